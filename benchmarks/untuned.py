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

Peers, timing and byte counts come from ``benchmarks/peers.py``: PyTorch eager ``F.layer_norm``,
``torch.compile`` of it and Liger-Kernel's LayerNorm (skipped, with the reason, where it does
not import). Every output is checked against float64 before it is timed (autonorm's written
into a buffer poisoned with NaN first); fp32 autonorm also on rows of mean 1000 and spread 0.1.
Bulk shapes are timed as single launches after an L2 flush (median), as a share of a copy of the
same bytes (docs/timing.md); small row counts by CUDA-graph replay (median of replays).
The tables, and the figures the shapes must reach, go to stdout; ``--json`` keeps every number.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import faulthandler
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import peers  # noqa: E402 - benchmarks/ is not a package: peers.py is found through HERE

ELEMENTS = 2**26
LOW, HIGH = 256, 65536
ODD_FROM = 1000  # the summary holds odd sizes from here up to the bandwidth target
MODES = ("shipped", "no-shipped", "tuned")
UNTUNED = "shipped"
PEER_NAMES = ("eager", "compile", "liger")
DTYPES = ("bf16", "fp16", "fp32")
SMALL_ROWS = (1, 64, 256)  # decode batches; --small-rows 1,16,64,256 adds one
EPS = 1e-5
OFFSET_MEAN, OFFSET_SPREAD, OFFSET_TOL = 1000.0, 0.1, 1e-6
GRAPH_REP_MS = 5  # each replay still averages hundreds of launches of a few microseconds
# The residue classes the odd sizes cycle through, hardest first: an odd hidden size starts
# 16-bit rows on 2-byte boundaries; 4 mod 8 and 2 mod 4 on 8- and 4-byte ones.
ODD_KINDS = ((2, 1), (8, 4), (4, 2))


# --------------------------------------------------------------------------------------------
# Shapes (no GPU)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One shape: a dtype and (rows, hidden), bulk (2^26 elements) or a small row count."""

    dtype: str
    hidden: int
    rows: int
    kind: str  # "bulk" or "small"

    @property
    def odd(self) -> bool:
        return self.hidden % 8 != 0

    def label(self) -> str:
        return f"{self.dtype} h={self.hidden} rows={self.rows}"

    def shape(self) -> peers.Shape:
        """The peers benchmark's shape: bytes, and the copy a bulk shape's share is taken of."""
        return peers.Shape("sweep" if self.kind == "bulk" else "latency", self.dtype,
                           self.hidden, self.rows)


def _draw_one(rng: random.Random, modulus: int, residue: int, lo: int, hi: int,
              taken: set[int]) -> int:
    for _ in range(100_000):
        v = int(2 ** rng.uniform(math.log2(lo), math.log2(hi + 1)))
        v = v // modulus * modulus + residue
        if lo <= v <= hi and v not in taken:
            return v
    raise ValueError(f"no free hidden size = {residue} mod {modulus} in [{lo}, {hi}]")


def draw_hidden_sizes(seed: int, count: int, excluded: set[int] | frozenset[int] = frozenset(),
                      low: int = LOW, high: int = HIGH) -> list[int]:
    """Draw ``count`` distinct hidden sizes in [low, high], log-uniformly, none in ``excluded``.

    A third of them (rounded) are not a multiple of 8; of those, all but a third (rounded down)
    are drawn from ODD_FROM up and the rest below it, cycling through ODD_KINDS. The rest are
    multiples of 8. The same seed and exclusions give the same sizes.

    Returns:
        The sizes, smallest first.

    """
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    rng = random.Random(seed)
    odd = round(count / 3)
    below = odd // 3
    specs = [(8, 0, low, high)] * (count - odd)
    for i in range(odd):
        modulus, residue = ODD_KINDS[i % len(ODD_KINDS)]
        lo, hi = (ODD_FROM, high) if i < odd - below else (low, ODD_FROM - 1)
        specs.append((modulus, residue, lo, hi))
    taken = set(excluded)
    sizes = []
    for modulus, residue, lo, hi in specs:
        v = _draw_one(rng, modulus, residue, lo, hi, taken)
        taken.add(v)
        sizes.append(v)
    return sorted(sizes)


