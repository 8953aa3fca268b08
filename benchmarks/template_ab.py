"""Time the kernels two or more checkouts of autonorm render for the same configurations.

A change to a template, or to the code that renders it, is judged against the code before it
on the same GPU, in the same process, interleaved. Run on a GPU machine, from the repository
root, with each variant a checkout (a folder holding ``autonorm/``; ``.`` is this one)::

    python benchmarks/template_ab.py --variant before=../autonorm-main --variant after=. \\
        --op layer_norm_backward --dtypes bf16,fp32 --hidden 8192,16384,65536

    python benchmarks/template_ab.py --variant before=../main --variant after=. \\
        --op rms_norm --residual --hidden 4096 --rows 256 \\
        --configs t256v8r1-registers-two_pass-c1-p0-e

A child process imports autonorm from each checkout and renders every configuration for this
GPU's limits. This process compiles every source, verifies it against float64 with this
checkout's workload (the family's verification cases: a variant that computes something else
fails there), times each once, then re-times the kernels that passed interleaved, ``--rounds``
rounds, the median of rounds (the tuner's finals: docs/timing.md). The first variant is the
baseline: each other variant's speed over it is the baseline's time over its own. Only the
source may differ: a variant whose launch plan is not this checkout's is reported and not
timed. The configurations are ``--configs`` (labels), else each shape's default.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

# Run in the variant's checkout: the kernels of each configuration it renders, as JSON.
_RENDER = r"""
import dataclasses, json, sys
import autonorm
from autonorm.ops import registry
from autonorm.runtime.limits import DeviceLimits

request = json.load(sys.stdin)
family = registry.get(request["op"])
problem = family.problem(**request["problem"])
limits = DeviceLimits(**request["limits"])
kernels = []
for config in request["configs"]:
    try:
        rendered = family.render(family.config_from_dict(config), problem, limits)
    except Exception as exc:
        kernels.append({"error": f"{type(exc).__name__}: {exc}"})
        continue
    kernels.append({"name": rendered.name, "source": rendered.source,
                    "launch": dataclasses.asdict(rendered.launch)})
