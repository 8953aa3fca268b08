# Session 3, call D: the README's main job from a cold start (CLI tune, bulk kernel in the space),
# then the full peers grid with the shipped DB.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 AUTONORM_CACHE_DIR=/tmp/ac CUPY_CACHE_DIR=/tmp/cc
AUTONORM_DB=$OUT/user.db timeout 160 bash benchmarks/gpu_checks.sh tune > $OUT/tune_suite.log 2>&1; grep -v "━" $OUT/tune_suite.log | tail -22
timeout 300 python3 benchmarks/peers.py --budget-s 280 --out $OUT/peers_full --plain > $OUT/peers_full.log 2>&1
tail -48 $OUT/peers_full.log
