# Call 2: fused gate/up: sweep again up to 96 rows (row blocks to the next power of two), then
# end-to-end A/B at the limit where it wins: small fixed batches and the whole workload
source scratch_gpu/s26/common.sh
rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> $R/gpu.txt 2>&1
git log --oneline -1 >> $R/gpu.txt; git status --short >> $R/gpu.txt
cat $R/gpu.txt
s=$SECONDS; timeout 150 python3 -m minivllm.benchmarks.kernel_gate_up --sweep --batches 3 4 8 16 24 32 48 64 80 96 128 --budget-s 90 --compile-workers 14 --output $R/kernel_gate_up.json > $R/kernel_gate_up.log 2>&1; echo "rc=$? wall=$((SECONDS-s))" >> $R/kernel_gate_up.log
grep -v Warning $R/kernel_gate_up.log | tail -n 3
python3 scratch_gpu/s26/table2.py $R/kernel_gate_up.json $R/table.json $R/limit.txt > $R/table.log 2>&1; cat $R/table.log
LIMIT=$(cat $R/limit.txt)
pack
run() {  # run <tag> <arm> <args...>
  tag=$1; arm=$2; shift 2
  left=$((545 - SECONDS)); echo "$tag $arm: $left s left"
  if [ $left -lt 60 ]; then return 1; fi
  if [ $arm = on ]; then export MINIVLLM_GATE_UP_SILU_MAX_M=$LIMIT MINI_GATE_UP_TABLE=$R/table.json PYTHONPATH=$PWD/scratch_gpu/s26/site:$PWD:/tmp/site;
  else export MINIVLLM_GATE_UP_SILU_MAX_M=0; unset MINI_GATE_UP_TABLE; export PYTHONPATH=$PWD:/tmp/site; fi
  s=$SECONDS; timeout $((left - 5)) python3 -m minivllm.cli bench throughput "$@" --output $R/${tag}_$arm.json > $R/${tag}_$arm.log 2>&1; echo "rc=$? wall=$((SECONDS-s))" >> $R/${tag}_$arm.log
  python3 -c "
import json; d=json.load(open('$R/${tag}_$arm.json')); m=d['minivllm']
print('$tag $arm', 'greedy %.4f s' % m['seconds'], 'T0.6 %.4f s' % m['sampled']['seconds'], 'repeats', [round(r['seconds'], 4) for r in d['repeats']['runs']], 'startup %.1f' % m['startup_s'])
" 2>&1 | tail -1
  pack
}
SMALL16="--num-requests 16 --input-len-range 128 128 --output-len-range 1024 1024 --repeats 4"
SMALL48="--num-requests 48 --input-len-range 128 128 --output-len-range 1024 1024 --repeats 4"
run b16_1 off $SMALL16; run b16_1 on $SMALL16
run full_1 off --repeats 2; run full_1 on --repeats 2
run b48_1 off $SMALL48; run b48_1 on $SMALL48
run b16_2 off $SMALL16; run b16_2 on $SMALL16
pack
