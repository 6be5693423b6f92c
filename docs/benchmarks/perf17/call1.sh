source scratch_gpu/s23/common.sh
rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1
timeout 420 python3 scratch_gpu/s23/dual.py $R/dual.json > $R/dual.log 2>&1; echo "rc=$?" >> $R/dual.log
tail -30 $R/dual.log
pack
