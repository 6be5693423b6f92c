"""``minivllm bench tp --rank-standin``: one rank's share of TP=N, timed on one GPU.

Upstream has no such option; it is a measuring device of this project. A rank of TP=N
computes a model of the same depth and hidden size with 1/N of the query heads, of the KV
heads (or one replicated KV head), of the MLP's intermediate size and of the vocabulary
(the embedding and the LM head are split by vocabulary rows). A random checkpoint of
exactly that shape, run at TP=1 on the same workload with the same engine options, does
every rank's GEMMs, attention and sampling, and nothing else: no collective, no waiting
for the slower rank, no step message to worker processes. Its time therefore bounds
TP=N from below, and ``tp1_over_standin`` (TP=1's seconds over the stand-in's) bounds
TP=N's speed-up from above: the ceiling a target like "TP=2 >= 1.6x TP=1" is judged
against. The bound is slightly loose: a real rank samples over the all-gathered full
vocabulary, the stand-in over its slice only.

Because the stand-in needs a single GPU, ``--rank-standin`` also makes the benchmark
usable where TP=N cannot start: with fewer visible GPUs than ``--tensor-parallel-size``
TP=N is skipped (the JSON says why under ``tpn_skipped``) and TP=1 and the stand-in run
alone. Without ``--rank-standin`` such a machine is refused before anything is built.
On the CPU (``--allow-cpu``) the ranks are processes over gloo, so TP=N always runs.

This module holds the stand-in's shape, checkpoint path, workload and figures; the
engines are run by ``tensor_parallel.run_engine`` like the others.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from minivllm.benchmarks.workloads import Workload

STANDIN_DIR = "/tmp/minivllm-bench"

# Special ids moved into a smaller vocabulary, counted down from its last id (Qwen3 keeps
# its special tokens at the top of the vocabulary too).
_SPECIAL_IDS = {"eos_token_id": 1, "bos_token_id": 2, "pad_token_id": 3}
# The config fields that make a stand-in's shape: checked on a reused checkpoint, recorded
# in the JSON.
SHAPE_FIELDS = ("num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
                "vocab_size", "hidden_size", "num_hidden_layers")  # fmt: skip


def add_rank_standin_args(parser: argparse.ArgumentParser) -> None:
    """Register ``--rank-standin`` and ``--rank-standin-path``."""
    parser.add_argument(
        "--rank-standin",
        action="store_true",
        help="also time, at TP=1, a random model of one rank's shape of TP=N (the ceiling "
        "of TP=N's speed-up from per-rank work alone); with fewer GPUs than TP=N, TP=N is "
        "skipped and only TP=1 and the stand-in run",
    )
    parser.add_argument(
        "--rank-standin-path",
        default=None,
        help=f"folder of the stand-in checkpoint (default: under {STANDIN_DIR}, named "
        "after its shape; made once)",
    )


def visible_gpus() -> int | None:
    """CUDA devices this process sees, or None on a machine without CUDA (where the
    benchmark's ranks are CPU processes over gloo and any size can run)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else None


def tpn_skip_reason(args: argparse.Namespace, tp: int) -> str | None:
    """Why TP=``tp`` cannot run here (then it is skipped), or None when it can.

    Raises:
        ValueError: Too few GPUs and no ``--rank-standin``: there would be nothing to
            measure, and TP=N would fail only after the checkpoint was built.
    """
    gpus = visible_gpus()
    if gpus is None or gpus >= tp:
        return None
    if not args.rank_standin:
        raise ValueError(
            f"--tensor-parallel-size {tp} needs {tp} GPUs and {gpus} is visible; pass "
            f"--rank-standin to time TP=1 and one rank's share of TP={tp} on this machine"
        )
    return (
        f"TP={tp} needs {tp} GPUs and {gpus} is visible: TP={tp} not run; TP=1 and the "
        "rank stand-in run alone"
    )


def _divided(field: str, value: int, tp: int) -> int:
    if value % tp:
        raise ValueError(
            f"--tensor-parallel-size {tp} does not divide {field}={value}: no rank stand-in"
        )
    return value // tp


def rank_shape(shape: dict[str, Any], tp: int) -> dict[str, Any]:
    """The shape one rank of TP=``tp`` computes: heads, KV heads, intermediate size and
    vocabulary divided by ``tp``; head size, hidden size, layers and rope unchanged.

    KV heads fewer than ``tp`` are replicated by the engine (one per rank), and the
    vocabulary is padded up to a multiple of ``tp``
    (``VocabParallelEmbedding``), so the slice is rounded up like the engine's. Special
    token ids that fall outside the smaller vocabulary are moved into it (see
    ``special_ids_within``).

    Raises:
        ValueError: ``tp`` does not divide the heads or the intermediate size, or the KV
            heads are neither a multiple nor a divisor of ``tp`` (the message names the
            field and ``--tensor-parallel-size``).
    """
    out = dict(shape)
    heads = shape["num_attention_heads"]
    out.setdefault("head_dim", shape["hidden_size"] // heads)  # kept, not recomputed
    out["num_attention_heads"] = _divided("num_attention_heads", heads, tp)
    kv = shape.get("num_key_value_heads") or heads
    replicated = kv < tp and tp % kv == 0  # the engine gives each rank one whole KV head
    out["num_key_value_heads"] = 1 if replicated else _divided("num_key_value_heads", kv, tp)
    out["intermediate_size"] = _divided("intermediate_size", shape["intermediate_size"], tp)
    out["vocab_size"] = -(-shape["vocab_size"] // tp)
    return special_ids_within(out)


def special_ids_within(shape: dict[str, Any]) -> dict[str, Any]:
    """``shape`` with its bos, eos and pad ids inside its vocabulary.

    A rank's slice of Qwen3's vocabulary (151,936 / 2 = 75,968) no longer holds Qwen3's
    special ids (151,643 and 151,645): the config would name tokens the embedding and LM
    head have no row for, which transformers warns about when it builds the model.
    The stand-in's ids are moved to the top of its own vocabulary instead, above the ids
    the throughput workload draws (at most 10,000) when the vocabulary is large enough.
    The timed work does not change: the workload ignores EOS.
    """
    out = dict(shape)
    vocab = out["vocab_size"]
    for key, down in _SPECIAL_IDS.items():
        value = out.get(key)
        if isinstance(value, int) and value >= vocab:
            out[key] = max(vocab - down, 0)
        elif isinstance(value, list):
            out[key] = [v if v < vocab else max(vocab - down, 0) for v in value]
    return out


def model_shape(args: argparse.Namespace, default: dict[str, Any]) -> dict[str, Any]:
    """The benchmarked model's Qwen3 config: ``default`` (the random Qwen3-8B shape) or
    ``--model``'s config.json.

    Raises:
        ValueError: ``--model`` is not a Qwen3 checkpoint (the stand-in is built as one).
    """
    if not args.model:
        return dict(default)
    config = json.loads((Path(args.model) / "config.json").read_text())
    if config.get("model_type") != "qwen3":
        raise ValueError(
            f"--rank-standin builds a Qwen3 checkpoint; --model {args.model} is "
            f"{config.get('model_type')!r}"
        )
    return config


def standin_path(args: argparse.Namespace, shape: dict[str, Any]) -> Path:
    """Where the stand-in checkpoint lives: ``--rank-standin-path``, or a folder under
    ``STANDIN_DIR`` named after a hash of ``shape``, so a different shape never reuses
    another's weights."""
    if args.rank_standin_path:
        return Path(args.rank_standin_path)
    digest = hashlib.sha1(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:12]
    return Path(STANDIN_DIR) / f"qwen3-rank-standin-{digest}"


def check_standin_checkpoint(path: Path, shape: dict[str, Any]) -> None:
    """Refuse a reused checkpoint folder whose config is not ``shape``'s.

    Raises:
        ValueError: An earlier run left a different shape at ``path``.
    """
    saved = json.loads((path / "config.json").read_text())
    wrong = [f for f in SHAPE_FIELDS if saved.get(f) != shape.get(f)]
    if wrong:
        raise ValueError(
            f"{path} holds another shape ({', '.join(wrong)} differ): delete it or pass "
            "another --rank-standin-path"
        )


def standin_workload(workload: Workload, vocab_size: int) -> tuple[Workload, bool]:
    """The workload with its token ids inside the stand-in's vocabulary, and whether any
    had to change.

    The engine refuses a prompt id beyond the vocabulary, and the throughput workload
    draws ids up to 10,000, above a small model's slice. Ids are wrapped modulo the
    vocabulary: with random weights only the prompt and output lengths decide the work,
    and those stay the same.
    """
    if max((max(p) for p in workload.prompts if p), default=0) < vocab_size:
        return workload, False
    prompts = [[t % vocab_size for t in p] for p in workload.prompts]
    return Workload(prompts, list(workload.output_lens)), True


def standin_figures(
    figures: dict[str, Any], shape: dict[str, Any], tp: int, tp1: dict[str, Any]
) -> dict[str, Any]:
    """The JSON's ``rank_standin``: the engine's figures for the stand-in, its shape and
    ``tp1_over_standin``, TP=N's speed-up ceiling from per-rank work alone."""
    return {
        **figures,
        "of_tensor_parallel_size": tp,
        "shape": {k: shape.get(k) for k in SHAPE_FIELDS},
        "tp1_over_standin": figures["output_tokens_per_s"] / tp1["output_tokens_per_s"],
    }
