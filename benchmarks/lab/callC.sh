# Session 3, call C: peers with the re-tuned shipped DB, fp16 65536 tune, the GPU test suite.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 AUTONORM_CACHE_DIR=/tmp/ac CUPY_CACHE_DIR=/tmp/cc
timeout 250 python3 benchmarks/peers.py --quick --budget-s 225 --out $OUT/peers --plain > $OUT/peers.log 2>&1
tail -45 $OUT/peers.log
AUTONORM_DB=$OUT/fp16.db timeout 40 python3 benchmarks/tune_grid.py --dtypes fp16 --hidden 65536 --trials 16 --timeout 25 > $OUT/fp16.log 2>&1; tail -2 $OUT/fp16.log
timeout 290 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider -ra --durations=12 > $OUT/gpu_tests.log 2>&1; tail -30 $OUT/gpu_tests.log
