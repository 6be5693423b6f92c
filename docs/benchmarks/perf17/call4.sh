source scratch_gpu/s23/common.sh
rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1
timeout 260 python3 scratch_gpu/s23/pdl.py $R/pdl.json > $R/pdl.log 2>&1; echo "rc=$?" >> $R/pdl.log
grep -E "^(256|128|64|16|1) |rc=|Error|error" $R/pdl.log | cut -c1-400
timeout 200 python3 -m pytest -q -x -m gpu tests/worker/test_kernel_warmup.py -k eager -p no:cacheprovider > $R/warmup_test_eager.log 2>&1; echo "rc=$?" >> $R/warmup_test_eager.log
tail -4 $R/warmup_test_eager.log
pack
