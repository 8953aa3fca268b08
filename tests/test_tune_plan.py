"""CPU tests of ``autonorm tune``'s plans: several shapes at once, or a model's config.json.

The model configs below are small copies of the keys the Hugging Face configs of
``autonorm/tuning_db/models.json`` use (the hidden size's key, the eps key or its absence, nested
text and vision configs), checked against that file's numbers. The command runs on a fake H200
with the fake evaluator, so nothing here needs a GPU.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from fake_evaluator import FakeEvaluator
from test_cli_errors import H200, assert_one_error_line, invoke

from autonorm import cli
from autonorm.codegen.environment import kernel_digest
from autonorm.ops.layer_norm.family import FAMILY
from autonorm.ops.layer_norm.problem import Problem
from autonorm.runtime.limits import H200 as H200_LIMITS
from autonorm.store.db import TuningDB, TuningKey
from autonorm.tune import model_config, plan
from autonorm.tune.model_config import PlanError
from autonorm.tune.plan import Shape

ROOT = Path(__file__).resolve().parent.parent
MODELS_JSON = ROOT / "autonorm" / "tuning_db" / "models.json"
MODELS = {m["name"]: m for m in json.loads(MODELS_JSON.read_text())["models"]}

# name in models.json -> its config.json, cut to the keys a plan reads (and a distractor or two).
CONFIGS = {
    "BERT base": {"model_type": "bert", "hidden_size": 768, "layer_norm_eps": 1e-12,
                  "intermediate_size": 3072},
    # `hidden_dim` is DistilBERT's feed-forward width; its model width is `dim`.
    "DistilBERT base": {"model_type": "distilbert", "dim": 768, "hidden_dim": 3072},
    "BART large": {"model_type": "bart", "d_model": 1024, "torch_dtype": "float32"},
    "GPT-2 XL": {"model_type": "gpt2", "n_embd": 1600, "layer_norm_epsilon": 1e-05},
    "Falcon 7B": {"model_type": "falcon", "hidden_size": 4544, "layer_norm_epsilon": 1e-05,
                  "torch_dtype": "bfloat16"},
    "Whisper tiny": {"model_type": "whisper", "d_model": 384, "torch_dtype": "float32"},
    "Llama 3 8B": {"model_type": "llama", "hidden_size": 4096, "rms_norm_eps": 1e-05,
                   "torch_dtype": "bfloat16"},
    "Qwen2.5 7B": {"model_type": "qwen2", "hidden_size": 3584, "rms_norm_eps": 1e-06,
                   "torch_dtype": "bfloat16"},
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_model_config_gives_the_norm_models_json_lists(name):
    [norm] = model_config.norms_of_config(CONFIGS[name], "config.json")
    entry = MODELS[name]
    assert (norm.op, norm.hidden, norm.eps) == (entry["norm"], entry["hidden"], entry["eps"])
    assert norm.dtype == {"bfloat16": "bfloat16", "float32": "float32"}.get(
        CONFIGS[name].get("torch_dtype"))


def test_a_clip_config_gives_its_text_and_vision_norms():
    config = {"model_type": "clip", "projection_dim": 512, "torch_dtype": "float32",
              "text_config": {"hidden_size": 512, "layer_norm_eps": 1e-05},
              "vision_config": {"hidden_size": 768, "layer_norm_eps": 1e-05,
                                "torch_dtype": "float16"}}
    norms = model_config.norms_of_config(config, "clip.json")
    assert [(n.where, n.hidden, n.dtype) for n in norms] == [
        ("clip.json:text_config", 512, "float32"), ("clip.json:vision_config", 768, "float16")]
    assert norms[0].hidden == MODELS["CLIP ViT-B/32 text"]["hidden"]
    assert norms[1].hidden == MODELS["CLIP ViT-B/32 vision"]["hidden"]
    assert {n.op for n in norms} == {"layer_norm"}


def test_t5_is_rmsnorm_whatever_its_eps_key_says():
    [norm] = model_config.norms_of_config(
        {"model_type": "t5", "d_model": 512, "layer_norm_epsilon": 1e-06}, "t5.json")
    assert (norm.op, norm.hidden, norm.eps) == ("rms_norm", 512, 1e-06)


# Gemma's norms scale by 1 + weight; Gemma 3's config nests its text model and a SigLIP tower.
GEMMA = {"model_type": "gemma", "hidden_size": 3072, "rms_norm_eps": 1e-06,
         "torch_dtype": "bfloat16"}
GEMMA3 = {"model_type": "gemma3", "torch_dtype": "bfloat16",
          "text_config": {"model_type": "gemma3_text", "hidden_size": 2560,
                          "rms_norm_eps": 1e-06},
          "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152,
                            "layer_norm_eps": 1e-06}}


def test_a_gemma_config_gives_an_rmsnorm_scaled_by_one_plus_its_weight():
    [norm] = model_config.norms_of_config(GEMMA, "gemma.json")
    assert (norm.op, norm.hidden, norm.eps, norm.weight_offset) == (
        "rms_norm", 3072, 1e-06, True)
    text, vision = model_config.norms_of_config(GEMMA3, "gemma3.json")
    assert (text.op, text.hidden, text.weight_offset) == ("rms_norm", 2560, True)
    assert (vision.op, vision.hidden, vision.weight_offset) == ("layer_norm", 1152, False)
    # Llama's RMSNorm scales by the weight itself; LayerNorm, asked for, has no offset.
    assert not model_config.norms_of_config(CONFIGS["Llama 3 8B"], "llama.json")[0].weight_offset
    assert not model_config.norms_of_config(GEMMA, "gemma.json", op="layer_norm")[0].weight_offset


def test_a_plan_carries_the_weight_offset_into_its_shapes_and_problems():
    norms = model_config.norms_of_config(GEMMA3, "gemma3.json")
    shapes = plan.expand(ops=[], hiddens=[], dtypes=[], rows=[64], default_rows=_rows_1024,
                         norms=norms)
    # The RMSNorm comes plain and after the residual add; LayerNorm has no residual add.
    assert shapes == [Shape("layer_norm", 1152, "bfloat16", 64),
                      Shape("rms_norm", 2560, "bfloat16", 64, weight_offset=True),
                      Shape("rms_norm", 2560, "bfloat16", 64, weight_offset=True,
                            residual=True)]
    assert shapes[1].describe() == "rms_norm bf16 hidden 2560 rows 64 1 + weight"
    problem = plan.problem_of(shapes[1])
    assert (problem.op, problem.hidden, problem.weight_offset) == ("rms_norm", 2560, True)
    assert not problem.residual and plan.problem_of(shapes[2]).residual
    # Without a weight there is nothing to offset: a Gemma norm tuned so is a plain one.
    bare = plan.expand(ops=[], hiddens=[], dtypes=[], rows=[64], default_rows=_rows_1024,
                       norms=norms[:1], has_weight=False)
    assert [(s.has_weight, s.weight_offset, s.residual) for s in bare] == [
        (False, False, False), (False, False, True)]
    # --weight-offset sets it on every shape; it keys another winner than the plain shape.
    plain, offset = (plan.expand(ops=["rms_norm"], hiddens=[4096], dtypes=[], rows=[64],
                                 default_rows=_rows_1024, weight_offset=on)[0]
                     for on in (False, True))
    assert offset.weight_offset and plain.identity != offset.identity
    assert plan.order([offset, plain]) == [plain, offset]


def test_a_model_norm_is_planned_plain_and_after_the_residual_add_where_its_op_has_one():
    llama = model_config.norms_of_config(CONFIGS["Llama 3 8B"], "llama.json")
    bert = model_config.norms_of_config(CONFIGS["BERT base"], "bert.json")
    assert plan.has_residual_add("rms_norm") and not plan.has_residual_add("layer_norm")
    assert not plan.has_residual_add("no_such_op")

    def forms(**options):
        return [(s.op, s.hidden, s.residual) for s in plan.expand(
            ops=options.pop("ops", []), hiddens=options.pop("hiddens", []), dtypes=[],
            rows=[64], default_rows=_rows_1024, **options)]

    assert forms(norms=llama + bert) == [("layer_norm", 768, False), ("rms_norm", 4096, False),
                                         ("rms_norm", 4096, True)]
    # --residual and --no-residual keep one form of every shape.
    assert forms(norms=llama, residual=True) == [("rms_norm", 4096, True)]
    assert forms(norms=llama, residual=False) == [("rms_norm", 4096, False)]
    # Shapes given on the command line are plain unless --residual says otherwise.
    assert forms(ops=["rms_norm"], hiddens=[8192]) == [("rms_norm", 8192, False)]
    assert forms(ops=["rms_norm"], hiddens=[8192], residual=True) == [("rms_norm", 8192, True)]
    # --op replaces the config's norm: LayerNorm over Llama's width is planned plain, and
    # after the residual add only where --residual asks.
    as_layer_norm = model_config.norms_of_config(CONFIGS["Llama 3 8B"], "l.json", op="layer_norm")
    assert forms(norms=as_layer_norm) == [("layer_norm", 4096, False)]
    assert forms(norms=as_layer_norm, residual=True) == [("layer_norm", 4096, True)]
    assert forms(ops=["layer_norm"], hiddens=[1024], residual=True) == [
        ("layer_norm", 1024, True)]
    plain, added = plan.expand(ops=[], hiddens=[], dtypes=[], rows=[64],
                               default_rows=_rows_1024, norms=llama)
    assert plain.identity != added.identity and plan.order([added, plain]) == [plain, added]
    assert added.describe() == "rms_norm bf16 hidden 4096 rows 64 residual add"
    assert plan.problem_of(added) == plan.problem_of(plain).__class__(4096, residual=True)


def test_an_op_given_replaces_a_norm_the_config_cannot_tell():
    config = {"model_type": "mystery", "hidden_size": 2048}
    with pytest.raises(PlanError, match="cannot tell its norm") as caught:
        model_config.norms_of_config(config, "c.json")
    assert caught.value.option == "--config"
    [norm] = model_config.norms_of_config(config, "c.json", op="layer_norm")
    assert (norm.op, norm.hidden) == ("layer_norm", 2048)


@pytest.mark.parametrize(("config", "expected"), [
    ([768], "not a JSON object"),
    ({"model_type": "bert", "vocab_size": 30522}, "no hidden size"),
    ({"model_type": "bert", "hidden_size": "768"}, "hidden_size must be a positive integer"),
    ({"model_type": "bert", "hidden_size": 768, "torch_dtype": "int8"}, "'int8' is not a dtype"),
    ({"model_type": "bert", "hidden_size": 768, "layer_norm_eps": "small"},
     "layer_norm_eps must be a positive number"),
])
def test_a_bad_config_is_refused_naming_the_option(config, expected):
    with pytest.raises(PlanError, match=expected) as caught:
        model_config.norms_of_config(config, "c.json")
    assert caught.value.option == "--config"


def _rows_1024(hidden: int) -> int:
    return 1024


def test_the_plan_is_the_deduplicated_product_in_a_fixed_order():
    shapes = plan.expand(ops=["layer_norm"], hiddens=[4096, 1024, 4096],
                         dtypes=["float32", "bfloat16"], rows=[64, 60, 4096],
                         default_rows=_rows_1024)
    # 60 and 64 share the rows-64 bucket: the first listed stays.
    assert [(s.hidden, s.dtype, s.rows) for s in shapes] == [
        (1024, "bfloat16", 64), (1024, "bfloat16", 4096), (1024, "float32", 64),
        (1024, "float32", 4096), (4096, "bfloat16", 64), (4096, "bfloat16", 4096),
        (4096, "float32", 64), (4096, "float32", 4096)]
    again = plan.expand(ops=[], hiddens=[1024, 4096], dtypes=["bfloat16", "float32"],
                        rows=[4096, 64], default_rows=_rows_1024)
    assert again == shapes


def test_the_plan_of_configs_takes_each_norm_and_lets_options_replace_its_values():
    bert, gpt2 = (model_config.norms_of_config(CONFIGS[n], n)[0] for n in ("BERT base", "GPT-2 XL"))
    shapes = plan.expand(ops=[], hiddens=[], dtypes=[], rows=[], default_rows=_rows_1024,
                         norms=[bert, gpt2, bert])
    assert [(s.op, s.hidden, s.dtype, s.rows) for s in shapes] == [
        ("layer_norm", 768, "bfloat16", 1024), ("layer_norm", 1600, "bfloat16", 1024)]
    shapes = plan.expand(ops=[], hiddens=[], dtypes=["float16"], rows=[64],
                         default_rows=_rows_1024, norms=[bert], has_bias=False)
    assert shapes == [Shape("layer_norm", 768, "float16", 64, True, False)]
    with pytest.raises(PlanError) as caught:
        plan.expand(ops=[], hiddens=[], dtypes=[], rows=[], default_rows=_rows_1024)
    assert caught.value.option == "--hidden"


def test_the_budget_is_split_across_the_shapes_left_and_capped_by_the_timeout():
    assert plan.shape_timeout(45.0, None, 1e6, 3) == 45.0   # no budget: the timeout
    assert plan.shape_timeout(45.0, 100.0, 10.0, 3) == 30.0  # (100 - 10) / 3
    assert plan.shape_timeout(20.0, 100.0, 0.0, 2) == 20.0   # capped by --timeout
    assert plan.shape_timeout(45.0, 100.0, 70.0, 1) == 30.0  # the last one takes what is left
    assert plan.shape_timeout(45.0, 100.0, 100.0, 2) is None  # spent
    assert plan.shape_timeout(45.0, 100.0, 99.5, 1) is None  # less than a shape is worth


H200_FINGERPRINT = H200.fingerprint


def _store_default_winner(path: Path, problem: Problem, rows: int, kernel: str | None = None
                          ) -> str:
    """Store the family's default as the H200 winner of ``problem``; return its label."""
    config = FAMILY.default(problem, H200_LIMITS)
    digest = kernel or kernel_digest(FAMILY.render(config, problem, H200_LIMITS).source)
    with TuningDB(path) as store:
        store.set_winner(TuningKey.for_problem(H200_FINGERPRINT, problem, rows),
                         config.to_dict(), {"median_us": 9.5, "share": 0.5}, digest)
    return config.label()


