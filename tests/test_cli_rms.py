"""CPU tests of the ``autonorm`` command line with ``--op rms_norm``: every verb, its flags.

RMSNorm has a weight, optionally Gemma's ``1 + weight`` (``--weight-offset``), no bias, and a
form that adds a residual first (``--residual``); LayerNorm has no weight offset and no
residual add. ``tune`` runs on a fake H200 with the fake evaluator; an
exported kernel is compiled with nvcc where the CUDA toolkit is installed.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from fake_evaluator import FakeEvaluator
from test_cli_errors import H200, assert_one_error_line, invoke

from autonorm import cli
from autonorm.codegen.environment import kernel_digest
from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.rms_norm.family import FAMILY
from autonorm.ops.rms_norm.problem import Problem
from autonorm.runtime import offline
from autonorm.runtime.limits import H200 as H200_LIMITS
from autonorm.store.db import TuningDB, TuningKey

RMS = ["--op", "rms_norm"]


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Problem]:
    """A tmp user DB and cache, no shipped DB, a fake H200; returns the problems tuned."""
    import autonorm.runtime.device
    from autonorm.tune import session

    monkeypatch.setenv("AUTONORM_DB", str(tmp_path / "user.db"))
    monkeypatch.setenv("AUTONORM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("AUTONORM_NO_SHIPPED_DB", "1")
    monkeypatch.delenv("AUTONORM_SHIPPED_DB", raising=False)
    monkeypatch.setattr(autonorm.runtime.device, "query_device", lambda device_id=None: H200)
    tuned: list[Problem] = []

    def build(problem, rows, *rest):  # noqa: ANN001, ANN202, ARG001
        tuned.append(problem)
        return FakeEvaluator()

    monkeypatch.setattr(session, "_build_evaluator", build)
    return tuned


def _render(*args: str) -> str:
    result = CliRunner().invoke(cli.main, ["render", *RMS, *args])
    assert result.exit_code == 0, result.output
    return result.stdout


def _store_winner(path: Path, problem: Problem, config: KernelConfig, rows_bucket: int) -> None:
    """Store ``config`` as the H200 winner of an RMSNorm problem (its kernel's digest too)."""
    key = TuningKey.for_problem(H200.fingerprint, problem, rows_bucket)
    kernel = kernel_digest(FAMILY.render(config, problem, H200_LIMITS).source)
    with TuningDB(path) as store:
        store.set_winner(key, config.to_dict(), {"median_us": 12.5, "gbps": 3900.0,
                                                 "share": 0.93}, kernel)


# -- render ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("flags", "problem"), [
    ([], Problem(4096)),
    (["--weight-offset"], Problem(4096, weight_offset=True)),
    (["--no-weight", "--dtype", "fp32"], Problem(4096, "float32", has_weight=False)),
], ids=["weight", "offset", "no-weight"])
def test_render_prints_the_rmsnorm_kernel_of_the_problem(env, flags, problem):
    source = _render("--hidden", "4096", *flags)
    expected = FAMILY.render(FAMILY.default(problem, H200_LIMITS), problem, H200_LIMITS).source
    assert source == expected
    assert "RMSNorm forward" in source and "__global__" in source


def test_the_weight_offset_renders_another_kernel():
    plain, offset = _render("--hidden", "2048"), _render("--hidden", "2048", "--weight-offset")
    assert plain != offset
    assert "weight_offset=False" in plain and "weight_offset=True" in offset


def test_render_takes_the_layer_norm_kernel_fields_for_rms_norm():
    by_options = _render("--hidden", "8192", "--threads", "256", "--cache", "bulk",
                         "--cluster", "2")
    by_json = _render("--hidden", "8192", "--config",
                      '{"threads": 256, "cache": "bulk", "cluster": 2, "stages": 2}')
    assert by_options == by_json
    assert "t256v8r1-bulk-two_pass-c2-p0-s2" in by_options


# -- the flags each op takes ------------------------------------------------------------------


@pytest.mark.parametrize("verb", [["render"], ["export", "-o", "{tmp}/out"], ["tune"]])
@pytest.mark.parametrize(("args", "expected"), [
    ([*RMS, "--no-bias"], "op rms_norm takes no --no-bias: its problem has no bias"),
    (["--weight-offset"], "op layer_norm takes no --weight-offset: its problem has no weight "
                          "offset (1 + weight) (ops with one: rms_norm, rms_norm_backward)"),
    ([*RMS, "--weight-offset", "--no-weight"],
     "--weight-offset scales by 1 + weight: it cannot go with --no-weight"),
], ids=["rms-no-bias", "layer-norm-offset", "offset-without-weight"])
def test_a_flag_the_op_has_no_field_for_is_one_error_line(env, tmp_path, verb, args, expected):
    verb = [a.replace("{tmp}", str(tmp_path)) for a in verb]
    assert_one_error_line(*invoke([*verb, "--hidden", "4096", *args]), expected)
    assert not env and not (tmp_path / "out").exists()


