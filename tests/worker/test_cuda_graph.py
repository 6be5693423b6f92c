"""CUDA graphs change how a decode step is launched, never what it computes."""

from __future__ import annotations

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.forward_context import AttentionMetadata
from minivllm.worker.cuda_graph import (
    DECODE,
    MAX_PREFILL_STEP_GRAPHS,
    PREFILL,
    PREFILL_CAPTURE_STEP,
    VERIFY,
    CUDAGraphRunner,
    default_capture_sizes,
    default_prefill_capture_sizes,
)
from tests.tiny_models import make_tiny_model


def test_capture_sizes_cover_every_batch() -> None:
    sizes = default_capture_sizes(100)
    assert sizes[:4] == [1, 2, 4, 8] and sizes[-1] == 100
    assert sizes == sorted(set(sizes))
    assert default_capture_sizes(3) == [1, 2, 3]


def test_prefill_capture_sizes_double_then_step_up_to_the_budget() -> None:
    pow2 = [32, 64, 128, 256, 512, 1024]
    full = default_prefill_capture_sizes(16384)
    assert full == [*pow2, *range(2048, 16385, PREFILL_CAPTURE_STEP)]
    # The budget is always a size: every step has a graph.
    assert default_prefill_capture_sizes(3500)[-3:] == [2048, 3072, 3500]
    assert default_prefill_capture_sizes(100) == [32, 64, 100]
    assert default_prefill_capture_sizes(16) == []
    assert default_prefill_capture_sizes(32) == [32]
    # A larger budget takes a larger step: at most MAX_PREFILL_STEP_GRAPHS above it.
    big = default_prefill_capture_sizes(65536)
    assert big[: len(pow2) + 3] == [*pow2, 2048, 4096, 8192] and big[-1] == 65536
    assert len([t for t in big if t > 4096]) <= MAX_PREFILL_STEP_GRAPHS
    for sizes in (full, big, default_prefill_capture_sizes(20000)):
        assert sizes == sorted(set(sizes))


def _record_graph_keys(monkeypatch) -> list[tuple[int, bool, tuple[str, int] | None]]:
    """Make ``CUDAGraphRunner.graph_key`` record every step it is asked about (the runner
    lives in this process): its token count, whether it is a mixed step (decodes beside
    prompt tokens), and the graph it got (None: eager)."""
    steps = []
    graph_key = CUDAGraphRunner.graph_key

    def recording_graph_key(self, meta, num_tokens):
        key = graph_key(self, meta, num_tokens)
        steps.append((num_tokens, meta.decode_split is not None, key))
        return key

    monkeypatch.setattr(CUDAGraphRunner, "graph_key", recording_graph_key)
    return steps


def _replays(runner) -> dict[str, int] | None:
    graphs = runner.cuda_graph_runner
    return None if graphs is None else dict(graphs.num_replays)


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("budget", [64, 2048])
def test_graphs_equal_eager(tmp_path, arch: str, budget: int) -> None:
    """Decode graphs, and prefill graphs for whole prompts (budget 2048) and for chunks
    mixed with decodes (budget 64: chunked prefill), against the eager forward pass."""
    path = make_tiny_model(arch, tmp_path / arch)
    lens = (1, 5, 17, 40, 70, 33, 130)
    prompts = [{"prompt_token_ids": [3 + (7 * i) % 90 for i in range(n)]} for n in lens]
    params = [SamplingParams(temperature=0.0, max_tokens=m) for m in (30, 12, 25, 8, 40, 3, 9)]
    results = {}
    for eager in (True, False):
        llm = LLM(
            str(path),
            dtype="float32",
            device="cuda",
            max_model_len=256,
            max_num_seqs=8,
            max_num_batched_tokens=budget,
            num_kv_blocks=128,
            enforce_eager=eager,
            attention_backend="triton",
        )
        outs = llm.generate(prompts, params, use_tqdm=False)
        results[eager] = [o.outputs[0].token_ids for o in outs]
        replays = llm.collective_rpc(_replays)[0]
        if eager:
            assert replays is None
        else:
            assert replays["decode"] > 0 and replays["prefill"] > 0, replays
        del llm
        torch.cuda.empty_cache()
    assert results[True] == results[False]


# The GPU tests of prefill graphs up to the budget: a budget that is not a power of two.
_BUDGET_3500_ON_GPU = dict(
    dtype="float32", device="cuda", max_model_len=1024, max_num_seqs=8,
    max_num_batched_tokens=3500, attention_backend="triton",
)  # fmt: skip


