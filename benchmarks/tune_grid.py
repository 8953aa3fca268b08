"""Tune a grid of shapes into one database: how ``autonorm/tuning_db/autonorm.db`` is built.

Runs on a GPU. Every (op, dtype, hidden size, row count) of the grid goes through
:func:`autonorm.tune.session.tune_and_store`, the path ``autonorm tune`` takes: the search
runs with crash isolation, every trial is recorded, and each winner is stored with the digest
of its kernel. Re-running resumes each shape's study. At the end the database is checkpointed
out of WAL mode, so the file stands alone (ready to ship).

Example (the shipped grid, written to a fresh file)::

    python benchmarks/tune_grid.py --db /tmp/ship.db --dtypes bf16,fp16,fp32 --trials 16

``--ops`` picks the norms: ``layer_norm`` (the default), ``rms_norm``, ``add_rms_norm``
(RMSNorm after the fused residual add), ``add_layer_norm`` (LayerNorm after it), their forms
with a float32 residual beside 16-bit x ``add_rms_norm_f32res`` and ``add_layer_norm_f32res``,
and the backwards ``layer_norm_backward`` and ``rms_norm_backward``.
``--models autonorm/tuning_db/models.json`` tunes the hidden sizes of the models listed there
(each size once; a LayerNorm model's for the LayerNorm ops, an RMSNorm model's for the RMSNorm
ops) at a decode and a prefill row count instead;
``--rows grid,64,4096`` tunes the benchmark row count and those buckets together;
``--skip-stored`` passes over shapes the database already has a usable winner for,
``--budget-s`` stops between shapes before one could run past a time limit,
``--snapshot`` writes the standalone file that ships, ``--shard K/N`` tunes every N-th shape
from the K-th (N processes, one a GPU, each into a database of its own, merged afterwards with
``autonorm db import``: ``benchmarks/gpu_checks.sh models``), and ``--plan`` lists the shapes
without a GPU (docs/tuning.md, "Shipping the shapes of widely used models").
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import optuna
from grid_shapes import OPS, Shape, load_models, norm_hidden_sizes, problem_of

from autonorm import settings
from autonorm.dtypes import normalize_dtype
from autonorm.ops import registry
from autonorm.ops.base import rows_bucket
from autonorm.runtime.device import query_device
from autonorm.runtime.limits import DeviceLimits
from autonorm.store.db import TuningDB, TuningKey
from autonorm.store.snapshot import write_snapshot
from autonorm.tune.interrupt import terminate_as_interrupt
from autonorm.tune.isolation import IsolatedEvaluator, build_gpu_evaluator
from autonorm.tune.search import TuneSettings
from autonorm.tune.session import TunedKernel, incumbent_of, tune_and_store

DEFAULT_HIDDEN = "768,1024,2048,4096,8192,12288,16384,32768,65536"
# With --models: a decode bucket (33-64 rows: a batch of sequences, one token each) and a
# prefill bucket (2049-4096 rows: a prompt's tokens). Lookup serves other row counts from the
# nearest tuned bucket (docs/tuning.md).
MODEL_ROWS = "64,4096"
# The --rows entry that stands for the benchmark grid's row count, elements // hidden.
GRID_ROWS = "grid"
# Seconds for --budget-s and the per-shape report (a module attribute, so tests can stand in).
clock = time.monotonic


def _int_list(text: str, flag: str, parser: argparse.ArgumentParser) -> list[int]:
    """Parse a comma-separated list of positive integers, or exit with an error naming ``flag``."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        parser.error(f"{flag}: give comma-separated positive integers, got {text!r}")
    if not values or min(values) < 1:
        parser.error(f"{flag}: give comma-separated positive integers, got {text!r}")
    return values


def _rows_list(text: str, parser: argparse.ArgumentParser) -> list[int | None]:
    """Parse ``--rows``: positive integers and ``grid`` (None: elements // hidden)."""
    entries = [v.strip() for v in text.split(",") if v.strip()]
    try:
        values = [None if v == GRID_ROWS else int(v) for v in entries]
    except ValueError:
        values = []
    if not values or any(v is not None and v < 1 for v in values):
        parser.error(f"--rows: give comma-separated positive integers or {GRID_ROWS}, "
                     f"got {text!r}")
    return values


