"""A/B of counting the CUDA graphs' pool in the KV pool's sizing (perf14).
argv[1]: "uncounted" makes ModelRunner.profile_cudagraph_memory return 0 without
capturing (the parent's sizing: the graphs' pool comes on top of the budget), "counted"
runs this code as is. The rest of argv goes to `minivllm bench throughput`.
Usage: python3 graph_budget.py uncounted|counted <bench throughput args>"""
import sys
from minivllm.worker.model_runner import ModelRunner
if sys.argv[1] == "uncounted":
    ModelRunner.profile_cudagraph_memory = lambda self: 0
else:
    assert sys.argv[1] == "counted", sys.argv[1]
from minivllm.cli import main
sys.exit(main(["bench", "throughput", *sys.argv[2:]]))