@pytest.mark.gpu
def test_long_prefills_through_graphs_up_to_the_budget_equal_eager(tmp_path, monkeypatch) -> None:
    """Prefill graphs up to the budget, on the GPU: eight prompts of 505 to 990 tokens in
    a 3,500-token budget run as a step of the whole budget (graph 3,500, the budget
    itself) and a step of the rest beside decodes (graph 2,048), and give the eager run's
    tokens."""
    steps = _record_graph_keys(monkeypatch)
    path = make_tiny_model("qwen3", tmp_path / "qwen3")
    lens = (900, 510, 777, 640, 880, 505, 990, 700)
    prompts = [{"prompt_token_ids": [3 + (11 * i + n) % 97 for i in range(n)]} for n in lens]
    params = [SamplingParams(temperature=0.0, max_tokens=m) for m in (9, 17, 5, 12, 7, 3, 6, 10)]
    results = {}
    for eager in (True, False):
        llm = LLM(str(path), **_BUDGET_3500_ON_GPU, num_kv_blocks=512, enforce_eager=eager)
        outs = llm.generate(prompts, params, use_tqdm=False)
        results[eager] = [o.outputs[0].token_ids for o in outs]
        del llm
        torch.cuda.empty_cache()
    assert results[True] == results[False]
    keys = [key for _, _, key in steps]
    sizes = {size for family, size in filter(None, keys) if family == PREFILL}
    assert None not in keys and {3500, 2048} <= sizes, sizes


def _capture_and_read_allocator(runner) -> dict[str, int]:
    """Capture a fresh set of graphs for ``runner``'s model, then read torch's allocator
    at once: the bytes of the default pool's segments that no tensor uses (what
    ``release_cached_blocks`` gives back; the graphs' private pools keep theirs while
    the graphs live), the new graphs' pool, and what the capture says it took."""
    graphs = _graph_runner_for(runner)
    graphs.capture()
    segments = torch.cuda.memory_snapshot()
    pool = tuple(graphs.pool)
    default_pool = (0, 0)
    idle = sum(
        seg["total_size"]
        for seg in segments
        if tuple(seg["segment_pool_id"]) == default_pool and seg["active_size"] == 0
    )
    in_pool = sum(seg["total_size"] for seg in segments if tuple(seg["segment_pool_id"]) == pool)
    return {"idle": idle, "in_pool": in_pool, "memory_bytes": graphs.memory_bytes}


@pytest.mark.gpu
def test_capture_leaves_no_idle_cached_memory(tmp_path) -> None:
    """The eager warm-up before each capture allocates outside the graphs' pool;
    ``torch.cuda.graph`` gives those blocks back as each capture begins, and capture
    gives back the last warm-up's too, so no idle cached segment outlives it and the
    memory it reports (``memory_bytes``) covers its pool."""
    path = make_tiny_model("qwen3", tmp_path / "qwen3")
    llm = LLM(str(path), **_BUDGET_3500_ON_GPU, num_kv_blocks=512)
    seen = llm.collective_rpc(_capture_and_read_allocator)[0]
    del llm
    torch.cuda.empty_cache()
    assert seen["idle"] == 0, seen
    assert 0 < seen["in_pool"] <= seen["memory_bytes"], seen


def _graph_memory(runner) -> tuple[int, int, int]:
    budget = torch.cuda.mem_get_info(runner.device)[1] * runner.cache_config.gpu_memory_utilization
    return runner.profiled_graph_bytes, runner.cuda_graph_runner.memory_bytes, int(budget)


@pytest.mark.gpu
def test_kv_sizing_counts_the_graphs_it_will_capture(tmp_path) -> None:
    """The memory profile captures the graphs once and sizes the KV pool without their
    pool, so after a run the process stays inside its ``gpu_memory_utilization`` budget.
    The profile also counts what the engine's capture finds already there (the static
    buffers, the kernels loaded), so it measures at least as much."""
    path = make_tiny_model("qwen3", tmp_path / "qwen3")
    torch.cuda.empty_cache()
    llm = LLM(str(path), **_BUDGET_3500_ON_GPU, gpu_memory_utilization=0.1)
    prompts = [{"prompt_token_ids": [3 + i % 50 for i in range(n)]} for n in (700, 30, 1000)]
    llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)
    profiled, captured, budget = llm.collective_rpc(_graph_memory)[0]
    free, total = torch.cuda.mem_get_info()
    del llm
    torch.cuda.empty_cache()
    assert 0 < captured <= profiled
    assert total - free <= budget, (total - free, budget)


