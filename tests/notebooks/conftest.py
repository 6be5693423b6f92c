"""One execution of each notebook per test session, shared by the tests that need it.

Running a notebook is the slow part (a kernel, a model, an engine); the test that it runs
top to bottom and the test that its stored outputs are fresh look at the same execution.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def executed_notebook() -> Callable[[Path], object]:
    """``executed_notebook(path)``: the notebook executed once per session (nbformat node).

    A notebook whose execution failed raises the same exception for every test that asks.
    """
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    pytest.importorskip("matplotlib")
    from tests.notebooks.test_notebooks import execute_notebook

    results: dict[Path, object] = {}

    def get(path: Path) -> object:
        if path not in results:
            try:
                results[path] = execute_notebook(path)
            except Exception as exc:  # noqa: BLE001 - replayed to every test that asks
                results[path] = exc
        result = results[path]
        if isinstance(result, Exception):
            raise result
        return result

    return get
