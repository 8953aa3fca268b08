#!/usr/bin/env bash
# Session 18, call a: where the bulk kernel's warps wait. Stall reasons and per-SASS stall
# samples of the dispatched kernels at bf16 32768 and fp32 16384 (same tile, t512 c1 s2).
set -u
OUT=${OUT:-/tmp/out}
timeout 240 ncu --profile-from-start off --clock-control none --kernel-name regex:autonorm \
  --section WarpStateStats --section SourceCounters --section SchedulerStats \
  -o "$OUT/stalls" python3 benchmarks/lab/ncu_peers.py bfloat16:32768 float32:16384 \
  > "$OUT/ncu_run.log" 2>&1; tail -5 "$OUT/ncu_run.log"
ncu -i "$OUT/stalls.ncu-rep" --page details --print-details all > "$OUT/details.txt" 2>&1
grep -E "autonorm_ln|Stall|Warp Cycles" "$OUT/details.txt" | head -80
ncu -i "$OUT/stalls.ncu-rep" --page source --csv --print-source sass > "$OUT/sass.csv" 2>&1
wc -l "$OUT/sass.csv"; head -3 "$OUT/sass.csv" | cut -c1-600
python3 benchmarks/lab/ncu_sass_summary.py "$OUT/sass.csv" > "$OUT/stalls_by_pass.txt"