def test_long_steps_take_the_stepped_prefill_graphs_on_cpu(tmp_path, monkeypatch) -> None:
    """Between 2,048 tokens and the budget a step takes the next graph of the 1,024-token
    steps: in a 4,000-token budget the first step fills the budget (graph 4,000) and the
    rest, 2,906 tokens beside decodes, pads to 3,072; with each graph replaced by the
    forward pass it records, the tokens equal the eager run's."""
    steps = _record_graph_keys(monkeypatch)
    path = make_tiny_model("qwen3", tmp_path / "qwen3")
    lens = (900, 810, 777, 940, 880, 905, 990, 700)
    prompts = [{"prompt_token_ids": [3 + (11 * i + n) % 97 for i in range(n)]} for n in lens]
    params = [SamplingParams(temperature=0.0, max_tokens=m) for m in (9, 17, 5, 12, 7, 3, 6, 10)]
    eager, emulated = _eager_and_emulated_tokens(
        path, prompts, params, max_model_len=1024, max_num_batched_tokens=4000, num_kv_blocks=512
    )
    assert emulated == eager
    prefill = [(n, key[1]) for n, _, key in steps if key[0] == PREFILL]
    assert prefill == [(4000, 4000), (2906, 3 * PREFILL_CAPTURE_STEP)], prefill


def test_verify_graphs_are_keyed_by_batch_size_and_fit_short_queries() -> None:
    """k = 3: a batch of short queries (up to 1 + k tokens each) replays the verify graph
    of its padded batch size; a longer query takes a prefill graph, short or not; without
    speculation no verify graph exists and short queries take prefill graphs too."""
    graphs = _cpu_graph_runner(num_speculative_tokens=3)
    assert graphs.verify_query_len == 4 and graphs.verify_capture_sizes == [1, 2, 4, 8]
    assert (VERIFY, 4) in graphs.graph_keys()
    assert graphs.graph_key(_meta(max_query_len=4, num_seqs=3), 12) == (VERIFY, 4)
    assert graphs.graph_key(_meta(max_query_len=2, num_seqs=8), 9) == (VERIFY, 8)
    assert graphs.graph_key(_meta(max_query_len=5, num_seqs=2), 6) == (PREFILL, 32)
    assert graphs.graph_key(_meta(max_query_len=1, num_seqs=5), 5) == (DECODE, 8)
    assert graphs.graph_key(_meta(max_query_len=40, num_seqs=2), 41) == (PREFILL, 64)
    plain = _cpu_graph_runner(num_speculative_tokens=0)
    assert plain.verify_capture_sizes == [] and plain.graph_key(_meta(4, 3), 12) == (PREFILL, 32)
    # A batch of more tokens than the largest prefill graph runs eagerly.
    assert plain.graph_key(_meta(max_query_len=40, num_seqs=2), 65) is None
    # 1 + k long enough for the prefill tiles: those graphs serve verification.
    assert _cpu_graph_runner(num_speculative_tokens=40).verify_capture_sizes == []


def _cpu_graph_runner(num_speculative_tokens: int) -> CUDAGraphRunner:
    return CUDAGraphRunner(
        torch.nn.Identity(),
        max_num_seqs=8,
        max_num_batched_tokens=64,
        max_model_len=128,
        block_size=16,
        hidden_size=4,
        dtype=torch.float32,
        device=torch.device("cpu"),
        num_speculative_tokens=num_speculative_tokens,
    )


def _meta(max_query_len: int, num_seqs: int) -> AttentionMetadata:
    empty = torch.zeros(num_seqs, dtype=torch.int32)
    return AttentionMetadata(empty, empty[:, None], empty, empty, max_query_len, 128)


class _NoReplay:
    def replay(self) -> None:
        pass


