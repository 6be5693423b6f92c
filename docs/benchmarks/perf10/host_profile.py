"""Where the host's time goes in a real throughput run (H200): phase timers, then cProfile."""
import argparse, collections, cProfile, io, json, pstats, sys, time
from minivllm.benchmarks.throughput import add_throughput_args, build_llm, checkpoint_path, generate_workload
from minivllm.benchmarks.workloads import throughput_workload

p = argparse.ArgumentParser(); add_throughput_args(p); args = p.parse_args([])
llm = build_llm(args, checkpoint_path(args))
wl = throughput_workload()
t = generate_workload(llm, wl, 0.6); print("warm run", t, flush=True)
engine = llm.llm_engine
core = engine.engine_core.engine_core
r = core.model_executor
for attr in ("driver_worker", "worker"):
    r = getattr(r, attr, r)
r = getattr(r, "model_runner", r)
tot = collections.defaultdict(float); cnt = collections.Counter()
def wrap(obj, name, key):
    inner = getattr(obj, name)
    def w(*a, **k):
        t0 = time.perf_counter()
        try: return inner(*a, **k)
        finally:
            tot[key] += time.perf_counter() - t0; cnt[key] += 1
    setattr(obj, name, w)
wrap(core.scheduler, "schedule", "schedule")
wrap(core.scheduler, "update_from_output", "update_from_output")
wrap(core, "_process_step", "_process_step (incl. get_output wait, update)")
wrap(core.scheduler, "make_stats", "make_stats")
wrap(engine.output_processor, "process_outputs", "process_outputs")
wrap(core.model_executor, "execute_model_async", "execute_model_async")
wrap(r, "_prepare_inputs", "  prepare_inputs")
wrap(r, "_forward", "  forward (graph replay)")
wrap(r, "sampler", "  sampler")
wrap(r, "_sampling_metadata", "  sampling_metadata")
wrap(r.model, "compute_logits", "  compute_logits")
import minivllm.worker.model_runner as mr
AO = None
for name in dir(mr):
    if name == "AsyncOutput": AO = getattr(mr, name)
inner_get = AO.get_output
def get_output(self):
    t0 = time.perf_counter()
    try: return inner_get(self)
    finally:
        tot["AsyncOutput.get_output (wait + tolist)"] += time.perf_counter() - t0; cnt["AsyncOutput.get_output (wait + tolist)"] += 1
AO.get_output = get_output
t = generate_workload(llm, wl, 0.6)
lines = [f"timed run with phase timers: {t:.3f} s"]
for k, v in sorted(tot.items(), key=lambda x: -x[1]):
    lines.append(f"{k:50s} {v:7.3f} s  {cnt[k]:6d} calls  {v / max(cnt[k], 1) * 1e3:.3f} ms/call")
print("\n".join(lines), flush=True)
pr = cProfile.Profile()
pr.enable(); t = generate_workload(llm, wl, 0.6); pr.disable()
s = io.StringIO(); st = pstats.Stats(pr, stream=s)
st.sort_stats("tottime").print_stats(60); st.sort_stats("cumtime").print_stats(60)
out = f"profiled run {t:.3f} s\n" + s.getvalue()
open(sys.argv[1], "w").write("\n".join(lines) + "\n\n" + out)
print(out[:6000])
