"""Where a decode step's host time goes inside execute_model_async (H200), at fixed batches.

For each batch B: B requests (prompt 512, ignore_eos, temperature 0.6) are prefilled, then
STEPS decode steps run with every phase of execute_model_async timed (perf_counter), the GPU
step timed by CUDA events, and one more block of steps under cProfile.
"""
import cProfile, collections, io, json, pstats, sys, time
import torch
from minivllm.benchmarks.throughput import add_throughput_args, build_llm, checkpoint_path
import argparse

out_path = sys.argv[1]
batches = [int(b) for b in sys.argv[2].split(",")]
STEPS = 150
p = argparse.ArgumentParser(); add_throughput_args(p); args = p.parse_args([])
CPU = not torch.cuda.is_available()  # a dry run of the script on the dev machine
PROMPT = 64 if CPU else 512
if CPU:
    STEPS = 12
    from minivllm import LLM
    from minivllm.demo import demo_model_path
    llm = LLM(str(demo_model_path()), device="cpu", dtype="float32", max_model_len=512, max_num_seqs=64)
else:
    llm = build_llm(args, checkpoint_path(args))
from minivllm import SamplingParams
from minivllm.sampling_params import RequestOutputKind
engine = llm.llm_engine
core = engine.engine_core.engine_core
runner = core.model_executor
for attr in ("driver_worker", "worker"):
    runner = getattr(runner, attr, runner)
runner = getattr(runner, "model_runner", runner)
import minivllm.worker.model_runner as mr
import minivllm.worker.input_batch as ib

tot = collections.defaultdict(float)
cnt = collections.Counter()

def wrap(obj, name, key):
    inner = getattr(obj, name)
    def w(*a, **k):
        t0 = time.perf_counter()
        try:
            return inner(*a, **k)
        finally:
            tot[key] += time.perf_counter() - t0
            cnt[key] += 1
    setattr(obj, name, w)

wrap(core.scheduler, "schedule", "schedule")
wrap(core.scheduler, "update_from_output", "update_from_output")
wrap(core, "_process_step", "_process_step (wait + update + outputs)")
wrap(engine.output_processor, "process_outputs", "process_outputs")
wrap(runner, "execute_model_async", "execute_model_async")
wrap(runner, "_update_generators", "  _update_generators")
wrap(runner, "_prepare_inputs", "  prepare_inputs")
wrap(runner, "_forward", "  forward")
if runner.cuda_graph_runner is not None:
    wrap(runner.cuda_graph_runner, "run", "    graphs.run (copies + replay)")
    wrap(runner.cuda_graph_runner, "graph_key", "    graph_key")
wrap(runner, "sampler", "  sampler")
wrap(runner, "_sampling_metadata", "  sampling_metadata")
wrap(runner.model, "compute_logits", "  compute_logits")
wrap(runner, "_propose_draft_tokens", "  propose_draft_tokens")
wrap(runner.block_tables, "update", "    block_tables.update")
wrap(runner.block_tables, "gather", "    block_tables.gather")
wrap(mr, "compute_prompt_logprobs", "  compute_prompt_logprobs")
AO = mr.AsyncOutput
inner_get = AO.get_output
def get_output(self):
    t0 = time.perf_counter()
    try:
        return inner_get(self)
    finally:
        tot["AsyncOutput.get_output (wait + tolist)"] += time.perf_counter() - t0
        cnt["AsyncOutput.get_output (wait + tolist)"] += 1
AO.get_output = get_output
import minivllm.utils.torch_utils as tu
inner_copy = ib.copy_arrays_to_device
def copy_w(*a, **k):
    t0 = time.perf_counter()
    try:
        return inner_copy(*a, **k)
    finally:
        tot["    copy_arrays_to_device"] += time.perf_counter() - t0
        cnt["    copy_arrays_to_device"] += 1
