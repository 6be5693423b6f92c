"""Draft-model speculative decoding end to end: a second model changes how fast, never what
comes out.

The target is a tiny random Llama of two layers whose second layer is damped; the draft is
the same model cut to its first layer (fewer layers, the same vocabulary), so it agrees
with the target often but not always and both branches of verification run. Greedy
outputs with the draft on (k = 1..5) must equal the outputs with speculation off, token
for token, with a KV pool that forces preemptions and prefix caching on; the demo model
drafting for itself must have every draft accepted; aborts and preemptions leak no block.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minivllm import LLM, SamplingParams
from minivllm.demo import demo_model_path
from minivllm.engine.arg_utils import EngineArgs
from minivllm.request import RequestStatus
from minivllm.worker.cuda_graph import DECODE, PREFILL, VERIFY, CUDAGraphRunner
from tests.engine.test_llm_engine import _workload
from tests.tiny_models import make_hf_config

MAX_MODEL_LEN = 96
# 14 blocks of 8 hold one request of max_model_len and little else: preemptions. A budget
# of 32 tokens chunks the longer prefills.
PREEMPTING = dict(block_size=8, num_kv_blocks=MAX_MODEL_LEN // 8 + 2, max_num_batched_tokens=32)
REPEATS = [[7, 8, 9, 10, 11] * 4, [42, 43] * 8]


def make_target_and_draft(root: Path, damp: float = 0.3) -> tuple[Path, Path]:
    """A two-layer target whose second layer adds ``damp`` times its usual output, and
    a one-layer draft holding the target's own embeddings, first layer and head."""
    import transformers

    torch.manual_seed(0)
    target = transformers.AutoModelForCausalLM.from_config(
        make_hf_config("llama", num_hidden_layers=2), dtype=torch.float32
    )
    with torch.no_grad():
        for name, p in target.named_parameters():
            if "norm" not in name:
                p.normal_(0.0, 0.08)  # as tests/tiny_models.py: no near-ties in the argmax
            if name.startswith("model.layers.1.") and ("o_proj" in name or "down_proj" in name):
                p.mul_(damp)
    draft = transformers.AutoModelForCausalLM.from_config(
        make_hf_config("llama", num_hidden_layers=1), dtype=torch.float32
    )
    kept = {k: v for k, v in target.state_dict().items() if not k.startswith("model.layers.1.")}
    draft.load_state_dict(kept)
    target.save_pretrained(root / "target")
    draft.save_pretrained(root / "draft")
    return root / "target", root / "draft"


def draft_model(path: Path, k: int) -> dict:
    return {"method": "draft_model", "model": str(path), "num_speculative_tokens": k}


def _generate(path, prompts, params, **kwargs) -> tuple[LLM, list[list[int]]]:
    llm = LLM(str(path), dtype="float32", device="cpu", max_model_len=MAX_MODEL_LEN, **kwargs)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return llm, [o.outputs[0].token_ids for o in outputs]


def _kv(llm: LLM):
    return llm.llm_engine.engine_core.engine_core.kv_cache_manager


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    target, draft = make_target_and_draft(tmp_path_factory.mktemp("pair"))
    # The engine-vs-HF prompts cut to 40 tokens (the long ones still share a prefix).
    prompts, max_tokens = _workload(seed=3, shared_prefix=True)
    prompts = [p[:40] for p in prompts] + REPEATS
    params = [SamplingParams(temperature=0.0, max_tokens=n) for n in [*max_tokens, 16, 16]]
    _, reference = _generate(target, prompts, params)
    return target, draft, prompts, params, reference


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_greedy_outputs_equal_without_speculation(case, k: int) -> None:
    target, draft, prompts, params, reference = case
    llm, got = _generate(
        target, prompts, params, speculative_config=draft_model(draft, k), **PREEMPTING
    )
    for i, (g, e) in enumerate(zip(got, reference, strict=True)):
        assert g == e, f"k={k}: prompt {i} diverged"
    stats = llm.llm_engine.stats
    assert stats.num_preemptions > 0, "the tiny pool was meant to force preemptions"
    assert stats.prefix_cache_hit_rate > 0
    spec = stats.spec_decoding_stats
    assert spec is not None and spec.num_spec_tokens == k
    # Both branches ran: drafts were accepted, and drafts were rejected.
    assert 0 < spec.num_accepted_tokens < spec.num_draft_tokens
    kv = _kv(llm)
    assert kv.num_free_blocks == kv.num_blocks


