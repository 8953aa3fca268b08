"""Verify and time a random sample of a family's configurations per shape, beside the default.

Run on a GPU machine, from the repository root::

    python benchmarks/explore.py --dtypes bf16 --hidden 4096,16384 --out results/
    python benchmarks/explore.py --focus cache=smem,vec=max --per-shape 32
    python benchmarks/explore.py --op layer_norm_backward --hidden 4096 --per-shape 8
    python benchmarks/explore.py --hidden 490,1001 --rows 256 --per-shape 40
    python benchmarks/explore.py --op rms_norm --residual --hidden 4099 --focus cache=bulk
    python benchmarks/explore.py --hidden 27656 --rows 1 --per-shape 0 \
        --configs t256v4r1-registers-two_pass-c8-p0,t512v4r1-registers-two_pass-c8-p0

Each shape is timed at ``--elements / hidden`` rows, or ``--rows`` at every hidden size, by the
tuner's own evaluator (compile, verify against float64, time: docs/timing.md). The script
prints the four fastest verified configurations and the first failures of each shape, and
writes every measurement to ``explore.json`` in ``--out``. It is a way to look at a shape's
space without a search; the tuner (``autonorm tune``) is the way to pick a winner.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
import time
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line (no GPU and no autonorm import needed for ``--help``)."""
    parser = argparse.ArgumentParser(
        description="Verify against float64 and time a random sample of a kernel family's "
                    "configurations per (dtype, hidden size), beside the untuned default, "
                    "with the tuner's evaluator. Prints the fastest per shape and writes "
                    "explore.json.",
    )
    parser.add_argument("--op", default="layer_norm",
                        help="kernel family, e.g. rms_norm or layer_norm_backward "
                             "(default: layer_norm)")
    parser.add_argument("--residual", action="store_true",
                        help="the norm after the fused residual add (LayerNorm and RMSNorm)")
    parser.add_argument("--no-bias", action="store_true",
                        help="LayerNorm without a bias (its backward then sums dweight only)")
    parser.add_argument("--dtypes", default="bf16,fp32",
                        help="comma-separated dtypes: bf16, fp16, fp32 (default: bf16,fp32)")
    parser.add_argument("--hidden", default="768,1024,2048,4096,8192,16384,32768,65536",
                        help="comma-separated hidden sizes (default: 768 ... 65536)")
    parser.add_argument("--per-shape", type=int, default=16,
                        help="random configurations sampled per shape (default: 16)")
    rows = parser.add_mutually_exclusive_group()
    rows.add_argument("--elements", type=int, default=1 << 26,
                      help="elements per launch; rows = elements // hidden (default: 2^26)")
    rows.add_argument("--rows", type=int, default=None,
                      help="rows per launch at every hidden size instead, e.g. 256 (few-row "
                           "latency)")
    parser.add_argument("--out", default="benchmarks/results",
                        help="folder for explore.json (default: benchmarks/results)")
    parser.add_argument("--configs", default="",
                        help="configurations to add to every shape where they are valid: "
                             "comma-separated labels (as printed, e.g. "
                             "t256v4r1-registers-two_pass-c8-p0) or a JSON list of "
                             "configuration dicts (the family's to_dict)")
    parser.add_argument("--focus", default="",
                        help="sample only configurations with these fields, e.g. "
                             "cache=registers,vec=max,cluster=1 (vec=max: the widest vector; "
                             "blocks_per_sm=persistent: any persistent grid)")
    parser.add_argument("--seed", type=int, default=None,
                        help="sampling seed (default: the hidden size, so runs repeat)")
    parser.add_argument("--top", type=int, default=4,
                        help="fastest candidates printed per shape (default 4; 0: all of them, "
                             "as explore.json holds them)")
    args = parser.parse_args(argv)
    if args.top < 0:
        parser.error(f"--top must be >= 0, got {args.top}")
    if args.rows is not None and args.rows < 1:
        parser.error(f"--rows must be >= 1, got {args.rows}")
    if args.elements < 1:
        parser.error(f"--elements must be >= 1, got {args.elements}")
    return args


