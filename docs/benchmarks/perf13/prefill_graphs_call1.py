"""A/B of prompt steps through prefill graphs up to the full token budget: run
`bench throughput` with MAX_PREFILL_CAPTURE_SIZE set (argv[1] tokens; 2048 = the default
of 8a2775c) before the engine is built; writes start-up time, CUDA memory and the graph
sizes to argv[2].
Usage: python3 prefill_graphs.py 16384 SIDE.json -- <bench throughput args>"""
import json, sys, time
import torch
import minivllm.worker.cuda_graph as cg
import minivllm.benchmarks.throughput as tp
cg.MAX_PREFILL_CAPTURE_SIZE = int(sys.argv[1])
side = {"max_prefill_capture_size": cg.MAX_PREFILL_CAPTURE_SIZE}
build = tp.build_llm

def timed_build(*a, **k):
    t = time.perf_counter()
    llm = build(*a, **k)
    side["startup_s"] = time.perf_counter() - t
    side["memory_reserved_gib"] = torch.cuda.memory_reserved() / 2**30
    side["memory_allocated_gib"] = torch.cuda.memory_allocated() / 2**30
    side["device_used_gib"] = (lambda f, t: (t - f) / 2**30)(*torch.cuda.mem_get_info())
    def info(runner):
        g = runner.cuda_graph_runner
        return {"prefill_sizes": g.prefill_capture_sizes, "num_graphs": len(g.graphs)}
    side.update(llm.collective_rpc(info)[0])
    return llm

tp.build_llm = timed_build
from minivllm.cli import main
try:
    main(["bench", "throughput", *sys.argv[4:]])
finally:
    json.dump(side, open(sys.argv[2], "w"), indent=1)
