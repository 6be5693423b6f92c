"""mkdocs hooks that make minivllm's documentation links impossible to rot.

Registered in ``mkdocs.yml`` under ``hooks:``. On every build they

1. generate a line-numbered, syntax-highlighted source page for every
   ``minivllm/**/*.py`` file (virtual files under ``source/``, never committed), each
   line an anchor ``#L<n>``;
2. generate the API reference (one mkdocstrings page per subpackage, under ``api/``), so
   a new module appears there without anyone editing a page;
3. rewrite ``mini:``/``vllm:`` links and fill ``python mini:`` include blocks on every
   page (see ``doclinks.py``), and put in the benchmark figures written as
   ``{{ fig("benchmarks/x.json", "key", "spec") }}`` from the committed JSON (see
   ``figures.py``); an unresolved one is logged as an error, which fails
   ``mkdocs build --strict`` and names the page, the line and the link or figure;
4. drop nav entries of chapters that are not written yet, and warn (failing a strict
   build) about a chapter that exists but is missing from the nav.

Upstream vLLM has a similar preprocessor, ``docs/mkdocs/hooks/url_schemes.py``, which
rewrites repository paths into GitHub links on ``main``; ours pins links to one commit and
to symbols, so they stay right when either side changes.
"""

from __future__ import annotations

import html
import logging
import re
from pathlib import Path

from doclinks import SOURCE_PAGES_DIR, LinkRewriter, load_lock, source_page_uri
from figures import FigureResolver
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page
from pygments.lexers import PythonLexer
from pygments.token import STANDARD_TYPES, _TokenType

log = logging.getLogger("mkdocs.plugins.minivllm_docs")

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "minivllm"
API_DIR = "api"
API_INDEX = f"{API_DIR}/index.md"

_rewriter: LinkRewriter | None = None
_figures: FigureResolver | None = None


# --------------------------------------------------------------------------- source pages


def _css_class(ttype: _TokenType) -> str:
    """Pygments' short CSS class for a token type (the one Material's theme styles)."""
    while ttype not in STANDARD_TYPES:
        ttype = ttype.parent
    return STANDARD_TYPES[ttype]


def highlight_lines(source: str) -> list[str]:
    """Highlight Python source and return one HTML string per source line.

    Pygments' own HTML formatter lets a token (a docstring) span lines; splitting every
    token at newlines instead keeps each line a self-contained element that can carry
    its own anchor.
    """
    lexer = PythonLexer(stripnl=False, ensurenl=False)
    lines: list[list[str]] = [[]]
    for ttype, value in lexer.get_tokens(source):
        cls = _css_class(ttype)
        for i, part in enumerate(value.split("\n")):
            if i:
                lines.append([])
            if part:
                text = html.escape(part, quote=False)
                lines[-1].append(f'<span class="{cls}">{text}</span>' if cls else text)
    return ["".join(parts) for parts in lines][: len(source.splitlines())]


def _module_name(rel: str) -> str:
    """``minivllm/core/block_pool.py`` -> ``minivllm.core.block_pool``."""
    parts = rel[: -len(".py")].split("/")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _api_page_of(rel: str) -> str:
    """The generated API page that documents a minivllm file."""
    parts = rel.split("/")
    return f"{API_DIR}/{parts[1]}.md" if len(parts) > 2 else f"{API_DIR}/{PACKAGE}.md"


SOURCE_PLACEHOLDER = "MINIVLLM-SOURCE-LISTING"
"""Stands in for the listing while Markdown runs; ``on_page_content`` swaps it in.

Thousands of highlighted spans are slow to push through Markdown's raw-HTML handling
(twice: Markdown's own pass and mkdocs' anchor scan), and there is nothing to convert.
"""


def render_source_page(rel: str, num_lines: int) -> str:
    """Markdown for the source page of one file (the listing is added after Markdown)."""
    page_dir = source_page_uri(rel).rsplit("/", 1)[0]
    depth = page_dir.count("/") + 1
    api = "../" * depth + _api_page_of(rel)
    out = [
        "---",
        "hide:",
        "  - toc",
        "search:",
        "  exclude: true",
        "---",
        "",
        f"# `{rel}`",
        "",
        f"{num_lines} lines. API reference: [`{_module_name(rel)}`]({api}). Every line is "
        "an anchor: the `mini:` links of the chapters point here.",
        "",
    ]
    if not num_lines:
        out.append("This file is empty: it only marks the folder as a Python package.")
    else:
        out.append(SOURCE_PLACEHOLDER)
    return "\n".join(out) + "\n"


def render_source_listing(source: str) -> str:
    """The highlighted listing: one block element per line, each with id ``L<n>``."""
    rows = "".join(
        f'<span class="mini-line" id="L{n}"><a class="mini-lineno" href="#L{n}">{n}</a>'
        f"{code}</span>"
        for n, code in enumerate(highlight_lines(source), start=1)
    )
    return f'<div class="highlight mini-source"><pre><code>{rows}</code></pre></div>'


def minivllm_files() -> list[str]:
    """Every ``minivllm/**/*.py`` path, relative to the repository root, sorted."""
    root = REPO_ROOT / PACKAGE
    return sorted(
        p.relative_to(REPO_ROOT).as_posix()
        for p in root.rglob("*.py")
        if "__pycache__" not in p.parts
    )


# --------------------------------------------------------------------------- API pages


