#!/usr/bin/env bash
# Session 17, call f (~4-5 min): A/B of lab/tree_patches/s17_stagger.patch, the first wave's
# fills staggered (fwd kernel: the k-th block of an SM sleeps k x the time DRAM takes for one
# row an SM; bulk kernel: odd clusters ask for their first tile that long later), at STAGGER_F
# 1.0 and 0.5 of that time, against main's templates. Each shape's shipped winner, verified,
# interleaved. Prediction (NOTES.md 84: fixed 4-6 us a launch against copy's 1-2 us; the first
# wave of 4 fwd blocks an SM asks for 128 KB an SM at once, so its rows land together after ~4
# us): x1.01-1.03 on the fwd winners at 16-bit 8192-16384, x1.00-1.01 on the bulk winners.
set -u
mkdir -p "$OUT"
L=benchmarks/lab
rm -rf "$L/templates_base" && mkdir -p "$L/templates_base" && cp -r templates/. "$L/templates_base/"
patch -p1 -s < "$L/tree_patches/s17_stagger.patch" || exit 1
ONLY=bfloat16:4096,bfloat16:8192,bfloat16:12288,bfloat16:16384,float16:16384,bfloat16:32768,bfloat16:65536,float32:16384,float32:65536
for F in 1.0 0.5; do
  sed -i "s/set STAGGER_F = [0-9.]*/set STAGGER_F = $F/" templates/layernorm_fwd.cu.j2 templates/layernorm_bulk.cu.j2
  echo "== STAGGER_F $F"
  timeout 150 python3 $L/ab_lab.py --base $L/templates_base --top 1 --rounds 5 \
    --budget-s 115 --out "$OUT/stagger_$F" --only $ONLY \
    2>&1 | grep -v "━" | tee "$OUT/ab_stagger_$F.log" | grep -v "^\s*$" | grep -E "SHAPE|x[01]\." | tail -30
done
