source scratch_gpu/s19/common.sh
git log --oneline -1 > $R/code.txt; git diff --stat >> $R/code.txt; nproc >> $R/code.txt
# 1. prompt steps: eager (2048) vs graphs up to the budget (16384), alternating
i=0
for cap in 2048 16384 2048 16384; do
  i=$((i+1))
  timeout 150 python3 scratch_gpu/s19/prefill_graphs.py $cap $R/side_${i}_${cap}.json -- --step-timeline --output $R/st_${i}_${cap}.json > $R/st_${i}_${cap}.log 2>&1
  echo "== $i $cap rc=$? $(date +%T)"; grep -v "INFO\|Writing\|Warn\|warn" $R/st_${i}_${cap}.log | grep "mixed\|roofline" | tail -2
  grep -h "startup\|device_used" $R/side_${i}_${cap}.json | tr -d '\n'; echo
  pack
done
# 2. occupancy of the decode attention variants (batch-132 hypothesis: 2 per SM)
timeout 60 python3 scratch_gpu/s19/occupancy.py $R/occupancy.json > $R/occupancy.log 2>&1; tail -12 $R/occupancy.log | cut -c1-400
pack
