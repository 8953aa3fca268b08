"""benchmarks/untuned.py without a GPU: the shapes it draws, its summary arithmetic, its tables.

The benchmark's GPU half (tuning, timing) runs on a GPU only; what decides which shapes it runs
and what its summary says is plain Python, checked here on synthetic measurements.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

# benchmarks/ is not a package: untuned.py's parts are in benchmarks/peerbench/
from peerbench import (  # noqa: E402
    untuned_figures,
    untuned_modes,
    untuned_records,
    untuned_shapes,
    untuned_tables,
)

SHIPPED = {768, 1024, 2048, 4096, 8192, 12288, 16384, 32768, 65536}
HELP_WITHOUT_GPU_STACK = """
import runpy, sys
for name in ("cupy", "triton", "torch"):
    sys.modules[name] = None
sys.argv = [sys.argv[1], "--help"]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120,
                          cwd=REPO)


# -- the shapes --------------------------------------------------------------------------------


def test_the_shipped_hidden_sizes_are_read_from_the_shipped_db():
    assert untuned_shapes.shipped_hidden_sizes() >= SHIPPED


@pytest.mark.parametrize("seed", range(6))
def test_the_draw_is_a_third_odd_in_range_and_never_shipped(seed):
    sizes = untuned_shapes.draw_hidden_sizes(seed, 9, untuned_shapes.shipped_hidden_sizes())
    assert sizes == sorted(set(sizes)) and len(sizes) == 9
    assert all(256 <= h <= 65536 for h in sizes)
    assert not set(sizes) & untuned_shapes.shipped_hidden_sizes()
    odd = [h for h in sizes if h % 8]
    assert len(odd) == 3
    assert len([h for h in odd if h >= 1000]) == 2  # most odd ones from 1,000 up, one below
    assert [h % 2 for h in odd if h >= 1000].count(1) == 1  # a truly odd size among them


def test_the_draw_is_seeded():
    first = untuned_shapes.draw_hidden_sizes(0, 9, SHIPPED)
    assert untuned_shapes.draw_hidden_sizes(0, 9, SHIPPED) == first
    assert untuned_shapes.draw_hidden_sizes(1, 9, SHIPPED) != first


def test_an_excluded_size_is_never_drawn():
    first = untuned_shapes.draw_hidden_sizes(3, 9)
    again = untuned_shapes.draw_hidden_sizes(3, 9, set(first))
    assert not set(again) & set(first)


@pytest.mark.parametrize("count", [1, 2, 3, 4, 5, 6, 9, 12])
def test_a_third_of_any_count_is_odd(count):
    sizes = untuned_shapes.draw_hidden_sizes(7, count, SHIPPED)
    assert len(sizes) == count
    assert len([h for h in sizes if h % 8]) == round(count / 3)


def test_a_range_with_no_room_is_refused():
    full = set(range(256, 264))
    with pytest.raises(ValueError, match="no free hidden size"):
        untuned_shapes.draw_hidden_sizes(0, 2, full, low=256, high=263)


