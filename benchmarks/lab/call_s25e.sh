#!/usr/bin/env bash
# Session 25, call E: the whole GPU suite on the tree with keep_x refused to clustered fwd
# kernels (call D) and the shipped DB of call C.
set -u
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$OUT/smi.txt"
bash benchmarks/gpu_checks.sh tests | tail -12
