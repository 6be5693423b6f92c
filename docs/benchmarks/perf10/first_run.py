"""Cold process: where does the first timed run's extra host time go? Minor page faults,
context switches and the eager prompt steps' launch time, first run vs second."""
import argparse, json, os, resource, sys, tempfile, time
os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-cold-")
from minivllm.benchmarks.throughput import add_throughput_args, build_llm, checkpoint_path, generate_workload
from minivllm.benchmarks.workloads import throughput_workload

p = argparse.ArgumentParser(); add_throughput_args(p); args = p.parse_args([])
path = checkpoint_path(args)
t0 = time.perf_counter(); llm = build_llm(args, path); startup = time.perf_counter() - t0
wl = throughput_workload()
core = llm.llm_engine.engine_core.engine_core
steps = []
inner = core.model_executor.execute_model_async
def timed_exec(so):
    t = time.perf_counter(); r0 = resource.getrusage(resource.RUSAGE_SELF)
    try: return inner(so)
    finally:
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        steps.append((so.total_num_scheduled_tokens, time.perf_counter() - t, r1.ru_minflt - r0.ru_minflt))
core.model_executor.execute_model_async = timed_exec
out = {"startup_s": startup}
for run in ("first", "second", "third"):
    steps.clear()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    s = generate_workload(llm, wl, 0.6)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    big = [x for x in steps if x[0] > 1000]
    out[run] = {"seconds": s, "minflt": r1.ru_minflt - r0.ru_minflt, "majflt": r1.ru_majflt - r0.ru_majflt,
                "nvcsw": r1.ru_nvcsw - r0.ru_nvcsw, "nivcsw": r1.ru_nivcsw - r0.ru_nivcsw,
                "user_s": r1.ru_utime - r0.ru_utime, "sys_s": r1.ru_stime - r0.ru_stime,
                "prompt_steps_launch_ms": [round(x[1] * 1e3, 1) for x in big],
                "prompt_steps_minflt": [x[2] for x in big],
                "decode_launch_s": sum(x[1] for x in steps if x[0] <= 1000),
                "decode_minflt": sum(x[2] for x in steps if x[0] <= 1000)}
    print(run, json.dumps(out[run]), flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
