#!/usr/bin/env bash
# Session 11, call B: the wide-row kernels' timelines (timeline_lab.py) and the rows-512 host
# path (host512_probe.py).
set -u
mkdir -p "$OUT"
timeout 240 python3 benchmarks/lab/timeline_lab.py --out "$OUT" 2>&1 | tee "$OUT/timeline_lab.log"
timeout 150 python3 benchmarks/lab/host512_probe.py 2>&1 | tee "$OUT/host512_probe.log"
