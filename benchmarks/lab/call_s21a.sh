#!/usr/bin/env bash
# Session 21, call A: the last-warp refill (templates/ vs templates_base/) A/B'd on the clustered
# bulk shapes; then torch.compile's kernels at the shapes where it leads, dumped for reading here.
set -u
mkdir -p "$OUT"
timeout 330 python3 benchmarks/lab/ab_lab.py --base benchmarks/lab/templates_base --cache bulk \
  --top 3 --rounds 5 --budget-s 280 --out "$OUT" \
  --only bfloat16:32768,bfloat16:65536,float16:32768,float16:65536,float32:32768,float32:65536 \
  > "$OUT/ab_lab.log" 2>&1
grep -v "━" "$OUT/ab_lab.log" | tail -40
mkdir -p "$OUT/cdump"
TORCHINDUCTOR_CACHE_DIR=/tmp/ind TRITON_CACHE_DIR=/tmp/tri timeout 150 python3 \
  benchmarks/lab/compile_dump.py float32:4096 bfloat16:1024 float16:1024 float32:1024 \
  float16:16384 2>&1 | grep -v Warning | tail -8 | tee "$OUT/cdump/compile_dump.log"
find /tmp/ind -name "*.py" -exec grep -l "triton_" {} + \
  | while read -r f; do cp "$f" "$OUT/cdump/"; done
find /tmp/ind -name "*.best_config" -exec cp {} "$OUT/cdump/" \;
find /tmp/tri \( -name "*.ptx" -o -name "*.cubin" -o -name "*.json" \) -size -2M \
  | while read -r f; do cp "$f" "$OUT/cdump/$(basename "$(dirname "$f")")_$(basename "$f")"; done
ls "$OUT/cdump" | wc -l; du -sh "$OUT/cdump"
