"""Asyncio helpers of the server: merging result streams, cancelling on disconnect.

Upstream counterpart: ``vllm/utils/async_utils.py`` (``merge_async_iterators``) and
``vllm/entrypoints/utils.py`` (``with_cancellation``, ``listen_for_disconnect``).

Both rest on one rule of ``AsyncLLM.generate``: when its generator is closed or the task
iterating it is cancelled, it aborts its request in the engine core, which frees the
request's KV blocks. So nothing here calls ``abort``: each helper only makes sure that a
generator nobody will read again is closed or cancelled, never left dangling.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from starlette.requests import Request

T = TypeVar("T")


async def _next(iterator: AsyncIterator[T]) -> T:
    return await iterator.__anext__()


async def merge_async_iterators(
    *iterators: AsyncGenerator[T, None],
) -> AsyncGenerator[tuple[int, T], None]:
    """Yield ``(i, item)`` from several async generators as items arrive, in any order.

    A completions request with a list of prompts runs one engine request per prompt;
    their outputs interleave. When this generator is closed or cancelled early (the
    client went away), every inner generator is cancelled or closed, so each aborts its
    engine request.
    """
    if len(iterators) == 1:  # the common case, with no tasks in between
        try:
            async for item in iterators[0]:
                yield 0, item
        finally:
            await iterators[0].aclose()
        return
    pending = {asyncio.ensure_future(_next(it)): i for i, it in enumerate(iterators)}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                i = pending.pop(task)
                try:
                    item = task.result()
                except StopAsyncIteration:
                    continue
                pending[asyncio.ensure_future(_next(iterators[i]))] = i
                yield i, item
    finally:
        for task in pending:
            task.cancel()  # the CancelledError runs through the generator it was reading
        await asyncio.gather(*pending, return_exceptions=True)
        for it in iterators:
            await it.aclose()


async def prepend_async(first: T, rest: AsyncGenerator[T, None]) -> AsyncGenerator[T, None]:
    """``first``, then the items of ``rest``; closing this generator closes ``rest``.

    A stream is primed with its first output before the HTTP response starts; this puts
    that output back in front.
    """
    try:
        yield first
        async for item in rest:
            yield item
    finally:
        await rest.aclose()


async def listen_for_disconnect(request: Request) -> None:
    """Return when the client closes the connection (the ASGI ``http.disconnect``)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def with_cancellation(handler: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """Run a route handler, and cancel it if the client disconnects before it returns.

    A non-streaming completion waits for the whole output; without this, a client that
    gave up would keep its request generating (and its KV blocks held) to the end.
    Cancelling the handler cancels its ``AsyncLLM.generate`` loop, which aborts the
    request. The handler must take the Starlette request as ``raw_request``.
    """

    @functools.wraps(handler)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        request: Request = kwargs["raw_request"]
        handler_task = asyncio.ensure_future(handler(*args, **kwargs))
        disconnect_task = asyncio.ensure_future(listen_for_disconnect(request))
        done, pending = await asyncio.wait(
            [handler_task, disconnect_task], return_when=asyncio.FIRST_COMPLETED
        )
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        if handler_task in done:
            return handler_task.result()
        return None  # the client is gone: there is nobody to answer

    return wrapper
