#!/usr/bin/env bash
# Prepared in session 16 (~2-3 min): A/B of lab/tree_patches/s16_fused_bulk.patch, fused 16-bit
# statistics in the bulk kernel with its refill behind a barrier of its own (no deferred refill),
# against the fwd-only fusion of s16_fused_two_pass.patch, which main must hold (NOTES.md 80).
# The same bulk configs (each shape's fastest verified bulk trials), verified, interleaved.
# Prediction: x1.00-1.03 on the 1-stage-deferring c1 tiles (bf16/fp16 32768: one smem pass and
# one barrier fewer a tile, the refill issued right after the store pass), x1.00 on clusters.
set -u
mkdir -p "$OUT"
L=benchmarks/lab
grep -q "fuses_passes" autonorm/codegen.py || { echo "main lacks s16_fused_two_pass.patch"; exit 1; }
rm -rf "$L/templates_base" && mkdir -p "$L/templates_base" && cp -r templates/. "$L/templates_base/"
patch -p1 -s < "$L/tree_patches/s16_fused_bulk.patch" || exit 1
timeout 330 python3 $L/ab_lab.py --base $L/templates_base --cache bulk --top 3 --rounds 5 \
  --budget-s 300 --out "$OUT/fb" \
  --only bfloat16:2048,bfloat16:8192,bfloat16:16384,bfloat16:32768,bfloat16:65536,float16:32768,float16:65536 \
  2>&1 | grep -v "━" | tee "$OUT/ab_fb.log" | grep -v "^\s*$" | tail -40
