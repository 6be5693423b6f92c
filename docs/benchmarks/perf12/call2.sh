source scratch_gpu/s18/common.sh
R=$PWD
timeout 200 python3 scratch_gpu/s18/eager_host.py $OUT/r/eager_host.json > $OUT/r/eager_host.log 2>&1; echo "rc=$?" >> $OUT/r/eager_host.log
grep -v "INFO\|Writing" $OUT/r/eager_host.log | tail -12
(cd scratch_gpu/s18/old && PYTHONPATH=$PWD:/tmp/site timeout 150 python3 $R/scratch_gpu/s18/eager_host.py $OUT/r/eager_host_old.json > $OUT/r/eager_host_old.log 2>&1; echo "rc=$?" >> $OUT/r/eager_host_old.log)
grep -v "INFO\|Writing" $OUT/r/eager_host_old.log | tail -12
timeout 170 python3 -m minivllm.cli bench throughput --step-timeline --output $OUT/r/step_timeline_new.json > $OUT/r/step_timeline_new.log 2>&1; echo "rc=$?" >> $OUT/r/step_timeline_new.log
grep -v "INFO\|Writing" $OUT/r/step_timeline_new.log | tail -6
(cd scratch_gpu/s18/old && PYTHONPATH=$PWD:/tmp/site timeout 170 python3 -m minivllm.cli bench throughput --step-timeline --output $OUT/r/step_timeline_old.json > $OUT/r/step_timeline_old.log 2>&1; echo "rc=$?" >> $OUT/r/step_timeline_old.log)
grep -v "INFO\|Writing" $OUT/r/step_timeline_old.log | tail -6
