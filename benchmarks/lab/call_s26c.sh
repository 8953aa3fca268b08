#!/usr/bin/env bash
# Session 26, call C. (1) The peers benchmark from a clean copy of the committed tree with the
# shipped DB (issue 4's "Done when" asks for that; call A's peers ran in the tree promote_lab
# had just written). (2) The tuner's own search at fp32 4096 / 8192 and bf16 8192 with the new
# row-a-tile bulk seed (space.bulk_seed_configs): prediction, its finals pick that seed or one
# within a point of it, at 99-100% of copy (fp32) and ~98% (bf16). ~400 s.
set -u
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$OUT/smi.txt"
here=$PWD
# The device's copy of .git is the session's starting commit, not the tree sent (the first try,
# c0, cloned it and so ran the old DB), so the clean tree is a copy of the sent files alone.
# (Call c's run reused c0's /tmp/clean on the warm machine; the DB's sha256 matched.)
rm -rf /tmp/clean && mkdir -p /tmp/clean && cp -a . /tmp/clean && rm -rf /tmp/clean/.git /tmp/clean/.whl
sha256sum tuning_db/autonorm.db /tmp/clean/tuning_db/autonorm.db
cd /tmp/clean && PYTHONPATH=/tmp/site:/tmp/clean OUT=$OUT/peersrun bash benchmarks/gpu_checks.sh peers | tail -42
cd "$here"
PYTHONPATH=/tmp/site:$here bash benchmarks/gpu_checks.sh search float32:4096,8192 bfloat16:8192
