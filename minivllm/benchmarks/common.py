"""Shared pieces of the engine benchmarks: the environment record, a random-weight
Qwen3-0.6B-shaped checkpoint, and timing helpers.

Every benchmark writes one JSON file with the exact command, the GPU, the software
versions and every figure, so a result can be traced to how it was produced. By default
the file goes under ``bench-results/`` of the current folder (git ignores it), never over
the committed results in ``docs/benchmarks/``: publishing a run is a deliberate
``--output docs/benchmarks/...``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

# Qwen3-0.6B's shape (the model of nano-vllm's published workload), random weights.
QWEN3_0_6B_SHAPE: dict[str, Any] = dict(
    vocab_size=151936,
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=40960,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    bos_token_id=151643,
    eos_token_id=151645,
)


# Where results go unless --output names a file (relative to the current folder).
RESULTS_DIR = "bench-results"


def default_output(name: str) -> str:
    """The default ``--output`` of a benchmark: ``bench-results/<name>``."""
    return f"{RESULTS_DIR}/{name}"


def require_gpu(args: argparse.Namespace, command: str, cpu_flag: bool = True) -> None:
    """Refuse a GPU benchmark on a machine without CUDA, unless ``--allow-cpu``
    (``cpu_flag=False``: a benchmark that has no CPU version at all).

    Its default workload (a 0.6B-parameter model, hundreds of requests or thousands of
    tokens) takes seconds on a GPU and hours on a CPU, and a CPU figure says nothing
    about the GPU results it would sit next to. With ``--allow-cpu`` (the smoke tests
    use it, with a tiny model and workload) the run goes on and says so.

    Raises:
        ValueError: No CUDA and no ``--allow-cpu`` (the CLI prints it, exit status 2).
    """
    if torch.cuda.is_available():
        return
    if not cpu_flag:
        raise ValueError(f"bench {command} needs a CUDA GPU and none is available")
    if not getattr(args, "allow_cpu", False):
        raise ValueError(
            f"bench {command} needs a CUDA GPU and none is available: on a CPU its default "
            "workload would run for hours; pass --allow-cpu with a small workload to run "
            "it on the CPU anyway"
        )
    print(
        f"[minivllm] bench {command}: no CUDA GPU, running on the CPU (--allow-cpu); the "
        "figures are not comparable with GPU results",
        flush=True,
    )


_CLI_ARGS: list[str] | None = None


def set_cli_args(args: Sequence[str]) -> None:
    """Record the ``minivllm`` arguments being run (the CLI calls this), so results
    name the command even when ``main`` is called from Python rather than a shell."""
    global _CLI_ARGS
    _CLI_ARGS = list(args)


def command_line() -> str:
    """How this process was invoked, as a user would type it."""
    if _CLI_ARGS is not None:
        return " ".join(["minivllm", *_CLI_ARGS])
    argv0 = Path(sys.argv[0]).name
    if argv0 in ("minivllm", "__main__.py", "cli.py"):
        return " ".join(["minivllm", *sys.argv[1:]])
    return " ".join([sys.executable.split("/")[-1], *sys.argv])


def environment() -> dict[str, Any]:
    """GPU, versions, date and command of this run."""
    import transformers

    env: dict[str, Any] = {
        "command": command_line(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        # It sets torch's CPU threads on a GPU (worker.cpu_threads): part of the setup.
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        env["cuda"] = torch.version.cuda
    else:
        env["gpu"] = None
    return env


def make_random_checkpoint(path: Path, shape: dict[str, Any] | None = None) -> Path:
    """Save a random-weight Qwen3 checkpoint (bfloat16) of ``shape`` into ``path``.

    Weights are drawn on the GPU when there is one (seconds instead of minutes), with a
    fixed seed, so minivllm and Hugging Face peers read the very same file.
    """
    import transformers

    if (path / "model.safetensors").is_file():
        return path
    config = transformers.Qwen3Config(**(shape or QWEN3_0_6B_SHAPE))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.Qwen3ForCausalLM(config).to(torch.bfloat16)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return path


def free_device_memory() -> None:
    """Return the last engine's memory, so the next one's KV pool is sized as alone (an
    engine's pool takes most of what is free when it starts)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def cuda_sync() -> None:
    """Wait for the GPU (no-op on the CPU)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, *args: Any, **kwargs: Any) -> tuple[Any, float]:
    """Run ``fn`` and return its result and wall seconds, GPU work included."""
    cuda_sync()
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    cuda_sync()
    return result, time.perf_counter() - start


def measure_copy_bandwidth(nbytes: int = 1 << 30) -> float:
    """Copy bandwidth in bytes/s (bytes read plus written): the memory roofline.

    On a GPU: a device-to-device copy of ``nbytes``, median of triton's do_bench. On the
    CPU (smoke tests only): a smaller memcpy timed by wall clock.
    """
    if not torch.cuda.is_available():
        nbytes = min(nbytes, 1 << 26)
        src = torch.ones(nbytes, dtype=torch.uint8)
        dst = torch.empty_like(src)
        _, seconds = timed(lambda: [dst.copy_(src) for _ in range(5)])
        return 2 * nbytes * 5 / seconds
    import triton.testing

    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = float(triton.testing.do_bench(lambda: dst.copy_(src), return_mode="median"))
    return 2 * nbytes / (ms * 1e-3)


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` as indented JSON, creating the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


def top2(position: dict) -> list[tuple[int, float]]:
    """The two most likely tokens of one logprobs row (``{token: Logprob}``), as
    ``[(token, logprob), ...]``, most likely first."""
    ranked = sorted(position.items(), key=lambda kv: -kv[1].logprob)[:2]
    return [(tok, lp.logprob) for tok, lp in ranked]


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where two token sequences differ (None: one is a prefix of the
    other, or they are equal)."""
    return next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None)


def compare_greedy(ref: list, other: list, labels: tuple[str, str]) -> dict[str, Any]:
    """Count identical greedy sequences and explain each first divergence by its top-2
    margin.

    ``ref`` and ``other`` are completions (``token_ids`` and ``logprobs`` with at least
    the top 2 per position) of the same prompts under two configurations named by
    ``labels`` (e.g. ``("tp1", "tpn")``). Both logprobs at a position share one
    normalizer, so their gap is the logit gap: a divergence where the reference's gap
    is a rounding error's size is a near-tie that batch-shape or reduction-order float
    noise can flip; a large gap would be a real error.
    """
    a_name, b_name = labels
    divergences = []
    for i, (a, b) in enumerate(zip(ref, other)):
        k = first_divergence(a.token_ids, b.token_ids)
        if k is None:
            continue
        top_a, top_b = top2(a.logprobs[k]), top2(b.logprobs[k])
        divergences.append(
            {
                "prompt": i,
                "position": k,
                f"{a_name}_top2": top_a,
                f"{b_name}_top2": top_b,
                f"{a_name}_margin": top_a[0][1] - top_a[1][1],
                f"{b_name}_margin": top_b[0][1] - top_b[1][1],
            }
        )
    margins = [d[f"{a_name}_margin"] for d in divergences]
    return {
        "num_prompts": len(ref),
        "num_identical": len(ref) - len(divergences),
        f"max_{a_name}_margin": max(margins, default=None),
        "divergences": divergences,
    }
