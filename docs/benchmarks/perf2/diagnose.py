"""GPU diagnosis used in the second performance round (run from the repo root on the GPU: `python docs/benchmarks/perf2/diagnose.py ttft|cold|warm`): which Triton kernels compile in which phase (TRITON_CACHE_DIR listing), and a torch.profiler table of batch-1 first tokens."""
import json, os, sys, time
from pathlib import Path
import torch

OUT = Path(os.environ.get("OUT", "/tmp/out"))


def cache_entries(d: Path) -> dict[str, str]:
    res = {}
    if not d.exists():
        return res
    for sub in d.iterdir():
        for f in sub.glob("*.json"):
            if f.name.startswith("__grp__"):
                continue
            try:
                meta = json.loads(f.read_text())
            except Exception:
                continue
            res[sub.name] = f.stem + " " + json.dumps({k: meta.get(k) for k in ("num_warps", "num_stages", "constants", "signature") if k in meta})[:400]
    return res


def phase(name, before, cache):
    after = cache_entries(cache)
    new = {k: v for k, v in after.items() if k not in before}
    print(f"## {name}: {len(new)} new kernels", flush=True)
    for v in sorted(new.values()):
        print("   ", v[:300], flush=True)
    return after


def cold(mode: str):
    from minivllm import LLM, SamplingParams
    from minivllm.benchmarks.common import make_random_checkpoint
    from minivllm.benchmarks.throughput import DEFAULT_CHECKPOINT
    from minivllm.benchmarks.workloads import throughput_workload
    cache = Path(os.environ["TRITON_CACHE_DIR"])
    path = str(make_random_checkpoint(Path(DEFAULT_CHECKPOINT)))
    snap = cache_entries(cache)
    t = time.perf_counter()
    llm = LLM(path, dtype="bfloat16", max_model_len=4096, max_num_seqs=256, max_num_batched_tokens=16384)
    print(f"STARTUP {mode}: {time.perf_counter() - t:.1f} s", flush=True)
    snap = phase("startup", snap, cache)
    llm.generate([{"prompt_token_ids": [1, 2, 3]}], SamplingParams(max_tokens=8))
    snap = phase("tiny warm-up", snap, cache)
    wl = throughput_workload(256, 0, (100, 1024), (100, 1024))
    prompts = [{"prompt_token_ids": p} for p in wl.prompts]
    for i, temp in enumerate([0.6, 0.6, 0.0]):
        params = [SamplingParams(temperature=temp, max_tokens=n, ignore_eos=True) for n in wl.output_lens]
        llm.reset_prefix_cache()
        torch.cuda.synchronize(); t = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        torch.cuda.synchronize(); dt = time.perf_counter() - t
        print(f"RUN {i} temp={temp}: {wl.num_output_tokens / dt:.0f} tok/s ({dt:.2f} s)", flush=True)
        snap = phase(f"run {i}", snap, cache)
    llm.shutdown()


def ttft():
    from minivllm import LLM, SamplingParams
    from minivllm.benchmarks.common import make_random_checkpoint
    from minivllm.benchmarks.throughput import DEFAULT_CHECKPOINT
    from torch.profiler import ProfilerActivity, profile
    path = str(make_random_checkpoint(Path(DEFAULT_CHECKPOINT)))
    for async_sched in (None, False):
        llm = LLM(path, dtype="bfloat16", max_model_len=4096, max_num_seqs=8, async_scheduling=async_sched)
        eng = llm.llm_engine
        prompt = [(7 * i) % 10000 for i in range(128)]

        def first_token(prof_step=None):
            eng.reset_prefix_cache()
            eng.add_request({"prompt_token_ids": prompt}, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
            torch.cuda.synchronize(); t = time.perf_counter()
            steps = 0
            while True:
                outs = eng.step(); steps += 1
                if any(len(o.outputs[0].token_ids) for o in outs) or not eng.has_unfinished_requests() or steps > 10:
                    break
            dt = time.perf_counter() - t
            while eng.has_unfinished_requests():
                eng.step()
            return dt, steps
        for _ in range(3):
            first_token()
        runs = [first_token() for _ in range(7)]
        print(f"TTFT async={async_sched}: " + ", ".join(f"{a*1e3:.2f}ms/{s}st" for a, s in runs), flush=True)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            first_token()
        prof.export_chrome_trace(str(OUT / f"ttft_async{async_sched}.json"))
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25), flush=True)
        llm.shutdown()
        del llm, eng
        torch.cuda.empty_cache()


if __name__ == "__main__":
    {"cold": lambda: cold("cold"), "warm": lambda: cold("warm"), "ttft": ttft}[sys.argv[1]]()
