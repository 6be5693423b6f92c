"""Architecture's package graph is the real import graph, never a drawing that drifts.

``docs/scripts/gen_package_graph.py`` builds the mermaid block from minivllm's imports
(grimp, as import-linter uses); here a fresh block must equal the one in the chapter,
and an import added between two drawn packages must change it.
"""

from __future__ import annotations

import pytest

from tests.docs import load_script


@pytest.fixture(scope="module")
def gen():
    """The generator script, imported as a module."""
    pytest.importorskip("grimp", reason="grimp comes with import-linter: pip install -e '.[test]'")
    pytest.importorskip("tomllib")  # Python 3.11+: the script reads pyproject.toml
    return load_script("gen_package_graph")


def test_chapter_block_matches_the_imports(gen) -> None:
    current = gen.CHAPTER.read_text(encoding="utf-8")
    assert gen.START in current and gen.END in current
    assert gen.render(current) == current, (
        "the package graph in docs/architecture.md differs from the imports: "
        "run `python docs/scripts/gen_package_graph.py`"
    )


def test_graph_follows_the_layers_and_the_imports(gen, monkeypatch) -> None:
    block = gen.mermaid()
    order = [name for layer in gen.layers() for name in layer]
    arrows = [line.split(" --> ") for line in block.splitlines() if " --> " in line]
    assert len(arrows) > 20
    for src, dst in arrows:  # importer above imported: the layers contract, drawn
        assert order.index(src.strip()) < order.index(dst), (src, dst)
    # core sits above only the bookkeeping it uses (spec_decode's pure-NumPy proposer).
    assert "    engine --> core" in block
    assert all(dst.strip() == "spec_decode" for src, dst in arrows if src.strip() == "core")
    # An import the code does not have appears once the graph says it does.
    real = gen.package_edges
    monkeypatch.setattr(gen, "package_edges", lambda nodes: real(nodes) | {("cli", "core")})
    assert "    cli --> core" in gen.mermaid() and "    cli --> core" not in block
