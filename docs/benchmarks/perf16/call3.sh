# Call 3: the fold with the own key first (session 22 working tree): registers, cold run, the whole run side by side, tests
source scratch_gpu/s22/common.sh
rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1
# 1. what the compiler makes of the decode variant with and without the prologue (triton 3.6, sm_90)
for flag in --ordered --qk-norm-rope; do
  timeout 60 python3 -m minivllm.benchmarks.kernel_inspect --config 16,64,4,2,1 --config 16,64,4,2,2 --config 16,64,4,2,8,1 $flag --output $R/inspect${flag#--}.json 2>&1 | grep regs
done
# the first placement (call 2: the own key folded in after the cached tiles)
(cd scratch_gpu/s22/after_loop && PYTHONPATH=$PWD:/tmp/site timeout 60 python3 -m minivllm.benchmarks.kernel_inspect --config 16,64,4,2,1 --config 16,64,4,2,2 --config 16,64,4,2,8,1 --qk-norm-rope --output $R/inspect_after_loop.json 2>&1 | grep regs)
pack
# 2. as a new user meets it: empty Triton cache, fresh processes
timeout 200 python3 -m minivllm.cli bench throughput --cold --output $R/throughput_cold.json > $R/throughput_cold.log 2>&1; echo "rc=$?" >> $R/throughput_cold.log
grep -v "INFO\|Writing" $R/throughput_cold.log | tail -3; pack
# 3. side by side, alternating processes (the first compiles)
i=0
for side in fold nofold fold nofold; do
  i=$((i+1))
  t=60; [ $i = 1 ] && t=150
  timeout $t python3 scratch_gpu/s22/fold_ab.py $R/ab_${i}_${side}.json $side > $R/ab_${i}_${side}.log 2>&1
  echo "== $i $side rc=$? $(date +%T)"; grep "^$side seconds" $R/ab_${i}_${side}.log
  pack
done
# 4. the fold's tests on the GPU
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/attention/test_triton_attn_qk_norm_rope.py tests/attention/test_layer.py > $R/gpu_tests_fold.log 2>&1; echo "rc=$?" >> $R/gpu_tests_fold.log
tail -3 $R/gpu_tests_fold.log | cut -c1-300; pack