# -- export -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("flags", "stem"), [
    ([], "autonorm_rms_bf16_h4096"),
    (["--weight-offset"], "autonorm_rms_bf16_h4096_offset"),
    (["--no-weight", "--dtype", "fp16"], "autonorm_rms_fp16_h4096_noweight"),
], ids=["weight", "offset", "no-weight"])
def test_export_writes_the_rmsnorm_kernel_named_by_the_family(env, tmp_path, flags, stem):
    status, out, err = invoke(["export", *RMS, "--hidden", "4096", *flags,
                               "-o", str(tmp_path / "out")])
    assert status == 0, err
    written = [Path(line) for line in out.split()]
    assert sorted(p.name for p in written) == [f"{stem}.cu", f"{stem}.h", f"{stem}.json"]
    assert all(p.parent == tmp_path / "out" and p.is_file() for p in written)
    assert "warning: nothing is tuned for" in err  # no winner: the untuned default, said so
    manifest = json.loads((tmp_path / "out" / f"{stem}.json").read_text())
    problem = FAMILY.problem(**manifest["problem"])
    assert manifest["problem"] == problem.fields() and "has_bias" not in manifest["problem"]
    assert f"{stem}_forward()" in err
    source = (tmp_path / "out" / f"{stem}.cu").read_text()
    assert "RMSNorm forward" in source
    assert FAMILY.render(FAMILY.config_from_dict(manifest["config"]), problem,
                         H200_LIMITS).source in source


def test_export_takes_the_stored_rmsnorm_winner_of_its_weight_form(env, tmp_path):
    offset = KernelConfig(256, 8, 2, "registers", "two_pass", 1, 0)
    plain = KernelConfig(512, 8, 1, "smem", "two_pass", 1, 0)
    _store_winner(tmp_path / "user.db", Problem(4096, weight_offset=True), offset, 1024)
    _store_winner(tmp_path / "user.db", Problem(4096), plain, 1024)
    for flags, config in (([], plain), (["--weight-offset"], offset)):
        status, out, err = invoke(["export", *RMS, "--hidden", "4096", "--rows", "1024",
                                   *flags, "-o", str(tmp_path / "out")])
        assert status == 0, err
        manifest = json.loads(Path(next(p for p in out.split() if p.endswith(".json")))
                              .read_text())
        assert manifest["label"] == config.label() and "warning" not in err


def test_an_exported_rmsnorm_kernel_compiles_with_plain_nvcc(env, tmp_path):
    nvcc = offline.nvcc_path()
    if nvcc is None:
        pytest.skip("nvcc not found on PATH: compiling exported kernels needs the CUDA toolkit")
    sources = []
    for flags in ([], ["--weight-offset"]):
        status, out, err = invoke(["export", *RMS, "--hidden", "4096", *flags,
                                   "-o", str(tmp_path)])
        assert status == 0, err
        sources += [Path(p).name for p in out.split() if p.endswith(".cu")]
    assert len(sources) == 2
    for source in sources:
        proc = subprocess.run(
            [nvcc, "-arch=sm_90", "-std=c++17", "-Xcompiler", "-Wall,-Wextra", "-c", source,
             "-o", source.replace(".cu", ".o")],
            cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "warning" not in (proc.stdout + proc.stderr).lower(), proc.stderr
        assert (tmp_path / source.replace(".cu", ".o")).stat().st_size > 0


# -- show -------------------------------------------------------------------------------------


def test_show_lists_rmsnorm_winners_with_their_weight_form(env, tmp_path):
    config = KernelConfig(256, 8, 2, "registers", "two_pass", 1, 0)
    _store_winner(tmp_path / "user.db", Problem(3072, weight_offset=True), config, 1024)
    status, out, err = invoke(["show", "--op", "rms_norm", "--json"])
    assert status == 0, err
    [record] = json.loads(out)
    assert (record["op"], record["hidden"], record["weight_offset"]) == ("rms_norm", 3072, True)
    assert record["config"] == config.to_dict()
    status, out, err = invoke(["show", "--op", "layer_norm", "--json"])
    assert status == 0 and json.loads(out) == []
    status, out, err = invoke(["show"])
    assert status == 0, err
    line = next(ln for ln in out.splitlines() if config.label() in ln)
    assert "rms_norm" in line and " 3072 " in line and "weight_offset" in line


def test_show_keeps_the_fused_add_or_the_plain_norm_on_request(env, tmp_path):
    config = KernelConfig(256, 8, 1, "registers", "two_pass", 1, 0)
    for residual in (False, True):
        _store_winner(tmp_path / "user.db", Problem(4096, residual=residual), config, 1024)
    for flags, kept in (([], {False, True}), (["--residual"], {True}),
                        (["--no-residual"], {False})):
        status, out, err = invoke(["show", *RMS, "--json", *flags])
        assert status == 0, err
        records = json.loads(out)
        assert len(records) == len(kept) and {r["residual"] for r in records} == kept, flags


# -- tune -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("flags", "problem", "says"), [
    ([], Problem(4096), "(weight)"),
    (["--weight-offset"], Problem(4096, weight_offset=True), "(1 + weight)"),
    (["--no-weight"], Problem(4096, has_weight=False), "(no weight)"),
], ids=["weight", "offset", "no-weight"])
def test_tune_stores_an_rmsnorm_winner_under_its_op(env, tmp_path, flags, problem, says):
    status, out, err = invoke(["tune", *RMS, "--hidden", "4096", "--rows", "1024",
                               "--trials", "3", *flags])
    assert status == 0, err
    assert f"tuning rms_norm bfloat16 hidden 4096 {says}, rows=1024" in err
    assert env == [problem]
    with TuningDB(tmp_path / "user.db") as store:
        winner = store.get_winner(TuningKey.for_problem(H200.fingerprint, problem, 1024))
        assert [w.key.op for w in store.winners()] == ["rms_norm"]
    assert winner is not None
    assert f"winner: {FAMILY.config_from_dict(winner.config).label()}" in out


