"""The README's status table is the Benchmarks chapter's, with the same figures.

``docs/scripts/gen_readme_status.py`` renders the chapter's table of targets (its
``fig()`` figures read from the committed JSON) into the README; here the README's copy
must equal a fresh rendering, and the rendering must follow the JSON and fix the links.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.docs import load_script


@pytest.fixture(scope="module")
def gen():
    """The generator script, imported as a module."""
    return load_script("gen_readme_status")


def test_readme_table_matches_the_chapter(gen) -> None:
    readme = gen.README.read_text(encoding="utf-8")
    chapter = gen.CHAPTER.read_text(encoding="utf-8")
    assert gen.render(readme, chapter) == readme, (
        "README.md's status table differs from docs/benchmarks.md's: "
        "run `python docs/scripts/gen_readme_status.py`"
    )
    block = gen.between(readme, gen.START, gen.END, "README.md")
    assert "fig(" not in block and "](benchmarks/" not in block
    assert block.count("\n|") >= 6  # a header, its rule and a row per target


def _chapter(row: str) -> str:
    table = f"| a | b |\n|---|---|\n{row}"
    return f"# Benchmarks\n\n<!-- status-table -->\n{table}\n<!-- /status-table -->\n"


def test_rendering_reads_the_json_and_fixes_the_links(gen, tmp_path: Path) -> None:
    (tmp_path / "benchmarks").mkdir()
    figures = tmp_path / "benchmarks" / "t.json"
    row = (
        '| speed | {{ fig("benchmarks/t.json", "run.tok_s", ",.0f") }} tok/s '
        "([JSON](benchmarks/t.json), [round](#third-round), [graphs](cuda_graphs.md#x)) |"
    )
    readme = f"intro\n{gen.START}\nold\n{gen.END}\nrest\n"
    figures.write_text(json.dumps({"run": {"tok_s": 26123.4}}))
    first = gen.render(readme, _chapter(row), tmp_path)
    assert first == (
        f"intro\n{gen.START}\n| a | b |\n|---|---|\n| speed | 26,123 tok/s "
        "([JSON](docs/benchmarks/t.json), [round](docs/benchmarks.md#third-round), "
        f"[graphs](docs/cuda_graphs.md#x)) |\n{gen.END}\nrest\n"
    )
    assert gen.render(first, _chapter(row), tmp_path) == first  # idempotent
    figures.write_text(json.dumps({"run": {"tok_s": 27000.0}}))  # a re-run benchmark
    assert "| speed | 27,000 tok/s" in gen.render(first, _chapter(row), tmp_path)


@pytest.mark.parametrize(
    ("readme", "row", "message"),
    [
        ("no markers\n", "| x | y |", "README.md must hold"),
        (None, "| x | [code](mini:minivllm/llm.py#LLM) |", "only docs-relative links"),
    ],
)
def test_rendering_refuses_what_the_readme_cannot_show(gen, readme, row, message) -> None:
    readme = readme or f"{gen.START}\n{gen.END}\n"
    with pytest.raises(ValueError, match=message):
        gen.render(readme, _chapter(row))
