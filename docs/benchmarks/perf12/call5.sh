source scratch_gpu/s18/common.sh
timeout 280 python3 -m minivllm.cli bench throughput --cold --output $OUT/r/throughput_cold.json > $OUT/r/throughput_cold.log 2>&1; echo "rc=$?" >> $OUT/r/throughput_cold.log
grep -v "INFO\|Writing" $OUT/r/throughput_cold.log | tail -8
