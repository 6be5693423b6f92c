"""``minivllm bench tp --rank-standin``: one rank's shape of TP=N, and the run on the CPU.

The shape arithmetic is checked on Qwen3-8B's shape; the runs use a tiny Qwen3 (not a
timing: they check what the JSON records). A machine with one GPU is simulated by
making ``visible_gpus`` answer 1; the engines still run on the CPU.
"""

from __future__ import annotations

import json
import multiprocessing

import pytest

from minivllm.benchmarks import tensor_parallel_standin as standin
from minivllm.benchmarks.tensor_parallel import QWEN3_8B_SHAPE
from minivllm.benchmarks.tensor_parallel_standin import (
    check_standin_checkpoint,
    model_shape,
    rank_shape,
    special_ids_within,
    standin_workload,
)
from minivllm.benchmarks.workloads import Workload
from minivllm.cli import main
from tests.tiny_models import make_tiny_model

pytestmark = pytest.mark.timeout(180)


def test_one_rank_of_qwen3_8b_at_two_ranks() -> None:
    shape = rank_shape(QWEN3_8B_SHAPE, 2)
    assert (shape["num_attention_heads"], shape["num_key_value_heads"]) == (16, 4)
    assert (shape["intermediate_size"], shape["vocab_size"]) == (6144, 75968)
    for key in ("hidden_size", "num_hidden_layers", "head_dim", "rope_theta"):
        assert shape[key] == QWEN3_8B_SHAPE[key]
    # Qwen3's special ids (151643, 151645) are past the slice: moved to its top, above
    # every id the workload draws.
    assert (shape["bos_token_id"], shape["eos_token_id"]) == (75966, 75967)
    assert QWEN3_8B_SHAPE["eos_token_id"] == 151645  # the model's own shape is untouched


def test_rank_shape_follows_the_engine_split() -> None:
    # Fewer KV heads than ranks: each rank holds one replicated KV head.
    assert rank_shape({**QWEN3_8B_SHAPE, "num_key_value_heads": 1}, 2)["num_key_value_heads"] == 1
    # An odd vocabulary is padded up to a multiple of the ranks, like VocabParallelEmbedding.
    assert rank_shape({**QWEN3_8B_SHAPE, "vocab_size": 151937}, 2)["vocab_size"] == 75969
    # head_dim absent from a config: the full model's hidden / heads, kept per rank.
    shape = {k: v for k, v in QWEN3_8B_SHAPE.items() if k != "head_dim"}
    assert rank_shape(shape, 4)["head_dim"] == 128


@pytest.mark.parametrize(
    ("changes", "tp", "field"),
    [
        ({}, 3, "num_attention_heads=32"),
        ({"num_attention_heads": 24, "num_key_value_heads": 8}, 3, "num_key_value_heads=8"),
        ({"intermediate_size": 12290}, 4, "intermediate_size=12290"),
    ],
)
def test_rank_shape_refuses_a_size_that_does_not_divide(changes, tp, field) -> None:
    with pytest.raises(ValueError, match=f"--tensor-parallel-size {tp} does not divide {field}"):
        rank_shape({**QWEN3_8B_SHAPE, **changes}, tp)


def test_special_ids_move_inside_the_vocabulary_only_when_outside() -> None:
    inside = {"vocab_size": 512, "bos_token_id": 1, "eos_token_id": 2}
    assert special_ids_within(inside) == inside
    moved = special_ids_within({"vocab_size": 512, "eos_token_id": [2, 600], "pad_token_id": 700})
    assert moved == {"vocab_size": 512, "eos_token_id": [2, 511], "pad_token_id": 509}


def test_workload_ids_wrap_into_a_small_vocabulary() -> None:
    workload = Workload([[3, 10000], [5120, 7]], [4, 2])
    same, wrapped = standin_workload(workload, 10001)
    assert same is workload and not wrapped
    small, wrapped = standin_workload(workload, 5120)
    assert wrapped and small.prompts == [[3, 4880], [0, 7]] and small.output_lens == [4, 2]


