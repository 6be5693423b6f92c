// The live view of `minivllm serve` (docs/live_view.md).
//
// It reads one JSON object, from GET /v1/live once and then from the server-sent events
// of GET /v1/live/stream: {record, metrics, stats, ...}. `record` is the engine core's
// StepRecord (minivllm/core/step_record.py), or null when nothing new happened. The
// playground sends ordinary OpenAI requests to /v1/completions, like any other client.
"use strict";

const $ = (id) => document.getElementById(id);
// What the page has shown so far (read by tests/entrypoints/openai/test_live_page.py).
const seen = { records: 0, maxRequestsInStep: 0, maxSharedBlocks: 0, preemptions: 0,
  draftTokens: 0, acceptedTokens: 0, rejectedTokens: 0 };
window.liveView = seen;
let model = null;
// A server started with --api-key wants it on every /v1 request: open the page as
// /#key=KEY (a fragment never reaches the server, so the key is not logged).
const apiKey = new URLSearchParams(location.hash.slice(1)).get("key");
const headers = apiKey ? { Authorization: `Bearer ${apiKey}` } : {};
const jsonHeaders = { ...headers, "Content-Type": "application/json" };

// ---- colours ---------------------------------------------------------------------------

// One colour per request, the same in the batch, the queues and the KV grid.
// FNV-1a, then a final mix: ids that differ in one character get unrelated hues.
function colour(requestId) {
  let h = 2166136261;
  for (const c of requestId) h = Math.imul(h ^ c.charCodeAt(0), 16777619) >>> 0;
  h = Math.imul(h ^ (h >>> 15), 2246822507) >>> 0;
  h = (h ^ (h >>> 13)) >>> 0;
  return `hsl(${h % 360}, 62%, ${44 + ((h >>> 9) % 14)}%)`;
}

const shortId = (id) => (id.length > 14 ? "…" + id.slice(-12) : id);

// ---- connection ------------------------------------------------------------------------

async function start() {
  const response = await fetch("/v1/live?watch=false", { headers });
  if (response.status === 401) {
    setStatus("this server wants its API key: open /#key=KEY", false);
    return;
  }
  const state = await response.json();
  model = state.model;
  $("model").textContent = model;
  if (state.playground) $("playground").hidden = false;
  else document.body.classList.add("read-only");
  render(state);
  for (;;) {  // the stream; after a failure, try again a second later
    try {
      await readEvents("/v1/live/stream", { headers }, (data) => render(JSON.parse(data)),
        () => setStatus("live", true));
    } catch (err) {
      // the server went away or restarted
    }
    setStatus("reconnecting", false);
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
}

// Server-sent events over fetch (EventSource cannot send an Authorization header): call
// onData with each event's data, until the stream ends.
async function readEvents(url, init, onData, onOpen = () => {}) {
  const response = await fetch(url, init);
  if (!response.ok) throw new Error((await response.json()).error.message);
  onOpen();
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    const events = buffer.split("\n\n");
    buffer = events.pop();
    for (const e of events) {
      if (e.startsWith("data: ")) onData(e.slice(6));
    }
  }
}

function setStatus(text, live) {
  $("status").textContent = text;
  $("status").classList.toggle("live", live);
}

function render(state) {
  renderMetrics(state.metrics, state.stats);
  if (state.record) renderRecord(state.record);
}

// ---- metrics ---------------------------------------------------------------------------

function renderMetrics(m, stats) {
  const ms = (s) => (s.p50 === null ? "–" : s.p50.toFixed(1) + " ms");
  const tiles = [
    [ms(m.ttft_ms), `TTFT p50 (${m.ttft_ms.count} in ${m.window_s} s)`],
    [ms(m.itl_ms), `ITL p50 (${m.itl_ms.count})`],
    [m.tokens_per_s.toFixed(1), "output tokens/s"],
    [stats ? (100 * stats.kv_cache_usage).toFixed(0) + " %" : "–", "KV blocks held"],
    [stats ? stats.num_running_reqs : "–", "running"],
    [stats ? stats.num_waiting_reqs : "–", "waiting"],
    [stats ? stats.num_preemptions : "–", "preemptions"],
    [stats && stats.prefix_cache_queries
      ? (100 * stats.prefix_cache_hits / stats.prefix_cache_queries).toFixed(0) + " %" : "–",
      "prefix-cache hits"],
  ];
  $("metrics").replaceChildren(...tiles.map(([value, label]) => {
    const div = document.createElement("div");
    div.innerHTML = `<b></b><span></span>`;
    div.firstChild.textContent = value;
    div.lastChild.textContent = label;
    return div;
  }));
}

// ---- one step record -------------------------------------------------------------------

