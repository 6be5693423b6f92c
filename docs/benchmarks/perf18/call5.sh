# Call 5: the working tree with --stream-interval (upstream's SchedulerConfig.stream_interval):
# serving at saturation with one chunk per token against one per four, on one lease, and
# the CPU seconds of every serving process (ps every 2 s)
source scratch_gpu/s24/common.sh
rm -rf $R; mkdir -p $R
python3 -c "from minivllm.benchmarks.common import measure_copy_bandwidth as m; print('copy_bandwidth_bytes_per_s', m())" > $R/gpu.txt 2>&1
ckpt=/tmp/minivllm-bench/qwen3-0.6b-random
python3 -c "from pathlib import Path; from minivllm.benchmarks.common import make_random_checkpoint as m; m(Path('$ckpt'))" > /dev/null 2>&1
( while true; do date +%s >> $R/ps.txt; ps -eo pid,ppid,times,args | grep -E "cli.py serve|spawn_main|serve_client|cli.py bench" | grep -v grep | cut -c1-160 >> $R/ps.txt; sleep 2; done ) &
pspid=$!
run() { name=$1; lim=$2; shift 2; s=$SECONDS; timeout -s INT -k 20 $lim python3 -m minivllm.cli bench serve --model $ckpt --request-rate inf --num-warmups 256 --output $R/$name.json "$@" > $R/$name.log 2>&1; echo "rc=$? wall=$((SECONDS-s))" >> $R/$name.log; echo "$name: $(grep -v 'INFO\|Warning' $R/$name.log | tail -n 3 | tr '\n' ' ')"; }
run s1_offline 230 --compare-offline --stream-interval 1
run s4 130 --launch-server --stream-interval 4
run s1 130 --launch-server --stream-interval 1
kill $pspid
pack