def test_demo_model_drafting_for_itself_is_always_accepted() -> None:
    """A draft identical to the target proposes the target's own greedy tokens, so every
    draft must be accepted; a draft whose cache were misaligned with the target's
    (wrong positions, wrong slots, stale K/V after a rejection or a preemption) would
    fail this at once."""
    path = demo_model_path()
    prompts = ["In the beginning", "And God said", "The LORD is my shepherd", "Blessed are"]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    base = LLM(str(path), dtype="float32", device="cpu", max_model_len=64)
    expected = [o.outputs[0].token_ids for o in base.generate(prompts, params, use_tqdm=False)]
    spec = LLM(
        str(path),
        dtype="float32",
        device="cpu",
        max_model_len=64,
        block_size=8,
        num_kv_blocks=9,  # about two requests at a time: the others wait or are preempted
        speculative_config=draft_model(path, 4),
    )
    got = [o.outputs[0].token_ids for o in spec.generate(prompts, params, use_tqdm=False)]
    assert got == expected
    stats = spec.llm_engine.stats
    assert stats.num_preemptions > 0
    accepted = stats.spec_decoding_stats
    assert accepted.num_draft_tokens > 0
    assert accepted.num_accepted_tokens == accepted.num_draft_tokens
    assert accepted.num_accepted_tokens_per_pos[0] == accepted.num_drafts


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_every_proposal_is_the_drafts_own_greedy_continuation(case, async_scheduling) -> None:
    """Each step's k drafts must be exactly what the draft model, run alone without a
    cache, continues the request's tokens with. Equal outputs cannot show this (the
    target corrects any draft); a draft cache that lost its place after a rejection, a
    preemption, a chunked prefill or a prefix hit proposes something else here (with
    async scheduling: also one whose positions missed the previous step's rejections)."""
    from tests.tiny_models import load_hf_model

    target, draft, prompts, params, _ = case
    llm = LLM(
        str(target),
        dtype="float32",
        device="cpu",
        max_model_len=MAX_MODEL_LEN,
        speculative_config=draft_model(draft, 3),
        async_scheduling=async_scheduling,
        **PREEMPTING,
    )
    core = llm.llm_engine.engine_core.engine_core
    scheduler = core.scheduler
    proposals: list[tuple[list[int], list[int]]] = []
    propose = core.spec_decode.propose_drafts

    def record(runner_output) -> None:
        # Every request that sampled and still runs, with the tokens it has after
        # the step (with async scheduling most drafts never pass the host's scheduler:
        # the next step took them from the device).
        for rid, tokens in zip(runner_output.req_ids, runner_output.draft_token_ids or []):
            request = scheduler.requests.get(rid)
            if request is not None and request.status == RequestStatus.RUNNING:
                proposals.append((list(request.all_token_ids), list(tokens)))
        propose(runner_output)

    core.spec_decode.propose_drafts = record
    llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert llm.llm_engine.stats.num_preemptions > 0
    assert len(proposals) > 50
    hf = load_hf_model(draft)
    with torch.no_grad():
        for context, drafts in proposals:
            ids = torch.tensor([context])
            expected = hf.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False
            )[0, len(context) :].tolist()
            assert drafts == expected[: len(drafts)], f"after {len(context)} tokens"


class _EagerReplay:
    """A captured graph's stand-in on the CPU: replaying runs the forward pass the graph
    records, over the same static buffers and padded layout."""

    def __init__(self, graphs, key) -> None:
        self.graphs, self.key = graphs, key

    def replay(self) -> None:
        with torch.inference_mode():
            self.graphs._forward(*self.key)


def _emulate_draft_graphs(runner) -> None:
    """What ``initialize_kv_cache`` does on a GPU, with the replays emulated."""
    draft_config = runner.vllm_config.speculative_config.draft_model_config
    k = runner.drafter.k
    graphs = CUDAGraphRunner(
        runner.drafter.model,
        max_num_seqs=runner.scheduler_config.max_num_seqs,
        max_num_batched_tokens=runner.scheduler_config.max_num_batched_tokens,
        max_model_len=runner.model_config.max_model_len,
        block_size=runner.block_size,
        hidden_size=draft_config.hf_config.hidden_size,
        dtype=runner.model_config.dtype,
        device=runner.device,
        num_speculative_tokens=k + 1,
    )
    graphs.graphs = {key: _EagerReplay(graphs, key) for key in graphs.graph_keys()}
    runner.drafter.graphs = graphs


def _draft_replays(runner) -> dict[str, int]:
    return dict(runner.drafter.graphs.num_replays)


