#!/usr/bin/env bash
# Prepared in session 12 for the next session (one call, ~6 min): build the lab trees from their
# patches (tree_patches/README.md), then (1) the clustered bulk kernels with the claim pushed an
# iteration after it returns (templates_claim2) A/B against the shipped templates, (2) the packed
# 16-bit tile in registers (t16_lab.py), (3) the driver's own launch cost against autonorm's
# raw launch (host_launch_probe.py).
set -u
mkdir -p "$OUT"
L=benchmarks/lab
for t in base t16 claim2; do
  rm -rf "$L/templates_$t"; mkdir -p "$L/templates_$t"
  git archive HEAD templates | tar -x --strip-components=1 -C "$L/templates_$t"
done
patch -s "$L/templates_t16/layernorm_bulk.cu.j2" < "$L/tree_patches/templates_t16.patch"
patch -s "$L/templates_claim2/layernorm_bulk.cu.j2" < "$L/tree_patches/templates_claim2.patch"
timeout 200 python3 $L/ab_lab.py --base $L/templates_base --new $L/templates_claim2 --cache bulk \
  --top 3 --rounds 5 --budget-s 170 --out "$OUT/claim2" \
  --only bfloat16:65536,float16:65536,float32:32768,float32:65536 \
  2>&1 | grep -v "━" | tee "$OUT/ab_claim2.log" | grep -v "^\s*$" | tail -16
timeout 200 python3 $L/t16_lab.py --rounds 5 --out "$OUT" 2>&1 | grep -v "━" \
  | tee "$OUT/t16_lab.log" | tail -24
timeout 90 python3 $L/host_launch_probe.py 2>&1 | grep -v Warning \
  | tee "$OUT/host_launch_probe.log" | tail -4
