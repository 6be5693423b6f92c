"""Refit the decode cost of a committed step timeline with the current fit_decode_cost.

The H200 run of step_timeline.json fitted its decode steps with plain least squares (the
code of that run); fit_decode_cost now leaves outlying steps out (_robust_fit). The
per-step columns in the JSON are everything the fit reads, so this reproduces the
current fit on the same steps without a GPU:

    python3 docs/benchmarks/perf11/refit_decode_cost.py docs/benchmarks/perf11/step_timeline.json \
        docs/benchmarks/perf11/decode_cost.json
"""

import json
import sys

from minivllm.benchmarks.step_cost_model import fit_decode_cost
from minivllm.benchmarks.step_timeline import StepTiming

source, target = sys.argv[1], sys.argv[2]
result = json.load(open(source))
columns, roof = result["step_timeline"]["per_step"], result["roofline"]
steps = [
    StepTiming(0.0, n, t, m, c, gpu_s=g)
    for n, t, m, c, g in zip(columns["num_reqs"], columns["num_tokens"], columns["mixed"],
                             columns["context_tokens"], columns["gpu_s"])
]
fit = fit_decode_cost(steps, roof["kv_bytes_per_token"], roof["weight_bytes"], roof["copy_bandwidth"])
json.dump({
    "command": " ".join(["python3", *sys.argv]),
    "source": source,
    "what": "decode_cost refitted from the run's per-step columns by the current "
            "fit_decode_cost (outlying steps left out); fit_at_run is the plain least-squares "
            "fit the run's own code wrote",
    "fit": fit,
    "fit_at_run": result["step_timeline"]["decode_cost"],
}, open(target, "w"), indent=1)
print(json.dumps(fit, indent=1))