def test_bulk_shapes_hold_2_to_the_26_elements_and_come_first():
    cases = untuned_shapes.build_cases([1000, 4567], ["bf16", "fp32"], [1, 64])
    bulk = [c for c in cases if c.kind == "bulk"]
    assert cases[: len(bulk)] == bulk and len(bulk) == 4 and len(cases) == 12
    assert {(c.hidden, c.rows) for c in bulk} == {(1000, 2**26 // 1000), (4567, 2**26 // 4567)}
    assert [c.rows for c in cases[4:]] == [1, 1, 1, 1, 64, 64, 64, 64]
    assert [c.odd for c in bulk[:2]] == [False, True]
    small_only = untuned_shapes.build_cases([1000, 4567], ["bf16"], [1, 64], bulk=False)
    assert [(c.kind, c.rows) for c in small_only] == [("small", 1)] * 2 + [("small", 64)] * 2


# -- the summary ---------------------------------------------------------------------------------

COPY_GBPS = 4000.0


def _record(dtype: str, hidden: int, kind: str, us: dict[str, float | str],
            offset: float | None = None) -> dict:
    """A record as the benchmark leaves it: each impl's microseconds, or a status string."""
    rows = 2**26 // hidden if kind == "bulk" else 64
    case = untuned_shapes.Case(dtype, hidden, rows, kind)
    rec = untuned_records.new_record(case)
    for name, value in us.items():
        r = untuned_records.new_impl()
        if isinstance(value, str):
            r["status"] = value
        else:
            r.update(status="ok", us=value, gbps=case.shape().bytes / (value * 1e-6) / 1e9)
        if name.startswith("autonorm:") and dtype == "fp32":
            r["offset_err"] = offset
        rec["impls"][name] = r
    return rec


def _summary(records: list[dict], modes: list[str]) -> dict[str, dict]:
    untuned_records.set_shares(records, {(2**27, "read"): COPY_GBPS, (2**28, "read"): COPY_GBPS})
    for rec in records:
        untuned_records.derive(rec, modes)
    return {f["figure"]: f for f in untuned_figures.summarize(records, modes)}


MODES = ["shipped", "no-shipped", "tuned"]


def _runs() -> list[dict]:
    a, n, t = "autonorm:shipped", "autonorm:no-shipped", "autonorm:tuned"
    return [
        # multiple of 8: best peers 100 (compile) and 80 (eager; liger WRONG is not a peer)
        _record("bf16", 2000, "bulk", {a: 90.0, n: 100.0, t: 81.0, "eager": 120.0,
                                       "compile": 100.0, "liger": "unavailable"}),
        _record("bf16", 4000, "bulk", {a: 64.0, n: 80.0, t: 64.0, "eager": 80.0,
                                       "compile": 96.0, "liger": 40.0}),
        # odd from 1,000 up: best peer 70
        _record("bf16", 4001, "bulk", {a: 100.0, n: 70.0, t: 90.0, "eager": 70.0,
                                       "compile": 75.0}),
        # odd below 1,000: in no odd figure
        _record("bf16", 900, "bulk", {a: 500.0, n: 500.0, t: 500.0, "eager": 100.0}),
        _record("fp32", 2000, "small", {a: 4.0, n: 5.0, "eager": 3.0, "compile": 6.0},
                offset=2e-7),
        _record("fp32", 4001, "small", {a: 2.0, n: 2.0, "eager": 3.0}, offset=3e-6),
    ]


def test_the_best_peer_is_the_fastest_correct_one():
    records = _runs()
    records[1]["impls"]["liger"]["status"] = "WRONG"
    _summary(records, MODES)
    assert [r["best_peer"] for r in records[:3]] == ["compile", "eager", "eager"]
    assert records[0]["ratio"] == {"shipped": 100 / 90, "no-shipped": 1.0, "tuned": 100 / 81}
    assert records[0]["untuned_over_tuned"] == pytest.approx(0.9)


def test_the_summary_figures_are_computed_from_the_records():
    records = _runs()
    records[1]["impls"]["liger"]["status"] = "WRONG"
    figures = _summary(records, MODES)
    worst = figures["untuned, multiple of 8: worst speed over the best peer"]
    assert worst["value"] == pytest.approx(min(80 / 64, 100 / 90))
    assert worst["where"] == "bf16 h=2000 rows=33554" and worst["met"] is True
    geo = figures["untuned, multiple of 8: geo-mean speed over the best peer"]
    assert geo["value"] == pytest.approx(math.sqrt(100 / 90 * 80 / 64))
    assert geo["met"] is (geo["value"] >= 1.15)
    tuned = figures["untuned, multiple of 8: worst speed over tuned"]
    assert tuned["value"] == pytest.approx(0.9) and tuned["met"] is True
    share = figures["untuned, odd from 1000: worst % of copy"]
    shape = untuned_shapes.Case("bf16", 4001, 2**26 // 4001, "bulk").shape()
    assert share["value"] == pytest.approx(shape.bytes / 100e-6 / 1e9 / COPY_GBPS * 100)
    assert share["n"] == 1
    odd = figures["untuned, odd from 1000: worst speed over the best peer"]
    assert odd["value"] == pytest.approx(0.7) and odd["met"] is False
    none = figures["no shipped DB: geo-mean speed over the best peer"]
    assert none["value"] == pytest.approx((1.0 * 1.0 * 1.0 * 0.2) ** 0.25) and none["n"] == 4
    small = figures["rows 1-256, untuned: worst speed over the best peer (CUDA graph)"]
    assert small["value"] == pytest.approx(0.75) and small["where"] == "fp32 h=2000 rows=64"
    offset = figures["fp32 rows of mean 1000, spread 0.1: worst error"]
    assert offset["value"] == pytest.approx(3e-6) and offset["met"] is False
    assert offset["where"] == "fp32 h=4001 rows=64" and offset["n"] == 4


def test_a_failed_or_skipped_shape_leaves_a_figure_unmet():
    records = _runs()
    records[1]["impls"]["liger"]["status"] = "WRONG"
    records[0]["impls"]["autonorm:shipped"].update(status="error", us=None)
    skipped = untuned_records.new_record(untuned_shapes.Case("bf16", 6000, 64, "small"))
    skipped["status"] = "skipped"
    figures = _summary([*records, skipped], MODES)
    worst = figures["untuned, multiple of 8: worst speed over the best peer"]
    assert worst["missing"] == 1 and worst["met"] is False
    assert worst["value"] == pytest.approx(80 / 64)  # the shapes that ran still count
    small = figures["rows 1-256, untuned: worst speed over the best peer (CUDA graph)"]
    assert small["missing"] == 1 and small["met"] is False


def test_a_mode_left_out_leaves_its_figures_without_shapes():
    figures = _summary(_runs(), ["shipped", "no-shipped"])
    tuned = figures["untuned, multiple of 8: worst speed over tuned"]
    assert tuned["n"] == 0 and tuned["met"] is None and tuned["value"] is None


def test_the_report_has_a_table_per_dtype_and_kind_and_the_summary():
    records = _runs()
    figures = list(_summary(records, MODES).values())
    text = untuned_tables.format_report(records, MODES, ["bf16", "fp32"], figures)
    assert "### bf16, rows = 2^26 / hidden: % of copy bandwidth" in text
    assert "### fp32, rows 1-256: microseconds by CUDA-graph replay" in text
    assert "### bf16, rows 1-256" not in text  # no small bf16 shape in these records
    assert "| hidden | rows | odd | shipped % | no-shipped % | tuned % | best peer |" in text
    assert "| 4001 | 16773 | yes |" in text
    assert "| untuned, multiple of 8: worst speed over tuned | 0.900 | >= 0.9 | 2 |" in text
    assert "| fp32 rows of mean 1000, spread 0.1: worst error | 3.0e-06 | <= 1e-06 |" in text
    assert text.count("| NO |") == sum(f["met"] is False for f in figures)


def test_a_pick_from_the_wrong_database_is_caught():
    assert untuned_modes.check_mode("tuned", "user") is None
    assert untuned_modes.check_mode("tuned", "default") is not None
    assert untuned_modes.check_mode("shipped", "default") is None
    assert untuned_modes.check_mode("shipped", "shipped-nearest") is None
    assert untuned_modes.check_mode("shipped", "user-nearest") is not None
    assert untuned_modes.check_mode("no-shipped", "shipped-nearest") is not None
    assert untuned_modes.check_mode("no-shipped", "default") is None


# -- the command line ----------------------------------------------------------------------------


def test_help_needs_no_gpu_stack():
    run = _run("-c", HELP_WITHOUT_GPU_STACK, str(BENCHMARKS / "untuned.py"))
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.startswith("usage: untuned.py")
    for flag in ("--seed", "--count", "--dtypes", "--modes", "--tune-timeout", "--small-rows",
                 "--json", "--plan"):
        assert flag in run.stdout


def test_plan_lists_the_shapes_without_a_gpu():
    run = _run(str(BENCHMARKS / "untuned.py"), "--plan", "--count", "3", "--dtypes", "fp16",
               "--small-rows", "1,256")
    assert run.returncode == 0, run.stderr[-2000:]
    sizes = untuned_shapes.draw_hidden_sizes(0, 3, untuned_shapes.shipped_hidden_sizes())
    assert f"hidden sizes (seed 0): {', '.join(map(str, sizes))}" in run.stdout
    lines = [line for line in run.stdout.splitlines() if line.startswith("  ")]
    assert len(lines) == 9 and sum(" odd" in line for line in lines) == 3


@pytest.mark.parametrize("argv, flag", [
    (["--dtypes", "fp8"], "--dtypes"),
    (["--modes", "tuned,fast"], "--modes"),
    (["--small-rows", "1,x"], "--small-rows"),
    (["--small-rows", "512"], "--small-rows"),
    (["--count", "0"], "--count"),
    (["--no-bulk", "--no-small"], "--no-bulk"),
])
def test_bad_arguments_end_in_one_line_naming_the_flag(argv, flag):
    run = _run(str(BENCHMARKS / "untuned.py"), *argv)
    assert run.returncode == 2
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("untuned.py: error:") and flag in last
    assert "Traceback" not in run.stderr


def test_the_tuned_database_is_copied_with_its_write_ahead_log(tmp_path: Path) -> None:
    from peerbench.untuned_tuning import copy_database

    from autonorm.ops.layer_norm.problem import Problem
    from autonorm.store.db import TuningDB, TuningKey

    source, copy = tmp_path / "tuned.db", tmp_path / "copy.db"
    key = TuningKey.for_problem("gpu-test", Problem(4104), 16384)
    with TuningDB(source) as db:
        db.set_winner(key, {"threads": 256}, {"share": 0.9}, "0" * 64)
        # Still open: the winner's pages are in tuned.db-wal, not yet in tuned.db.
        assert (tmp_path / "tuned.db-wal").stat().st_size > 0
        copy_database(source, copy)
    with TuningDB(copy) as db:
        assert db.get_winner(key).metrics == {"share": 0.9}


def test_tuning_keeps_the_current_winners_it_holds_and_tunes_the_rest(tmp_path: Path,
                                                                     monkeypatch) -> None:
    # The GPU's half faked at its seams: the device query, and the tuner (which records the
    # shapes it was asked for). A held, current winner is kept; a stale one is tuned again.
    import argparse
    import types

    from peerbench import untuned_tuning
    from test_cli_errors import H200 as INFO

    import autonorm.runtime.device as device
    import autonorm.tune.session as session
    from autonorm import lookup
    from autonorm.ops.layer_norm.family import FAMILY
    from autonorm.ops.layer_norm.problem import Problem
    from autonorm.runtime.limits import H200
    from autonorm.store.db import TuningDB, TuningKey

    monkeypatch.setattr(device, "query_device", lambda: INFO)
    asked = []

    def tune_and_store(problem, rows, **_):
        asked.append(problem.hidden)
        return types.SimpleNamespace(stored=False, evaluated=0, config=None, timing=None,
                                     failures={"fake": 1})

    monkeypatch.setattr(session, "tune_and_store", tune_and_store)
    cases = [untuned_shapes.Case("bf16", h, 2**26 // h, "bulk") for h in (1072, 2416, 4360)]
    target = tmp_path / "tuned.db"
    with TuningDB(target) as db:
        for hidden, kernel in ((1072, None), (2416, "0" * 64)):  # current, then stale
            problem = Problem(hidden, "bfloat16")
            config = FAMILY.default(problem, H200, 2**26 // hidden)
            key = TuningKey.for_problem(INFO.fingerprint, problem, 2**26 // hidden)
            db.set_winner(key, config.to_dict(), {"share": 0.9},
                          kernel or lookup.kernel_of(config, problem, H200))
    args = argparse.Namespace(tune_trials=1, tune_timeout=1.0, seed=0)
    modes = untuned_modes.Modes(tmp_path)
    records = untuned_tuning.tune_bulk(cases, args, modes, math.inf, lambda _: None, target)
    assert [r["status"] for r in records] == ["kept", "error", "error"]
    assert records[0]["share"] == 0.9 and records[0]["label"]
    assert asked == [2416, 4360]
