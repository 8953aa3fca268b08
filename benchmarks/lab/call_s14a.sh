#!/usr/bin/env bash
# Prepared in session 13 for the next session (one call, ~6 min): the fixed cost per launch
# (NOTES.md 67). (1) templates_stagger (tree_patches/templates_stagger.patch): the bulk kernel's
# prologue requests stage 0 alone and the other stages once it has landed; A/B against the
# shipped templates on the bulk shapes. (2) Timelines (%globaltimer stamps) of the shipped and
# the staggered kernels at bf16 32768 and 65536: first arrival, the work of each tile, exits.
# Prediction: the first tile lands at ~2.5 us instead of ~5 us; x1.01-1.03 at 32768-65536 if the
# cost is the ramp, x1.00 or worse if it is the drain (then NOTES.md "next" (c)).
set -u
mkdir -p "$OUT"
L=benchmarks/lab
for t in base stagger; do
  rm -rf "$L/templates_$t"; mkdir -p "$L/templates_$t"
  git archive HEAD templates 2>/dev/null | tar -x --strip-components=1 -C "$L/templates_$t" \
    || cp -r templates/. "$L/templates_$t/"
done
patch -s "$L/templates_stagger/layernorm_bulk.cu.j2" < "$L/tree_patches/templates_stagger.patch"
timeout 230 python3 $L/ab_lab.py --base $L/templates_base --new $L/templates_stagger --cache bulk \
  --top 2 --rounds 5 --budget-s 200 --out "$OUT/stagger" \
  --only bfloat16:32768,float16:32768,bfloat16:65536,float16:65536,float32:16384,float32:32768,float32:65536 \
  2>&1 | grep -v "━" | tee "$OUT/ab_stagger.log" | grep -v "^\s*$" | tail -20
# The shipped kernels with a stamped copy for reference (how much of a plain copy's event time
# lies outside its own first-entry-to-last-exit span), then the staggered ones.
timeout 100 python3 $L/timeline_lab.py --only 32768,65536 --runs 5 --out "$OUT" --copy 2>&1 \
  | grep -v "━" | tee -a "$OUT/timeline_stagger.log" | tail -32
timeout 100 python3 $L/timeline_lab.py --only 32768,65536 --runs 5 --out "$OUT" \
  --tree $L/templates_stagger 2>&1 | grep -v "━" | tee -a "$OUT/timeline_stagger.log" | tail -30
