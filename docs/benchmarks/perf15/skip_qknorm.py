"""What the q/k-norm + rotary kernel costs a whole run: the throughput workload with it
(kept) and with it replaced by nothing (skipped), alternating processes. The skipped side
is numerically wrong (q and k unnormalised and unrotated, the KV cache never written: it
is zeroed first on both sides, so attention reads finite values), but the work is the
same: EOS is ignored and every request runs its fixed number of tokens. The difference
is the most that folding the kernel into attention could save."""
import json, sys, time
import torch

out, side = sys.argv[1], sys.argv[2]
if side == "skipped":
    from minivllm.model_executor.layers import triton_qk_norm_rope as t

    def nothing(positions, query, key, *rest):
        return query, key

    t.qk_norm_rope = nothing
    t.qk_norm_rope_kv_cache = nothing
import argparse
from minivllm.benchmarks.common import environment
from minivllm.benchmarks.throughput import (add_throughput_args, build_llm, checkpoint_path,
                                            generate_workload, SAMPLED_TEMPERATURE)
from minivllm.benchmarks.workloads import throughput_workload

p = argparse.ArgumentParser(); add_throughput_args(p); args = p.parse_args([])
t0 = time.perf_counter()
llm = build_llm(args, checkpoint_path(args))
startup = time.perf_counter() - t0
runner = llm.llm_engine.engine_core.engine_core.model_executor.model_runner
for k, v in runner.kv_caches:
    k.zero_(); v.zero_()
wl = throughput_workload()
runs = [generate_workload(llm, wl, SAMPLED_TEMPERATURE) for _ in range(3)]
res = {**environment(), "side": side, "startup_s": startup, "seconds": runs,
       "output_tokens": wl.num_output_tokens,
       "tok_s_timed": [wl.num_output_tokens / s for s in runs[1:]]}
print(side, "seconds", [round(s, 3) for s in runs], "startup", round(startup, 1), flush=True)
json.dump(res, open(out, "w"), indent=1)
