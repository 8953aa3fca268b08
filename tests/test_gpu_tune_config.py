"""GPU: a model tuned in one command is what dispatch runs; winners travel verified.

``autonorm tune --config`` tunes the norms of a small Hugging Face style config.json into a
temporary user database, and dispatch then runs exactly those winners: the lookup of every shape
of the plan returns the stored winner, from the user's database, and the public API's output on
CuPy arrays matches float64. A winner tuned on this GPU, exported and imported with ``--verify``
into an empty database, is verified again here and dispatched the same; a file whose kernels
fail (one refused by the rules, one that fails verification on this GPU) is refused whole and
the database it was imported into keeps what it had. ``--workers 2`` runs two workers on one
study, sharing the GPU where there is only one.

Every search is a few candidates over a few hundred rows, so the file runs in about a minute.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pytest
from click.testing import CliRunner
from test_db_transfer import put

import autonorm
from autonorm import cli, dispatch, lookup
from autonorm.codegen.environment import kernel_digest
from autonorm.numerics import TOLERANCES, from_float64, measure_error, to_float64
from autonorm.ops import layer_norm as codegen
from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.problem import Problem
from autonorm.ops.layer_norm.reference import layer_norm_reference
from autonorm.ops.rms_norm.reference import rms_norm_reference
from autonorm.runtime.device import query_device
from autonorm.store import bundle, transfer
from autonorm.store.db import TuningDB, TuningKey
from autonorm.tune import model_config, plan
from autonorm.tune import trials as book
from autonorm.tune.session import study_for
from autonorm.tune.storage import open_storage

pytestmark = pytest.mark.gpu

ROWS = 256

# Gemma 3's layout: a text model's RMSNorm (scaled by 1 + weight) and a SigLIP tower's
# LayerNorm, in fp16 (CuPy has no bfloat16, and the API is called on CuPy arrays below).
MODEL = {
    "model_type": "gemma3", "torch_dtype": "float16",
    "text_config": {"model_type": "gemma3_text", "hidden_size": 1152, "rms_norm_eps": 1e-06},
    "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 768,
                      "layer_norm_eps": 1e-06},
}


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A tmp user DB and cache dir; dispatch forgets its choices before and after."""
    monkeypatch.setenv("AUTONORM_DB", str(tmp_path / "user.db"))
    monkeypatch.setenv("AUTONORM_CACHE_DIR", str(tmp_path / "cache"))
    for name in ("AUTONORM_NO_KEEP_X", "AUTONORM_TUNE_ON_FIRST_USE"):
        monkeypatch.delenv(name, raising=False)
    dispatch.clear_cache()
    yield tmp_path
    dispatch.clear_cache()


