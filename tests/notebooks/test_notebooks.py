"""Every notebook in ``notebooks/`` runs top to bottom on the CPU, in under two minutes.

The notebooks are stored with their outputs (the docs site shows them as they are);
this test executes a fresh copy of each with nbclient and fails on the first cell that
raises, so a notebook can never silently drift from the code it teaches. Checks inside
the notebooks (``assert`` cells) fail the test too. The execution is shared with
``test_freshness.py`` (``conftest.py``), which compares the stored outputs with it.

To re-execute the notebooks and store their new outputs::

    python -m tests.notebooks.test_notebooks --write
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK_DIR = REPO_ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
# The limit per notebook on 2 CPU cores; a cell that hangs fails at this point.
TIMEOUT_S = 120


def kernel_env() -> dict[str, str]:
    """The kernel's environment: the repository importable, Triton interpreted without CUDA,
    matplotlib drawing inline, one CPU thread."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    env.setdefault("TRITON_INTERPRET", "1")  # set by conftest too when there is no CUDA
    # The notebooks' models are tiny: a second thread gains nothing, and OpenMP threads
    # that spin-wait on cores shared with other processes make a step 10x slower.
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def execute_notebook(path: Path, timeout_s: int = TIMEOUT_S):
    """Run ``path`` in a fresh kernel (cwd: ``notebooks/``) and return the executed notebook.

    Raises:
        nbclient.exceptions.CellExecutionError: A cell raised.
        TimeoutError: The whole notebook took longer than ``timeout_s``.
    """
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    start = time.monotonic()
    client = NotebookClient(
        nb,
        timeout=timeout_s,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute(env=kernel_env())  # keyword arguments go to KernelManager.start_kernel
    elapsed = time.monotonic() - start
    if elapsed > timeout_s:
        raise TimeoutError(f"{path.name} took {elapsed:.0f} s (limit {timeout_s} s)")
    nb.metadata["minivllm_exec_seconds"] = round(elapsed, 1)
    return nb


def test_notebooks_exist() -> None:
    names = [p.name for p in NOTEBOOKS]
    assert names == [
        "01_block_pool.ipynb",
        "02_paged_attention.ipynb",
        "03_scheduler.ipynb",
        "04_end_to_end.ipynb",
        "05_memory.ipynb",
        "06_sampling.ipynb",
        "07_serving.ipynb",
        "08_spec_decode.ipynb",
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_top_to_bottom(path: Path, executed_notebook) -> None:
    nb = executed_notebook(path)
    errors = [
        out
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
        if out.get("output_type") == "error"
    ]
    assert not errors


def main(argv: list[str]) -> int:
    """``--write``: execute every notebook (or those named) and store the outputs."""
    import nbformat

    if "--write" not in argv:
        print(__doc__)
        return 2
    names = [a for a in argv if a != "--write"]
    for path in NOTEBOOKS:
        if names and path.stem not in names and path.name not in names:
            continue
        nb = execute_notebook(path, timeout_s=10 * TIMEOUT_S)
        seconds = nb.metadata.pop("minivllm_exec_seconds", None)
        # Clean metadata so a re-run without changes gives a small diff.
        for cell in nb.cells:
            cell.metadata.pop("execution", None)
        nbformat.write(nb, path)
        print(f"{path.name}: executed in {seconds} s and written")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
