"""The fwd kernel's keep_x forms, shared by the render test (CPU) and the same-bits test (GPU).

16-, 8-, 4- and 2-byte loads of x, the smem row filled through registers, the prefetching
persistent grid and the uncached kernel. Clustered fwd kernels and rows filled by cp.async refuse
keep_x (tests/test_bulk.py), so none is of either.
"""

from __future__ import annotations

from autonorm.ops.layer_norm.config import KernelConfig

# (plain config, hidden, dtype)
FWD_KEEP_CASES = [
    (KernelConfig(128, 8, 4, "smem", "two_pass", 1, 0, 0, 64), 1024, "bfloat16"),  # via registers
    (KernelConfig(256, 8, 1, "smem", "two_pass", 1, 0, 0, 64), 8192, "float16"),  # via registers
    (KernelConfig(128, 8, 4, "registers", "two_pass", 1, 0, 0, 64), 768, "bfloat16"),
    (KernelConfig(256, 2, 2, "registers", "two_pass", 1, 0), 4096, "float32"),  # 8-byte loads
    (KernelConfig(256, 4, 1, "registers", "two_pass", 1, 2), 8192, "float32"),  # prefetch
    (KernelConfig(256, 1, 1, "registers", "welford", 1, 0), 768, "float32"),  # 4-byte loads
    (KernelConfig(128, 1, 1, "none", "welford", 1, 0), 1024, "float16"),  # 2-byte loads
]