ib.copy_arrays_to_device = copy_w
# GPU time per step: events around the runner's execute
gpu_events = []
inner_exec = runner.execute_model_async
def exec_ev(so):
    if CPU:
        return inner_exec(so)
    s = torch.cuda.Event(enable_timing=True); s.record()
    h = inner_exec(so)
    e = torch.cuda.Event(enable_timing=True); e.record()
    gpu_events.append((s, e))
    return h
runner.execute_model_async = exec_ev

def fill(B, max_tokens):
    params = SamplingParams(temperature=0.6, max_tokens=max_tokens, ignore_eos=True,
                            output_kind=RequestOutputKind.FINAL_ONLY)
    for i in range(B):
        engine.add_request({"prompt_token_ids": [(i * 7 + j) % 9000 + 5 for j in range(PROMPT)]}, params)

def prefill(B):
    # step until every request has a generated token
    for _ in range(200):
        engine.step()
        sched = core.scheduler
        if all(r.num_output_tokens > 0 for r in sched.requests.values()) and len(sched.requests) == B:
            return

result = {"steps": STEPS, "batches": {}}
# warm-up: one tiny generate
llm.generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(max_tokens=8), use_tqdm=False)
for B in batches:
    fill(B, min(3 * STEPS + 40, 400))
    prefill(B)
    for _ in range(10):
        engine.step()
    tot.clear(); cnt.clear(); gpu_events.clear()
    t0 = time.perf_counter()
    for _ in range(STEPS):
        engine.step()
    wall = time.perf_counter() - t0
    if not CPU:
        torch.cuda.synchronize()
    gpu_ms = sorted(s.elapsed_time(e) for s, e in gpu_events) or [0.0]
    phases = {k: {"ms_per_call": 1e3 * v / max(cnt[k], 1), "calls": cnt[k]} for k, v in tot.items()}
    row = {"wall_ms_per_step": 1e3 * wall / STEPS, "gpu_ms_median": gpu_ms[len(gpu_ms) // 2], "phases": phases}
    print(f"B={B} wall {row['wall_ms_per_step']:.3f} ms/step, gpu {row['gpu_ms_median']:.3f}", flush=True)
    for k, v in sorted(phases.items(), key=lambda x: -x[1]['ms_per_call'] * x[1]['calls']):
        print(f"   {k:45s} {v['ms_per_call']:.3f} ms x {v['calls']}", flush=True)
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(STEPS // 3):
        engine.step()
    pr.disable()
    s = io.StringIO(); st = pstats.Stats(pr, stream=s)
    st.sort_stats("tottime").print_stats(45)
    st.sort_stats("cumtime").print_stats("model_runner|input_batch|cuda_graph|sampler|gumbel|metadata|torch_utils|buffer_utils|async_utils|async_spec|block_table|logits", 40)
    row["cprofile_steps"] = STEPS // 3
    row["cprofile"] = s.getvalue()
    result["batches"][str(B)] = row
    engine.abort_request(list(core.scheduler.requests))
    for _ in range(3):
        engine.step()
json.dump(result, open(out_path, "w"), indent=1)
# The graph launch alone: host microseconds of replay() for a decode graph, on an idle
# GPU (synchronised after each) and back to back (the queue fills).
g = runner.cuda_graph_runner
if g is not None:
    g.slot_mapping.fill_(-1)
    g.seq_lens.fill_(1)
    launch = {}
    for key in [k for k in g.graphs if k[0] == "decode"][-1:] + [k for k in g.graphs if k[0] == "decode"][:1]:
        graph = g.graphs[key]
        idle, queued = [], []
        for _ in range(30):
            torch.cuda.synchronize()
            t0 = time.perf_counter(); graph.replay(); idle.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        for _ in range(30):
            t0 = time.perf_counter(); graph.replay(); queued.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        idle.sort(); queued.sort()
        launch[str(key)] = {"idle_us_median": 1e6 * idle[15], "queued_us_median": 1e6 * queued[15],
                            "queued_us_max": 1e6 * queued[-1]}
        print("replay", key, launch[str(key)], flush=True)
    result["graph_launch"] = launch
    json.dump(result, open(out_path, "w"), indent=1)
