"""minivllm's log output: one handler on the ``minivllm`` logger, INFO by default.

Upstream counterpart: ``vllm/logger.py`` (``init_logger`` and its default handler).
Every module logs through ``logging.getLogger(__name__)``; because their names start
with ``minivllm.``, records reach the handler installed here. That is how the engine
reports the KV cache size it profiled at start without the user configuring logging.
Set ``MINIVLLM_LOGGING_LEVEL`` (e.g. ``WARNING``) to change the level.
"""

from __future__ import annotations

import logging
import os

LOGGING_LEVEL_ENV = "MINIVLLM_LOGGING_LEVEL"
_FORMAT = "[minivllm %(levelname)s %(asctime)s %(filename)s] %(message)s"


def configure_root_logger() -> logging.Logger:
    """Install the handler on the ``minivllm`` logger (once; later calls are no-ops)."""
    logger = logging.getLogger("minivllm")
    if not any(getattr(h, "_minivllm", False) for h in logger.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(_FORMAT, datefmt="%H:%M:%S"))
        handler._minivllm = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
        # Like vLLM: our records are ours to print; don't print them twice through root.
        logger.propagate = False
    logger.setLevel(os.environ.get(LOGGING_LEVEL_ENV, "INFO").upper())
    return logger
