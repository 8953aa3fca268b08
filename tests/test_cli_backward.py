"""The command line on the backward families: --backward, render, and a tuning on the fake
evaluator that stores a backward winner under its own op."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from test_cli_errors import assert_one_error_line, env, invoke  # noqa: F401 - env: a fixture


def test_tune_backward_stores_the_backward_op(env: Path) -> None:  # noqa: F811
    status, stdout, stderr = invoke(["tune", "--op", "rms_norm", "--backward", "--hidden", "1024",
                                     "--trials", "4"])
    assert status == 0, stdout + stderr
    with sqlite3.connect(env / "user.db") as db:
        ops = {row[0] for row in db.execute("SELECT op FROM winners")}
    assert ops == {"rms_norm_backward"}


def test_render_the_backward_of_the_residual_add(env: Path) -> None:  # noqa: F811
    # The backward of add_layer_norm: the returned h's gradient joins dx in the kernel.
    status, stdout, _ = invoke(["render", "--op", "layer_norm_backward", "--hidden", "4096",
                                "--residual"])
    assert status == 0
    assert "const T* dhr = dh + " in stdout
    status, plain, _ = invoke(["render", "--op", "layer_norm_backward", "--hidden", "4096"])
    assert status == 0 and "dhr" not in plain


def test_backward_tunes_the_backward_of_a_models_norms(env: Path) -> None:  # noqa: F811
    config = env / "config.json"
    config.write_text('{"model_type": "gemma2", "hidden_size": 1024, "rms_norm_eps": 1e-6}')
    status, stdout, stderr = invoke(["tune", "--backward", "--config", str(config),
                                     "--dry-run"])
    assert status == 0, stdout + stderr
    # Plain only (a model's modules run the plain norm), and Gemma's 1 + weight kept.
    assert stdout.splitlines()[0] == "rms_norm_backward bf16 hidden 1024 rows 65536 1 + weight"
    status, stdout, stderr = invoke(["tune", "--backward", "--config", str(config),
                                     "--trials", "2"])
    assert status == 0, stdout + stderr
    with sqlite3.connect(env / "user.db") as db:
        stored = [(op, json.loads(problem)) for op, problem in
                  db.execute("SELECT op, problem FROM winners")]
    assert stored == [("rms_norm_backward", {"dtype": "bfloat16", "has_weight": True,
                                             "hidden": 1024, "weight_offset": True})]
    # An op that has none is still refused, in one line.
    assert_one_error_line(*invoke(["tune", "--backward", "--config", str(config), "--op",
                                   "nope"]), "nope")


def test_render_a_backward_kernel(env: Path) -> None:  # noqa: F811
    status, stdout, _ = invoke(["render", "--op", "layer_norm_backward", "--hidden", "4096",
                                "--dtype", "fp32", "--no-bias"])
    assert status == 0
    assert "LayerNorm backward" in stdout and "bias=False" in stdout


def test_export_a_backward_kernel(env: Path) -> None:  # noqa: F811
    status, stdout, stderr = invoke(["export", "--op", "rms_norm_backward", "--hidden", "4096",
                                     "-o", str(env / "out")])
    assert status == 0, stdout + stderr
    source = (env / "out" / "autonorm_rms_bwd_bf16_h4096.cu").read_text()
    assert "RMSNorm backward" in source
    assert "autonorm_rms_bwd_bf16_h4096_backward()" in stderr
    assert "autonorm_rms_bwd_bf16_h4096_workspace_bytes()" in stderr


def test_export_and_render_take_backward_as_tune_does(env: Path) -> None:  # noqa: F811
    status, stdout, stderr = invoke(["export", "--op", "rms_norm", "--backward", "--hidden",
                                     "4096", "-o", str(env / "flag")])
    assert status == 0, stdout + stderr
    status, named, _ = invoke(["export", "--op", "rms_norm_backward", "--hidden", "4096", "-o",
                               str(env / "named")])
    assert status == 0
    cu = "autonorm_rms_bwd_bf16_h4096.cu"
    assert (env / "flag" / cu).read_text() == (env / "named" / cu).read_text()
    status, flagged, _ = invoke(["render", "--backward", "--hidden", "1000", "--dtype", "fp16"])
    assert status == 0 and "LayerNorm backward" in flagged
    assert flagged == invoke(["render", "--op", "layer_norm_backward", "--hidden", "1000",
                              "--dtype", "fp16"])[1]


def test_show_backward_lists_backward_kernels_only(env: Path) -> None:  # noqa: F811
    import json

    for extra in ([], ["--backward"]):
        for op in ("rms_norm", "layer_norm"):
            status, stdout, stderr = invoke(["tune", "--op", op, *extra, "--hidden", "1024",
                                             "--trials", "2"])
            assert status == 0, stdout + stderr

    def ops_shown(*args: str) -> set[str]:
        status, stdout, _ = invoke(["show", "--json", *args])
        assert status == 0
        return {record["op"] for record in json.loads(stdout)}

    assert ops_shown() == {"rms_norm", "layer_norm", "rms_norm_backward", "layer_norm_backward"}
    assert ops_shown("--backward") == {"rms_norm_backward", "layer_norm_backward"}
    assert ops_shown("--backward", "--op", "rms_norm") == {"rms_norm_backward"}
    assert ops_shown("--backward", "--op", "rms_norm_backward") == {"rms_norm_backward"}
