"""The fold of q/k norm + RoPE + cache write into decode attention, side by side: the
throughput workload in one process with MINIVLLM_FOLD_QK_NORM_ROPE=1 (decode steps attend
from the raw q/k) or 0 (the q/k-norm kernel runs before attention at every step), the same
code otherwise; alternating processes. Three runs per process; the first is a warm-up."""
import json, os, sys, time

out, side = sys.argv[1], sys.argv[2]
os.environ["MINIVLLM_FOLD_QK_NORM_ROPE"] = "1" if side == "fold" else "0"
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
print(side, "seconds", [round(s, 3) for s in runs], "startup", round(startup, 1), flush=True)
json.dump(res, open(out, "w"), indent=1)
