"""The live page in a real browser: headless Chromium, network off, on the demo model.

The page streams a prompt's completion (it must equal the API's greedy output), and a
burst of requests with a shared prefix must show up as several requests in one step and
as shared blocks in the KV grid. The server speculates (n-gram drafts), so the page also
shows drafts, each accepted or rejected. Chromium is driven over its DevTools pipe by the
standard-library client of tests/docs/test_browser.py. Screenshots go to
``$MINIVLLM_TEST_ARTIFACTS`` (else the test's temp dir); docs/assets/live_*.png are
copies of them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.docs.test_browser import DevTools, _chromium
from tests.entrypoints.openai.server_process import RemoteOpenAIServer

WAIT_S = 90.0
API_KEY = "live-page-key"

PAGE_STATE = """(() => ({
  playground: !document.getElementById('playground').hidden,
  status: document.getElementById('status').textContent,
  completion: document.getElementById('completion').textContent,
  completionState: document.getElementById('completion').dataset.state,
  burstDone: document.getElementById('burst-status').dataset.done === '1',
  batchRows: document.querySelectorAll('#batch .row').length,
  gridShared: Number(document.getElementById('kv-grid').dataset.numShared),
  seen: window.liveView,
}))()"""


@pytest.fixture(scope="module")
def chromium() -> str:
    binary = _chromium()
    if binary is None:
        pytest.skip("Chromium is not installed (apt-get install -y chromium)")
    return binary


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    out = os.environ.get("MINIVLLM_TEST_ARTIFACTS")
    path = Path(out) / "live" if out else tmp_path
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def browser(chromium: str, tmp_path: Path) -> Iterator[DevTools]:
    devtools = DevTools(chromium, tmp_path / "chromium-profile")
    try:
        devtools.open_page()
        yield devtools
    finally:
        devtools.close()


def wait_for(browser: DevTools, done: Callable[[dict], bool], what: str) -> dict:
    """Poll the page's state until ``done`` holds (or fail, showing the last state)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        state = browser.evaluate(PAGE_STATE)
        if done(state):
            return state
        if time.monotonic() > deadline:
            pytest.fail(f"the page never showed {what}: {state}")
        time.sleep(0.1)


def test_page_streams_a_prompt_and_shows_a_burst(
    chromium: str, browser: DevTools, artifacts: Path
) -> None:
    # With --api-key, the page needs the key too: it asks for it, then works as /#key=KEY.
    spec = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}'
    with RemoteOpenAIServer(
        extra_args=["--api-key", API_KEY, "--speculative-config", spec]
    ) as server:
        browser.navigate(server.url + "/")
        wait_for(browser, lambda s: "API key" in s["status"], "that it needs the key")
        browser.navigate("about:blank")  # a new fragment alone would not load the page again
        browser.navigate(f"{server.url}/#key={API_KEY}")
        wait_for(browser, lambda s: s["status"] == "live" and s["seen"]["records"] > 0, "live")

        # A greedy prompt: the streamed text equals the API's answer to the same request.
        prompt, max_tokens = "In the beginning God created", 24
        browser.evaluate(
            f"document.getElementById('prompt').value = {prompt!r};"
            f"document.getElementById('max_tokens').value = {max_tokens};"
            "document.getElementById('send').click()"
        )
        state = wait_for(browser, lambda s: s["completionState"] != "streaming", "the completion")
        expected = httpx.post(
            server.url + "/v1/completions",
            json={"prompt": prompt, "max_tokens": max_tokens, "temperature": 0},
            headers={"Authorization": f"Bearer {API_KEY}"},
            timeout=60,
        ).json()["choices"][0]["text"]
        assert state["completionState"] == "done", state
        assert state["completion"] == expected and expected
        browser.screenshot(artifacts / "live_prompt.png")

        # A burst: several requests in one step, prefix blocks shared in the grid.
        browser.evaluate("document.getElementById('burst').click()")
        # The picture for the chapter: a batch of several requests sharing prefix blocks
        # (if the sampled records never catch one on screen, the asserts below say so).
        wait_for(
            browser,
            lambda s: (s["batchRows"] >= 2 and s["gridShared"] >= 1) or s["burstDone"],
            "the burst",
        )
        browser.screenshot(artifacts / "live_burst.png")
        state = wait_for(browser, lambda s: s["burstDone"], "the burst finishing")
        seen = state["seen"]
        assert seen["maxRequestsInStep"] >= 2, seen
        assert seen["maxSharedBlocks"] >= 1, seen
        # Drafts were drawn, and every one of them with its fate: the core sends a step's
        # record after the step ran (no async scheduling with n-gram speculation).
        assert seen["draftTokens"] > 0, seen
        assert seen["acceptedTokens"] + seen["rejectedTokens"] == seen["draftTokens"], seen
        # Once the engine is idle, the pool the page shows has every block back.
        wait_for(browser, lambda s: s["batchRows"] == 0, "the idle pool")
