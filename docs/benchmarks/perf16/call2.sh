# Call 2: the fold (working tree of session 22): its tests on the GPU, then the whole run side by side
source scratch_gpu/s22/common.sh
rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1
# 1. the fold's tests, graphs vs eager and the engine on the GPU
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/attention/test_triton_attn_qk_norm_rope.py tests/model_executor/test_qk_norm_rope.py tests/attention/test_triton_attn.py > $R/gpu_tests_fold.log 2>&1; echo "rc=$?" >> $R/gpu_tests_fold.log
tail -4 $R/gpu_tests_fold.log | cut -c1-300; pack
timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/worker/test_cuda_graph.py tests/engine/test_llm_engine_gpu.py > $R/gpu_tests.log 2>&1; echo "rc=$?" >> $R/gpu_tests.log
tail -4 $R/gpu_tests.log | cut -c1-300; pack
# 2. side by side, alternating processes (the first compiles)
i=0
for side in fold nofold fold nofold; do
  i=$((i+1))
  timeout 110 python3 scratch_gpu/s22/fold_ab.py $R/ab_${i}_${side}.json $side > $R/ab_${i}_${side}.log 2>&1
  echo "== $i $side rc=$? $(date +%T)"; grep "^$side seconds" $R/ab_${i}_${side}.log
  pack
done
