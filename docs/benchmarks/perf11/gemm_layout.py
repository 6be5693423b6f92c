"""Decode GEMMs of the Qwen3-0.6B shape at every captured batch size: does the weight's
layout ([N, K] as stored, x @ W.T; or [K, N] contiguous, x @ W) or cuBLASLt instead of
cuBLAS change the time? CUDA graph of back-to-back calls over rotating weight copies
(>= 256 MiB per shape, so L2 is cold), median of 7 replays."""
import json, sys, time
import torch
import torch.nn.functional as F

SHAPES = {"qkv_proj": (4096, 1024), "o_proj": (1024, 2048), "gate_up_proj": (6144, 1024),
          "down_proj": (1024, 3072), "lm_head": (151936, 1024)}
MS = [1, 2, 4, 8, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240, 256]
dev = "cuda"; dt = torch.bfloat16
out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": []}

def time_graph(fn, xs, ws, reps=7):
    n = len(ws)
    for i in range(n): fn(xs, ws[i])
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(n): fn(xs, ws[i])
    g.replay(); torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b.record(); b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / n)
    ts.sort(); return ts[len(ts) // 2]

VARIANTS = {
    "linear_NK": lambda x, w: F.linear(x, w),          # as stored today
    "mm_KN": lambda x, w: torch.mm(x, w),               # weight pre-transposed, contiguous
}
t0 = time.time()
for name, (N, K) in SHAPES.items():
    copies = max(1, min(64, (256 << 20) // (N * K * 2)))
    w_nk = [torch.randn(N, K, device=dev, dtype=dt) * 0.02 for _ in range(copies)]
    w_kn = [w.t().contiguous() for w in w_nk]
    for lib in ("cublas", "cublaslt"):
        torch.backends.cuda.preferred_blas_library(lib)
        for M in MS:
            x = torch.randn(M, K, device=dev, dtype=dt)
            row = {"layer": name, "n": N, "k": K, "m": M, "lib": lib, "copies": copies}
            ref = F.linear(x, w_nk[0]).float()
            for v, fn in VARIANTS.items():
                ws = w_nk if v == "linear_NK" else w_kn
                row[v] = round(time_graph(fn, x, ws), 3)
                err = (fn(x, ws[0]).float() - ref).abs().max().item()
                row[v + "_maxerr"] = err
            out["rows"].append(row)
            print(json.dumps(row), flush=True)
    del w_nk, w_kn; torch.cuda.empty_cache()
torch.backends.cuda.preferred_blas_library("cublas")
out["elapsed_s"] = time.time() - t0
json.dump(out, open(sys.argv[1], "w"), indent=1)