def shipped_hidden_sizes() -> set[int]:
    """Return every hidden size the shipped tuning database holds a winner for (any GPU)."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from autonorm import settings
    from autonorm.store.db import TuningDB

    saved = os.environ.pop("AUTONORM_NO_SHIPPED_DB", None)  # the file, whatever the setting
    try:
        path = settings.shipped_db_path()
    finally:
        if saved is not None:
            os.environ["AUTONORM_NO_SHIPPED_DB"] = saved
    if path is None or not path.is_file():
        return set()
    with TuningDB(path, read_only=True, immutable=True, source="shipped") as db:
        return {w.key.hidden for w in db.winners()}


def build_cases(hiddens: list[int], dtypes: list[str], small_rows: list[int],
                elements: int = ELEMENTS, bulk: bool = True) -> list[Case]:
    """Bulk shapes first (every dtype, every size; none unless ``bulk``), then the small row
    counts, one at a time."""
    cases = [Case(d, h, max(1, elements // h), "bulk") for d in dtypes for h in hiddens
             if bulk]
    cases += [Case(d, h, r, "small") for r in small_rows for d in dtypes for h in hiddens]
    return cases


# --------------------------------------------------------------------------------------------
# Records, ratios and the summary (no GPU)
# --------------------------------------------------------------------------------------------


def autonorm_key(mode: str) -> str:
    """The record key of autonorm in a mode."""
    return f"autonorm:{mode}"


def new_record(case: Case) -> dict:
    shape = case.shape()
    return {"dtype": case.dtype, "hidden": case.hidden, "rows": case.rows, "kind": case.kind,
            "odd": case.odd, "bytes": shape.bytes, "copy_bytes": shape.copy_bytes,
            "status": "ok", "impls": {}}


def new_impl() -> dict:
    # status: ok | WRONG | error | unavailable | skipped (as peers.py's records)
    return {"status": "error", "us": None, "us_p20": None, "us_p80": None, "gbps": None,
            "share": None, "rel_err": None, "offset_err": None, "choice": None,
            "poisoned": None, "first_call_s": None, "error": None}


def set_shares(records: list[dict], rates: dict[tuple[int, str], float]) -> None:
    """Share of copy of each bulk measurement: its GB/s over the same bytes' read-flush copy."""
    for rec in records:
        copy = rates.get((rec["copy_bytes"], "read")) if rec["kind"] == "bulk" else None
        for r in rec["impls"].values():
            r["share"] = r["gbps"] / copy if (copy and r["gbps"]) else None


def derive(rec: dict, modes: list[str]) -> None:
    """Add the best peer, autonorm's speed over it per mode, and untuned over tuned speed."""
    ok = [(n, rec["impls"][n]) for n in PEER_NAMES if n in rec["impls"]]
    ok = [(n, r) for n, r in ok if r["status"] == "ok" and r["us"]]
    best = min(ok, key=lambda nr: nr[1]["us"], default=(None, None))
    rec["best_peer"] = best[0]
    rec["best_peer_us"] = best[1]["us"] if best[1] else None
    rec["best_peer_share"] = best[1]["share"] if best[1] else None
    rec["ratio"] = {}
    for mode in modes:
        r = rec["impls"].get(autonorm_key(mode))
        good = r is not None and r["status"] == "ok" and r["us"]
        rec["ratio"][mode] = rec["best_peer_us"] / r["us"] if good and best[1] else None
    untuned = rec["impls"].get(autonorm_key(UNTUNED))
    tuned = rec["impls"].get(autonorm_key("tuned"))
    both = all(r is not None and r["status"] == "ok" and r["us"] for r in (untuned, tuned))
    rec["untuned_over_tuned"] = tuned["us"] / untuned["us"] if both else None


