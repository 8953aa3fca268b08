"""CPU: ``autonorm db import --verify`` end to end, with the GPU's verification stood in for.

The command verifies each entry of this GPU through the tuner's crash-isolated evaluator; here
that evaluator is a stand-in that fails one kernel and passes the others, so the command's own
path runs: which kernels reach the evaluator and at how many rows, the refusal lines, the
summary, what the user's database keeps and the error recorded with an imported winner. The
GPU test of the same path is tests/test_gpu_tune_config.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from test_db_transfer import A100, BF16_4096, BF16_8192, H200, ROW, ROW2, ROW128, put

from autonorm import cli
from autonorm.results import Outcome
from autonorm.store import transfer
from autonorm.store.db import TuningDB

ERROR = "offset: rel_l2 3.10e-02 (tol 1e-02), scaled_max 2.00e-01 (tol 6e-02)"


class StandIn:
    """Takes the isolated evaluator's place: fails hidden 4096's kernel, passes the others."""

    built: list[tuple[Any, tuple]] = []
    closed: list[StandIn] = []

    def __init__(self, factory: Any, args: tuple) -> None:
        StandIn.built.append((factory, args))
        self.problem = args[0]

    def evaluate(self, config: Any) -> Outcome:
        if self.problem.hidden == 4096:
            return Outcome("verification", error=ERROR, max_rel_err=3.1e-2)
        return Outcome("ok", max_rel_err=3e-3)

    def close(self) -> None:
        StandIn.closed.append(self)


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A tmp user DB, a fake H200 as this machine's GPU and the stand-in evaluator."""
    import autonorm.runtime.device
    import autonorm.tune.isolation

    monkeypatch.setenv("AUTONORM_DB", str(tmp_path / "user.db"))
    monkeypatch.setenv("AUTONORM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("AUTONORM_NO_SHIPPED_DB", "1")
    monkeypatch.setattr(autonorm.runtime.device, "query_device", lambda device_id=None: H200)
    monkeypatch.setattr(autonorm.tune.isolation, "IsolatedEvaluator", StandIn)
    StandIn.built, StandIn.closed = [], []
    return tmp_path


def invoke(args: list[str]) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli.main, args)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    return result.exit_code, result.stdout, result.stderr


def test_verify_takes_what_passes_and_keeps_the_users_winner_where_a_kernel_fails(env):
    from autonorm.tune.isolation import build_gpu_evaluator

    with TuningDB(env / "user.db") as user:  # the user's own, slower than the file's
        mine = put(user, H200, BF16_4096, ROW128, 4096, median_us=50.0)
        before = user.get_winner(mine)
    with TuningDB(env / "source.db") as source:
        put(source, H200, BF16_4096, ROW, 4096, median_us=10.0)
        passing = put(source, H200, BF16_8192, ROW2, 8192, median_us=20.0)
        put(source, A100, BF16_4096, ROW128, 4096, median_us=14.0)
    status, stdout, stderr = invoke(["db", "import", "--verify", str(env / "source.db")])
    assert status == 0, stderr
    summary = stderr.strip().splitlines()[-1]
    assert summary.startswith("1 added, 0 replaced, 0 kept, 0 unchanged from "), summary
    assert summary.endswith("refused 2 (2 failed verification)"), summary
    said = {(line.split()[0], line.split(" hidden ")[1].split()[0],
             "A100" in line): line for line in stdout.splitlines()}
    assert set(said) == {("add", "8192", False), ("refuse", "4096", False),
                         ("refuse", "4096", True)}, stdout
    assert said["refuse", "4096", False].endswith(f": verification: {ERROR}")
    assert said["refuse", "4096", True].endswith(
        ": not verified: tuned on NVIDIA A100-SXM4-80GB, not on this GPU (NVIDIA H200) where "
        "it could be run")
    # Only this GPU's kernels ran, each in its own evaluator at its winner's row count, and
    # each evaluator was closed.
    assert sorted((args[0].hidden, args[1], args[2]) for _, args in StandIn.built) == [
        (4096, 4096, 0), (8192, 8192, 0)]
    assert {factory for factory, _ in StandIn.built} == {build_gpu_evaluator}
    assert len(StandIn.closed) == 2
    with TuningDB(env / "user.db") as user:
        kept = user.get_winner(mine)
        assert (kept.config, kept.metrics, kept.kernel) == (before.config, before.metrics,
                                                            before.kernel)
        assert user.get_winner(passing).config == ROW2.to_dict()
        [trial] = user.trials()
        assert (trial["study"], trial["hidden"], trial["max_rel_err"]) == (
            transfer.IMPORTED_STUDY, 8192, 3e-3)
