"""``POST /v1/completions``: prompts in, text out, whole or streamed.

Upstream counterpart: ``vllm/entrypoints/openai/completion/serving.py``
(``OpenAIServingCompletion``). The request becomes one ``AsyncLLM.generate`` call per
prompt, each with its own id (``cmpl-<hex>-<i>``). A full response asks the engine for
``FINAL_ONLY`` outputs and builds one ``CompletionResponse``; a stream asks for ``DELTA``
outputs and turns each into one server-sent event (``data: {...}``), then an optional
usage chunk and ``data: [DONE]``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import msgspec

from minivllm.entrypoints.openai.protocol import (
    CompletionLogProbs,
    CompletionRequest,
    CompletionResponse,
    CompletionResponseChoice,
    CompletionStreamResponse,
    ErrorResponse,
    UsageInfo,
    random_uuid,
)
from minivllm.entrypoints.openai.serving_engine import (
    OpenAIServing,
    VLLMValidationError,
    clamp_logprob,
    decoded_token,
)
from minivllm.entrypoints.utils import merge_async_iterators, prepend_async
from minivllm.outputs import PositionLogprobs, RequestOutput
from minivllm.sampling_params import _MAX_N as MAX_N_SEQUENCES

ResultStream = AsyncGenerator[tuple[int, RequestOutput], None]


def sse(payload: str) -> str:
    """One server-sent event."""
    return f"data: {payload}\n\n"


_json_encoder = msgspec.json.Encoder()


def stream_chunk_json(
    request_id: str,
    created: int,
    model: str,
    choice: dict[str, Any],
    include_usage: bool,
) -> str:
    """One streamed chunk's JSON: the same text as ``CompletionStreamResponse(...)
    .model_dump_json(exclude_unset=True)`` (``"usage": null`` with ``include_usage``).

    ``choice`` holds a ``CompletionResponseStreamChoice``'s fields, all of them, in its
    order, with ``logprobs`` as a plain dict (``CompletionLogProbs.model_dump()``).

    Why not the pydantic model: this runs once per token of every stream, and building
    and serializing two validated models costs about ten times what msgspec's encoder
    takes for the same fields in a dict, which at hundreds of streams held the front end
    back behind the engine core. ``test_serving_completion_json.py`` keeps both in step.
    """
    chunk: dict[str, Any] = {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
    }
    if include_usage:
        chunk["usage"] = None  # OpenAI: "usage": null on all but the last
    return _json_encoder.encode(chunk).decode()


class OpenAIServingCompletion(OpenAIServing):
    """The completions API on top of ``AsyncLLM``."""

    async def create_completion(
        self, request: CompletionRequest
    ) -> ErrorResponse | CompletionResponse | AsyncGenerator[str, None]:
        """Validate, start the engine requests, and answer in full or as a stream.

        A stream is started only once its first output is in: the engine's own checks
        (token ids outside the vocabulary, say) then still come back as a 400 instead of
        an error event inside a 200 response.
        """
        if (error := await self._check_model(request.model)) is not None:
            return error
        request_id = f"cmpl-{random_uuid()}"
        try:
            prompts = self._parse_prompts(request.prompt, request.n)
            params = [
                request.to_sampling_params(self.max_model_len, len(p["prompt_token_ids"]))
                for p in prompts
            ]
            if request.echo and request.logprobs is not None:
                for sp in params:
                    sp.prompt_logprobs = request.logprobs  # echoed tokens get logprobs too
        except ValueError as exc:
            return self.create_error_response(exc)
        generators = [
            self.engine_client.generate(prompt, sp, f"{request_id}-{i}")
            for i, (prompt, sp) in enumerate(zip(prompts, params))
        ]
        results = merge_async_iterators(*generators)
        created = int(time.time())
        if request.stream:
            try:
                first = await results.__anext__()
            except Exception as exc:  # ValueError -> 400, EngineDeadError -> 500
                await results.aclose()
                return self.create_error_response(exc)
            return self.completion_stream_generator(
                request, prompts, prepend_async(first, results), request_id, created
            )
        final: list[RequestOutput | None] = [None] * len(prompts)
        try:
            async for i, output in results:
                final[i] = output
        except Exception as exc:
            return self.create_error_response(exc)
        return self.request_output_to_completion_response(
            [o for o in final if o is not None], prompts, request, request_id, created
        )

    def _parse_prompts(self, prompt: str | list[Any], n: int = 1) -> list[dict[str, Any]]:
        """The request's ``prompt`` as engine prompts: one text, texts, ids or lists of ids.

        Each prompt becomes ``n`` engine requests; a request may ask for at most as many
        sequences in all as ``SamplingParams`` allows ``n`` to be (checked before any
        prompt is tokenized, so a list of a million prompts costs nothing).
        """
        if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
            items: Sequence[Any] = [prompt]
        else:
            items = prompt
        if not items:
            raise VLLMValidationError("'prompt' is an empty list", "prompt")
        if len(items) * n > MAX_N_SEQUENCES:
            raise VLLMValidationError(
                f"'prompt' has {len(items)} prompts and n={n}: {len(items) * n} sequences, "
                f"more than the {MAX_N_SEQUENCES} one request may ask for",
                "prompt",
            )
        prompts = [self._tokenize_prompt_input(p) for p in items]
        for p in prompts:
            self._validate_prompt_len(p["prompt_token_ids"], "prompt")
        return prompts

    def _prompt_text(self, prompt: dict[str, Any]) -> str:
        """The prompt's text, decoded from its ids when it was sent as ids (for ``echo``)."""
        if prompt.get("prompt") is not None:
            return prompt["prompt"]
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(prompt["prompt_token_ids"])

    async def completion_stream_generator(
        self,
        request: CompletionRequest,
        prompts: list[dict[str, Any]],
        results: ResultStream,
        request_id: str,
        created: int,
    ) -> AsyncGenerator[str, None]:
        """Server-sent events: one chunk per sample with new text, then usage and [DONE].

        Choice ``index`` is ``prompt_index * n + sample_index``. Cancellation (a client
        that disconnected) is not caught: it must reach ``AsyncLLM.generate`` to abort.
        """
        n = request.n
        model = self.models.model_name()
        text_len = [0] * (n * len(prompts))
        num_tokens = [0] * (n * len(prompts))
        echoed = [False] * (n * len(prompts))
        include_usage = bool(request.stream_options and request.stream_options.include_usage)
        try:
            async for prompt_idx, res in results:
                for output in res.outputs:
                    i = prompt_idx * n + output.index
                    text, token_ids = output.text, list(output.token_ids)
                    logprobs = output.logprobs
                    if request.echo and not echoed[i]:
                        echoed[i] = True
                        text, token_ids, logprobs = self._with_echo(
                            prompts[prompt_idx], res, output
                        )
                    elif not text and not token_ids and output.finish_reason is None:
                        continue
                    chunk_logprobs = None
                    if request.logprobs is not None:
                        chunk_logprobs = self._create_completion_logprobs(
                            token_ids, logprobs, request.logprobs, text_len[i]
                        ).model_dump()
                    text_len[i] += len(text)
                    num_tokens[i] += len(output.token_ids)
                    choice = {  # CompletionResponseStreamChoice's fields, in its order
                        "index": i,
                        "text": text,
                        "logprobs": chunk_logprobs,
                        "finish_reason": output.finish_reason,
                        "stop_reason": output.stop_reason,
                    }
                    yield sse(stream_chunk_json(request_id, created, model, choice, include_usage))
            if include_usage:
                prompt_tokens = sum(len(p["prompt_token_ids"]) for p in prompts)
                usage = UsageInfo(
                    prompt_tokens=prompt_tokens,
                    completion_tokens=sum(num_tokens),
                    total_tokens=prompt_tokens + sum(num_tokens),
                )
                final = CompletionStreamResponse(
                    id=request_id, created=created, model=model, choices=[], usage=usage
                )
                yield sse(final.model_dump_json())
        except Exception as exc:  # not CancelledError / GeneratorExit: those must propagate
            yield sse(self.create_error_response(exc).model_dump_json())
        finally:
            await results.aclose()  # on every way out, so an early exit aborts the request
        yield "data: [DONE]\n\n"

    def _with_echo(
        self, prompt: dict[str, Any], res: RequestOutput, output: Any
    ) -> tuple[str, list[int], list[PositionLogprobs | None] | None]:
        """The prompt prepended to a sample's text, token ids and logprobs (``echo``)."""
        prompt_ids = list(res.prompt_token_ids)
        text = self._prompt_text(prompt) + output.text
        logprobs = None
        if output.logprobs is not None:
            prompt_lps = res.prompt_logprobs or [None] * len(prompt_ids)
            logprobs = [*prompt_lps, *output.logprobs]
        return text, prompt_ids + list(output.token_ids), logprobs

    def request_output_to_completion_response(
        self,
        final_outputs: list[RequestOutput],
        prompts: list[dict[str, Any]],
        request: CompletionRequest,
        request_id: str,
        created: int,
    ) -> CompletionResponse:
        """The full response: every sample of every prompt, and the token usage."""
        choices: list[CompletionResponseChoice] = []
        prompt_tokens = completion_tokens = 0
        for prompt, res in zip(prompts, final_outputs):
            prompt_tokens += len(res.prompt_token_ids)
            for output in res.outputs:
                completion_tokens += len(output.token_ids)
                text, token_ids, logprobs = output.text, list(output.token_ids), output.logprobs
                if request.echo:
                    text, token_ids, logprobs = self._with_echo(prompt, res, output)
                choice_logprobs = None
                if request.logprobs is not None:
                    choice_logprobs = self._create_completion_logprobs(
                        token_ids, logprobs, request.logprobs
                    )
                choices.append(
                    CompletionResponseChoice(
                        index=len(choices),
                        text=text,
                        logprobs=choice_logprobs,
                        finish_reason=output.finish_reason,
                        stop_reason=output.stop_reason,
                    )
                )
        usage = UsageInfo(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
        )
        return CompletionResponse(
            id=request_id,
            created=created,
            model=self.models.model_name(),
            choices=choices,
            usage=usage,
        )

    def _create_completion_logprobs(
        self,
        token_ids: list[int],
        logprobs: Sequence[PositionLogprobs | None] | None,
        num_top: int,
        initial_text_offset: int = 0,
    ) -> CompletionLogProbs:
        """OpenAI's completions logprobs object for ``token_ids``.

        Per token: its text, its logprob, and ``top_logprobs``: the sampled token plus
        the ``num_top`` most likely ones, keyed by text (so at most ``num_top + 1``
        entries, ``num_top`` when the sampled token is among them). ``text_offset`` is
        where each token starts in the choice's text. A position with no logprobs (the
        first prompt token under ``echo``) gets None.
        """
        out = CompletionLogProbs()
        offset = initial_text_offset
        for pos, token_id in enumerate(token_ids):
            step = logprobs[pos] if logprobs is not None and pos < len(logprobs) else None
            if step is None or token_id not in step:
                token = self.tokenizer.decode([token_id]) if self.tokenizer else ""
                out.token_logprobs.append(None)
                out.top_logprobs.append(None)
            else:
                token = decoded_token(token_id, step[token_id], self.tokenizer)
                out.token_logprobs.append(clamp_logprob(step[token_id].logprob))
                out.top_logprobs.append(
                    {
                        decoded_token(tid, lp, self.tokenizer): clamp_logprob(lp.logprob)
                        for rank, (tid, lp) in enumerate(step.items())
                        if rank <= num_top
                    }
                )
            out.tokens.append(token)
            out.text_offset.append(offset)
            offset += len(token)
        return out