def geo_mean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def _figure(name: str, pairs: list[tuple[str, float | None]], how: str, target: float,
            higher: bool) -> dict:
    """One summary figure over (shape label, value) pairs; None values count as missing."""
    have = [(w, v) for w, v in pairs if v is not None]
    value = where = None
    if have and how == "geo":
        value = geo_mean([v for _, v in have])
    elif have:
        worst = min(have, key=lambda wv: wv[1]) if higher else max(have, key=lambda wv: wv[1])
        where, value = worst
    missing = len(pairs) - len(have)
    met = None
    if pairs:
        met = value is not None and not missing and (value >= target if higher else
                                                     value <= target)
    return {"figure": name, "value": value, "target": target,
            "better": "higher" if higher else "lower", "n": len(pairs), "missing": missing,
            "where": where, "met": met}


def _where(rec: dict) -> str:
    return f"{rec['dtype']} h={rec['hidden']} rows={rec['rows']}"


def summarize(records: list[dict], modes: list[str]) -> list[dict]:
    """The figures of a run that say whether shapes nobody tuned are fast, with their targets.

    Each is a dict: figure, value, target, better (higher or lower), n (shapes), missing
    (shapes without a value: a failure, or a shape --budget-s skipped; a figure with any is not
    met), where (the worst shape) and met (None when the run has no shape for it).
    """
    bulk = [r for r in records if r["kind"] == "bulk"]
    small = [r for r in records if r["kind"] == "small"]
    even = [r for r in bulk if not r["odd"]]
    odd = [r for r in bulk if r["odd"] and r["hidden"] >= ODD_FROM]

    def ratios(recs: list[dict], mode: str) -> list[tuple[str, float | None]]:
        return [(_where(r), r["ratio"].get(mode)) for r in recs] if mode in modes else []

    def shares(recs: list[dict], mode: str) -> list[tuple[str, float | None]]:
        if mode not in modes:
            return []
        out = []
        for r in recs:
            share = r["impls"].get(autonorm_key(mode), {}).get("share")
            out.append((_where(r), None if share is None else share * 100))
        return out

    fp32 = [(_where(r), x.get("offset_err")) for r in records if r["dtype"] == "fp32"
            for k, x in r["impls"].items() if k.startswith("autonorm:")]
    tuned = [(_where(r), r["untuned_over_tuned"]) for r in even] if "tuned" in modes else []
    return [
        _figure("untuned, multiple of 8: worst speed over the best peer",
                ratios(even, UNTUNED), "worst", 1.0, True),
        _figure("untuned, multiple of 8: geo-mean speed over the best peer",
                ratios(even, UNTUNED), "geo", 1.15, True),
        _figure("untuned, multiple of 8: worst speed over tuned", tuned, "worst", 0.90, True),
        _figure(f"untuned, odd from {ODD_FROM}: worst % of copy", shares(odd, UNTUNED),
                "worst", 80.0, True),
        _figure(f"untuned, odd from {ODD_FROM}: worst speed over the best peer",
                ratios(odd, UNTUNED), "worst", 1.0, True),
        _figure("no shipped DB: geo-mean speed over the best peer", ratios(bulk, "no-shipped"),
                "geo", 1.0, True),
        _figure("rows 1-256, untuned: worst speed over the best peer (CUDA graph)",
                ratios(small, UNTUNED), "worst", 1.0, True),
        _figure("rows 1-256, no shipped DB: worst speed over the best peer (CUDA graph)",
                ratios(small, "no-shipped"), "worst", 1.0, True),
        _figure(f"fp32 rows of mean {OFFSET_MEAN:g}, spread {OFFSET_SPREAD:g}: worst error",
                fp32, "worst", OFFSET_TOL, False),
    ]


# --------------------------------------------------------------------------------------------
# Tables (no GPU)
# --------------------------------------------------------------------------------------------


def format_table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _num(v: float | None, spec: str, suffix: str = "") -> str:
    return "-" if v is None else format(v, spec) + suffix


def _cell(r: dict | None, bulk: bool) -> str:
    """autonorm's or a peer's figure: % of copy (bulk) or microseconds (small), or its status."""
    if r is None:
        return ""
    if r["status"] in ("error", "unavailable", "skipped"):
        return {"error": "error", "unavailable": "n/a", "skipped": "skipped"}[r["status"]]
    text = _num(r["share"] * 100 if bulk and r["share"] else (None if bulk else r["us"]), ".1f")
    return text + (" WRONG" if r["status"] == "WRONG" else "")


