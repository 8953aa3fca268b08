# Session 3, call E: re-tune the 16-bit latency buckets at 16384 (rows 64, 512) with more trials,
# merge the better winners into the shipped DB copy here, re-run the latency suite.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 AUTONORM_CACHE_DIR=/tmp/ac CUPY_CACHE_DIR=/tmp/cc
AUTONORM_DB=$OUT/lat2.db timeout 110 python3 benchmarks/tune_grid.py --dtypes bf16,fp16 --hidden 16384 --rows 64,512 --trials 30 --timeout 12 > $OUT/lat2.log 2>&1; tail -4 $OUT/lat2.log
cp tuning_db/autonorm.db $OUT/shipped_merged.db && chmod u+w $OUT/shipped_merged.db && python3 benchmarks/lab/merge_db.py $OUT/lat2.db $OUT/shipped_merged.db
AUTONORM_SHIPPED_DB=$OUT/shipped_merged.db timeout 100 python3 benchmarks/peers.py --suites latency --budget-s 90 --out $OUT/peers_lat --plain > $OUT/peers_lat.log 2>&1; tail -9 $OUT/peers_lat.log
