# Call 4: HEAD 43f3f61: call 3's serving comparison again, with every Python process's
# threads sampled every 5 ms (sampler/sitecustomize.py): where the served run's time goes
source scratch_gpu/s24/common.sh
rm -rf $R; mkdir -p $R/stacks_offline $R/stacks_serve
ckpt=/tmp/minivllm-bench/qwen3-0.6b-random
python3 -c "from pathlib import Path; from minivllm.benchmarks.common import make_random_checkpoint as m; m(Path('$ckpt'))" > /dev/null 2>&1
s=$SECONDS
MINI_STACKS=$R/stacks_serve PYTHONPATH=$PWD/scratch_gpu/s24/sampler:$PYTHONPATH timeout -s INT -k 20 400 python3 -m minivllm.cli bench serve --model $ckpt --compare-offline --request-rate inf --num-warmups 256 --output $R/serve.json > $R/serve.log 2>&1; echo "rc=$? wall=$((SECONDS-s))" >> $R/serve.log
grep -v "INFO\|Warning" $R/serve.log | tail -n 6
ls $R/stacks_serve | head
pack
