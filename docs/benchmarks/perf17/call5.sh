# Call 5: HEAD (cd9560c; no minivllm/ change since 59be1ff) cold: item 2 on this session's lease
source scratch_gpu/s23/common.sh
rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1
timeout 330 python3 -m minivllm.cli bench throughput --cold --output $R/throughput_cold.json > $R/throughput_cold.log 2>&1; echo "rc=$?" >> $R/throughput_cold.log
grep -v "INFO\|Writing" $R/throughput_cold.log | tail -6
pack
