# Call 2: HEAD 43f3f61: item 2 cold on this lease, then serving at saturation against offline
source scratch_gpu/s24/common.sh
rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1
python3 -c "import torch, triton, transformers, fastapi, uvicorn, zmq, msgspec; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, 'fastapi', fastapi.__version__, 'uvicorn', uvicorn.__version__)" >> $R/gpu.txt 2>&1
s=$SECONDS; timeout 300 python3 -m minivllm.cli bench throughput --cold --output $R/throughput_cold.json > $R/throughput_cold.log 2>&1; echo "rc=$? wall=$((SECONDS-s))" >> $R/throughput_cold.log
grep -v "INFO\|Writing" $R/throughput_cold.log | tail -n 5
ckpt=/tmp/minivllm-bench/qwen3-0.6b-random
python3 -c "from pathlib import Path; from minivllm.benchmarks.common import make_random_checkpoint as m; m(Path('$ckpt'))"
left=$((575 - SECONDS)); echo "left for serve: $left"
s=$SECONDS; timeout -s INT -k 20 $left python3 -m minivllm.cli bench serve --model $ckpt --compare-offline --request-rate inf --num-warmups 256 --output $R/serve.json > $R/serve.log 2>&1; echo "rc=$? wall=$((SECONDS-s))" >> $R/serve.log
grep -v "INFO\|Warning" $R/serve.log | tail -n 6
pack
