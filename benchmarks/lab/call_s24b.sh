#!/usr/bin/env bash
# Session 24, call B: the latency buckets at hidden 16384 (rows 1, 8, 64; peers' do_bench had
# autonorm at 1.05x Liger at rows 64 in session 23's last run). The rows-64 searches timed 22
# configs and no clustered bulk tile smaller than 16 KB, and no t1024 register kernel: with
# 1-64 rows most SMs idle, so a row split over 2-8 blocks shortens each row's chain. Head to
# head (promote_lab.py, 21 rounds, a 1% floor: the finals' cv is ~4% at these sizes).
set -u
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$OUT/smi.txt"
W=bulk-two_pass
R=registers-two_pass-c1-p0
H8="t256v8r1-$W-c2-p0-s1,t128v8r1-$W-c4-p0-s1,t256v8r1-$W-c4-p0-s1,t128v8r1-$W-c8-p0-s1"
H8="$H8,t1024v8r1-$R,t128v8r1-$R"
H4="t256v4r1-$W-c2-p0-s1,t128v4r1-$W-c4-p0-s1,t256v4r1-$W-c4-p0-s1,t128v4r1-$W-c8-p0-s1"
H4="$H4,t1024v4r1-$R,t512v4r1-$R"
A=()
for rows in 64 8 1; do
  A+=(bfloat16:16384@$rows=$H8 float16:16384@$rows=$H8 float32:16384@$rows=$H4)
done
timeout 500 python3 benchmarks/lab/promote_lab.py tuning_db/autonorm.db "${A[@]}" \
  --rounds 21 --min-gain 0.01 --note "session 24 call B" 2>&1 | tee "$OUT/promote.log"
cp tuning_db/autonorm.db "$OUT/shipped.db"
