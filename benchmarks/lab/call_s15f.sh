#!/usr/bin/env bash
# Session 15, call F (~4 min): A/B of tree_patches/templates_bst.patch (y leaves the bulk kernel
# by the bulk engine: the store pass writes y into the tile's stage, thread 0 stores the stage
# with cp.async.bulk and refills it once the store has read it). copy_lab (call E): bulk-load +
# thread-rewrite + bulk-store copies ran x1.005 (64 KB tiles, 3 stages) and x1.027 (32 KB, 4
# stages) of bulk-load + thread-store copies, the structure of today's kernel.
set -u
mkdir -p "$OUT"
L=benchmarks/lab
for t in base bst; do rm -rf "$L/templates_$t"; cp -r templates "$L/templates_$t"; done
patch -s "$L/templates_bst/layernorm_bulk.cu.j2" < "$L/tree_patches/templates_bst.patch" || exit 1
timeout 280 python3 $L/ab_lab.py --base $L/templates_base --new $L/templates_bst --cache bulk \
  --top 2 --rounds 5 --budget-s 250 --out "$OUT/bst" \
  --only bfloat16:16384,bfloat16:32768,bfloat16:65536,float16:32768,float32:12288,float32:32768,float32:65536,float16:65536 \
  2>&1 | grep -v "━" | tee "$OUT/ab_bst.log" | grep -v "^\s*$" | tail -30