def invoke(args: list[str]) -> tuple[int, str, str]:
    """Run the CLI in this process; return (status, stdout, stderr)."""
    result = CliRunner().invoke(cli.main, args)
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        result.exc_info)
    return result.exit_code, result.stdout, result.stderr


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def use_db(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    """Point the user database at ``path`` and drop dispatch's choices from the last one."""
    monkeypatch.setenv("AUTONORM_DB", str(path))
    dispatch.clear_cache()


def inputs(rows: int, hidden: int, dtype: str, seed: int, *, offset: bool = False
           ) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """Rows far from zero, a weight (its offset from one with ``offset``) and a bias.

    Returns:
        (the arrays on the GPU in ``dtype``, their float64 values on the host).

    """
    import cupy

    rng = np.random.default_rng(seed)
    x = from_float64(3.0 + rng.standard_normal((rows, hidden)), dtype)
    w = from_float64((0.0 if offset else 1.0) + 0.1 * rng.standard_normal(hidden), dtype)
    b = from_float64(0.1 * rng.standard_normal(hidden), dtype)
    stored = (x, w, b)
    return (tuple(cupy.asarray(a) for a in stored),
            tuple(to_float64(a, dtype) for a in stored))


def assert_runs_the_winner(problem: Any, stored: Any) -> None:
    """What the API's call compiled for ``problem`` is ``stored``, the user's winner."""
    chosen = dispatch.chosen(problem, ROWS)
    assert chosen is not None, problem
    assert chosen.source == "user", (problem, chosen.source)
    assert chosen.config.to_dict() == stored.config


# --------------------------------------------------------------------------- tune --config


def test_a_model_tuned_by_its_config_is_what_dispatch_runs(env: Path) -> None:
    config_path = env / "config.json"
    config_path.write_text(json.dumps(MODEL))
    status, stdout, stderr = invoke([
        "tune", "--config", str(config_path), "--rows", str(ROWS), "--no-residual",
        "--trials", "3", "--timeout", "10", "--budget", "40",
    ])
    assert status == 0, stderr
    assert f"{config_path}:text_config: rms_norm over hidden 1152, 1 + weight" in stderr
    table = lines(stdout)[1:]
    assert len(table) == 2 and all(row.endswith("  tuned") for row in table), stdout

    norms = {n.op: n for n in model_config.read_model_config(config_path)}
    shapes = plan.expand(ops=[], hiddens=[], dtypes=[], rows=[ROWS],
                         default_rows=lambda hidden: ROWS, norms=list(norms.values()),
                         residual=False)
    assert [(s.op, s.hidden, s.dtype, s.weight_offset) for s in shapes] == [
        ("layer_norm", 768, "float16", False), ("rms_norm", 1152, "float16", True)]
    info = query_device()
    with TuningDB(env / "user.db") as db:
        stored = {w.key: w for w in db.winners()}
    assert len(stored) == len(shapes)

    for index, shape in enumerate(shapes):
        problem = plan.problem_of(shape)
        winner = stored[TuningKey.for_problem(info.fingerprint, problem, ROWS)]
        # The lookup dispatch does: the user's winner of this exact key, as stored.
        choice = dispatch.choose_config(problem, ROWS)
        assert choice.source == "user", (shape.describe(), choice.source)
        assert choice.config.to_dict() == winner.config
        assert choice.winner is not None and choice.winner.key == winner.key
        assert lookup.kernel_of(choice.config, problem, info.limits()) == winner.kernel

        # The public API on CuPy arrays runs it, and matches float64.
        eps = norms[shape.op].eps
        (x, w, b), (x64, w64, b64) = inputs(ROWS, shape.hidden, shape.dtype, index,
                                            offset=shape.weight_offset)
        if shape.op == "layer_norm":
            y = autonorm.layer_norm(x, w, b, eps=eps)
            reference = layer_norm_reference(x64, w64, b64, eps)
        else:
            y = autonorm.rms_norm(x, w, eps=eps, weight_offset=True)
            reference = rms_norm_reference(x64, w64, eps, weight_offset=True)
        error = measure_error(y.get().astype(np.float64), reference)
        assert error.within(shape.dtype), (shape.describe(), error)
        assert_runs_the_winner(problem, winner)


# --------------------------------------------------------------------------- db import --verify


def test_a_tuned_winner_imported_with_verify_is_verified_and_dispatched_the_same(
    env: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    problem, rows = Problem(2048, "float16"), 128
    use_db(monkeypatch, env / "a.db")
    status, _, stderr = invoke(["tune", "--hidden", "2048", "--dtype", "fp16", "--rows",
                                str(rows), "--trials", "3", "--timeout", "10"])
    assert status == 0, stderr
    status, _, stderr = invoke(["db", "export", "-o", str(env / "a.json")])
    assert status == 0, stderr
    document = json.loads((env / "a.json").read_text())
    [entry] = document["winners"]
    assert entry["verification"]["passed"] and entry["verification"]["max_rel_err"] > 0
    # Without the tuner's record, an error stored with the import can only come from verifying
    # the kernel again on this GPU.
    entry["verification"] = None
    document["sha256"] = bundle.seal(document)
    bare = env / "bare.json"
    bare.write_text(bundle.dump(document))

    use_db(monkeypatch, env / "b.db")
    status, stdout, stderr = invoke(["db", "import", "--verify", str(bare)])
    assert status == 0, stderr
    assert lines(stderr)[-1].startswith("1 added, 0 replaced, 0 kept, 0 unchanged from"), stderr
    assert lines(stdout)[0].startswith("add ")
    use_db(monkeypatch, env / "c.db")  # the same file unverified: no error is recorded
    status, _, stderr = invoke(["db", "import", str(bare)])
    assert status == 0, stderr
    with (TuningDB(env / "a.db") as a, TuningDB(env / "b.db") as b,
          TuningDB(env / "c.db") as c):
        [tuned], [imported] = a.winners(), b.winners()
        assert (imported.key, imported.config, imported.kernel, imported.metrics) == (
            tuned.key, tuned.config, tuned.kernel, tuned.metrics)
        [verified] = b.trials()
        assert verified["study"] == transfer.IMPORTED_STUDY
        assert 0 < verified["max_rel_err"] <= TOLERANCES["float16"]["rel_l2"]
        assert [t["max_rel_err"] for t in c.trials()] == [None]

    # Dispatch from B picks the imported winner, as it picks the tuned one from A.
    use_db(monkeypatch, env / "a.db")
    choice_a = dispatch.choose_config(problem, rows)
    use_db(monkeypatch, env / "b.db")
    choice_b = dispatch.choose_config(problem, rows)
    assert choice_b == choice_a and choice_b.source == "user"
    assert choice_b.config.to_dict() == tuned.config
    (x, w, bias), (x64, w64, b64) = inputs(rows, 2048, "float16", 7)
    y = autonorm.layer_norm(x, w, bias, eps=1e-5)
    error = measure_error(y.get().astype(np.float64), layer_norm_reference(x64, w64, b64, 1e-5))
    assert error.within("float16"), error
    chosen = dispatch.chosen(problem, rows)
    assert chosen is not None and chosen.source == "user"
    assert chosen.config.to_dict() == tuned.config


def test_import_verify_refuses_failing_kernels_and_keeps_what_was_stored(
    env: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two entries, sealed: stats="naive" (refused by the rules before any launch) and a sound
    configuration whose kernel this GPU's evaluator computes without a shift (tests/
    unstable_evaluator.py), which fails verification on the offset rows."""
    from unstable_evaluator import build_naive_stats_evaluator

    import autonorm.tune.isolation

    info = query_device()
    limits = info.limits()
    fp32_4096, fp32_2048 = Problem(4096, "float32"), Problem(2048, "float32")
    good = KernelConfig(256, 4, 1, "registers", "two_pass", 1, 0)
    slower = KernelConfig(128, 4, 1, "smem", "two_pass", 1, 0)
    with TuningDB(env / "b.db") as b:  # the user's own: slower than the file at one key
        put(b, info, fp32_4096, slower, ROWS, median_us=50.0)
        put(b, info, Problem(1024, "float32"), good, ROWS, median_us=7.0)
    with TuningDB(env / "source.db") as source:
        put(source, info, fp32_4096, good, ROWS, median_us=10.0)
        put(source, info, fp32_2048, good, ROWS, median_us=10.0)
    use_db(monkeypatch, env / "source.db")
    status, _, stderr = invoke(["db", "export", "-o", str(env / "w.json")])
    assert status == 0, stderr
    document = json.loads((env / "w.json").read_text())
    [naive] = [e for e in document["winners"] if e["problem"]["hidden"] == 2048]
    unstable = KernelConfig.from_dict({**naive["config"], "stats": "naive"})
    naive["config"] = unstable.to_dict()
    naive["kernel"] = kernel_digest(
        codegen.render(unstable, fp32_2048, limits, allow_unstable=True).source)
    document["sha256"] = bundle.seal(document)  # a valid seal: the entries decide
    (env / "w.json").write_text(bundle.dump(document))

    use_db(monkeypatch, env / "b.db")
    with TuningDB(env / "b.db") as b:
        before = [(w.key, w.config, w.metrics) for w in b.winners()], b.trials()
    # Unverified, the file's faster kernel would replace the user's slower one.
    status, _, stderr = invoke(["db", "import", "--dry-run", str(env / "w.json")])
    assert status == 0, stderr
    assert lines(stderr)[-1].startswith("dry run, nothing written: would have 0 added, "
                                        "1 replaced"), stderr
    assert lines(stderr)[-1].endswith("refused 1 (1 refused by the rules)"), stderr

    monkeypatch.setattr(autonorm.tune.isolation, "build_gpu_evaluator",
                        build_naive_stats_evaluator)
    status, stdout, stderr = invoke(["db", "import", "--verify", str(env / "w.json")])
    [error] = lines(stderr)
    assert status == 1 and error.startswith("error: nothing imported: 0 added, 0 replaced"), stderr
    assert "refused 2 (" in error and "1 failed verification" in error
    assert "1 refused by the rules" in error
    refused = {line.split(" hidden ")[1].split()[0]: line for line in lines(stdout)}
    assert set(refused) == {"2048", "4096"} and all(
        line.startswith("refuse ") for line in refused.values())
    assert "stats must be one of" in refused["2048"]
    assert "verification: " in refused["4096"] and "offset: rel_l2" in refused["4096"]
    with TuningDB(env / "b.db") as b:
        assert ([(w.key, w.config, w.metrics) for w in b.winners()], b.trials()) == before


# --------------------------------------------------------------------------- --workers


def test_two_workers_share_one_study_on_this_machines_gpus(env: Path) -> None:
    from autonorm.tune import workers

    problem, rows = Problem(1024, "float16"), ROWS
    journal = env / "study.journal"
    status, _, stderr = invoke(["tune", "--hidden", "1024", "--dtype", "fp16", "--rows",
                                str(rows), "--trials", "10", "--timeout", "30", "--workers", "2",
                                "--storage", str(journal)])
    assert status == 0, stderr
    shared = [line for line in lines(stderr) if " workers on " in line]
    if workers.visible_gpu_count() == 1:
        assert shared == ["2 workers on 1 GPU: workers share GPU 0"], stderr
    else:
        assert shared == [], stderr
    assert "tuning workers exited" not in stderr  # both workers ran to the end
    info = query_device()
    name = study_for(problem, rows, info)
    study = optuna.load_study(study_name=name, storage=open_storage(str(journal), name))
    measured = [t for t in study.trials if book.is_measured(t)]
    owners = {t.user_attrs[book.ATTR_OWNER]["pid"] for t in measured}
    assert len(owners - {os.getpid()}) == 2, owners  # each worker measured candidates
    params = [book.params_key(t.params) for t in measured]
    assert len(params) == len(set(params)) >= 10  # none twice
    with TuningDB(env / "user.db") as db:
        [winner] = db.winners()
    choice = dispatch.choose_config(problem, rows)
    assert choice.source == "user" and choice.config.to_dict() == winner.config
