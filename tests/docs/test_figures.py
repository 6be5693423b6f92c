"""Benchmark figures come from committed JSON: the resolver, and no figure typed by hand.

A chapter writes a measured number as ``{{ fig("benchmarks/x.json", "key", "spec") }}``
(``docs/hooks/figures.py``), so a re-run of a benchmark updates the text and a figure no
JSON holds cannot be written at all. The scan below finds numbers that look like
measurements (a unit of speed, time or bandwidth, an ``x`` speed-up, a percentage) anywhere
else in a page's prose and tables; code blocks and inline code are the reader's commands and
configuration, not results, and are skipped.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from doclinks import iter_markdown
from figures import FIG_RE, FigureError, FigureResolver, evaluate, find_figures, lookup

from tests.docs import DOCS_DIR, doc_pages

_NUMBER = r"(?<![\w.,/-])\d[\d,]*(?:\.\d+)?"
_RANGE = rf"{_NUMBER}(?:\s?(?:-|–|to)\s?\d[\d,]*(?:\.\d+)?)?"
_UNIT = (
    r"(?:\s?(?:(?:(?:output|prompt|total) )?tok(?:ens)?(?:/s| per second)|requests/s"
    r"|ms|us|µs|μs|GB/s|GiB/s|TB/s|TFLOP/s|TFLOPS)\b"
    r"|\ss\b"  # seconds need the space: "400s" is a plural
    r"|x(?!\w)|×|\s?%)"
)
MEASUREMENT_RE = re.compile(_RANGE + _UNIT)
"""``23,409 tok/s``, ``4.51 ms``, ``13-22 µs``, ``4.22 TB/s``, ``1.30x``, ``63 %``, ``5.7 s``."""

GOAL_RE = re.compile(
    r"\btargets?\b|\bat (?:most|least)\b|[<>]=|≥|≤|\bdefault\b|\btimeout\b", re.IGNORECASE
)
"""A goal set before measuring ("the target was 60 %", "at most 2 ms") or a setting
("0.25 s by default", "a timeout of 5 s") is not a result."""

NOT_MEASURED: dict[str, dict[str, str]] = {
    # chapter -> {figure as written: why it is not a measurement}
}
"""Numbers with a unit that are settings or definitions, not results; each one says why.

