"""Host time of one eager call of a do-nothing op with paged_attention's fourteen arguments,
registered two ways: @torch.library.custom_op, and Library.define + Library.impl (what
minivllm.utils.torch_utils.direct_register_custom_op does). CPU only: the dispatch is
host work. Usage: python op_dispatch.py OUT.json"""
import json, platform, sys, time
import torch
from minivllm.benchmarks.common import environment


@torch.library.custom_op("dispatch_bench::custom", mutates_args=("out",))
def custom(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
           block_table: torch.Tensor, seq_lens: torch.Tensor, query_start_loc: torch.Tensor,
           out: torch.Tensor, scale: float, max_query_len: int, max_seq_len: int,
           num_kv_splits: int | None, key: torch.Tensor | None = None,
           value: torch.Tensor | None = None, seq_order: torch.Tensor | None = None) -> None:
    return None


def direct(*args) -> None:
    return None


lib = torch.library.Library("dispatch_bench", "FRAGMENT")
lib.define("direct" + torch.library.infer_schema(custom._init_fn, mutates_args=("out",)))
lib.impl("direct", direct, "CPU")
ts = [torch.zeros(4) for _ in range(9)]
args = (*ts[:7], 0.1, 512, 512, None, ts[7], ts[8], None)
result = {**environment(), "command": "python docs/benchmarks/perf12/op_dispatch.py " + sys.argv[1],
          "cpu": platform.processor() or platform.machine(), "calls": 5000, "us_per_call": {}}
with torch.inference_mode():
    for name, fn in (("custom_op", torch.ops.dispatch_bench.custom),
                     ("library_impl", torch.ops.dispatch_bench.direct)):
        for _ in range(200):
            fn(*args)
        best = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(1000):
                fn(*args)
            best.append((time.perf_counter() - t0) / 1000 * 1e6)
        result["us_per_call"][name] = min(best)
        print(name, [round(b, 1) for b in best])
json.dump(result, open(sys.argv[1], "w"), indent=1)
