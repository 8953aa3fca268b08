"""GPU: the dispatched kernels read x from DRAM once (ncu's dram__bytes_read.sum).

Needs Nsight Compute (`ncu`); skips without it. Judged by reads: dirty lines still in L2 at the
end of a kernel make dram__bytes_write.sum read low (shared/device/README.md).
"""

from __future__ import annotations

import csv
import io
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.gpu

SCRIPT = textwrap.dedent(
    """
    import cupy, autonorm
    from ml_dtypes import bfloat16
    rows, hidden = {rows}, {hidden}
    x = cupy.random.standard_normal((rows, hidden), dtype=cupy.float32).astype(bfloat16)
    w = (1 + 0.1 * cupy.random.standard_normal(hidden, dtype=cupy.float32)).astype(bfloat16)
    b = (0.1 * cupy.random.standard_normal(hidden, dtype=cupy.float32)).astype(bfloat16)
    cupy.cuda.Device().synchronize()
    y = autonorm.layer_norm(x, w, b, 1e-5)
    cupy.cuda.Device().synchronize()
    """
)


def _dram_read_bytes(rows: int, hidden: int) -> float:
    cmd = [
        "ncu", "--clock-control", "none", "--kernel-name", "regex:autonorm_ln",
        "--metrics", "dram__bytes_read.sum", "--print-units", "base", "--csv",
        sys.executable, "-c", SCRIPT.format(rows=rows, hidden=hidden),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=os.environ.copy())
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith('"')]
    rows_csv = list(csv.DictReader(io.StringIO("\n".join(lines))))
    values = [
        float(r["Metric Value"].replace(",", ""))
        for r in rows_csv
        if r.get("Metric Name") == "dram__bytes_read.sum"
    ]
    assert values, proc.stdout[-2000:]
    return values[-1]


@pytest.mark.skipif(shutil.which("ncu") is None, reason="needs Nsight Compute (ncu)")
@pytest.mark.parametrize("hidden", [16384, 65536])
def test_winner_reads_x_once(hidden: int) -> None:
    rows = (1 << 26) // hidden
    expected = rows * hidden * 2 + 2 * hidden * 2  # x once, weight and bias once (bf16)
    measured = _dram_read_bytes(rows, hidden)
    print(f"hidden {hidden}: dram read {measured / 1e6:.1f} MB, expected {expected / 1e6:.1f} MB")
    assert abs(measured - expected) <= 0.05 * expected
