"""The list of widely used models' norm shapes, and the grid tune_grid.py --models makes of it.

CPU only: the list is read and checked, and the grid is expanded without tuning anything.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MODELS = REPO / "autonorm" / "tuning_db" / "models.json"
sys.path.insert(0, str(REPO / "benchmarks"))

import tune_grid  # noqa: E402 - benchmarks/ is not a package

DTYPES = ("bfloat16", "float16", "float32")


@pytest.fixture(scope="module")
def models() -> list[dict]:
    return tune_grid.load_models(MODELS)


def test_every_model_has_a_shape_and_the_config_it_comes_from(models):
    assert len(models) >= 30
    names = [m["name"] for m in models]
    assert len(set(names)) == len(names)
    for m in models:
        assert m["norm"] in ("layer_norm", "rms_norm"), m
        assert isinstance(m["hidden"], int) and m["hidden"] >= 256, m
        assert 0 < m["eps"] <= 1e-5, m
        assert m["source"].startswith("https://huggingface.co/"), m
        assert m["source"].endswith("/config.json"), m
        assert m["field"], m  # the config key the hidden size is read from


def test_the_list_holds_the_models_people_run(models):
    by_name = {m["name"]: m for m in models}
    assert by_name["BERT base"]["hidden"] == 768 and by_name["BERT base"]["eps"] == 1e-12
    assert by_name["GPT-2 XL"]["hidden"] == 1600
    assert by_name["Falcon 7B"]["hidden"] == 4544
    assert by_name["Llama 3 8B"]["norm"] == "rms_norm"
    norms = {m["norm"] for m in models}
    assert norms == {"layer_norm", "rms_norm"}


def test_the_layer_norm_sizes_are_each_listed_once(models):
    sizes = tune_grid.norm_hidden_sizes(models, "layer_norm")
    assert sizes == sorted(set(sizes))
    assert sizes == sorted({m["hidden"] for m in models if m["norm"] == "layer_norm"})
    rms_only = {m["hidden"] for m in models if m["norm"] == "rms_norm"} - set(sizes)
    assert rms_only and not rms_only & set(sizes)  # e.g. 3584: no LayerNorm model has it


def test_models_expand_to_every_dtype_size_and_both_buckets(models):
    args = tune_grid.parse_args(["--models", str(MODELS)])
    sizes = tune_grid.norm_hidden_sizes(models, "layer_norm")
    assert tune_grid.grid(args) == [
        ("layer_norm", d, h, r) for d in DTYPES for h in sizes for r in (64, 4096)
    ]
    assert len(tune_grid.grid(args)) == 3 * len(sizes) * 2
    assert not {s.hidden for s in tune_grid.grid(args)} & {3584, 7168, 896}


def test_models_take_rows_and_dtypes_from_the_flags(models):
    args = tune_grid.parse_args(["--models", str(MODELS), "--rows", "1,512", "--dtypes", "fp32"])
    sizes = tune_grid.norm_hidden_sizes(models, "layer_norm")
    expected = [("layer_norm", "float32", h, r) for h in sizes for r in (1, 512)]
    assert tune_grid.grid(args) == expected


def test_without_models_the_grid_is_the_benchmark_grid():
    args = tune_grid.parse_args(["--dtypes", "bf16", "--hidden", "1024,4096"])
    assert tune_grid.grid(args) == [("layer_norm", "bfloat16", 1024, 65536),
                                    ("layer_norm", "bfloat16", 4096, 16384)]
    default = tune_grid.parse_args([])
    assert len(tune_grid.grid(default)) == 3 * 9


@pytest.mark.parametrize("argv, flag", [
    (["--models", str(MODELS), "--hidden", "768"], "--hidden"),
    (["--models", "no/such/models.json"], "--models"),
    (["--hidden", "768,x"], "--hidden"),
    (["--rows", "0"], "--rows"),
    (["--dtypes", "fp8"], "--dtypes"),
])
def test_bad_arguments_end_in_one_line_naming_the_flag(argv, flag, capsys):
    with pytest.raises(SystemExit) as exit_:
        tune_grid.parse_args(argv)
    assert exit_.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("tune_grid.py: error:") and flag in last


@pytest.mark.parametrize("change, message", [
    (lambda m: m.pop("source"), "needs the fields"),
    (lambda m: m.update(hidden="768"), "hidden must be a positive integer"),
    (lambda m: m.update(norm="group_norm"), "norm must be one of"),
    (lambda m: m.update(eps=0), "eps must be a positive number"),
    (lambda m: m.update(source="huggingface.co/x"), "source must be the https URL"),
])
def test_a_bad_entry_is_refused_by_name(tmp_path, change, message):
    data = json.loads(MODELS.read_text())
    change(data["models"][2])
    path = tmp_path / "models.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=message) as err:
        tune_grid.load_models(path)
    assert data["models"][2]["name"] in str(err.value) and "entry 2" in str(err.value)
