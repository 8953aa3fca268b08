"""``autonorm db``: move winners between machines, and check the tuning database.

``export`` writes the user database's winners as a sealed, portable file
(:mod:`autonorm.store.bundle`); ``import`` merges such a file, or another autonorm database,
into it (:mod:`autonorm.store.transfer`); ``check`` runs SQLite's integrity check and judges
every stored winner (:mod:`autonorm.store.audit`). With ``--verify`` each kernel is verified
again on this GPU against float64, through the tuner's crash-isolated evaluator. Every way out
ends in one line (:mod:`autonorm.cli_messages`).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import click

from autonorm.cli_params import DTYPE, OP

# What a merge's lists say, in the summary and before each entry.
_ACTIONS = (("added", "add"), ("replaced", "replace"), ("kept", "keep"),
            ("unchanged", "unchanged"))


@click.group()
def db() -> None:
    """Export, import and check tuned winners (the user's tuning database)."""


@db.command("export")
@click.option("-o", "--out", "out", type=click.Path(dir_okay=False, path_type=Path),
              required=True, help="File to write ('-': standard output).")
@click.option("--op", type=OP, default=None, help="Only this kernel family.")
@click.option("--dtype", type=DTYPE, default=None, help="Only this dtype.")
@click.option("--hidden", type=click.IntRange(min=1), default=None,
              help="Only this hidden size.")
@click.option("--device", default=None,
              help="Only GPUs whose fingerprint contains this text (e.g. H200).")
def export_winners(out: Path, op: str | None, dtype: str | None, hidden: int | None,
                   device: str | None) -> None:
    """Write your winners as a portable, sealed JSON file.

    Each winner carries its GPU (fingerprint and limits), problem, rows bucket, configuration,
    kernel digest, timings and verification record; a SHA-256 over the content lets an import
    detect any change.
    """
    from autonorm import settings
    from autonorm.store import bundle
    from autonorm.store.db import TuningDB

    store = TuningDB.open_user_to_read()
    if store is None:
        raise click.ClickException(
            f"no tuning database at {settings.user_db_path()}: nothing to export")
    with store:
        document = bundle.export_document(store, op=op, dtype=dtype, hidden=hidden,
                                          device=device)
    count = len(document["winners"])
    if not count:
        raise click.ClickException(f"no winners in {store.path} match the filters; "
                                   "nothing written")
    text = bundle.dump(document)
    if str(out) == "-":
        click.echo(text, nl=False)
    else:
        try:
            out.write_text(text)
        except OSError as exc:
            raise click.ClickException(f"cannot write {out}: {exc.strerror or exc}") from None
    gpus = len({w["device"] for w in document["winners"]})
    click.echo(f"exported {count} winner{'s' * (count != 1)} of {gpus} GPU"
               f"{'s' * (gpus != 1)} to {out} (sha256 {document['sha256'][:16]}...)", err=True)


@db.command("import")
@click.argument("source", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--dry-run", is_flag=True, help="Say what would change; write nothing.")
@click.option("--verify", is_flag=True,
              help="Verify each kernel again on this GPU before it is stored (needs a GPU; "
                   "winners of other GPUs are refused).")
def import_winners(source: Path, dry_run: bool, verify: bool) -> None:
    """Merge a winners file (or another autonorm database) into your tuning database.

    Refuses a tampered file, one of an unknown format version, and every entry whose
    configuration does not render here the kernel that was timed (another kernel version).
    Per key the faster winner stays; a winner it replaces is kept in the trials table.
    """
    from autonorm import settings
    from autonorm.store import bundle, transfer
    from autonorm.store.db import TuningDB

    verifier = _gpu_verifier(others_pass=False) if verify else None
    user = settings.user_db_path()
    if user.exists() and source.resolve() == user.resolve():
        raise click.ClickException(f"{source} is your tuning database itself; nothing to import")
    found = bundle.load(source)
    if dry_run:
        store = TuningDB.open_user_to_read() or TuningDB()
    else:
        store = TuningDB.open_user()
    with store:
        report = transfer.merge(store, found, dry_run=dry_run, verifier=verifier)
    for name, verb in _ACTIONS:
        for winner in getattr(report, name):
            click.echo(f"{verb:<10} {_describe(winner)}")
    for what, _, detail in report.refused:
        click.echo(f"{'refuse':<10} {what}: {detail}")
    counts = ", ".join(f"{len(getattr(report, name))} {name}" for name, _ in _ACTIONS)
    summary = f"{counts} from {source}"
    refused = report.refusals()
    if refused:
        why = ", ".join(f"{n} {reason}" for reason, n in refused.most_common())
        summary += f"; refused {len(report.refused)} ({why})"
    taken = len(report.added) + len(report.replaced) + len(report.kept) + len(report.unchanged)
    if refused and not taken:
        raise click.ClickException(f"nothing imported: {summary}")
    prefix = "dry run, nothing written: would have " if dry_run else ""
    click.echo(f"{prefix}{summary}", err=True)


@db.command("check")
@click.option("--verify", is_flag=True,
              help="Also verify this GPU's usable winners again on it (needs a GPU).")
def check(verify: bool) -> None:
    """Check your tuning database: SQLite's integrity check, then every stored winner.

    A winner is usable, stale (its configuration renders another kernel than the one timed:
    lookup skips it until it is tuned again), invalid (the rules refuse it on its GPU) or
    corrupt (its row cannot be read). Exits non-zero on corruption, an invalid or corrupt
    winner, or (with --verify) a kernel that fails verification.
    """
    from autonorm import settings
    from autonorm.store import audit
    from autonorm.store.db import TuningDB

    verifier = _gpu_verifier(others_pass=True) if verify else None
    path = settings.user_db_path()
    if not path.exists():
        click.echo(f"no tuning database at {path}: nothing to check", err=True)
        return
    if not path.is_file():
        raise click.ClickException(f"tuning database {path} is not a file")
    problems = audit.integrity_problems(path)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise click.ClickException(
            f"tuning database {path} is corrupt: the integrity check found: {problems[0]}{more}")
    store = TuningDB.open_user_to_read()
    assert store is not None
    with store:
        findings = audit.check_winners(store, verifier)
    if findings:
        _print_findings(findings, str(path))
    counts = Counter(f.judgement.status for f in findings)
    summary = (f"integrity ok; {len(findings)} winners: "
               + (", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "none"))
    if any(status in audit.BAD_STATUSES for status in counts):
        raise click.ClickException(f"tuning database {path}: {summary}")
    click.echo(f"tuning database {path}: {summary}", err=True)


def _describe(winner: Any) -> str:
    """A winner in a few words: op, shape, bucket, GPU, configuration and time."""
    from autonorm.cli_show import config_label, other_fields
    from autonorm.dtypes import SHORT_DTYPES

    key, fields = winner.key, winner.key.fields
    median = winner.metrics.get("median_us")
    time = f" {median:.1f} us" if isinstance(median, (int, float)) else ""
    return (f"{key.op} {SHORT_DTYPES.get(key.dtype, key.dtype)} hidden {key.hidden} "
            f"({other_fields(fields)}) rows<={key.rows_bucket} on {key.device.split('|')[0]}: "
            f"{config_label(key.op, winner.config)}{time}")


def _print_findings(findings: list[Any], title: str) -> None:
    """Print ``db check``'s table: one winner a line, with its status and why."""
    from rich import box
    from rich.table import Table

    from autonorm.cli_show import config_label, other_fields, print_whole

    table = Table(title=f"autonorm db check ({title})", box=box.SIMPLE_HEAD)
    for col in ("GPU", "op", "dtype", "hidden", "with", "rows<=", "config", "status", "why"):
        table.add_column(col, justify="right" if col in ("hidden", "rows<=") else "left",
                         no_wrap=col != "why")
    for finding in findings:
        w, row = finding.winner, finding.row
        if w is None:
            cells = [str(row.get(c)) for c in ("device", "op", "dtype", "hidden")]
            cells = [cells[0].split("|")[0], *cells[1:], "?", str(row.get("rows_bucket")), "?"]
        else:
            cells = [w.key.device.split("|")[0], w.key.op, w.key.dtype, str(w.key.hidden),
                     other_fields(w.key.fields), str(w.key.rows_bucket),
                     config_label(w.key.op, w.config)]
        table.add_row(*cells, finding.judgement.status, finding.judgement.detail)
    print_whole(table)


def _gpu_verifier(*, others_pass: bool) -> Any:
    """Verify winners' kernels again on this GPU (a one-line error where there is none).

    Args:
        others_pass: a winner of another GPU passes unverified (``check``); else it fails
            (``import``: it cannot be verified here).

    """
    from autonorm.runtime.device import NoGPUError, query_device
    from autonorm.store.audit import Reverified

    try:
        info = query_device()
    except NoGPUError as exc:
        raise click.ClickException(f"--verify needs a CUDA GPU to run the kernels on: {exc}"
                                   ) from None

    def verify(winner: Any, problem: Any, config: Any) -> Reverified:
        from autonorm.tune.evaluator_process import close_evaluator
        from autonorm.tune.isolation import IsolatedEvaluator, build_gpu_evaluator

        if winner.key.device != info.fingerprint:
            where = winner.key.device.split("|")[0]
            return Reverified(others_pass, f"not verified: tuned on {where}, not on this GPU "
                                           f"({info.name}) where it could be run")
        rows = winner.metrics.get("rows")
        rows = rows if isinstance(rows, int) and rows > 0 else winner.key.rows_bucket
        evaluator = IsolatedEvaluator(build_gpu_evaluator, (problem, rows, 0))
        try:
            outcome = evaluator.evaluate(config)
        finally:
            close_evaluator(evaluator)
        if outcome.status == "ok":
            error = f" (max rel err {outcome.max_rel_err:.2e})" if outcome.max_rel_err else ""
            return Reverified(True, f"verified again on {info.name}{error}", outcome.max_rel_err)
        return Reverified(False, f"{outcome.status}: {outcome.error}", outcome.max_rel_err)

    return verify
