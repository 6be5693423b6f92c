"""The streamed completion chunk's hand-built JSON matches the pydantic model's.

``stream_chunk_json`` skips ``CompletionStreamResponse`` because it runs once per token
of every stream; these cases pin it to exactly what the model would have written.
"""

from __future__ import annotations

import pytest

from minivllm.entrypoints.openai.protocol import (
    CompletionLogProbs,
    CompletionResponseStreamChoice,
    CompletionStreamResponse,
)
from minivllm.entrypoints.openai.serving_completion import stream_chunk_json

LOGPROBS = CompletionLogProbs(
    text_offset=[0, 3],
    token_logprobs=[-0.25, None],
    tokens=[" hé", "\n"],
    top_logprobs=[{" hé": -0.25, " ho": -1.5e-7}, None],
)


@pytest.mark.parametrize(
    ("text", "logprobs", "finish_reason", "stop_reason"),
    [
        (" plain", None, None, None),
        ('quote " backslash \\ newline \n tab \t nul \x00 é 😀 \ufffd', None, None, None),
        ("", None, "length", None),
        (" end", None, "stop", 7),
        (" end", None, "stop", "STOP"),
        (" hé\n", LOGPROBS, None, None),
    ],
)
@pytest.mark.parametrize("include_usage", [False, True])
def test_stream_chunk_json_is_the_pydantic_models_json(
    text, logprobs, finish_reason, stop_reason, include_usage
) -> None:
    fields = dict(
        index=3,
        text=text,
        logprobs=logprobs,
        finish_reason=finish_reason,
        stop_reason=stop_reason,
    )
    model = CompletionStreamResponse(
        id="cmpl-x-0",
        object="text_completion",
        created=1700000000,
        model="demo",
        choices=[CompletionResponseStreamChoice(**fields)],
    )
    if include_usage:
        model.usage = None
    choice = {**fields, "logprobs": None if logprobs is None else logprobs.model_dump()}
    fast = stream_chunk_json("cmpl-x-0", 1700000000, "demo", choice, include_usage)
    assert fast == model.model_dump_json(exclude_unset=True)
