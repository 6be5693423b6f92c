source scratch_gpu/s20/common.sh
git log --oneline -1 > $R/code.txt 2>&1; git diff --stat >> $R/code.txt 2>&1
timeout 230 python3 -m minivllm.cli bench throughput --cold --output $R/throughput_cold.json > $R/throughput_cold.log 2>&1; echo "rc=$?" >> $R/throughput_cold.log
grep -v "INFO\|Writing" $R/throughput_cold.log | tail -4; grep -h "memory profile" $R/throughput_cold.log | cut -c1-300 | tail -1; pack
