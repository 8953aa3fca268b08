#!/usr/bin/env bash
# Session 8, call A: the L2-flush / copy-size lab (flush_lab.py), then session 7's unrun call G
# (the capped 16-bit defaults through the verifier at 40 shapes, the affine-variant GPU tests).
set -u
mkdir -p "$OUT"
timeout 200 python3 benchmarks/lab/flush_lab.py --out "$OUT" 2>&1 | tee "$OUT/flush_lab.log"
timeout 300 bash benchmarks/lab/call_s7g.sh 2>&1 | tail -50
