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
from autonorm.codegen.environment import kernel_digest
from autonorm.ops import layer_norm as codegen
from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.family import FAMILY
from autonorm.ops.layer_norm.problem import Problem
from autonorm.ops.layer_norm.space import default_config
from autonorm.runtime.limits import H200
from autonorm.store.db import TuningDB, TuningKey

COMMANDS = ["tune", "show", "export", "render", "info"]


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


H200_FINGERPRINT = "NVIDIA H200|sm90|132sm|l2=62914560|bus=6016|memclk=3201000"


def _store_winner(path: Path, problem: Problem, config: KernelConfig, rows_bucket: int,
                  metrics: dict) -> TuningKey:
    """Store ``config`` as an H200 winner, with the digest of the kernel it renders."""
    key = TuningKey.for_problem(H200_FINGERPRINT, problem, rows_bucket)
    kernel = kernel_digest(FAMILY.render(config, problem, H200).source)
    with TuningDB(path) as store:
        store.set_winner(key, config.to_dict(), metrics, kernel)
    return key


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


def test_render_early_weight_loads(runner):
    args = ["render", "--dtype", "fp32", "--threads", "256", "--vec", "4", "--rows-per-block",
            "1", "--cache", "registers", "--stats", "two_pass", "--blocks-per-sm", "0",
            "--cluster", "1", "--max-regs", "0", "--early"]
    result = runner.invoke(cli.main, [*args, "--hidden", "4096"])  # 4 vectors a thread
    assert result.exit_code == 0, result.output
    assert "t256v4r1-registers-two_pass-c1-p0-e" in result.output
    assert "wpre[it] = load_vec(wseg" in result.output
    # At 2 vectors a thread the loads move by themselves: a one-line reason, no traceback.
    bad = runner.invoke(cli.main, [*args, "--hidden", "2048"])
    assert bad.exit_code != 0 and "Traceback" not in bad.output
    assert len(_lines(bad.output)) == 1 and "leave early off" in bad.output


def test_render_impossible_combination(runner):
    result = runner.invoke(
        cli.main, ["render", "--hidden", "1000", "--vec", "8", "--dtype", "fp32"]
    )
    assert result.exit_code != 0
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = _lines(result.output)
    assert len(lines) == 1, result.output
    assert lines[0].startswith("error:")  # every error of the CLI is one `error: ...` line
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
    for hidden, config in zip((4096, 65536), configs, strict=True):
        _store_winner(tmp_path / "user.db", Problem(hidden, "bfloat16"), config, 1024,
                      {"median_us": 70.5, "gbps": 3811.0, "share": 0.91})
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
    config = KernelConfig(256, 8, 2, "registers", "two_pass", 1, 0)
    key = _store_winner(tmp_path / "user.db", Problem(4096, "bfloat16", True, False),
                        config, 16384, {"median_us": 12.5, "gbps": 4000.0, "share": 0.9})
    config = config.to_dict()
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
    assert row["op"] == "layer_norm"
    assert row["kernel"] == kernel_digest(
        FAMILY.render(FAMILY.config_from_dict(config), Problem(4096, "bfloat16", True, False),
                      H200).source)


