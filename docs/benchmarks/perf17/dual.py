"""Hypothesis check: a decode step's forward pass as two half batches on two streams inside
one CUDA graph (the halves' latency-bound GEMMs and small kernels can run beside the other
half's bandwidth-bound attention) against the engine's one-stream graph, at fixed batch
sizes with ragged contexts. Also the two halves on one stream (the cost of the split alone).
Usage: python3 dual.py OUT.json"""
import argparse, json, sys, time
import numpy as np
import torch
import minivllm.attention.triton_launch_config as lc
from minivllm.benchmarks.common import environment
from minivllm.benchmarks.throughput import add_throughput_args, build_llm, checkpoint_path
from minivllm.forward_context import AttentionMetadata, set_forward_context

p = argparse.ArgumentParser(); add_throughput_args(p); args = p.parse_args([])
llm = build_llm(args, checkpoint_path(args))


def probe(runner):
    g = runner.cuda_graph_runner
    model = g.model
    dev = g.output.device
    k0 = runner.kv_caches[0][0]
    num_blocks, block_size = k0.shape[0], k0.shape[1]
    maxb = g.block_table.shape[1]
    rng = np.random.default_rng(0)
    out = {"num_blocks": num_blocks, "block_size": block_size, "sizes": {}}

    def fill(n, lens):
        g.block_table[:n].copy_(torch.arange(n * maxb, device=dev, dtype=torch.int32).view(n, maxb) % num_blocks)
        g.seq_lens[:n].copy_(torch.tensor(lens, dtype=torch.int32))
        g.slot_mapping.fill_(-1)
        g.input_ids[:n].copy_(torch.randint(0, 1000, (n,)))
        g.positions[:n].copy_(torch.tensor(lens, dtype=torch.long) - 1)
        g.query_start_loc.copy_(g._arange)
        order = np.argsort(-np.array(lens), kind="stable")
        g.seq_order[:n].copy_(torch.tensor(order))

    def meta(sl, qsl, order):
        return AttentionMetadata(slot_mapping=g.slot_mapping[sl], block_table=g.block_table[sl],
                                 seq_lens=g.seq_lens[sl], query_start_loc=qsl,
                                 max_query_len=1, max_seq_len=g.max_model_len, launch_order=order)

    def capture_split(n, lens, two_streams):
        h = n // 2
        la, lb = np.array(lens[:h]), np.array(lens[h:n])
        oa = torch.tensor(np.argsort(-la, kind="stable"), device=dev)
        ob = torch.tensor(np.argsort(-lb, kind="stable"), device=dev)
        ma = meta(slice(0, h), g._arange[: h + 1], oa)
        mb = meta(slice(h, n), g._arange[: n - h + 1], ob)
        sa, sb = torch.cuda.Stream(), torch.cuda.Stream()
        if not two_streams:
            sb = sa

        def body():
            cur = torch.cuda.current_stream()
            sa.wait_stream(cur); sb.wait_stream(cur)
            with torch.cuda.stream(sa), set_forward_context(ma):
                g.output[:h] = model(g.input_ids[:h], g.positions[:h])
            with torch.cuda.stream(sb), set_forward_context(mb):
                g.output[h:n] = model(g.input_ids[h:n], g.positions[h:n])
            cur.wait_stream(sa); cur.wait_stream(sb)

        saved = lc.FUSED_MERGE_MAX_SEGMENTS
        lc.FUSED_MERGE_MAX_SEGMENTS = 1  # the halves run at once: no shared ticket counters
        try:
            body(); torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                body()
        finally:
            lc.FUSED_MERGE_MAX_SEGMENTS = saved
        return graph, (sa, sb, oa, ob, ma, mb)

    def timeit(graph, reps=40):
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(reps):
            graph.replay()
        e1.record(); torch.cuda.synchronize()
        return e0.elapsed_time(e1) / reps

    with torch.inference_mode():
        for n in [256, 224, 192, 160, 128, 96, 64, 32]:
            for dist in ["uniform_100_2048", "uniform_100_1024"]:
                hi = 2048 if dist.endswith("2048") else 1024
                lens = rng.integers(100, hi + 1, n).tolist()
                fill(n, lens)
                single = g.graphs[("decode", n)]
                single.replay(); torch.cuda.synchronize()
                ref = g.output[:n].float().clone()
                dual, keep = capture_split(n, lens, True)
                dual.replay(); torch.cuda.synchronize()
                diff_dual = (g.output[:n].float() - ref).abs().max().item()
                serial, keep2 = capture_split(n, lens, False)
                serial.replay(); torch.cuda.synchronize()
                diff_serial = (g.output[:n].float() - ref).abs().max().item()
                t = {"single": [], "dual": [], "split_one_stream": []}
                for _ in range(4):
                    t["single"].append(timeit(single))
                    t["dual"].append(timeit(dual))
                    t["split_one_stream"].append(timeit(serial))
                r = {k: float(np.median(v)) for k, v in t.items()}
                r.update(raw_ms=t, max_abs_diff_dual=diff_dual, max_abs_diff_serial=diff_serial,
                         ref_abs_max=ref.abs().max().item(), context_tokens=int(sum(lens)),
                         dual_over_single=r["dual"] / r["single"],
                         serial_over_single=r["split_one_stream"] / r["single"])
                out["sizes"][f"{n}/{dist}"] = r
                print(n, dist, {k: round(v, 4) for k, v in r.items() if not isinstance(v, dict)}, flush=True)
                del dual, serial, keep, keep2
                torch.cuda.synchronize()
    return out


res = {**environment(), "command": " ".join(sys.argv), **llm.collective_rpc(probe)[0]}
json.dump(res, open(sys.argv[1], "w"), indent=1)