function renderRecord(r) {
  seen.records += 1;
  seen.maxRequestsInStep = Math.max(seen.maxRequestsInStep, r.scheduled.length);
  seen.maxSharedBlocks = Math.max(seen.maxSharedBlocks, r.kv_shared.length);
  seen.preemptions += r.preempted.length;
  for (const s of r.scheduled) {
    seen.draftTokens += s.num_draft_tokens;
    if (s.num_accepted_tokens !== null) {
      seen.acceptedTokens += s.num_accepted_tokens;
      seen.rejectedTokens += s.num_draft_tokens - s.num_accepted_tokens;
    }
  }
  renderBatch(r);
  renderQueues(r);
  renderEvents(r);
  renderGrid(r);
}

// A request's drafts (speculative decoding): [accepted, rejected, not yet verified]. The
// record is taken as the step is scheduled; the core fills in the accepted count once the
// step ran (null until then, and always null without drafts).
function draftSplit(s) {
  if (!s.num_draft_tokens) return [0, 0, 0];
  if (s.num_accepted_tokens === null) return [0, 0, s.num_draft_tokens];
  return [s.num_accepted_tokens, s.num_draft_tokens - s.num_accepted_tokens, 0];
}

function renderBatch(r) {
  const sum = (f) => r.scheduled.reduce((n, s) => n + f(s), 0);
  const prefill = sum((s) => s.num_prefill_tokens);
  const decode = sum((s) => s.num_decode_tokens);
  const drafts = [0, 1, 2].map((i) => sum((s) => draftSplit(s)[i]));
  const numDrafts = drafts[0] + drafts[1] + drafts[2];
  const draftText = numDrafts
    ? ` + ${numDrafts} draft (${drafts[0]} accepted, ${drafts[1]} rejected)` : "";
  $("batch-summary").textContent = r.scheduled.length
    ? `step ${r.step}: ${r.scheduled.length} requests, ${prefill} prefill + ${decode} decode` +
      `${draftText} tokens of a ${r.token_budget}-token budget`
    : `idle after step ${r.step}`;
  // The top bar: the batch against the budget (at least a sliver, so a few decode
  // tokens of a large budget stay visible). The rows: each request's share of the batch.
  const [p, d, a, x, u] = $("budget").children;
  const sliver = (n, total) => (n ? `max(3px, ${100 * n / total}%)` : "0");
  p.style.width = sliver(prefill, r.token_budget);
  d.style.width = sliver(decode, r.token_budget);
  [a, x, u].forEach((el, i) => { el.style.width = sliver(drafts[i], r.token_budget); });
  const total = Math.max(1, prefill + decode + numDrafts);
  const batch = $("batch");
  batch.dataset.numRequests = r.scheduled.length;
  batch.replaceChildren(...r.scheduled.map((s) => {
    const row = document.createElement("div");
    row.className = "row";
    row.dataset.requestId = s.request_id;
    const [accepted, rejected, pending] = draftSplit(s);
    const draftTag = !s.num_draft_tokens ? ""
      : pending ? `${pending} drafts` : `${accepted}/${s.num_draft_tokens} drafts accepted`;
    const tags = [s.num_prefill_tokens ? `${s.num_prefill_tokens} prefill` : "1 decode",
      draftTag, s.is_resumed ? "resumed" : s.is_new ? "new" : "",
      s.num_cached_tokens ? `${s.num_cached_tokens} cached` : "", `${s.num_blocks} blocks`];
    row.innerHTML = `<span class="chip"></span><div class="bar"><span class="prefill">` +
      `</span><span class="decode"></span><span class="accepted"></span>` +
      `<span class="rejected"></span><span class="pending"></span></div>` +
      `<span class="tag"></span>`;
    row.dataset.drafts = s.num_draft_tokens;
    row.dataset.accepted = accepted;
    row.children[0].textContent = shortId(s.request_id);
    row.children[0].style.background = colour(s.request_id);
    const widths = [s.num_prefill_tokens, s.num_decode_tokens, accepted, rejected, pending];
    widths.forEach((n, i) => { row.children[1].children[i].style.width = sliver(n, total); });
    row.children[1].title = `${s.num_prefill_tokens} prefill, ${s.num_decode_tokens} decode` +
      (s.num_draft_tokens ? `, ${s.num_draft_tokens} drafts: ${accepted} accepted, ` +
        `${rejected} rejected` + (pending ? `, ${pending} not verified yet` : "") : "");
    row.children[2].textContent = tags.filter(Boolean).join(", ");
    return row;
  }));
}

function chips(ids) {
  return ids.map((id) => {
    const chip = document.createElement("span");
    chip.className = "chip";
    chip.textContent = shortId(id);
    chip.title = id;
    chip.style.background = colour(id);
    return chip;
  });
}

function renderQueues(r) {
  $("running").replaceChildren(...chips(r.running));
  $("waiting").replaceChildren(...chips(r.waiting));
}

