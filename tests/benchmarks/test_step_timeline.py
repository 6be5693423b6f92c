"""``bench throughput --step-timeline``: the step buckets, the kernel classes, the kernel
summary on synthetic events, and one whole run on the CPU through the real ``LLM``.

No timings are asserted: on the CPU only the structure and the counts are exact.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import minivllm
from minivllm.benchmarks.roofline import decode_roofline
from minivllm.benchmarks.step_timeline import (
    CPU_KERNELS,
    CPU_TIMING,
    StepTimeline,
    StepTiming,
    aggregate,
    bucket_edges,
    run_step_timeline,
)
from minivllm.benchmarks.step_timeline_kernels import (
    KernelEvent,
    busy_and_gaps,
    kernel_class,
    kernel_events,
    summarize_kernels,
)
from minivllm.benchmarks.workloads import Workload
from minivllm.cli import main
from tests.benchmarks.test_bench_smoke import COMMON
from tests.tiny_models import make_tiny_model


def _step(reqs: int, tokens: int, mixed: bool, gpu: float | None, gap: float | None) -> StepTiming:
    # The same host and queuing time in every step: their sums count the steps.
    return StepTiming(0.0, reqs, tokens, mixed, execute_s=0.25, host_s=1.0, gpu_s=gpu, gap_s=gap)


def test_bucket_edges_are_inclusive_above() -> None:
    cases = {
        1: (1, 1),
        2: (2, 8),
        8: (2, 8),
        9: (9, 16),
        16: (9, 16),
        17: (17, 64),
        128: (65, 128),
        129: (129, 256),
        256: (129, 256),
        257: (257, None),
    }
    assert {n: bucket_edges(n) for n in cases} == cases


def test_aggregate_sums_and_means_by_kind_and_batch() -> None:
    steps = [
        _step(1, 1, False, 0.5, 0.125),
        _step(3, 3, False, 1.0, 0.25),
        _step(8, 8, False, 2.0, None),  # the last step has no next one: no gap
        _step(200, 200, False, 4.0, 0.5),
        _step(300, 300, False, 8.0, 1.0),
        _step(8, 900, True, 16.0, 2.0),
        _step(200, 1000, True, None, None),  # GPU fields unknown: left out of the means
    ]
    out = aggregate(steps)
    kinds = {k["kind"]: k for k in out["kinds"]}
    assert kinds["decode"]["steps"] == 5 and kinds["mixed"]["steps"] == 2
    assert kinds["decode"]["gpu_s"] == 15.5 and kinds["decode"]["gpu_mean_s"] == 15.5 / 5
    assert kinds["decode"]["gap_s"] == 1.875 and kinds["decode"]["gap_mean_s"] == 1.875 / 4
    assert kinds["mixed"]["gpu_s"] == 16.0 and kinds["mixed"]["gpu_mean_s"] == 16.0
    assert kinds["mixed"]["host_s"] == 2.0 and kinds["mixed"]["execute_mean_s"] == 0.25
    assert kinds["mixed"]["tokens"] == 1900 and kinds["mixed"]["tokens_per_step"] == 950
    rows = {(b["kind"], b["batch_min"], b["batch_max"]): b for b in out["buckets"]}
    assert list(rows) == [
        ("decode", 1, 1),
        ("decode", 2, 8),
        ("decode", 129, 256),
        ("decode", 257, None),
        ("mixed", 2, 8),
        ("mixed", 129, 256),
    ]
    two_to_8 = rows[("decode", 2, 8)]
    assert (two_to_8["steps"], two_to_8["tokens"], two_to_8["tokens_per_step"]) == (2, 11, 5.5)
    assert (two_to_8["gpu_s"], two_to_8["gpu_mean_s"]) == (3.0, 1.5)
    assert (two_to_8["gap_s"], two_to_8["gap_mean_s"]) == (0.25, 0.25)
    assert (two_to_8["host_s"], two_to_8["execute_s"]) == (2.0, 0.5)
    unknown = rows[("mixed", 129, 256)]
    assert unknown["gpu_s"] is None and unknown["gpu_mean_s"] is None and unknown["steps"] == 1
    assert aggregate([]) == {
        "kinds": [
            {
                "kind": k,
                "steps": 0,
                "tokens": 0,
                "tokens_per_step": None,
                **{
                    f: None
                    for f in (
                        "gpu_s",
                        "gpu_mean_s",
                        "gap_s",
                        "gap_mean_s",
                        "host_s",
                        "host_mean_s",
                        "execute_s",
                        "execute_mean_s",
                    )
                },
            }
            for k in ("decode", "mixed")
        ],
        "buckets": [],
    }


def _launched_triton_kernels() -> set[str]:
    """Names of minivllm's ``@triton.jit`` functions that some file launches as a grid."""
    jitted, sources = set(), []
    for path in Path(minivllm.__file__).parent.rglob("*.py"):
        src = path.read_text()
        sources.append(src)
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.FunctionDef) and any(
                "jit" in ast.unparse(d) for d in node.decorator_list
            ):
                jitted.add(node.name)
    launched = {m for src in sources for m in re.findall(r"(\w+)\[[^\]\n]*\]\(", src)}
    return jitted & launched


