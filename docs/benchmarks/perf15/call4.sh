source scratch_gpu/s21/common.sh
rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1
i=0
for side in kept skipped kept skipped; do
  i=$((i+1))
  timeout 150 python3 scratch_gpu/s21/skip_qknorm.py $R/sq_${i}_${side}.json $side > $R/sq_${i}_${side}.log 2>&1
  echo "== $i $side rc=$? $(date +%T)"; grep "^$side seconds" $R/sq_${i}_${side}.log
  pack
done
