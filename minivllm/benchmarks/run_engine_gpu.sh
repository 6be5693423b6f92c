#!/usr/bin/env bash
# One GPU session for the engine: native GPU tests, then the three engine benchmarks.
# Usage (repo root, on the GPU machine): bash minivllm/benchmarks/run_engine_gpu.sh OUTDIR
set -uo pipefail
out=${1:-/tmp/minivllm-out}
mkdir -p "$out"
export PYTHONPATH=. PYTHONUNBUFFERED=1 NO_MKDOCS_2_WARNING=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" | tee -a "$out/gpu.txt"
timeout 200 python3 -m pytest -q -p no:cacheprovider -x tests/worker tests/engine/test_llm_engine_gpu.py \
  tests/attention 2>&1 | tail -n 25 | tee "$out/gpu_tests.txt"
python3 -m minivllm.cli bench latency --output "$out/latency.json" 2>&1 | grep -v Warning | tail -n 5
python3 -m minivllm.cli bench throughput --peer hf --peer-num-requests 32 \
  --output "$out/throughput.json" 2>&1 | grep -v Warning | tail -n 8
python3 -m minivllm.cli bench prefix --output "$out/prefix.json" 2>&1 | grep -v Warning | tail -n 5
