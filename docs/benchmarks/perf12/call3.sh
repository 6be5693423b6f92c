source scratch_gpu/s18/common.sh
R=$PWD
nproc; uptime
new() { timeout 150 python3 scratch_gpu/s18/eager_host.py $OUT/r/$1.json $2 > $OUT/r/$1.log 2>&1; grep "forward host\|forward gpu" $OUT/r/$1.log | tail -3; }
old() { (cd scratch_gpu/s18/old && PYTHONPATH=$PWD:/tmp/site timeout 150 python3 $R/scratch_gpu/s18/eager_host.py $OUT/r/$1.json $2 > $OUT/r/$1.log 2>&1; grep "forward host\|forward gpu" $OUT/r/$1.log | tail -3); }
echo warm-up; old ab_old_0 --quick
echo A; new ab_new_1 --quick
echo B; old ab_old_1 --quick
echo A; new ab_new_2 --quick
echo B; old ab_old_2 --quick
echo A; new ab_new_3
echo B; old ab_old_3