def test_a_reused_folder_of_another_shape_is_refused(tmp_path) -> None:
    shape = rank_shape(QWEN3_8B_SHAPE, 2)
    (tmp_path / "config.json").write_text(json.dumps(rank_shape(QWEN3_8B_SHAPE, 4)))
    with pytest.raises(ValueError, match="num_attention_heads"):
        check_standin_checkpoint(tmp_path, shape)
    (tmp_path / "config.json").write_text(json.dumps(shape))
    check_standin_checkpoint(tmp_path, shape)


def test_only_a_qwen3_model_gets_a_standin(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    args = type("Args", (), {"model": str(tmp_path)})()
    with pytest.raises(ValueError, match="--rank-standin builds a Qwen3 checkpoint"):
        model_shape(args, QWEN3_8B_SHAPE)


def _argv(model, out, standin_path) -> list[str]:
    return ["bench", "tp", "--model", str(model), "--dtype", "float32", "--max-model-len",
            "64", "--max-num-seqs", "4", "--max-num-batched-tokens", "64", "--num-requests",
            "3", "--input-len-range", "4", "16", "--output-len-range", "2", "6",
            "--warmup-requests", "1", "--equiv-requests", "2", "--equiv-max-tokens", "4",
            "--allow-cpu", "--output", str(out), "--rank-standin-path",
            str(standin_path)]  # fmt: skip


def _check_standin(result: dict, standin_path) -> None:
    rank = result["rank_standin"]
    tp1 = result["tp1"]
    assert rank["of_tensor_parallel_size"] == 2 and rank["tensor_parallel_size"] == 1
    assert rank["shape"] == {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
                             "intermediate_size": 64, "vocab_size": 5120, "hidden_size": 64,
                             "num_hidden_layers": 2}  # fmt: skip
    assert rank["seconds"] > 0 and rank["steps"] > 0
    assert rank["output_tokens_per_s"] == result["workload"]["output_tokens"] / rank["seconds"]
    assert rank["tp1_over_standin"] == rank["output_tokens_per_s"] / tp1["output_tokens_per_s"]
    # The workload draws ids up to 10000: wrapped into the 5120-token slice.
    assert rank["token_ids_wrapped"] and rank["checkpoint"] == str(standin_path)
    config = json.loads((standin_path / "config.json").read_text())
    assert config["vocab_size"] == 5120 and config["eos_token_id"] < 5120


def test_standin_after_both_sizes(tmp_path) -> None:
    model = make_tiny_model("qwen3", tmp_path / "qwen3", vocab_size=10240)
    out, path = tmp_path / "tp.json", tmp_path / "standin"
    assert main([*_argv(model, out, path), "--rank-standin"]) == 0
    result = json.loads(out.read_text())
    assert result["tpn"]["tensor_parallel_size"] == 2 and "tpn_skipped" not in result
    assert result["tpn_over_tp1"] > 0 and result["equivalence"]["num_prompts"] == 2
    _check_standin(result, path)
    assert out.with_suffix(".png").stat().st_size > 0
    assert multiprocessing.active_children() == []


def test_one_gpu_skips_tpn_and_runs_the_standin(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(standin, "visible_gpus", lambda: 1)
    model = make_tiny_model("qwen3", tmp_path / "qwen3", vocab_size=10240)
    out, path = tmp_path / "tp.json", tmp_path / "standin"
    assert main([*_argv(model, out, path), "--rank-standin"]) == 0
    result = json.loads(out.read_text())
    assert "TP=2 needs 2 GPUs and 1 is visible" in result["tpn_skipped"]
    for key in ("tpn", "tpn_over_tp1", "equivalence", "workload_greedy", "incomplete"):
        assert key not in result
    _check_standin(result, path)
    assert not out.with_suffix(".png").exists()  # the picture compares TP=N with TP=1


def test_one_gpu_without_standin_is_refused_before_anything_runs(
    tmp_path, monkeypatch, capsys
) -> None:
    monkeypatch.setattr(standin, "visible_gpus", lambda: 1)
    model = make_tiny_model("qwen3", tmp_path / "qwen3", vocab_size=10240)
    out, path = tmp_path / "tp.json", tmp_path / "standin"
    assert main(_argv(model, out, path)) == 2
    assert "pass --rank-standin" in capsys.readouterr().err
    assert not out.exists() and not path.exists()
