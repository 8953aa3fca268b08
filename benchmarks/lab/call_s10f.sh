#!/usr/bin/env bash
# Session 10, call F: ncu on the fwd kernel's c1 and c2 smem kernels (ncu_clusters.py): the
# sections first, then the stall reasons as metrics (a second run, in case a name is refused).
set -u
mkdir -p "$OUT"
timeout 150 ncu --profile-from-start off --clock-control none --section SpeedOfLight \
  --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats \
  --section MemoryWorkloadAnalysis \
  python3 benchmarks/lab/ncu_clusters.py > "$OUT/ncu_clusters.txt" 2>&1
grep -E "^[0-9]|autonorm_ln|Duration|DRAM Throughput|Registers Per|Achieved Occ|Theoretical Occ|Block Limit|Cluster|Issue Slots Busy|Eligible Warps|No Eligible|Grid Size|Waves|Warp Cycles Per Issued|ERROR|rror" \
  "$OUT/ncu_clusters.txt" | head -120
m=smsp__average_warps_issue_stalled
timeout 100 ncu --profile-from-start off --clock-control none --metrics \
  ${m}_barrier_per_issue_active.ratio,${m}_membar_per_issue_active.ratio,${m}_long_scoreboard_per_issue_active.ratio,${m}_short_scoreboard_per_issue_active.ratio,${m}_mio_throttle_per_issue_active.ratio,${m}_lg_throttle_per_issue_active.ratio,${m}_wait_per_issue_active.ratio,${m}_sleeping_per_issue_active.ratio \
  python3 benchmarks/lab/ncu_clusters.py > "$OUT/ncu_stalls.txt" 2>&1
grep -E "^[0-9]|autonorm_ln|stalled|ERROR" "$OUT/ncu_stalls.txt" | head -60
