"""The site builds strictly, and an unresolved link or figure fails a strict build."""

from __future__ import annotations

import html
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from urllib.parse import unquote, urljoin

import pytest

from tests.docs import HOOKS_DIR, REPO_ROOT
from tests.docs.conftest import mkdocs_env

SOURCE_LINK_RE = re.compile(r'href="(?P<href>[^"#]*source/minivllm/[^"#]*)#(?P<anchor>L\d+)"')


def _page_html(site: Path, page_url: str) -> str:
    """The HTML file behind a directory URL of the built site."""
    path = site / unquote(page_url).lstrip("/")
    return (path / "index.html" if path.is_dir() else path).read_text(encoding="utf-8")


def test_site_builds_strictly(built_site: tuple[Path, subprocess.CompletedProcess]) -> None:
    site, proc = built_site
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    assert (site / "index.html").is_file()
    # A line-numbered source page per minivllm file, each line an anchor.
    for py in (REPO_ROOT / "minivllm").rglob("*.py"):
        if "__pycache__" in py.parts:
            continue
        rel = py.relative_to(REPO_ROOT).as_posix()
        page = _page_html(site, f"source/{rel}/")
        lines = len(py.read_text(encoding="utf-8").splitlines())
        if lines:
            assert f'id="L{lines}"' in page and f'id="L{lines + 1}"' not in page, rel


def test_built_source_links_land_on_existing_anchors(
    built_site: tuple[Path, subprocess.CompletedProcess],
) -> None:
    """Every rendered mini: link of every page points at an anchor its target has."""
    site, proc = built_site
    assert proc.returncode == 0, proc.stderr
    checked, broken = 0, []
    for page in site.rglob("index.html"):
        page_url = "/" + page.parent.relative_to(site).as_posix() + "/"
        if page_url.startswith("/source/"):
            continue
        for m in SOURCE_LINK_RE.finditer(page.read_text(encoding="utf-8")):
            target = urljoin(page_url, html.unescape(m["href"]))
            checked += 1
            if f'id="{m["anchor"]}"' not in _page_html(site, target):
                broken.append(f"{page_url} -> {target}#{m['anchor']}")
    assert checked > 0
    assert not broken, "\n".join(broken)


def test_unresolved_link_fails_strict_build(tmp_path: Path) -> None:
    """A minimal project using the hooks: one bad mini: link, one bad vllm: link, one bad figure."""
    pytest.importorskip("mkdocs", reason="mkdocs is not installed: pip install -e '.[docs]'")
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text(
        textwrap.dedent(
            """\
            # Broken

            Good: [](mini:minivllm/request.py#Request).
            Bad: [](mini:minivllm/request.py#NoSuchThing).
            Bad: [](vllm:vllm/v1/request.py#Request).
            Bad: {{ fig("benchmarks/none.json", "a.b", ".1f") }} ms.
            """
        ),
        encoding="utf-8",
    )
    (tmp_path / "mkdocs.yml").write_text(
        textwrap.dedent(
            f"""\
            site_name: broken
            theme: mkdocs
            hooks:
              - {HOOKS_DIR / "minivllm_docs.py"}
            """
        ),
        encoding="utf-8",
    )
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=mkdocs_env(),
        timeout=300,
        check=False,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0, log
    assert "docs/index.md:4: unresolved link 'mini:minivllm/request.py#NoSuchThing'" in log
    assert "docs/index.md:5: unresolved link 'vllm:vllm/v1/request.py#Request'" in log
    assert "docs/index.md:6: unresolved figure fig(" in log
    assert "docs/benchmarks/none.json does not exist" in log
    assert "request.py#Request'" not in log.replace("vllm/v1/request.py#Request'", "")
