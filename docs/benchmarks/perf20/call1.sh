# Call 1: fused gate/up + SiLU-and-mul: GPU tests, tile sweep, end-to-end A/B (warm cache)
source scratch_gpu/s26/common.sh
rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> $R/gpu.txt 2>&1
git log --oneline -1 >> $R/gpu.txt; git status --short >> $R/gpu.txt
cat $R/gpu.txt
s=$SECONDS; timeout 150 python3 -m pytest -q -m gpu -x tests/model_executor/test_gate_up_silu.py tests/engine/test_llm_engine_gpu.py > $R/gpu_tests.log 2>&1; echo "rc=$? wall=$((SECONDS-s))" >> $R/gpu_tests.log
tail -n 4 $R/gpu_tests.log
s=$SECONDS; timeout 170 python3 -m minivllm.benchmarks.kernel_gate_up --sweep --budget-s 110 --compile-workers 14 --output $R/kernel_gate_up.json > $R/kernel_gate_up.log 2>&1; echo "rc=$? wall=$((SECONDS-s))" >> $R/kernel_gate_up.log
grep -v Warning $R/kernel_gate_up.log | tail -n 16
python3 scratch_gpu/s26/table.py $R/kernel_gate_up.json $R/table.json > $R/table.log 2>&1; cat $R/table.log
pack
i=0
for arm in off on off on; do
  i=$((i+1)); left=$((540 - SECONDS)); echo "run $i $arm: $left s left"
  if [ $left -lt 75 ]; then break; fi
  if [ $arm = on ]; then export MINIVLLM_GATE_UP_SILU_MAX_M=256 MINI_GATE_UP_TABLE=$R/table.json PYTHONPATH=$PWD/scratch_gpu/s26/site:$PWD:/tmp/site;
  else export MINIVLLM_GATE_UP_SILU_MAX_M=0; unset MINI_GATE_UP_TABLE; export PYTHONPATH=$PWD:/tmp/site; fi
  s=$SECONDS; timeout $((left - 10)) python3 -m minivllm.cli bench throughput --repeats 2 --output $R/tp_${i}_$arm.json > $R/tp_${i}_$arm.log 2>&1; echo "rc=$? wall=$((SECONDS-s))" >> $R/tp_${i}_$arm.log
  python3 -c "
import json; d=json.load(open('$R/tp_${i}_$arm.json')); m=d['minivllm']
print('$arm', 'greedy %.3f s %.1f%%' % (m['seconds'], 100*m['fraction_of_roofline']), 'T0.6 %.3f s %.1f%%' % (m['sampled']['seconds'], 100*m['sampled']['fraction_of_roofline']), 'repeats', [(round(r['seconds'], 3), round(100*r['fraction_of_roofline'], 1)) for r in d['repeats']['runs']])
" 2>&1 | tail -2
  pack
done
pack
