# Call 6: HEAD (c6047e9; no minivllm/ change since 59be1ff): the graph and engine GPU tests
source scratch_gpu/s23/common.sh
rm -rf $R; mkdir -p $R
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/worker/test_cuda_graph.py tests/engine/test_llm_engine_gpu.py > $R/gpu_tests.log 2>&1; echo "rc=$?" >> $R/gpu_tests.log
tail -4 $R/gpu_tests.log | cut -c1-300
pack
