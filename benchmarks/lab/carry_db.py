"""Carry winners whose kernels a template change left the same into a re-tuned DB.

    python benchmarks/lab/carry_db.py OLD.db BASE_TEMPLATES NEW.db [--margin 0.01]
    python benchmarks/lab/carry_db.py OLD.db BASE_TEMPLATES          # OLD.db itself, in place

A winner is keyed by the templates' hash, so any template change retires every winner, even
those whose rendered source did not change (session 16: the fused 16-bit two-pass changed only
the fwd template's 16-bit kernels, yet it retired the 60-trial bulk and fp32 winners). For each
winner of OLD.db, tuned on BASE_TEMPLATES, this renders its config from BASE_TEMPLATES and from
the working tree's templates; where the two sources are identical but for comments (the same
kernel, so its measurement stands) it re-keys the winner to today's version and merges it into
NEW.db with merge_db's rule (taken only where it beats NEW.db's winner by more than
``--margin``). Without NEW.db it re-keys OLD.db itself and drops the winners whose kernel
changed, keeping its trials: the shapes left without a winner are then tuned and merged in
(``gpu_checks.sh search``).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sqlite3
import tempfile
from pathlib import Path

import merge_db
from tree_render import templates_from

from autonorm import codegen
from autonorm.space import H200, KernelConfig, Problem

# A string literal (kept whole, so a "//" inside one is not taken for a comment), or a //
# comment to the end of its line, or a /* */ one.
TOKEN = re.compile(r'"(?:\\.|[^"\\\n])*"|//[^\n]*|/\*.*?\*/', re.S)


def code_of(source: str) -> str:
    """``source`` without its comments and blank lines: what the compiler reads of it."""
    bare = TOKEN.sub(lambda m: m.group(0) if m.group(0).startswith('"') else "", source)
    lines = (line.rstrip() for line in bare.splitlines())
    return "\n".join(line for line in lines if line)


def same_kernel(config: KernelConfig, problem: Problem, base: str) -> bool:
    """Whether ``config`` renders the same code from ``base`` as from today's templates.

    Comments aside: every render already differs from the one measured in its version line
    (a comment naming the templates' hash), and a change to a comment alone (session 23: the
    bulk schedule's) must not retire the winners it leaves the same kernels.
    """
    new = codegen.render(config, problem, H200).source
    with templates_from(base):
        old = codegen.render(config, problem, H200).source
    return code_of(old) == code_of(new)


def carry(con: sqlite3.Connection, base: str) -> None:
    """Re-key ``con``'s winners that render the same kernel from ``base``; drop the others."""
    version = codegen.code_version()
    rows = con.execute("select rowid, dtype, hidden, has_weight, has_bias, rows_bucket, config "
                       "from winners").fetchall()
    kept = 0
    for rowid, dtype, hidden, w, b, bucket, cfg in rows:
        problem = Problem(hidden, dtype, has_weight=bool(w), has_bias=bool(b))
        config = KernelConfig.from_dict(json.loads(cfg))
        if same_kernel(config, problem, base):
            con.execute("update winners set version=? where rowid=?", (version, rowid))
            kept += 1
        else:
            con.execute("delete from winners where rowid=?", (rowid,))
            print(f"{dtype} {hidden} rows {bucket}: {config.label()} changed, not carried")
    con.commit()
    print(f"{kept} of {len(rows)} winners render the same kernel")


def main(old_db: str, base: str, new_db: str | None, margin: float) -> None:
    if new_db is None:
        con = sqlite3.connect(old_db)
        carry(con, base)
        con.close()
        return
    with tempfile.TemporaryDirectory() as tmp:
        carried = str(Path(tmp) / "carried.db")
        shutil.copy(old_db, carried)
        con = sqlite3.connect(carried)
        con.execute("delete from trials")
        carry(con, base)
        con.close()
        merge_db.main(carried, new_db, margin)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old_db")
    ap.add_argument("base")
    ap.add_argument("new_db", nargs="?", default=None)
    ap.add_argument("--margin", type=float, default=0.01)
    args = ap.parse_args()
    main(args.old_db, args.base, args.new_db, args.margin)
