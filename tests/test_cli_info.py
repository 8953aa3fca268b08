"""``autonorm info``: what it reports with and without a GPU, and a misspelt setting."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from test_shipped_kernels import COUNT

from autonorm import cli
from autonorm.runtime.device import DeviceInfo, NoGPUError

# The shipped database's H200: its winners are this GPU's.
H200 = DeviceInfo(name="NVIDIA H200", cc=90, sm_count=132, l2_bytes=62914560,
                  smem_optin=232448, mem_bus_bits=6016, mem_clock_khz=3201000)


@pytest.fixture
def run(tmp_path, monkeypatch):
    """Run ``autonorm info`` with a fresh user DB path and the shipped DB; return its stdout."""
    import autonorm.runtime.device

    for name in list(__import__("os").environ):
        if name.startswith("AUTONORM_") and not name.startswith("AUTONORM_TEST_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AUTONORM_DB", str(tmp_path / "user.db"))
    monkeypatch.setenv("AUTONORM_CACHE_DIR", str(tmp_path / "cache"))

    def invoke(gpu: DeviceInfo | None, *args: str) -> str:
        def query(device_id=None):  # noqa: ANN001, ANN202, ARG001
            if gpu is None:
                raise NoGPUError("no CUDA GPU found on this machine")
            return gpu

        monkeypatch.setattr(autonorm.runtime.device, "query_device", query)
        result = CliRunner().invoke(cli.main, ["info", *args])
        assert result.exit_code == 0, result.output
        return result.stdout

    return invoke


def _line(out: str, key: str) -> str:
    return next(line for line in out.splitlines() if line.split("  ")[0].strip() == key)


def test_without_a_gpu_each_missing_piece_says_what_it_costs(run, tmp_path):
    out = run(None)
    assert _line(out, "GPU").endswith("none: no CUDA GPU found on this machine (tune and run "
                                      "kernels need one; show, export and render work without)")
    assert _line(out, "user DB").endswith(f"{tmp_path / 'user.db'} (not created yet: the first "
                                          "tuning creates it)")
    assert f"({COUNT} winners; tuned on NVIDIA H200, read-only)" in _line(out, "shipped DB")
    assert _line(out, "settings").endswith(f"AUTONORM_DB={tmp_path / 'user.db'}, "
                                           f"AUTONORM_CACHE_DIR={tmp_path / 'cache'}")
    assert not (tmp_path / "user.db").exists()  # reading creates nothing


def test_on_a_gpu_the_winners_for_it_are_counted(run):
    out = run(H200)
    assert _line(out, "GPU").endswith("NVIDIA H200, sm_90, 132 SMs, 60 MiB L2")
    assert f"({COUNT} winners, {COUNT} for this GPU; tuned on NVIDIA H200, read-only)" in _line(
        out, "shipped DB")
    other = DeviceInfo(name="NVIDIA A100", cc=80, sm_count=108, l2_bytes=41943040,
                       smem_optin=166912, mem_bus_bits=5120, mem_clock_khz=1593000)
    assert f"({COUNT} winners, 0 for this GPU;" in _line(run(other), "shipped DB")


def test_an_mps_client_sees_the_sms_it_may_use(run, monkeypatch):
    from autonorm.runtime import driver

    monkeypatch.setattr(driver, "context_sm_count", lambda: 66)
    out = run(H200)
    assert _line(out, "GPU").endswith("NVIDIA H200, sm_90, 132 SMs (66 usable by this process: "
                                      "MPS or a green context), 60 MiB L2")
    assert json.loads(run(H200, "--json"))["gpu"]["usable_sms"] == 66


def test_a_misspelt_setting_is_named_with_the_one_meant(run, monkeypatch):
    monkeypatch.setenv("AUTONORM_NO_SHIPED_DB", "1")
    monkeypatch.setenv("AUTONORM_TEST_REDIS_URL", "redis://x")  # the test suite's own
    out = run(None)
    warnings = [line for line in out.splitlines() if line.startswith("warning")]
    assert warnings == ["warning     AUTONORM_NO_SHIPED_DB is no autonorm setting and is "
                        "ignored; did you mean AUTONORM_NO_SHIPPED_DB?"]


def test_a_yes_or_no_setting_it_cannot_read_is_named_once(run, monkeypatch):
    from autonorm import settings

    monkeypatch.setattr(settings, "_FLAGS_WARNED", set())
    monkeypatch.setenv("AUTONORM_NO_SHIPPED_DB", "sometimes")
    result = CliRunner().invoke(cli.main, ["info"])
    assert result.exit_code == 0
    warnings = [line for line in result.stdout.splitlines() if line.startswith("warning")]
    assert warnings == ["warning     AUTONORM_NO_SHIPPED_DB='sometimes' is neither yes (1, true, "
                        "yes, on) nor no (0, false, no, off): it is ignored"]
    assert "warning:" not in result.stderr
    assert _line(run(None), "shipped DB").endswith("read-only)")  # ignored: the file is used


def test_json_holds_the_same_facts(run, monkeypatch):
    monkeypatch.setenv("AUTONORM_NO_SHIPPED_DB", "1")
    found = json.loads(run(H200, "--json"))
    assert found["gpu"]["fingerprint"] == H200.fingerprint
    assert found["shipped_db"] == {"path": None, "winners": None}
    assert found["settings"]["AUTONORM_NO_SHIPPED_DB"] == "1"
    assert found["unknown_settings"] == []


def test_every_command_but_info_warns_of_a_misspelt_setting_once(run, monkeypatch):
    from autonorm import settings
    from autonorm.errors import UnknownSettingWarning

    monkeypatch.setattr(settings, "_WARNED", False)
    monkeypatch.setenv("AUTONORM_TUNE_ON_FIRSTUSE", "1")
    result = CliRunner().invoke(cli.main, ["show", "--all-devices"])
    assert result.exit_code == 0
    assert ("warning: AUTONORM_TUNE_ON_FIRSTUSE is no autonorm setting and is ignored; did you "
            "mean AUTONORM_TUNE_ON_FIRST_USE?") in result.stderr
    # Dispatch asks too, on its first kernel of a process: the warning is given once.
    with pytest.warns(UnknownSettingWarning):
        monkeypatch.setattr(settings, "_WARNED", False)
        settings.warn_unknown_variables()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        settings.warn_unknown_variables()
    # info says it among its lines, not on stderr besides.
    monkeypatch.setattr(settings, "_WARNED", False)
    result = CliRunner().invoke(cli.main, ["info"])
    assert "warning:" not in result.stderr
    assert "did you mean AUTONORM_TUNE_ON_FIRST_USE?" in result.stdout