def _table(stdout: str) -> dict[str, str]:
    """A plan's summary rows by shape (the first column)."""
    return {line.split("  ")[0].strip(): line for line in stdout.splitlines()[1:]}


def test_a_plan_lists_and_tunes_the_rmsnorm_shapes_beside_layer_norm(env):
    status, out, err = invoke(["tune", "--op", "layer_norm,rms_norm", "--hidden", "1024",
                               "--rows", "64", "--trials", "3"])
    assert status == 0, err
    assert "tuning a plan of 2 shapes on NVIDIA H200 (132 SMs): 0 already stored, 2 to tune" in err
    rows = _table(out)
    assert list(rows) == ["layer_norm bf16 hidden 1024 rows 64",
                          "rms_norm bf16 hidden 1024 rows 64"]
    assert all(row.endswith("  tuned") for row in rows.values())
    assert [type(p).op for p in env] == ["layer_norm", "rms_norm"]


def test_a_gemma_config_tunes_rmsnorm_scaled_by_one_plus_its_weight(env, tmp_path):
    gemma = tmp_path / "gemma.json"
    gemma.write_text(json.dumps({"model_type": "gemma", "hidden_size": 3072,
                                 "rms_norm_eps": 1e-06, "torch_dtype": "bfloat16"}))
    llama = tmp_path / "llama.json"
    llama.write_text(json.dumps({"model_type": "llama", "hidden_size": 4096,
                                 "rms_norm_eps": 1e-05, "torch_dtype": "bfloat16"}))
    status, out, err = invoke(["tune", "--config", str(gemma), "--config", str(llama),
                               "--rows", "64", "--trials", "3"])
    assert status == 0, err
    assert f"{gemma}: rms_norm over hidden 3072, 1 + weight, eps 1e-06, dtype bfloat16" in err
    assert f"{llama}: rms_norm over hidden 4096, eps 1e-05, dtype bfloat16" in err
    # Each RMSNorm plain and after the residual add (autonorm.tune.plan says why).
    assert list(_table(out)) == ["rms_norm bf16 hidden 3072 rows 64 1 + weight",
                                 "rms_norm bf16 hidden 3072 rows 64 1 + weight residual add",
                                 "rms_norm bf16 hidden 4096 rows 64",
                                 "rms_norm bf16 hidden 4096 rows 64 residual add"]
    assert env == [Problem(3072, weight_offset=True),
                   Problem(3072, weight_offset=True, residual=True), Problem(4096),
                   Problem(4096, residual=True)]
    # The resume check keys the weight form: a rerun finds both stored, tunes nothing.
    env.clear()
    status, out, err = invoke(["tune", "--config", str(gemma), "--config", str(llama),
                               "--rows", "64", "--trials", "3"])
    assert status == 0, err
    assert env == [] and all(r.endswith("already stored") for r in _table(out).values())


# -- the residual add ---------------------------------------------------------------------------

ADD = Problem(8192, residual=True)


def test_render_prints_the_residual_kernel_of_the_problem(env):
    source = _render("--hidden", "8192", "--residual")
    expected = FAMILY.render(FAMILY.default(ADD, H200_LIMITS), ADD, H200_LIMITS).source
    assert source == expected and source != _render("--hidden", "8192")
    assert "__restrict__ res," in source and "__restrict__ hout," in source


