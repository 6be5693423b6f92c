"""One strict build of the site per test session, shared by the build and browser tests."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs import REPO_ROOT


def mkdocs_env() -> dict[str, str]:
    """The environment for mkdocs runs: Material's console banner switched off."""
    return {**os.environ, "NO_MKDOCS_2_WARNING": "1"}


@pytest.fixture(scope="session")
def built_site(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, subprocess.CompletedProcess]:
    """``mkdocs build --strict`` of the real site into a temp dir: (site dir, process)."""
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        pytest.skip("mkdocs / mkdocs-material are not installed: pip install -e '.[docs]'")
    site = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env=mkdocs_env(),
        timeout=300,
        check=False,
    )
    return site, proc
