source scratch_gpu/s21/common.sh
rm -rf $R/*; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1
OLD=$PWD/scratch_gpu/s21/old
# 1. the host's share of a decode step, parent (old) vs this code (new), alternating processes
i=0
for side in old new old new; do
  i=$((i+1))
  if [ $side = old ]; then PP=$OLD:/tmp/site; else PP=$PWD:/tmp/site; fi
  PYTHONPATH=$PP timeout 120 python3 scratch_gpu/s21/ab_host.py $R/ab_${i}_${side}.json $side > $R/ab_${i}_${side}.log 2>&1
  echo "== $i $side rc=$? $(date +%T)"; grep "^$side batch" $R/ab_${i}_${side}.log | cut -c1-260
  pack
done
# 2. the committed benchmark at this code
timeout 100 python3 -m minivllm.cli bench host --engine --batch-sizes 1 8 64 128 256 --steps 200 --prompt-len 512 --output $R/host_engine.json > $R/host_engine.log 2>&1; echo "rc=$?" >> $R/host_engine.log
grep "batch" $R/host_engine.log | cut -c1-260; pack
# 3. GPU tests: graphs vs eager (decode logits rows), samplers, engine
timeout 260 python3 -m pytest -q -p no:cacheprovider -m gpu tests/worker tests/engine tests/sample > $R/gpu_tests.log 2>&1; echo "rc=$?" >> $R/gpu_tests.log
tail -15 $R/gpu_tests.log | cut -c1-300; pack
