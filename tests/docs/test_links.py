"""The link schemes: resolver, rewriter, lock file and coverage of the package."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from doclinks import (
    LinkRewriter,
    SymbolError,
    find_c_symbol,
    find_links,
    find_python_symbol,
    gitlink_commit,
    line_defines,
    load_lock,
)

from tests.docs import (
    DOCS_DIR,
    REPO_ROOT,
    chapters,
    doc_pages,
    engine_chapters,
    load_script,
)

LOCK_PATH = DOCS_DIR / "vllm.lock.json"


def _load_lock_script():
    return load_script("gen_vllm_lock")


def _rel(page: Path) -> str:
    return page.relative_to(REPO_ROOT).as_posix()


# --------------------------------------------------------------------------- the real docs


def test_every_mini_link_lands_on_its_definition() -> None:
    """The line a mini: link points at holds the named def/class/assignment."""
    wrong = []
    checked = 0
    for page in doc_pages():
        for link in find_links(page.read_text(encoding="utf-8")):
            if link.scheme != "mini" or not link.symbol:
                continue
            source = (REPO_ROOT / link.path).read_text(encoding="utf-8")
            try:
                span = find_python_symbol(source, link.symbol, link.path)
            except SymbolError as exc:
                wrong.append(f"{_rel(page)}:{link.lineno}: {link.target}: {exc}")
                continue
            text = source.splitlines()[span.line - 1]
            checked += 1
            if not line_defines(text, link.symbol):
                wrong.append(f"{_rel(page)}:{link.lineno}: {link.target} -> {text!r}")
    assert not wrong, "mini: links that miss their definition:\n" + "\n".join(wrong)
    assert checked > 0, "no mini: symbol link found in docs/"


def test_every_link_resolves() -> None:
    """Every page rewrites without an unresolved mini:/vllm: link (what the hook does)."""
    rewriter = LinkRewriter(REPO_ROOT, load_lock(LOCK_PATH))
    errors = []
    for page in doc_pages():
        uri = page.relative_to(DOCS_DIR).as_posix()
        errors += rewriter.rewrite(page.read_text(encoding="utf-8"), uri)[1]
    assert not errors, "\n".join(errors)


def test_lock_commit_is_the_submodule_commit() -> None:
    """The lock pins the commit the repository records for vllm-ref."""
    lock = json.loads(LOCK_PATH.read_text(encoding="utf-8"))
    assert lock["commit"] == gitlink_commit(REPO_ROOT)


def test_lock_lists_exactly_the_linked_symbols() -> None:
    """No vllm: link is missing from the lock, and the lock holds nothing unlinked."""
    lock = json.loads(LOCK_PATH.read_text(encoding="utf-8"))
    symbols, files = set(), set()
    for page in doc_pages():
        for link in find_links(page.read_text(encoding="utf-8")):
            if link.scheme == "vllm":
                files.add(link.path)
                if link.symbol:
                    symbols.add(link.target)
    assert set(lock["symbols"]) == symbols, "run `python docs/scripts/gen_vllm_lock.py`"
    assert set(lock["files"]) == files, "run `python docs/scripts/gen_vllm_lock.py`"
    assert list(lock["symbols"]) == sorted(lock["symbols"])
    assert lock["files"] == sorted(lock["files"])


def test_lock_matches_fresh_extraction_from_vllm_ref() -> None:
    """With vllm-ref populated, regenerating the lock changes nothing."""
    script = _load_lock_script()
    try:
        fresh = script.extract()
    except script.LockError as exc:
        if "not populated" in str(exc):
            pytest.skip(f"vllm-ref is not populated ({exc})")
        raise
    assert script.dumps(fresh) == LOCK_PATH.read_text(encoding="utf-8"), (
        "docs/vllm.lock.json is stale: run `python docs/scripts/gen_vllm_lock.py`"
    )


def test_every_module_is_linked_from_a_chapter() -> None:
    """Every non-empty minivllm module is explained (mini:-linked) in an engine chapter."""
    modules = {
        p.relative_to(REPO_ROOT).as_posix()
        for p in (REPO_ROOT / "minivllm").rglob("*.py")
        if "__pycache__" not in p.parts
        and not (p.name == "__init__.py" and not p.read_text(encoding="utf-8").strip())
    }
    linked = {
        link.path
        for page in engine_chapters()
        for link in find_links(page.read_text(encoding="utf-8"))
        if link.scheme == "mini"
    }
    unlinked = sorted(modules - linked)
    assert not unlinked, (
        f"{len(unlinked)} modules have no mini: link from any chapter: " + ", ".join(unlinked)
    )


def test_every_chapter_links_upstream() -> None:
    """Every chapter links at least one upstream symbol."""
    pages = chapters()
    assert pages, "no chapter in docs/"
    missing = [
        _rel(page)
        for page in pages
        if not any(
            link.scheme == "vllm" and link.symbol
            for link in find_links(page.read_text(encoding="utf-8"))
        )
    ]
    assert not missing, f"chapters without a vllm: symbol link: {missing}"


# --------------------------------------------------------------------------- the resolver

FAKE_MODULE = '''\
"""A module made up for the tests."""

import functools

LIMIT: int = 4
first, second = 1, 2


@functools.lru_cache
def helper(x):
    """Return x."""
    return x


class Box:
    """A box."""

    size = 3

    @property
    def volume(self):
        return self.size ** 3

    def grow(self, by):
        self.size += by


if LIMIT:
    def conditional():
        return 1
'''


def _line_of(source: str, needle: str) -> int:
    """1-based line of the first line containing needle (the independent oracle)."""
    return next(i for i, t in enumerate(source.splitlines(), 1) if needle in t)


@pytest.mark.parametrize(
    ("symbol", "needle", "first_needle"),
    [
        ("helper", "def helper", "@functools.lru_cache"),
        ("Box", "class Box", "class Box"),
        ("Box.volume", "def volume", "@property"),
        ("Box.grow", "def grow", "def grow"),
        ("Box.size", "size = 3", "size = 3"),
        ("LIMIT", "LIMIT: int", "LIMIT: int"),
        ("second", "first, second", "first, second"),
        ("conditional", "def conditional", "def conditional"),
    ],
)
def test_find_python_symbol(symbol: str, needle: str, first_needle: str) -> None:
    span = find_python_symbol(FAKE_MODULE, symbol)
    assert span.line == _line_of(FAKE_MODULE, needle)
    assert span.start == _line_of(FAKE_MODULE, first_needle)
    assert line_defines(FAKE_MODULE.splitlines()[span.line - 1], symbol)


@pytest.mark.parametrize("symbol", ["missing", "Box.missing", "helper.x", "Box.grow.inner"])
def test_find_python_symbol_rejects_unknown(symbol: str) -> None:
    with pytest.raises(SymbolError):
        find_python_symbol(FAKE_MODULE, symbol)


def test_find_c_symbol_skips_declarations_and_calls() -> None:
    source = textwrap.dedent(
        """\
        __device__ void my_kernel(float* x);
        template <typename T>
        __global__ void my_kernel(
            T* out) {
          other_kernel<T>(out);
        }
        void caller() {
          my_kernel<<<1, 1>>>(nullptr);
        }
        """
    )
    assert find_c_symbol(source, "my_kernel").line == 3
    with pytest.raises(SymbolError):
        find_c_symbol(source, "other_kernel")


# --------------------------------------------------------------------------- the rewriter


@pytest.fixture
def fake_repo(tmp_path: Path) -> Path:
    (tmp_path / "minivllm").mkdir()
    (tmp_path / "minivllm" / "fake.py").write_text(FAKE_MODULE, encoding="utf-8")
    return tmp_path


FAKE_LOCK = {
    "commit": "0123456789abcdef0123456789abcdef01234567",
    "symbols": {"vllm/v1/core/block_pool.py#BlockPool": 130},
    "files": ["vllm/v1/core/block_pool.py", "vllm/v1/core/"],
}


def test_rewriter_renders_links_and_includes(fake_repo: Path) -> None:
    markdown = textwrap.dedent(
        """\
        # Page

        See [](mini:minivllm/fake.py#Box.grow) and [the `Box`](mini:minivllm/fake.py#Box),
        the file [](mini:minivllm/fake.py), upstream [](vllm:vllm/v1/core/block_pool.py#BlockPool)
        and its folder [](vllm:vllm/v1/core/).

        Syntax shown as code stays code: `[](mini:minivllm/fake.py#nothing)`.
        A bracket in code `[0, n)` before a link: [`grow`](mini:minivllm/fake.py#Box.grow).

        ```markdown
        [](mini:minivllm/fake.py#also_nothing)
        ```

        ```python mini:minivllm/fake.py#Box.volume
        ```
        """
    )
    text, errors = LinkRewriter(fake_repo, FAKE_LOCK).rewrite(markdown, "guide/page.md")
    assert errors == []
    grow = _line_of(FAKE_MODULE, "def grow")
    box = _line_of(FAKE_MODULE, "class Box")
    href = "../source/minivllm/fake.py.md"
    assert f'[`fake.py:{grow}`]({href}#L{grow} "Box.grow")' in text
    assert f'[the `Box`]({href}#L{box} "Box")' in text
    assert f'`[0, n)` before a link: [`grow`]({href}#L{grow} "Box.grow")' in text
    assert f"[`fake.py`]({href})" in text
    blob = f"https://github.com/vllm-project/vllm/blob/{FAKE_LOCK['commit']}"
    assert f'[`vllm/v1/core/block_pool.py:130`]({blob}/vllm/v1/core/block_pool.py#L130' in text
    tree = f"https://github.com/vllm-project/vllm/tree/{FAKE_LOCK['commit']}/vllm/v1/core)"
    assert tree in text
    assert "`[](mini:minivllm/fake.py#nothing)`" in text
    assert "[](mini:minivllm/fake.py#also_nothing)" in text
    # The include: decorator first, real first line number, dedented body, caption link.
    start = _line_of(FAKE_MODULE, "@property")
    assert f'```python linenums="{start}"\n@property\ndef volume(self):\n' in text
    assert f"#L{_line_of(FAKE_MODULE, 'def volume')}" in text


@pytest.mark.parametrize(
    ("link", "reason"),
    [
        ("[](mini:minivllm/fake.py#Box.shrink)", "'shrink'"),
        ("[](mini:minivllm/absent.py#Box)", "does not exist"),
        ("[](mini:README.md)", "minivllm/**/*.py"),
        ("[](vllm:vllm/v1/core/block_pool.py#BlockPool.free_blocks)", "gen_vllm_lock"),
        ("[](vllm:vllm/v1/engine/core.py)", "gen_vllm_lock"),
    ],
)
def test_rewriter_reports_unresolved_links(fake_repo: Path, link: str, reason: str) -> None:
    markdown = f"# Page\n\nA broken link: {link}.\n"
    text, errors = LinkRewriter(fake_repo, FAKE_LOCK).rewrite(markdown, "page.md")
    assert len(errors) == 1
    assert errors[0].startswith("page.md:3: unresolved link ")
    assert link[3:-1] in errors[0] and reason in errors[0]
    assert "UNRESOLVED" in text


def test_rewriter_rejects_bad_include_blocks(fake_repo: Path) -> None:
    markdown = textwrap.dedent(
        """\
        ```python mini:minivllm/fake.py#helper
        pasted code is not allowed
        ```

        ```python mini:minivllm/fake.py#nope
        ```
        """
    )
    _, errors = LinkRewriter(fake_repo, FAKE_LOCK).rewrite(markdown, "page.md")
    assert len(errors) == 2
    assert errors[0].startswith("page.md:1:") and "must be empty" in errors[0]
    assert errors[1].startswith("page.md:5:") and "'nope'" in errors[1]
