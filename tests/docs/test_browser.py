"""The built site in a real browser, with the network off.

Headless Chromium follows a mini: link to its line; renders the diagrams of a chapter
served and read from the offline build's folder (file://); and opens every page of the
nav, checking that each mermaid block became an SVG, each image loaded, nothing was
requested from outside 127.0.0.1 and the console stayed free of errors.

Chromium is driven through the DevTools protocol over ``--remote-debugging-pipe`` (JSON
messages separated by NUL bytes on file descriptors 3 and 4), so the test needs no
package beyond the standard library. Screenshots go to ``$MINIVLLM_TEST_ARTIFACTS``
when it is set, else to the test's temp dir.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import os
import re
import select
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from doclinks import line_defines

from tests.docs import DOCS_DIR, REPO_ROOT
from tests.docs.conftest import mkdocs_env

CHROMIUM_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "/usr/bin/chromium")
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--window-size=1280,900",
    "--remote-debugging-pipe",
    # The network is off: no host name resolves, and every request that is not to
    # loopback goes to a proxy port where nothing listens (Chromium never proxies
    # loopback), so only the local server and file:// load.
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
    "--proxy-server=http://127.0.0.1:9",
)
TIMEOUT_S = 60.0


def _chromium() -> str | None:
    for name in CHROMIUM_CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


class DevTools:
    """A minimal DevTools-protocol client over Chromium's debugging pipe."""

    def __init__(self, binary: str, user_data_dir: Path) -> None:
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()

        def wire_pipes() -> None:  # runs in the child: Chromium expects fds 3 and 4
            os.dup2(to_chrome_r, 3)
            os.dup2(from_chrome_w, 4)

        self.proc = subprocess.Popen(
            [binary, *CHROMIUM_FLAGS, f"--user-data-dir={user_data_dir}", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=wire_pipes,
            pass_fds=(3, 4),
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict] = []
        self.session: str | None = None
        # Called with each event of a kind as soon as it is read (e.g. to answer
        # Fetch.requestPaused while a navigation is still waiting for its load event).
        self.handlers: dict[str, Callable[[dict], None]] = {}

    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_chrome], [], [], left)[0]:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self._from_chrome, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed the debugging pipe")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        message = json.loads(raw)
        handler = self.handlers.get(message.get("method", ""))
        if handler is not None:
            handler(message["params"])
        return message

    def send(self, method: str, **params: object) -> int:
        """Send one command (to the attached page, once attached); return its id."""
        self._next_id += 1
        message: dict = {"id": self._next_id, "method": method, "params": params}
        if self.session and not method.startswith("Target."):
            message["sessionId"] = self.session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        return self._next_id

    def call(self, method: str, **params: object) -> dict:
        """Send one command and wait for its reply."""
        want = self.send(method, **params)
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == want:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str) -> dict:
        """Wait for (and consume) the next event of a kind."""
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            for i, event in enumerate(self.events):
                if event.get("method") == method:
                    return self.events.pop(i)
            self.events.append(self._read_message(deadline))

    def evaluate(self, expression: str) -> object:
        """Evaluate JavaScript in the page and return its JSON value."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def open_page(self) -> None:
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)[
            "sessionId"
        ]
        self.call("Page.enable")
        self.call("Runtime.enable")

    def navigate(self, url: str) -> None:
        self.events.clear()
        self.call("Page.navigate", url=url)
        self.wait_event("Page.loadEventFired")

    def screenshot(self, path: Path) -> None:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, TimeoutError, OSError):
            self.call("Browser.close")
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_chrome)
        os.close(self._from_chrome)


@pytest.fixture
def served_site(built_site) -> Iterator[str]:
    """The strictly built site, served from a local HTTP server thread."""
    site, proc = built_site
    if proc.returncode != 0:
        pytest.fail(f"the site did not build:\n{proc.stderr}")
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    out = os.environ.get("MINIVLLM_TEST_ARTIFACTS")
    path = Path(out) / "docs" if out else tmp_path
    path.mkdir(parents=True, exist_ok=True)
    return path


def _chapter_to_visit() -> str:
    """The PagedAttention chapter: the one the issue asks the browser to open."""
    assert (DOCS_DIR / "paged_attention.md").is_file()
    return "paged_attention"


FIRST_SOURCE_LINK = """(() => {
  const a = [...document.querySelectorAll('article a[href]')]
    .find(a => a.href.includes('/source/minivllm/') && /#L\\d+$/.test(a.href) && a.title);
  if (!a) return null;
  a.setAttribute('data-test-follow', '1');
  return {href: a.href, symbol: a.title, text: a.textContent};
})()"""

LANDED_LINE = """(() => {
  const el = document.getElementById(location.hash.slice(1));
  if (!el) return null;
  const num = el.querySelector('.mini-lineno');
  const box = el.getBoundingClientRect();
  return {
    hash: location.hash, path: location.pathname,
    number: num ? num.textContent : null,
    code: el.textContent.slice(num ? num.textContent.length : 0),
    isTarget: el.matches(':target'),
    visible: box.top >= 0 && box.bottom <= window.innerHeight,
  };
})()"""


def test_browser_follows_mini_link_to_its_line(served_site: str, artifacts: Path, tmp_path):
    binary = _chromium()
    if binary is None:
        pytest.skip(
            "Chromium is not installed (apt-get install -y chromium chromium-driver); "
            "the browser test needs it"
        )
    browser = DevTools(binary, tmp_path / "chromium-profile")
    try:
        browser.open_page()
        browser.navigate(f"{served_site}/")
        assert "minivllm" in str(browser.evaluate("document.title"))
        home_link = browser.evaluate(FIRST_SOURCE_LINK)
        assert home_link, "the home page has no rendered mini: link"
        browser.screenshot(artifacts / "home.png")

        chapter = _chapter_to_visit()
        browser.navigate(f"{served_site}/{chapter}/")
        link = browser.evaluate(FIRST_SOURCE_LINK)
        assert link, f"{chapter} has no rendered mini: link"
        browser.screenshot(artifacts / f"{chapter}.png")

        # Click it as a reader would, and wait for the source page to load.
        browser.events.clear()
        browser.evaluate("document.querySelector('a[data-test-follow]').click()")
        browser.wait_event("Page.loadEventFired")
        time.sleep(0.3)  # let the browser finish scrolling to the fragment
        landed = browser.evaluate(LANDED_LINE)
        browser.screenshot(artifacts / f"{chapter}-link-target.png")
    finally:
        browser.close()

    assert landed, f"no element for the anchor of {link['href']}"
    assert landed["path"].startswith("/source/minivllm/")
    assert landed["isTarget"] and landed["visible"], landed
    assert landed["hash"] == "#L" + landed["number"]
    shown = re.fullmatch(r".+\.py:(\d+)", link["text"].strip())
    if shown:  # the default rendering, file.py:LINE, names the line it lands on
        assert shown[1] == landed["number"], (link, landed)
    assert line_defines(landed["code"], link["symbol"]), (link, landed)


def _chapter_with_mermaid() -> str:
    """The Architecture chapter, which draws its diagrams with mermaid."""
    assert "```mermaid" in (DOCS_DIR / "architecture.md").read_text(encoding="utf-8")
    return "architecture"


MERMAID_PAGE = """(() => ({
  diagrams: document.querySelectorAll('article div.mermaid').length,
}))()"""


def _svg_diagrams(browser: DevTools) -> int:
    """How many div.mermaid hold an <svg> in their shadow root.

    The theme renders each diagram into a closed shadow root, which page scripts cannot
    read; the DevTools DOM, asked to pierce shadow roots, can.
    """
    root = browser.call("DOM.getDocument", depth=-1, pierce=True)["root"]

    def has_svg(node: dict) -> bool:
        return node.get("localName") == "svg" or any(
            has_svg(child) for child in node.get("children", []) + node.get("shadowRoots", [])
        )

    def count(node: dict) -> int:
        attrs = node.get("attributes", [])
        classes = dict(zip(attrs[::2], attrs[1::2])).get("class", "").split()
        if node.get("localName") == "div" and "mermaid" in classes:
            return int(any(has_svg(r) for r in node.get("shadowRoots", [])))
        return sum(count(c) for c in node.get("children", []) + node.get("shadowRoots", []))

    return count(root)


def _rendered_mermaid(browser: DevTools, url: str, blocks: int) -> dict:
    """Open a page and wait until its mermaid blocks are SVGs (or time out); the final state."""
    browser.navigate(url)
    deadline = time.monotonic() + 20
    while True:
        state = browser.evaluate(MERMAID_PAGE)
        state["svgs"] = _svg_diagrams(browser)
        if state["svgs"] == blocks or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    requested = [
        e["params"]["request"]["url"]
        for e in browser.events
        if e.get("method") == "Network.requestWillBeSent"
    ]
    state["mermaidUrls"] = [u for u in requested if "mermaid" in u]
    state["cdnUrls"] = [u for u in requested if "unpkg.com" in u or "jsdelivr" in u]
    browser.evaluate(  # the first diagram just below the header, for the screenshot
        "(e => e && scrollTo(0, e.getBoundingClientRect().top + scrollY - 64))"
        "(document.querySelector('article .mermaid'))"
    )
    time.sleep(0.2)
    return state


@pytest.fixture(scope="session")
def offline_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site built for reading from disk: ``MINIVLLM_OFFLINE=true mkdocs build --strict``
    (the theme's offline plugin: flat ``.html`` URLs, the search index inlined)."""
    if _chromium() is None:  # only the browser reads it: no build without one
        pytest.skip("Chromium is not installed (apt-get install -y chromium)")
    pytest.importorskip("material", reason="mkdocs-material is not installed")
    site = tmp_path_factory.mktemp("offline-site")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env={**mkdocs_env(), "MINIVLLM_OFFLINE": "true"},
        timeout=300,
        check=False,
    )
    if proc.returncode != 0:
        pytest.fail(f"the offline site did not build:\n{proc.stderr}")
    return site


