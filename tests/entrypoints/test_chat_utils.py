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