MINIVLLM_KERNELS = {
    "kernel_unified_attention": "attention",
    "reduce_segments_kernel": "attention",
    "qk_norm_rope_kernel": "rotary",
    "rotary_embedding_kernel": "rotary",
    "rms_norm_kernel": "norm",
    "silu_and_mul_kernel": "activation",
    "reshape_and_cache_kernel": "cache_write",
    "skinny_gemm_kernel": "gemm",
    "gate_up_silu_kernel": "gemm",  # its SiLU-and-mul epilogue does not make it "activation"
    "_gumbel_max_partial_kernel": "sampler",
}


def test_every_launched_minivllm_kernel_has_its_class() -> None:
    # A new kernel fails here until KERNEL_CLASSES (and this table) know it.
    assert _launched_triton_kernels() == set(MINIVLLM_KERNELS)
    assert {name: kernel_class(name) for name in MINIVLLM_KERNELS} == MINIVLLM_KERNELS


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("nvjet_sm90_tst_64x32_64x16_4x2_h_bz_TNT", "gemm"),
        ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT", "gemm"),
        ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float>", "gemm"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "gemm"),
        (
            "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, "
            "at::native::ArgMaxOps<float>, unsigned int, long, 4> >",
            "sampler",
        ),
        (
            "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
            "collective",
        ),
        ("Memcpy DtoH (Device -> Pinned)", "copy"),
        ("Memset (Device)", "copy"),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<int>>",
            "other",
        ),
        ("pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64>>", "attention"),
        ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80", "attention"),
    ],
)
def test_kernel_class_of_library_kernels(name: str, cls: str) -> None:
    assert kernel_class(name) == cls


def test_kernel_events_reads_a_real_profile_and_keeps_gpu_events_only() -> None:
    from torch.profiler import ProfilerActivity, profile

    # A CPU-only profile: the real kineto event API is read, and nothing is on a GPU.
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.ones(4).add_(1)
    assert kernel_events(prof) == []

    def kineto(name: str, device, start: int, dur: int) -> SimpleNamespace:
        return SimpleNamespace(
            name=lambda: name,
            device_type=lambda: device,
            start_ns=lambda: start,
            duration_ns=lambda: dur,
        )

    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU
    events = [kineto("k", cuda, 5, 7), kineto("aten::add", cpu, 1, 9), kineto("z", cuda, 9, 0)]
    fake = SimpleNamespace(
        profiler=SimpleNamespace(kineto_results=SimpleNamespace(events=lambda: events))
    )
    assert kernel_events(fake) == [KernelEvent("k", 5, 7)]


def test_summarize_kernels_counts_overlaps_once() -> None:
    events = [
        KernelEvent("nvjet_a", 0, 10_000),
        KernelEvent("rms_norm_kernel", 5_000, 10_000),  # overlaps the first: busy 0..15 us
        KernelEvent("nvjet_a", 18_000, 2_000),  # 3 us gap
        KernelEvent("kernel_unified_attention", 70_000, 30_000),  # 50 us gap
        KernelEvent("Memcpy HtoD (Pinned -> Device)", 2_100_000, 1_000),  # 2000 us gap
    ]
    assert busy_and_gaps(events) == (2_101_000, 48_000, [3_000, 50_000, 2_000_000])
    out = summarize_kernels(events)
    assert out["num_kernels"] == 5
    assert out["busy_s"] == pytest.approx(48e-6) and out["idle_s"] == pytest.approx(2.053e-3)
    assert [(r["min_us"], r["max_us"], r["count"]) for r in out["idle_gaps"]] == [
        (0, 5, 1),
        (5, 20, 0),
        (20, 100, 1),
        (100, 1000, 0),
        (1000, None, 1),
    ]
    assert list(out["classes_s"]) == ["attention", "gemm", "norm", "copy"]
    assert out["classes_s"]["gemm"] == pytest.approx(12e-6)
    assert out["top_kernels"][1] == {"name": "nvjet_a", "calls": 2, "seconds": 12e-6}
    assert summarize_kernels([])["busy_s"] == 0 and busy_and_gaps([]) == (0, 0, [])


