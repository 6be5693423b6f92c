"""The soak test through ``minivllm serve``, short: ~100 random requests streamed
concurrently by the official ``openai`` client, a fifth of them disconnecting at a random
point (``minivllm bench soak --engine server`` runs the long one).

The server must stay healthy, end with an empty KV pool and queue, count in
``/metrics`` the finishes its clients saw, and send every finished request the same text
and finish reason as a reference run of it (greedy near-ties allowed, counted).
"""

from __future__ import annotations

import argparse
import asyncio

import httpx
import pytest

from minivllm.benchmarks import soak
from minivllm.benchmarks.soak_server import soak_server
from minivllm.benchmarks.soak_workload import make_workload
from minivllm.demo import demo_model_path
from tests.entrypoints.openai.server_process import ENGINE_ARGS, RemoteOpenAIServer

# 16 blocks hold one full-length request (max_model_len 256): 24 make a busy batch preempt.
NUM_KV_BLOCKS = 24


@pytest.fixture(scope="module")
def server():
    extra = [
        "--num-kv-blocks",
        str(NUM_KV_BLOCKS),
        "--max-num-seqs",
        "16",
        "--max-num-batched-tokens",
        "64",
        "--served-model-name",
        "soak",
    ]
    with RemoteOpenAIServer(extra) as srv:
        yield srv


def soak_args(**overrides) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    soak.add_soak_args(parser)
    args = parser.parse_args([])
    settings = dict(
        model=str(demo_model_path()),
        device="cpu",
        engine="server",
        num_requests=100,
        abort_rate=0.2,
        max_model_len=ENGINE_ARGS["max_model_len"],
        num_kv_blocks=NUM_KV_BLOCKS,
    )
    for key, value in {**settings, **overrides}.items():
        setattr(args, key, value)
    return args


def test_server_soak(server) -> None:
    args = soak_args()
    ref_engine = soak.reference_engine(args.model, args)
    try:
        shape = soak.workload_shape(ref_engine.tokenizer, 4096, args)
        workload = make_workload(args.num_requests, 1, shape)
        result = asyncio.run(soak_server(server.url, workload, NUM_KV_BLOCKS, max_in_flight=32))
        checks = soak.check_against_reference(workload, result, ref_engine, args)
    finally:
        ref_engine.shutdown()
    out = soak.summarize(args, workload, result, checks)
    c = out["counts"]
    assert c["errors"] == 0, (out["error_examples"], server.logs()[-3000:])
    assert c["mismatches"] == 0, out["mismatch_examples"]
    assert c["leaked_blocks"] == 0 and c["unfinished_at_end"] == 0
    assert all(result.server["checks"].values()), result.server
    assert out["passed"]
    # What the run was for: disconnects, finishes, preemption, prefix hits.
    assert c["aborted"] > 0 and c["finished"] > c["requests"] // 2
    assert c["compared"] > c["finished"] * 0.8
    assert c["preemptions"] > 0 and c["prefix_cache_hit_tokens"] > 0
    # Still serving after all that.
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200
