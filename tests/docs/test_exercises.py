"""The chapters' exercises, and every test a page names, stay real.

Each chapter ends with two or three exercises (a change to make, what the reader should
see, and the test that checks it) before its side-by-side table. An exercise that names a
test which was renamed or deleted would send the reader nowhere, so every test file,
test function and ``pytest ... -k`` selection written on any page must still exist.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

from tests.docs import DOCS_DIR, REPO_ROOT, chapters, doc_pages

WITHOUT_EXERCISES = {"glossary.md"}
"""Pages that are reference material, not chapters to work through."""

EXERCISES_RE = re.compile(r"^## Exercises\s*$", re.MULTILINE)
SECTION_RE = re.compile(r"^## .*$", re.MULTILINE)
ITEM_RE = re.compile(r"^\d+\. \*\*", re.MULTILINE)
TEST_FILE_RE = re.compile(r"\btests/[\w/]+\.py\b")
TEST_NAME_RE = re.compile(r"`(test_\w+)`")
# pytest [tests/x.py[::name]] -k "expr"  or  -k word
PYTEST_K_RE = re.compile(
    r"pytest (?P<path>tests/[\w/]+\.py)\S*\s+-k\s+(?:\"(?P<q>[^\"]+)\"|(?P<w>\w+))"
)


def _page_id(page: Path) -> str:
    return page.relative_to(DOCS_DIR).as_posix()


@cache
def functions_in(path: str) -> frozenset[str]:
    """Names of the test functions defined in one test file (empty if it does not exist)."""
    file = REPO_ROOT / path
    if not file.is_file():
        return frozenset()
    tree = ast.parse(file.read_text(encoding="utf-8"))
    return frozenset(
        node.name
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.name.startswith("test_")
    )


@cache
def all_test_functions() -> frozenset[str]:
    names: set[str] = set()
    for file in (REPO_ROOT / "tests").rglob("test_*.py"):
        names |= functions_in(file.relative_to(REPO_ROOT).as_posix())
    return frozenset(names)


def k_terms(expr: str) -> list[str]:
    """The name fragments of a ``-k`` expression (``"a or (b and not c)"`` -> a, b, c)."""
    words = re.findall(r"\w+", expr)
    return [w for w in words if w not in {"and", "or", "not"}]


@pytest.mark.parametrize(
    "page",
    [p for p in chapters() if p.name not in WITHOUT_EXERCISES],
    ids=_page_id,
)
def test_chapter_ends_with_exercises_before_its_side_by_side_table(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    match = EXERCISES_RE.search(text)
    assert match, f"docs/{_page_id(page)} has no '## Exercises' section"
    following = [m.group(0) for m in SECTION_RE.finditer(text, match.end())]
    assert len(following) == 1 and "side by side" in following[0].lower(), (
        f"docs/{_page_id(page)}: the exercises come last, just before the side-by-side "
        f"table; sections after them: {following}"
    )
    body = text[match.end() : text.index(following[0], match.end())]
    assert 2 <= len(ITEM_RE.findall(body)) <= 3, (
        f"docs/{_page_id(page)}: write two or three numbered exercises, each '1. **Title.**'"
    )


@pytest.mark.parametrize("page", doc_pages(), ids=_page_id)
def test_every_test_a_page_names_exists(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    missing = [f for f in sorted(set(TEST_FILE_RE.findall(text))) if not (REPO_ROOT / f).is_file()]
    missing += [
        name for name in sorted(set(TEST_NAME_RE.findall(text))) if name not in all_test_functions()
    ]
    for m in PYTEST_K_RE.finditer(text):
        names = functions_in(m["path"])
        for term in k_terms(m["q"] or m["w"]):
            if not any(term in name for name in names):
                missing.append(f"pytest {m['path']} -k ...{term}...")
    assert not missing, f"docs/{_page_id(page)} names tests that do not exist: {missing}"


def test_k_terms_and_the_pattern() -> None:
    assert k_terms("arrival_order or (random_workloads and not slow)") == [
        "arrival_order",
        "random_workloads",
        "slow",
    ]
    text = 'run `pytest tests/core/test_scheduler.py -k "a or b"` and pytest tests/x.py -k c'
    found = [(m["path"], m["q"] or m["w"]) for m in PYTEST_K_RE.finditer(text)]
    assert found == [("tests/core/test_scheduler.py", "a or b"), ("tests/x.py", "c")]
    assert "test_waiting_requests_are_admitted_in_arrival_order" in functions_in(
        "tests/core/test_scheduler.py"
    )
    assert functions_in("tests/no_such_file.py") == frozenset()
