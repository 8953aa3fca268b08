"""Tests of naming the candidates a tune saw fail (autonorm.tune.failures): no GPU."""

from __future__ import annotations

from autonorm.ops.base import problem_key
from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.problem import Problem
from autonorm.results import Outcome, Timing
from autonorm.runtime.device import DeviceInfo
from autonorm.store.db import TuningDB, TuningKey
from autonorm.tune.failures import (
    ERROR_CHARS,
    FailedCandidate,
    describe_failed,
    failed_candidates,
)

DEVICE = DeviceInfo("NVIDIA H200", 90, 132, 62914560, 232448, 6144, 3201000).fingerprint
KEY = TuningKey(DEVICE, "layer_norm", problem_key(Problem(4096, "bfloat16")), 1024)
OTHER = TuningKey(DEVICE, "layer_norm", problem_key(Problem(2048, "bfloat16")), 1024)
TIMED = Outcome("ok", Timing(70.5, 70.1, 71.0, 0.01, 3800.0, 0.92, 30), max_rel_err=1e-3)


def config(threads: int) -> KernelConfig:
    return KernelConfig(threads=threads, vec=8, cache="smem", stats="welford")


def test_failed_candidates_newest_first_one_a_label_of_this_study_only():
    with TuningDB(None) as db:
        launch = Outcome("launch", error="CUDARuntimeError: cudaErrorIllegalInstruction: "
                                         "an illegal instruction was encountered")
        log = Outcome("compile", error=f"{config(256).label()}: \n  kernel.cu(12): error: "
                                       "identifier x is undefined\n1 error detected")
        db.record_outcome(KEY, config(128), launch, study="s1")
        db.record_outcome(KEY, config(256), log, study="s1")
        db.record_outcome(KEY, config(512), Outcome("invalid", error="rules"), study="s1")
        db.record_outcome(KEY, config(64), TIMED, study="s1")
        # Another study (older code) and another key: not this tune's
        db.record_outcome(KEY, config(1024), launch, study="s0")
        db.record_outcome(OTHER, config(1024), launch, study="s1")
        # A label that failed, then ran: no longer failed
        db.record_outcome(KEY, config(32), Outcome("verification", error="0.3 > 8e-3"), study="s1")
        db.record_outcome(KEY, config(32), TIMED, study="s1")

        failed = failed_candidates(db, KEY, "s1")
        assert failed == (
            FailedCandidate("compile", config(256).label(),
                            "kernel.cu(12): error: identifier x is undefined"),
            FailedCandidate("launch", config(128).label(), launch.error),
        )
        assert failed_candidates(db, KEY, "s0") == (
            FailedCandidate("launch", config(1024).label(), launch.error),)
        assert failed_candidates(db, KEY, "s2") == ()


def test_a_long_error_is_cut_to_one_terminal_line():
    with TuningDB(None) as db:
        db.record_outcome(KEY, config(128), Outcome("launch", error="x" * 1000), study="s")
        db.record_outcome(KEY, config(256), Outcome("launch"), study="s")
        short, long = failed_candidates(db, KEY, "s")
    assert short.error == ""
    assert len(long.error) == ERROR_CHARS and long.error.endswith("...")


def test_describe_failed_names_the_first_few_and_counts_the_rest():
    failed = tuple(FailedCandidate(kind, f"c{i}", f"e{i}" if i else "")
                   for i, kind in enumerate(("launch", "compile", "verification", "launch")))
    assert describe_failed(failed) == [
        "failed at launch: c0",
        "failed to compile: c1: e1",
        "failed verification: c2: e2",
        "and 1 more (the database's trials table has each)",
    ]
    assert describe_failed(failed[:1]) == ["failed at launch: c0"]
    assert describe_failed(()) == []
