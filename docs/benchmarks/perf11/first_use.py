"""Cold process: which phase of a step pays the first run's extra host time?
mode plain: per-phase host time and page faults of each step, three runs.
mode warm: the same after an extra start-up warm-up (replay every captured graph once;
  one eager step of max_num_batched_tokens tokens over the real cache, writing no slot;
  the LM head + sampler at max_num_seqs rows).
mode prof: torch.profiler (CPU + CUDA runtime) around the first two prompt steps of
  run 1 and of run 2."""
import argparse, json, math, os, resource, sys, tempfile, time
os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-cold-")
import torch
from minivllm.benchmarks.throughput import add_throughput_args, build_llm, checkpoint_path, generate_workload
from minivllm.benchmarks.workloads import throughput_workload
from minivllm.forward_context import AttentionMetadata, set_forward_context

mode, outpath = sys.argv[1], sys.argv[2]
p = argparse.ArgumentParser(); add_throughput_args(p); args = p.parse_args([])
path = checkpoint_path(args)

def extra_warmup(runner):
    t0 = time.perf_counter()
    g = runner.cuda_graph_runner
    with torch.inference_mode():
        for key in g.graph_keys():
            g._set_capture_layout(*key); g.graphs[key].replay()
        g.query_start_loc.copy_(g._arange); g._query_start_loc_is_arange = True; g.seq_lens.fill_(1)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        n = runner.scheduler_config.max_num_batched_tokens
        L = min(runner.model_config.max_model_len, n)
        ns = math.ceil(n / L)
        dev = runner.device
        starts = [min(i * L, n) for i in range(ns + 1)]
        qsl = torch.tensor(starts, dtype=torch.int32, device=dev)
        sl = qsl[1:] - qsl[:-1]
        bt = torch.zeros(ns, g.block_table.shape[1], dtype=torch.int32, device=dev)
        meta = AttentionMetadata(torch.full((n,), -1, dtype=torch.long, device=dev), bt, sl, qsl, L, L)
        ids = torch.zeros(n, dtype=torch.long, device=dev)
        pos = torch.arange(n, device=dev) % L
        with set_forward_context(meta):
            hidden = runner.model(ids, pos)
        rows = runner.scheduler_config.max_num_seqs
        logits = runner.model.compute_logits(hidden[:rows])
        from minivllm.sample.gumbel import gumbel_sample
        gumbel_sample(logits, torch.full((rows,), 0.6, device=dev), 12345, None)
        torch.cuda.synchronize()
    print(f"extra warm-up: graphs {t1 - t0:.3f} s, eager step {time.perf_counter() - t1:.3f} s", flush=True)

t0 = time.perf_counter(); llm = build_llm(args, path); startup = time.perf_counter() - t0
core = llm.llm_engine.engine_core.engine_core
runner = core.model_executor.model_runner
if mode == "warm":
    extra_warmup(runner)
wl = throughput_workload()

cur = {}
def timed(name, fn):
    def w(*a, **k):
        t = time.perf_counter(); f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        try: return fn(*a, **k)
        finally:
            cur[name] = cur.get(name, 0.0) + time.perf_counter() - t
            cur[name + "_flt"] = cur.get(name + "_flt", 0) + resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
    return w
runner._prepare_inputs = timed("prepare", runner._prepare_inputs)
runner._forward = timed("forward", runner._forward)
runner.model.compute_logits = timed("logits", runner.model.compute_logits)
runner.sampler = timed("sampler", runner.sampler)
runner._sampling_metadata = timed("metadata", runner._sampling_metadata)
steps = []
prof_state = {"prof": None, "n": 0, "run": None}
inner = core.model_executor.execute_model_async
def step(so):
    cur.clear()
    big = so.total_num_scheduled_tokens > 1000
    if mode == "prof" and big and prof_state["run"] in ("first", "second") and prof_state["n"] < 2:
        if prof_state["prof"] is None:
            prof_state["prof"] = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA])
            prof_state["prof"].__enter__()
        prof_state["n"] += 1
    r = timed("total", inner)(so)
    if mode == "prof" and prof_state["prof"] is not None and prof_state["n"] == 2 and big:
        torch.cuda.synchronize()
        prof_state["prof"].__exit__(None, None, None)
        tab = prof_state["prof"].key_averages().table(sort_by="self_cpu_time_total", row_limit=40)
        open(os.path.join(os.path.dirname(outpath), f"prof_{prof_state['run']}.txt"), "w").write(tab)
        prof_state["prof"] = None; prof_state["n"] = 3
    steps.append((so.total_num_scheduled_tokens, dict(cur)))
    return r
core.model_executor.execute_model_async = step
if mode == "prof":  # initialise CUPTI before the timed runs
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]):
        torch.zeros(1, device="cuda").add_(1); torch.cuda.synchronize()
out = {"mode": mode, "startup_s": startup}
for run in ("first", "second", "third"):
    steps.clear(); prof_state.update(run=run, n=0)
    ms0 = torch.cuda.memory_stats(); hs0 = torch.cuda.host_memory_stats()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    s = generate_workload(llm, wl, 0.6)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    ms1 = torch.cuda.memory_stats(); hs1 = torch.cuda.host_memory_stats()
    big = [x for x in steps if x[0] > 1000]
    dec = [x[1] for x in steps if x[0] <= 1000]
    keys = sorted({k for d in dec for k in d})
    out[run] = {"seconds": s, "minflt": r1.ru_minflt - r0.ru_minflt, "user_s": r1.ru_utime - r0.ru_utime,
                "sys_s": r1.ru_stime - r0.ru_stime,
                "device_allocs": ms1.get("num_device_alloc", 0) - ms0.get("num_device_alloc", 0),
                "host_allocs": hs1.get("num_host_alloc", 0) - hs0.get("num_host_alloc", 0),
                "prompt_steps": [{"tokens": x[0], **{k: (round(v * 1e3, 2) if isinstance(v, float) else v) for k, v in x[1].items()}} for x in big],
                "decode_steps": len(dec),
                "decode_ms": {k: round(sum(d.get(k, 0) for d in dec) * (1e3 if not k.endswith("_flt") else 1), 1) for k in keys}}
    print(run, json.dumps(out[run]), flush=True)
json.dump(out, open(outpath, "w"), indent=1)
