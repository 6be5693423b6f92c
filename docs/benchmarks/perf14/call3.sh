source scratch_gpu/s20/common.sh
git log --oneline -1 > $R/code.txt 2>&1; git diff --stat >> $R/code.txt 2>&1
# 1. item 1 with the graphs profiled at start-up: fresh process, empty Triton cache
timeout 220 python3 -m minivllm.cli bench throughput --cold --output $R/throughput_cold.json > $R/throughput_cold.log 2>&1; echo "rc=$?" >> $R/throughput_cold.log
grep -v "INFO\|Writing" $R/throughput_cold.log | tail -4; grep -h "memory profile" $R/throughput_cold.log | cut -c1-300 | tail -2; pack
# 2. the graph tests and the draft model's (its graphs are profiled too)
timeout 220 python3 -m pytest -q -p no:cacheprovider -m gpu tests/worker/test_cuda_graph.py tests/spec_decode > $R/gpu_tests.log 2>&1; echo "rc=$?" >> $R/gpu_tests.log
tail -15 $R/gpu_tests.log | cut -c1-300; pack
