#!/usr/bin/env python3
"""Benchmark autonorm at LayerNorm shapes nobody tuned, against its peers, in one run.

Run on a GPU machine, from the repository root::

    python benchmarks/untuned.py --json $OUT/untuned.json    # everything (~8 min on an H200)
    python benchmarks/untuned.py --count 3 --dtypes bf16 --modes shipped,no-shipped
    python benchmarks/untuned.py --plan                      # the shapes it would run (no GPU)

Shapes: ``--count`` hidden sizes drawn with ``--seed`` from 256 to 65,536, log-uniformly; a
third of them not a multiple of 8 ("odd"), most of those from 1,000 up; none of them a hidden
size the shipped tuning database holds. Each runs at rows = 2^26 / hidden ("bulk") and at each
of ``--small-rows``, in every ``--dtypes``.

autonorm runs in each of ``--modes``, switched in this process (the settings are read at each
lookup; dispatch's caches are cleared between modes, and each pick is checked against its mode):

- ``shipped``: the default dispatch, the shipped database on, no user database: untuned;
- ``no-shipped``: ``AUTONORM_NO_SHIPPED_DB=1``, a GPU with no tuning at all;
- ``tuned``: after tuning the bulk shape for ``--tune-timeout`` seconds, as
  ``benchmarks/tune_grid.py`` tunes (``tune_and_store``, warm evaluator), into a temporary user
  database (``AUTONORM_DB``): the user's own database is neither read nor written. Only the
  multiples of 8 are tuned unless ``--tune-odd`` is given: the summary compares untuned with
  tuned speed at those.

Peers, timing and byte counts come from the peers benchmark's modules (``benchmarks/peerbench/``,
as ``benchmarks/peers.py`` runs them): PyTorch eager ``F.layer_norm``, ``torch.compile`` of it
and Liger-Kernel's LayerNorm (skipped, with the reason, where it does not import). Every output
is checked against float64 before it is timed (autonorm's written into a buffer poisoned with
NaN first); fp32 autonorm also on rows of mean 1000 and spread 0.1.
Bulk shapes are timed as single launches after an L2 flush (median), as a share of a copy of the
same bytes (docs/timing.md); small row counts by CUDA-graph replay (median of replays).
The tables, and the figures the shapes must reach, go to stdout; ``--json`` keeps every number.
"""

from __future__ import annotations

import datetime as _dt
import faulthandler
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

