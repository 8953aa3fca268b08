#!/usr/bin/env bash
# Session 10, call G: the stall reasons of the fwd kernel's c2 with st.async pushes (the patch of
# call C in benchmarks/lab/push_tree, rebuilt from tree_patches/s10_fwd_cluster_push.patch).
set -u
mkdir -p "$OUT"
m=smsp__average_warps_issue_stalled
PYTHONPATH=/tmp/site:$PWD/benchmarks/lab/push_tree:$PWD/benchmarks/lab timeout 100 ncu \
  --profile-from-start off --clock-control none --metrics \
  ${m}_barrier_per_issue_active.ratio,${m}_membar_per_issue_active.ratio,${m}_long_scoreboard_per_issue_active.ratio,${m}_short_scoreboard_per_issue_active.ratio,${m}_mio_throttle_per_issue_active.ratio,gpu__time_duration.sum,sm__warps_active.avg.pct_of_peak_sustained_active \
  python3 benchmarks/lab/ncu_clusters.py "$@" > "$OUT/ncu_stalls_push.txt" 2>&1
grep -E "^[0-9]|autonorm_ln|stalled|duration|warps_active|ERROR|rror" "$OUT/ncu_stalls_push.txt" | head -60
