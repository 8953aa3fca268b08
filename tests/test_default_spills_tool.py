"""benchmarks/default_spills.py: the grid it renders, its one-line errors, and a real nvcc run.

No GPU: the defaults compile offline (skipped where nvcc is not installed; CI installs it).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from test_compile_offline import requires_nvcc

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import default_spills  # noqa: E402 - benchmarks/ is not a package


def test_the_grid_takes_every_form_dtype_size_and_row_count():
    args = default_spills.parse_args(["--ops", "rms_norm", "--dtypes", "bf16,fp32", "--hidden",
                                      "1000,4099", "--rows", "grid,64"])
    kernels, shapes = default_spills.defaults(args)
    launches = sum(map(len, shapes.values()))
    # 5 forms, less the float32 residual beside float32 x: 9 problems a size, 2 sizes, 2 rows.
    assert launches == 9 * 2 * 2
    every = [s for ss in shapes.values() for s in ss]
    assert sum("x 67108 rows" in s for s in every) == 9  # the grid's rows at 1000
    assert sum("x 64 rows" in s for s in every) == 18
    assert {k.problem.op for k, _ in kernels.values()} == {"rms_norm"}


@pytest.mark.parametrize(("argv", "says"), [
    (["--ops", "group_norm"], "unknown op 'group_norm'"),
    (["--hidden", "12,x"], "comma-separated integers"),
    (["--rows", "0"], "must be >= 1"),
    (["--dtypes", "fp64"], "fp64"),
    (["--arch", "sm_87"], "no limits known for sm_87"),
])
def test_bad_arguments_end_in_one_line(argv, says, capsys):
    with pytest.raises(SystemExit):
        default_spills.parse_args(argv)
    assert says in capsys.readouterr().err


@requires_nvcc
@pytest.mark.slow
def test_the_spilling_defaults_are_listed_and_fail_the_run(capsys):
    # LayerNorm bf16 backward at odd 9001: the row in registers one element a vector spills.
    assert default_spills.main(["--ops", "layer_norm_backward", "--dtypes", "bf16", "--hidden",
                                "9001", "--rows", "grid"]) == 1
    out = capsys.readouterr().out.splitlines()
    spilled, total = (int(n) for n in out[0].split(" default kernels")[0].split(" of "))
    assert 0 < spilled <= total
    assert out[1] == f"by hidden size: 9001: {spilled}"
    kernels = [i for i, line in enumerate(out) if "spill stores" in line]
    assert len(kernels) == spilled
    # Each with what dispatch does about it: only a kernel that reads the row again fits, a
    # slower kind of kernel, so the default stays.
    for i in kernels:
        assert out[i + 1] == ("    no leaner pick runs without spills: dispatch keeps the "
                              "default"), out[i + 1]
    assert default_spills.main(["--ops", "layer_norm_backward", "--dtypes", "bf16", "--hidden",
                                "4096", "--rows", "grid"]) == 0
    assert capsys.readouterr().out.startswith("0 of ")