def _op_list(text: str, parser: argparse.ArgumentParser) -> list[str]:
    """Parse ``--ops`` (each op once, in the order given), or exit with an error naming it."""
    ops = list(dict.fromkeys(v.strip() for v in text.split(",") if v.strip()))
    unknown = [op for op in ops if op not in OPS]
    if unknown or not ops:
        parser.error(f"--ops: give a comma list of {', '.join(OPS)}, got {text!r}")
    return ops


def _shard(text: str | None, parser: argparse.ArgumentParser) -> tuple[int, int]:
    """Parse ``--shard K/N`` into (K, N); (0, 1), the whole grid, without it."""
    if text is None:
        return 0, 1
    k, sep, n = text.partition("/")
    try:
        shard = (int(k), int(n))
    except ValueError:
        shard = (-1, 0)
    if not sep or not 0 <= shard[0] < shard[1]:
        parser.error(f"--shard: expected K/N with 0 <= K < N, got {text!r}")
    return shard


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(
        prog="tune_grid.py",
        description="Tune every (op, dtype, hidden size, row count) of a grid on this GPU and "
        "store the winners in one tuning database (how the shipped database is built).",
    )
    parser.add_argument("--ops", "--op", dest="ops", default="layer_norm",
                        help=f"comma-separated norms to tune, one after another: "
                        f"{', '.join(OPS)} (RMSNorm after the fused residual add) "
                        "(default: %(default)s)")
    parser.add_argument("--dtypes", default="bf16,fp16,fp32",
                        help="comma-separated dtypes: bf16, fp16, fp32 or full names "
                        "(default: %(default)s)")
    shapes = parser.add_mutually_exclusive_group()
    shapes.add_argument("--hidden", default=None,
                        help=f"comma-separated hidden sizes (default: {DEFAULT_HIDDEN})")
    shapes.add_argument("--models", type=Path, default=None,
                        help="a list of models' norm shapes (autonorm/tuning_db/models.json): "
                        "tune the hidden sizes of its entries of each op's norm (layer_norm or "
                        f"rms_norm), each once, at rows {MODEL_ROWS} (decode and prefill "
                        "buckets) unless --rows is given")
    parser.add_argument("--elements", type=int, default=1 << 26,
                        help="rows per shape are elements // hidden, the benchmark grid "
                        "(default: %(default)s = 2^26)")
    parser.add_argument("--rows", default="",
                        help="comma-separated row counts to tune at every hidden size instead "
                        "of elements // hidden (--models: instead of "
                        f"{MODEL_ROWS}), e.g. 1,8,64,512 (latency buckets); {GRID_ROWS} stands "
                        f"for elements // hidden, e.g. {GRID_ROWS},64,4096; row counts of one "
                        "power-of-two bucket share a winner and are tuned once")
    parser.add_argument("--trials", type=int, default=16,
                        help="candidates measured per shape (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=12.0,
                        help="search seconds per shape, finals excluded (default: %(default)s)")
    parser.add_argument("--finals-top", type=int, default=3,
                        help="best candidates re-timed against the incumbent per shape "
                        "(default: %(default)s)")
    parser.add_argument("--finals-rounds", type=int, default=3,
                        help="interleaved rounds of the finals (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="sampler seed (default: %(default)s)")
    parser.add_argument("--db", type=Path, default=None,
                        help="tuning database to write (default: the user database, "
                        "AUTONORM_DB or the cache dir)")
    parser.add_argument("--storage", default=None,
                        help="Optuna storage of the studies (default: one journal file per "
                        "study in the cache dir)")
    parser.add_argument("--skip-stored", action="store_true",
                        help="pass over shapes the database already has a usable winner for "
                        "(to continue a run cut short, or to keep a copy of the shipped "
                        "database's winners as they are)")
    parser.add_argument("--snapshot", type=Path, default=None,
                        help="at the end, write the database's devices and winners (no trials) "
                        "to this file as one standalone file: the form "
                        "autonorm/tuning_db/autonorm.db ships in")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="stop between shapes once the next one could end past this many "
                        "seconds (the longest shape so far taken as its length): the shapes "
                        "left are listed and a re-run with --skip-stored resumes; a limit "
                        "that ends the command cleanly, where `timeout` would cut a shape off")
    parser.add_argument("--shard", default=None, metavar="K/N",
                        help="tune only the K-th of every N shapes of the grid (K from 0): N "
                        "processes, one a GPU, each into its own --db, share a grid")
    parser.add_argument("--plan", action="store_true",
                        help="list the shapes in tuning order and exit (no GPU needed)")
    args = parser.parse_args(argv)
    args.shard_of = _shard(args.shard, parser)
    if args.trials < 1 or args.timeout <= 0 or args.elements < 1:
        parser.error("--trials and --elements must be >= 1 and --timeout > 0")
    if args.budget_s is not None and not args.budget_s > 0:
        parser.error(f"--budget-s must be a number of seconds > 0, got {args.budget_s:g}")
    args.op_names = _op_list(args.ops, parser)
    if args.models is not None:
        try:
            models = load_models(args.models)
        except (OSError, ValueError) as exc:
            parser.error(f"--models: {exc}")
        args.hidden_sizes = {op: norm_hidden_sizes(models, OPS[op].norm) for op in args.op_names}
        for op, sizes in args.hidden_sizes.items():
            if not sizes:
                parser.error(f"--models: {args.models} lists no {OPS[op].norm} model")
    else:
        sizes = _int_list(args.hidden or DEFAULT_HIDDEN, "--hidden", parser)
        args.hidden_sizes = {op: sizes for op in args.op_names}
    rows = args.rows or (MODEL_ROWS if args.models is not None else "")
    args.row_counts = _rows_list(rows, parser) if rows else []
    try:
        args.dtype_names = [normalize_dtype(d) for d in args.dtypes.split(",") if d.strip()]
    except ValueError as exc:  # normalize_dtype names the dtype it refuses
        parser.error(f"--dtypes: {exc}")
    if not args.dtype_names:
        parser.error("--dtypes: give at least one of bf16, fp16, fp32")
    return args