def test_a_usable_winner_of_the_exact_bucket_is_what_resume_skips(tmp_path):
    problem, shape = Problem(1024, "bfloat16"), Shape("layer_norm", 1024, "bfloat16", 64)
    _store_default_winner(tmp_path / "a.db", problem, 64)
    _store_default_winner(tmp_path / "b.db", problem, 64, kernel="another kernel")
    with TuningDB(tmp_path / "a.db") as store:
        assert plan.usable_winner(store, H200_FINGERPRINT, shape, problem, H200_LIMITS)
        other_bucket = Shape("layer_norm", 1024, "bfloat16", 65)
        assert plan.usable_winner(store, H200_FINGERPRINT, other_bucket, problem,
                                  H200_LIMITS) is None
        assert plan.usable_winner(store, "another GPU", shape, problem, H200_LIMITS) is None
    with TuningDB(tmp_path / "b.db") as store:  # stale: it renders another kernel now
        assert plan.usable_winner(store, H200_FINGERPRINT, shape, problem, H200_LIMITS) is None
    assert plan.usable_winner(None, H200_FINGERPRINT, shape, problem, H200_LIMITS) is None


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A tmp user DB and cache, no shipped DB, a fake H200; returns the problems evaluated."""
    import autonorm.runtime.device
    from autonorm.tune import session

    monkeypatch.setenv("AUTONORM_DB", str(tmp_path / "user.db"))
    monkeypatch.setenv("AUTONORM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("AUTONORM_NO_SHIPPED_DB", "1")
    monkeypatch.delenv("AUTONORM_SHIPPED_DB", raising=False)
    monkeypatch.setattr(autonorm.runtime.device, "query_device", lambda device_id=None: H200)
    built: list[tuple[int, str, int]] = []

    def build(problem, rows, *rest):
        built.append((problem.hidden, problem.dtype, rows))
        return FakeEvaluator()

    monkeypatch.setattr(session, "_build_evaluator", build)
    return built


def _table(stdout: str) -> dict[str, str]:
    """The summary's rows by shape (the first column)."""
    return {line.split("  ")[0].strip(): line for line in stdout.splitlines()[1:]}


