# Call 3: HEAD 43f3f61: serving at saturation against offline (call 2's try lacked the
# opentelemetry-api wheel fastapi 0.165 imports); the GPU's clocks and power under load
source scratch_gpu/s24/common.sh
rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total,driver_version,vbios_version,power.limit,clocks.max.sm,clocks.max.mem --format=csv > $R/gpu.txt 2>&1
nvidia-smi -q -d CLOCK,POWER,PERFORMANCE,ECC > $R/smi_q.txt 2>&1
python3 -c "import torch, triton, transformers, fastapi, uvicorn, zmq, msgspec; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, 'fastapi', fastapi.__version__, 'uvicorn', uvicorn.__version__)" >> $R/gpu.txt 2>&1
python3 -c "from minivllm.benchmarks.common import measure_copy_bandwidth as m; print('copy_bandwidth_bytes_per_s', m())" >> $R/gpu.txt 2>&1
ckpt=/tmp/minivllm-bench/qwen3-0.6b-random
python3 -c "from pathlib import Path; from minivllm.benchmarks.common import make_random_checkpoint as m; m(Path('$ckpt'))"
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu --format=csv -lms 250 > $R/clocks.csv 2>&1 &
smi=$!
s=$SECONDS; timeout -s INT -k 20 420 python3 -m minivllm.cli bench serve --model $ckpt --compare-offline --request-rate inf --num-warmups 256 --output $R/serve.json > $R/serve.log 2>&1; echo "rc=$? wall=$((SECONDS-s))" >> $R/serve.log
kill $smi
grep -v "INFO\|Warning" $R/serve.log | tail -n 8
cp /tmp/minivllm-bench/*.log $R/ 2>/dev/null
pack
