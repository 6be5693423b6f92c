source scratch_gpu/s23/common.sh
rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1
i=0
for v in auto off deferred auto off deferred; do
  i=$((i+1))
  timeout 150 python3 scratch_gpu/s23/gc_ab.py $R/gc_${i}_$v.json $v > $R/gc_${i}_$v.log 2>&1
  echo "rc=$?" >> $R/gc_${i}_$v.log; grep -E "^(auto|off|deferred) " $R/gc_${i}_$v.log
done
timeout 230 python3 -m pytest -q -x -m gpu tests/worker/test_kernel_warmup.py -k graphs -p no:cacheprovider > $R/warmup_test.log 2>&1; echo "rc=$?" >> $R/warmup_test.log
tail -5 $R/warmup_test.log
pack
