source scratch_gpu/s18/common.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 scratch_gpu/s18/marker_check.py 2>&1 | tail -5
timeout 330 python3 -m minivllm.cli bench throughput --step-timeline --output $OUT/r/step_timeline.json > $OUT/r/step_timeline.log 2>&1; echo "rc=$?" >> $OUT/r/step_timeline.log
grep -v "INFO\|Writing" $OUT/r/step_timeline.log | tail -12
