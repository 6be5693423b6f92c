"""A/B of giving back the allocator's cached blocks after graph capture (perf14).
argv[1]: "keep" makes release_cached_blocks a no-op (the parent's behaviour: the warm-ups'
activations stay cached outside the graphs' pool), "release" runs this code as is.
The rest of argv goes to `minivllm bench throughput`.
Usage: python3 release.py keep|release <bench throughput args>"""
import sys
import minivllm.worker.cuda_graph as cg
import minivllm.worker.model_runner as mr
if sys.argv[1] == "keep":
    cg.release_cached_blocks = mr.release_cached_blocks = lambda: None
else:
    assert sys.argv[1] == "release", sys.argv[1]
from minivllm.cli import main
sys.exit(main(["bench", "throughput", *sys.argv[2:]]))