@pytest.mark.parametrize("k", [1, 3])
def test_draft_passes_through_the_graph_layout_are_exact_on_cpu(k: int) -> None:
    """The draft's passes replayed through CUDA graphs' static, padded buffers (emulated
    on the CPU: each replay runs the forward pass the graph records) propose what the
    eager passes propose: the demo model drafting for itself keeps every draft."""
    path = demo_model_path()
    llm = LLM(
        str(path),
        dtype="float32",
        device="cpu",
        max_model_len=128,
        max_num_seqs=4,
        max_num_batched_tokens=32,
        speculative_config=draft_model(path, k),
    )
    llm.collective_rpc(_emulate_draft_graphs)
    long = "And the earth was without form, and void; and darkness was upon the deep. " * 3
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    llm.generate([long], params, use_tqdm=False)  # alone: a first chunk of 32 tokens
    llm.generate(["In the beginning", "And God said", "Blessed are"], params, use_tqdm=False)
    spec = llm.llm_engine.stats.spec_decoding_stats
    assert 0 < spec.num_accepted_tokens == spec.num_draft_tokens
    replays = llm.collective_rpc(_draft_replays)[0]
    # Catch-up passes after a verification (up to k + 2 tokens a request), the long
    # prompt's first chunk (32 tokens), and the chain (k > 1) all ran in graphs.
    assert replays[VERIFY] > 0 and replays[PREFILL] > 0, replays
    assert (replays[DECODE] > 0) == (k > 1), replays


