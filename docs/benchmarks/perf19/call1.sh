# Call 1: prompt steps' attention, probed
source scratch_gpu/s25/common.sh
rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> $R/gpu.txt 2>&1
cat $R/gpu.txt
s=$SECONDS; timeout 240 python3 scratch_gpu/s25/attn_probe.py $R/attn_probe.json > $R/attn_probe.log 2>&1; echo "rc=$? wall=$((SECONDS-s))" >> $R/attn_probe.log
tail -n 12 $R/attn_probe.log
N=$(which ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $N"
for w in short long; do
  s=$SECONDS; timeout 110 $N --clock-control none --target-processes all -k regex:kernel_unified_attention --launch-skip 2 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats --section LaunchStats --section ComputeWorkloadAnalysis --section SchedulerStats python3 scratch_gpu/s25/ncu_one.py $w > $R/ncu_$w.txt 2>&1; echo "rc=$? wall=$((SECONDS-s))" >> $R/ncu_$w.txt
  grep -E "Duration|Throughput|Hit Rate|Achieved Occupancy|Registers|Block Limit|Stall|rc=|Shared Memory Config|Issued|Theoretical Occ" $R/ncu_$w.txt | head -40
done
pack
