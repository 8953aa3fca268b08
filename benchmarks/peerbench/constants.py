"""The peers benchmark's fixed settings: implementations, suites, sizes, tolerances, timing.

``DEVICE`` is read as ``constants.DEVICE`` where tensors are made, so a CPU dry run patches it
here, once, for every module.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent.parent  # benchmarks/, where the scripts are
REPO = HERE.parent

ALL_IMPLS = ("autonorm", "autonorm-inplace", "eager", "compile", "triton", "liger")
IN_PLACE_IMPLS = ("autonorm-inplace",)
# Fixed per implementation, so a name keeps its colour in every op's plot.
COLORS = {"autonorm": "C0", "eager": "C1", "compile": "C2", "triton": "C3", "liger": "C4",
          "autonorm-inplace": "C5"}
DEFAULT_OP = "layer_norm"
PEERS = ("eager", "compile", "triton", "liger")
ALL_SUITES = ("sweep", "latency", "llm")
RUN_ORDER = ("latency", "llm", "sweep")
DTYPES = ("bf16", "fp16", "fp32")
ITEMSIZE = {"bf16": 2, "fp16": 2, "fp32": 4}
TOL = {"bf16": 1e-2, "fp16": 1e-2, "fp32": 1e-4}

SWEEP_HIDDEN = (768, 1024, 2048, 4096, 8192, 12288, 16384, 32768, 65536)
QUICK_HIDDEN = (1024, 4096, 16384, 65536)
QUICK_DTYPES = ("bf16", "fp32")
SWEEP_ELEMENTS = 2**26
LATENCY_HIDDEN = 16384
LATENCY_ROWS = (1, 8, 64, 512)
LLM_TOKENS = 4096
LLM_HIDDEN = (4096, 8192)

EPS = 1e-5
DEVICE = "cuda"  # a module constant so a CPU dry run can patch it
COPY_BYTES = 2**28  # the fixed reference copy's buffer (2^29 bytes moved)
# Copies are timed at x's size rounded to a MiB: sizes a few KiB apart (hidden 768 and 12288
# do not divide 2^26) would each get a copy of their own, with its own noise, and cudaMemcpy's
# rate depends on a size's last few KiB (docs/timing.md). The tuner's finals round the same
# way (autonorm.runtime.timing.copy_buffer_bytes; not imported here: --selftest runs without
# autonorm).
COPY_ROUND = 2**20
FLUSH_BYTES = 256 * 2**20  # over 4x the H200's 60 MB L2, as do_bench's flush buffer
FLUSHES = ("read", "zero")  # primary first
FLUSH_MIN_REPS = 25
FLUSH_MAX_REPS = 1000
HOST_CALLS = 200
HOST_REPEATS = 5
BENCH_WARMUP_MS = 25
BENCH_REP_MS = 100
GRAPH_REP_MS = 20
QUANTILES = [0.5, 0.2, 0.8]
TARGET_SHARE = 0.95
MAX_PROBLEM_LINES = 25
