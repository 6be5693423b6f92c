"""Tests of the documentation site: link resolution, the vLLM lock, the build, a browser.

The link resolver lives in ``docs/hooks/doclinks.py`` (mkdocs loads it from there); the
tests import that same module, so they check exactly what the site shows.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCS_DIR = REPO_ROOT / "docs"
HOOKS_DIR = DOCS_DIR / "hooks"
if str(HOOKS_DIR) not in sys.path:
    sys.path.insert(0, str(HOOKS_DIR))

STRUCTURAL_PAGES = ("index.md", "architecture.md", "code_structure.md")
"""Pages that survey the whole package rather than explain one part of it."""


def doc_pages() -> list[Path]:
    """Every markdown page written by hand (generated pages never touch the disk)."""
    return sorted(DOCS_DIR.rglob("*.md"))


def chapters() -> list[Path]:
    """Top-level pages except the home page: the chapters of the book."""
    return [p for p in sorted(DOCS_DIR.glob("*.md")) if p.name != "index.md"]


def engine_chapters() -> list[Path]:
    """Chapters that explain one part of the engine (not the structural overviews)."""
    return [p for p in chapters() if p.name not in STRUCTURAL_PAGES]


def load_script(name: str) -> ModuleType:
    """``docs/scripts/<name>.py`` imported as a module (registered, for its dataclasses)."""
    spec = importlib.util.spec_from_file_location(name, DOCS_DIR / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
