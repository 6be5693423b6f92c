"""The protocol objects: sampling-parameter mapping, defaults, and what is refused."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from minivllm.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    CompletionStreamResponse,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
)
from minivllm.sampling_params import RequestOutputKind

MESSAGES = [{"role": "user", "content": "hi"}]


def test_completion_request_maps_every_sampling_field() -> None:
    req = CompletionRequest(
        prompt="p",
        n=2,
        max_tokens=7,
        temperature=0.7,
        top_p=0.9,
        seed=3,
        stop=["x"],
        logprobs=2,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        top_k=5,
        min_p=0.1,
        repetition_penalty=1.2,
        min_tokens=2,
        ignore_eos=True,
        stop_token_ids=[9],
        skip_special_tokens=False,
        include_stop_str_in_output=True,
    )
    sp = req.to_sampling_params(max_model_len=100, prompt_len=10)
    assert (sp.n, sp.max_tokens, sp.temperature, sp.top_p, sp.seed) == (2, 7, 0.7, 0.9, 3)
    assert (sp.top_k, sp.min_p, sp.repetition_penalty, sp.min_tokens) == (5, 0.1, 1.2, 2)
    assert (sp.presence_penalty, sp.frequency_penalty, sp.logprobs) == (0.5, -0.5, 2)
    assert sp.stop == ["x"] and sp.stop_token_ids == [9]
    assert sp.ignore_eos and sp.include_stop_str_in_output and not sp.skip_special_tokens
    assert sp.output_kind == RequestOutputKind.FINAL_ONLY


def test_defaults_and_stream_kind() -> None:
    sp = CompletionRequest(prompt="p", stream=True).to_sampling_params(100, 10)
    # OpenAI's defaults: 16 tokens for completions, temperature 1.
    assert (sp.max_tokens, sp.temperature, sp.top_p, sp.logprobs) == (16, 1.0, 1.0, None)
    assert sp.output_kind == RequestOutputKind.DELTA


def test_max_tokens_capped_by_the_room_left() -> None:
    assert (
        CompletionRequest(prompt="p", max_tokens=500).to_sampling_params(100, 90).max_tokens == 10
    )
    # Chat: omitted means all of the room; max_completion_tokens wins over max_tokens.
    chat = ChatCompletionRequest(messages=MESSAGES)
    assert chat.to_sampling_params(100, 30).max_tokens == 70
    both = ChatCompletionRequest(messages=MESSAGES, max_tokens=5, max_completion_tokens=3)
    assert both.to_sampling_params(100, 30).max_tokens == 3


def test_chat_logprobs_mapping() -> None:
    assert ChatCompletionRequest(messages=MESSAGES).to_sampling_params(100, 1).logprobs is None
    req = ChatCompletionRequest(messages=MESSAGES, logprobs=True, top_logprobs=3)
    assert req.to_sampling_params(100, 1).logprobs == 3
    assert (
        ChatCompletionRequest(messages=MESSAGES, logprobs=True).to_sampling_params(100, 1).logprobs
        == 0
    )
    with pytest.raises(ValidationError, match="top_logprobs needs logprobs"):
        ChatCompletionRequest(messages=MESSAGES, top_logprobs=2)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"prompt": "p", "max_tokens": "many"}, "max_tokens"),
        ({"prompt": "p", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "p", "temperature": "hot"}, "temperature"),
        ({"prompt": "p", "logprobs": -1}, "logprobs"),
        ({"prompt": "p", "logprobs": 21}, "logprobs"),
        ({"prompt": "p", "n": True}, "n"),
        ({"prompt": "p", "temperature": float("nan")}, "temperature"),
        ({"prompt": [[1, [2]]]}, "prompt"),
        ({"prompt": "p", "stop_token_ids": ["a"]}, "stop_token_ids"),
        ({"max_tokens": 3}, "prompt"),
    ],
)
def test_wrong_types_name_the_field(body: dict, field: str) -> None:
    with pytest.raises(ValidationError) as info:
        CompletionRequest.model_validate(body)
    assert any(field in err["loc"] for err in info.value.errors())


def test_out_of_range_values_are_refused_by_sampling_params() -> None:
    req = CompletionRequest(prompt="p", top_p=2.0)
    with pytest.raises(ValueError, match="top_p"):
        req.to_sampling_params(100, 1)


def test_unknown_fields_are_ignored_as_upstream() -> None:
    req = CompletionRequest.model_validate({"prompt": "p", "metadata": {"a": 1}, "suffixx": 1})
    assert req.to_sampling_params(100, 1).max_tokens == 16


def test_tokenize_request_union_picks_by_fields() -> None:
    from pydantic import TypeAdapter

    from minivllm.entrypoints.openai.protocol import TokenizeRequest

    adapter = TypeAdapter(TokenizeRequest)
    assert isinstance(adapter.validate_python({"prompt": "x"}), TokenizeCompletionRequest)
    assert isinstance(adapter.validate_python({"messages": MESSAGES}), TokenizeChatRequest)


def test_stream_chunk_json_shape() -> None:
    chunk = CompletionStreamResponse(
        id="cmpl-1", object="text_completion", created=1, model="m", choices=[]
    )
    assert chunk.model_dump_json(exclude_unset=True) == (
        '{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[]}'
    )
