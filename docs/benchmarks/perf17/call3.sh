source scratch_gpu/s23/common.sh
rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1
timeout 200 python3 scratch_gpu/s23/pdl.py $R/pdl.json > $R/pdl.log 2>&1; echo "rc=$?" >> $R/pdl.log
grep -E "^(256|128|64|16|1) |rc=|Error|error" $R/pdl.log | cut -c1-600
i=0
for s in 2 0 2 0; do
  i=$((i+1))
  timeout 90 python3 scratch_gpu/s23/pdl_ab.py $R/ab_${i}_$s.json $s > $R/ab_${i}_$s.log 2>&1
  echo "rc=$?" >> $R/ab_${i}_$s.log; grep -E "^pdl |rc=" $R/ab_${i}_$s.log
done
pack