def test_tune_residual_stores_the_residual_winner_apart_from_the_plain_one(env, tmp_path):
    status, out, err = invoke(["tune", *RMS, "--residual", "--hidden", "8192", "--rows", "1024",
                               "--trials", "3"])
    assert status == 0, err
    assert "tuning rms_norm residual + bfloat16 hidden 8192 (weight), rows=1024" in err
    assert env == [ADD]
    with TuningDB(tmp_path / "user.db") as store:
        winner = store.get_winner(TuningKey.for_problem(H200.fingerprint, ADD, 1024))
        assert store.get_winner(TuningKey.for_problem(H200.fingerprint, Problem(8192), 1024)
                                ) is None
    assert winner is not None and winner.key.fields["residual"] is True
    assert f"winner: {FAMILY.config_from_dict(winner.config).label()}" in out
    # The residual add runs from a row cache only: never the uncached kernel.
    assert FAMILY.config_from_dict(winner.config).cache in ("registers", "smem", "bulk")


def test_show_says_which_winner_adds_the_residual(env, tmp_path):
    plain = KernelConfig(256, 8, 1, "registers", "two_pass", 1, 0)
    added = KernelConfig(512, 8, 1, "smem", "two_pass", 1, 0)
    _store_winner(tmp_path / "user.db", Problem(8192), plain, 1024)
    _store_winner(tmp_path / "user.db", ADD, added, 1024)
    status, out, err = invoke(["show", "--op", "rms_norm", "--json"])
    assert status == 0, err
    records = {r["config"]["threads"]: r for r in json.loads(out)}
    assert (records[256]["residual"], records[512]["residual"]) == (False, True)
    status, out, err = invoke(["show"])
    assert status == 0, err
    line = {c.label(): next(ln for ln in out.splitlines() if c.label() in ln)
            for c in (plain, added)}
    assert "residual" in line[added.label()] and "residual" not in line[plain.label()]


def test_export_residual_writes_the_fused_launcher_and_names_the_op_when_untuned(env, tmp_path):
    status, out, err = invoke(["export", *RMS, "--residual", "--hidden", "8192",
                               "-o", str(tmp_path / "out")])
    assert status == 0, err
    stem = "autonorm_add_rms_bf16_h8192"
    assert sorted(Path(p).name for p in out.split()) == [f"{stem}.cu", f"{stem}.h",
                                                         f"{stem}.json"]
    assert ("warning: nothing is tuned for residual + bfloat16 hidden 8192 (weight), op "
            "rms_norm, on any device") in err
    assert "`autonorm tune --op rms_norm`" in err
    manifest = json.loads((tmp_path / "out" / f"{stem}.json").read_text())
    assert manifest["problem"]["residual"] is True
    assert [p["name"] for p in manifest["parameters"]] == [
        "x", "residual", "weight", "y", "h", "rows", "eps", "stream"]
    header = (tmp_path / "out" / f"{stem}.h").read_text()
    assert "h[r, :] = x[r, :] + residual[r, :]" in header


def test_the_residual_winner_is_exported_not_the_plain_one(env, tmp_path):
    plain = KernelConfig(256, 8, 1, "registers", "two_pass", 1, 0)
    added = KernelConfig(512, 8, 1, "smem", "two_pass", 1, 0)
    _store_winner(tmp_path / "user.db", Problem(8192), plain, 1024)
    _store_winner(tmp_path / "user.db", ADD, added, 1024)
    for flags, config in (([], plain), (["--residual"], added)):
        status, out, err = invoke(["export", *RMS, "--hidden", "8192", "--rows", "1024",
                                   *flags, "-o", str(tmp_path / "out")])
        assert status == 0, err
        manifest = json.loads(Path(next(p for p in out.split() if p.endswith(".json")))
                              .read_text())
        assert manifest["label"] == config.label() and "warning" not in err
        assert manifest["problem"]["residual"] is bool(flags)


def test_a_model_plan_keeps_one_form_with_residual_or_no_residual(env, tmp_path):
    llama = tmp_path / "llama.json"
    llama.write_text(json.dumps({"model_type": "llama", "hidden_size": 4096,
                                 "rms_norm_eps": 1e-05, "torch_dtype": "bfloat16"}))
    for flag, problem in (("--residual", Problem(4096, residual=True)),
                          ("--no-residual", Problem(4096))):
        env.clear()
        status, out, err = invoke(["tune", "--config", str(llama), flag, "--rows", "64",
                                   "--trials", "3"])
        assert status == 0, err
        assert env == [problem] and len(_table(out)) == 1
        assert "planned plain and after the residual add" not in err