def api_pages() -> dict[str, str]:
    """Generated API pages: ``{src_uri: markdown}``, one per subpackage plus top level."""
    root = REPO_ROOT / PACKAGE
    pages: dict[str, str] = {}
    top = sorted(p.stem for p in root.glob("*.py") if p.stem != "__init__")
    body = [f"# `{PACKAGE}`", "", "Top-level modules of the package.", ""]
    body += [f"::: {PACKAGE}.{name}\n" for name in top]
    pages[f"{API_DIR}/{PACKAGE}.md"] = "\n".join(body)
    subpackages = sorted(
        p.parent.name for p in root.glob("*/__init__.py") if "__pycache__" not in p.parts
    )
    for sub in subpackages:
        pages[f"{API_DIR}/{sub}.md"] = (
            f"# `{PACKAGE}.{sub}`\n\n"
            f"::: {PACKAGE}.{sub}\n"
            "    options:\n"
            "      show_submodules: true\n"
        )
    rows = [f"| [`{PACKAGE}`]({PACKAGE}.md) | top-level modules: {', '.join(top)} |"]
    rows += [f"| [`{PACKAGE}.{sub}`]({sub}.md) | the `{sub}` subpackage |" for sub in subpackages]
    pages[API_INDEX] = "\n".join(
        [
            "# API reference",
            "",
            "Generated from the docstrings by mkdocstrings, one page per subpackage. The",
            "chapters explain why the code is shaped the way it is; these pages list what",
            "each class and function takes and returns.",
            "",
            "| page | contents |",
            "|---|---|",
            *rows,
            "",
        ]
    )
    return pages


# --------------------------------------------------------------------------- nav


def _nav_title(page_uri: str) -> str:
    stem = page_uri.rsplit("/", 1)[-1][: -len(".md")]
    return f"{PACKAGE}.{stem}" if stem != PACKAGE else f"{PACKAGE} (top level)"


def _filter_nav(items: list, present: set[str], api: list) -> list:
    """Drop entries whose page does not exist yet; expand the API reference entry."""
    kept: list = []
    for item in items:
        title, value = next(iter(item.items())) if isinstance(item, dict) else (None, item)
        if isinstance(value, list):
            value = _filter_nav(value, present, api)
            if not value:
                continue
        elif value == API_INDEX:
            value = api
        elif value.endswith(".md") and value not in present:
            log.info("nav: %s is not written yet; left out of the navigation", value)
            continue
        kept.append({title: value} if title is not None else value)
    return kept


def _nav_pages(items: list) -> set[str]:
    pages: set[str] = set()
    for item in items:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        if isinstance(value, list):
            pages |= _nav_pages(value)
        else:
            pages.add(value)
    return pages


# --------------------------------------------------------------------------- hooks


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add the generated pages, and fit the nav to the chapters that exist."""
    global _rewriter, _figures
    _rewriter = LinkRewriter(REPO_ROOT, load_lock(Path(config.docs_dir) / "vllm.lock.json"))
    _figures = FigureResolver(Path(config.docs_dir))
    for rel in minivllm_files():
        num_lines = len((REPO_ROOT / rel).read_text(encoding="utf-8").splitlines())
        content = render_source_page(rel, num_lines)
        files.append(File.generated(config, source_page_uri(rel), content=content))
    generated_api = api_pages()
    for uri, content in generated_api.items():
        files.append(File.generated(config, uri, content=content))

    if config.nav is not None:
        api = [API_INDEX] + [
            {_nav_title(uri): uri} for uri in generated_api if uri != API_INDEX
        ]
        present = {f.src_uri for f in files.documentation_pages()}
        config.nav = _filter_nav(config.nav, present, api)
        in_nav = _nav_pages(config.nav)
        for f in files.documentation_pages():
            if "/" not in f.src_uri and f.src_uri not in in_nav:
                log.warning(
                    "chapter docs/%s is not in the nav of mkdocs.yml: add it where it belongs "
                    "in the reading order",
                    f.src_uri,
                )
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Resolve mini:/vllm: links, include blocks and benchmark figures.

    Logs an error per unresolved one (naming page and line), which fails a strict build.
    """
    uri = page.file.src_uri
    if uri.startswith(f"{SOURCE_PAGES_DIR}/") or _rewriter is None or _figures is None:
        return markdown
    text, errors = _figures.rewrite(markdown, uri)
    text, link_errors = _rewriter.rewrite(text, uri)
    for error in errors + link_errors:
        log.error("docs/%s", error)
    return text


LEFTOVER_RE = re.compile(r'(?:href|src)="(?P<url>(?:mini|vllm):[^"]*)"')


def on_page_content(html_text: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Put the listing into source pages; flag mini:/vllm: URLs that escaped the rewriter.

    A URL escapes with syntax the rewriter does not recognise (a reference-style link, a
    link split over two lines); without this check the browser would get a dead link.
    """
    uri = page.file.src_uri
    marker = f"<p>{SOURCE_PLACEHOLDER}</p>"
    if uri.startswith(f"{SOURCE_PAGES_DIR}/") and marker in html_text:
        rel = uri[len(SOURCE_PAGES_DIR) + 1 : -len(".md")]
        source = (REPO_ROOT / rel).read_text(encoding="utf-8")
        html_text = html_text.replace(marker, render_source_listing(source))
        # mkdocs validates #L<n> links against the ids it saw while rendering Markdown.
        num_lines = len(source.splitlines())
        page.present_anchor_ids = (page.present_anchor_ids or set()) | {
            f"L{n}" for n in range(1, num_lines + 1)
        }
        return html_text
    for match in LEFTOVER_RE.finditer(html_text):
        log.error(
            "docs/%s: link %r was not resolved: write it as [text](scheme:path#Symbol) "
            "on one line",
            page.file.src_uri,
            html.unescape(match["url"]),
        )
    return html_text
