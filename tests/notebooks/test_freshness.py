"""A notebook's stored outputs are what its code prints now.

The site shows the stored outputs (``mkdocs-jupyter`` with ``execute: false``), so each
code cell's stored text is compared with the same cell of the session's fresh execution
(shared with ``test_notebooks.py``): same words, numbers within a tolerance, timings,
rates, addresses and images left out (``freshness.py``). To refresh the stored outputs
after a change to the code::

    python -m tests.notebooks.test_notebooks --write
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.notebooks.freshness import cell_text, compare, lines_match, mask
from tests.notebooks.test_notebooks import NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_stored_outputs_match_a_fresh_run(path: Path, executed_notebook) -> None:
    stored = json.loads(path.read_text(encoding="utf-8"))
    fresh = executed_notebook(path)
    diffs = compare(stored, fresh)
    assert not diffs, (
        f"{path.name}: stored outputs differ from a fresh run; re-execute with "
        f"`python -m tests.notebooks.test_notebooks --write {path.stem}`\n"
        + "\n".join(str(d) for d in diffs)
    )


def _code_cell(*outputs: dict, source: str = "print(x)") -> dict:
    return {"cell_type": "code", "source": source, "outputs": list(outputs)}


def _stream(text: str, name: str = "stdout") -> dict:
    return {"output_type": "stream", "name": name, "text": text}


def test_compare_reports_cell_line_and_both_texts() -> None:
    stored = {
        "cells": [
            {"cell_type": "markdown", "source": "# T"},
            _code_cell(_stream("blocks: 16\nhit rate 0.500\n"), source="print(stats)\nmore()"),
        ]
    }
    fresh = {
        "cells": [
            {"cell_type": "markdown", "source": "# T"},
            _code_cell(_stream("blocks: 17\nhit rate 0.500\n")),
        ]
    }
    (diff,) = compare(stored, fresh)
    assert (diff.cell, diff.source, diff.line) == (1, "print(stats)", 1)
    assert (diff.stored, diff.fresh) == ("blocks: 16", "blocks: 17")
    assert "cell 1 ('print(stats)'), output line 1" in str(diff)


def test_compare_finds_a_log_line_the_stored_output_lacks() -> None:
    stored = {"cells": [_code_cell(_stream("3 requests\n"))]}
    log = "[minivllm INFO 12:01:02 core.py] KV cache: 512 blocks\n"
    fresh = {"cells": [_code_cell(_stream(log, name="stderr"), _stream("3 requests\n"))]}
    (diff,) = compare(stored, fresh)
    assert diff.fresh.startswith("[minivllm INFO <clock> core.py]")


def test_numbers_within_tolerance_timings_and_images_are_ignored() -> None:
    image = {"output_type": "display_data", "data": {"image/png": "AAAA", "text/plain": "<F>"}}
    stored = {
        "cells": [
            _code_cell(
                _stream("logprob -2.30259, took 1.5 s at 0x7f00aa\n"),
                image,
                {
                    "output_type": "execute_result",
                    "data": {"text/plain": "tensor([0.1000, 2.0000])"},
                },
            )
        ]
    }
    fresh = {
        "cells": [
            _code_cell(
                _stream("logprob -2.30261, took 9.25 s at 0x7f11bb\n"),
                {
                    "output_type": "execute_result",
                    "data": {"text/plain": "tensor([0.1001, 2.0000])"},
                },
            )
        ]
    }
    assert compare(stored, fresh) == []


@pytest.mark.parametrize(
    ("stored", "fresh", "same"),
    [
        ("p = 0.2500", "p = 0.2501", True),
        ("p = 0.25", "p = 0.30", False),
        ("16 blocks", "16 blocks", True),
        ("16 blocks", "17 blocks", False),
        ("16 blocks", "16.0 blocks", False),
        ("hit", "miss", False),
        ("1.5e-03", "1.5e-03", True),
    ],
)
def test_lines_match(stored: str, fresh: str, same: bool) -> None:
    assert lines_match(stored, fresh) is same


def test_a_cell_tagged_output_varies_is_compared_without_its_numbers() -> None:
    stored = {"cells": [_code_cell(_stream("64 engine steps; served at http://127.0.0.1:52085\n"))]}
    fresh = {"cells": [_code_cell(_stream("66 engine steps; served at http://127.0.0.1:60263\n"))]}
    assert [d.line for d in compare(stored, fresh)] == [1]
    stored["cells"][0]["metadata"] = {"tags": ["output-varies"]}
    assert compare(stored, fresh) == []
    fresh["cells"][0]["outputs"] = [_stream("66 engine runs; served at http://127.0.0.1:1\n")]
    assert [d.line for d in compare(stored, fresh)] == [1]


def test_mask_and_cell_text() -> None:
    bar = "Processed prompts: 100%|##########| 4/4 [00:01<00:00,  2.61it/s]"
    assert mask(bar) == "Processed prompts: <bar>| 4/4 [<elapsed>]"
    assert mask("880.5 tok/s in 41 ms") == "<time> in <time>"
    cell = _code_cell(_stream("a\n"), {"output_type": "error", "ename": "E", "evalue": "v"})
    assert cell_text(cell) == "a\nE: v\n"
