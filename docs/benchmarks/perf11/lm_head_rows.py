"""The LM head (Qwen3-0.6B: 151,936 x 1,024, bf16) and the one-pass sampler at every row
count a step can sample (1..256), eager as the engine runs them: median of 15 timings of
8 back-to-back calls each (CUDA events). Does some row count cost far more than its
neighbours?"""
import json, sys
import torch
import torch.nn.functional as F
from minivllm.sample.gumbel import gumbel_sample

dev, dt = "cuda", torch.bfloat16
V, H = 151936, 1024
w = torch.randn(V, H, device=dev, dtype=dt) * 0.02
x_all = torch.randn(288, H, device=dev, dtype=dt)

def t(fn, reps=15, inner=8):
    fn(); torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(inner): fn()
        b.record(); b.synchronize(); ts.append(a.elapsed_time(b) * 1e3 / inner)
    ts.sort(); return round(ts[len(ts) // 2], 2)

rows = []
for m in range(1, 257):
    x = x_all[:m]
    lm = t(lambda: F.linear(x, w))
    logits = F.linear(x, w)
    temp = torch.full((m,), 0.6, device=dev)
    samp = t(lambda: gumbel_sample(logits, temp, 12345, None))
    rows.append({"m": m, "lm_head_us": lm, "sampler_us": samp})
    if m % 16 == 0: print(json.dumps(rows[-1]), flush=True)
json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, open(sys.argv[1], "w"), indent=1)
