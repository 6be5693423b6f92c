source scratch_gpu/s19/common.sh
git log --oneline -1 > $R/code.txt; git diff --stat >> $R/code.txt
timeout 50 python3 scratch_gpu/s19/pad_seqs.py $R/pad_seqs.json > $R/pad_seqs.log 2>&1; tail -14 $R/pad_seqs.log; pack
timeout 170 python3 -m minivllm.cli bench throughput --cold --output $R/throughput_cold.json > $R/throughput_cold.log 2>&1; echo "rc=$?" >> $R/throughput_cold.log
grep -v "INFO\|Writing" $R/throughput_cold.log | tail -4; pack
timeout 260 python3 -m pytest -q -p no:cacheprovider -m gpu tests/worker tests/engine > $R/gpu_tests.log 2>&1; echo "rc=$?" >> $R/gpu_tests.log
tail -3 $R/gpu_tests.log; pack