def test_browser_renders_mermaid_offline(
    built_site, served_site: str, offline_site: Path, artifacts: Path, tmp_path
):
    """Diagrams render from the vendored mermaid, served or read from file://, network off.

    The theme fetches mermaid from unpkg unless the page already has it; with no host
    resolving, a CDN copy cannot load, so a missing vendored file leaves the source text.
    The file:// case opens the offline build (``MINIVLLM_OFFLINE=true``), the folder a
    reader would download and open.
    """
    binary = _chromium()
    if binary is None:
        pytest.skip("Chromium is not installed (apt-get install -y chromium)")
    site, _ = built_site
    chapter = _chapter_with_mermaid()
    page = (site / chapter / "index.html").read_text(encoding="utf-8")
    blocks = page.count('<pre class="mermaid">')
    assert blocks > 0, f"the built {chapter} page has no mermaid block"
    offline_page = offline_site / f"{chapter}.html"
    assert offline_page.is_file(), "the offline build has no flat .html page"
    assert offline_page.read_text(encoding="utf-8").count('<pre class="mermaid">') == blocks
    roots = {"served": served_site, "file": offline_site.as_uri()}
    urls = {"served": f"{served_site}/{chapter}/", "file": offline_page.as_uri()}
    browser = DevTools(binary, tmp_path / "chromium-profile")
    try:
        browser.open_page()
        browser.call("DOM.enable")
        browser.call("Network.enable")
        browser.call("Log.enable")
        states = {}
        for how, url in urls.items():
            watch = _PageWatch(browser, (roots[how] + "/", "data:", "blob:"))
            states[how] = _rendered_mermaid(browser, url, blocks)
            states[how]["errors"], states[how]["external"] = watch.errors, watch.external
            browser.screenshot(artifacts / f"{chapter}-mermaid-{how}.png")
    finally:
        browser.close()

    for how, state in states.items():
        assert state["svgs"] == blocks and state["diagrams"] == blocks, (how, blocks, state)
        assert not state["errors"] and not state["external"], (how, state)
        assert not state["cdnUrls"], (how, state)
        assert state["mermaidUrls"], (how, state)  # mermaid came from the site itself
        assert all(u.startswith(roots[how] + "/") for u in state["mermaidUrls"]), (how, state)