PLAN = ["tune", "--hidden", "4096,1024", "--hidden", "2048,4096", "--rows", "60,64",
        "--trials", "4"]


def test_a_plan_tunes_each_shape_stores_its_winner_and_resumes(env, tmp_path):
    label = _store_default_winner(tmp_path / "user.db", Problem(2048, "bfloat16"), 64)
    status, out, err = invoke(PLAN)
    assert status == 0, err
    assert "tuning a plan of 3 shapes on NVIDIA H200 (132 SMs): 1 already stored, 2 to tune" in err
    assert "[2/2] layer_norm bf16 hidden 4096 rows 60: tuning" in err
    rows = _table(out)
    assert list(rows) == [f"layer_norm bf16 hidden {h} rows 60" for h in (1024, 2048, 4096)]
    assert rows["layer_norm bf16 hidden 2048 rows 60"].endswith("already stored")
    assert label in rows["layer_norm bf16 hidden 2048 rows 60"]
    assert sorted(env) == [(1024, "bfloat16", 60), (4096, "bfloat16", 60)]  # 2048 skipped
    with TuningDB(tmp_path / "user.db") as store:
        for hidden in (1024, 4096):
            winner = store.get_winner(
                TuningKey.for_problem(H200_FINGERPRINT, Problem(hidden, "bfloat16"), 64))
            row = rows[f"layer_norm bf16 hidden {hidden} rows 60"]
            assert row.endswith("  tuned")
            assert FAMILY.config_from_dict(winner.config).label() in row
            assert f"{winner.metrics['median_us']:.1f}" in row
            assert f"{winner.metrics['share'] * 100:.1f}" in row
    # Re-running finds every shape stored and measures nothing; --force tunes them again.
    env.clear()
    status, out, err = invoke(PLAN)
    assert status == 0, err
    assert env == [] and all(r.endswith("already stored") for r in _table(out).values())
    status, out, err = invoke([*PLAN, "--force", "--trials", "5"])
    assert status == 0, err
    assert len(env) == 3 and all(r.endswith("  tuned") for r in _table(out).values())