@settings(
    max_examples=6,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(seed=st.integers(0, 2**16), k=st.integers(1, 4))
def test_aborts_and_preemption_leak_no_block(case, seed: int, k: int) -> None:
    """Random arrivals and aborts over a pool that preempts: the finished requests get
    the tokens they get without speculation, and every block comes back."""
    target, draft, prompts, params, reference = case
    llm = LLM(
        str(target),
        dtype="float32",
        device="cpu",
        max_model_len=MAX_MODEL_LEN,
        speculative_config=draft_model(draft, k),
        **PREEMPTING,
    )
    engine, rng = llm.llm_engine, random.Random(seed)
    order = rng.sample(range(len(prompts)), len(prompts))
    ids: dict[str, int] = {}
    finished: dict[str, list[int]] = {}
    aborted: set[str] = set()
    while order or engine.has_unfinished_requests():
        for _ in range(rng.randint(0, 2)):
            if order:
                i = order.pop()
                ids[engine.add_request({"prompt_token_ids": prompts[i]}, params[i])] = i
        running = [rid for rid in ids if rid not in finished and rid not in aborted]
        if running and rng.random() < 0.15:
            victim = rng.choice(running)
            engine.abort_request([victim])
            aborted.add(victim)
        for out in engine.step():
            if out.finished and out.request_id not in aborted:
                finished[out.request_id] = out.outputs[0].token_ids
    for rid, tokens in finished.items():
        assert tokens == reference[ids[rid]]
    kv = _kv(llm)
    assert kv.num_free_blocks == kv.num_blocks
    assert not engine.engine_core.engine_core.scheduler.has_unfinished_requests()


def test_engine_core_process_drafts_too(monkeypatch) -> None:
    """The server's path: AsyncLLM with the engine core in its own process gets the draft
    model's configuration across, loads both models there, and streams the offline
    greedy tokens."""
    import asyncio

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the core process: one thread, as here

    from minivllm.demo import demo_draft_path
    from minivllm.engine.async_llm import AsyncLLM
    from minivllm.sampling_params import RequestOutputKind

    path, prompt = demo_model_path(), "And God said"
    args = EngineArgs(
        str(path), dtype="float32", device="cpu", max_model_len=64,
        speculative_config=draft_model(demo_draft_path(), 3),
    )  # fmt: skip
    engine = AsyncLLM.from_engine_args(args, multiprocess=True)
    params = SamplingParams(temperature=0.0, max_tokens=24, output_kind=RequestOutputKind.DELTA)

    async def stream() -> list[int]:
        tokens = []
        async for out in engine.generate(prompt, params, "r"):
            tokens.extend(out.outputs[0].token_ids)
        return tokens

    try:
        streamed = asyncio.run(stream())
        stats = engine.scheduler_stats.spec_decoding_stats
    finally:
        engine.shutdown()
    alone = LLM(str(path), dtype="float32", device="cpu", max_model_len=64)
    expected = alone.generate(prompt, SamplingParams(temperature=0.0, max_tokens=24))
    assert streamed == expected[0].outputs[0].token_ids
    assert stats.num_draft_tokens > 0  # the drafts came from the core process's draft


# ---- configuration --------------------------------------------------------------------


def _refused(tmp_path, config: dict, message: str, monkeypatch) -> None:
    """``config`` is refused with ``message`` before any model is loaded."""
    import minivllm.model_executor.loader as loader

    def never(*args, **kwargs):
        raise AssertionError("a model was loaded before the configuration was checked")

    monkeypatch.setattr(loader, "get_model", never)
    args = EngineArgs(model=str(demo_model_path()), device="cpu", speculative_config=config)
    with pytest.raises(ValueError, match=message):
        args.create_engine_config()


def test_bad_draft_model_config_is_refused_before_anything_loads(tmp_path, monkeypatch) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    no_weights = tmp_path / "no_weights"
    no_weights.mkdir()
    (no_weights / "config.json").write_text("{}")
    small_vocab = tmp_path / "small_vocab"
    transformers_model(small_vocab, vocab_size=256)
    short = tmp_path / "short"
    transformers_model(short, vocab_size=4096, max_position_embeddings=64)
    cases = [
        ({"num_speculative_tokens": 2}, "model .* is required"),
        ({"model": str(tmp_path / "missing"), "num_speculative_tokens": 2}, "not a folder"),
        ({"model": str(empty), "num_speculative_tokens": 2}, "no config.json"),
        ({"model": str(no_weights), "num_speculative_tokens": 2}, "no \\*.safetensors"),
        ({"model": str(short), "num_speculative_tokens": 0}, "num_speculative_tokens"),
        (
            {"model": str(short), "num_speculative_tokens": 2, "prompt_lookup_max": 3},
            "prompt_lookup_max applies to method='ngram' only",
        ),
        ({"model": str(small_vocab), "num_speculative_tokens": 2}, "vocab_size=256"),
        ({"model": str(short), "num_speculative_tokens": 2}, "max_position_embeddings=64"),
    ]
    for config, message in cases:
        _refused(tmp_path, {"method": "draft_model", **config}, message, monkeypatch)
    # The draft is split over the target's ranks: 3 heads do not split over 2.
    three_heads = tmp_path / "three_heads"
    transformers_model(
        three_heads, vocab_size=4096, hidden_size=96, num_attention_heads=3, num_key_value_heads=1
    )
    args = EngineArgs(
        model=str(demo_model_path()),
        device="cpu",
        tensor_parallel_size=2,
        speculative_config=draft_model(three_heads, 2),
    )
    with pytest.raises(ValueError, match="three_heads.*num_attention_heads=3"):
        args.create_engine_config()
    # A draft model named without method='draft_model' is an n-gram config with a stray key.
    _refused(
        tmp_path,
        {"method": "ngram", "model": str(short), "num_speculative_tokens": 2},
        "needs method='draft_model'",
        monkeypatch,
    )


def transformers_model(path: Path, **overrides) -> Path:
    """A random one-layer Llama saved with safetensors (its weights never matter here)."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_config(
        make_hf_config("llama", num_hidden_layers=1, **overrides), dtype=torch.float32
    )
    model.save_pretrained(path)
    return path


@pytest.mark.gpu
def test_on_the_gpu_with_cuda_graphs_and_a_profiled_pool() -> None:
    """On a GPU: the pool is sized by profiling with the draft's weights and bytes per
    block counted (fewer blocks than without it), the draft's passes replay its CUDA
    graphs, the demo model drafting for itself keeps every draft, and with the shipped
    draft the greedy text is the demo model's alone."""
    from minivllm.demo import demo_draft_path

    path = demo_model_path()
    prompts = ["In the beginning", "And God said", "The LORD is my shepherd", "Blessed are"]
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    # float32: a verification pass scores several tokens of a request at once, and in
    # bfloat16 its rounding may break a near-tie differently from a one-token step.
    args = dict(device="cuda", dtype="float32", max_model_len=256, gpu_memory_utilization=0.3)
    args.update(max_num_seqs=8, max_num_batched_tokens=256)  # few graphs to capture
    runs, blocks = {}, {}
    for name, draft in (("off", None), ("self", path), ("draft", demo_draft_path())):
        spec = None if draft is None else draft_model(draft, 4)
        llm = LLM(str(path), enforce_eager=False, speculative_config=spec, **args)
        outs = llm.generate(prompts, params, use_tqdm=False)
        runs[name] = [o.outputs[0].token_ids for o in outs]
        blocks[name] = _kv(llm).num_blocks
        if draft is not None:
            stats = llm.llm_engine.stats.spec_decoding_stats
            replays = llm.collective_rpc(_draft_replays)[0]
            assert replays[DECODE] > 0 and replays[VERIFY] > 0, replays
            if name == "self":
                assert 0 < stats.num_accepted_tokens == stats.num_draft_tokens
            else:
                assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens
        del llm
        torch.cuda.empty_cache()
    assert runs["self"] == runs["off"]
    assert runs["draft"] == runs["off"]
    # A block id costs the draft's bytes too (the demo drafting itself: twice as many).
    assert blocks["self"] < blocks["off"] * 0.6
    assert blocks["draft"] < blocks["off"]