# ------------------------------------------------------------------ every chapter, offline


def _nav_pages(config_path: Path) -> list[str]:
    """The docs-relative paths of every page in mkdocs.yml's nav, in reading order."""
    import yaml

    class _Loader(yaml.SafeLoader):
        """Reads mkdocs.yml with its !ENV and !!python/name tags left unresolved."""

    _Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
    _Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, s, node: None)
    nav = yaml.load(config_path.read_text(encoding="utf-8"), Loader=_Loader)["nav"]

    def walk(items: list) -> Iterator[str]:
        for item in items:
            if isinstance(item, str):
                yield item
            elif isinstance(item, dict):
                for value in item.values():
                    yield from walk(value) if isinstance(value, list) else [value]

    return list(walk(nav))


def _page_url(page: str) -> str:
    """The directory URL (relative to the site root) mkdocs gives a nav page."""
    stem = page.rsplit(".", 1)[0]
    if stem == "index":
        return ""
    if stem.endswith("/index"):
        return stem[: -len("index")]
    return stem + "/"


def _pages_to_visit(site: Path) -> list[str]:
    """Every page of the nav that the build wrote (the hook drops unwritten chapters)."""
    urls = []
    for page in _nav_pages(REPO_ROOT / "mkdocs.yml"):
        url = _page_url(page)
        built = (site / url / "index.html").is_file()
        if (DOCS_DIR / page).exists() or page.startswith("api/"):
            assert built, f"{page} is in the nav and in docs/ but the build wrote no page"
        if built:
            urls.append(url)
    return urls


