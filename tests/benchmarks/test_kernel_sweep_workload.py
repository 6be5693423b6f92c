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
