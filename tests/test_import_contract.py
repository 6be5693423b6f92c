"""The import contract: packages import downwards only (``[tool.importlinter]`` in
pyproject.toml, explained in docs/code_structure.md).

``lint-imports`` reads the contract and the package's import graph (static: nothing is
imported or run); a new upward import fails this test with import-linter's report, which
names the importing and the imported module.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = "from importlinter.cli import lint_imports_command; lint_imports_command()"


def test_lint_imports_keeps_every_contract() -> None:
    proc = subprocess.run(
        # Run from the repository root: it reads [tool.importlinter] from pyproject.toml.
        [sys.executable, "-c", LINT_IMPORTS, "--no-cache"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"lint-imports failed:\n{proc.stdout}\n{proc.stderr}"


def test_every_top_level_module_has_a_layer() -> None:
    """A new package or module must be placed in the layers, or nothing constrains it."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    config = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    layers = next(c["layers"] for c in contracts if c["type"] == "layers")
    placed = {name.strip() for layer in layers for name in layer.split("|")}
    package = REPO_ROOT / "minivllm"
    top_level = {
        f"minivllm.{p.stem}" if p.is_file() else f"minivllm.{p.name}"
        for p in package.iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()
    }
    assert sorted(top_level - placed) == [], "add these to the layers contract"
    assert sorted(placed - top_level) == [], "the layers contract names missing modules"
