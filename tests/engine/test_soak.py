"""The soak test, short: a few hundred random requests through ``LLMEngine`` and
``AsyncLLM`` on a tiny model (``minivllm bench soak`` runs the long one).

Each run must end with no leaked KV block, nothing left queued, no failed request, and
every finished request equal to its reference run (greedy near-ties allowed, counted).
The workload must actually exercise what it claims to (preemption, prefix hits, aborts,
every output kind), and the harness must be able to fail: a leak and a wrong token put
in on purpose are caught.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from minivllm.benchmarks import soak
from minivllm.benchmarks.soak_workload import WorkloadShape, make_workload
from minivllm.core.kv_cache_manager import KVCacheManager
from minivllm.engine.arg_utils import EngineArgs
from minivllm.engine.llm_engine import LLMEngine
from minivllm.sampling_params import RequestOutputKind, SamplingParams


def soak_args(model_dir: Path, tmp_path: Path, **overrides) -> argparse.Namespace:
    """``minivllm bench soak``'s options for the tiny model: 8 blocks hold one
    full-length request, the pool 24, so a busy batch preempts. The reference runs 64
    requests at a time (the tiny model's rows are cheap)."""
    parser = argparse.ArgumentParser()
    soak.add_soak_args(parser)
    args = parser.parse_args([])
    settings = dict(
        model=str(model_dir),
        device="cpu",
        num_requests=300,
        max_model_len=128,
        num_kv_blocks=24,
        max_num_seqs=16,
        max_num_batched_tokens=128,
        max_in_flight=32,
        reference_batch=64,
        output=str(tmp_path / "soak.json"),
    )
    for key, value in {**settings, **overrides}.items():
        setattr(args, key, value)
    return args


def assert_clean(out: dict) -> None:
    c = out["counts"]
    assert c["errors"] == 0, out["error_examples"]
    assert c["mismatches"] == 0, out["mismatch_examples"]
    assert c["leaked_blocks"] == 0 and c["unfinished_at_end"] == 0
    assert out["passed"]
    # The workload did what it is for.
    assert c["finished"] > c["requests"] // 2 and c["aborted"] > 0
    assert c["preemptions"] > 0 and c["prefix_cache_hit_tokens"] > 0
    assert c["compared"] > c["finished"] * 0.8


def test_offline_engine_soak(model_dir, tmp_path) -> None:
    out = soak.run_soak(soak_args(model_dir, tmp_path))
    assert_clean(out)
    assert Path(out["settings"] and tmp_path / "soak.json").is_file()


def test_async_llm_soak(model_dir, tmp_path) -> None:
    out = soak.run_soak(
        soak_args(model_dir, tmp_path, engine="async", num_requests=150), in_thread=True
    )
    assert_clean(out)


def test_the_workload_covers_every_parameter() -> None:
    shape = WorkloadShape(vocab_size=512, max_model_len=128, stop_token_ids=(7, 8))
    w = make_workload(1000, 0, shape)
    assert w == make_workload(1000, 0, shape)  # a seed names a workload
    lens = [len(r.prompt_token_ids) for r in w]
    assert min(lens) == 1 and max(r.params.max_tokens + len(r.prompt_token_ids) for r in w) == 128
    params = [r.params for r in w]
    assert {p.n for p in params} == {1, 2, 3}
    assert {p.output_kind for p in params} == set(RequestOutputKind)
    for check in (
        lambda p: p.temperature == 0.0,
        lambda p: p.seed is not None,
        lambda p: p.temperature > 0 and p.seed is None,
        lambda p: p.stop,
        lambda p: p.stop_token_ids,
        lambda p: p.logprobs is not None,
        lambda p: p.max_tokens == 1,
        lambda p: p.min_tokens > 0,
        lambda p: p.ignore_eos,
        lambda p: p.repetition_penalty != 1.0,
        lambda p: p.top_k > 0 and p.top_p < 1.0 and p.min_p > 0,
    ):
        assert any(check(p) for p in params)
    aborts = [r.abort_after for r in w if r.abort_after is not None]
    assert 0 in aborts and 60 < len(aborts) < 140


def test_a_leak_is_caught(model_dir, tmp_path, monkeypatch) -> None:
    """Blocks of aborted requests never given back: the soak reports them and fails."""
    free = KVCacheManager.free

    def free_unless_aborted(self, request, *args, **kwargs) -> None:
        if request.status.name != "FINISHED_ABORTED":
            free(self, request, *args, **kwargs)

    monkeypatch.setattr(KVCacheManager, "free", free_unless_aborted)
    out = soak.run_soak(soak_args(model_dir, tmp_path, num_requests=60, abort_rate=0.5))
    assert out["counts"]["leaked_blocks"] > 0 and not out["passed"]


def test_a_wrong_token_is_caught(model_dir, tmp_path, monkeypatch) -> None:
    """A sampler that changes one row's token when the batch is large: a mismatch."""
    from minivllm.sample.sampler import Sampler

    forward = Sampler.forward

    def flip_in_big_batches(self, logits, metadata):
        out = forward(self, logits, metadata)
        if logits.shape[0] >= 6:
            out.sampled_token_ids[0] = (out.sampled_token_ids[0] + 1) % logits.shape[1]
        return out

    monkeypatch.setattr(Sampler, "forward", flip_in_big_batches)
    out = soak.run_soak(soak_args(model_dir, tmp_path, num_requests=60, reference_batch=4))
    assert out["counts"]["mismatches"] > 0 and not out["passed"]


def test_delta_text_with_stop_strings_longer_than_the_text() -> None:
    """A stream holds back ``len(longest stop) - 1`` characters; while the text is
    shorter than that, nothing may be sent (the soak found text sent twice)."""
    from minivllm.demo import demo_model_path

    engine = LLMEngine.from_engine_args(
        EngineArgs(
            model=str(demo_model_path()),
            device="cpu",
            dtype="float32",
            num_kv_blocks=32,
            max_model_len=128,
        )
    )
    final = None
    for k in range(1, 21):
        texts = {}
        for kind in (RequestOutputKind.DELTA, RequestOutputKind.FINAL_ONLY):
            params = SamplingParams(temperature=0.0, max_tokens=8, stop=["#" * k], output_kind=kind)
            engine.add_request("In the beginning", params)
            pieces = []
            while engine.has_unfinished_requests():
                pieces += [o.outputs[0].text for o in engine.step()]
            texts[kind] = "".join(pieces)
        final = texts[RequestOutputKind.FINAL_ONLY]
        assert texts[RequestOutputKind.DELTA] == final, f"stop string of {k} characters"
    assert final


@pytest.mark.parametrize("abort_rate", [-0.1, 1.5])
def test_bad_abort_rate_is_refused(abort_rate) -> None:
    with pytest.raises(ValueError, match="abort_rate"):
        make_workload(10, 0, WorkloadShape(512, 128, abort_rate=abort_rate))


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--num-requests", "0"),
        ("--abort-rate", "nan"),
        ("--reference-batch", "0"),
        ("--tie-tolerance", "-1"),
        ("--max-seconds", "0"),
    ],
)
def test_bench_soak_refuses_bad_options_before_loading(flag, value, capsys) -> None:
    from minivllm.cli import main

    assert main(["bench", "soak", flag, value, "--model", "/nonexistent"]) == 2
    assert f"minivllm: error: {flag} must be" in capsys.readouterr().err
