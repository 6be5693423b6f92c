"""Host cost of one eager prompt step: where the launch time of a 16,384-token forward goes.
1. the model's eager forward (32 prompts x 512 tokens): host ms to queue it vs ms to finish;
2. cProfile of three forwards (top by tottime and cumtime);
3. torch.profiler (CPU) of one forward: per-op self CPU;
4. per call host us of the layer ops, through their public path and below it."""
import argparse, cProfile, io, json, pstats, sys, time
import torch
from minivllm.benchmarks.throughput import add_throughput_args, build_llm, checkpoint_path
from minivllm.forward_context import AttentionMetadata, set_forward_context

out_json = sys.argv[1]; outdir = out_json.rsplit("/", 1)[0]; tag = out_json.rsplit("/", 1)[1][:-5]; quick = "--quick" in sys.argv
p = argparse.ArgumentParser(); add_throughput_args(p); args = p.parse_args([])
llm = build_llm(args, checkpoint_path(args))
runner = llm.llm_engine.engine_core.engine_core.model_executor.model_runner
dev = runner.device
S, L = 32, 512
n = S * L
i32 = dict(dtype=torch.int32, device=dev)
qsl = torch.arange(0, n + 1, L, **i32)
seq_lens = torch.full((S,), L, **i32)
bt = torch.zeros(S, runner.cuda_graph_runner.block_table.shape[1], **i32)
meta = AttentionMetadata(torch.full((n,), -1, dtype=torch.long, device=dev), bt, seq_lens, qsl, L, L)
ids = torch.randint(0, 1000, (n,), device=dev)
pos = torch.arange(n, device=dev) % L
res = {}

def fwd():
    with set_forward_context(meta):
        return runner.model(ids, pos)

with torch.inference_mode():
    for _ in range(3): fwd()
    torch.cuda.synchronize()
    host, total = [], []
    for _ in range(8):
        torch.cuda.synchronize(); t0 = time.perf_counter(); fwd(); t1 = time.perf_counter()
        torch.cuda.synchronize(); t2 = time.perf_counter()
        host.append((t1 - t0) * 1e3); total.append((t2 - t0) * 1e3)
    res["forward_host_ms"] = host; res["forward_total_ms"] = total
    print("forward host ms", [round(x, 2) for x in host], "total", [round(x, 2) for x in total], flush=True)
    # GPU-only time: the same forward queued behind a long sleep, so the host is never the bottleneck
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(200_000_000); s.record(); fwd(); e.record(); torch.cuda.synchronize()
    res["forward_gpu_ms"] = s.elapsed_time(e)
    print("forward gpu ms (queued ahead)", round(res["forward_gpu_ms"], 2), flush=True)

    if quick:
        for _ in range(4): fwd()
        torch.cuda.synchronize()
        host2, cpus = [], []
        import os, threading
        def cpu_now():
            return int(open("/proc/thread-self/stat").read().rsplit(")", 1)[1].split()[36])
        for _ in range(16):
            torch.cuda.synchronize(); t0 = time.perf_counter(); fwd(); host2.append((time.perf_counter() - t0) * 1e3)
            cpus.append(cpu_now())
        res["forward_host_ms_2"] = host2; res["cpu_of_each"] = cpus
        res["affinity"] = sorted(os.sched_getaffinity(0)); res["threads"] = threading.active_count()
        res["os_threads"] = len(os.listdir("/proc/self/task"))
        print("cpus", cpus, "affinity", res["affinity"], "threads", res["threads"], res["os_threads"], flush=True)
        print("forward host ms again", sorted(round(x, 2) for x in host2), flush=True)
        json.dump(res, open(out_json, "w"), indent=1)
        sys.exit(0)
    pr = cProfile.Profile(); pr.enable()
    for _ in range(3): fwd()
    pr.disable(); torch.cuda.synchronize()
    buf = io.StringIO()
    st = pstats.Stats(pr, stream=buf); st.sort_stats("tottime").print_stats(45); st.sort_stats("cumtime").print_stats(45)
    open(f"{outdir}/{tag}_cprofile.txt", "w").write(buf.getvalue())

    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fwd()
    torch.cuda.synchronize()
    open(f"{outdir}/{tag}_torchprof.txt", "w").write(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40))

    # per-op host cost
    from minivllm.attention.backends import triton_attn as ta
    from minivllm.attention.triton_launch_config import select_config
    from minivllm.attention.triton_unified_attention import launch_unified_attention
    import dataclasses
    layer = None
    for m in runner.model.modules():
        if type(m).__name__ == "Attention": layer = m; break
    kc, vc = layer.kv_cache
    H, KH, D = layer.num_heads, layer.num_kv_heads, layer.head_size
    qkv = torch.randn(n, (H + 2 * KH) * D, dtype=kc.dtype, device=dev)
    q, k, v = (t.view(n, -1, D) for t in qkv.split([H * D, KH * D, KH * D], dim=1))
    o = torch.empty_like(q)
    cfg = select_config(num_tokens=n, num_seqs=S, num_heads=H, num_kv_heads=KH, max_query_len=L, max_seq_len=L, device=dev, head_size=D, element_size=2)
    cfg1 = dataclasses.replace(cfg, new_kv=1)
    res["prefill_config"] = dataclasses.asdict(cfg)
    def t_us(fn, reps=30):
        fn(); torch.cuda.synchronize()
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter(); fn(); ts.append((time.perf_counter() - t0) * 1e6)
            torch.cuda.synchronize()
        ts.sort(); return ts[len(ts) // 2]
    ops = {
        "paged_attention (public)": lambda: ta.paged_attention(q, kc, vc, bt, seq_lens, qsl, 0.1, out=o, max_query_len=L, max_seq_len=L, key=k, value=v),
        "torch.ops.minivllm.paged_attention": lambda: torch.ops.minivllm.paged_attention(q, kc, vc, bt, seq_lens, qsl, o, 0.1, L, L, None, k, v, None),
        "select_config": lambda: select_config(num_tokens=n, num_seqs=S, num_heads=H, num_kv_heads=KH, max_query_len=L, max_seq_len=L, device=dev, head_size=D, element_size=2),
        "launch_unified_attention (tma)": lambda: launch_unified_attention(q, kc, vc, bt, seq_lens, qsl, o, 0.1, cfg, key=k, value=v),
        "launch_unified_attention (pointers)": lambda: launch_unified_attention(q, kc, vc, bt, seq_lens, qsl, o, 0.1, cfg1, key=k, value=v),
        "check_paged_attention_args": lambda: ta.check_paged_attention_args(q, kc, vc, bt, seq_lens, qsl, o),
    }
    x = torch.randn(n, 1024, dtype=kc.dtype, device=dev); w = torch.randn(4096, 1024, dtype=kc.dtype, device=dev)
    ops["F.linear 16384x1024x4096"] = lambda: torch.nn.functional.linear(x, w)
    ops["empty 16384x1024"] = lambda: torch.empty(n, 1024, dtype=kc.dtype, device=dev)
    # the layer kernels' public ops, taken from the model's first decoder layer
    for name in ("fused_add_rms_norm", "rms_norm", "silu_and_mul", "qk_norm_rope_kv_cache"):
        res.setdefault("ops_available", []).append((name, hasattr(torch.ops.minivllm, name)))
    per = {}
    for name, fn in ops.items():
        try:
            per[name] = t_us(fn)
        except Exception as ex:
            per[name] = repr(ex)[:200]
        print(f"{name:40s} {per[name]}", flush=True)
    res["host_us_per_call"] = per
json.dump(res, open(out_json, "w"), indent=1)
