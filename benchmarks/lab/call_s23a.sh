#!/usr/bin/env bash
# Session 23, call A: the full peers run on session 22's DB (plain bulk stores, NOTES 106), which
# no peers run had measured.
set -u
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$OUT/smi.txt"
bash benchmarks/gpu_checks.sh peers
