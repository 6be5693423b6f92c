source scratch_gpu/s18/common.sh
timeout 400 python3 -m pytest -q -p no:cacheprovider -m gpu tests/attention tests/model_executor tests/worker tests/engine tests/sample > $OUT/r/gpu_tests.log 2>&1; echo "rc=$?" >> $OUT/r/gpu_tests.log
tail -4 $OUT/r/gpu_tests.log
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/attention/test_triton_attn.py tests/model_executor/test_custom_ops.py > $OUT/r/gpu_tests_ops.log 2>&1; echo "rc=$?" >> $OUT/r/gpu_tests_ops.log
tail -4 $OUT/r/gpu_tests_ops.log