json.dump({"autonorm": autonorm.__file__, "kernels": kernels}, sys.stdout)
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line (no GPU and no autonorm import needed for ``--help``)."""
    parser = argparse.ArgumentParser(
        description="Verify against float64 and time, interleaved in one process, the kernels "
                    "that two or more checkouts of autonorm render for the same "
                    "configurations. The first variant is the baseline.")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=DIR",
                        help="a checkout to render with (a folder holding autonorm/); give two "
                             "or more, the baseline first")
    parser.add_argument("--op", default="layer_norm",
                        help="kernel family, e.g. rms_norm or layer_norm_backward "
                             "(default: layer_norm)")
    parser.add_argument("--residual", action="store_true",
                        help="the norm after the fused residual add")
    parser.add_argument("--no-bias", action="store_true", help="LayerNorm without a bias")
    parser.add_argument("--dtypes", default="bf16,fp32",
                        help="comma-separated dtypes: bf16, fp16, fp32 (default: bf16,fp32)")
    parser.add_argument("--hidden", default="4096,16384",
                        help="comma-separated hidden sizes (default: 4096,16384)")
    rows = parser.add_mutually_exclusive_group()
    rows.add_argument("--elements", type=int, default=1 << 26,
                      help="elements per launch; rows = elements // hidden (default: 2^26)")
    rows.add_argument("--rows", type=int, default=None, help="rows per launch at every size")
    parser.add_argument("--configs", default="",
                        help="comma-separated configuration labels (default: each shape's "
                             "default); a label a shape's rules refuse is left out there")
    parser.add_argument("--rounds", type=int, default=7,
                        help="interleaved timing rounds (default: 7)")
    parser.add_argument("--out", default="benchmarks/results",
                        help="folder for template_ab.json (default: benchmarks/results)")
    args = parser.parse_args(argv)
    args.variants = parse_variants(parser, args.variant)
    for name in ("elements", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.rows is not None and args.rows < 1:
        parser.error(f"--rows must be >= 1, got {args.rows}")
    return args


def parse_variants(parser: argparse.ArgumentParser, given: list[str]) -> dict[str, Path]:
    """Return ``--variant`` NAME=DIR pairs in order; exits with a one-line error if one is bad."""
    variants: dict[str, Path] = {}
    for item in given:
        name, sep, folder = item.partition("=")
        if not sep or not name or not folder:
            parser.error(f"--variant {item!r}: expected NAME=DIR")
        if name in variants:
            parser.error(f"--variant {item!r}: the name {name!r} is given twice")
        root = Path(folder).resolve()
        if not (root / "autonorm" / "__init__.py").is_file():
            parser.error(f"--variant {item!r}: {root} holds no autonorm/ package")
        variants[name] = root
    if len(variants) < 2:
        parser.error("give two --variant NAME=DIR or more (the baseline first)")
    return variants


def render_in(root: Path, op: str, problem: dict[str, Any], configs: list[dict[str, Any]],
              limits: dict[str, Any]) -> list[dict[str, Any]]:
    """Render ``configs`` with the autonorm of checkout ``root``, in a child process.

    Returns:
        One dict a configuration: ``name``, ``source`` and ``launch`` (the launch plan's
        fields), or ``error`` where that checkout refuses it.

    Raises:
        RuntimeError: the child failed, or imported autonorm from elsewhere than ``root``.

    """
    path = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    request = {"op": op, "problem": problem, "configs": configs, "limits": limits}
    child = subprocess.run([sys.executable, "-c", _RENDER], input=json.dumps(request),
                           capture_output=True, text=True, cwd=root, check=False,
                           env={**os.environ, "PYTHONPATH": path})
    if child.returncode:
        last = (child.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"rendering in {root} failed: {last}")
    reply = json.loads(child.stdout)
    imported = Path(reply["autonorm"]).resolve()
    if not imported.is_relative_to(root):
        raise RuntimeError(f"rendering in {root} imported autonorm from {imported.parent}")
    return reply["kernels"]


def speed_cells(times: dict[str, float | None], statuses: dict[str, str]) -> list[str]:
    """One table cell a variant: its time in us, and for the others its speed over the first."""
    names = list(times)
    base = times[names[0]]
    cells = []
    for name in names:
        us = times[name]
        if us is None:
            cells.append(statuses[name])
        elif name == names[0] or base is None:
            cells.append(f"{us:.2f}")
        else:
            cells.append(f"{us:.2f} (x{base / us:.3f})")
    return cells


def main(argv: list[str] | None = None) -> int:
    """Render, verify and time every shape's configurations in every variant."""
    args = parse_args(argv)
    from peerbench.gpu import require_gpu

    require_gpu("template_ab.py")
    from autonorm.dtypes import normalize_dtype
    from autonorm.ops import registry
    from autonorm.runtime.compiler import CompilePool
    from autonorm.runtime.device import query_device
    from autonorm.tune.evaluator import GpuEvaluator

    family = registry.get(args.op)
    limits = query_device().limits()
    fields: dict[str, Any] = {"residual": True} if args.residual else {}
    if args.no_bias:
        fields["has_bias"] = False
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pool = CompilePool()
    names = list(args.variants)
    print("| op | dtype | hidden | rows | config | " + " | ".join(f"{n} us" for n in names)
          + " |\n|" + "---|" * (5 + len(names)), flush=True)
    records: list[dict[str, Any]] = []
    for dtype in args.dtypes.split(","):
        for hidden in map(int, args.hidden.split(",")):
            problem = family.problem(hidden=hidden, dtype=normalize_dtype(dtype), **fields)
            rows = args.rows if args.rows is not None else max(1, args.elements // hidden)
            default = family.default(problem, limits, rows)
            configs = [type(default).from_label(label)
                       for label in filter(None, args.configs.split(","))] or [default]
            configs = [c for c in configs if not family.check(c, problem, limits)]
            if not configs:
                print(f"| {args.op} | {dtype} | {hidden} | {rows} | none of --configs is "
                      "valid here |", flush=True)
                continue
            ours = [family.render(c, problem, limits) for c in configs]
            kernels: dict[tuple[str, int], Any] = {}
            statuses: dict[tuple[str, int], str] = {}
            for name, root in args.variants.items():
                rendered = render_in(root, args.op, dataclasses.asdict(problem),
                                     [c.to_dict() for c in configs],
                                     dataclasses.asdict(limits))
                for i, (mine, theirs) in enumerate(zip(ours, rendered, strict=True)):
                    if "error" in theirs:
                        statuses[name, i] = "refused"
                    elif theirs["launch"] != dataclasses.asdict(mine.launch):
                        statuses[name, i] = "other plan"
                    else:
                        kernels[name, i] = dataclasses.replace(
                            mine, name=theirs["name"], source=theirs["source"])
            evaluator = GpuEvaluator(problem, rows, pool=pool, render=kernels.__getitem__)
            evaluator.prepare(list(kernels))
            passed = []
            for key in kernels:
                outcome = evaluator.evaluate(key)
                statuses[key] = outcome.status
                if outcome.status == "ok":
                    passed.append(key)
            timed = dict(zip(passed, evaluator.retime(passed, args.rounds), strict=True))
            for i, config in enumerate(configs):
                times = {n: timed[n, i].median_us if (n, i) in timed else None for n in names}
                cells = speed_cells(times, {n: statuses[n, i] for n in names})
                print(f"| {args.op} | {dtype} | {hidden} | {rows} | {config.label()} | "
                      + " | ".join(cells) + " |", flush=True)
                records.append({"op": args.op, "problem": dataclasses.asdict(problem),
                                "rows": rows, "config": config.to_dict(),
                                "label": config.label(),
                                "variants": {n: {"status": statuses[n, i], "us": times[n],
                                                 "share": timed[n, i].share
                                                 if (n, i) in timed else None}
                                             for n in names}})
            (out / "template_ab.json").write_text(json.dumps(records, indent=1))
            del evaluator
    pool.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
