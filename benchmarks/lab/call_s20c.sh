#!/usr/bin/env bash
# Session 20, call C (after 93's cheaper exit landed and the DB was re-tuned): the fixed cost per
# launch refitted on the new winners, the export GPU tests after the launcher's comment changed,
# then 60 trials at the shapes that trail torch.compile within a point or two.
set -u
mkdir -p "$OUT"
timeout 200 python3 benchmarks/lab/linearity_lab.py --out "$OUT/lin" > "$OUT/linearity_lab.log" 2>&1
grep "fit:" "$OUT/linearity_lab.log"
timeout 100 python3 -m pytest -q -m gpu tests/test_export.py -p no:cacheprovider > "$OUT/gpu_export.log" 2>&1
tail -2 "$OUT/gpu_export.log"
bash benchmarks/gpu_checks.sh search bfloat16:1024 float16:1024,16384 float32:1024,4096 2>&1 | tail -12
