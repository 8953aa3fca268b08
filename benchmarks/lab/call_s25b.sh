#!/usr/bin/env bash
# Session 25, call B: keep_x gave the bulk kernel x1.02-1.05 (NOTES 117). The same evict_last
# policy on the fwd kernel's x loads (ld.global.nc and the smem fill's cp.async; tree
# templates_fwdkeep from tree_patches/s25_fwd_x_keep.patch), at the fwd kernel's shipped winners,
# where autonorm trails torch.compile by 1-2% (16-bit 1024, fp32 4096). 9 rounds, interleaved.
set -u
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$OUT/smi.txt"
rm -rf benchmarks/lab/templates_fwdkeep && cp -r templates benchmarks/lab/templates_fwdkeep
(cd benchmarks/lab/templates_fwdkeep && patch -s layernorm_fwd.cu.j2 < ../tree_patches/s25_fwd_x_keep.patch) || exit 3
timeout 420 python3 benchmarks/lab/l2hint_lab.py --out "$OUT" --rounds 9 --policies fwdkeep \
  --shapes bfloat16:1024,float16:1024,float32:4096,bfloat16:768,bfloat16:2048,bfloat16:4096,bfloat16:8192,float16:8192,float32:8192,float16:768 \
  2>&1 | tee "$OUT/fwdkeep_lab.log" | grep -v "^$"
