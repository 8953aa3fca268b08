"""The yes-or-no settings read yes and no in their usual spellings and ignore anything else aloud.

Anything but "" or "0" once read as yes, so ``AUTONORM_TUNE_ON_FIRST_USE=false`` turned tuning
on and ``AUTONORM_NO_SHIPPED_DB=false`` switched the shipped database off.
"""

from __future__ import annotations

import warnings

import pytest

from autonorm import settings
from autonorm.errors import BadSettingWarning


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(settings, "_FLAGS_WARNED", set())
    for name in settings.FLAGS:
        monkeypatch.delenv(name, raising=False)


def _silent(name: str) -> bool:
    """Read the flag, failing on any warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return settings.flag(name)


@pytest.mark.parametrize("value", ["1", "true", "True", "YES", " on "])
@pytest.mark.parametrize("name", settings.FLAGS)
def test_yes_in_its_usual_spellings(name, value, monkeypatch):
    monkeypatch.setenv(name, value)
    assert _silent(name) is True


@pytest.mark.parametrize("value", ["", "0", "false", "False", "NO", "off "])
@pytest.mark.parametrize("name", settings.FLAGS)
def test_no_in_its_usual_spellings(name, value, monkeypatch):
    monkeypatch.setenv(name, value)
    assert _silent(name) is False
    assert settings.flag_messages() == []


@pytest.mark.parametrize("name", settings.FLAGS)
def test_unset_is_no(name):
    assert _silent(name) is False


@pytest.mark.parametrize("name", settings.FLAGS)
def test_any_other_value_is_ignored_with_one_warning(name, monkeypatch):
    monkeypatch.setenv(name, "maybe")
    message = (f"{name}='maybe' is neither yes (1, true, yes, on) nor no (0, false, no, off): "
               "it is ignored")
    with pytest.warns(BadSettingWarning) as record:
        assert settings.flag(name) is False
    assert [str(w.message) for w in record] == [message]
    assert _silent(name) is False  # said once a process
    assert settings.flag_messages() == [message]


def test_each_setting_reads_its_flag_both_ways(monkeypatch):
    monkeypatch.setenv("AUTONORM_NO_SHIPPED_DB", "false")
    assert settings.shipped_db_path() is not None
    monkeypatch.setenv("AUTONORM_NO_SHIPPED_DB", "true")
    assert settings.shipped_db_path() is None
    monkeypatch.setenv("AUTONORM_TUNE_ON_FIRST_USE", "off")
    assert settings.tune_on_first_use() is False
    monkeypatch.setenv("AUTONORM_TUNE_ON_FIRST_USE", "on")
    assert settings.tune_on_first_use() is True
    monkeypatch.setenv("AUTONORM_NO_KEEP_X", "no")
    assert settings.keep_x_allowed() is True
    monkeypatch.setenv("AUTONORM_NO_KEEP_X", "yes")
    assert settings.keep_x_allowed() is False