def test_a_plan_names_each_shapes_failed_candidates(env, monkeypatch):
    from autonorm.tune import session

    evaluators: list[FakeEvaluator] = []

    def build(problem, rows, *rest):
        evaluators.append(FakeEvaluator(fail=lambda c: "compile" if c.cache == "smem" else None))
        return evaluators[-1]

    monkeypatch.setattr(session, "_build_evaluator", build)
    status, out, err = invoke(["tune", "--hidden", "1024,4096", "--trials", "12"])
    assert status == 0, err
    for evaluator, hidden in zip(evaluators, (1024, 4096), strict=True):
        failed = [c.label() for c in evaluator.calls if c.cache == "smem"]
        assert failed, "no smem candidate was tried: the check below could not fail"
        said = f": failed to compile: {failed[-1]}: fake compile failure of {failed[-1]}"
        assert any(f"layer_norm bf16 hidden {hidden} rows " in line and line.endswith(said)
                   for line in err.splitlines()), err


def test_model_configs_are_tuned_each_with_the_norm_it_names(env, tmp_path):
    gpt2, llama = tmp_path / "gpt2.json", tmp_path / "llama.json"
    gpt2.write_text(json.dumps(CONFIGS["GPT-2 XL"]))
    llama.write_text(json.dumps(CONFIGS["Llama 3 8B"]))
    status, out, err = invoke(["tune", "--config", str(gpt2), "--config", str(llama),
                               "--rows", "64", "--trials", "3", "--budget", "600"])
    assert status == 0, err
    assert f"{gpt2}: layer_norm over hidden 1600, eps 1e-05, dtype not given" in err
    assert (f"{llama}: rms_norm over hidden 4096, eps 1e-05, dtype bfloat16; planned plain "
            "and after the residual add") in err
    assert "not yet supported" not in err
    assert list(_table(out)) == ["layer_norm bf16 hidden 1600 rows 64",
                                 "rms_norm bf16 hidden 4096 rows 64",
                                 "rms_norm bf16 hidden 4096 rows 64 residual add"]
    assert all(row.endswith("  tuned") for row in _table(out).values())
    assert sorted(env) == [(1600, "bfloat16", 64), (4096, "bfloat16", 64),
                           (4096, "bfloat16", 64)]
    with TuningDB(tmp_path / "user.db") as store:
        winners = store.winners(None, None)
    ops = {w.key.op: w.key.fields for w in winners}
    assert set(ops) == {"layer_norm", "rms_norm"}
    assert ops["rms_norm"]["weight_offset"] is False and "has_bias" not in ops["rms_norm"]
    assert sorted(w.key.fields["residual"] for w in winners if w.key.op == "rms_norm") == [
        False, True]


