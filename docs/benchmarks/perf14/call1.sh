source scratch_gpu/s20/common.sh
git log --oneline -1 > $R/code.txt 2>&1; git diff --stat >> $R/code.txt 2>&1; nproc >> $R/code.txt
# 1. a real mixed step's attention: eager split vs the graph's padded launch (cold Triton cache)
timeout 200 python3 scratch_gpu/s20/real_step_attn.py $R/real_step_attn.json > $R/real_step_attn.log 2>&1; echo "rc=$?" >> $R/real_step_attn.log
tail -16 $R/real_step_attn.log | cut -c1-300; pack
# 2. cached blocks after capture: keep (parent) vs release (this code), alternating
i=0
for v in keep release keep release; do
  i=$((i+1))
  timeout 100 python3 scratch_gpu/s20/release.py $v --output $R/tp_${i}_${v}.json > $R/tp_${i}_${v}.log 2>&1
  echo "== $i $v rc=$? $(date +%T)"; grep "roofline\|start-up" $R/tp_${i}_${v}.log | tail -2
  pack
done
# 3. this code's graph tests on the GPU
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/worker/test_cuda_graph.py > $R/gpu_tests.log 2>&1; echo "rc=$?" >> $R/gpu_tests.log
tail -15 $R/gpu_tests.log | cut -c1-300; pack