def test_step_timeline_on_the_cpu_records_every_step_once(llm) -> None:
    core = llm.llm_engine.engine_core.engine_core
    sched, runner = core.scheduler, core.model_executor.model_runner
    wl = Workload(prompts=[[5, 6, 7, 8, 9], [10] * 9, [11, 12, 13]], output_lens=[3, 6, 2])
    before = sched.num_steps
    out = run_step_timeline(llm, wl, roofline=decode_roofline(wl, 10**6, 64, 1e12))
    assert out["totals"]["steps"] == sched.num_steps - before > 0
    # The wrappers are gone: the class's own methods show through again.
    assert "schedule" not in vars(sched) and "execute_model_async" not in vars(runner)
    assert out["gpu_timing"] == CPU_TIMING and out["kernels"] == {"skipped": CPU_KERNELS}
    per_step = out["per_step"]
    assert len(per_step["num_reqs"]) == out["totals"]["steps"]
    assert all(g is None for g in per_step["gpu_s"] + per_step["gap_s"])
    assert all(x is not None for x in per_step["execute_s"] + per_step["host_s"])
    # Each request's prompt runs once, then one token per output token but the last.
    assert sum(per_step["num_tokens"]) == wl.num_prompt_tokens + wl.num_output_tokens - 3
    assert per_step["mixed"][0] and not per_step["mixed"][-1]
    # Every step reads each sequence's whole context: its prompt, then one more token
    # per decode step (a request's last token is sampled, never run).
    contexts = sum(len(p) * o + o * (o - 1) // 2 for p, o in zip(wl.prompts, wl.output_lens))
    assert sum(per_step["context_tokens"]) == contexts
    # The decode cost fit needs GPU times: on the CPU it says why it is missing.
    assert "0 decode steps with GPU times" in out["decode_cost"]["skipped"]
    kinds = {k["kind"]: k["steps"] for k in out["kinds"]}
    assert kinds["decode"] + kinds["mixed"] == out["totals"]["steps"]
    assert sum(b["steps"] for b in out["buckets"]) == out["totals"]["steps"]
    assert out["totals"]["gpu_s"] is None
    json.dumps(out)  # all of it goes into the result file


class _FakeEvent:
    """A recorded CUDA event at a known GPU time (seconds)."""

    def __init__(self, at: float) -> None:
        self.at = at

    def elapsed_time(self, later: _FakeEvent) -> float:
        return (later.at - self.at) * 1e3  # milliseconds, as torch.cuda.Event's


def test_resolve_turns_events_into_step_and_gap_times(monkeypatch) -> None:
    # The GPU path without a GPU: events at known times, synchronize a no-op.
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    runner = SimpleNamespace(device=torch.device("cuda"))
    core = SimpleNamespace(scheduler=object(), model_executor=SimpleNamespace(model_runner=runner))
    timeline = StepTimeline(core)
    assert timeline.use_events
    spans = [(0.0, 0.5), (0.75, 1.0), (1.0, 2.0)]  # GPU time 0.5, 0.25, 1; gaps 0.25, 0
    timeline.steps = [
        StepTiming(10.0 + i, 4, 4, False, execute_s=0.125, events=(_FakeEvent(a), _FakeEvent(b)))
        for i, (a, b) in enumerate(spans)
    ]
    steps = timeline.resolve(run_end=12.5)
    assert [s.gpu_s for s in steps] == [0.5, 0.25, 1.0]
    assert [s.gap_s for s in steps] == [0.25, 0.0, None]
    assert [s.host_s for s in steps] == [1.0, 1.0, 0.5]
    assert all(s.events is None for s in steps)  # the events are let go


def test_step_timeline_restores_the_engine_when_the_run_fails(llm) -> None:
    core = llm.llm_engine.engine_core.engine_core
    with pytest.raises(RuntimeError, match="stopped"), StepTimeline(core):
        assert "schedule" in vars(core.scheduler)
        raise RuntimeError("stopped")
    assert "schedule" not in vars(core.scheduler)
    assert "execute_model_async" not in vars(core.model_executor.model_runner)


def test_bench_throughput_writes_the_step_timeline(tmp_path_factory, tmp_path) -> None:
    qwen3 = make_tiny_model("qwen3", tmp_path_factory.mktemp("qwen3"), vocab_size=10240)
    out = tmp_path / "throughput.json"
    main(
        [
            "bench",
            "throughput",
            "--model",
            str(qwen3),
            "--num-requests",
            "2",
            "--input-len-range",
            "4",
            "8",
            "--output-len-range",
            "2",
            "3",
            "--step-timeline",
            "--output",
            str(out),
            *COMMON,
        ]
    )
    timeline = json.loads(out.read_text())["step_timeline"]
    assert timeline["temperature"] == 0.6 and timeline["kernels"] == {"skipped": CPU_KERNELS}
    assert timeline["totals"]["steps"] == len(timeline["per_step"]["num_reqs"]) > 0
    assert "skipped" in timeline["decode_cost"]  # given the roofline; no GPU times here
