"""Errors the front ends raise to their callers.

Upstream counterpart: ``vllm/v1/engine/exceptions.py`` (``EngineDeadError``,
``EngineGenerateError``).
"""

from __future__ import annotations


class EngineGenerateError(Exception):
    """One request failed inside the engine (its logits were not finite, or its step
    raised); the engine is healthy and other requests go on. The server answers 500."""


class EngineDeadError(Exception):
    """The engine core failed or its process died; no request can be served any more.

    The server answers 500 to every request and 503 to ``/health`` from then on.
    """

    def __init__(self, reason: str = "the engine core is dead") -> None:
        self.reason = reason
        super().__init__(
            f"EngineCore encountered an issue: {reason}. See the engine core's log for the "
            f"original error; restart the engine to serve again."
        )
