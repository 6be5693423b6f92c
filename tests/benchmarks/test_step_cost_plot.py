"""The decode cost figure (``step_cost_plot.py``) drawn from a synthetic step timeline
result, and its refusal of a result that has no fit."""

from __future__ import annotations

import json

import pytest

from minivllm.benchmarks.step_cost_model import fit_decode_cost
from minivllm.benchmarks.step_cost_plot import main, plot_decode_cost
from minivllm.benchmarks.step_timeline import per_step_columns
from tests.benchmarks.test_step_cost_model import BANDWIDTH, KV_BYTES, WEIGHT_BYTES, _decode_steps


def _result(cost: dict) -> dict:
    steps = _decode_steps(60)
    roofline = {
        "copy_bandwidth": BANDWIDTH,
        "kv_bytes_per_token": KV_BYTES,
        "weight_bytes": WEIGHT_BYTES,
    }
    timeline = {"per_step": per_step_columns(steps), "decode_cost": cost}
    return {"roofline": roofline, "step_timeline": timeline}


def test_the_figure_is_drawn_from_the_json_alone(tmp_path) -> None:
    cost = fit_decode_cost(_decode_steps(60), KV_BYTES, WEIGHT_BYTES, BANDWIDTH)
    result = tmp_path / "throughput.json"
    result.write_text(json.dumps(_result(cost)))
    out = tmp_path / "figs" / "decode_cost.png"
    main([str(result), str(out)])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_result_without_a_fit_is_refused_with_the_field_named(tmp_path) -> None:
    with pytest.raises(ValueError, match="decode_cost is skipped: no GPU"):
        plot_decode_cost(_result({"skipped": "no GPU times"}), tmp_path / "x.png")
    with pytest.raises(ValueError, match="decode_cost is missing"):
        plot_decode_cost({"step_timeline": {}}, tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()
