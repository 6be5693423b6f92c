source scratch_gpu/s18/common.sh
(lscpu; echo; nvidia-smi topo -m; echo; numactl --hardware 2>&1; cat /proc/cpuinfo | grep MHz | head -16; uptime) > $OUT/r/topo.txt 2>&1
grep -i "numa\|model name\|^CPU(s)\|Thread\|Socket" $OUT/r/topo.txt | head; nvidia-smi topo -m | head -4
q() { timeout 100 $2 python3 scratch_gpu/s18/eager_host.py $OUT/r/$1.json --quick > $OUT/r/$1.log 2>&1; echo "$1 $2"; grep "forward host ms again\|cpus" $OUT/r/$1.log | tail -2; }
for i in 1 2 3 4 5; do q free_$i ""; done
for i in 1 2; do q pin0_$i "taskset -c 0"; done
for i in 1 2; do q pin15_$i "taskset -c 15"; done
cd $OUT/r && tar czf ../all.tgz *.json *.log topo.txt && rm -f *.json *.log && mv ../all.tgz .
