#!/usr/bin/env bash
# Session 8, call G: 60-trial search at 16-bit 16384 (the shapes that trail torch.compile) on the
# final templates; merge_db takes a winner only >1 point better; if it took one, the peers sweep
# at those shapes again.
set -u
mkdir -p "$OUT"
bash benchmarks/gpu_checks.sh search bfloat16:16384 float16:16384 2>&1 | tail -12
if grep -q "winners taken" "$OUT/merge.log" && ! grep -q "^0 winners taken" "$OUT/merge.log"; then
  AUTONORM_CACHE_DIR=/tmp/ac_peers timeout 150 python3 benchmarks/peers.py --out "$OUT/peers" \
    --plain --suites sweep --hidden 16384 --dtypes bf16,fp16 > "$OUT/peers_16384.log" 2>&1
  tail -30 "$OUT/peers_16384.log"
fi
