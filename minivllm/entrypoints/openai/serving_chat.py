"""``POST /v1/chat/completions``: a conversation in, the assistant's reply out.

Upstream counterpart: ``vllm/entrypoints/openai/chat_completion/serving.py``
(``OpenAIServingChat``). The messages are rendered with the chat template
(``chat_utils.render_chat_prompt``) into one prompt, which goes to ``AsyncLLM.generate``
like a completion's. What differs is the shape of the answer: a ``message`` (or, in a
stream, ``delta`` objects that open with the assistant's role) and logprobs as a list of
per-token objects instead of four parallel lists. Tools, reasoning parsers and
multimodal content, which make most of upstream's file, are not supported.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence

from minivllm.entrypoints.openai.protocol import (
    ChatCompletionLogProb,
    ChatCompletionLogProbs,
    ChatCompletionLogProbsContent,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatCompletionResponseStreamChoice,
    ChatCompletionStreamResponse,
    ChatMessage,
    DeltaMessage,
    ErrorResponse,
    UsageInfo,
    random_uuid,
)
from minivllm.entrypoints.openai.serving_completion import sse
from minivllm.entrypoints.openai.serving_engine import (
    OpenAIServing,
    clamp_logprob,
    decoded_token,
)
from minivllm.entrypoints.utils import prepend_async
from minivllm.outputs import PositionLogprobs, RequestOutput

ROLE = "assistant"


class OpenAIServingChat(OpenAIServing):
    """The chat completions API on top of ``AsyncLLM``."""

    async def create_chat_completion(
        self, request: ChatCompletionRequest
    ) -> ErrorResponse | ChatCompletionResponse | AsyncGenerator[str, None]:
        """Render, validate, start the engine request, answer in full or as a stream.

        As for completions, a stream starts once the first output is in, so an error the
        engine raises for this request is still a proper HTTP error.
        """
        if (error := await self._check_model(request.model)) is not None:
            return error
        request_id = f"chatcmpl-{random_uuid()}"
        try:
            prompt = self._render_chat(request.messages, request.add_generation_prompt)
            self._validate_prompt_len(prompt["prompt_token_ids"], "messages")
            params = request.to_sampling_params(self.max_model_len, len(prompt["prompt_token_ids"]))
        except ValueError as exc:
            return self.create_error_response(exc)
        results = self.engine_client.generate(prompt, params, request_id)
        created = int(time.time())
        if request.stream:
            try:
                first = await results.__anext__()
            except Exception as exc:  # ValueError -> 400, EngineDeadError -> 500
                await results.aclose()
                return self.create_error_response(exc)
            return self.chat_completion_stream_generator(
                request, first, results, request_id, created
            )
        return await self.chat_completion_full_generator(request, results, request_id, created)

    async def chat_completion_stream_generator(
        self,
        request: ChatCompletionRequest,
        first: RequestOutput,
        results: AsyncGenerator[RequestOutput, None],
        request_id: str,
        created: int,
    ) -> AsyncGenerator[str, None]:
        """Server-sent events: a role chunk per choice, content deltas, usage, [DONE].

        Cancellation is not caught, so a disconnect reaches ``AsyncLLM.generate``, which
        aborts the request; ``results`` is closed on every way out.
        """
        model = self.models.model_name()
        include_usage = bool(request.stream_options and request.stream_options.include_usage)
        num_tokens = [0] * request.n
        prompt_tokens = len(first.prompt_token_ids)

        def chunk(choices: list[ChatCompletionResponseStreamChoice]) -> str:
            resp = ChatCompletionStreamResponse(
                id=request_id,
                object="chat.completion.chunk",
                created=created,
                model=model,
                choices=choices,
            )
            if include_usage:
                resp.usage = None  # OpenAI: "usage": null on all but the last
            return sse(resp.model_dump_json(exclude_unset=True))

        try:
            # OpenAI opens each choice with its role and empty content.
            for i in range(request.n):
                yield chunk(
                    [
                        ChatCompletionResponseStreamChoice(
                            index=i,
                            delta=DeltaMessage(role=ROLE, content=""),
                            logprobs=None,
                            finish_reason=None,
                        )
                    ]
                )
            async for res in prepend_async(first, results):
                for output in res.outputs:
                    if not output.token_ids and output.finish_reason is None:
                        continue
                    num_tokens[output.index] += len(output.token_ids)
                    logprobs = None
                    if request.logprobs:
                        logprobs = self._create_chat_logprobs(
                            list(output.token_ids), output.logprobs, request.top_logprobs
                        )
                    yield chunk(
                        [
                            ChatCompletionResponseStreamChoice(
                                index=output.index,
                                delta=DeltaMessage(content=output.text),
                                logprobs=logprobs,
                                finish_reason=output.finish_reason,
                                stop_reason=output.stop_reason,
                            )
                        ]
                    )
            if include_usage:
                usage = UsageInfo(
                    prompt_tokens=prompt_tokens,
                    completion_tokens=sum(num_tokens),
                    total_tokens=prompt_tokens + sum(num_tokens),
                )
                final = ChatCompletionStreamResponse(
                    id=request_id, created=created, model=model, choices=[], usage=usage
                )
                yield sse(final.model_dump_json())
        except Exception as exc:  # not CancelledError / GeneratorExit: those must propagate
            yield sse(self.create_error_response(exc).model_dump_json())
        finally:
            await results.aclose()
        yield "data: [DONE]\n\n"

    async def chat_completion_full_generator(
        self,
        request: ChatCompletionRequest,
        results: AsyncIterator[RequestOutput],
        request_id: str,
        created: int,
    ) -> ErrorResponse | ChatCompletionResponse:
        """Wait for the final output and build the full response."""
        final: RequestOutput | None = None
        try:
            async for res in results:
                final = res
        except Exception as exc:
            return self.create_error_response(exc)
        assert final is not None, "the engine finished a request without an output"
        choices = []
        for output in final.outputs:
            logprobs = None
            if request.logprobs:
                logprobs = self._create_chat_logprobs(
                    list(output.token_ids), output.logprobs, request.top_logprobs
                )
            choices.append(
                ChatCompletionResponseChoice(
                    index=output.index,
                    message=ChatMessage(role=ROLE, content=output.text),
                    logprobs=logprobs,
                    finish_reason=output.finish_reason,
                    stop_reason=output.stop_reason,
                )
            )
        prompt_tokens = len(final.prompt_token_ids)
        completion_tokens = sum(len(o.token_ids) for o in final.outputs)
        return ChatCompletionResponse(
            id=request_id,
            created=created,
            model=self.models.model_name(),
            choices=choices,
            usage=UsageInfo(
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                total_tokens=prompt_tokens + completion_tokens,
            ),
        )

    def _create_chat_logprobs(
        self,
        token_ids: list[int],
        logprobs: Sequence[PositionLogprobs | None] | None,
        top_logprobs: int | None,
    ) -> ChatCompletionLogProbs:
        """OpenAI's chat logprobs: per token its text, logprob, bytes and alternatives.

        ``top_logprobs`` lists the first ``top_logprobs`` candidates the engine returned
        at that position: the sampled token first, then the most likely others.
        """
        content = []
        for pos, token_id in enumerate(token_ids):
            step = logprobs[pos] if logprobs is not None and pos < len(logprobs) else None
            if step is None or token_id not in step:
                token = self.tokenizer.decode([token_id]) if self.tokenizer else ""
                content.append(
                    ChatCompletionLogProbsContent(
                        token=token, bytes=list(token.encode("utf-8", errors="replace"))
                    )
                )
                continue
            token = decoded_token(token_id, step[token_id], self.tokenizer)
            top = []
            for rank, (tid, lp) in enumerate(step.items()):
                if rank >= (top_logprobs or 0):
                    break
                text = decoded_token(tid, lp, self.tokenizer)
                top.append(
                    ChatCompletionLogProb(
                        token=text,
                        logprob=clamp_logprob(lp.logprob),
                        bytes=list(text.encode("utf-8", errors="replace")),
                    )
                )
            content.append(
                ChatCompletionLogProbsContent(
                    token=token,
                    logprob=clamp_logprob(step[token_id].logprob),
                    bytes=list(token.encode("utf-8", errors="replace")),
                    top_logprobs=top,
                )
            )
        return ChatCompletionLogProbs(content=content)
