"""benchmarks/bucket_reach.py without a GPU: its cases, its summary and its argument errors."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import bucket_reach  # noqa: E402 - benchmarks/ is not a package

WITHOUT_GPU_STACK = """
import runpy, sys
for name in ("cupy", "triton", "torch"):
    sys.modules[name] = None
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _plan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_GPU_STACK, str(REPO / "benchmarks" / "bucket_reach.py"),
         "--plan", *args], capture_output=True, text=True, timeout=120, cwd=REPO, check=False)


def test_the_plan_lists_the_cases_lent_from_another_bucket_without_a_gpu() -> None:
    run = _plan("--ops", "rms_norm,layer_norm", "--hidden", "4096,16384", "--rows", "1,64",
                "--dtypes", "bf16")
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert lines[-1] == f"{len(lines) - 1} cases"
    # RMSNorm 4096 is tuned at 16,384 rows only: 1 and 64 rows are 14 and 8 octaves away.
    assert any(line.startswith("rms_norm") and "4096 rows     1  14 octaves" in line
               for line in lines), run.stdout
    # LayerNorm 16384 has its own 1- and 64-row buckets: nothing lent there.
    assert not any(line.startswith("layer_norm") and " 16384 " in line for line in lines)


def test_the_summary_is_the_geometric_mean_by_octaves() -> None:
    records = [{"octaves": 2.0, "nearest_us": 2.0, "default_us": 1.0},
               {"octaves": 2.0, "nearest_us": 1.0, "default_us": 2.0},
               {"octaves": 8.0, "nearest_us": 3.0, "default_us": 2.0}]
    rows = bucket_reach.summarize(records)
    assert [(o, n) for o, n, *_ in rows] == [(2.0, 2), (8.0, 1)]
    assert math.isclose(rows[0][2], 1.0) and (rows[0][3], rows[0][4]) == (0.5, 2.0)
    assert math.isclose(rows[1][2], 1.5)
    assert "1.500" in bucket_reach.format_summary(records)


@pytest.mark.parametrize(("args", "message"), [
    (["--ops", "group_norm"], "group_norm: one of"),
    (["--rows", "0,8"], "positive integers"),
    (["--dtypes", "fp64"], "fp64: one of"),
])
def test_bad_arguments_are_named(args: list[str], message: str) -> None:
    run = _plan(*args)
    assert run.returncode == 2 and message in run.stderr, run.stderr
