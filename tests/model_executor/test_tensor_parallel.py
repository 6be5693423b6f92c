"""Tensor-parallel layers under real collectives: two CPU processes over gloo.

The layer tests simulate ranks in one process; this test runs the whole model split over
two processes with ``torch.distributed`` so the all-reduce (row-parallel layers,
embedding) and all-gather (logits) really happen. The checkpoint has one KV head (so it
is replicated on both ranks), tied embeddings and an odd vocabulary (so the vocabulary
is padded), and the logits must still equal Hugging Face's.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file

from tests.tiny_models import load_hf_model, make_tiny_model

PROMPTS = [[3, 5, 7, 9, 11, 400], [100, 200, 300]]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: int, path: str, port: int, out: str) -> None:
    import transformers

    from minivllm.config import ModelConfig
    from minivllm.model_executor.loader import get_model
    from tests.model_executor.paged_forward import PagedForward

    # One intra-op thread per rank: two ranks share the CI machine's two cores.
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        hf_config = transformers.AutoConfig.from_pretrained(path)
        config = ModelConfig(model=path, hf_config=hf_config, dtype=torch.float32, max_model_len=64)
        model = get_model(config, torch.device("cpu"))
        qkv = model.model.layers[0].self_attn.qkv_proj
        assert (qkv.num_heads, qkv.num_kv_heads, qkv.num_kv_head_replicas) == (2, 1, 2)
        logits = PagedForward(model, num_seqs=len(PROMPTS)).step(PROMPTS)
        save_file({"logits": logits.contiguous()}, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


def test_two_ranks_match_hf(tmp_path: Path):
    path = make_tiny_model(
        "llama",
        tmp_path / "ckpt",
        num_key_value_heads=1,
        tie_word_embeddings=True,
        vocab_size=509,
    )
    out = str(tmp_path / "logits")
    # fork, not spawn: the children inherit the imported modules instead of re-importing
    # torch and transformers (safe here: no CUDA context exists on this path).
    mp.start_processes(
        _rank_main, args=(2, str(path), _free_port(), out), nprocs=2, start_method="fork"
    )
    hf_model = load_hf_model(path)
    with torch.no_grad():
        expected = torch.cat([hf_model(torch.tensor([p])).logits[0] for p in PROMPTS])
    for rank in range(2):
        logits = load_file(f"{out}.{rank}")["logits"]
        torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)
