source scratch_gpu/s21/common.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1
git log -1 --format=%H > $R/code.txt 2>/dev/null; git diff --stat >> $R/code.txt 2>/dev/null
timeout 400 python3 scratch_gpu/s21/exec_host.py $R/exec_host.json 8,64,256 > $R/exec_host.log 2>&1
tail -60 $R/exec_host.log
pack
