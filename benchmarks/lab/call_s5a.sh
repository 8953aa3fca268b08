#!/usr/bin/env bash
# Session 5, call A: ncu of the shipped winners next to torch.compile's kernel; same-run A/B of
# the 32-element fp32 tile and of the rebased Welford against main's templates; kernel GPU tests.
set -u
mkdir -p "$OUT"
# As run, these lines spelled the ncu command out (7 sections, no InstructionStats; see git
# history); gpu_checks.sh's `ncu` suite now holds it.
bash benchmarks/gpu_checks.sh ncu bfloat16:1024 bfloat16:16384 float16:8192
timeout 120 python3 benchmarks/lab/ab_lab.py --base benchmarks/lab/templates_base --ftile \
  --base-tile-max 16 --only bfloat16:768,bfloat16:8192,bfloat16:16384,bfloat16:32768,float16:16384,bfloat16:65536 \
  --top 3 --rounds 4 --budget-s 100 --out "$OUT/ab_ftile" > "$OUT/ab_ftile.log" 2>&1
grep -v "^\s*$" "$OUT/ab_ftile.log" | tail -30
timeout 80 python3 benchmarks/lab/ab_lab.py --base benchmarks/lab/templates_base --stats welford \
  --only float32:1024,float32:4096,float32:16384,bfloat16:4096 \
  --top 3 --rounds 4 --budget-s 60 --out "$OUT/ab_welford" > "$OUT/ab_welford.log" 2>&1
grep -v "^\s*$" "$OUT/ab_welford.log" | tail -20
timeout 240 python3 -m pytest -q -m gpu tests/test_gpu_kernels.py tests/test_gpu_bulk.py \
  -p no:cacheprovider -ra --durations=5 > "$OUT/gpu_tests_a.log" 2>&1
tail -15 "$OUT/gpu_tests_a.log"