def _mermaid_svgs(browser: DevTools) -> list[str]:
    """One entry per div.mermaid that holds an <svg>: the svg's aria-roledescription.

    Mermaid draws a syntax error as an SVG too, with the role "error"; the caller tells
    the two apart by this entry.
    """
    root = browser.call("DOM.getDocument", depth=-1, pierce=True)["root"]

    def attrs(node: dict) -> dict:
        flat = node.get("attributes", [])
        return dict(zip(flat[::2], flat[1::2], strict=False))

    def svg_in(node: dict) -> dict | None:
        if node.get("localName") == "svg":
            return node
        for child in node.get("children", []) + node.get("shadowRoots", []):
            found = svg_in(child)
            if found is not None:
                return found
        return None

    found: list[str] = []

    def visit(node: dict) -> None:
        if node.get("localName") == "div" and "mermaid" in attrs(node).get("class", "").split():
            for shadow in node.get("shadowRoots", []):
                svg = svg_in(shadow)
                if svg is not None:
                    found.append(attrs(svg).get("aria-roledescription", ""))
                    return
            return
        for child in node.get("children", []) + node.get("shadowRoots", []):
            visit(child)

    visit(root)
    return found


IMAGES = """(() => [...document.images].map(i => ({
  src: i.currentSrc || i.src, complete: i.complete, width: i.naturalWidth,
})))()"""

FIRST_FIGURE = """(() => {
  const e = document.querySelector('article .mermaid, article img');
  if (e) scrollTo(0, e.getBoundingClientRect().top + scrollY - 64);
})()"""


class _PageWatch:
    """Fails every request that is not local, and records it, the console's errors,
    and failed loads, for the page being visited."""

    def __init__(self, browser: DevTools, local_prefixes: tuple[str, ...]) -> None:
        self.browser = browser
        self.local = local_prefixes
        self.external: list[str] = []
        self.failed: list[str] = []
        self.errors: list[str] = []
        browser.handlers["Fetch.requestPaused"] = self._paused
        browser.handlers["Runtime.consoleAPICalled"] = self._console
        browser.handlers["Runtime.exceptionThrown"] = self._exception
        browser.handlers["Log.entryAdded"] = self._log
        browser.handlers["Network.loadingFailed"] = self._load_failed
        self._urls: dict[str, str] = {}
        browser.handlers["Network.requestWillBeSent"] = self._request

    def _is_local(self, url: str) -> bool:
        return url.startswith(self.local)

    def _paused(self, params: dict) -> None:
        url = params["request"]["url"]
        if self._is_local(url):
            self.browser.send("Fetch.continueRequest", requestId=params["requestId"])
        else:
            self.external.append(url)
            self.browser.send(
                "Fetch.failRequest", requestId=params["requestId"], errorReason="BlockedByClient"
            )

    def _request(self, params: dict) -> None:
        url = params["request"]["url"]
        self._urls[params["requestId"]] = url
        if not self._is_local(url) and url not in self.external:
            self.external.append(url)

    def _load_failed(self, params: dict) -> None:
        if not params.get("canceled"):
            url = self._urls.get(params["requestId"], params["requestId"])
            self.failed.append(f"{url}: {params.get('errorText')}")

    def _console(self, params: dict) -> None:
        if params.get("type") in ("error", "assert"):
            args = params.get("args", [])
            self.errors.append(
                "console: " + " ".join(str(a.get("value", a.get("description"))) for a in args)
            )

    def _exception(self, params: dict) -> None:
        details = params.get("exceptionDetails", {})
        text = details.get("exception", {}).get("description") or details.get("text")
        self.errors.append(f"exception: {text}")

    def _log(self, params: dict) -> None:
        entry = params.get("entry", {})
        if entry.get("level") == "error":
            self.errors.append(f"log: {entry.get('text')} {entry.get('url', '')}".strip())

    def reset(self) -> None:
        self.external, self.failed, self.errors = [], [], []
        self._urls = {}