Kept short on purpose: prefer rephrasing. An entry that no longer matches fails the test,
so the list cannot outlive the text it excuses.
"""


# Inline code may run over a line break inside a paragraph (a quoted error message).
_CODE_SPAN_RE = re.compile(r"(?<!`)(`+)(?!`).+?(?<!`)\1(?!`)", re.DOTALL)


def _keep_lines(token: str) -> object:
    """A substitution that keeps the line breaks of what it replaces (for line numbers)."""
    return lambda m: token + "\n" * m[0].count("\n")


def _prose(paragraph: str) -> str:
    """A paragraph without figures, inline code and link targets; line breaks kept."""
    paragraph = FIG_RE.sub(_keep_lines(" FIG "), paragraph)
    paragraph = _CODE_SPAN_RE.sub(_keep_lines(" CODE "), paragraph)
    return re.sub(r"\]\([^)]*\)", "] ", paragraph)


def _paragraphs(markdown: str) -> list[tuple[int, str]]:
    """(first line, text) of each run of text lines between blank lines and code blocks."""
    blocks: list[tuple[int, list[str]]] = []
    previous = None
    for kind, item in iter_markdown(markdown):
        if kind != "text":
            previous = None
            continue
        lineno, line = item  # type: ignore[misc]
        if not line.strip():
            previous = None
        elif previous is not None and previous == lineno - 1:
            blocks[-1][1].append(line)
        else:
            blocks.append((lineno, [line]))
        previous = lineno if line.strip() else None
    return [(first, "\n".join(lines)) for first, lines in blocks]


def typed_figures(markdown: str) -> list[tuple[int, str]]:
    """(line, figure) for every measurement-looking number written outside ``fig()``."""
    found: list[tuple[int, str]] = []
    for first, paragraph in _paragraphs(markdown):
        prose = _prose(paragraph)
        for m in MEASUREMENT_RE.finditer(prose):
            lineno = first + prose.count("\n", 0, m.start())
            before, after = prose[max(0, m.start() - 30) : m.start()], prose[m.end() : m.end() + 12]
            if not (GOAL_RE.search(before) or GOAL_RE.search(after)):
                found.append((lineno, m[0]))
    return found


def _page_id(page: Path) -> str:
    return page.relative_to(DOCS_DIR).as_posix()


# --------------------------------------------------------------------------- the chapters


@pytest.mark.parametrize("page", doc_pages(), ids=_page_id)
def test_no_benchmark_figure_is_typed_by_hand(page: Path) -> None:
    """Every measured figure of a page is a fig() that reads it from docs/benchmarks/."""
    excused = NOT_MEASURED.get(_page_id(page), {})
    typed = typed_figures(page.read_text(encoding="utf-8"))
    unexcused = [
        f"docs/{_page_id(page)}:{lineno}: {figure!r}"
        for lineno, figure in typed
        if figure not in excused
    ]
    assert not unexcused, (
        "figures typed by hand; write each as "
        '{{ fig("benchmarks/<file>.json", "<key>", "<format>") }} from the JSON that holds it, '
        "or drop it if no committed JSON does:\n" + "\n".join(unexcused)
    )
    stale = set(excused) - {figure for _, figure in typed}
    assert not stale, f"NOT_MEASURED lists figures docs/{_page_id(page)} no longer has: {stale}"


def test_every_chapter_figure_resolves() -> None:
    """Each fig() of every page names a JSON file and a key that exist (the build's check)."""
    resolver = FigureResolver(DOCS_DIR)
    count, errors = 0, []
    for page in doc_pages():
        for lineno, args in find_figures(page.read_text(encoding="utf-8")):
            count += 1
            try:
                resolver.render(args)
            except FigureError as exc:
                errors.append(f"docs/{_page_id(page)}:{lineno}: fig({args}): {exc}")
    assert count > 0
    assert not errors, "\n".join(errors)


def test_scan_finds_typed_figures_and_skips_code_and_goals() -> None:
    page = "\n".join(
        [
            "Throughput was 23,409 tok/s, 1.30x the synchronous loop, at 63 % of the roofline.",
            "Offline 22,952 output tokens per second, 480 output tokens/s at rate 1.",
            "Attention took 4.51 ms; tiny shapes take 13-22 µs at 4.22 TB/s.",
            'Measured: {{ fig("benchmarks/t.json", "a.b", ",.0f") }} tok/s and `--timeout 5 s`.',
            "The target was 60 % of the roofline; a step should take at most 2 ms.",
            "One record per interval (0.25 s by default), a timeout of 30 s.",
            "```bash",
            "minivllm bench throughput  # 23,409 tok/s",
            "```",
            "A batch of 64 x 8,192 tokens, Qwen3-0.6B, 28 layers; 400s name no `param`.",
            "",
            "The error reads `rank 1 did not answer within 5.0 s",
            "after that`, and the step took 6.14 ms.",
        ]
    )
    assert typed_figures(page) == [
        (1, "23,409 tok/s"),
        (1, "1.30x"),
        (1, "63 %"),
        (2, "22,952 output tokens per second"),
        (2, "480 output tokens/s"),
        (3, "4.51 ms"),
        (3, "13-22 µs"),
        (3, "4.22 TB/s"),
        (13, "6.14 ms"),
    ]


# --------------------------------------------------------------------------- the resolver

SAMPLE = {
    "copy_bandwidth_bytes_per_s": 4222409580837.6,
    "minivllm": {"output_tokens_per_s": 23409.2, "fraction_of_roofline": 0.6252},
    "sync": {"output_tokens_per_s": 18055.4},
    "rows": [{"batch": 1, "ms": 0.384}, {"batch": 256, "ms": 4.027}],
    "profile": {"top": [{"name": "attn.v2", "us": 36080.0}], "num_steps": 8},
}


@pytest.fixture
def docs(tmp_path: Path) -> Path:
    (tmp_path / "benchmarks" / "sub").mkdir(parents=True)
    (tmp_path / "benchmarks" / "t.json").write_text(json.dumps(SAMPLE), encoding="utf-8")
    (tmp_path / "benchmarks" / "sub" / "bad.json").write_text("{not json", encoding="utf-8")
    (tmp_path / "elsewhere.json").write_text(json.dumps(SAMPLE), encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize(
    ("args", "text"),
    [
        ('"benchmarks/t.json", "minivllm.output_tokens_per_s", ",.0f"', "23,409"),
        ('"benchmarks/t.json", "copy_bandwidth_bytes_per_s / 1e12", ".2f"', "4.22"),
        ('"benchmarks/t.json", "minivllm.fraction_of_roofline * 100", ".0f"', "63"),
        ('"benchmarks/t.json", "100 - minivllm.fraction_of_roofline * 100", ".0f"', "37"),
        (
            '"benchmarks/t.json", "minivllm.output_tokens_per_s / sync.output_tokens_per_s", ".2f"',
            "1.30",
        ),
        ('"benchmarks/t.json", "rows.1.ms", ".2f"', "4.03"),
        ('"benchmarks/t.json", "rows[batch=1].ms", ".2f"', "0.38"),
        (
            '"benchmarks/t.json", "profile.top[name=attn.v2].us / profile.num_steps", ",.0f"',
            "4,510",
        ),
        ('"benchmarks/t.json", "rows[batch=256].ms"', "4.03"),
    ],
)
def test_resolver_renders_figures(docs: Path, args: str, text: str) -> None:
    html = FigureResolver(docs).render(args)
    assert html.endswith(f">{text}</span>"), html
    assert 'class="mini-fig" title="benchmarks/t.json: ' in html


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        ('"benchmarks/missing.json", "a"', "docs/benchmarks/missing.json does not exist"),
        ('"elsewhere.json", "minivllm.output_tokens_per_s"', "figures come from benchmarks/"),
        ('"benchmarks/sub/bad.json", "a"', "is not valid JSON"),
        ('"benchmarks/t.json", "minivllm.no_such_key"', "no key 'no_such_key'"),
        ('"benchmarks/t.json", "rows.7.ms"', "index 7 out of range"),
        ('"benchmarks/t.json", "rows[batch=3].ms"', "0 elements of 'rows[batch=3].ms' match"),
        ('"benchmarks/t.json", "minivllm"', "not a number"),
        ('"benchmarks/t.json", "minivllm.output_tokens_per_s", "q"', "bad format spec"),
        ('"benchmarks/t.json", "rows.0.ms ** 2"', "only key paths, numbers"),
        ('"benchmarks/t.json", "rows.0.ms(1)"', "only key paths, numbers"),
        ('"benchmarks/t.json"', "write fig("),
        ('"benchmarks/t.json", "rows.0.ms / (rows.0.ms - rows.0.ms)"', "divides by zero"),
    ],
)
def test_resolver_rejects_bad_figures(docs: Path, args: str, reason: str) -> None:
    with pytest.raises(FigureError, match=re.escape(reason)):
        FigureResolver(docs).render(args)


