# Call 3: the committed code (fused gate/up up to 64 rows by default, the swept table): cold
# throughput run, GPU tests, batch-16 A/B against MINIVLLM_GATE_UP_SILU_MAX_M=0, whole workload A/B
source scratch_gpu/s26/common.sh
rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> $R/gpu.txt 2>&1
git log --oneline -1 >> $R/gpu.txt; git status --short >> $R/gpu.txt
cat $R/gpu.txt
s=$SECONDS; timeout 240 python3 -m minivllm.cli bench throughput --cold --output $R/throughput_cold.json > $R/throughput_cold.log 2>&1; echo "rc=$? wall=$((SECONDS-s))" >> $R/throughput_cold.log
grep -v "INFO\|Writing" $R/throughput_cold.log | tail -n 8
pack
s=$SECONDS; timeout 120 python3 -m pytest -q -m gpu tests/model_executor/test_gate_up_silu.py tests/engine/test_llm_engine_gpu.py > $R/gpu_tests.log 2>&1; echo "rc=$? wall=$((SECONDS-s))" >> $R/gpu_tests.log
tail -n 3 $R/gpu_tests.log
pack
run() {  # run <tag> <arm> <args...>; arm "on" is the default, "off" sets the limit to 0
  tag=$1; arm=$2; shift 2
  left=$((548 - SECONDS)); echo "$tag $arm: $left s left"
  if [ $left -lt 50 ]; then return 1; fi
  if [ $arm = on ]; then unset MINIVLLM_GATE_UP_SILU_MAX_M; else export MINIVLLM_GATE_UP_SILU_MAX_M=0; fi
  s=$SECONDS; timeout $((left - 5)) python3 -m minivllm.cli bench throughput "$@" --output $R/${tag}_$arm.json > $R/${tag}_$arm.log 2>&1; echo "rc=$? wall=$((SECONDS-s))" >> $R/${tag}_$arm.log
  python3 -c "
import json; d=json.load(open('$R/${tag}_$arm.json')); m=d['minivllm']
print('$tag $arm', 'greedy %.4f s' % m['seconds'], 'T0.6 %.4f s' % m['sampled']['seconds'], 'repeats', [round(r['seconds'], 4) for r in d['repeats']['runs']], 'startup %.1f' % m['startup_s'])
" 2>&1 | tail -1
  pack
}
SMALL16="--num-requests 16 --input-len-range 128 128 --output-len-range 1024 1024 --repeats 4"
run b16_1 on $SMALL16; run b16_1 off $SMALL16
run full_1 on --repeats 2; run full_1 off --repeats 2
run b16_2 on $SMALL16; run b16_2 off $SMALL16
pack
