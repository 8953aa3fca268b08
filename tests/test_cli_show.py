"""``autonorm show``'s table keeps every cell whole: piped, and on terminals of any width.

The shipped database's rows are the widest a user meets (the backward ops, three fields after
the add, times over 1,000 us).
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from autonorm import cli, cli_show
from autonorm.store.db import TuningDB


@pytest.fixture
def show(tmp_path, monkeypatch):
    """Run ``autonorm show --all-devices`` over the shipped winners; return its lines."""
    monkeypatch.setenv("AUTONORM_DB", str(tmp_path / "user.db"))
    monkeypatch.setenv("AUTONORM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("AUTONORM_NO_SHIPPED_DB", raising=False)

    def run(terminal_width: int | None) -> list[str]:
        monkeypatch.setattr(cli_show, "_terminal_width", lambda: terminal_width)
        result = CliRunner().invoke(cli.main, ["show", "--all-devices"])
        assert result.exit_code == 0, result.output
        return result.output.splitlines()

    return run


def _labels_and_times() -> list[tuple[str, str, str]]:
    """Each shipped winner's config label, time and share of copy as the table prints them."""
    found = []
    with TuningDB.open_shipped() as store:
        winners = store.winners(None, None)
    for winner in winners:
        m = winner.metrics
        found.append((cli_show.config_label(winner.key.op, winner.config),
                      f"{m['median_us']:.1f}", f"{m['share'] * 100:.1f}"))
    return found


@pytest.mark.parametrize("terminal_width", [None, 200, 140, 120])
def test_every_winner_keeps_its_label_time_and_share(show, terminal_width):
    lines = show(terminal_width)
    assert not any("…" in line for line in lines)
    if terminal_width is not None:
        assert max(len(line.rstrip()) for line in lines) <= terminal_width
    expected = _labels_and_times()
    assert len(expected) > 100
    rows = [line.split() for line in lines]
    for label, time, share in expected:
        assert any(label in row and time in row and share in row for row in rows), label


def test_a_narrow_terminal_loses_whole_columns_and_says_what_they_held(show):
    header_wide = next(line for line in show(None) if line.split()[:2] == ["source", "GPU"])
    assert "GB/s" in header_wide and "with" in header_wide
    lines = show(140)
    header = next(line.split() for line in lines if "config" in line.split())
    assert header[0] == "GPU" and "GB/s" not in header and "source" not in header
    assert "every row shipped" in " ".join(lines[:2])


def test_a_terminal_too_narrow_for_any_table_gets_whole_rows(show):
    lines = show(80)
    assert not any("…" in line for line in lines)
    assert max(len(line.rstrip()) for line in lines) > 80


def test_show_filters_by_dtype_and_hidden_size(tmp_path, monkeypatch):
    import json

    monkeypatch.setenv("AUTONORM_DB", str(tmp_path / "user.db"))
    monkeypatch.delenv("AUTONORM_NO_SHIPPED_DB", raising=False)
    result = CliRunner().invoke(cli.main, ["show", "--all-devices", "--json", "--dtype", "fp32",
                                           "--hidden", "4096"])
    assert result.exit_code == 0, result.output
    records = json.loads(result.stdout)
    assert records and {(r["dtype"], r["hidden"]) for r in records} == {("float32", 4096)}
    with TuningDB.open_shipped() as store:
        expected = [w for w in store.winners() if (w.key.dtype, w.key.hidden) == ("float32", 4096)]
    assert len(records) == len(expected)
