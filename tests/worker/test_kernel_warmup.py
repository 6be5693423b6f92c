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

import pytest

from tests.tiny_models import make_tiny_model

SCRIPT = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from minivllm import LLM, SamplingParams

    def entries():
        return sorted(p.name for p in Path(os.environ["TRITON_CACHE_DIR"]).iterdir())

    llm = LLM(sys.argv[1], dtype="bfloat16", max_model_len=4096, max_num_seqs=64,
              max_num_batched_tokens=1024, attention_backend="triton")
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
def test_no_kernel_compiles_after_startup(tmp_path) -> None:
    model = make_tiny_model("qwen3", tmp_path / "model", max_position_embeddings=4096)
    cache = tmp_path / "triton-cache"
    cache.mkdir()
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache)}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(model)],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("READY"))
    _, ready, _, after = line.split()
    assert int(ready) > 0
    assert ready == after, proc.stdout[-2000:]