def test_export_default_config(runner, tmp_path):
    out = tmp_path / "out"
    result = runner.invoke(
        cli.main, ["export", "--hidden", "4096", "--dtype", "bf16", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    # The DefaultConfigWarning is a plain line on stderr, without Python's source line.
    [warning] = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert warning.startswith("warning: nothing is tuned for bfloat16 hidden 4096")
    assert "DefaultConfigWarning" not in result.stderr and ".py:" not in result.stderr
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
    config = KernelConfig.from_label("t512v8r1-bulk-two_pass-c2-p0-s3")
    _store_winner(tmp_path / "user.db", Problem(65536, "bfloat16"), config, 1024,
                  {"median_us": 73.5, "gbps": 3650.0, "share": 0.88})
    out = tmp_path / "out"
    result = runner.invoke(cli.main, ["export", "--hidden", "65536", "--dtype", "bf16",
                                      "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert (f"{config.label()} (user): autonorm_ln_bf16_h65536_forward(); "
            "autonorm_ln_bf16_h65536_forward_ws() takes a workspace of 8 bytes") in result.stderr


def _study_log(quiet: bool) -> str:
    # A fresh interpreter: Optuna sets its logger to INFO on first import, which the CLI must
    # undo, or "A new study created" lines reach the user's terminal.
    code = ("from autonorm import cli\n" + ("cli._quiet_optuna()\n" if quiet else "")
            + "import optuna\noptuna.create_study()\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=120)
    return proc.stderr


def test_tune_keeps_optunas_info_lines_out_of_the_output():
    assert "A new study created" in _study_log(quiet=False)  # the check can fail
    assert "A new study created" not in _study_log(quiet=True)


def test_tune_stores_the_winner_and_says_so(runner, tmp_path, monkeypatch):
    """`autonorm tune` end to end on the CPU: a fake H200 and the fake evaluator."""
    from fake_evaluator import FakeEvaluator, fake_median_us

    import autonorm.runtime.device
    from autonorm.runtime.device import DeviceInfo
    from autonorm.tune import session

    device = DeviceInfo(name="NVIDIA H200", cc=90, sm_count=132, l2_bytes=62914560,
                        smem_optin=232448, mem_bus_bits=6016, mem_clock_khz=3201000)
    assert device.fingerprint == H200_FINGERPRINT
    monkeypatch.setattr(autonorm.runtime.device, "query_device", lambda device_id=None: device)
    evaluator = FakeEvaluator()
    monkeypatch.setattr(session, "_build_evaluator", lambda *args: evaluator)
    result = runner.invoke(cli.main, ["tune", "--hidden", "4096", "--trials", "6",
                                      "--rows", "1000"])
    assert result.exit_code == 0, result.output
    best = min(evaluator.calls, key=fake_median_us)
    assert "study nvidia-h200-" in result.stderr and "layer-norm_bfloat16_h4096" in result.stderr
    assert f"winner: {best.label()}" in result.stdout
    assert "6 candidates measured" in result.stdout
    assert str(tmp_path / "user.db") in result.stdout
    problem = Problem(4096, "bfloat16")
    with TuningDB(tmp_path / "user.db") as store:
        winner = store.get_winner(TuningKey.for_problem(H200_FINGERPRINT, problem, 1024))
    assert winner.config == best.to_dict()
    assert winner.kernel == kernel_digest(FAMILY.render(best, problem, H200).source)


def test_tune_names_the_candidates_that_failed(runner, tmp_path, monkeypatch):
    """`autonorm tune` says which candidates failed and why, not only how many."""
    from fake_evaluator import FakeEvaluator

    import autonorm.runtime.device
    from autonorm.runtime.device import DeviceInfo
    from autonorm.tune import session

    device = DeviceInfo(name="NVIDIA H200", cc=90, sm_count=132, l2_bytes=62914560,
                        smem_optin=232448, mem_bus_bits=6016, mem_clock_khz=3201000)
    monkeypatch.setattr(autonorm.runtime.device, "query_device", lambda device_id=None: device)
    evaluator = FakeEvaluator(fail=lambda c: "launch" if c.cache == "smem" else None)
    monkeypatch.setattr(session, "_build_evaluator", lambda *args: evaluator)
    result = runner.invoke(cli.main, ["tune", "--hidden", "4096", "--trials", "12",
                                      "--rows", "1000"])
    assert result.exit_code == 0, result.output
    failed = list(dict.fromkeys(c.label() for c in evaluator.calls if c.cache == "smem"))
    assert failed, "the fake search tried no smem candidate: the check below could not fail"
    assert f"{len(failed)} failed at launch" in result.stdout
    newest = failed[-1]
    assert f"  failed at launch: {newest}: fake launch failure of {newest}\n" in result.stderr
    named = [line for line in result.stderr.splitlines() if "failed at launch: " in line]
    assert len(named) == min(len(failed), 3)


def test_an_unknown_op_is_refused(runner):
    for command in (["tune"], ["export", "-o", "x"], ["render"]):
        result = runner.invoke(cli.main, [*command, "--op", "no_such_op", "--hidden", "64"])
        assert result.exit_code == 2
        assert "'no_such_op' is not a known op (layer_norm" in result.output
        assert "Traceback" not in result.output


def test_render_takes_a_config_as_json(runner):
    by_options = runner.invoke(cli.main, ["render", "--hidden", "1000", "--dtype", "fp32",
                                          "--cache", "smem", "--threads", "128"])
    by_json = runner.invoke(cli.main, ["render", "--hidden", "1000", "--dtype", "fp32",
                                       "--config", '{"cache": "smem", "threads": 128}'])
    assert by_options.exit_code == 0 and by_json.exit_code == 0, by_json.output
    assert by_json.output == by_options.output and "__global__" in by_json.output
    for bad, why in (('{"colour": 1}', "has no field colour"), ("[1]", "JSON object"),
                     ("{", "not JSON")):
        result = runner.invoke(cli.main, ["render", "--hidden", "1000", "--config", bad])
        assert result.exit_code == 2 and why in result.output, result.output


class _StubFamily:
    """A family of another op, as far as the CLI's problem options reach."""

    op = "stub_op"

    def problem(self, hidden: int, dtype: str) -> Problem:
        return Problem(hidden, dtype)


def test_layer_norm_options_belong_to_layer_norm(runner, monkeypatch):
    from autonorm.ops import registry

    registry.register(_StubFamily())
    try:
        result = runner.invoke(cli.main, ["render", "--op", "stub_op", "--hidden", "64",
                                          "--threads", "128"])
        assert result.exit_code == 2
        assert "--threads is a layer_norm field; give the fields of stub_op with --config" in (
            result.output)
        result = runner.invoke(cli.main, ["render", "--op", "stub_op", "--hidden", "64",
                                          "--no-weight"])
        assert result.exit_code == 2 and "op stub_op takes no --no-weight" in result.output
    finally:
        registry.unregister("stub_op")