def test_decode_replays_bring_the_launch_order_and_restore_the_padding() -> None:
    """A decode graph reads its launch order from a static buffer: the batch's order (the
    host's ``launch_order``, or a device sort without one) up front, the padding
    sequences' own indices behind it, also after a larger batch wrote there."""
    graphs = _cpu_graph_runner(num_speculative_tokens=0)
    graphs.graphs = {key: _NoReplay() for key in graphs.graph_keys()}
    captured = graphs._metadata(DECODE, 8)
    assert captured.seq_order.data_ptr() == graphs.seq_order.data_ptr()
    assert graphs._metadata(PREFILL, 32).launch_order is None

    def replay(seq_lens: list[int], host_order: list[int] | None) -> list[int]:
        n = len(seq_lens)
        lens = torch.tensor(seq_lens, dtype=torch.int32)
        meta = AttentionMetadata(
            torch.zeros(n, dtype=torch.long), torch.zeros(n, 1, dtype=torch.int32), lens,
            torch.arange(n + 1, dtype=torch.int32), 1, max(seq_lens),
            launch_order=None if host_order is None else torch.tensor(host_order),
        )  # fmt: skip
        key = graphs.graph_key(meta, n)
        assert key is not None and key[0] == DECODE
        graphs.run(key, torch.zeros(n, dtype=torch.long), torch.zeros(n, dtype=torch.long), meta)
        return graphs.seq_order[: key[1]].tolist()

    assert replay([5, 9, 7, 2, 8], [1, 4, 2, 0, 3]) == [1, 4, 2, 0, 3, 5, 6, 7]
    assert graphs.capture_sizes[:4] == [1, 2, 4, 8]
    assert replay([3, 6, 1], [1, 0, 2]) == [1, 0, 2, 3]  # the old tail is given back
    assert graphs.seq_order[:8].tolist() == [1, 0, 2, 3, 4, 5, 6, 7]
    assert replay([4, 11, 2], None) == [1, 0, 2, 3]  # sorted on the device instead


class _EagerReplay:
    """A captured graph's stand-in on the CPU: replaying runs the forward pass the graph
    would have recorded, over the same static buffers and the same padded layout."""

    def __init__(self, graphs: CUDAGraphRunner, key: tuple[str, int]) -> None:
        self.graphs, self.key = graphs, key

    def replay(self) -> None:
        with torch.inference_mode():
            self.graphs._forward(*self.key)


def _graph_runner_for(runner, num_speculative_tokens: int = 0) -> CUDAGraphRunner:
    """A ``CUDAGraphRunner`` for ``runner``'s model, as the runner builds its own."""
    sched = runner.scheduler_config
    return CUDAGraphRunner(
        runner.model,
        max_num_seqs=sched.max_num_seqs,
        max_num_batched_tokens=sched.max_num_batched_tokens,
        max_model_len=runner.model_config.max_model_len,
        block_size=runner.block_size,
        hidden_size=runner.model_config.hf_config.hidden_size,
        dtype=runner.model_config.dtype,
        device=runner.device,
        num_speculative_tokens=num_speculative_tokens,
    )


def _install_emulated_graphs(runner, num_speculative_tokens: int) -> None:
    graphs = _graph_runner_for(runner, num_speculative_tokens)
    graphs.graphs = {key: _EagerReplay(graphs, key) for key in graphs.graph_keys()}
    runner.cuda_graph_runner = graphs


def _eager_and_emulated_tokens(path, prompts, params, **llm_kwargs) -> tuple[list, list]:
    """Each prompt's tokens from a CPU engine (float32, eight sequences) run eagerly, then
    from one whose graphs are emulated (``_EagerReplay``)."""
    results = []
    for emulate in (False, True):
        llm = LLM(str(path), dtype="float32", device="cpu", max_num_seqs=8, **llm_kwargs)
        if emulate:
            llm.collective_rpc(_install_emulated_graphs, args=(0,))
        outs = llm.generate(prompts, params, use_tqdm=False)
        results.append([o.outputs[0].token_ids for o in outs])
    return results[0], results[1]


def test_verify_steps_through_the_graph_layout_equal_eager_on_cpu(tmp_path) -> None:
    """The padding a verify, decode or prefill replay applies (empty sequences, slot -1,
    the query start offsets) leaves every real token's result as eager computes it: on
    the CPU, with each graph replaced by the forward pass it records, speculative
    decoding gives the tokens of a run without graphs, and verify graphs were used."""
    path = make_tiny_model("qwen3", tmp_path / "qwen3")
    repeats = [[7, 8, 9, 10, 11] * 6, [300, 301, 302] * 9, [42, 43] * 10, list(range(3, 60))]
    prompts = [{"prompt_token_ids": p} for p in repeats]
    params = SamplingParams(temperature=0.0, max_tokens=20)
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2}
    results = []
    for emulate in (False, True):
        llm = LLM(
            str(path), dtype="float32", device="cpu", max_model_len=128, max_num_seqs=8,
            max_num_batched_tokens=64, speculative_config=spec,
        )  # fmt: skip
        if emulate:
            llm.collective_rpc(_install_emulated_graphs, args=(3,))
        outs = llm.generate(prompts, params, use_tqdm=False)
        results.append([o.outputs[0].token_ids for o in outs])
        if emulate:
            replays = llm.collective_rpc(_replays)[0]
            assert replays[VERIFY] > 0 and replays[DECODE] + replays[PREFILL] > 0, replays
        assert llm.llm_engine.stats.spec_decoding_stats.num_accepted_tokens > 0
    assert results[1] == results[0]


