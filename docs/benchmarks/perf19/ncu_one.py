"""One attention launch to profile: step 4's prompts alone (short) or 1 x 8192 (long)."""
import sys
import torch
sys.path.insert(0, "scratch_gpu/s25")
from prompt_steps import prompt_steps
from minivllm.attention.triton_launch_config import select_config
from minivllm.attention.triton_unified_attention import launch_unified_attention
from minivllm.benchmarks.kernel_sweep_workload import batch_inputs
from minivllm.benchmarks.kernel_inputs import NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE, launcher_args

which = sys.argv[1]
if which == "short":
    seqs = [s for s in prompt_steps()[4] if not (s[1] == 1 and s[0] > 0)]
else:
    seqs = [(0, 8192)]
inp = batch_inputs(seqs, 0)
c = select_config(num_tokens=sum(n for _, n in seqs), num_seqs=len(seqs), num_heads=NUM_HEADS,
                  num_kv_heads=NUM_KV_HEADS, max_query_len=max(n for _, n in seqs),
                  max_seq_len=max(a + b for a, b in seqs), device=torch.device("cuda"), head_size=HEAD_SIZE)
print(which, len(seqs), c)
paged = {k: inp[k] for k in ("key_cache", "value_cache", "block_table")}
args = launcher_args(inp["query"], paged, inp["seq_lens"], inp["query_start_loc"])
for _ in range(3):
    launch_unified_attention(*args, c, key=inp["key"], value=inp["value"])
torch.cuda.synchronize()
