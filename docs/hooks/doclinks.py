"""The link schemes of minivllm's documentation, independent of mkdocs.

Chapters never type a line number. They name a symbol and this module finds its line:

- ``[](mini:minivllm/core/block_pool.py#BlockPool.free_blocks)`` -> the line of that
  ``def``/``class``/assignment in minivllm, computed now from the code with :mod:`ast`;
- ``[](vllm:vllm/v1/core/block_pool.py#BlockPool.free_blocks)`` -> the line in upstream
  vLLM at the pinned commit, read from the committed lock ``docs/vllm.lock.json``;
- an empty fenced block whose info string is ``python mini:<path>#<Symbol>`` -> the
  symbol's source, decorators included, with its real line numbers.

The mkdocs hook (``minivllm_docs.py``), the lock generator
(``docs/scripts/gen_vllm_lock.py``) and the tests all use this one resolver, so what the
tests check is exactly what the site shows.
"""

from __future__ import annotations

import ast
import json
import posixpath
import re
import subprocess
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

GITHUB_BLOB = "https://github.com/vllm-project/vllm/blob/{commit}/{path}"
GITHUB_TREE = "https://github.com/vllm-project/vllm/tree/{commit}/{path}"
SOURCE_PAGES_DIR = "source"
"""Generated line-numbered source pages live under this folder of the site."""

# [text](scheme:path#Symbol) -- text may be empty; path has no spaces, ')' or '#'.
LINK_RE = re.compile(
    r"\[(?P<text>[^\[\]]*)\]\((?P<scheme>mini|vllm):(?P<path>[^)#\s]+)(?:#(?P<symbol>[^)\s]+))?\)"
)
FENCE_RE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
INCLUDE_INFO_RE = re.compile(r"^\s*python\s+mini:(?P<path>[^#\s]+)#(?P<symbol>\S+)\s*$")
# An inline code span: a run of backticks, anything, the same run again.
CODE_SPAN_RE = re.compile(r"(?<!`)(?P<ticks>`+)(?!`).*?(?<!`)(?P=ticks)(?!`)")
C_SUFFIXES = (".c", ".cc", ".cpp", ".cu", ".cuh", ".h", ".hpp")


class SymbolError(LookupError):
    """A link names a file or symbol that does not exist."""


@dataclass(frozen=True)
class SymbolSpan:
    """Where a symbol lives in its file (1-based, inclusive)."""

    line: int
    """The line holding ``def``/``class`` (or the assignment); what links point at."""
    start: int
    """First line of the whole definition, decorators included."""
    end: int
    """Last line of the definition."""


@dataclass(frozen=True)
class Link:
    """One ``[text](scheme:path#symbol)`` occurrence in a markdown page."""

    scheme: str
    path: str
    symbol: str | None
    text: str
    lineno: int
    """Line of the markdown page the link is on (1-based), for error messages."""

    @property
    def target(self) -> str:
        """The link target as written, without the scheme."""
        return f"{self.path}#{self.symbol}" if self.symbol else self.path


# --------------------------------------------------------------------------- symbols


def _names_assigned(node: ast.stmt) -> list[str]:
    """Names bound by a plain or annotated assignment statement."""
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = list(node.targets)
    elif isinstance(node, ast.AnnAssign):
        targets = [node.target]
    names: list[str] = []
    for target in targets:
        elts = target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]
        names += [e.id for e in elts if isinstance(e, ast.Name)]
    return names


def _is_overload(node: ast.stmt) -> bool:
    decorators = getattr(node, "decorator_list", [])
    return any(
        (isinstance(d, ast.Name) and d.id == "overload")
        or (isinstance(d, ast.Attribute) and d.attr == "overload")
        for d in decorators
    )


def _find_in_body(body: list[ast.stmt], name: str) -> ast.stmt | None:
    """First definition of ``name`` in a block, in source order.

    Looks through ``if``/``try``/``with`` blocks too (``if TYPE_CHECKING:``, optional
    imports), but never into function bodies. ``@overload`` stubs are skipped so a link
    lands on the implementation.
    """
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == name and not _is_overload(node):
                return node
        elif name in _names_assigned(node):
            return node
        elif isinstance(node, (ast.If, ast.Try, ast.With, ast.AsyncWith)):
            blocks = [node.body, getattr(node, "orelse", []), getattr(node, "finalbody", [])]
            blocks += [h.body for h in getattr(node, "handlers", [])]
            for block in blocks:
                found = _find_in_body(block, name)
                if found is not None:
                    return found
    return None


