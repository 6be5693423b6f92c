"""Decode GEMMs with weights cold (rotating copies) vs hot in L2, and with an L2 prefetch."""
import json, sys, time
import torch, triton, triton.language as tl

SHAPES = {"qkv": (4096, 1024), "o": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072)}

@triton.jit
def touch_kernel(w_ptr, out_ptr, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    base = pid * BLOCK * ITERS
    for i in range(ITERS):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(w_ptr + offs, mask=offs < n, other=0.0, eviction_policy="evict_last").to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc))

def graph_time(fn, reps=50):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn(); fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(5): g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(reps): g.replay()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t) / reps)
    ts.sort()
    return ts[len(ts) // 2]

res = {}
dev = "cuda"
for m in (16, 64, 128, 256):
    for name, (n, k) in SHAPES.items():
        copies = max(2, (512 << 20) // (n * k * 2))
        ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) for _ in range(copies)]
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        out = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
        per = 32
        def cold():
            for i in range(per):
                torch.mm(x, ws[i % copies].t(), out=out)
        def hot():
            for i in range(per):
                torch.mm(x, ws[0].t(), out=out)
        tc = graph_time(cold) / per * 1e6
        th = graph_time(hot) / per * 1e6
        res[f"{name}_m{m}"] = {"cold_us": tc, "hot_us": th, "mb": n * k * 2 / 2**20}
        print(f"m={m:4d} {name:8s} cold {tc:6.2f} us  hot {th:6.2f} us  ({n*k*2/2**20:.0f} MiB)", flush=True)
        del ws
# prefetch then GEMM: alternate attention-like big streaming read (evicting L2) with the 4 GEMMs,
# with and without a side-stream prefetch of the layer's weights during the streaming read.
m = 64
layers = 8
W = [[torch.randn(*SHAPES[s], device=dev, dtype=torch.bfloat16) for s in SHAPES] for _ in range(layers)]
kv = torch.randn(64 << 20, device=dev, dtype=torch.bfloat16)  # 128 MiB stream per layer
sink = torch.empty(1 << 16, device=dev, dtype=torch.float32)
xs = {s: torch.randn(m, SHAPES[s][1], device=dev, dtype=torch.bfloat16) for s in SHAPES}
outs = {s: torch.empty(m, SHAPES[s][0], device=dev, dtype=torch.bfloat16) for s in SHAPES}
def stream_read():
    touch_kernel[(1024,)](kv, sink, kv.numel(), BLOCK=1024, ITERS=triton.cdiv(kv.numel(), 1024 * 1024))
def gemms(l):
    for j, s in enumerate(SHAPES):
        torch.mm(xs[s], W[l][j].t(), out=outs[s])
def prefetch(l, ctas):
    for j, s in enumerate(SHAPES):
        w = W[l][j]
        iters = triton.cdiv(w.numel(), ctas * 1024)
        touch_kernel[(ctas,)](w, sink[ctas * j:], w.numel(), BLOCK=1024, ITERS=iters)
side = torch.cuda.Stream()
def plain():
    for l in range(layers):
        stream_read(); gemms(l)
def only_stream():
    for l in range(layers):
        stream_read()
def with_prefetch(ctas):
    def f():
        main = torch.cuda.current_stream()
        for l in range(layers):
            side.wait_stream(main)
            with torch.cuda.stream(side):
                prefetch(l, ctas)
            stream_read()
            main.wait_stream(side)
            gemms(l)
    return f
t_stream = graph_time(only_stream, 20) / layers * 1e6
t_plain = graph_time(plain, 20) / layers * 1e6
res["layer_stream_only_us"] = t_stream
res["layer_plain_us"] = t_plain
print(f"stream only {t_stream:.1f} us/layer; stream + 4 GEMMs (m=64) {t_plain:.1f} us/layer", flush=True)
for ctas in (8, 16, 32):
    t = graph_time(with_prefetch(ctas), 20) / layers * 1e6
    res[f"layer_prefetch_{ctas}_us"] = t
    print(f"  with prefetch ({ctas} CTAs) {t:.1f} us/layer", flush=True)
json.dump(res, open(sys.argv[1], "w"), indent=1)