def format_dtype_tables(records: list[dict], dtype: str, modes: list[str]) -> list[str]:
    """The bulk table (% of copy) and the small-rows table (us) of one dtype, in markdown."""
    out = []
    for kind, title in (("bulk", f"{dtype}, rows = 2^26 / hidden: % of copy bandwidth"),
                        ("small", f"{dtype}, rows 1-256: microseconds by CUDA-graph replay")):
        recs = [r for r in records if r["dtype"] == dtype and r["kind"] == kind]
        if not recs:
            continue
        bulk = kind == "bulk"
        shown = [m for m in modes if bulk or m != "tuned"]
        unit = "%" if bulk else "us"
        headers = ["hidden", "rows", "odd"] + [f"{m} {unit}" for m in shown]
        headers += ["best peer", f"peer {unit}"] + [f"{m} / peer" for m in shown]
        if bulk and "tuned" in modes and UNTUNED in modes:
            headers.append("untuned / tuned")
        if dtype == "fp32":
            headers.append("offset err")
        rows = []
        for r in sorted(recs, key=lambda r: (r["rows"] if not bulk else 0, r["hidden"])):
            if r["status"] == "skipped":
                rows.append([str(r["hidden"]), str(r["rows"]), "yes" if r["odd"] else "",
                             "skipped"] + [""] * (len(headers) - 4))
                continue
            peer = r["best_peer"]
            peer_v = (r["best_peer_share"] * 100 if r["best_peer_share"] else None) if bulk \
                else r["best_peer_us"]
            row = [str(r["hidden"]), str(r["rows"]), "yes" if r["odd"] else ""]
            row += [_cell(r["impls"].get(autonorm_key(m)), bulk) for m in shown]
            row += [peer or "-", _num(peer_v, ".1f")]
            row += [_num(r["ratio"].get(m), ".2f", "x") for m in shown]
            if bulk and "tuned" in modes and UNTUNED in modes:
                row.append(_num(r["untuned_over_tuned"], ".2f"))
            if dtype == "fp32":
                errs = [x["offset_err"] for k, x in r["impls"].items()
                        if k.startswith("autonorm:") and x.get("offset_err") is not None]
                row.append(_num(max(errs) if errs else None, ".1e"))
            rows.append(row)
        out.append(f"### {title}\n\n" + format_table(headers, rows))
    return out


def format_summary(figures: list[dict]) -> str:
    rows = []
    for f in figures:
        lower = f["better"] == "lower"
        spec = ".1e" if lower else (".1f" if "% of copy" in f["figure"] else ".3f")
        met = {None: "n/a", True: "yes", False: "NO"}[f["met"]]
        target = ("<= " if lower else ">= ") + format(f["target"], ".0e" if lower else "g")
        extra = f" ({f['missing']} missing)" if f["missing"] else ""
        rows.append([f["figure"], _num(f["value"], spec), target, f"{f['n']}{extra}",
                     f["where"] or "", met])
    return format_table(["figure", "value", "target", "shapes", "worst at", "met"], rows)


def format_report(records: list[dict], modes: list[str], dtypes: list[str],
                  figures: list[dict]) -> str:
    parts = []
    for dtype in dtypes:
        parts += format_dtype_tables(records, dtype, modes)
    parts.append("### Summary (speed over the best peer > 1: autonorm faster)\n\n"
                 + format_summary(figures))
    return "\n\n".join(parts)


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"give positive integers, e.g. 1,16,64,256, not {text!r}")
    return values


