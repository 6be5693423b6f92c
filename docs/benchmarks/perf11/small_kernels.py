"""The decoder layer's small Triton kernels at decode batch sizes: launch configurations
(num_warps; heads per program for q/k norm + RoPE; block for SiLU-and-mul) timed as a
CUDA graph of 200 back-to-back launches on L2-resident inputs (as in a step, where the
previous GEMM just wrote them), median of 7 replays. Current configuration marked."""
import json, sys
import torch, triton
from minivllm.model_executor.layers.triton_layernorm import rms_norm_kernel
from minivllm.model_executor.layers.triton_activation import silu_and_mul_kernel
from minivllm.model_executor.layers.triton_qk_norm_rope import qk_norm_rope_kernel

dev, dt = "cuda", torch.bfloat16
H, D, I, QH, KH, HS, BS = 1024, 128, 3072, 16, 8, 128, 16
MS = [16, 64, 128, 256]
N = 200

def bench(launch):
    launch(); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(N): launch()
    g.replay(); torch.cuda.synchronize()
    ts = []
    for _ in range(7):
        a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b) * 1e3 / N)
    ts.sort(); return round(ts[3], 3)

rows = []
for M in MS:
    x = torch.randn(M, H, device=dev, dtype=dt); r = torch.randn_like(x); w = torch.randn(H, device=dev, dtype=dt); o = torch.empty_like(x)
    for warps in (1, 2, 4, 8):
        t = bench(lambda: rms_norm_kernel[(M,)](o, x, r, w, 1, x.stride(0), 0, r.stride(0), o.stride(0), H, 1e-6,
                                                 HAS_RESIDUAL=True, BLOCK=1024, LAUNCH_DEPENDENTS=False, num_warps=warps))
        rows.append({"kernel": "fused_add_rms_norm", "m": M, "num_warps": warps, "current": warps == 4, "us": t})
    xs = torch.randn(M, 2 * I, device=dev, dtype=dt); os_ = torch.empty(M, I, device=dev, dtype=dt)
    for block in (512, 1024, 2048, 4096):
        for warps in (2, 4, 8, 16):
            if block // (32 * warps) < 2: continue
            t = bench(lambda: silu_and_mul_kernel[(M, triton.cdiv(I, block))](os_, xs, xs.stride(0), os_.stride(0), I,
                                                                                 BLOCK=block, LAUNCH_DEPENDENTS=False, num_warps=warps))
            rows.append({"kernel": "silu_and_mul", "m": M, "block": block, "num_warps": warps, "current": block == 1024 and warps == 4, "us": t})
    qkv = torch.randn(M, (QH + 2 * KH) * HS, device=dev, dtype=dt)
    q, k, v = qkv.split([QH * HS, KH * HS, KH * HS], dim=-1)
    qw = torch.randn(HS, device=dev, dtype=dt); kw = torch.randn(HS, device=dev, dtype=dt)
    cs = torch.randn(4096, HS, device=dev, dtype=dt)
    pos = torch.randint(0, 4000, (M,), device=dev)
    kc = torch.zeros(4096, BS, KH, HS, device=dev, dtype=dt); vc = torch.zeros_like(kc)
    slots = torch.randperm(4096 * BS, device=dev)[:M]
    for heads in (2, 4, 8):
        for warps in (1, 2, 4, 8):
            grid = (M, triton.cdiv(QH, heads) + triton.cdiv(KH, heads))
            t = bench(lambda: qk_norm_rope_kernel[grid](pos, q, k, qw, kw, cs, v, kc, vc, slots, q.stride(0), k.stride(0), cs.stride(0),
                                                        v.stride(0), *kc.stride()[:3], QH, KH, HS, 1e-6, HEAD_SIZE=HS, BLOCK_D=128,
                                                        BLOCK_HALF=64, HEADS=heads, WRITE_CACHE=True, CACHE_BLOCK_SIZE=BS, num_warps=warps))
            rows.append({"kernel": "qk_norm_rope_kv_cache", "m": M, "heads": heads, "num_warps": warps,
                         "current": heads == 8 and warps == 4, "us": t})
    for rr in rows[-40:]:
        if rr["m"] == M: print(json.dumps(rr), flush=True)
# an empty-ish reference: the smallest kernel a graph can run back to back
e = torch.zeros(1, device=dev)
rows.append({"kernel": "add_one_element", "us": bench(lambda: e.add_(1))})
json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "timing": "CUDA graph of 200 back-to-back launches, L2-resident inputs, median of 7 replays", "rows": rows},
          open(sys.argv[1], "w"), indent=1)
