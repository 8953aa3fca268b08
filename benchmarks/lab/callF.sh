# Session 3, call F (lab only): the bulk kernel's tile held as fp32 in registers, stage refilled
# at once (benchmarks/lab/templates_ftile, diff in measured/h200_2026-11-29_s3/ftile_lab.patch)
# against the shipped templates, bulk configs of the shipped DB.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 AUTONORM_CACHE_DIR=/tmp/ac CUPY_CACHE_DIR=/tmp/cc
timeout 150 python3 benchmarks/lab/ab_lab.py --base templates --new benchmarks/lab/templates_ftile --cache bulk --top 6 --rounds 3 --budget-s 115 --out $OUT --only bfloat16:16384,bfloat16:65536,bfloat16:8192,float16:16384,bfloat16:32768 > $OUT/ab_ftile.log 2>&1; cat $OUT/ab_ftile.log | cut -c1-150
