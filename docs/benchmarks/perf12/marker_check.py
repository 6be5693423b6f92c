import torch
from torch.profiler import ProfilerActivity, profile
from minivllm.benchmarks.step_timeline_kernels import kernel_events, STEP_MARKER
x = torch.ones(16, device="cuda")
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    torch.cuda._sleep(0); x.add_(1); torch.cuda._sleep(0)
    torch.cuda.synchronize()
ev = kernel_events(prof)
for e in ev: print(repr(e.name), e.duration_ns)
print("markers:", sum(STEP_MARKER in e.name for e in ev))
