"""Host time of ``triton.cdiv`` and ``triton.next_power_of_2`` (Triton functions that can
also run in a kernel; a host call goes through Triton's wrapper) against plain Python
(``minivllm.utils.math_utils``), alone and inside the two host functions every eager
attention call and every step's sampler run: ``select_config`` and
``gumbel_launch_config``, each timed with its modules' ``cdiv`` and ``next_power_of_2``
bound to Triton's and then to the plain ones, side by side in one process. CPU only.
Usage: python docs/benchmarks/perf12/host_arith.py OUT.json"""
import json, sys, time
import torch
import triton
from minivllm.attention import triton_decode_split, triton_launch_config
from minivllm.benchmarks.common import environment
from minivllm.sample import gumbel
from minivllm.utils.math_utils import cdiv, next_power_of_2


def per_call_us(fn, calls=20000, repeats=5):
    for _ in range(500):
        fn()
    best = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best.append((time.perf_counter() - t0) / calls * 1e6)
    return min(best)


kw = dict(num_tokens=16384, num_seqs=32, num_heads=16, num_kv_heads=8, max_query_len=512,
          max_seq_len=512, device=torch.device("cpu"), head_size=128, element_size=2)
cases = {
    "cdiv": lambda: None,
    "next_power_of_2": lambda: None,
    "select_config_prompt_32x512": lambda: triton_launch_config.select_config(**kw),
    "select_config_decode_1x512": lambda: triton_launch_config.select_config(
        **{**kw, "num_tokens": 1, "num_seqs": 1, "max_query_len": 1}),
    "gumbel_launch_config_151936x256": lambda: gumbel.gumbel_launch_config(151936, False, 256),
}
result = {**environment(), "command": "python docs/benchmarks/perf12/host_arith.py " + sys.argv[1],
          "us_per_call": {}}
modules = (triton_launch_config, triton_decode_split, gumbel)
sides = (("triton", triton.cdiv, triton.next_power_of_2), ("math_utils", cdiv, next_power_of_2))
for name, fn in cases.items():
    row = {}
    for label, div, pow2 in sides:
        for m in modules:
            m.cdiv = div
            if hasattr(m, "next_power_of_2"):
                m.next_power_of_2 = pow2
        call = {"cdiv": lambda: div(16384, 32), "next_power_of_2": lambda: pow2(151936)}.get(name, fn)
        row[label] = per_call_us(call)
    result["us_per_call"][name] = row
    print(name, {k: round(v, 2) for k, v in row.items()})
json.dump(result, open(sys.argv[1], "w"), indent=1)