def rows_of(args: argparse.Namespace, hidden: int) -> int:
    """Rows of a launch at ``hidden``: ``--rows``, else ``--elements // hidden`` (at least 1)."""
    return args.rows if args.rows is not None else max(1, args.elements // hidden)


def shape_lines(records: list[dict], top: int) -> list[str]:
    """The lines printed for one shape's records: the ``top`` fastest (all where ``top`` is 0),
    the default marked, then up to three failures."""
    ok = sorted((r for r in records if r["status"] == "ok"), key=lambda r: r["us"])
    lines = []
    for r in (ok[:top] if top else ok):
        mark = " (default)" if r["default"] else ""
        lines.append(f"    {r['share'] * 100:5.1f}%  {r['gbps']:7.0f} GB/s {r['us']:8.1f}us "
                     f"cv={r['cv']:.3f} err={r['max_rel_err']:.1e} {r['label']}{mark}")
    for r in [r for r in records if r["status"] != "ok"][:3]:
        lines.append(f"    FAIL {r['status']}: {r['label']}: {(r['error'] or '')[:200]}")
    return lines


def parse_configs(family, op: str, text: str) -> list:  # noqa: ANN001
    """The configurations ``--configs`` names: comma-separated labels, or a JSON list of dicts.

    Raises:
        ValueError: a label that is not one of the family's, a dict field it does not have,
            or text that is neither.

    """
    if not text.strip():
        return []
    if not text.lstrip().startswith("["):
        from peerbench.labels import parse_labels

        return parse_labels(family.config_type, text)
    known = {field.name for field in dataclasses.fields(family.config_type)}
    configs = []
    for data in json.loads(text):
        if not isinstance(data, dict):
            raise ValueError(f"expected labels or a JSON list of dicts, got {data!r} in the list")
        unknown = sorted(set(data) - known)
        if unknown:
            # config_from_dict ignores unknown keys: a misspelt field would run the default.
            raise ValueError(f"{op} has no field {', '.join(unknown)}")
        configs.append(family.config_from_dict(data))
    return configs


def main(argv: list[str] | None = None) -> int:
    """Explore every requested shape; return the process exit code."""
    args = parse_args(argv)
    from autonorm.ops import registry

    family = registry.get(args.op)
    if args.no_bias and "has_bias" not in {
            f.name for f in dataclasses.fields(family.problem(hidden=1024, dtype="float32"))}:
        print(f"explore: --no-bias: {args.op} has no bias", file=sys.stderr)
        return 2
    try:
        extra = parse_configs(family, args.op, args.configs)
    except ValueError as error:
        print(f"explore: --configs: {error}", file=sys.stderr)
        return 2
    from peerbench.gpu import require_gpu

    require_gpu("explore.py")
    from autonorm.dtypes import normalize_dtype
    from autonorm.runtime.compiler import CompilePool
    from autonorm.runtime.device import query_device
    from autonorm.tune.evaluator import GpuEvaluator

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    limits = query_device().limits()
    pool = CompilePool()
    records: list[dict] = []
    fields: dict = {"residual": True} if args.residual else {}
    if args.no_bias:
        fields["has_bias"] = False
    for dtype in args.dtypes.split(","):
        for hidden in map(int, args.hidden.split(",")):
            problem = family.problem(hidden=hidden, dtype=normalize_dtype(dtype), **fields)
            rows = rows_of(args, hidden)
            space = family.space(problem, limits)
            for item in filter(None, args.focus.split(",")):
                field, value = item.split("=")
                want = 16 // problem.itemsize if value == "max" else value
                space = [c for c in space if str(getattr(c, field)) == str(want)
                         or (field == "blocks_per_sm" and value == "persistent"
                             and c.blocks_per_sm > 0)]
            rng = random.Random(hidden if args.seed is None else args.seed)
            cands = [family.default(problem, limits, rows)]
            cands += rng.sample(space, min(args.per_shape, len(space)))
            cands += [c for c in extra if not family.check(c, problem, limits)]
            t0 = time.time()
            evaluator = GpuEvaluator(problem, rows, pool=pool)
            evaluator.prepare(cands)
            shape_records = []
            for index, config in enumerate(cands):
                outcome = evaluator.evaluate(config)
                rec = {"dtype": problem.dtype, "hidden": hidden, "rows": rows,
                       "config": config.to_dict(), "label": config.label(),
                       "default": index == 0,
                       "status": outcome.status, "error": outcome.error,
                       "max_rel_err": outcome.max_rel_err}
                if outcome.timing:
                    rec.update(us=outcome.timing.median_us, gbps=outcome.timing.gbps,
                               share=outcome.timing.share, cv=outcome.timing.cv)
                shape_records.append(rec)
            records += shape_records
            fails = sum(r["status"] != "ok" for r in shape_records)
            print(f"{problem.dtype:9s} {hidden:6d} copy={evaluator.copy_gbps:.0f}GB/s "
                  f"{time.time() - t0:5.1f}s fails={fails}", flush=True)
            print("\n".join(shape_lines(shape_records, args.top)), flush=True)
            (out / "explore.json").write_text(json.dumps(records, indent=1))
            del evaluator
    pool.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
