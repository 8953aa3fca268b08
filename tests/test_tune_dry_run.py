"""``autonorm tune --dry-run``: the shapes a command would tune, without a GPU or a change."""

from __future__ import annotations

import json
from pathlib import Path

from test_cli_errors import env, invoke  # noqa: F401 - env: a fixture (a fake H200)


def _no_gpu(monkeypatch) -> None:  # noqa: ANN001
    import autonorm.runtime.device
    from autonorm.runtime.device import NoGPUError

    def none(device_id=None):  # noqa: ANN001, ANN202, ARG001
        raise NoGPUError("no CUDA GPU found on this machine")

    monkeypatch.setattr(autonorm.runtime.device, "query_device", none)


def test_a_model_plan_is_listed_without_a_gpu_and_nothing_is_touched(env: Path,  # noqa: F811
                                                                      monkeypatch) -> None:
    _no_gpu(monkeypatch)
    config = env / "llama.json"
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": 4096,
                                  "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16"}))
    status, stdout, stderr = invoke(["tune", "--config", str(config), "--dry-run"])
    assert status == 0, stdout + stderr
    assert stdout.splitlines() == [
        "rms_norm bf16 hidden 4096 rows 16384",
        "rms_norm bf16 hidden 4096 rows 16384 residual add",
        "2 shapes, 2 to tune (no GPU here: which are stored already is known on the GPU): at "
        "most 90 s of search, plus compiles and finals",
    ]
    assert not (env / "user.db").exists()
    assert not (env / "cache").exists()


def test_on_the_gpu_the_stored_shapes_say_so(env: Path) -> None:  # noqa: F811
    status, stdout, stderr = invoke(["tune", "--hidden", "1024", "--trials", "2"])
    assert status == 0, stdout + stderr
    status, stdout, _ = invoke(["tune", "--hidden", "1024,2048", "--budget", "30", "--dry-run"])
    assert status == 0
    lines = stdout.splitlines()
    assert lines[0].startswith("layer_norm bf16 hidden 1024 rows 65536  (stored: t")
    assert lines[1] == "layer_norm bf16 hidden 2048 rows 32768"
    assert lines[2] == ("2 shapes, 1 to tune on NVIDIA H200: at most 30 s of search, plus "
                        "compiles and finals")
    status, stdout, _ = invoke(["tune", "--hidden", "1024,2048", "--force", "--dry-run"])
    assert status == 0
    assert "stored" not in stdout and "2 shapes, 2 to tune on NVIDIA H200" in stdout