# benchmarks/ is not a package: peerbench (and tune_grid.py) are found through HERE
from peerbench.copies import copy_rates, copy_sizes, measure_copies, used_copies  # noqa: E402
from peerbench.failures import short_error, sync_quietly  # noqa: E402
from peerbench.impls import Impls  # noqa: E402
from peerbench.untuned_arguments import parse_args  # noqa: E402
from peerbench.untuned_constants import (  # noqa: E402
    GRAPH_REP_MS,
    OFFSET_MEAN,
    OFFSET_SPREAD,
    PEER_NAMES,
)
from peerbench.untuned_figures import summarize  # noqa: E402
from peerbench.untuned_measurement import measure  # noqa: E402
from peerbench.untuned_modes import Modes, turn_off_first_use_tuning  # noqa: E402
from peerbench.untuned_records import derive, new_record, set_shares  # noqa: E402
from peerbench.untuned_report import device_meta, write_results  # noqa: E402
from peerbench.untuned_shapes import (  # noqa: E402
    build_cases,
    draw_hidden_sizes,
    shipped_hidden_sizes,
)
from peerbench.untuned_tables import format_report  # noqa: E402
from peerbench.untuned_tuning import copy_database, tune_bulk  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    excluded = shipped_hidden_sizes()
    hiddens = args.hidden or draw_hidden_sizes(args.seed, args.count, excluded)
    cases = build_cases(hiddens, args.dtypes, args.small_rows, bulk=not args.no_bulk)
    bulk = [c for c in cases if c.kind == "bulk"]
    print(f"hidden sizes (seed {args.seed}): {', '.join(map(str, hiddens))}; odd: "
          f"{', '.join(str(h) for h in hiddens if h % 8) or 'none'}; "
          f"{len(bulk)} bulk and {len(cases) - len(bulk)} small-row shapes; modes "
          f"{', '.join(args.modes)}"
          + (f" ({len([c for c in bulk if args.tune_odd or not c.odd])} bulk shapes tuned)"
             if "tuned" in args.modes else "")
          + f"; shipped hidden sizes left out: {sorted(excluded)}", flush=True)
    if args.plan:
        for case in cases:
            print(f"  {case.kind:5s} {case.label()}{'  odd' if case.odd else ''}")
        return 0

    start = time.perf_counter()
    deadline = start + args.budget_s if args.budget_s else math.inf

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - start:6.1f}s] {msg}", flush=True)

    faulthandler.enable()
    import torch

    if not torch.cuda.is_available():
        print("untuned.py needs a CUDA GPU (--plan shows the shapes without one)",
              file=sys.stderr)
        return 2
    torch.set_grad_enabled(False)
    turn_off_first_use_tuning()
    work = Path(tempfile.mkdtemp(prefix="autonorm-untuned-"))
    modes = Modes(work)
    meta = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "argv": sys.argv, "args": vars(args), "hidden_sizes": hiddens,
            "shipped_hidden_sizes": sorted(excluded), **device_meta(),
            "method": {"bulk": "single launches after a read flush of the L2, median "
                               "(peerbench.timing.flushed_ms); share over a read-flush copy of "
                               "x's bytes rounded to a MiB, the larger of the copies at start "
                               "and end",
                       "small": f"do_bench_cudagraph, rep {GRAPH_REP_MS} ms "
                                "(peerbench.timing.graph_ms)",
                       "ratio": "best peer's time over autonorm's (> 1: autonorm faster)",
                       "untuned_over_tuned": "tuned time over untuned (shipped mode) time",
                       "offset": f"fp32 rows of mean {OFFSET_MEAN:g} and spread "
                                 f"{OFFSET_SPREAD:g}: relative L2 error vs float64"}}
    tuning: list[dict] = []
    records: list[dict] = []
    try:
        tuned: set[tuple[str, int]] = set()
        if "tuned" in args.modes or args.tune_only:
            to_tune = [c for c in bulk if args.tune_odd or not c.odd]
            # Tuned straight into --tuned-db where given: each winner is committed as it is
            # found, so a run cut short keeps them and the next one tunes only the rest.
            target = args.tuned_db or modes.tuned_db
            log(f"tuning {len(to_tune)} bulk shapes, {args.tune_timeout:g} s of search "
                f"each, into {target} (shapes it holds a winner of are kept)")
            tuning = tune_bulk(to_tune, args, modes, deadline, log, target)
            meta["tuning_s"] = time.perf_counter() - start
            tuned = {(t["dtype"], t["hidden"]) for t in tuning if t["status"] != "skipped"}
            if args.tuned_db is not None and not args.tune_only:
                copy_database(args.tuned_db, modes.tuned_db)
            if args.tune_only:
                write_results(args.json, meta, tuning, records, None)
                return 0
        impls = Impls(list(PEER_NAMES), args.liger_wheel)
        meta["unavailable"] = impls.unavailable
        for name, why in impls.unavailable.items():
            log(f"{name} skipped: {why}")
        sizes = copy_sizes([c.shape() for c in bulk])
        copy_start = measure_copies(sizes)
        rates = copy_rates(copy_start)
        for i, case in enumerate(cases):
            if time.perf_counter() > deadline:
                rec = new_record(case)
                rec["status"] = "skipped"
            else:
                on = [m for m in args.modes if m != "tuned" or (
                    case.kind == "bulk" and (case.dtype, case.hidden) in tuned)]
                try:
                    rec = measure(case, args.seed * 7919 + i, on, modes, impls, log)
                except Exception as exc:  # noqa: BLE001 - e.g. out of memory making inputs
                    log(f"{case.label()}: failed: {short_error(exc)}")
                    rec = new_record(case)
                    rec.update(status="error", error=short_error(exc))
                    sync_quietly()
            records.append(rec)
            set_shares(records, rates)
            for r in records:
                derive(r, args.modes)
            write_results(args.json, meta, tuning, records, None)
        copy_end = measure_copies(sizes)
        meta["copy"] = used_copies(copy_start, copy_end)
        set_shares(records, copy_rates(copy_start, copy_end))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for r in records:
        derive(r, args.modes)
    figures = summarize(records, args.modes)
    meta["wall_s"] = time.perf_counter() - start
    write_results(args.json, meta, tuning, records, figures)
    skipped = sum(r["status"] == "skipped" for r in records)
    print()
    print(format_report(records, args.modes, args.dtypes, figures))
    print(f"\n{meta['device']}; torch {meta['torch']}; {len(records)} shapes"
          f"{f' ({skipped} skipped: --budget-s)' if skipped else ''}; "
          f"total {meta['wall_s']:.0f} s" + (f"; wrote {args.json}" if args.json else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
