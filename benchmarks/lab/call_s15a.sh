#!/usr/bin/env bash
# Prepared in session 14 for the next session (~4 min): (1) NOTES.md 73's A/B, the capture
# query before and after, in alternating processes at bf16 16384 rows 512 (the bulk kernel),
# the old tree made here from tree_patches/s14_capture_query.patch reversed (the device's copy
# of the repository lacks older commits); rows 8 once for the wrapper's cost against rows 512;
# (2) the GPU tests that call s14f's budget cut off on that change.
set -u
mkdir -p "$OUT"
L=benchmarks/lab
rm -rf $L/old_tree && mkdir -p $L/old_tree && cp -r autonorm templates tuning_db $L/old_tree/
(cd $L/old_tree && patch -s -R -p1 < ../tree_patches/s14_capture_query.patch) || exit 1
bash $L/host_ab.sh "$PWD/$L/old_tree" 3 "$OUT/host_bulk_ab.log" --rows 512
echo "== new, rows 8" | tee -a "$OUT/host_bulk_ab.log"
timeout 45 python3 $L/host_launch_probe.py --rows 8 2>&1 | grep -v Warning | tail -3 \
  | tee -a "$OUT/host_bulk_ab.log"
timeout 200 python3 -m pytest -q -m gpu tests/test_gpu_schedule.py tests/test_gpu_traffic.py \
  tests/test_isolation.py tests/test_torch.py -p no:cacheprovider -ra > "$OUT/gpu_tests_73.log" 2>&1
tail -6 "$OUT/gpu_tests_73.log"
