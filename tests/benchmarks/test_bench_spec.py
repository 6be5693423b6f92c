"""``minivllm bench spec`` runs end to end on the CPU (demo model, tiny counts).

Not timings: the test keeps the command from rotting between GPU runs, checks the
JSON's shape, and checks that every comparison is computed from the runs it compares.
"""

from __future__ import annotations

import json

import pytest

from minivllm.benchmarks.spec_decode_plot import plot_spec_results
from minivllm.benchmarks.workloads import repetitive_prompts
from minivllm.cli import main
from minivllm.demo import demo_model_path

SMALL = [
    "--dtype", "float32", "--max-model-len", "256", "--max-num-seqs", "4",
    "--max-num-batched-tokens", "256", "--num-prompts", "2", "--output-len", "32",
    "--num-requests", "3", "--input-len-range", "4", "10", "--output-len-range", "2", "6",
    "--sweep-batch-sizes", "1", "3", "--sweep-output-len", "8", "--sweep-prompt-len", "8",
    "--margin-output-len", "12", "--repeat-off",
]  # fmt: skip


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("spec") / "spec.json"
    demo = str(demo_model_path())
    argv = ["bench", "spec", "--model", demo, "--ks", "2", "--throughput-k", "2",
            "--draft-model", demo, "--draft-ks", "2", "--output", str(out), "--allow-cpu",
            *SMALL]  # fmt: skip
    assert main(argv) == 0
    assert out.with_suffix(".png").is_file()
    return json.loads(out.read_text())


def test_records_command_and_environment(result) -> None:
    assert "bench spec" in result["command"] and "--ks 2" in result["command"]
    assert {"torch", "triton", "gpu", "transformers"} <= set(result)
    assert result["workload"]["text"] and result["workload"]["num_prompts"] == 2
    assert result["workload"]["kind"] == "repetitive"  # no --prompt-file: the default


def test_batch1_comparisons_come_from_the_runs(result) -> None:
    b1 = result["batch1"]
    off = b1["off"]
    assert list(b1["ngram"]) == ["2"]
    for k, entry in b1["ngram"].items():
        assert entry["k"] == int(k) and not entry["async_scheduling"]
        assert entry["speedup_tpot"] == pytest.approx(off["tpot_ms"] / entry["tpot_ms"])
        assert entry["tpot_ms"] == pytest.approx(
            1e3 * entry["seconds"] / (entry["output_tokens"] - 2)
        )  # all but each first
        # Greedy speculation is lossless on the CPU in float32: every request identical.
        assert entry["identical_to_off"] == 2
        assert entry["first_difference"] == [None, None]
        # The repetitive prompts give the proposer matches; the statistics add up.
        assert entry["num_draft_tokens"] > 0
        assert entry["acceptance_rate"] == pytest.approx(
            entry["num_accepted_tokens"] / entry["num_draft_tokens"]
        )
        assert entry["mean_acceptance_length"] == pytest.approx(
            1 + entry["num_accepted_tokens"] / entry["num_drafts"]
        )
        assert len(entry["acceptance_rate_per_pos"]) == int(k)
        assert (
            sorted(entry["acceptance_rate_per_pos"], reverse=True)
            == (entry["acceptance_rate_per_pos"])
        )
        assert entry["tokens_per_step"] > 1  # accepted drafts: fewer steps than tokens
    assert off["tokens_per_step"] == pytest.approx(1.0, abs=0.1)
    assert "acceptance_rate" not in off


def test_throughput_ratio_comes_from_the_runs(result) -> None:
    t = result["throughput"]
    assert t["num_requests"] == 3 and t["ngram"]["k"] == 2
    assert t["off"]["output_tokens"] == t["ngram"]["output_tokens"]
    assert t["ratio_on_over_off"] == pytest.approx(
        t["ngram"]["output_tokens_per_s"] / t["off"]["output_tokens_per_s"]
    )
    assert 0 <= t["identical_requests"] <= 3


def test_threshold_run_comes_from_the_runs(result) -> None:
    t = result["throughput"]
    th = t["ngram_threshold"]
    assert th["k"] == 2 and th["async_scheduling"]  # n-gram with a threshold runs ahead
    assert th["disable_by_batch_size"] == result["sweep"]["disable_by_batch_size"]
    assert th["output_tokens"] == t["off"]["output_tokens"]
    assert th["ratio_over_off"] == pytest.approx(
        th["output_tokens_per_s"] / t["off"]["output_tokens_per_s"]
    )
    assert th["identical_requests"] == 3  # float32 on the CPU: lossless


def test_sweep_rows_and_crossover_come_from_the_runs(result) -> None:
    from minivllm.benchmarks.spec_decode_measure import crossover

    sweep = result["sweep"]
    assert (sweep["k"], sweep["output_len"], sweep["prompt_len"]) == (2, 8, 8)
    rows = sweep["rows"]
    assert [r["batch_size"] for r in rows] == [1, 3]
    for row in rows:
        b = row["batch_size"]
        for name in ("ngram", "ngram_threshold", "off_again"):
            entry = row[name]
            assert entry["output_tokens"] == row["off"]["output_tokens"] == 8 * b
            assert entry["ratio_over_off"] == pytest.approx(
                entry["output_tokens_per_s"] / row["off"]["output_tokens_per_s"]
            )
            assert entry["identical_to_off"] == b
            assert 0 <= entry["num_accepted_tokens"] <= entry["num_draft_tokens"]
        assert row["off"]["num_draft_tokens"] == 0
    assert sweep["crossover"] == crossover(rows)
    # No --disable-by-batch-size: the threshold is the crossover (1 if none paid).
    assert sweep["threshold_from_sweep"]
    assert sweep["disable_by_batch_size"] == (sweep["crossover"] or 1)


