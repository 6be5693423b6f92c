source scratch_gpu/s21/common.sh
rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1
# 1. the one-launch sampler on the GPU: the sampler tests (chi-square, greedy = argmax, tilings), the warm-up
timeout 130 python3 -m pytest -q -p no:cacheprovider tests/sample/test_gumbel.py tests/sample/test_sampler.py tests/sample/test_rejection_sampler.py tests/worker/test_kernel_warmup.py > $R/gpu_tests.log 2>&1; echo "rc=$?" >> $R/gpu_tests.log
tail -4 $R/gpu_tests.log | cut -c1-300; pack
# 2. the host's phases with it
timeout 110 python3 -m minivllm.cli bench host --engine --batch-sizes 1 256 --steps 200 --prompt-len 512 --output $R/host_engine.json > $R/host_engine.log 2>&1; echo "rc=$?" >> $R/host_engine.log
grep "batch\|rc=" $R/host_engine.log | cut -c1-300; pack
