"""Hugging Face transformers as the peer engine, on the same weights and requests.

Two ways transformers can run a batch: ``generate`` on padded static batches (each
batch runs until its longest request is done), and ``generate_batch``-style continuous
batching (its paged-attention manager, one request per prompt with its own length).
Only the tokens each request asked for are counted.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from minivllm.benchmarks.common import cuda_sync
from minivllm.benchmarks.workloads import Workload


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_hf(path: str, dtype: torch.dtype = torch.bfloat16, attn: str = "sdpa") -> Any:
    """The checkpoint in transformers, on the GPU when there is one."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=dtype, attn_implementation=attn
    )
    return model.to(_device()).eval()


@torch.inference_mode()
def run_hf_generate(model: Any, workload: Workload, batch_size: int = 64) -> dict[str, Any]:
    """Padded static batches of ``batch_size`` (left padding), greedy, EOS ignored."""
    cuda_sync()
    start = time.perf_counter()
    for b in range(0, len(workload.prompts), batch_size):
        prompts = workload.prompts[b : b + batch_size]
        lens = workload.output_lens[b : b + batch_size]
        width = max(len(p) for p in prompts)
        ids = torch.zeros(len(prompts), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        model.generate(
            ids.to(_device()), attention_mask=mask.to(_device()), max_new_tokens=max(lens),
            min_new_tokens=max(lens), do_sample=False, pad_token_id=0,
        )
    cuda_sync()
    seconds = time.perf_counter() - start
    return {"engine": "hf_generate", "batch_size": batch_size, "seconds": seconds,
            "output_tokens_per_s": workload.num_output_tokens / seconds}


def run_hf_continuous(model: Any, workload: Workload) -> dict[str, Any]:
    """transformers' continuous batching (``generate_batch``'s manager), per-request
    output lengths, greedy, EOS ignored.

    Not under ``inference_mode``: the manager runs the model on its own thread and
    updates its static tensors in place, which inference tensors forbid. Each result is
    checked for the number of tokens asked, so a failed request cannot pass as fast.
    """
    from transformers import GenerationConfig

    gen_cfg = GenerationConfig(
        max_new_tokens=max(workload.output_lens), do_sample=False,
        eos_token_id=-1, pad_token_id=0,
    )
    cuda_sync()
    start = time.perf_counter()
    produced = 0
    done = 0
    with model.continuous_batching_context_manager(generation_config=gen_cfg, block=True) as mgr:
        for p, n in zip(workload.prompts, workload.output_lens):
            mgr.add_request(p, max_new_tokens=n)
        while done < len(workload.prompts):
            result = mgr.get_result(timeout=1)
            if result is not None and result.is_finished():
                done += 1
                produced += len(result.generated_tokens)
            elif result is None and not mgr.is_running():
                raise RuntimeError("transformers' continuous batching stopped early")
    if produced != workload.num_output_tokens:
        raise RuntimeError(
            f"transformers produced {produced} tokens, expected {workload.num_output_tokens}"
        )
    cuda_sync()
    seconds = time.perf_counter() - start
    return {"engine": "hf_generate_batch", "seconds": seconds,
            "output_tokens_per_s": workload.num_output_tokens / seconds}
