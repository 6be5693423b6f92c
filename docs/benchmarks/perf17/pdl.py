"""Programmatic dependent launch of the attention kernel (MINIVLLM_ATTENTION_PDL 0 / 1 / 2):
decode graphs captured in each mode, replayed on the same ragged batch, timed in turns;
the outputs compared bit for bit (PDL changes when a program starts, never what it
computes: a difference would mean a program read the query before the q/k kernel had
written it). Also one eager forward pass per mode. Usage: python3 pdl.py OUT.json"""
import argparse, json, sys
import numpy as np
import torch
import minivllm.attention.triton_launch_config as lc
from minivllm.benchmarks.common import environment
from minivllm.benchmarks.throughput import add_throughput_args, build_llm, checkpoint_path
from minivllm.forward_context import set_forward_context

p = argparse.ArgumentParser(); add_throughput_args(p); args = p.parse_args([])
llm = build_llm(args, checkpoint_path(args))
MODES = ("0", "1", "2")


def probe(runner):
    g = runner.cuda_graph_runner
    dev = g.output.device
    k0 = runner.kv_caches[0][0]
    num_blocks = k0.shape[0]
    maxb = g.block_table.shape[1]
    rng = np.random.default_rng(1)
    out = {"sizes": {}}

    def fill(n, lens):
        g.block_table[:n].copy_(torch.arange(n * maxb, device=dev, dtype=torch.int32).view(n, maxb) % num_blocks)
        g.seq_lens[:n].copy_(torch.tensor(lens, dtype=torch.int32))
        g.slot_mapping.fill_(-1)
        g.input_ids[:n].copy_(torch.randint(0, 1000, (n,)))
        g.positions[:n].copy_(torch.tensor(lens, dtype=torch.long) - 1)
        g.query_start_loc.copy_(g._arange)
        g.seq_order[:n].copy_(torch.tensor(np.argsort(-np.array(lens), kind="stable")))

    def capture(n):
        # The capture batch: every sequence its own index in the launch order (a larger
        # batch's order, left in the buffer, would name sequences past this one).
        g.seq_order.copy_(torch.arange(g.seq_order.shape[0], device=dev))
        g._set_capture_layout("decode", n)
        g._forward("decode", n)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            g._forward("decode", n)
        return graph

    def timeit(graph, reps=50):
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(reps):
            graph.replay()
        e1.record(); torch.cuda.synchronize()
        return e0.elapsed_time(e1) / reps

    saved = lc.ATTENTION_PDL
    with torch.inference_mode():
        for n in [256, 128, 64, 16, 1]:
            lens = rng.integers(100, 2049, n).tolist()
            graphs = {}
            for mode in MODES:
                lc.ATTENTION_PDL = mode
                graphs[mode] = capture(n)
            lc.ATTENTION_PDL = saved
            fill(n, lens)
            outs, eager = {}, {}
            for mode in MODES:
                graphs[mode].replay(); torch.cuda.synchronize()
                outs[mode] = g.output[:n].clone()
                lc.ATTENTION_PDL = mode
                with set_forward_context(g._metadata("decode", n)):
                    eager[mode] = g.model(g.input_ids[:n], g.positions[:n]).clone()
                lc.ATTENTION_PDL = saved
            t = {m: [] for m in MODES}
            for _ in range(5):
                for m in MODES:
                    t[m].append(timeit(graphs[m]))
            r = {f"ms_mode{m}": float(np.median(v)) for m, v in t.items()}
            r["raw_ms"] = t
            r["graph_equal_to_mode0"] = {m: bool(torch.equal(outs[m], outs["0"])) for m in MODES}
            r["eager_equal_to_mode0"] = {m: bool(torch.equal(eager[m], eager["0"])) for m in MODES}
            r["graph_equal_eager_mode0"] = bool(torch.equal(outs["0"], eager["0"]))
            r["saved_us_mode1"] = 1e3 * (r["ms_mode0"] - r["ms_mode1"])
            r["saved_us_mode2"] = 1e3 * (r["ms_mode0"] - r["ms_mode2"])
            r["context_tokens"] = int(sum(lens))
            out["sizes"][str(n)] = r
            print(n, {k: v for k, v in r.items() if k != "raw_ms"}, flush=True)
            del graphs
    return out


res = {**environment(), "command": " ".join(sys.argv), **llm.collective_rpc(probe)[0]}
json.dump(res, open(sys.argv[1], "w"), indent=1)
