source scratch_gpu/s21/common.sh
rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1
# 1. GPU tests: graphs vs eager (every decode step now reads its logits rows unsliced), the engine
timeout 250 python3 -m pytest -q -p no:cacheprovider -m gpu tests/worker/test_cuda_graph.py tests/engine/test_llm_engine_gpu.py > $R/gpu_tests.log 2>&1; echo "rc=$?" >> $R/gpu_tests.log
tail -6 $R/gpu_tests.log | cut -c1-300; pack
# 2. as a new user meets it: empty Triton cache, fresh processes
timeout 240 python3 -m minivllm.cli bench throughput --cold --output $R/throughput_cold.json > $R/throughput_cold.log 2>&1; echo "rc=$?" >> $R/throughput_cold.log
grep -v "INFO\|Writing" $R/throughput_cold.log | tail -5; pack
