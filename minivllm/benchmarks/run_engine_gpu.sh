#!/usr/bin/env bash
# One GPU session for the engine: native GPU tests, then the engine benchmarks.
# Usage (repo root, on the GPU machine): bash minivllm/benchmarks/run_engine_gpu.sh OUTDIR [peers]
# With "peers", only the throughput benchmark runs, with Hugging Face on the first 32 requests.
set -uo pipefail
out=${1:-/tmp/minivllm-out}
mode=${2:-engine}
mkdir -p "$out/prof"
export PYTHONPATH=. PYTHONUNBUFFERED=1
# The engine core's transport (pyzmq, msgspec) is not in the GPU image and there is no
# network: install the carried wheels (.whl/, see run_serve_gpu.sh) first.
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --find-links .whl pyzmq msgspec 2>&1 | tail -n 3
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" | tee -a "$out/gpu.txt"
bench() { python3 -m minivllm.cli bench "$@" 2>&1 | grep -v Warning | tail -n 5; }
if [ "$mode" = peers ]; then
  bench throughput --peer hf --peer-num-requests 32 --output "$out/throughput_peers.json"
  exit 0
fi
timeout 200 python3 -m pytest -q -p no:cacheprovider -x tests/model_executor/test_custom_ops.py \
  tests/worker tests/engine/test_llm_engine_gpu.py tests/engine/test_async_scheduling.py \
  > "$out/gpu_tests.txt" 2>&1
rc=$?
tail -n 15 "$out/gpu_tests.txt"
if [ $rc -ne 0 ]; then
  echo "GPU tests failed: benchmarks fall back to the native (torch) layers"
  export MINIVLLM_NATIVE_OPS=1
fi
bench host --output "$out/host.json"
bench throughput --compare-sync --profile-dir "$out/prof" --output "$out/throughput.json"
bench latency --output "$out/latency.json" --profile-dir "$out/prof"
bench prefix --output "$out/prefix.json"
rm -f "$out/prof/decode_batch1_trace.json"  # large; the summary JSON is kept
