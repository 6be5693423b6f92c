# Call 1: HEAD (59be1ff, snapshot in scratch_gpu/s22/head) before the fold: item 1 with the one-launch sampler
source scratch_gpu/s22/common.sh
rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1
H=$PWD/scratch_gpu/s22/head
# 1. as a new user meets it: empty Triton cache, fresh processes
(cd $H && PYTHONPATH=$H:/tmp/site timeout 250 python3 -m minivllm.cli bench throughput --cold --output $R/throughput_cold.json > $R/throughput_cold.log 2>&1; echo "rc=$?" >> $R/throughput_cold.log)
grep -v "INFO\|Writing" $R/throughput_cold.log | tail -5; pack
# 2. the warm-up tests (cut off in session 21's call 5) and the engine's GPU tests
(cd $H && PYTHONPATH=$H:/tmp/site timeout 200 python3 -m pytest -q -p no:cacheprovider tests/worker/test_kernel_warmup.py tests/engine/test_llm_engine_gpu.py > $R/gpu_tests.log 2>&1; echo "rc=$?" >> $R/gpu_tests.log)
tail -6 $R/gpu_tests.log | cut -c1-300; pack