def test_short_queries_through_prefill_graphs_equal_eager_on_cpu(tmp_path) -> None:
    """Without speculation, a batch of short queries (prompts of a few tokens, and prompts
    sent again whose blocks the prefix cache holds, so only their last tokens are
    computed) replays a prefill graph, and its tokens equal the eager run's."""
    path = make_tiny_model("qwen3", tmp_path / "qwen3")
    prompts = [{"prompt_token_ids": [5 + i for i in range(n)]} for n in (3, 9, 40, 66)]
    params = SamplingParams(temperature=0.0, max_tokens=6)
    results = []
    for emulate in (False, True):
        llm = LLM(
            str(path), dtype="float32", device="cpu", max_model_len=128, max_num_seqs=8,
            max_num_batched_tokens=64, enable_prefix_caching=True,
        )  # fmt: skip
        if emulate:
            llm.collective_rpc(_install_emulated_graphs, args=(0,))
        first = llm.generate(prompts, params, use_tqdm=False)
        before = llm.collective_rpc(_replays)[0] if emulate else None
        again = llm.generate(prompts[2:], params, use_tqdm=False)  # prefix-cache hits
        results.append([o.outputs[0].token_ids for o in first + again])
        if emulate:
            after = llm.collective_rpc(_replays)[0]
            assert before[PREFILL] > 0, before
            assert after[PREFILL] > before[PREFILL], (before, after)
            assert llm.llm_engine.stats.prefix_cache_hits > 0
    assert results[1] == results[0]


def test_mixed_steps_through_prefill_graphs_equal_eager_on_cpu(tmp_path, monkeypatch) -> None:
    """A mixed step (decodes beside a prompt chunk) replays a prefill graph, every row on
    the prefill tiles (eagerly the decodes get a launch of their own): with the Triton
    kernels interpreted on the CPU and each graph replaced by the forward pass it
    records, its tokens equal the eager run's."""
    path = make_tiny_model("qwen3", tmp_path / "qwen3")
    lens = (7, 30, 90, 12)
    prompts = [{"prompt_token_ids": [5 + (3 * i + n) % 50 for i in range(n)]} for n in lens]
    params = SamplingParams(temperature=0.0, max_tokens=8)
    steps = _record_graph_keys(monkeypatch)
    eager, emulated = _eager_and_emulated_tokens(
        path, prompts, params, max_model_len=128, max_num_batched_tokens=40,
        attention_backend="triton",
    )  # fmt: skip
    assert emulated == eager
    mixed_keys = [key for _, mixed, key in steps if mixed]
    assert mixed_keys and all(key[0] == PREFILL for key in mixed_keys), mixed_keys


@pytest.mark.gpu
@pytest.mark.parametrize("k", [1, 4])
def test_verify_graphs_equal_eager(tmp_path, k: int) -> None:
    """Speculative decoding on the GPU: verification steps replay verify graphs (and a
    64-token budget mixes prefill chunks in), and the greedy tokens equal the eager run's
    with speculation and the eager run's without it."""
    path = make_tiny_model("qwen3", tmp_path / "qwen3")
    repeats = [[7, 8, 9, 10, 11] * 6, [300, 301, 302] * 9, [42, 43] * 10, list(range(3, 90))]
    prompts = [{"prompt_token_ids": p} for p in repeats]
    params = SamplingParams(temperature=0.0, max_tokens=40)
    spec = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 2}
    results = {}
    for name, eager, speculative in (
        ("eager", True, None), ("eager+spec", True, spec), ("graphs+spec", False, spec)
    ):  # fmt: skip
        llm = LLM(
            str(path), dtype="float32", device="cuda", max_model_len=256, max_num_seqs=8,
            max_num_batched_tokens=64, num_kv_blocks=128, enforce_eager=eager,
            attention_backend="triton", speculative_config=speculative,
        )  # fmt: skip
        outs = llm.generate(prompts, params, use_tqdm=False)
        results[name] = [o.outputs[0].token_ids for o in outs]
        if not eager:
            replays = llm.collective_rpc(_replays)[0]
            assert replays[VERIFY] > 0 and replays[DECODE] + replays[PREFILL] > 0, replays
            assert llm.llm_engine.stats.spec_decoding_stats.num_accepted_tokens > 0
        del llm
        torch.cuda.empty_cache()
    assert results["eager+spec"] == results["eager"]
    assert results["graphs+spec"] == results["eager"]
