set -u
mkdir -p "$OUT"
timeout 150 python3 -m pytest -q -m gpu tests/test_gpu_schedule.py tests/test_torch.py -p no:cacheprovider -ra > "$OUT/sched_torch.log" 2>&1; tail -8 "$OUT/sched_torch.log"
bash benchmarks/gpu_checks.sh ship 2>&1 | grep -v "━" | tail -60
