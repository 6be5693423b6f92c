"""Compare a notebook's stored outputs with a fresh execution of it.

The site shows the notebooks with their stored outputs and never runs them, so a stored
output that the code no longer produces would teach something false. This module lines
up the text a cell printed when it was stored with the text it prints now:

- text only: ``stream`` output (stdout and stderr) and the ``text/plain`` of results;
  outputs that carry an image (plots) are skipped, pixels differ across library versions;
- numbers compared within a tolerance (integers exactly), since float printing can move in
  the last digits across torch builds;
- timings, rates, progress bars, local ports and memory addresses masked first: they differ
  on every run;
- a cell tagged ``output-varies`` (cell metadata ``tags``) is compared without its numbers:
  its words must match, but what it counts depends on timing (a server's step count under a
  burst of requests), so it is not a claim about the code.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

REL_TOL = 1e-2
"""Relative tolerance for a float printed in a stored output (plus ``ABS_TOL``)."""
ABS_TOL = 1e-3

_MASKS: list[tuple[re.Pattern[str], str]] = [
    # tqdm bars: "Processed prompts: 100%|####| 4/4 [00:01<00:00,  2.61it/s, ...]"
    (re.compile(r"\[\d+:\d+(?::\d+)?<[^\]]*\]"), "[<elapsed>]"),
    (re.compile(r"\d+%\|[^|\n]*\|"), "<bar>|"),
    (re.compile(r"0x[0-9a-fA-F]+"), "0x<addr>"),
    (re.compile(r"\b(127\.0\.0\.1|localhost):\d+"), r"\1:<port>"),
    (re.compile(r"\b\d\d:\d\d:\d\d(?:[.,]\d+)?\b"), "<clock>"),
    # a duration or a rate: "3.2 s", "41 ms", "12.5 it/s", "880 tok/s", "0.95 seconds"
    (
        re.compile(
            r"\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?\s*"
            r"(?:s|sec|seconds|ms|us|µs|ns|it/s|s/it|tok/s|tokens/s|toks/s|req/s|requests/s)\b"
        ),
        "<time>",
    ),
]
VARIES_TAG = "output-varies"
"""Cell tag: the cell's printed numbers depend on timing; only its words are compared."""

_NUMBER_RE = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


def mask(text: str) -> str:
    """Text with timings, rates, bars, clocks and addresses replaced by fixed tokens."""
    for pattern, token in _MASKS:
        text = pattern.sub(token, text)
    return text


def cell_text(cell: dict) -> str:
    """The text a code cell showed: streams and plain-text results, images skipped."""
    parts: list[str] = []
    for out in cell.get("outputs", []):
        kind = out.get("output_type")
        if kind == "stream":
            text = out.get("text", "")
            parts.append(text if isinstance(text, str) else "".join(text))
        elif kind in ("execute_result", "display_data"):
            data = out.get("data", {})
            if any(key.startswith("image/") for key in data):
                continue
            plain = data.get("text/plain", "")
            parts.append((plain if isinstance(plain, str) else "".join(plain)) + "\n")
        elif kind == "error":
            parts.append(f"{out.get('ename')}: {out.get('evalue')}\n")
    return "".join(parts)


def _numbers_match(stored: str, fresh: str) -> bool:
    if "." not in stored and "e" not in stored.lower():
        return int(stored) == int(fresh) if "." not in fresh else False
    a, b = float(stored), float(fresh)
    return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=ABS_TOL)


def lines_match(stored: str, fresh: str, numbers: bool = True) -> bool:
    """Same words, and (unless ``numbers`` is false) the same numbers within the tolerance."""
    if _NUMBER_RE.sub("#", stored) != _NUMBER_RE.sub("#", fresh):
        return False
    if not numbers:
        return True
    pairs = zip(_NUMBER_RE.findall(stored), _NUMBER_RE.findall(fresh))
    return all(_numbers_match(a, b) for a, b in pairs)


@dataclass(frozen=True)
class Difference:
    """The first line where a cell's stored text and its fresh text disagree."""

    cell: int
    """Index of the cell in the notebook (0-based, markdown cells counted)."""
    source: str
    """The first line of the cell's source, to find it."""
    line: int
    """Line of the cell's text output (1-based)."""
    stored: str
    fresh: str

    def __str__(self) -> str:
        return (
            f"cell {self.cell} ({self.source!r}), output line {self.line}:\n"
            f"    stored: {self.stored!r}\n"
            f"    fresh:  {self.fresh!r}"
        )


def compare(stored_nb: dict, fresh_nb: dict) -> list[Difference]:
    """The first difference of every code cell whose stored text the code no longer prints.

    Both notebooks must have the same cells (the fresh one is an execution of the other).
    """
    diffs: list[Difference] = []
    stored_cells, fresh_cells = stored_nb["cells"], fresh_nb["cells"]
    assert len(stored_cells) == len(fresh_cells), "the fresh run must be of the same notebook"
    for index, (old, new) in enumerate(zip(stored_cells, fresh_cells)):
        if old.get("cell_type") != "code":
            continue
        source = old.get("source", "")
        source = source if isinstance(source, str) else "".join(source)
        first = source.strip().split("\n", 1)[0]
        numbers = VARIES_TAG not in old.get("metadata", {}).get("tags", [])
        old_lines = mask(cell_text(old)).rstrip("\n").split("\n")
        new_lines = mask(cell_text(new)).rstrip("\n").split("\n")
        for n in range(max(len(old_lines), len(new_lines))):
            a = old_lines[n] if n < len(old_lines) else "<no line>"
            b = new_lines[n] if n < len(new_lines) else "<no line>"
            both = n < len(old_lines) and n < len(new_lines)
            if a == b or (both and lines_match(a, b, numbers)):
                continue
            diffs.append(Difference(index, first, n + 1, a, b))
            break
    return diffs
