#!/usr/bin/env bash
# One GPU session for the paged-attention kernels: native kernel tests, the tile sweep
# and `minivllm bench kernel`. Run from the repository root; writes logs and results to
# $OUT (default ./.device-out). Each stage has its own time limit so that a slow one
# cannot take the others' results with it.
set -o pipefail
OUT=${OUT:-.device-out}
mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' \
  | tee -a "$OUT/gpu.txt"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout "${TEST_S:-180}" python3 -m pytest tests/attention -q -rs 2>&1 | tee "$OUT/tests.log"
fi
if [ "${SKIP_SWEEP:-0}" != 1 ]; then
  timeout "${SWEEP_S:-200}" python3 -m minivllm.benchmarks.kernel_sweep "$OUT/sweep.json" \
    2>&1 | tee "$OUT/sweep.log"
fi
timeout "${BENCH_S:-240}" python3 -m minivllm.benchmarks.kernel --output-dir "$OUT" 2>&1 \
  | tee "$OUT/bench.log"
