#!/usr/bin/env bash
# Session 11, call H: the peers' latency suite three times in a row (each a fresh process), to
# see whether the host-inclusive outliers of NOTES 58 follow autonorm or the run.
set -u
mkdir -p "$OUT"
for i in 1 2 3; do
  timeout 100 python3 benchmarks/peers.py --suites latency --impls autonorm,eager,triton \
    --plain --out "$OUT/lat$i" > "$OUT/latency_$i.log" 2>&1
  grep -A7 "^Latency" "$OUT/latency_$i.log"
done
