"""``autonorm export --config``: the kernel of each norm shape a model's config plans (no GPU).

The shapes are those ``autonorm tune --config`` plans for the same file: a RMSNorm model's
norms plain and after the residual add, a LayerNorm model's plain; ``--op``, ``--hidden`` and
``--dtype`` replace what the config says, and ``--residual`` keeps the form after the add.
"""

from __future__ import annotations

import json
from pathlib import Path

from test_cli_errors import assert_one_error_line, env, invoke  # noqa: F401 - env: a fixture

LLAMA = {"model_type": "llama", "hidden_size": 4096, "rms_norm_eps": 1e-5,
         "torch_dtype": "bfloat16"}
BERT = {"model_type": "bert", "hidden_size": 768, "layer_norm_eps": 1e-12}


def _configs(where: Path) -> list[str]:
    paths = []
    for name, config in (("llama", LLAMA), ("bert", BERT)):
        path = where / f"{name}.json"
        path.write_text(json.dumps(config))
        paths += ["--config", str(path)]
    return paths


def _exported(stdout: str) -> dict[str, dict]:
    """Each export's manifest, by the stem of its files."""
    manifests = [Path(line) for line in stdout.splitlines() if line.endswith(".json")]
    return {path.stem: json.loads(path.read_text()) for path in manifests}


def test_each_norm_of_each_model_is_exported_once(env: Path) -> None:  # noqa: F811
    status, stdout, stderr = invoke(["export", *_configs(env), "-o", str(env / "out")])
    assert status == 0, stdout + stderr
    manifests = _exported(stdout)
    assert set(manifests) == {"autonorm_rms_bf16_h4096", "autonorm_add_rms_bf16_h4096",
                              "autonorm_ln_bf16_h768"}
    assert len(stdout.splitlines()) == 9  # .cu, .h and .json of each
    for stem in manifests:
        assert (env / "out" / f"{stem}.cu").is_file() and (env / "out" / f"{stem}.h").is_file()


def test_options_replace_what_the_configs_say(env: Path) -> None:  # noqa: F811
    status, stdout, _ = invoke(["export", *_configs(env), "--dtype", "fp32", "--residual",
                                "-o", str(env / "out")])
    assert status == 0
    assert set(_exported(stdout)) == {"autonorm_add_rms_fp32_h4096", "autonorm_add_ln_fp32_h768"}
    status, stdout, _ = invoke(["export", *_configs(env)[:2], "--op", "layer_norm", "-o",
                                str(env / "ln")])
    assert status == 0
    assert set(_exported(stdout)) == {"autonorm_ln_bf16_h4096"}


def test_backward_exports_the_backward_of_each_norm(env: Path) -> None:  # noqa: F811
    # Training runs each norm backward too: the backward kernel of each, plain (a model's own
    # modules run the plain norm), Gemma's 1 + weight kept.
    gemma = env / "gemma.json"
    gemma.write_text(json.dumps({"model_type": "gemma2", "hidden_size": 2304,
                                 "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16"}))
    status, stdout, stderr = invoke(["export", *_configs(env), "--config", str(gemma),
                                     "--backward", "-o", str(env / "out")])
    assert status == 0, stdout + stderr
    manifests = _exported(stdout)
    assert set(manifests) == {"autonorm_rms_bwd_bf16_h4096", "autonorm_ln_bwd_bf16_h768",
                              "autonorm_rms_bwd_bf16_h2304_offset"}
    assert {m["problem"]["hidden"]: m["function"].endswith("_backward")
            for m in manifests.values()} == {4096: True, 768: True, 2304: True}
    assert manifests["autonorm_rms_bwd_bf16_h2304_offset"]["problem"]["weight_offset"] is True
    # --op names the norm in either form; --residual the backward of the add.
    status, stdout, _ = invoke(["export", *_configs(env)[:2], "--op", "rms_norm_backward",
                                "--residual", "-o", str(env / "add")])
    assert status == 0
    assert set(_exported(stdout)) == {"autonorm_add_rms_bwd_bf16_h4096"}


def test_a_model_config_refuses_what_exports_one_shape(env: Path) -> None:  # noqa: F811
    configs = _configs(env)
    out = ["-o", str(env / "out")]
    assert_one_error_line(*invoke(["export", *out]), "Missing option '--hidden'. Or give a "
                                                     "model's --config")
    assert_one_error_line(*invoke(["export", *configs, "--residual-dtype", "fp32", *out]),
                          "--residual-dtype exports one shape")
    assert_one_error_line(*invoke(["export", "--config", str(env / "none.json"), *out]),
                          "cannot read")
