#!/usr/bin/env bash
# Session 24, call J: call I's victim read was cupy.sum (not bandwidth-bound); again with a
# 16-byte-load reader, and the evict_last tree with each landed tile's x lines set back to
# evict_normal (does the gain survive, does the victim's penalty go?).
set -u
mkdir -p "$OUT"
timeout 300 python3 benchmarks/lab/l2hint_probe.py --out "$OUT" --rounds 7 2>&1 | tee "$OUT/l2hint_probe.log"
