"""CPU tests of the ``autonorm`` command line (click's CliRunner, plus one real subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from autonorm import cli
from autonorm.ops import layer_norm as codegen
from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.problem import Problem
from autonorm.ops.layer_norm.space import default_config
from autonorm.store.db import TuningDB, TuningKey

COMMANDS = ["tune", "show", "export", "render"]


@pytest.fixture
def runner(tmp_path, monkeypatch):
    """A CliRunner with an empty tmp user DB and the shipped DB disabled."""
    monkeypatch.setenv("AUTONORM_DB", str(tmp_path / "user.db"))
    monkeypatch.setenv("AUTONORM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("AUTONORM_NO_SHIPPED_DB", "1")
    monkeypatch.delenv("AUTONORM_SHIPPED_DB", raising=False)
    return CliRunner()


def _no_gpu(monkeypatch):
    """Make sure no GPU is seen here, even if CuPy happens to be installed."""
    import autonorm.runtime.device

    def query_device(device_id=None):  # noqa: ARG001
        raise autonorm.runtime.device.NoGPUError("no CUDA GPU found on this machine")

    monkeypatch.setattr(autonorm.runtime.device, "query_device", query_device)


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def test_module_entry_point_help():
    env = {**os.environ, "AUTONORM_NO_SHIPPED_DB": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "autonorm", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    for command in COMMANDS:
        assert command in proc.stdout


def test_group_help(runner):
    result = runner.invoke(cli.main, ["--help"])
    assert result.exit_code == 0
    for command in COMMANDS:
        assert command in result.output


@pytest.mark.parametrize("command", COMMANDS)
def test_command_help(runner, command):
    result = runner.invoke(cli.main, [command, "--help"])
    assert result.exit_code == 0, result.output
    assert f"Usage: main {command}" in result.output or f"{command} [OPTIONS]" in result.output


def test_render_prints_cuda_source(runner):
    result = runner.invoke(
        cli.main, ["render", "--hidden", "1000", "--dtype", "fp32", "--cache", "smem"]
    )
    assert result.exit_code == 0, result.output
    problem = Problem(1000, "float32", True, True)
    config = KernelConfig.from_dict({**default_config(problem).to_dict(), "cache": "smem"})
    name = codegen.kernel_name(config, problem)
    assert name in result.output
    assert "__global__" in result.output


def test_render_bulk_kernel(runner):
    result = runner.invoke(
        cli.main,
        ["render", "--hidden", "16384", "--dtype", "bf16", "--cache", "bulk", "--cluster", "2",
         "--stages", "3"],
    )
    assert result.exit_code == 0, result.output
    assert "-bulk-two_pass-c2-p0-s3" in result.output
    assert "cp.async.bulk" in result.output and "__cluster_dims__(2, 1, 1)" in result.output
    # --stages on a kernel that has none is refused with a one-line reason.
    bad = runner.invoke(cli.main, ["render", "--hidden", "1024", "--cache", "smem",
                                   "--stages", "2"])
    assert bad.exit_code != 0
    assert "stages apply to the bulk-copy kernel only" in bad.output


def test_render_register_cap(runner):
    args = ["render", "--hidden", "768", "--dtype", "bf16", "--threads", "128",
            "--rows-per-block", "4", "--cache", "smem"]
    capped = runner.invoke(cli.main, [*args, "--max-regs", "64"])
    assert capped.exit_code == 0, capped.output
    assert "t128v8r4-smem-two_pass-c1-p0-m64" in capped.output
    assert "__launch_bounds__(128, 8)" in capped.output  # 65,536 / (128 x 8) = 64 registers
    uncapped = runner.invoke(cli.main, [*args, "--max-regs", "0"])
    assert uncapped.exit_code == 0 and "__launch_bounds__(128, 8)" not in uncapped.output
    # fp32 takes no cap: a one-line reason, no traceback.
    bad = runner.invoke(cli.main, ["render", "--hidden", "768", "--dtype", "fp32",
                                   "--max-regs", "64"])
    assert bad.exit_code != 0 and "Traceback" not in bad.output
    assert "16-bit rows only" in bad.output


def test_render_impossible_combination(runner):
    result = runner.invoke(
        cli.main, ["render", "--hidden", "1000", "--vec", "8", "--dtype", "fp32"]
    )
    assert result.exit_code != 0
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = _lines(result.output)
    assert len(lines) == 1, result.output
    assert lines[0].startswith("Error:")
    assert "vec" in lines[0]
    assert "Traceback" not in result.output


def test_render_bad_dtype(runner):
    result = runner.invoke(cli.main, ["render", "--hidden", "1024", "--dtype", "int8"])
    assert result.exit_code == 2
    assert "int8" in result.output
    assert "Traceback" not in result.output


def test_tune_needs_gpu(runner, monkeypatch):
    _no_gpu(monkeypatch)
    result = runner.invoke(cli.main, ["tune", "--hidden", "16384"])
    assert result.exit_code != 0
    assert isinstance(result.exception, SystemExit)
    assert "needs a CUDA GPU" in result.output


def test_tune_hidden_zero(runner, monkeypatch):
    _no_gpu(monkeypatch)
    result = runner.invoke(cli.main, ["tune", "--hidden", "0"])
    assert result.exit_code != 0
    assert isinstance(result.exception, SystemExit)
    assert "hidden" in result.output


def test_show_empty(runner, monkeypatch):
    _no_gpu(monkeypatch)
    result = runner.invoke(cli.main, ["show"])
    assert result.exit_code == 0, result.output
    assert "no tuned kernels" in result.output


def test_show_prints_whole_rows_when_piped(runner, tmp_path):
    """Piped output (CliRunner is not a terminal) keeps each config label whole, one row a line."""
    configs = [KernelConfig(256, 8, 2, "registers", "two_pass", 1, 0),
               KernelConfig(512, 8, 1, "bulk", "two_pass", 4, 0, stages=2)]
    with TuningDB(tmp_path / "user.db") as store:
        for hidden, config in zip((4096, 65536), configs, strict=True):
            key = TuningKey(
                device="NVIDIA H200|sm90|132sm|l2=62914560|bus=6016|memclk=3201000",
                version=codegen.code_version(), dtype="bfloat16", hidden=hidden,
                has_weight=True, has_bias=True, rows_bucket=1024,
            )
            store.set_winner(key, config.to_dict(), {"median_us": 70.5, "gbps": 3811.0,
                                                      "share": 0.91})
    result = runner.invoke(cli.main, ["show", "--all-devices"])
    assert result.exit_code == 0, result.output
    for hidden, config in zip((4096, 65536), configs, strict=True):
        line = next(ln for ln in result.output.splitlines() if config.label() in ln)
        assert f" {hidden} " in line and "bf16" in line and "H200" in line and "91.0" in line
    assert "…" not in result.output


def test_tune_summary_says_its_failures_in_words():
    assert cli.describe_failures(
        {"invalid": 92, "compile": 0, "launch": 0, "verification": 0}
    ) == "92 invalid configurations skipped; none failed"
    assert cli.describe_failures({"invalid": 0, "compile": 2, "launch": 0, "verification": 1}) == (
        "2 failed to compile, 1 failed verification")
    assert cli.describe_failures({}) == "none failed"


def test_show_all_devices_json(runner, tmp_path):
    key = TuningKey(
        device="NVIDIA H200|sm90|132sm|l2=62914560|bus=6016|memclk=3201000",
        version=codegen.code_version(),
        dtype="bfloat16",
        hidden=4096,
        has_weight=True,
        has_bias=False,
        rows_bucket=16384,
    )
    config = KernelConfig(256, 8, 2, "registers", "two_pass", 1, 0).to_dict()
    with TuningDB(tmp_path / "user.db") as store:
        store.set_winner(key, config, {"median_us": 12.5, "gbps": 4000.0, "share": 0.9})
    result = runner.invoke(cli.main, ["show", "--all-devices", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert len(rows) == 1
    row = rows[0]
    assert row["source"] == "user"
    assert row["device"] == key.device
    assert (row["dtype"], row["hidden"], row["has_bias"], row["rows_bucket"]) == (
        "bfloat16",
        4096,
        False,
        16384,
    )
    assert row["config"] == config
    assert row["metrics"]["median_us"] == 12.5


def test_export_default_config(runner, tmp_path):
    from autonorm.export import DefaultConfigWarning

    out = tmp_path / "out"
    with pytest.warns(DefaultConfigWarning, match="nothing is tuned"):
        result = runner.invoke(
            cli.main, ["export", "--hidden", "4096", "--dtype", "bf16", "-o", str(out)]
        )
    assert result.exit_code == 0, result.output
    suffixes = sorted(p.suffix for p in out.iterdir())
    assert suffixes == [".cu", ".h", ".json"]
    manifest = json.loads(next(out.glob("*.json")).read_text())
    assert manifest.get("source") == "default"
    assert "__global__" in next(out.glob("*.cu")).read_text()
    # stdout is the three paths (for scripts); stderr says what they hold
    assert sorted(Path(line).suffix for line in result.stdout.split()) == [".cu", ".h", ".json"]
    assert f"{manifest['label']} (default): autonorm_ln_bf16_h4096_forward()" in result.stderr
    assert "workspace" not in result.stderr  # not a bulk-copy kernel


def test_export_of_a_bulk_winner_names_its_workspace_launcher(runner, tmp_path):
    key = TuningKey(
        device="NVIDIA H200|sm90|132sm|l2=62914560|bus=6016|memclk=3201000",
        version=codegen.code_version(), dtype="bfloat16", hidden=65536, has_weight=True,
        has_bias=True, rows_bucket=1024,
    )
    config = KernelConfig.from_label("t512v8r1-bulk-two_pass-c2-p0-s3")
    with TuningDB(tmp_path / "user.db") as store:
        store.set_winner(key, config.to_dict(), {"median_us": 73.5, "gbps": 3650.0,
                                                 "share": 0.88})
    out = tmp_path / "out"
    result = runner.invoke(cli.main, ["export", "--hidden", "65536", "--dtype", "bf16",
                                      "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert (f"{config.label()} (user): autonorm_ln_bf16_h65536_forward(); "
            "autonorm_ln_bf16_h65536_forward_ws() takes a workspace of 8 bytes") in result.stderr


def _study_log(quiet: bool) -> str:
    # A fresh interpreter: Optuna resets its logger to INFO on first import, which is what the
    # CLI must undo (the H200 cold-start log showed "A new study created" before this).
    code = ("from autonorm import cli\n" + ("cli._quiet_optuna()\n" if quiet else "")
            + "import optuna\noptuna.create_study()\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=120)
    return proc.stderr


def test_tune_keeps_optunas_info_lines_out_of_the_output():
    assert "A new study created" in _study_log(quiet=False)  # the check can fail
    assert "A new study created" not in _study_log(quiet=True)


def test_a_tune_worker_passes_the_seeds_for_its_rows(monkeypatch):
    # `--workers N` runs the study in N processes and the parent's call after them finds it
    # started, so only worker 0 can enqueue the seeds; before session 24 no worker passed them
    # and a multi-worker search began without its starting points.
    from autonorm.ops.layer_norm.space import seed_configs
    from autonorm.runtime.limits import H200
    from autonorm.tune import tuner

    class _Closable:
        pool = None

        def close(self) -> None:
            pass

    seen = {}
    monkeypatch.setattr(cli, "_tuning_parts",
                        lambda problem, rows, quiet=False: (None, _Closable(), H200, None,
                                                            _Closable()))
    monkeypatch.setattr(tuner, "tune", lambda *a, **kw: seen.update(kw))
    problem = Problem(16384, "float32")
    spec = {"problem": problem.__dict__, "rows": 1, "storage": "x.journal", "study": "s",
            "settings": {"n_trials": 4, "timeout_s": 1.0, "seed": 0}}
    cli._tune_worker(0, spec)
    assert seen["seeds"] == seed_configs(problem, H200, 1) and seen["worker_index"] == 0
    assert any(c.cluster == 8 for c in seen["seeds"])  # rows 1: the latency seeds too