def find_python_symbol(source: str, symbol: str, filename: str = "<source>") -> SymbolSpan:
    """Locate a dotted symbol (``Class.method``, ``function``, ``CONSTANT``) with ``ast``.

    Raises:
        SymbolError: when no part of the dotted path matches.
    """
    tree = ast.parse(source, filename=filename)
    body: list[ast.stmt] = tree.body
    node: ast.stmt | None = None
    parts = symbol.split(".")
    for depth, part in enumerate(parts):
        node = _find_in_body(body, part)
        where = ".".join(parts[:depth]) or filename
        if node is None:
            raise SymbolError(f"no def/class/assignment named {part!r} in {where}")
        if depth < len(parts) - 1:
            if not isinstance(node, ast.ClassDef):
                raise SymbolError(f"{'.'.join(parts[: depth + 1])!r} in {filename} is not a class")
            body = node.body
    assert node is not None
    decorators = getattr(node, "decorator_list", [])
    start = min([d.lineno for d in decorators] + [node.lineno])
    return SymbolSpan(line=node.lineno, start=start, end=node.end_lineno or node.lineno)


def find_c_symbol(source: str, symbol: str, filename: str = "<source>") -> SymbolSpan:
    """Locate a C/C++/CUDA definition: the first unindented line naming it as a definition.

    Upstream's kernels live in namespaces that clang-format does not indent, so a
    definition starts at column 0 while calls are indented inside function bodies.
    """
    name = re.escape(symbol)
    pattern = re.compile(
        rf"^(?:(?:struct|class|enum|union)\s+{name}\b|\S.*\b{name}\s*(?:<[^;]*>)?\s*\()"
    )
    for lineno, text in enumerate(source.splitlines(), start=1):
        if pattern.match(text) and not text.rstrip().endswith(";"):
            return SymbolSpan(line=lineno, start=lineno, end=lineno)
    raise SymbolError(f"no unindented definition of {symbol!r} in {filename}")


def find_symbol(root: Path, path: str, symbol: str) -> SymbolSpan:
    """Resolve ``path#symbol`` under ``root`` (Python via ast, C/CUDA via definitions)."""
    file = root / path
    if not file.is_file():
        raise SymbolError(f"file {path!r} does not exist under {root}")
    source = file.read_text(encoding="utf-8")
    if path.endswith(".py"):
        return find_python_symbol(source, symbol, filename=path)
    if path.endswith(C_SUFFIXES):
        return find_c_symbol(source, symbol, filename=path)
    raise SymbolError(f"symbols can only be resolved in Python or C/CUDA files, not {path!r}")


def line_defines(text: str, symbol: str) -> bool:
    """Whether a source line is the definition of the last part of a dotted symbol."""
    name = re.escape(symbol.rsplit(".", 1)[-1])
    return bool(
        re.match(rf"\s*(async\s+def|def|class)\s+{name}\b", text)
        or re.match(rf"\s*(?:[\w.]+\s*,\s*)*{name}\s*(?:,\s*[\w.]+\s*)*(?::|=(?!=))", text)
    )


# --------------------------------------------------------------------------- markdown


def _link_matches(line: str) -> list[re.Match[str]]:
    """Links of one line that do not start inside an inline code span.

    A link's text may itself hold code (``[`get_model`](vllm:...)``), so links are found
    on the whole line and only those whose ``[`` sits inside a code span are dropped:
    that is how a page shows the syntax literally.
    """
    spans = [m.span() for m in CODE_SPAN_RE.finditer(line)]
    return [
        m
        for m in LINK_RE.finditer(line)
        if not any(start <= m.start() < end for start, end in spans)
    ]


@dataclass
class _Fence:
    indent: str
    fence: str
    info: str
    opened_at: int
    body: list[str] = field(default_factory=list)

    def closes(self, line: str) -> bool:
        stripped = line.strip()
        char = self.fence[0]
        return len(stripped) >= len(self.fence) and stripped == char * len(stripped)


