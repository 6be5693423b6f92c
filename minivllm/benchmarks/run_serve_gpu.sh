#!/usr/bin/env bash
# One GPU session for serving: `minivllm bench serve` against a `minivllm serve` it starts.
# Usage (repo root, on the GPU machine): bash minivllm/benchmarks/run_serve_gpu.sh OUTDIR
# The GPU image lacks the server's packages and has no network: .whl/ (git-ignored, carried
# along) holds Python 3.12 wheels of fastapi, uvicorn, pyzmq, msgspec, httpx,
# prometheus-client, openai and their dependencies, from `pip download --only-binary=:all:
# --python-version 3.12 ...`; they are installed first. Under 8 minutes in all.
set -uo pipefail
out=${1:-/tmp/minivllm-out}
mkdir -p "$out"
export PYTHONPATH=. PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --find-links .whl \
    fastapi uvicorn pyzmq msgspec prometheus-client httpx openai 2>&1 | tail -n 3
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
python3 -c "import torch, triton, transformers, fastapi, uvicorn, zmq, msgspec, httpx; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, 'fastapi', fastapi.__version__, 'uvicorn', uvicorn.__version__)" | tee -a "$out/gpu.txt"
# The random-weight Qwen3-0.6B shape of the other GPU benchmarks, made once, up front.
ckpt=/tmp/minivllm-bench/qwen3-0.6b-random
python3 -c "from pathlib import Path; from minivllm.benchmarks.common import make_random_checkpoint as m; m(Path('$ckpt'))"
# SIGINT on timeout: the benchmark then stops the server it started (no orphan on the GPU).
bench() {
  timeout -s INT -k 30 "$1" python3 -m minivllm.cli bench serve --model "$ckpt" "${@:2}" 2>&1 \
    | grep -v Warning | tail -n 6
}
# Saturation: all 256 requests of the throughput workload at once, against offline
# LLM.generate on the same requests in the same run (one full warm-up pass each).
bench 300 --compare-offline --request-rate inf --num-warmups 256 --output "$out/serve.json"
# Latency at 1, 4 and 16 requests/s (Poisson arrivals), 48 requests per rate.
bench 200 --launch-server --request-rates 1,4,16 --num-prompts 48 --num-warmups 32 \
  --output "$out/serve_sweep.json"
python3 -m minivllm.benchmarks.serve_plot "$out/serve_sweep.json" --compare "$out/serve.json" \
  --output "$out/serve.png"
tail -n 5 "$out"/serve*_server.log