def test_crossover_is_the_last_size_that_still_paid() -> None:
    from minivllm.benchmarks.spec_decode_measure import crossover

    def rows(*ratios):
        return [
            {"batch_size": b, "ngram": {"ratio_over_off": r}}
            for b, r in zip([1, 4, 16, 64], ratios)
        ]

    assert crossover(rows(1.6, 1.2, 1.0, 0.7)) == 16
    assert crossover(rows(1.6, 0.9, 1.1, 0.7)) == 1  # the first loss ends it
    assert crossover(rows(0.9, 1.2, 1.1, 1.1)) is None


def test_identity_margins_come_from_the_runs(result) -> None:
    identity = result["identity"]
    assert (identity["prompts"], identity["output_len"]) == (2, 12)
    entry = result["batch1"]["ngram"]["2"]["greedy_margins"]
    assert entry["num_prompts"] == 2
    # float32 on the CPU: no divergence, so no margin to explain.
    assert entry["num_identical"] == 2 and entry["divergences"] == []
    assert identity["num_sequences"] == 2 * len(identity["by_setting"])
    assert identity["num_identical"] == identity["num_sequences"]
    assert identity["max_off_margin"] is None
    assert identity["by_setting"]["ngram k=2"] == [2, 2]
    gaps = identity["off_gaps"]  # off's top-2 gap at each of its 2 x 12 positions
    assert gaps["num_positions"] == 24
    assert 0 <= gaps["min"] <= gaps["p10"] <= gaps["median"]


def test_margins_report_both_runs_at_the_first_divergence() -> None:
    """The margin helper is bench tp's (compare_greedy), with spec's labels and lists."""
    from minivllm.benchmarks.spec_decode_measure import margins
    from minivllm.outputs import CompletionOutput
    from minivllm.runner_outputs import Logprob

    def completion(tokens, top2):
        rows = [{a: Logprob(la, 1), b: Logprob(lb, 2)} for a, la, b, lb in top2]
        return CompletionOutput(0, "", tokens, None, logprobs=rows)

    off = completion([5, 6, 7], [(5, -1.0, 9, -3.0), (6, -2.0, 8, -2.0078125), (7, -1, 1, -4)])
    on = completion([5, 8, 4], [(5, -1.0, 9, -3.0), (8, -2.0, 6, -2.0), (4, -1.0, 1, -2.0)])
    found = margins([off, off], [on, off])
    assert found["num_identical"] == 1 and found["max_off_margin"] == 0.0078125
    (d,) = found["divergences"]
    assert (d["prompt"], d["position"]) == (0, 1)
    assert d["off_top2"] == [[6, -2.0], [8, -2.0078125]] and d["on_margin"] == 0.0


def test_draft_model_measured_or_skipped_with_a_reason(result) -> None:
    draft = result["batch1"]["draft_model"]
    if "skipped" in draft:
        assert "draft-model proposer" in draft["skipped"]
        return
    assert list(draft) == ["2"]
    entry = draft["2"]
    assert "error" not in entry, entry.get("error")
    assert entry["identical_to_off"] == 2  # the draft is the target: every draft accepted
    assert entry["acceptance_rate"] == pytest.approx(1.0)


def test_plot_redraws_from_json(result, tmp_path) -> None:
    plot_spec_results(result, tmp_path / "again.png")
    assert (tmp_path / "again.png").stat().st_size > 10_000


def test_refuses_a_cpu_without_allow_cpu(capsys) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("there is a GPU")
    assert main(["bench", "spec", "--ks", "2"]) == 2
    assert "--allow-cpu" in capsys.readouterr().err


def test_bad_arguments_named(tmp_path, capsys) -> None:
    assert main(["bench", "spec", "--ks", "0", "--allow-cpu"]) == 2
    assert "--ks" in capsys.readouterr().err
    assert main(["bench", "spec", "--draft-model", str(tmp_path), "--allow-cpu"]) == 2
    assert "--draft-model" in capsys.readouterr().err
    argv = ["bench", "spec", "--allow-cpu", "--num-requests", "8", "--sweep-batch-sizes", "16"]
    assert main(argv) == 2
    assert "--sweep-batch-sizes" in capsys.readouterr().err
    assert main(["bench", "spec", "--allow-cpu", "--disable-by-batch-size", "0"]) == 2
    assert "--disable-by-batch-size" in capsys.readouterr().err


def test_a_broken_model_fails_fast_with_the_reason(tmp_path) -> None:
    """Non-finite logits fail each request (finish_reason "error") and the engine serves
    on; the bench must stop at once, not wait for a first token that never comes."""
    from safetensors.torch import load_file, save_file

    from tests.tiny_models import make_tiny_model

    path = make_tiny_model("llama", tmp_path / "nan")
    weights = load_file(path / "model.safetensors")
    weights["lm_head.weight"].fill_(float("nan"))
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    argv = ["bench", "spec", "--model", str(path), "--ks", "2", "--output",
            str(tmp_path / "out.json"), "--allow-cpu", *SMALL]  # fmt: skip
    with pytest.raises(RuntimeError, match="failed in the engine.*finite"):
        main(argv)


def test_repetitive_prompts_repeat() -> None:
    ids = repetitive_prompts(None, 2, vocab_size=512)
    assert all(p[: len(p) // 2] == p[len(p) // 2 :] for p in ids)
    assert all(0 <= t < 512 for p in ids for t in p)