def iter_markdown(markdown: str) -> Iterator[tuple[str, object]]:
    """Split a page into ("text", line), ("fence", _Fence) events, fences complete."""
    fence: _Fence | None = None
    for lineno, line in enumerate(markdown.split("\n"), start=1):
        if fence is None:
            match = FENCE_RE.match(line)
            if match and not (match["fence"][0] == "`" and "`" in match["info"]):
                fence = _Fence(match["indent"], match["fence"], match["info"], lineno)
            else:
                yield "text", (lineno, line)
        elif fence.closes(line):
            yield "fence", fence
            fence = None
        else:
            fence.body.append(line)
    if fence is not None:  # unterminated fence: markdown treats the rest as code
        yield "fence", fence


def find_links(markdown: str) -> list[Link]:
    """Every mini:/vllm: link outside code, and every include block as a mini: link."""
    links: list[Link] = []
    for kind, item in iter_markdown(markdown):
        if kind == "text":
            lineno, line = item  # type: ignore[misc]
            for m in _link_matches(line):
                links.append(Link(m["scheme"], m["path"], m["symbol"], m["text"], lineno))
        else:
            include = INCLUDE_INFO_RE.match(item.info)  # type: ignore[union-attr]
            if include:
                lineno = item.opened_at  # type: ignore[union-attr]
                links.append(Link("mini", include["path"], include["symbol"], "", lineno))
    return links


# --------------------------------------------------------------------------- rewriting


def source_page_uri(path: str) -> str:
    """Docs-relative URI of the generated source page of a minivllm file."""
    return f"{SOURCE_PAGES_DIR}/{path}.md"


def load_lock(lock_path: Path) -> dict:
    """The vLLM lock file, or an empty lock (every vllm: link then fails) if absent."""
    if not lock_path.is_file():
        return {"commit": None, "symbols": {}, "files": []}
    return json.loads(lock_path.read_text(encoding="utf-8"))