def grid(args: argparse.Namespace) -> list[Shape]:
    """Return the shapes of the grid in tuning order: by op, dtype, hidden size, then rows.

    A row count whose power-of-two bucket the shape already has is left out: one tuning key,
    one winner (the first row count of a bucket is the one timed). With ``--shard K/N`` only
    every N-th shape from the K-th: the shards of a grid are disjoint, cover it, and differ
    by one shape at most, each a mix of ops, dtypes and sizes.
    """
    shapes: list[Shape] = []
    keys: set[tuple[str, str, int, int]] = set()
    for op in args.op_names:
        for dtype in args.dtype_names:
            if OPS[op].fields.get("residual_dtype") == dtype:
                continue  # x's own dtype: the plain add's shape
            for hidden in args.hidden_sizes[op]:
                for given in args.row_counts or [None]:
                    rows = given or max(1, args.elements // hidden)
                    key = (op, dtype, hidden, rows_bucket(rows))
                    if key not in keys:
                        keys.add(key)
                        shapes.append(Shape(op, dtype, hidden, rows))
    k, n = args.shard_of
    return shapes[k::n]


def plan(args: argparse.Namespace) -> str:
    """Return the listing ``--plan`` prints: one line a shape, then the count and search time."""
    shapes = grid(args)
    lines = [f"{s.op:12s} {s.dtype:9s} {s.hidden:6d} r{s.rows:<6d} "
             f"(bucket {rows_bucket(s.rows)})" for s in shapes]
    counts = ", ".join(f"{op} {sum(s.op == op for s in shapes)}" for op in args.op_names)
    lines.append(f"{len(shapes)} shapes ({counts}): at most {len(shapes) * args.timeout:.0f} s "
                 f"of search at --timeout {args.timeout:g} s a shape, plus compiles and finals")
    return "\n".join(lines)


def warm_gpu_evaluator(problem: Any, rows: int, limits: DeviceLimits) -> Any:
    """Build the GPU evaluator and run the family's default once (in the isolated child).

    The first candidate of a cold process also pays for the compiler's start and the compile
    pool's processes; done here, before the shape's search clock starts, every shape gets its
    whole budget for candidates.
    """
    evaluator = build_gpu_evaluator(problem, rows)
    default = registry.family_of(problem).default(problem, limits)
    evaluator.prepare([default])
    evaluator.evaluate(default)
    return evaluator


class WarmIsolated:
    """An evaluator factory: the warmed GPU evaluator in a crash-isolated child process."""

    def __init__(self, limits: DeviceLimits) -> None:
        self.limits = limits

    def __call__(self, problem: Any, rows: int) -> IsolatedEvaluator:
        return IsolatedEvaluator(warm_gpu_evaluator, (problem, rows, self.limits))


def report(tuned: TunedKernel, seconds: float) -> str:
    """Return the one line printed for a tuned shape."""
    problem = tuned.problem
    shape = f"{problem.dtype:9s} {problem.hidden:6d} r{tuned.rows:<6d}"
    if not tuned.stored:
        return f"{shape} nothing verified {tuned.failures} ({seconds:.0f} s)"
    t = tuned.timing
    kept = tuned.kept_note
    return (f"{shape} {t.share * 100:5.1f}% {t.gbps:6.0f} GB/s {t.median_us:7.1f} us "
            f"{tuned.config.label()}{kept} ({seconds:.0f} s)")


def checkpoint(path: Path) -> None:
    """Fold the WAL into the database file and leave WAL mode, so the file stands alone."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("PRAGMA journal_mode=DELETE")
    finally:
        conn.close()


def main(argv: list[str] | None = None) -> int:
    """Tune the grid; return the process exit code."""
    args = parse_args(argv)
    if args.plan:
        print(plan(args), flush=True)
        return 0
    from peerbench.gpu import require_gpu

    require_gpu("tune_grid.py")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    info = query_device()
    tune_settings = TuneSettings(
        n_trials=args.trials, timeout_s=args.timeout, seed=args.seed,
        finals_top=args.finals_top, finals_rounds=args.finals_rounds,
    )
    limits = info.limits()
    factory = WarmIsolated(limits)
    db = TuningDB(args.db) if args.db is not None else TuningDB.open_user()
    path = db.path or settings.user_db_path()
    op = None
    shapes = grid(args)
    begun = clock()
    longest = 0.0  # the longest shape so far: the budget's estimate of the next one
    # `kill` and `timeout` end it as Ctrl-C does: finished shapes stay stored.
    with terminate_as_interrupt():
        try:
            for index, shape in enumerate(shapes):
                if shape.op != op:
                    op = shape.op
                    print(f"tuning {op} on {info.name} into {path}", flush=True)
                started = clock()
                dtype, hidden, rows = shape.dtype, shape.hidden, shape.rows
                problem = problem_of(shape)
                key = TuningKey.for_problem(info.fingerprint, problem, rows)
                if args.skip_stored and incumbent_of(db, key, problem, limits) is not None:
                    print(f"{dtype:9s} {hidden:6d} r{rows:<6d} stored already: skipped", flush=True)
                    continue
                if args.budget_s is not None and started - begun + longest > args.budget_s:
                    print(f"budget of {args.budget_s:g} s reached: {len(shapes) - index} shapes "
                          "left; re-run with --skip-stored to resume", file=sys.stderr,
                          flush=True)
                    break
                tuned = tune_and_store(
                    problem, rows, settings=tune_settings, device=info, storage=args.storage,
                    store=db, evaluator_factory=factory, quiet=True,
                )
                seconds = clock() - started
                longest = max(longest, seconds)
                print(report(tuned, seconds), flush=True)
        except KeyboardInterrupt:
            print("interrupted: finished shapes are stored; re-run to resume", file=sys.stderr)
            return 130
        finally:
            db.close()
            checkpoint(path)
    if args.snapshot is not None:
        with TuningDB(path) as source:
            written = write_snapshot(source, args.snapshot)
            count = len(source.winners())
        print(f"wrote {written}: {count} winners, no trials (the shipped form)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
