"""The engine benchmarks run end to end (on the CPU, tiny model, tiny workload).

These are not timings: they keep ``minivllm bench ...`` from rotting between GPU runs
and check that every result file records its command, versions and figures.
"""

from __future__ import annotations

import json

import pytest

from minivllm.benchmarks.roofline import decode_roofline
from minivllm.benchmarks.workloads import Workload, throughput_workload
from minivllm.cli import main
from tests.tiny_models import make_tiny_model


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    # The published workload draws token ids up to 10000.
    return str(make_tiny_model("qwen3", tmp_path_factory.mktemp("qwen3"), vocab_size=10240))


# --allow-cpu: the GPU benchmarks refuse a machine without CUDA otherwise.
COMMON = [
    "--dtype",
    "float32",
    "--max-model-len",
    "128",
    "--max-num-seqs",
    "8",
    "--max-num-batched-tokens",
    "64",
    "--allow-cpu",
]


def test_published_workload_totals() -> None:
    w = throughput_workload()
    assert (len(w.prompts), w.num_prompt_tokens, w.num_output_tokens) == (256, 142827, 133966)


def test_roofline_counts_every_kv_read() -> None:
    w = Workload(prompts=[[0] * 3, [0] * 1], output_lens=[2, 3])
    roof = decode_roofline(w, weight_bytes=10, kv_bytes_per_token=1, copy_bandwidth=1.0)
    # 3 steps read weights; request 0 reads 4+5 tokens, request 1 reads 2+3+4.
    assert roof.total_weight_read == 30 and roof.total_kv_read == 18
    assert roof.max_output_tokens_per_s == pytest.approx(5 / 48)


def test_bench_throughput_with_hf_peer(qwen3_dir, tmp_path) -> None:
    out = tmp_path / "throughput.json"
    main(
        [
            "bench",
            "throughput",
            "--model",
            qwen3_dir,
            "--num-requests",
            "3",
            "--input-len-range",
            "4",
            "12",
            "--output-len-range",
            "2",
            "5",
            "--peer",
            "hf",
            "--output",
            str(out),
            *COMMON,
        ]
    )
    result = json.loads(out.read_text())
    assert "bench throughput" in result["command"]
    assert {"torch", "transformers", "gpu"} <= set(result)
    assert result["minivllm"]["output_tokens_per_s"] > 0
    assert result["minivllm"]["fraction_of_roofline"] > 0
    assert result["peers"]["hf_generate"]["output_tokens_per_s"] > 0


def test_bench_latency_and_prefix(qwen3_dir, tmp_path) -> None:
    lat = tmp_path / "latency.json"
    main(
        [
            "bench",
            "latency",
            "--model",
            qwen3_dir,
            "--input-len",
            "8",
            "--output-len",
            "4",
            "--repeats",
            "2",
            "--output",
            str(lat),
            "--profile-dir",
            str(tmp_path / "prof"),
            *COMMON,
        ]
    )
    result = json.loads(lat.read_text())
    assert result["median_tpot_ms"] > 0
    assert result["profile"]["top"] and (tmp_path / "prof" / "decode_batch1_trace.json").is_file()
    pre = tmp_path / "prefix.json"
    main(
        [
            "bench",
            "prefix",
            "--model",
            qwen3_dir,
            "--num-requests",
            "3",
            "--prefix-len",
            "48",
            "--suffix-len",
            "4",
            "--output-len",
            "2",
            "--output",
            str(pre),
            *COMMON,
        ]
    )
    result = json.loads(pre.read_text())
    assert result["caching_on"]["prefix_cache_hit_rate"] > 0.5
    assert result["caching_off"]["prefix_cache_hit_rate"] == 0


def test_bench_host_splits_the_step(tmp_path) -> None:
    out = tmp_path / "host.json"
    main(
        [
            "bench",
            "host",
            "--batch-sizes",
            "1",
            "4",
            "--prompt-len",
            "20",
            "--steps",
            "5",
            "--prepare-batch",
            "8",
            "--prepare-blocks",
            "3",
            "40",
            "--output",
            str(out),
        ]
    )
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert [r["batch"] for r in rows] == [1, 4]
    for r in rows:
        parts = r["schedule_ms"] + r["execute_ms"] + r["update_ms"]
        assert 0 < parts <= r["ms_per_step"] * 1.01
    prepare = result["prepare_inputs"]
    assert [(r["batch"], r["blocks_per_request"], r["steps"]) for r in prepare] == [
        (8, 3, 5),
        (8, 40, 5),
    ]
    for r in prepare:
        assert 0 < r["persistent_min_us"] <= r["persistent_median_us"]
        assert 0 < r["rebuilt_min_us"] <= r["rebuilt_median_us"]


def test_gpu_benchmarks_refuse_a_cpu_without_allow_cpu(qwen3_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    out = tmp_path / "never.json"
    for name in ("throughput", "latency", "prefix", "kernel"):
        flags = ["--output-dir", str(tmp_path)] if name == "kernel" else ["--output", str(out)]
        assert main(["bench", name, *flags]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"minivllm: error: bench {name} needs a CUDA GPU")
        assert err.count("\n") == 1 and "Traceback" not in err  # one line, no traceback
        assert ("--allow-cpu" in err) == (name != "kernel")
    assert not out.exists() and not (tmp_path / "kernel.json").exists()
    # With the flag, the run goes on and says it runs on the CPU.
    main(
        [
            "bench",
            "latency",
            "--model",
            qwen3_dir,
            "--input-len",
            "4",
            "--output-len",
            "2",
            "--repeats",
            "1",
            "--output",
            str(out),
            *COMMON,
        ]
    )
    assert "running on the CPU (--allow-cpu)" in capsys.readouterr().out
    assert json.loads(out.read_text())["gpu"] is None


def test_default_outputs_never_under_docs(monkeypatch, tmp_path) -> None:
    """Run from the repository root, a benchmark must not overwrite committed results."""
    from minivllm.cli import build_parser

    parser = build_parser()
    for name, flag in [
        ("throughput", "output"),
        ("latency", "output"),
        ("prefix", "output"),
        ("host", "output"),
        ("serve", "output"),
        ("kernel", "output_dir"),
    ]:
        default = getattr(parser.parse_args(["bench", name]), flag)
        assert default.startswith("bench-results"), (name, default)


def test_peers_are_reported_as_each_finishes(qwen3_dir, monkeypatch) -> None:
    """A run stopped during the slow static-batching peer keeps the continuous one's
    figures: run_peers hands out what it has before each peer and after the last."""
    from minivllm.benchmarks import hf_peer
    from minivllm.benchmarks.throughput import run_peers

    monkeypatch.setattr(hf_peer, "load_hf", lambda path: None)
    monkeypatch.setattr(hf_peer, "run_hf_continuous",
                        lambda model, sub: {"output_tokens_per_s": 2.0})  # fmt: skip

    def static_fails(model, sub):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(hf_peer, "run_hf_generate", static_fails)
    seen = []
    sub = Workload(prompts=[[1, 2]], output_lens=[4])
    peers = run_peers(qwen3_dir, sub, 0.5, on_peer=lambda p: seen.append(json.dumps(p)))
    snapshots = [json.loads(s) for s in seen]
    assert len(snapshots) == 3  # before each of the two peers, and after the last
    assert "hf_generate_batch" not in snapshots[0]
    assert snapshots[1]["hf_generate_batch"]["minivllm_speedup"] == pytest.approx(4.0)
    assert "hf_generate" not in snapshots[1]
    assert "out of memory" in snapshots[2]["hf_generate"]["error"]
    assert snapshots[2] == json.loads(json.dumps(peers))
