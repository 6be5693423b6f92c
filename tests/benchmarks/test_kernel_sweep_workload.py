"""The workload sweep's command line (the sweep itself needs a GPU: its stages are faked)."""

from __future__ import annotations

import json

import pytest

from minivllm.benchmarks import kernel_sweep_workload as sweep


def test_refuses_a_machine_without_cuda(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    out = tmp_path / "never.json"
    with pytest.raises(SystemExit) as exc:
        sweep.main([str(out), "--decode-only"])
    assert exc.value.code == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("decode_only", [False, True])
def test_decode_only_skips_the_prefill_batches(tmp_path, monkeypatch, decode_only) -> None:
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.empty_cache", lambda: None)
    monkeypatch.setattr(sweep, "measure_copy_bandwidth", lambda: 1.0)
    monkeypatch.setattr(sweep, "environment", lambda: {"command": "test"})
    monkeypatch.setattr(sweep, "sweep_batch", lambda name, seqs, seed: {"num_seqs": len(seqs)})
    monkeypatch.setattr(sweep, "sweep_decode_batch", lambda b, bw, seed: {"batch": b})
    out = tmp_path / "sweep.json"
    sweep.main([str(out), *(["--decode-only"] if decode_only else [])])
    result = json.loads(out.read_text())
    assert [d["batch"] for d in result["decode"]] == list(sweep.DECODE_BATCHES)
    batches = sweep.workload_batches().items()
    expected = {} if decode_only else {name: {"num_seqs": len(s)} for name, s in batches}
    assert result["batches"] == expected


def test_chosen_batches_and_a_stopped_sweep_keeps_what_it_measured(tmp_path, monkeypatch):
    """``--decode-batches`` picks the sizes, and the JSON is written after every batch: a
    sweep that stops (a time limit, here an error) leaves the batches it finished."""
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.empty_cache", lambda: None)
    monkeypatch.setattr(sweep, "measure_copy_bandwidth", lambda: 1.0)
    monkeypatch.setattr(sweep, "environment", lambda: {"command": "test"})

    def decode_batch(batch: int, bw: float, seed: int) -> dict:
        if batch == 96:
            raise TimeoutError("stopped")
        return {"batch": batch}

    monkeypatch.setattr(sweep, "sweep_decode_batch", decode_batch)
    out = tmp_path / "sweep.json"
    with pytest.raises(TimeoutError):
        sweep.main([str(out), "--decode-only", "--decode-batches", "256", "48", "96", "8"])
    assert [d["batch"] for d in json.loads(out.read_text())["decode"]] == [256, 48]


def test_decode_sweep_times_the_engines_pick_longest_first(monkeypatch) -> None:
    """At 256 sequences on an H200-sized GPU the engine's pick (``ordered``) is timed
    longest first and the batch-order pick, a different configuration, in batch order;
    every other candidate longest first. (Timings faked: the sweep needs a GPU.)"""
    import torch

    from minivllm.attention import triton_launch_config as tlc

    monkeypatch.setattr(tlc, "num_multiprocessors", lambda device: 132)
    monkeypatch.setattr(tlc, "smem_budget", lambda device: 227 * 1024)
    monkeypatch.setattr(
        sweep, "batch_inputs",
        lambda seqs, seed: {"seq_lens": torch.tensor([c + n for c, n in seqs])},
    )  # fmt: skip
    timed = []

    def fake_time(inputs, config, seq_order=None) -> float:
        timed.append((config, seq_order is not None))
        return 0.1 + 0.01 * len(timed)

    monkeypatch.setattr(sweep, "time_config", fake_time)
    result = sweep.sweep_decode_batch(256, copy_bw=1e12, seed=0)
    engine = sweep.picked_config([(1000, 1)] * 256, ordered=True)
    batch_order = sweep.picked_config([(1000, 1)] * 256)
    assert engine != batch_order and (engine.tile_n, batch_order.tile_n) == (64, 128)
    assert result["select_config"] == engine.__dict__
    assert result["batch_order_config"] == batch_order.__dict__
    assert timed[-1] == (batch_order, False)
    assert all(ordered for _, ordered in timed[:-1])
    assert (engine, True) in timed
    picked = [r for r in result["rows"] if r["auto"]]
    assert len(picked) == 1 and picked[0]["ordered"]
    assert picked[0]["ms"] == result["select_config_ms"]


def test_mixed_split_times_only_the_mixed_batches(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr(sweep, "measure_copy_bandwidth", lambda: 1.0)
    monkeypatch.setattr(sweep, "environment", lambda: {"command": "test"})
    monkeypatch.setattr(sweep, "split_mixed_batch",
                        lambda name, seqs, seed: {"batch": name, "first": seqs[0]})  # fmt: skip
    monkeypatch.setattr(sweep, "sweep_batch", lambda *a: pytest.fail("not a split run"))
    out = tmp_path / "split.json"
    sweep.main([str(out), "--mixed-split"])
    rows = json.loads(out.read_text())["mixed_split"]
    assert [r["batch"] for r in rows] == ["mixed_8192", "mixed_16384"]
    # Each mixed batch lists its decodes first, as the scheduler does.
    assert all(r["first"][1] == 1 for r in rows)