def _choices(text: str, allowed: tuple[str, ...]) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in allowed]
    if bad or not items:
        raise argparse.ArgumentTypeError(
            f"{', '.join(bad) or '(empty)'} not in {', '.join(allowed)}")
    return items


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="untuned.py",
        description=(
            "Benchmark autonorm's LayerNorm forward at hidden sizes nobody tuned (drawn with a\n"
            "seed from 256 to 65,536, a third of them not a multiple of 8, none in the shipped\n"
            "database), at rows = 2^26 / hidden and at small row counts, in bf16, fp16 and\n"
            "fp32, against PyTorch eager, torch.compile and Liger in the same run: autonorm\n"
            "untuned (shipped database on), with no shipped database, and after tuning each\n"
            "shape. Prints a markdown table per dtype and the summary figures. Needs a CUDA GPU\n"
            "(--plan does not). Method: docs/timing.md."
        ),
        epilog=(
            "examples:\n"
            "  python benchmarks/untuned.py --json out/untuned.json  everything (~8 min, H200)\n"
            "  python benchmarks/untuned.py --count 3 --dtypes bf16 --small-rows 1\n"
            "  python benchmarks/untuned.py --modes shipped,no-shipped   no tuning phase\n"
            "  python benchmarks/untuned.py --plan                   the shapes, without a GPU"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the hidden sizes (default 0)")
    p.add_argument("--count", type=int, default=9, help="hidden sizes to draw (default 9)")
    p.add_argument("--hidden", type=lambda s: _int_list(s), default=None,
                   help="measure these hidden sizes instead of a draw (e.g. 490,3556)")
    p.add_argument("--dtypes", type=lambda s: _choices(s, DTYPES),
                   default=list(DTYPES), help="bf16,fp16,fp32 (default all three)")
    p.add_argument("--modes", type=lambda s: _choices(s, MODES), default=list(MODES),
                   help="autonorm's modes: shipped,no-shipped,tuned (default all three)")
    p.add_argument("--small-rows", type=lambda s: _int_list(s),
                   default=list(SMALL_ROWS), help="small row counts (1 to 256), timed by "
                   "CUDA-graph replay (default 1,64,256)")
    p.add_argument("--no-small", action="store_true", help="skip the small row counts")
    p.add_argument("--no-bulk", action="store_true",
                   help="skip the shapes of 2^26 elements (only the small row counts)")
    p.add_argument("--tune-timeout", type=float, default=4.0,
                   help="search seconds per bulk shape in the tuned mode (default 4)")
    p.add_argument("--tune-odd", action="store_true",
                   help="tune the odd bulk shapes too (default: only the multiples of 8)")
    p.add_argument("--tune-trials", type=int, default=40,
                   help="candidates measured at most per bulk shape (default 40)")
    p.add_argument("--tuned-db", type=Path, default=None,
                   help="the tuned mode's database: reused where it exists (no tuning), "
                        "else written after tuning, for a later run")
    p.add_argument("--tune-only", action="store_true",
                   help="tune (into --tuned-db) and exit without measuring")
    p.add_argument("--budget-s", type=float, default=540.0,
                   help="after this many seconds the shapes not yet measured are skipped "
                        "(default 540; 0: no limit)")
    p.add_argument("--json", type=Path, default=None,
                   help="write every number here (rewritten after each shape)")
    p.add_argument("--liger-wheel", default="auto",
                   help="as in peers.py: 'auto', a wheel path, or 'none'")
    p.add_argument("--plan", action="store_true",
                   help="print the drawn shapes and the work, then exit (no GPU needed)")
    args = p.parse_args(argv)
    if args.count < 1:
        p.error(f"--count: give at least 1, got {args.count}")
    if not (args.tune_timeout > 0 and args.tune_trials >= 1 and args.budget_s >= 0):
        p.error("--tune-timeout must be > 0, --tune-trials >= 1 and --budget-s >= 0")
    if args.no_small:
        args.small_rows = []
    if max(args.small_rows, default=1) > 256:
        p.error("--small-rows: give row counts from 1 to 256")
    if args.no_bulk and not args.small_rows:
        p.error("--no-bulk with --no-small leaves nothing to measure")
    return args


# --------------------------------------------------------------------------------------------
# On the GPU
# --------------------------------------------------------------------------------------------


def check_mode(mode: str, source: str) -> str | None:
    """Say why a lookup's source cannot be ``mode``'s pick (a mode that did not take), or None."""
    if mode == "tuned":
        ok = source.startswith("user")
    else:
        ok = not source.startswith("user") and not (mode == "no-shipped" and "shipped" in source)
    return None if ok else f"dispatch picked a {source!r} kernel in mode {mode}"


class Modes:
    """Switches autonorm's lookup between the modes, in this process."""

    def __init__(self, work: Path) -> None:
        self.no_user_db = work / "no-user.db"  # never created: no user database
        self.tuned_db = work / "tuned.db"

    def enter(self, mode: str) -> None:
        from autonorm import dispatch
        from autonorm.torch import clear_kernel_cache

        os.environ["AUTONORM_DB"] = str(self.tuned_db if mode == "tuned" else self.no_user_db)
        if mode == "no-shipped":
            os.environ["AUTONORM_NO_SHIPPED_DB"] = "1"
        else:
            os.environ.pop("AUTONORM_NO_SHIPPED_DB", None)
        dispatch.clear_cache()  # both caches hold kernels picked under the previous mode
        clear_kernel_cache()


def tune_bulk(cases: list[Case], args: argparse.Namespace, modes: Modes, deadline: float,
              log) -> list[dict]:
    """Tune each bulk shape into the temporary user database; one record per shape."""
    import optuna
    from tune_grid import WarmIsolated

    from autonorm.dtypes import normalize_dtype
    from autonorm.ops import registry
    from autonorm.runtime.device import query_device
    from autonorm.store.db import TuningDB
    from autonorm.tune.search import TuneSettings
    from autonorm.tune.session import tune_and_store

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    info = query_device()
    family = registry.get("layer_norm")
    # The grid tuner's finals (3 candidates, 3 rounds): a shorter tail after each search.
    settings = TuneSettings(n_trials=args.tune_trials, timeout_s=args.tune_timeout,
                            seed=args.seed, finals_top=3, finals_rounds=3)
    factory = WarmIsolated(info.limits())
    studies = modes.tuned_db.parent / "studies"
    studies.mkdir(exist_ok=True)
    out = []
    with TuningDB(modes.tuned_db) as db:
        for case in cases:
            rec = {"dtype": case.dtype, "hidden": case.hidden, "rows": case.rows,
                   "status": "skipped", "label": None, "share": None, "evaluated": None,
                   "seconds": None, "error": None}
            out.append(rec)
            if time.perf_counter() > deadline:
                continue
            started = time.perf_counter()
            try:
                problem = family.problem(hidden=case.hidden, dtype=normalize_dtype(case.dtype))
                tuned = tune_and_store(problem, case.rows, settings=settings, device=info,
                                       storage=str(studies), store=db,
                                       evaluator_factory=factory, quiet=True)
                rec.update(status="ok" if tuned.stored else "error", evaluated=tuned.evaluated,
                           label=tuned.config.label() if tuned.stored else None,
                           share=tuned.timing.share if tuned.stored else None,
                           error=None if tuned.stored else f"nothing verified {tuned.failures}")
            except Exception as exc:  # noqa: BLE001 - the shape's tuned mode reports it
                rec.update(status="error", error=peers._short(exc))
            rec["seconds"] = time.perf_counter() - started
            share = _num(rec["share"] and rec["share"] * 100, ".1f", "%")
            log(f"tuned {case.label()}: {rec['label'] or rec['error']} {share} "
                f"({rec['seconds']:.0f} s)")
    return out


def _inputs(case: Case, seed: int):
    import torch
    import torch.nn.functional as F  # noqa: N812

    dtype = peers._torch_dtype(case.dtype)
    torch.manual_seed(seed)
    x = torch.randn(case.rows, case.hidden, device="cuda", dtype=dtype)
    w = (1.0 + 0.1 * torch.randn(case.hidden, device="cuda")).to(dtype)
    b = (0.1 * torch.randn(case.hidden, device="cuda")).to(dtype)
    wd, bd = w.double(), b.double()
    ref = F.layer_norm(x.double(), (case.hidden,), wd, bd, EPS)
    offset = None
    if case.dtype == "fp32":
        xo = OFFSET_MEAN + OFFSET_SPREAD * torch.randn(case.rows, case.hidden, device="cuda")
        ro = F.layer_norm(xo.double(), (case.hidden,), wd, bd, EPS)
        offset = (xo, ro, ro.norm())
    return x, w, b, ref, ref.norm(), offset


def _time(fn, case: Case, r: dict) -> None:
    ms, p20, p80 = (peers.flushed_ms(fn, "read") if case.kind == "bulk"
                    else peers.graph_ms(fn, rep_ms=GRAPH_REP_MS))
    r.update(us=ms * 1e3, us_p20=p20 and p20 * 1e3, us_p80=p80 and p80 * 1e3,
             gbps=peers.gbps_of(case.shape().bytes, ms))


def _run_autonorm(case: Case, mode: str, modes: Modes, data: tuple) -> dict:
    """Verify (output poisoned first, and fp32 offset rows) and time autonorm in ``mode``."""
    import torch

    import autonorm.torch as ant
    from autonorm import dispatch
    from autonorm.dtypes import normalize_dtype
    from autonorm.ops.layer_norm.problem import Problem

    x, w, b, ref, ref_norm, offset = data
    r = new_impl()
    modes.enter(mode)
    poison = torch.full_like(x, float("nan"))
    ptr = poison.data_ptr()
    del poison  # the allocator hands this block to y, so rows the kernel skips stay NaN
    t0 = time.perf_counter()
    y = ant.layer_norm(x, w, b, EPS)
    torch.cuda.synchronize()
    r["first_call_s"] = time.perf_counter() - t0
    r["poisoned"] = y.data_ptr() == ptr
    r["rel_err"] = peers.rel_error(y, ref, ref_norm)
    del y
    choice = dispatch.chosen(Problem(case.hidden, normalize_dtype(case.dtype)), case.rows)
    source = choice.source if choice is not None else "?"
    r["choice"] = f"{source} {choice.config.label()}" if choice is not None else None
    if offset is not None:
        xo, ro, ro_norm = offset
        r["offset_err"] = peers.rel_error(ant.layer_norm(xo, w, b, EPS), ro, ro_norm)
    ok = math.isfinite(r["rel_err"]) and r["rel_err"] <= peers.TOL[case.dtype]
    r["status"] = "ok" if ok else "WRONG"
    wrong_mode = check_mode(mode, source)
    if wrong_mode:
        r.update(status="error", error=wrong_mode)
        return r
    _time(lambda: ant.layer_norm(x, w, b, EPS), case, r)
    return r


def _run_peer(case: Case, name: str, impls, data: tuple) -> dict:
    import torch

    x, w, b, ref, ref_norm, _ = data
    r = new_impl()
    try:
        fn, _ = impls.make(name, case.shape(), x, w, b, EPS)
    except peers.Unavailable as exc:
        r.update(status="unavailable", error=str(exc))
        return r
    t0 = time.perf_counter()
    y = fn()
    torch.cuda.synchronize()
    r["first_call_s"] = time.perf_counter() - t0
    r["rel_err"] = peers.rel_error(y, ref, ref_norm)
    del y
    ok = math.isfinite(r["rel_err"]) and r["rel_err"] <= peers.TOL[case.dtype]
    r["status"] = "ok" if ok else "WRONG"
    _time(fn, case, r)
    return r


def measure(case: Case, seed: int, modes_on: list[str], modes: Modes, impls, log) -> dict:
    """Every implementation at one shape: autonorm in each of ``modes_on``, then the peers."""
    import torch

    rec = new_record(case)
    data = _inputs(case, seed)
    runs = [(autonorm_key(m), m) for m in modes_on] + [(n, None) for n in PEER_NAMES]
    for key, mode in runs:
        try:
            if mode is not None:
                r = _run_autonorm(case, mode, modes, data)
            else:
                r = _run_peer(case, key, impls, data)
        except Exception as exc:  # noqa: BLE001 - one implementation's failure, not the run's
            r = new_impl()
            r["error"] = peers._short(exc)
            peers._sync_quietly()
        rec["impls"][key] = r
        what = r["error"] if r["status"] in ("error", "unavailable") else (
            f"{r['status']} {_num(r['us'], '.1f', ' us')} err {_num(r['rel_err'], '.1e')}"
            + (f" offset {r['offset_err']:.1e}" if r["offset_err"] is not None else "")
            + (f" [{r['choice']}]" if r["choice"] else ""))
        log(f"{case.label():28s} {key:20s} {what}")
    del data
    torch.cuda.empty_cache()
    return rec


def _device_meta() -> dict:
    import torch

    props = torch.cuda.get_device_properties(0)
    meta = {"device": props.name, "capability": f"{props.major}.{props.minor}",
            "sm_count": props.multi_processor_count, "torch": torch.__version__,
            "cuda_runtime": torch.version.cuda}
    for name in ("triton", "cupy", "autonorm"):
        try:
            meta[name] = getattr(__import__(name), "__version__", "?")
        except Exception as exc:  # noqa: BLE001
            meta[name] = f"unavailable: {peers._short(exc)}"
    return meta


def _write(path: Path | None, meta: dict, tuning: list[dict], records: list[dict],
           figures: list[dict] | None) -> None:
    if path is None:
        return
    data = {"meta": meta, "tuning": tuning, "cases": records, "summary": figures}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(peers._clean(data), indent=1, default=str))
    os.replace(tmp, path)


