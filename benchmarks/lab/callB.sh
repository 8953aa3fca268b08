# Session 3, call B: A/B of the template change (16-bit shapes), then the shipped-DB re-tune.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 AUTONORM_CACHE_DIR=/tmp/ac CUPY_CACHE_DIR=/tmp/cc
ONLY=bfloat16:768,bfloat16:1024,bfloat16:2048,bfloat16:4096,bfloat16:8192,bfloat16:16384,bfloat16:65536,float16:1024,float16:16384,float32:1024,float32:16384
timeout 170 python3 benchmarks/lab/ab_lab.py --base benchmarks/lab/templates_base --out $OUT --budget-s 140 --rounds 3 --only $ONLY > $OUT/ab2.log 2>&1
grep -E "SHAPE" $OUT/ab2.log
AUTONORM_DB=$OUT/ship.db timeout 250 python3 benchmarks/tune_grid.py --dtypes bf16,fp32,fp16 --trials 24 --timeout 10 > $OUT/grid.log 2>&1
tail -30 $OUT/grid.log
AUTONORM_DB=$OUT/ship.db timeout 80 python3 benchmarks/tune_grid.py --dtypes bf16,fp16,fp32 --hidden 4096,8192 --rows 4096 --trials 12 --timeout 5 > $OUT/llm.log 2>&1
tail -8 $OUT/llm.log
AUTONORM_DB=$OUT/ship.db timeout 90 python3 benchmarks/tune_grid.py --dtypes bf16,fp16,fp32 --hidden 16384 --rows 1,8,64,512 --trials 10 --timeout 3 > $OUT/lat.log 2>&1
tail -14 $OUT/lat.log
