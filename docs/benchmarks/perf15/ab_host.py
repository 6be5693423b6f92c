"""One side of the host A/B: bench host --engine's measurement, with whichever minivllm
is first on PYTHONPATH (the parent commit's copy, or this commit's)."""
import json, sys
import minivllm
from minivllm import LLM
from minivllm.benchmarks.common import environment, make_random_checkpoint
from minivllm.benchmarks.host_engine import measure_engine_batch, _summary_line
from minivllm.benchmarks.throughput import DEFAULT_CHECKPOINT
from pathlib import Path

out, side = sys.argv[1], sys.argv[2]
batches, steps, prompt = [8, 64, 256], 200, 512
model = str(make_random_checkpoint(Path(DEFAULT_CHECKPOINT)))
llm = LLM(model, max_model_len=prompt + steps + 40, max_num_seqs=256)
rows = []
for b in batches:
    r = measure_engine_batch(llm, b, prompt, steps, 0.6)
    print(side, _summary_line(r), flush=True)
    rows.append(r)
json.dump({**environment(), "side": side, "minivllm_file": minivllm.__file__, "rows": rows},
          open(out, "w"), indent=1)