def test_a_spent_budget_tunes_nothing_and_leaves_the_plan_to_a_rerun(env):
    status, out, err = invoke(["tune", "--hidden", "1024,2048", "--budget", "1e-9"])
    assert status == 0, err
    assert env == []
    assert all(row.endswith("budget spent") for row in _table(out).values())
    assert "2 of 2 shapes not tuned within the budget: run the same command" in err


def test_an_interrupted_plan_keeps_the_shapes_it_finished(env, tmp_path, monkeypatch):
    from autonorm.tune import session

    evaluators = iter([FakeEvaluator(), FakeEvaluator(interrupt_at=1)])
    monkeypatch.setattr(session, "_build_evaluator", lambda *args: next(evaluators))
    result = CliRunner().invoke(cli.main, ["tune", "--hidden", "1024,2048", "--trials", "3"])
    assert result.exit_code == 130
    assert "error: interrupted: finished shapes and trials are kept" in result.stderr
    assert list(_table(result.stdout)) == ["layer_norm bf16 hidden 1024 rows 65536"]


BAD_PLANS = [
    (["--hidden", "4096,abc"], "'--hidden': 'abc' is not a valid integer"),
    (["--hidden", "4096,0"], "'--hidden': 0 is not in the range x>=1"),
    (["--hidden", "4096,"], "'--hidden': '' is not a valid integer"),
    (["--hidden", "1024", "--dtype", "bf16,int8"], "unsupported dtype 'int8'"),
    (["--hidden", "1024", "--rows", "64,0"], "'--rows': 0 is not in the range"),
    (["--hidden", "1024", "--op", "layer_norm,group_norm"], "'group_norm' is not a known op"),
    (["--hidden", "1024,2048", "--budget", "0"], "'--budget': 0.0 is not in the range x>0"),
    (["--hidden", "1024,2048", "--budget", "nan"], "'--budget': nan is not a number"),
    (["--hidden", "1024," + "9" * 12], "unsupported hidden size"),
    (["--config", "{tmp}/missing.json"], "--config"),
    (["--config", "{tmp}/bad.json"], "not JSON"),
    (["--config", "{tmp}/nohidden.json"], "no hidden size"),
    (["--config", "{tmp}/llama.json", "--no-bias"], "op rms_norm takes no --no-bias"),
    (["--config", "{tmp}/llama.json", "--op", "layer_norm", "--weight-offset"],
     "op layer_norm takes no --weight-offset"),
    (["--hidden", "1024", "--op", "rms_norm", "--no-weight", "--weight-offset"],
     "--weight-offset scales by 1 + weight: it cannot go with --no-weight"),
    ([], "Missing option '--hidden'. Or give a model's --config"),
]


@pytest.mark.parametrize(("args", "expected"), BAD_PLANS,
                         ids=[" ".join(a)[:50] for a, _ in BAD_PLANS])
def test_a_bad_plan_ends_in_one_error_line(env, tmp_path, args, expected):
    (tmp_path / "bad.json").write_text("{")
    (tmp_path / "nohidden.json").write_text('{"model_type": "bert"}')
    (tmp_path / "llama.json").write_text(json.dumps(CONFIGS["Llama 3 8B"]))
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    line = assert_one_error_line(*invoke(["tune", *args]), expected)
    assert not env, line  # refused before anything was tuned
