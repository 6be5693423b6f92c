"""Residency per SM of the decode attention kernel the throughput run's decode graphs use
(the ordered decode family), from the compiled kernel's registers and shared memory.
Usage: python3 occupancy.py OUT.json (after building the LLM so the variants are compiled)."""
import argparse, json, sys
import torch
from minivllm.benchmarks.throughput import add_throughput_args, build_llm, checkpoint_path
from minivllm.attention.triton_unified_attention import kernel_unified_attention

p = argparse.ArgumentParser(); add_throughput_args(p); args = p.parse_args([])
llm = build_llm(args, checkpoint_path(args))
props = torch.cuda.get_device_properties(0)
rows = []
for dev_cache in kernel_unified_attention.device_caches.values():
    cache = dev_cache[0] if isinstance(dev_cache, tuple) else dev_cache
    for key, k in cache.items():
        if getattr(k, "n_regs", None) is None:
            k._init_handles()
        md = k.metadata
        threads = md.num_warps * 32
        regs = k.n_regs
        # registers go to warps in units of 256; each block also reserves 1 KiB of shared
        per_warp = -(-regs * 32 // 256) * 256
        by_regs = (65536 // per_warp) // md.num_warps
        by_smem = props.shared_memory_per_multiprocessor // (md.shared + 1024)
        by_threads = 2048 // threads
        rows.append({"key": str(key), "num_warps": md.num_warps, "num_stages": md.num_stages,
                     "n_regs": regs, "n_spills": k.n_spills, "shared": md.shared,
                     "resident_per_sm": min(by_regs, by_smem, by_threads, 32),
                     "limits": {"regs": by_regs, "smem": by_smem, "threads": by_threads}})
out = {"sms": props.multi_processor_count, "smem_per_sm": props.shared_memory_per_multiprocessor,
       "variants": rows}
json.dump(out, open(sys.argv[1], "w"), indent=1)
for r in rows:
    print(r["key"][-200:], r["num_warps"], r["num_stages"], r["n_regs"], r["shared"], r["resident_per_sm"], r["limits"])
