#!/usr/bin/env bash
# Session 7, call E (final shipped DB): ncu of the capped 16-bit winners next to torch.compile at
# bf16 768 / 16384 and fp16 8192 (issue slots, instructions: is the 16-bit kernel now
# instruction-bound?), for NOTES' "what next".
set -u
mkdir -p "$OUT"
timeout 200 ncu --profile-from-start off --clock-control none --section SpeedOfLight \
  --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats \
  --section ComputeWorkloadAnalysis --section InstructionStats \
  python3 benchmarks/lab/ncu_peers.py bfloat16:768 bfloat16:16384 float16:8192 \
  > "$OUT/ncu_peers.txt" 2>&1
grep -E "^  [a-z_]|autonorm|triton|Duration|DRAM Throughput|Registers Per|Achieved Occ|Issue Slots Busy|Executed Ipc A|Executed Instructions  |No Eligible|Block Size|Grid Size|Stall" "$OUT/ncu_peers.txt" | head -90
