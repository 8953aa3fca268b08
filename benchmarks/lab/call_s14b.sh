#!/usr/bin/env bash
# Session 14, first call: the GPU suite on main's HEAD (2f2e047: wrap_stream's lru_cache, the
# launcher's bounded stream cache; neither had run on a GPU), then the A/B of
# tree_patches/templates_stagger.patch on the bulk shapes (session 13 had prepared both in one
# script, with the timelines; they ran on the product templates in call_s14c.sh).
set -u
mkdir -p "$OUT"
L=benchmarks/lab
timeout 300 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider -ra --durations=10 \
  > "$OUT/gpu_tests.log" 2>&1; tail -16 "$OUT/gpu_tests.log"
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
