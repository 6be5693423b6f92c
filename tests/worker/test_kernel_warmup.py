"""Nothing compiles mid-run: after ``LLM(...)`` is ready, a workload of every batch shape
the engine meets adds no kernel to Triton's cache.

Run in a subprocess with an empty ``TRITON_CACHE_DIR``, so every compilation leaves a
directory there, and counted before and after the workload.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch

from tests.tiny_models import make_tiny_model

SCRIPT = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from minivllm import LLM, SamplingParams

    def entries():
        return sorted(p.name for p in Path(os.environ["TRITON_CACHE_DIR"]).iterdir())

    llm = LLM(sys.argv[1], dtype="bfloat16", max_model_len=4096, max_num_seqs=64,
              max_num_batched_tokens=1024, attention_backend="triton",
              enforce_eager=sys.argv[2] == "eager")
    ready = entries()
    # Every shape class: 1 to 900-token prompts (odd and even counts, chunked beyond
    # the budget), batches of 1 to 64, long contexts (split-KV), greedy and sampled.
    lens = [1, 2, 3, 16, 17, 31, 32, 33, 100, 127, 500, 900, 2100, 3900]
    prompts = [{"prompt_token_ids": [(5 + 7 * i + n) % 500 for i in range(n)]} for n in lens]
    params = SamplingParams(temperature=0.6, max_tokens=40, ignore_eos=True, seed=1)
    for batch in (1, 3, len(prompts)):
        llm.generate(prompts[:batch], params, use_tqdm=False)
        llm.generate(prompts[-batch:], SamplingParams(max_tokens=8, ignore_eos=True),
                     use_tqdm=False)
    many = [{"prompt_token_ids": [(3 * i + j) % 500 for i in range(20 + j)]} for j in range(64)]
    llm.generate(many, SamplingParams(temperature=0.0, max_tokens=150, ignore_eos=True),
                 use_tqdm=False)
    after = entries()
    print("READY", len(ready), "AFTER", len(after))
    new = [n for n in after if n not in ready]
    root = Path(os.environ["TRITON_CACHE_DIR"])
    print("NEW", sorted(f.stem for n in new for f in (root / n).glob("*.json")))
    """
)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["graphs", "eager"])
def test_no_kernel_compiles_after_startup(tmp_path, mode: str) -> None:
    model = make_tiny_model("qwen3", tmp_path / "model", max_position_embeddings=4096)
    cache = tmp_path / "triton-cache"
    cache.mkdir()
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache)}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(model), mode],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("READY"))
    _, ready, _, after = line.split()
    assert int(ready) > 0
    assert ready == after, proc.stdout[-2000:]


def test_kv_cache_write_variant_warms_up_without_storing(tmp_path, monkeypatch) -> None:
    """With ``enforce_eager`` nothing is captured, so the warm-up itself launches the q/k
    kernel's cache-writing variant: once, through the layer's own op, to the padding slot,
    which leaves every cache byte as it was. (Whether it compiles the same variant a step
    launches is what the GPU test above checks.)"""
    from minivllm import LLM
    from minivllm.model_executor.custom_op import CustomOp
    from minivllm.model_executor.layers import triton_qk_norm_rope
    from minivllm.worker.kernel_warmup import warm_up_kv_cache_write

    calls = []
    real = triton_qk_norm_rope.qk_norm_rope_kv_cache

    def spy(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(triton_qk_norm_rope, "qk_norm_rope_kv_cache", spy)
    path = make_tiny_model("qwen3", tmp_path / "model")
    # Without a GPU the Triton kernels run in the interpreter (tests/conftest.py sets it).
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for backend, launches in (("triton", 1), ("torch", 0)):
        # A small pool: the check below copies a pattern the size of the whole cache.
        llm = LLM(str(path), dtype="float32", device=device, max_model_len=64, num_kv_blocks=8,
                  attention_backend=backend, enforce_eager=True)  # fmt: skip

        def warm(runner):
            caches = [c for pair in runner.kv_caches for c in pair]
            for c in caches:  # a known pattern: the pool is allocated uninitialised
                c.copy_(torch.arange(c.numel(), dtype=c.dtype).view_as(c))
            before = [c.clone() for c in caches]
            with CustomOp.force("cuda"):
                count = warm_up_kv_cache_write(runner.model)
            return count, all(torch.equal(a, b) for a, b in zip(before, caches))

        calls.clear()
        assert llm.collective_rpc(warm) == [(launches, True)]
        assert len(calls) == launches
        if launches:
            slots = calls[0][-1]
            assert slots.tolist() == [-1] and slots.dtype == torch.long


def _logits_runner(max_num_seqs: int, k: int | None, seen: list[int]) -> SimpleNamespace:
    """A stand-in runner whose model records the row count of each LM-head call."""

    class Model:
        def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
            seen.append(hidden.shape[0])
            return torch.zeros(hidden.shape[0], 11)

    spec = None if k is None else SimpleNamespace(num_speculative_tokens=k)
    return SimpleNamespace(
        model=Model(), device=torch.device("cpu"),
        model_config=SimpleNamespace(dtype=torch.float32, hf_config=SimpleNamespace(hidden_size=8)),
        scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs),
        vllm_config=SimpleNamespace(speculative_config=spec),
    )  # fmt: skip


@pytest.mark.parametrize(("k", "rows"), [(None, 5), (2, 15)])
def test_lm_head_warms_up_at_every_row_count_a_step_samples(k, rows) -> None:
    """cuBLAS picks the LM head's kernel per row count, and its first GEMM of a new count
    costs milliseconds: every count a step can sample (``max_num_seqs``, times ``1 + k``
    when drafts are verified) runs once at start-up."""
    from minivllm.worker.kernel_warmup import warm_up_logits

    seen: list[int] = []
    assert warm_up_logits(_logits_runner(5, k, seen)) == rows
    assert seen == list(range(1, rows + 1))


def test_lm_head_warm_up_runs_on_a_real_model(tmp_path) -> None:
    from minivllm import LLM
    from minivllm.worker.kernel_warmup import warm_up_logits

    path = make_tiny_model("qwen3", tmp_path / "model")
    llm = LLM(str(path), dtype="float32", device="cpu", max_model_len=64, max_num_seqs=3,
              enforce_eager=True)  # fmt: skip
    assert llm.collective_rpc(warm_up_logits) == [3]
