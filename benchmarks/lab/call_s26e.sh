#!/usr/bin/env bash
# Session 26, call E: which fwd kernels with keep_x raise an illegal instruction. Call D's tuner
# search at fp32 4096 hit cudaErrorIllegalInstruction at t128v2r1-smem-two_pass-c1-p0-k, an
# unclustered kernel whose smem row is filled by 8-byte hinted cp.async.ca (session 25 found it
# only in clustered 16-byte cp.async.cg fills, NOTES.md 122). Each config and its plain twin in a
# process of its own (keepx_diag.py), over the fill width (4/8/16 bytes), the vectors a thread
# copies (ITERS 8/16/32/64), a persistent grid, Welford; then compute-sanitizer on the first one.
# Prediction: every hinted cp.async fill of more than 8 vectors a thread faults, plain twins
# verify. ~150 s.
set -u
mkdir -p "$OUT"
S=smem-two_pass-c1
timeout 300 python3 benchmarks/lab/keepx_diag.py \
  4096:float32:t128v2r1-$S-p0-k 4096:float32:t256v2r1-$S-p0-k 4096:float32:t64v2r1-$S-p0-k \
  4096:float32:t128v4r1-$S-p0-k 4096:float32:t64v4r1-$S-p0-k 4096:float32:t32v4r1-$S-p0-k \
  4096:float32:t128v1r1-$S-p0-k 4096:float32:t128v2r1-$S-p1-k 4096:float32:t128v2r1-smem-welford-c1-p0-k \
  4096:float32:t128v2r2-$S-p0-k \
  4096:bfloat16:t64v8r1-$S-p0-k 4096:bfloat16:t32v8r1-$S-p0-k 4096:bfloat16:t128v4r1-$S-p0-k \
  8192:bfloat16:t64v8r1-$S-p0-k 16384:float32:t256v2r1-$S-p0-k 2>&1 | tee "$OUT/diag.log"
cat > /tmp/one.py <<'PY'
import sys
from autonorm import codegen, compiler
from autonorm.space import KernelConfig, Problem
from autonorm.verify import verify
p = Problem(4096, "float32")
r = codegen.render(KernelConfig.from_label(sys.argv[1]), p)
open(sys.argv[2], "w").write(r.source)
k = compiler.compile_kernel(r)
print("ok" if verify(k, p).ok else "WRONG")
PY
timeout 120 compute-sanitizer --tool memcheck --show-backtrace device python3 /tmp/one.py \
  t128v2r1-$S-p0-k "$OUT/t128v2r1_k.cu" > "$OUT/sanitizer.log" 2>&1
head -60 "$OUT/sanitizer.log"
for t in cuobjdump nvdisasm; do echo "$t: $(command -v $t || ls /usr/local/cuda/bin/$t 2>/dev/null)"; done
