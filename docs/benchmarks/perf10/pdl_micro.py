"""Gap between kernels in a CUDA graph, with and without programmatic dependent launch."""
import json, sys, time
import torch, triton, triton.language as tl
print("triton", triton.__version__, "torch", torch.__version__)
try:
    from triton.language.extra.cuda import gdc_wait, gdc_launch_dependents
    print("gdc available")
except Exception as e:
    print("gdc import failed", e); gdc_wait = gdc_launch_dependents = None

@triton.jit
def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr, PDL: tl.constexpr):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n + offs, mask=offs < n).to(tl.float32)
    tl.store(y_ptr + row * n + offs, (x * 0.999).to(y_ptr.dtype.element_ty), mask=offs < n)

M = int(sys.argv[1]) if len(sys.argv) > 1 else 256
x = torch.randn(M, 1024, device="cuda", dtype=torch.bfloat16)
w = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16) * 0.03
bufs = [torch.empty_like(x) for _ in range(2)]

def tri(src, dst, pdl):
    scale_kernel[(M,)](src, dst, 1024, BLOCK=1024, PDL=pdl, num_warps=4, launch_pdl=pdl)

def chain(kind, pdl, n=100):
    a, b = bufs
    src = x
    for i in range(n):
        if kind == "gemm" and i % 2 == 0:
            torch.mm(src, w, out=a)
        else:
            tri(src, a, pdl)
        src, a = a, (b if a is bufs[0] else bufs[0])
    return src

res = {}
for kind in ("triton", "gemm"):
    for pdl in (False, True):
        try:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    chain(kind, pdl)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                out = chain(kind, pdl)
            ref = chain(kind, False); torch.cuda.synchronize()
            g.replay(); torch.cuda.synchronize()
            same = torch.equal(out, ref)
            for _ in range(20): g.replay()
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(200): g.replay()
            torch.cuda.synchronize()
            us = (time.perf_counter() - t) / 200 / 100 * 1e6
            res[f"{kind}_pdl{int(pdl)}"] = us
            print(kind, "pdl", pdl, f"{us:.2f} us per kernel", "equal", same, flush=True)
        except Exception as e:
            print(kind, pdl, "failed", repr(e)[:500], flush=True)
# single-kernel durations for reference (profiler)
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CUDA]) as p:
    for _ in range(20):
        tri(x, bufs[0], False); torch.mm(x, w, out=bufs[1])
    torch.cuda.synchronize()
for e in p.key_averages():
    if e.device_type.name == "CUDA" or "kernel" in e.key:
        print(f"{e.key[:60]:60s} {e.count} {getattr(e,'device_time',0):.2f}")
json.dump(res, open(sys.argv[2] if len(sys.argv) > 2 else "/dev/null", "w"))
