"""Python's garbage collector during LLM.generate, side by side: "auto" (this code: heap frozen,
collections when the allocation counts say), "off" (no collection at all during generate: the
upper bound of what moving them can win) and "deferred" (automatic collection off during
generate; the collections the thresholds call for run at the start of each step's wait for
the GPU, AsyncOutput._resolve, while the next step is already queued). The throughput
workload at temperature 0.6, three runs per process (the first a warm-up); every collection
logged with its generation, duration and time. Usage: python3 gc_ab.py OUT.json VARIANT"""
import contextlib, gc, json, sys, time
out, variant = sys.argv[1], sys.argv[2]
import argparse
import minivllm.llm as llm_mod
import minivllm.worker.async_utils as au
from minivllm.benchmarks.common import environment
from minivllm.benchmarks.throughput import (add_throughput_args, build_llm, checkpoint_path,
                                            generate_workload, SAMPLED_TEMPERATURE)
from minivllm.benchmarks.workloads import throughput_workload

frozen = llm_mod.frozen_gc_heap


@contextlib.contextmanager
def frozen_and_disabled():
    with frozen():
        gc.disable()
        try:
            yield
        finally:
            gc.enable()


def collect_due():
    t0, t1, t2 = gc.get_threshold()
    c0, c1, c2 = gc.get_count()
    if c0 < t0:
        return
    gc.collect(2 if c2 >= t2 - 1 and c1 >= t1 - 1 else 1 if c1 >= t1 - 1 else 0)


if variant in ("off", "deferred"):
    llm_mod.frozen_gc_heap = frozen_and_disabled
if variant == "deferred":
    resolve = au.AsyncOutput._resolve
    def _resolve(self):
        collect_due()
        return resolve(self)
    au.AsyncOutput._resolve = _resolve

events, start = [], [0.0]
def cb(phase, info):
    if phase == "start":
        start[0] = time.perf_counter()
    else:
        now = time.perf_counter()
        events.append((info["generation"], (now - start[0]) * 1e3, now))
gc.callbacks.append(cb)

p = argparse.ArgumentParser(); add_throughput_args(p); args = p.parse_args(sys.argv[3:])
t0 = time.perf_counter()
llm = build_llm(args, checkpoint_path(args))
startup = time.perf_counter() - t0
wl = throughput_workload()
runs = []
for i in range(3):
    events.clear()
    t = time.perf_counter()
    s = generate_workload(llm, wl, SAMPLED_TEMPERATURE)
    ev = [(g, round(ms, 3), round(w - t, 3)) for g, ms, w in events]
    by = {g: [e[1] for e in ev if e[0] == g] for g in (0, 1, 2)}
    runs.append({"seconds": s, "gc_ms": sum(e[1] for e in ev),
                 "collections": [len(by[g]) for g in (0, 1, 2)],
                 "ms_by_generation": [round(sum(by[g]), 2) for g in (0, 1, 2)],
                 "max_ms_by_generation": [max(by[g], default=0) for g in (0, 1, 2)],
                 "longest": sorted(ev, key=lambda e: -e[1])[:8]})
    print(variant, i, "%.3f s" % s, "gc %.1f ms" % runs[-1]["gc_ms"], runs[-1]["collections"],
          runs[-1]["max_ms_by_generation"], flush=True)
res = {**environment(), "variant": variant, "startup_s": startup, "runs": runs,
       "output_tokens": wl.num_output_tokens}
json.dump(res, open(out, "w"), indent=1)