// Preemptions and finishes since the previous record, newest first.
function renderEvents(r) {
  const list = $("events");
  const add = (text, cls) => {
    const li = document.createElement("li");
    li.textContent = `step ${r.step}: ${text}`;
    li.className = cls;
    list.prepend(li);
  };
  for (const id of r.finished) add(`finished ${shortId(id)}, blocks freed`, "finished");
  for (const id of r.preempted) add(`preempted ${shortId(id)}: blocks freed, back to waiting`,
    "preempted");
  while (list.children.length > 8) list.lastChild.remove();
}

// ---- the KV pool -----------------------------------------------------------------------

// The grid, as StepRecord.grid builds it: 0 free, 1 free but cached, 2 + i held, the i-th
// request of kv_tables being the first whose table holds the block. Cells shrink to fit
// any pool into about 320 px of height.
function gridCodes(r) {
  const codes = new Uint16Array(r.num_blocks);
  for (const id of r.kv_cached_free) codes[id] = 1;
  const tables = Object.values(r.kv_tables);
  for (let i = tables.length - 1; i >= 0; i--) {  // the first holder wins
    for (const id of tables[i]) codes[id] = 2 + i;
  }
  return codes;
}

function renderGrid(r) {
  const canvas = $("kv-grid");
  const scale = window.devicePixelRatio || 1;
  const width = Math.max(200, Math.floor(canvas.clientWidth * scale));
  const n = r.num_blocks;
  const cell = Math.max(1, Math.min(16, Math.floor(Math.sqrt(width * 320 * scale / n))));
  const cols = Math.floor(width / cell);
  canvas.width = cols * cell;
  canvas.height = Math.ceil(n / cols) * cell;
  const ctx = canvas.getContext("2d");
  const css = getComputedStyle(document.documentElement);
  const fills = [css.getPropertyValue("--free"), css.getPropertyValue("--cached"),
    ...Object.keys(r.kv_tables).map(colour)];
  const codes = gridCodes(r);
  const gap = cell >= 5 ? 1 : 0;
  for (let i = 0; i < n; i++) {
    ctx.fillStyle = fills[codes[i]];
    ctx.fillRect((i % cols) * cell, Math.floor(i / cols) * cell, cell - gap, cell - gap);
  }
  ctx.strokeStyle = "#111";
  ctx.lineWidth = Math.max(1, Math.floor(cell / 5));
  for (const i of r.kv_shared) {
    const x = (i % cols) * cell, y = Math.floor(i / cols) * cell, w = ctx.lineWidth;
    ctx.strokeRect(x + w / 2, y + w / 2, cell - gap - w, cell - gap - w);
  }
  canvas.dataset.numShared = r.kv_shared.length;
  $("kv-summary").textContent =
    `${r.num_used_blocks} held, ${r.kv_shared.length} shared, ${r.num_cached_free_blocks} ` +
    `free but cached, ${r.num_free_blocks - r.num_cached_free_blocks} free of ${n} ` +
    `(${r.block_size} tokens each); ${r.num_prefix_hit_blocks} prefix-cache hits this step`;
}

// ---- the playground --------------------------------------------------------------------

function samplingFields() {
  const body = {
    max_tokens: Number($("max_tokens").value),
    temperature: Number($("temperature").value),
    top_p: Number($("top_p").value),
  };
  if ($("seed").value !== "") body.seed = Number($("seed").value);
  return body;
}

// Stream one completion into the page: server-sent events, one text delta per event.
async function generate(event) {
  event.preventDefault();
  const out = $("completion");
  out.textContent = "";
  out.dataset.state = "streaming";
  $("send").disabled = true;
  try {
    const body = JSON.stringify({ model, prompt: $("prompt").value, stream: true,
      ...samplingFields() });
    await readEvents("/v1/completions", { method: "POST", headers: jsonHeaders, body },
      (data) => {
        if (data === "[DONE]") return;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message);
        out.textContent += chunk.choices[0].text;
      });
    out.dataset.state = "done";
  } catch (err) {
    out.textContent += `\n[error: ${err.message}]`;
    out.dataset.state = "error";
  } finally {
    $("send").disabled = false;
  }
}

// N concurrent requests that share a prefix (each ends differently).
async function burst() {
  const n = Number($("burst-n").value);
  const status = $("burst-status");
  let finished = 0;
  status.textContent = `0 / ${n} done`;
  $("burst").disabled = true;
  const one = async (i) => {
    await fetch("/v1/completions", {
      method: "POST",
      headers: jsonHeaders,
      body: JSON.stringify({ model, prompt: `${$("burst-prefix").value} (${i + 1})`,
        max_tokens: Number($("burst-tokens").value), temperature: 0.8, ignore_eos: true }),
    });
    finished += 1;
    status.textContent = `${finished} / ${n} done`;
  };
  try {
    await Promise.all([...Array(n).keys()].map(one));
  } finally {
    $("burst").disabled = false;
    status.dataset.done = "1";
  }
}

$("prompt-form").addEventListener("submit", generate);
$("burst").addEventListener("click", burst);
start().catch((err) => setStatus(`error: ${err.message}`, false));
