#!/usr/bin/env bash
# Session 24, call M: the whole GPU suite on the keep_x templates (e31221153f6e; every shipped
# winner's kernel unchanged, keep_x in the search, the bulk seeds and test_gpu_schedule's
# same-bits test), then the main job's cold-start tune.
set -u
mkdir -p "$OUT"
bash benchmarks/gpu_checks.sh tests | tail -8
bash benchmarks/gpu_checks.sh tune | tail -14
