# Call 1: HEAD 43f3f61 (no minivllm/ change since 59be1ff): the headline benchmarks again
# (the commands of minivllm/benchmarks/run_engine_gpu.sh, without its GPU tests), then bench kernel
source scratch_gpu/s24/common.sh
rm -rf $R; mkdir -p $R/prof
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" >> $R/gpu.txt 2>&1
b() { name=$1; lim=$2; shift 2; s=$SECONDS; timeout $lim python3 -m minivllm.cli bench "$@" > $R/$name.log 2>&1; echo "rc=$? wall=$((SECONDS-s))" >> $R/$name.log; echo "$name: $(tail -n 1 $R/$name.log)"; }
b host 90 host --output $R/host.json
b throughput 240 throughput --compare-sync --profile-dir $R/prof --output $R/throughput.json
b latency 100 latency --output $R/latency.json --profile-dir $R/prof
b prefix 100 prefix --output $R/prefix.json
left=$((560 - SECONDS)); echo "left for kernel: $left"
if [ $left -gt 60 ]; then b kernel $((left - 15)) kernel --output-dir $R/kernel; fi
find $R -name '*trace*' -size +5M -delete
ls -la $R $R/prof $R/kernel 2>/dev/null | head -40
pack