def test_rewrite_names_page_and_line_and_leaves_code_alone(docs: Path) -> None:
    markdown = "\n".join(
        [
            '# T\n\nGood: {{ fig("benchmarks/t.json", "rows.0.ms", ".3f") }} ms.',
            'Bad: {{ fig("benchmarks/t.json", "rows.0.nope") }}.',
            'Shown literally: `{{ fig("benchmarks/t.json", "nope") }}`.',
            "```text",
            '{{ fig("benchmarks/t.json", "nope") }}',
            "```",
        ]
    )
    text, errors = FigureResolver(docs).rewrite(markdown, "chapter.md")
    assert ">0.384</span> ms." in text
    assert errors == [
        'chapter.md:4: unresolved figure fig("benchmarks/t.json", "rows.0.nope"): '
        "no key 'nope' (in 'rows.0.nope')"
    ]
    assert text.count('fig("benchmarks/t.json", "nope")') == 2
    assert [lineno for lineno, _ in find_figures(markdown)] == [3, 4]


def test_lookup_and_evaluate() -> None:
    assert lookup(SAMPLE, "rows[batch=256]") == {"batch": 256, "ms": 4.027}
    assert evaluate(SAMPLE, "(rows.0.ms + rows.1.ms) * 1000 / 2") == pytest.approx(2205.5)
    assert evaluate(SAMPLE, "-rows.0.ms") == pytest.approx(-0.384)
    with pytest.raises(FigureError, match="bad key path"):
        lookup(SAMPLE, "rows..ms")
