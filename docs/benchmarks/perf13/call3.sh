source scratch_gpu/s19/common.sh
git log --oneline -1 > $R/code.txt; git diff --stat >> $R/code.txt
timeout 60 python3 scratch_gpu/s19/pad_seqs.py $R/pad_seqs.json > $R/pad_seqs.log 2>&1; tail -14 $R/pad_seqs.log; pack
timeout 380 python3 -m pytest -q -p no:cacheprovider -m gpu tests/attention tests/model_executor tests/worker tests/engine tests/sample > $R/gpu_tests.log 2>&1; echo "rc=$?" >> $R/gpu_tests.log
tail -4 $R/gpu_tests.log; pack
timeout 130 python3 -m pytest -q -p no:cacheprovider tests/attention/test_triton_attn.py tests/model_executor/test_custom_ops.py > $R/gpu_tests_ops.log 2>&1; echo "rc=$?" >> $R/gpu_tests_ops.log
tail -4 $R/gpu_tests_ops.log; pack
