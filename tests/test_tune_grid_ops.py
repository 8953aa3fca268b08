"""tune_grid.py's ``--ops``: LayerNorm and RMSNorm, plain, after the fused residual add and
backward.

CPU only: the grid is expanded and listed without a GPU, and the tuning loop runs on a fake
H200 with the fake evaluator (tests/fake_evaluator.py) into a temporary database.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from fake_evaluator import FakeEvaluator

from autonorm.ops.layer_norm.problem import Problem as LayerNormProblem
from autonorm.ops.norm_backward.problem import LayerNormBackward, RMSNormBackward
from autonorm.ops.rms_norm.problem import Problem as RMSNormProblem
from autonorm.runtime.device import DeviceInfo
from autonorm.store.db import TuningDB, TuningKey

REPO = Path(__file__).resolve().parents[1]
MODELS = REPO / "autonorm" / "tuning_db" / "models.json"
sys.path.insert(0, str(REPO / "benchmarks"))

import peerbench.gpu  # noqa: E402
import tune_grid  # noqa: E402 - benchmarks/ is not a package

DTYPES = ("bfloat16", "float16", "float32")
HIDDEN = (768, 1024, 2048, 4096, 8192, 12288, 16384, 32768, 65536)
H200 = DeviceInfo(name="NVIDIA H200", cc=90, sm_count=132, l2_bytes=62914560,
                  smem_optin=232448, mem_bus_bits=6016, mem_clock_khz=3201000)


def shapes_of(argv: list[str]) -> list[tuple]:
    return tune_grid.grid(tune_grid.parse_args(argv))


def test_the_default_op_is_layer_norm_and_its_grid_is_unchanged():
    grid = shapes_of([])
    assert grid == [("layer_norm", d, h, 2**26 // h) for d in DTYPES for h in HIDDEN]
    assert shapes_of(["--ops", "layer_norm"]) == grid == shapes_of(["--op", "layer_norm"])
    # The problem is the one `--op layer_norm` always built: weight and bias.
    problem = tune_grid.problem_of(grid[0])
    assert problem == LayerNormProblem(768, "bfloat16", has_weight=True, has_bias=True)


def test_rms_ops_tune_the_plain_norm_and_the_residual_add_one_op_after_the_other():
    grid = shapes_of(["--ops", "rms_norm,add_rms_norm", "--dtypes", "bf16,fp32",
                      "--hidden", "4096,65536"])
    per_op = [(d, h, 2**26 // h) for d in ("bfloat16", "float32") for h in (4096, 65536)]
    assert grid == [("rms_norm", *s) for s in per_op] + [("add_rms_norm", *s) for s in per_op]
    plain, added = tune_grid.problem_of(grid[0]), tune_grid.problem_of(grid[4])
    assert plain == RMSNormProblem(4096, "bfloat16", has_weight=True, weight_offset=False,
                                   residual=False)
    assert added == RMSNormProblem(4096, "bfloat16", residual=True)
    # Two tuning keys: the plain norm's winner never stands in for the fused add's.
    keys = {TuningKey.for_problem(H200.fingerprint, p, 16384) for p in (plain, added)}
    assert len(keys) == 2 and {k.op for k in keys} == {"rms_norm"}
    assert [k.fields["residual"] for k in sorted(keys, key=lambda k: k.problem)] == [False, True]


def test_op_is_a_synonym_and_an_op_given_twice_is_tuned_once():
    assert tune_grid.parse_args(["--op", "add_rms_norm"]).op_names == ["add_rms_norm"]
    args = tune_grid.parse_args(["--ops", "add_rms_norm, rms_norm,add_rms_norm"])
    assert args.op_names == ["add_rms_norm", "rms_norm"]


def test_grid_rows_join_the_decode_and_prefill_buckets_once_per_bucket():
    grid = shapes_of(["--ops", "rms_norm", "--dtypes", "bf16", "--hidden", "4096,16384",
                      "--rows", "grid,64,4096"])
    # At hidden 16384 the grid's row count (2^26 / 16384) is the prefill bucket itself.
    assert [s[2:] for s in grid] == [(4096, 16384), (4096, 64), (4096, 4096),
                                     (16384, 4096), (16384, 64)]
    # Row counts of one power-of-two bucket are one tuning key: the first is timed.
    same = shapes_of(["--dtypes", "bf16", "--hidden", "1024", "--rows", "3000,4096,64"])
    assert same == [("layer_norm", "bfloat16", 1024, 3000), ("layer_norm", "bfloat16", 1024, 64)]


def test_models_give_each_op_the_hidden_sizes_of_its_norm():
    models = tune_grid.load_models(MODELS)
    layer = sorted({m["hidden"] for m in models if m["norm"] == "layer_norm"})
    rms = sorted({m["hidden"] for m in models if m["norm"] == "rms_norm"})
    assert tune_grid.norm_hidden_sizes(models, "rms_norm") == rms
    grid = shapes_of(["--models", str(MODELS), "--ops", "layer_norm,rms_norm,add_rms_norm",
                      "--dtypes", "bf16"])
    for op, sizes in (("layer_norm", layer), ("rms_norm", rms), ("add_rms_norm", rms)):
        assert [s[2:] for s in grid if s[0] == op] == [(h, r) for h in sizes for r in (64, 4096)]
    assert {3584, 896, 7168} <= {s[2] for s in grid if s[0] == "add_rms_norm"}
    assert not {3584, 896, 7168} & {s[2] for s in grid if s[0] == "layer_norm"}
    assert 1600 not in {s[2] for s in grid if s[0] == "rms_norm"}  # GPT-2 XL: LayerNorm


def test_models_without_an_rmsnorm_model_are_refused_for_an_rms_op(tmp_path, capsys):
    data = json.loads(MODELS.read_text())
    data["models"] = [m for m in data["models"] if m["norm"] == "layer_norm"]
    path = tmp_path / "models.json"
    path.write_text(json.dumps(data))
    assert shapes_of(["--models", str(path)])  # LayerNorm alone still plans
    with pytest.raises(SystemExit) as exit_:
        tune_grid.parse_args(["--models", str(path), "--ops", "layer_norm,add_rms_norm"])
    assert exit_.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == f"tune_grid.py: error: --models: {path} lists no rms_norm model"


def test_add_layer_norm_tunes_layer_norm_after_the_residual_add():
    grid = shapes_of(["--ops", "layer_norm,add_layer_norm", "--dtypes", "bf16",
                      "--hidden", "8192"])
    assert grid == [("layer_norm", "bfloat16", 8192, 8192),
                    ("add_layer_norm", "bfloat16", 8192, 8192)]
    plain, added = (tune_grid.problem_of(shape) for shape in grid)
    assert added == LayerNormProblem(8192, "bfloat16", has_weight=True, has_bias=True,
                                     residual=True)
    assert not plain.residual
    keys = {TuningKey.for_problem(H200.fingerprint, p, 8192) for p in (plain, added)}
    assert len(keys) == 2 and {k.op for k in keys} == {"layer_norm"}


def test_the_float32_residual_ops_tune_16_bit_x_only():
    grid = shapes_of(["--ops", "add_rms_norm_f32res,add_layer_norm_f32res", "--hidden", "4096"])
    assert [(s.op, s.dtype) for s in grid] == [
        ("add_rms_norm_f32res", "bfloat16"), ("add_rms_norm_f32res", "float16"),
        ("add_layer_norm_f32res", "bfloat16"), ("add_layer_norm_f32res", "float16")]
    problems = [tune_grid.problem_of(shape) for shape in grid]
    assert all(p.residual and p.residual_dtype == "float32" for p in problems)
    assert problems[0] == RMSNormProblem(4096, "bfloat16", residual=True,
                                         residual_dtype="float32")
    plain = RMSNormProblem(4096, "bfloat16", residual=True)
    assert (TuningKey.for_problem(H200.fingerprint, problems[0], 16384)
            != TuningKey.for_problem(H200.fingerprint, plain, 16384))


@pytest.mark.parametrize("argv, flag", [
    (["--ops", "group_norm"], "--ops"),
    (["--ops", "rms_norm,fused"], "--ops"),
    (["--ops", ","], "--ops"),
    (["--rows", "grid,x"], "--rows"),
    (["--rows", "grid,0"], "--rows"),
    (["--rows", ","], "--rows"),
])
def test_bad_ops_and_rows_end_in_one_line_naming_the_flag(argv, flag, capsys):
    with pytest.raises(SystemExit) as exit_:
        tune_grid.parse_args(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"tune_grid.py: error: {flag}:")
    assert "Traceback" not in "\n".join(err)


def test_plan_lists_every_shape_without_a_gpu(monkeypatch, capsys):
    def no_gpu():  # noqa: ANN202
        raise AssertionError("--plan must not touch the GPU")

    monkeypatch.setattr(tune_grid, "query_device", no_gpu)
    argv = ["--plan", "--ops", "rms_norm,add_rms_norm", "--rows", "grid,64,4096",
            "--timeout", "10"]
    assert tune_grid.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    grid = shapes_of(argv)
    # 2 ops x 3 dtypes x (9 hidden sizes x 3 buckets, less hidden 16384's repeated 4096).
    assert len(grid) == 2 * 3 * (9 * 3 - 1)
    assert lines[-1] == ("156 shapes (rms_norm 78, add_rms_norm 78): at most 1560 s of search "
                         "at --timeout 10 s a shape, plus compiles and finals")
    assert len(lines) == len(grid) + 1
    assert lines[0].split() == ["rms_norm", "bfloat16", "768", "r87381", "(bucket", "131072)"]
    assert lines[-2].split() == ["add_rms_norm", "float32", "65536", "r4096", "(bucket", "4096)"]


@pytest.fixture
def fake_h200(tmp_path, monkeypatch) -> list:
    """A fake H200 and the fake evaluator in place of the GPU; returns the problems tuned."""
    monkeypatch.setenv("AUTONORM_DB", str(tmp_path / "user.db"))
    monkeypatch.setenv("AUTONORM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("AUTONORM_NO_SHIPPED_DB", "1")
    monkeypatch.setattr(tune_grid, "query_device", lambda: H200)
    monkeypatch.setattr(peerbench.gpu, "missing", lambda **_: None)
    tuned: list = []

    def factory(problem, rows):  # noqa: ANN001, ANN202, ARG001
        tuned.append(problem)
        return FakeEvaluator()

    monkeypatch.setattr(tune_grid, "WarmIsolated", lambda limits: factory)
    return tuned


@pytest.mark.usefixtures("quiet_optuna")
def test_the_backwards_are_tuned_and_stored_under_their_ops(fake_h200, tmp_path, capsys):
    db = tmp_path / "grid.db"
    argv = ["--ops", "layer_norm_backward,rms_norm_backward", "--hidden", "2048", "--dtypes",
            "fp32", "--rows", "grid", "--trials", "2", "--db", str(db)]
    assert tune_grid.main(argv) == 0
    assert fake_h200 == [LayerNormBackward(2048, "float32"),
                         RMSNormBackward(2048, "float32", has_weight=True)]
    with TuningDB(db) as store:
        ops = {w.key.op for w in store.winners()}
    assert ops == {"layer_norm_backward", "rms_norm_backward"}
    assert "tuning rms_norm_backward on NVIDIA H200" in capsys.readouterr().out


@pytest.mark.usefixtures("quiet_optuna")
def test_the_ops_are_tuned_and_stored_under_their_own_keys(fake_h200, tmp_path, capsys):
    db, snapshot = tmp_path / "grid.db", tmp_path / "ship.db"
    argv = ["--ops", "layer_norm,add_rms_norm", "--hidden", "1024", "--dtypes", "bf16",
            "--rows", "64", "--trials", "2", "--db", str(db)]
    assert tune_grid.main([*argv, "--snapshot", str(snapshot)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert fake_h200 == [LayerNormProblem(1024, "bfloat16"),
                         RMSNormProblem(1024, "bfloat16", residual=True)]
    assert out[0] == f"tuning layer_norm on NVIDIA H200 into {db}"
    assert out[2] == f"tuning add_rms_norm on NVIDIA H200 into {db}"
    assert out[1].startswith("bfloat16    1024 r64 ") and "%" in out[1]
    with TuningDB(snapshot) as store:
        winners = {(w.key.op, w.key.problem, w.key.rows_bucket) for w in store.winners()}
    assert winners == {
        (type(p).op, TuningKey.for_problem(H200.fingerprint, p, 64).problem, 64)
        for p in fake_h200
    }
    # Again with --skip-stored: both winners are usable, nothing is measured.
    fake_h200.clear()
    assert tune_grid.main([*argv, "--skip-stored"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert fake_h200 == []
    assert [line for line in out if "skipped" in line] == [
        "bfloat16    1024 r64     stored already: skipped"] * 2


@pytest.mark.usefixtures("quiet_optuna")
def test_a_budget_stops_between_shapes_and_a_rerun_resumes(fake_h200, tmp_path, monkeypatch,
                                                           capsys):
    # A fake clock: every reading is 10 s after the one before, so a shape "takes" 10 s and the
    # budget check before each sees 20 s more than before the last.
    ticks = iter(range(0, 10_000, 10))
    monkeypatch.setattr(tune_grid, "clock", lambda: float(next(ticks)))
    db = tmp_path / "grid.db"
    argv = ["--ops", "rms_norm", "--hidden", "1024,2048,4096", "--dtypes", "bf16", "--rows",
            "64", "--trials", "2", "--db", str(db), "--skip-stored"]
    # Begun at 0; shape 1 checked at 10 and done at 20 (10 s); shape 2 checked at 30: 30 + 10
    # fits 45; shape 3 checked at 50: over the budget, not started.
    assert tune_grid.main([*argv, "--budget-s", "45"]) == 0
    captured = capsys.readouterr()
    assert [p.hidden for p in fake_h200] == [1024, 2048]
    assert captured.err.strip().splitlines()[-1] == (
        "budget of 45 s reached: 1 shapes left; re-run with --skip-stored to resume")
    with TuningDB(db) as store:
        assert len(store.winners()) == 2
    assert tune_grid.main(argv) == 0  # the re-run tunes only what is left
    assert [p.hidden for p in fake_h200] == [1024, 2048, 4096]


def test_a_budget_must_be_positive(capsys):
    with pytest.raises(SystemExit):
        tune_grid.parse_args(["--budget-s", "0"])
    assert "--budget-s must be a number of seconds > 0, got 0" in capsys.readouterr().err


@pytest.mark.parametrize("n", [1, 3, 8])
def test_shards_split_a_grid_evenly_and_cover_it(n):
    argv = ["--models", str(MODELS), "--ops", "layer_norm,rms_norm,add_rms_norm"]
    whole = shapes_of(argv)
    shards = [shapes_of([*argv, "--shard", f"{k}/{n}"]) for k in range(n)]
    assert sorted(s for shard in shards for s in shard) == sorted(whole)
    assert len({s for shard in shards for s in shard}) == len(whole)
    assert max(map(len, shards)) - min(map(len, shards)) <= 1
    if n > 1:
        assert all(len({s.op for s in shard}) == 3 for shard in shards)


@pytest.mark.parametrize("shard", ["1", "2/2", "-1/4", "a/b", "0/0", "1/2/3"])
def test_a_bad_shard_ends_in_one_line_naming_the_flag(shard, capsys):
    with pytest.raises(SystemExit):
        tune_grid.parse_args([f"--shard={shard}"])
    assert f"--shard: expected K/N with 0 <= K < N, got {shard!r}" in capsys.readouterr().err


@pytest.mark.usefixtures("quiet_optuna")
def test_shards_tuned_apart_merge_into_one_database(fake_h200, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from autonorm import cli

    argv = ["--ops", "rms_norm,add_rms_norm", "--hidden", "1024,2048", "--dtypes", "bf16",
            "--rows", "64", "--trials", "2"]
    for k in range(2):
        db = tmp_path / f"{k}.db"
        assert tune_grid.main([*argv, "--shard", f"{k}/2", "--db", str(db)]) == 0
    merged = tmp_path / "merged.db"
    monkeypatch.setenv("AUTONORM_DB", str(merged))
    for k in range(2):
        result = CliRunner().invoke(cli.main, ["db", "import", str(tmp_path / f"{k}.db")])
        assert result.exit_code == 0, result.output
    with TuningDB(merged) as store:
        tuned = {(w.key.op, w.key.fields["residual"], w.key.hidden) for w in store.winners()}
    assert tuned == {("rms_norm", added, h) for added in (False, True) for h in (1024, 2048)}
    assert len(fake_h200) == 4
