"""One ``minivllm serve`` shared by the server tests that can share it.

Each server costs seconds to start (two processes import torch and load the model) and
to stop, so every test that needs only the demo model with the default engine arguments
(``ENGINE_ARGS``, plus an API key and a served model name) takes ``shared_server``. A
module that needs other flags (a poisoned model, a small KV pool, a longer context,
speculative decoding...), or that counts the engine's state from its start, starts its
own. The server is stopped when the package's last test has run, whether the tests
passed, failed or timed out (pytest-timeout raises in the test, so teardown runs; if the
test process dies outright, the server gets SIGTERM from the kernel:
``RemoteOpenAIServer`` sets its parent-death signal).

A test that stops the shared server carries ``@pytest.mark.stops_shared_server``; such
tests run after every other test of this package, so the server they stop has served
everyone else.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.entrypoints.openai.server_process import SHARED_SERVER_ARGS, RemoteOpenAIServer

HERE = Path(__file__).parent
STOPS_SHARED_SERVER = "stops_shared_server"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{STOPS_SHARED_SERVER}: stops the shared server; runs last in its package"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Move this package's ``stops_shared_server`` tests behind its other tests (in
    place, so the package's tests stay together and the server starts once)."""
    mine = [i for i, item in enumerate(items) if HERE in item.path.parents]
    if not mine:
        return
    start, end = mine[0], mine[-1] + 1
    block = items[start:end]
    stops = [item for item in block if item.get_closest_marker(STOPS_SHARED_SERVER)]
    items[start:end] = [item for item in block if item not in stops] + stops


@pytest.fixture(scope="package")
def shared_server() -> Iterator[RemoteOpenAIServer]:
    """``minivllm serve`` on the demo model with ``ENGINE_ARGS`` and
    ``SHARED_SERVER_ARGS``, for every test of the package that asks for it."""
    with RemoteOpenAIServer(SHARED_SERVER_ARGS) as server:
        yield server
