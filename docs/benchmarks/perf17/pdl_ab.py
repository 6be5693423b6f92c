"""The throughput workload at temperature 0.6 with MINIVLLM_ATTENTION_PDL=SIDE (0: off,
2: the default of this code), the same code otherwise; alternating fresh processes, three
runs each (the first a warm-up). Usage: python3 pdl_ab.py OUT.json SIDE"""
import json, os, sys, time
out, side = sys.argv[1], sys.argv[2]
os.environ["MINIVLLM_ATTENTION_PDL"] = side
import argparse
from minivllm.benchmarks.common import environment
from minivllm.benchmarks.throughput import (add_throughput_args, build_llm, checkpoint_path,
                                            generate_workload, SAMPLED_TEMPERATURE)
from minivllm.benchmarks.workloads import throughput_workload
p = argparse.ArgumentParser(); add_throughput_args(p); args = p.parse_args([])
t0 = time.perf_counter()
llm = build_llm(args, checkpoint_path(args))
startup = time.perf_counter() - t0
wl = throughput_workload()
runs = [generate_workload(llm, wl, SAMPLED_TEMPERATURE) for _ in range(3)]
res = {**environment(), "side": side, "startup_s": startup, "seconds": runs,
       "output_tokens": wl.num_output_tokens,
       "tok_s_timed": [wl.num_output_tokens / s for s in runs[1:]]}
print("pdl", side, "seconds", [round(s, 3) for s in runs], "startup", round(startup, 1), flush=True)
json.dump(res, open(out, "w"), indent=1)