class LinkRewriter:
    """Turns the link schemes of one page into plain markdown, collecting errors.

    Args:
        mini_root: the folder that holds ``minivllm/`` (the repository root).
        lock: the parsed ``docs/vllm.lock.json``.
    """

    def __init__(self, mini_root: Path, lock: dict) -> None:
        self.mini_root = mini_root
        self.lock = lock
        self._sources: dict[str, str] = {}

    def _source(self, path: str) -> str:
        if path not in self._sources:
            if not path.startswith("minivllm/") or not path.endswith(".py"):
                raise SymbolError(f"mini: links must name a minivllm/**/*.py file, not {path!r}")
            file = self.mini_root / path
            if not file.is_file():
                raise SymbolError(f"file {path!r} does not exist")
            self._sources[path] = file.read_text(encoding="utf-8")
        return self._sources[path]

    def mini_span(self, path: str, symbol: str) -> SymbolSpan:
        """Resolve a mini: symbol against the current code."""
        return find_python_symbol(self._source(path), symbol, filename=path)

    def _href(self, page_uri: str, path: str, line: int | None) -> str:
        rel = posixpath.relpath(source_page_uri(path), posixpath.dirname(page_uri) or ".")
        return f"{rel}#L{line}" if line else rel

    def render_link(self, link: Link, page_uri: str) -> str:
        """Markdown for one link; raises SymbolError when it does not resolve."""
        if link.scheme == "mini":
            self._source(link.path)
            line = self.mini_span(link.path, link.symbol).line if link.symbol else None
            name = posixpath.basename(link.path)
            label = f"{name}:{line}" if line else name
            href = self._href(page_uri, link.path, line)
        else:
            commit = self.lock.get("commit")
            if not commit:
                raise SymbolError("docs/vllm.lock.json is missing or has no commit")
            if link.symbol:
                line = self.lock["symbols"].get(link.target)
                if line is None:
                    raise SymbolError(
                        "not in docs/vllm.lock.json: run `python docs/scripts/gen_vllm_lock.py`"
                    )
                label = f"{link.path}:{line}"
                href = GITHUB_BLOB.format(commit=commit, path=link.path) + f"#L{line}"
            else:
                if link.path not in self.lock["files"]:
                    raise SymbolError(
                        "not in docs/vllm.lock.json: run `python docs/scripts/gen_vllm_lock.py`"
                    )
                label = link.path
                url = GITHUB_TREE if link.path.endswith("/") else GITHUB_BLOB
                href = url.format(commit=commit, path=link.path.rstrip("/"))
        text = link.text or f"`{label}`"
        title = f' "{link.symbol}"' if link.symbol else ""
        return f"[{text}]({href}{title})"

    def render_include(self, fence: _Fence, page_uri: str) -> list[str]:
        """The source of a symbol as a numbered code block, with a caption link."""
        match = INCLUDE_INFO_RE.match(fence.info)
        assert match is not None
        path, symbol = match["path"], match["symbol"]
        if any(line.strip() for line in fence.body):
            raise SymbolError("an include block must be empty: the hook fills it from the code")
        span = self.mini_span(path, symbol)
        lines = self._source(path).split("\n")[span.start - 1 : span.end]
        code = textwrap.dedent("\n".join(lines))
        longest = max((len(m) for m in re.findall(r"`+", code)), default=0)
        ticks = "`" * max(3, longest + 1)
        href = self._href(page_uri, path, span.line)
        label = f"{path}:{span.line}"
        ind = fence.indent
        caption = f'{ind}[`{label}`]({href} "{symbol}") &mdash; `{symbol}`'
        out = [caption, f"{ind}{{: .mini-caption }}", ""]
        out.append(f'{ind}{ticks}python linenums="{span.start}"')
        out += [f"{ind}{line}" if line else "" for line in code.split("\n")]
        out.append(f"{ind}{ticks}")
        return out

    def rewrite(self, markdown: str, page_uri: str) -> tuple[str, list[str]]:
        """Rewrite every link and include block of a page.

        Returns:
            The new markdown, and one error message per unresolved link (naming the page,
            the markdown line and the link). An unresolved link renders as
            ```UNRESOLVED scheme:target``` so ``mkdocs serve`` keeps working while the
            author fixes it.
        """
        out: list[str] = []
        errors: list[str] = []

        def fail(lineno: int, what: str, exc: Exception) -> None:
            errors.append(f"{page_uri}:{lineno}: unresolved link {what}: {exc}")

        for kind, item in iter_markdown(markdown):
            if kind == "text":
                lineno, line = item  # type: ignore[misc]
                pieces: list[str] = []
                pos = 0
                for m in _link_matches(line):
                    link = Link(m["scheme"], m["path"], m["symbol"], m["text"], lineno)
                    pieces.append(line[pos : m.start()])
                    try:
                        pieces.append(self.render_link(link, page_uri))
                    except (SymbolError, SyntaxError) as exc:
                        fail(lineno, f"'{link.scheme}:{link.target}'", exc)
                        pieces.append(f"`UNRESOLVED {link.scheme}:{link.target}`")
                    pos = m.end()
                pieces.append(line[pos:])
                out.append("".join(pieces))
                continue
            fence: _Fence = item  # type: ignore[assignment]
            if INCLUDE_INFO_RE.match(fence.info):
                try:
                    out += self.render_include(fence, page_uri)
                    continue
                except (SymbolError, SyntaxError) as exc:
                    fail(fence.opened_at, f"'{fence.info.strip()}'", exc)
            out.append(f"{fence.indent}{fence.fence}{fence.info}")
            out += fence.body
            out.append(f"{fence.indent}{fence.fence}")
        return "\n".join(out), errors


# --------------------------------------------------------------------------- pinning


def gitlink_commit(repo_root: Path, path: str = "vllm-ref") -> str:
    """The commit the repository records for the ``vllm-ref`` submodule.

    Reads ``git ls-tree HEAD``; before the gitlink is committed, falls back to the index
    (``git ls-files -s``).
    """
    for args in (["ls-tree", "HEAD", path], ["ls-files", "-s", path]):
        proc = subprocess.run(
            ["git", "-C", str(repo_root), *args], capture_output=True, text=True, check=False
        )
        fields = proc.stdout.split()
        if proc.returncode == 0 and fields and fields[0] == "160000":
            return fields[1] if args[0] == "ls-files" else fields[2]
    raise SymbolError(f"no gitlink (mode 160000) recorded for {path!r} in {repo_root}")
