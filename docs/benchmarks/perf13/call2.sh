source scratch_gpu/s19/common.sh
git log --oneline -1 > $R/code.txt; git diff --stat >> $R/code.txt; nproc >> $R/code.txt
# 1. prompt steps: eager (graphs stop at 2,048 tokens) vs graphs up to the budget with the
#    decode split inside, alternating
i=0
for v in 2048 budget 2048 budget; do
  i=$((i+1))
  timeout 140 python3 scratch_gpu/s19/prefill_graphs.py $v $R/side_${i}_${v}.json -- --step-timeline --output $R/st_${i}_${v}.json > $R/st_${i}_${v}.log 2>&1
  echo "== $i $v rc=$? $(date +%T)"; grep -v "INFO\|Writing\|Warn\|warn" $R/st_${i}_${v}.log | grep "tok/s\|mixed" | tail -2
  grep -h "startup\|device_used" $R/side_${i}_${v}.json | tr -d '\n'; echo
  pack
done
# 2. cold, as a user meets it (fresh process, empty Triton cache), this code
timeout 250 python3 -m minivllm.cli bench throughput --cold --output $R/throughput_cold.json > $R/throughput_cold.log 2>&1; echo "rc=$?" >> $R/throughput_cold.log
grep -v "INFO\|Writing" $R/throughput_cold.log | tail -6
pack