def _visit(browser: DevTools, watch: _PageWatch, url: str, blocks: int, shot: Path) -> dict:
    """Open one page, wait for its diagrams and images, screenshot it; what it found."""
    watch.reset()
    browser.navigate(url)
    deadline = time.monotonic() + 20
    while True:
        svgs = _mermaid_svgs(browser) if blocks else []
        images = browser.evaluate(IMAGES)
        settled = len(svgs) >= blocks and all(i["complete"] for i in images)
        if settled or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    browser.evaluate(FIRST_FIGURE)
    browser.screenshot(shot)
    browser.call("Runtime.evaluate", expression="0")  # drain events raised by the load
    return {
        "url": url,
        "blocks": blocks,
        "svgs": len(svgs),
        "error_diagrams": svgs.count("error"),
        "broken_images": [i["src"] for i in images if not i["complete"] or i["width"] == 0],
        "images": len(images),
        "external": list(watch.external),
        "failed": list(watch.failed),
        "errors": list(watch.errors),
    }


def test_browser_opens_every_chapter_offline(
    built_site, served_site: str, artifacts: Path, tmp_path: Path
):
    """Every page of the nav, served with the network off: each mermaid block is an SVG
    (not mermaid's error picture), each image loads, no console error, no failed load and
    no request leaves 127.0.0.1. A screenshot of each page is saved."""
    binary = _chromium()
    if binary is None:
        pytest.skip("Chromium is not installed (apt-get install -y chromium)")
    site, _ = built_site
    urls = _pages_to_visit(site)
    assert len(urls) > 30, urls
    shots = artifacts / "pages"
    shots.mkdir(exist_ok=True)
    browser = DevTools(binary, tmp_path / "chromium-profile")
    results = []
    try:
        browser.open_page()
        watch = _PageWatch(browser, (served_site + "/", "data:", "blob:", "about:"))
        for domain in ("DOM", "Network", "Log"):
            browser.call(f"{domain}.enable")
        browser.call("Fetch.enable", patterns=[{"urlPattern": "*"}])
        for url in urls:
            html_text = (site / url / "index.html").read_text(encoding="utf-8")
            blocks = html_text.count('<pre class="mermaid">')
            name = url.strip("/").replace("/", "__") or "home"
            results.append(
                _visit(browser, watch, f"{served_site}/{url}", blocks, shots / f"{name}.png")
            )
    finally:
        browser.close()

    bad = [
        r
        for r in results
        if r["svgs"] != r["blocks"]
        or r["error_diagrams"]
        or r["broken_images"]
        or r["external"]
        or r["failed"]
        or r["errors"]
    ]
    assert not bad, json.dumps(bad, indent=1)
    assert sum(r["blocks"] for r in results) >= 10  # the diagrams were really checked
    assert sum(r["images"] for r in results) >= 5
    assert len(list(shots.glob("*.png"))) == len(results)


EXTERNAL_LOAD_RE = re.compile(
    r"<script\b[^>]*\bsrc=\"https?://[^\"]*\""
    # <link> loads only for these rels; canonical, alternate and the like are mere links
    r"|<link\b(?=[^>]*\brel=\"(?:stylesheet|preload|modulepreload|preconnect|icon|manifest)\")"
    r"[^>]*\bhref=\"https?://[^\"]*\"[^>]*>"
    r"|<(?:img|iframe|source)\b[^>]*\bsrc=\"https?://[^\"]*\""
)
EXTERNAL_CSS_RE = re.compile(r"@import\s+(?:url\()?\s*[\"']?https?://|url\(\s*[\"']?https?://")


def test_built_site_loads_nothing_from_the_network(built_site) -> None:
    """No page or stylesheet of the built site names an http(s) resource to load: no CDN
    script, no web font (the theme's ``font: false``), no remote image or stylesheet.
    Plain links to GitHub and upstream's docs are fine: a reader follows them by choice.
    Needs no browser, so it runs wherever the site builds."""
    site, proc = built_site
    assert proc.returncode == 0, proc.stderr
    found = []
    for page in site.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        found += [f"{page.relative_to(site)}: {m[:120]}" for m in EXTERNAL_LOAD_RE.findall(text)]
        for style in re.findall(r"<style\b[^>]*>(.*?)</style>", text, flags=re.S):
            found += [
                f"{page.relative_to(site)}: <style> {m}" for m in EXTERNAL_CSS_RE.findall(style)
            ]
    for css in site.rglob("*.css"):
        text = css.read_text(encoding="utf-8")
        found += [f"{css.relative_to(site)}: {m}" for m in EXTERNAL_CSS_RE.findall(text)]
    assert not found, "\n".join(found[:20])
