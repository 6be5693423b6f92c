"""Chat rendering: the demo model's template, text parts, and the errors a client sees."""

from __future__ import annotations

import pytest

from minivllm.demo import demo_model_path
from minivllm.entrypoints.chat_utils import (
    ChatTemplateResolutionError,
    apply_hf_chat_template,
    parse_chat_messages,
    render_chat_prompt,
)


@pytest.fixture(scope="module")
def demo_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(demo_model_path()))


def test_demo_template_renders_roles_and_generation_prompt(demo_tokenizer) -> None:
    messages = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Who made the heaven?"},
    ]
    text = apply_hf_chat_template(demo_tokenizer, parse_chat_messages(messages))
    assert text == (
        "### System:\nAnswer briefly.\n\n### User:\nWho made the heaven?\n\n### Assistant:\n"
    )
    without = apply_hf_chat_template(
        demo_tokenizer, parse_chat_messages(messages), add_generation_prompt=False
    )
    assert without == text.removesuffix("### Assistant:\n")


def test_render_chat_prompt_tokenizes_without_special_tokens(demo_tokenizer) -> None:
    prompt = render_chat_prompt(demo_tokenizer, [{"role": "user", "content": "Love is"}])
    assert prompt["prompt"] == "### User:\nLove is\n\n### Assistant:\n"
    assert prompt["prompt_token_ids"] == demo_tokenizer.encode(
        prompt["prompt"], add_special_tokens=False
    )
    assert demo_tokenizer.decode(prompt["prompt_token_ids"]) == prompt["prompt"]


def test_text_parts_are_joined_and_other_parts_refused() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert parse_chat_messages([{"role": "user", "content": parts}]) == [
        {"role": "user", "content": "a\nb"}
    ]
    image = [{"type": "image_url", "image_url": {"url": "x"}}]
    with pytest.raises(ValueError, match=r"messages\[1\]\.content\[0\].*'image_url'"):
        parse_chat_messages([{"role": "user", "content": "hi"}, {"role": "user", "content": image}])
    with pytest.raises(ValueError, match=r"messages\[0\] must be an object with a 'role'"):
        parse_chat_messages([{"content": "no role"}])


def test_model_without_template_is_a_clear_error(demo_tokenizer) -> None:
    import copy

    bare = copy.deepcopy(demo_tokenizer)
    bare.chat_template = None
    with pytest.raises(ChatTemplateResolutionError, match="has no chat template"):
        render_chat_prompt(bare, [{"role": "user", "content": "hi"}])
    # A template given by the caller is used instead.
    prompt = render_chat_prompt(
        bare, [{"role": "user", "content": "hi"}], chat_template="{{ messages[0]['content'] }}!"
    )
    assert prompt["prompt"] == "hi!"


def test_template_errors_become_value_errors(demo_tokenizer) -> None:
    strict = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(ValueError, match="roles must alternate"):
        render_chat_prompt(demo_tokenizer, [{"role": "user", "content": "x"}], strict)


def test_llm_chat_renders_like_the_server(demo_tokenizer) -> None:
    from minivllm import LLM, SamplingParams

    llm = LLM(str(demo_model_path()), device="cpu", dtype="float32", num_kv_blocks=64)
    params = SamplingParams(temperature=0, max_tokens=6)
    first = [{"role": "user", "content": "Who made the heaven?"}]
    second = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Love is"}]
    outs = llm.chat([first, second], params, use_tqdm=False)
    assert len(outs) == 2
    for conversation, out in zip((first, second), outs):
        prompt = render_chat_prompt(demo_tokenizer, conversation)
        assert out.prompt == prompt["prompt"]
        assert out.prompt_token_ids == prompt["prompt_token_ids"]
        [same] = llm.generate(prompt, params, use_tqdm=False)
        assert same.outputs[0].token_ids == out.outputs[0].token_ids
    # One conversation (a list of messages) gives one output.
    [one] = llm.chat(first, params, use_tqdm=False)
    assert one.outputs[0].token_ids == outs[0].outputs[0].token_ids
    # A tokenizer without a template: a clear error before anything is queued.
    llm.get_tokenizer().chat_template = None
    with pytest.raises(ValueError, match="has no chat template"):
        llm.chat(first, params, use_tqdm=False)
