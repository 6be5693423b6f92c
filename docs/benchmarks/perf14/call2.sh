source scratch_gpu/s20/common.sh
git log --oneline -1 > $R/code.txt 2>&1; git diff --stat >> $R/code.txt 2>&1
# 1. a real mixed step's attention: eager split vs the graph's padded launch
timeout 200 python3 scratch_gpu/s20/real_step_attn.py $R/real_step_attn.json > $R/real_step_attn.log 2>&1; echo "rc=$?" >> $R/real_step_attn.log
tail -16 $R/real_step_attn.log | cut -c1-300; pack
# 2. the graphs' pool in the KV sizing: uncounted (parent) vs counted (this code), alternating
i=0
for v in uncounted counted uncounted counted; do
  i=$((i+1))
  timeout 110 python3 scratch_gpu/s20/graph_budget.py $v --output $R/tp_${i}_${v}.json > $R/tp_${i}_${v}.log 2>&1
  echo "== $i $v rc=$? $(date +%T)"; grep "roofline\|start-up" $R/tp_${i}_${v}.log | tail -2
  pack
done
# 3. GPU tests of the runner's start (every GPU engine test builds one)
timeout 250 python3 -m pytest -q -p no:cacheprovider -m gpu tests/worker tests/engine > $R/gpu_tests.log 2>&1; echo "rc=$?" >> $R/gpu_tests.log
tail -15 $R/gpu_tests.log | cut -c1-300; pack