def _turn_off_first_use_tuning() -> None:
    """Untuned must stay untuned: no lookup may tune on the spot (docs/tuning.md)."""
    os.environ.pop("AUTONORM_TUNE_ON_FIRST_USE", None)
    import autonorm

    switch = getattr(autonorm, "tune_on_first_use", None)
    if switch is not None:
        switch(False)


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
    _turn_off_first_use_tuning()
    work = Path(tempfile.mkdtemp(prefix="autonorm-untuned-"))
    modes = Modes(work)
    meta = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "argv": sys.argv, "args": vars(args), "hidden_sizes": hiddens,
            "shipped_hidden_sizes": sorted(excluded), **_device_meta(),
            "method": {"bulk": "single launches after a read flush of the L2, median "
                               "(peers.flushed_ms); share over a read-flush copy of x's bytes "
                               "rounded to a MiB, the larger of the copies at start and end",
                       "small": f"do_bench_cudagraph, rep {GRAPH_REP_MS} ms (peers.graph_ms)",
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
            if args.tuned_db is not None and args.tuned_db.exists():
                shutil.copy(args.tuned_db, modes.tuned_db)
                log(f"tuned mode: winners from {args.tuned_db} (no tuning)")
                tuned = {(c.dtype, c.hidden) for c in to_tune}
            else:
                log(f"tuning {len(to_tune)} bulk shapes, {args.tune_timeout:g} s of search "
                    f"each, into {modes.tuned_db}")
                tuning = tune_bulk(to_tune, args, modes, deadline, log)
                meta["tuning_s"] = time.perf_counter() - start
                tuned = {(t["dtype"], t["hidden"]) for t in tuning if t["status"] != "skipped"}
                if args.tuned_db is not None:
                    shutil.copy(modes.tuned_db, args.tuned_db)
            if args.tune_only:
                _write(args.json, meta, tuning, records, None)
                return 0
        impls = peers.Impls(list(PEER_NAMES), args.liger_wheel)
        meta["unavailable"] = impls.unavailable
        for name, why in impls.unavailable.items():
            log(f"{name} skipped: {why}")
        sizes = peers.copy_sizes([c.shape() for c in bulk])
        copy_start = peers.measure_copies(sizes)
        rates = peers.copy_rates(copy_start)
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
                    log(f"{case.label()}: failed: {peers._short(exc)}")
                    rec = new_record(case)
                    rec.update(status="error", error=peers._short(exc))
                    peers._sync_quietly()
            records.append(rec)
            set_shares(records, rates)
            for r in records:
                derive(r, args.modes)
            _write(args.json, meta, tuning, records, None)
        copy_end = peers.measure_copies(sizes)
        meta["copy"] = peers.used_copies(copy_start, copy_end)
        set_shares(records, peers.copy_rates(copy_start, copy_end))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for r in records:
        derive(r, args.modes)
    figures = summarize(records, args.modes)
    meta["wall_s"] = time.perf_counter() - start
    _write(args.json, meta, tuning, records, figures)
    skipped = sum(r["status"] == "skipped" for r in records)
    print()
    print(format_report(records, args.modes, args.dtypes, figures))
    print(f"\n{meta['device']}; torch {meta['torch']}; {len(records)} shapes"
          f"{f' ({skipped} skipped: --budget-s)' if skipped else ''}; "
          f"total {meta['wall_s']:.0f} s" + (f"; wrote {args.json}" if args.json else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
