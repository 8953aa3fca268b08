"""The benchmark tools' no-GPU behaviour: every --help, and peers.py's self-test.

CI has no GPU, CuPy, Triton or CUDA PyTorch; these run the tools the way a newcomer's first
command would, so a broken import or argument parser shows here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autonorm.runtime.device import gpu_available

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
BASH = shutil.which("bash") or "/bin/bash"

SCRIPTS = ("peers.py", "explore.py", "backward.py", "launch_overhead.py", "offset_errors.py",
           "triton_tutorial_ln.py", "untuned.py", "skew_weights.py", "template_ab.py",
           "gpu_tests.py", "default_spills.py", "forced.py", "backward_latency.py",
           "bucket_reach.py", "tune_grid.py")

# Runs a script's --help with the GPU stack unimportable: --help must need none of it.
HELP_WITHOUT_GPU_STACK = """
import os, runpy, sys
for name in ("cupy", "triton", "torch"):
    sys.modules[name] = None
script = sys.argv[1]
sys.argv = [script, "--help"]
sys.path.insert(0, os.path.dirname(script))  # as `python script` puts its folder first
runpy.run_path(script, run_name="__main__")
"""


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=120, cwd=REPO)


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_describes_the_tool_without_the_gpu_stack(script):
    run = _run(sys.executable, "-c", HELP_WITHOUT_GPU_STACK, str(BENCHMARKS / script))
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    usage, _, rest = run.stdout.partition("\n\n")
    assert usage.startswith(f"usage: {script}"), run.stdout[:500]
    description = rest.partition("\n\n")[0]
    assert len(description.split()) >= 8, f"--help of {script} says too little: {description!r}"
    assert "--help" in run.stdout


# Each GPU script, with arguments that pass its parser, on this machine without a GPU.
GPU_RUNS = {
    "explore.py": ["--hidden", "1024", "--per-shape", "1"],
    "backward.py": [],
    "backward_latency.py": [],
    "bucket_reach.py": [],
    "offset_errors.py": [],
    "launch_overhead.py": [],
    "skew_weights.py": [],
    "tune_grid.py": ["--ops", "rms_norm"],
    "forced.py": ["--hidden", "490"],
    "template_ab.py": ["--variant", f"a={REPO}", "--variant", f"b={REPO}"],
    "untuned.py": ["--count", "1"],
    "peers.py": [],
    "gpu_tests.py": [],  # counting the GPUs needs one (--gpus N or --part K/N do not)
}


@pytest.mark.parametrize("script", sorted(GPU_RUNS))
def test_a_gpu_script_without_a_gpu_says_so_in_one_line(script, tmp_path):
    if gpu_available():
        pytest.skip("this machine has a GPU: the script would run")
    env = {**os.environ, "AUTONORM_DB": str(tmp_path / "user.db"),
           "AUTONORM_CACHE_DIR": str(tmp_path / "cache")}
    run = subprocess.run([sys.executable, str(BENCHMARKS / script), *GPU_RUNS[script]],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert run.returncode == 2, run.stdout[-2000:] + run.stderr[-2000:]
    assert "Traceback" not in run.stderr, run.stderr[-2000:]
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith(f"{script} needs a CUDA GPU"), run.stderr[-2000:]
    assert not (tmp_path / "user.db").exists()


def test_the_refusal_names_what_is_missing(monkeypatch, capsys):
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    from peerbench import gpu

    import autonorm.runtime.device as device

    def no_cupy():  # noqa: ANN202
        raise device.NoGPUError("CuPy is not installed")

    monkeypatch.setattr(device, "import_cupy", no_cupy)
    assert gpu.missing() == "CuPy is not installed"
    with pytest.raises(SystemExit) as exit_:
        gpu.require_gpu("x.py")
    assert exit_.value.code == 2
    assert capsys.readouterr().err == "x.py needs a CUDA GPU: CuPy is not installed\n"
    monkeypatch.setattr(device, "import_cupy", lambda: None)
    monkeypatch.setitem(sys.modules, "torch", None)  # an import of torch fails
    assert gpu.missing() is None
    assert gpu.missing(torch=True).startswith("PyTorch is not installed")


def test_gpu_checks_help_lists_every_suite():
    run = _run(BASH, str(BENCHMARKS / "gpu_checks.sh"), "--help")
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("usage: bash benchmarks/gpu_checks.sh")
    for suite in ("tests", "tune", "grid", "buckets", "ship", "models", "search", "peers", "ncu",
                  "ncu-backward"):
        assert f"\n  {suite} " in run.stdout, suite


def test_gpu_checks_refuses_an_unknown_suite_before_doing_anything(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path / "out")}
    run = subprocess.run([BASH, str(BENCHMARKS / "gpu_checks.sh"), "no-such-suite"],
                         capture_output=True, text=True, timeout=60, cwd=REPO, env=env)
    assert run.returncode == 2
    assert "unknown suite: no-such-suite" in run.stderr
    assert not (tmp_path / "out").exists()


def test_peers_selftest_renders_both_flushes(tmp_path):
    # peers.py --selftest runs its parsing, shares, tables and JSON on synthetic numbers (no GPU)
    # and asserts on them itself; here it must finish and leave a JSON with both flushes' shares.
    run = _run(sys.executable, str(BENCHMARKS / "peers.py"), "--selftest", "--plain",
               "--out", str(tmp_path))
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "selftest ok" in run.stdout
    data = json.loads((tmp_path / "peers.json").read_text())
    sweep = [m for m in data["measurements"] if m["suite"] == "sweep" and m["status"] == "ok"]
    assert sweep
    assert all(m["share"] > 0 and m["share_zero"] > 0 for m in sweep)
    assert {c["flush"] for c in data["meta"]["copy"]["used"]} == {"read", "zero"}


def test_explore_takes_a_row_count_or_elements_not_both(capsys: pytest.CaptureFixture) -> None:
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    import explore  # benchmarks/ is not a package

    assert explore.rows_of(explore.parse_args(["--rows", "256"]), 490) == 256
    assert explore.rows_of(explore.parse_args([]), 1024) == 2**26 // 1024
    assert explore.rows_of(explore.parse_args(["--elements", "100"]), 490) == 1
    assert explore.parse_args(["--residual"]).residual and not explore.parse_args([]).residual
    assert explore.parse_args(["--no-bias"]).no_bias and not explore.parse_args([]).no_bias
    assert explore.parse_args([]).top == 4 and explore.parse_args(["--top", "0"]).top == 0
    with pytest.raises(SystemExit):
        explore.parse_args(["--top", "-1"])

    def record(label: str, us: float, default: bool = False, status: str = "ok") -> dict:
        return {"label": label, "us": us, "share": 0.5, "gbps": 1.0, "cv": 0.0,
                "max_rel_err": 0.0, "default": default, "status": status, "error": "boom"}

    records = [record("a", 3.0, default=True), record("b", 1.0), record("c", 2.0),
               record("d", 0.0, status="wrong")]
    lines = explore.shape_lines(records, 2)
    assert [line.split()[-1] for line in lines[:2]] == ["b", "c"] and len(lines) == 3
    assert "FAIL wrong: d: boom" in lines[2]
    lines = explore.shape_lines(records, 0)  # every one, the default marked
    assert lines[2].endswith("a (default)") and len(lines) == 4
    assert explore.main(["--op", "rms_norm_backward", "--no-bias"]) == 2
    assert "rms_norm_backward has no bias" in capsys.readouterr().err
    assert explore.main(["--configs", '[{"threads": 64, "stat": "two_pass"}]']) == 2
    assert "layer_norm has no field stat" in capsys.readouterr().err
    assert explore.main(["--configs", "[64]"]) == 2
    assert "expected labels or a JSON list of dicts, got 64" in capsys.readouterr().err
    assert explore.main(["--configs", "t256v4r1-registers-two_pass-c8-p0,t512bogus"]) == 2
    assert "not a kernel label: 't512bogus'" in capsys.readouterr().err
    from autonorm.ops import registry

    family = registry.get("layer_norm")
    labels = "t256v4r1-registers-two_pass-c8-p0, t512v8r1-bulk-two_pass-c1-p0-s2-k"
    assert [c.label() for c in explore.parse_configs(family, "layer_norm", labels)] == [
        "t256v4r1-registers-two_pass-c8-p0", "t512v8r1-bulk-two_pass-c1-p0-s2-k"]
    as_json = json.dumps([{"threads": 256, "vec": 4, "rows_per_block": 1, "cache": "registers",
                           "stats": "two_pass", "cluster": 8}])
    assert explore.parse_configs(family, "layer_norm", as_json) == explore.parse_configs(
        family, "layer_norm", "t256v4r1-registers-two_pass-c8-p0")
    backward = registry.get("rms_norm_backward")
    assert explore.parse_configs(backward, "rms_norm_backward", "t256v8-registers-accsmem-p2")[
        0].label() == "t256v8-registers-accsmem-p2"
    assert explore.parse_configs(family, "layer_norm", " ") == []
    for argv, message in ((["--rows", "0"], "--rows must be >= 1, got 0"),
                          (["--rows", "8", "--elements", "64"], "not allowed with argument")):
        with pytest.raises(SystemExit):
            explore.parse_args(argv)
        assert message in capsys.readouterr().err


def test_skew_weights_reads_its_shapes_and_refuses_bad_ones(capsys: pytest.CaptureFixture) -> None:
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    import skew_weights

    args = skew_weights.parse_args(["--shapes", "bf16:4099,fp32:2053+add,rms:fp16:6151+add",
                                    "--rounds", "2"])
    assert args.shapes == [("layer_norm", "bf16", 4099, False), ("layer_norm", "fp32", 2053, True),
                           ("rms_norm", "fp16", 6151, True)]
    assert args.rounds == 2
    assert len(skew_weights.parse_args([]).shapes) == len(skew_weights.SHAPES)
    for argv, message in ((["--shapes", "bf16-4099"], "is not dtype:hidden"),
                          (["--shapes", "bf16:4099+mul"], "only '+add' may follow"),
                          (["--shapes", "mul:bf16:4099"], "the op is ln or rms"),
                          (["--rounds", "0"], "--rounds must be >= 1, got 0")):
        with pytest.raises(SystemExit):
            skew_weights.parse_args(argv)
        assert message in capsys.readouterr().err


def test_the_readme_lists_every_tool():
    readme = (REPO / "README.md").read_text()
    table = readme[readme.index("## Benchmarks and tools"):readme.index("## Documentation")]
    # grid_shapes.py is tune_grid.py's module, not a tool.
    tools = [p.name for p in BENCHMARKS.glob("*.py") if p.name != "grid_shapes.py"]
    assert len(tools) >= 14
    for name in [*tools, "gpu_checks.sh"]:
        assert f"`{name}`" in table, name


def test_forced_plans_its_candidates_and_refuses_bad_input(capsys: pytest.CaptureFixture) -> None:
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    import forced

    assert forced.main(["--dtypes", "fp32", "--hidden", "490", "--threads", "128", "--plan"]) == 0
    listed = capsys.readouterr().out.splitlines()
    labels = [line.strip() for line in listed[1:]]
    # fp32 490 at 128 threads: vectors of 1, 2 and 4 elements (4 reads skewed rows), both
    # statistics; the early loads only where a thread holds two vectors or fewer.
    assert listed[0] == f"layer_norm float32 490: {len(labels)} candidates, rows [1, 64, 256]"
    assert "t128v2r1-registers-two_pass-c1-p0" in labels
    assert "t128v4r1-registers-welford-c1-p0" in labels
    assert "t128v1r1-registers-two_pass-c1-p0-e" in labels
    assert not any(label.startswith("t128v8") for label in labels)  # past fp32's 16 bytes
    assert all(label.startswith("t128v") and "-registers-" in label for label in labels)
    chosen = "t256v4r1-registers-two_pass-c8-p0,t512v4r1-registers-two_pass-c8-p0"
    assert forced.main(["--hidden", "27656", "--configs", chosen, "--plan"]) == 0
    assert capsys.readouterr().out.split("\n")[1:3] == [
        "  t256v4r1-registers-two_pass-c8-p0", "  t512v4r1-registers-two_pass-c8-p0"]
    with pytest.raises(SystemExit, match="--configs: not a kernel label: 'bogus'"):
        forced.main(["--hidden", "490", "--configs", "bogus", "--plan"])
    for argv, message in ((["--hidden", "x"], "take comma-separated values"),
                          (["--hidden", "490", "--rows", "0"], "need positive integers"),
                          (["--hidden", "490", "--dtypes", "fp8"], "take comma-separated values"),
                          (["--hidden", "490", "--rounds", "0"], "--rounds must be at least 1")):
        with pytest.raises(SystemExit):
            forced.parse_args(argv)
        assert message in capsys.readouterr().err
