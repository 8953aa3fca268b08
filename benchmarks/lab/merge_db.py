"""Merge winners (and their trials) from a tuning DB into the shipped one, keeping the better.

    python benchmarks/lab/merge_db.py SRC.db tuning_db/autonorm.db [--margin 0.01]

A key (device, version, dtype, hidden, affine, rows bucket) takes SRC's winner when the shipped
DB has none for it or SRC's measured share of copy bandwidth is higher by more than ``--margin``
(default 0.01 of copy bandwidth: session 4 took bf16 16384's winner on a 0.003 edge in the tuner,
and it read 79% against 85% in the peers run). Only same-version rows are merged: a winner tuned
on other templates is not comparable.
"""

from __future__ import annotations

import json
import sqlite3

KEY = ("device", "version", "dtype", "hidden", "has_weight", "has_bias", "rows_bucket")


def main(src: str, dst: str, margin: float = 0.01) -> None:
    con = sqlite3.connect(dst)
    con.execute("attach ? as s", (src,))
    taken = 0
    cols = [d[0] for d in con.execute("select * from s.winners limit 0").description]
    where = " and ".join(f"{k}=?" for k in KEY)
    for row in con.execute("select * from s.winners").fetchall():
        rec = dict(zip(cols, row, strict=True))
        old = con.execute(f"select metrics from main.winners where {where}",
                          [rec[k] for k in KEY]).fetchone()
        new_share = json.loads(rec["metrics"]).get("share", 0)
        old_share = json.loads(old[0]).get("share", 0) if old else -1
        label = f"{rec['dtype']} {rec['hidden']} rows {rec['rows_bucket']}"
        if old is None or new_share > old_share + margin:
            con.execute(f"delete from main.winners where {where}", [rec[k] for k in KEY])
            con.execute(f"insert into main.winners ({', '.join(cols)}) values "
                        f"({', '.join('?' for _ in cols)})", row)
            taken += 1
            print(f"{label}: {old_share:.3f} -> {new_share:.3f}")
        else:
            print(f"{label}: kept {old_share:.3f} (new {new_share:.3f})")
    tcols = [d[0] for d in con.execute("select * from s.trials limit 0").description if d[0] != "id"]
    con.execute(f"insert into main.trials ({', '.join(tcols)}) select {', '.join(tcols)} "
                "from s.trials")
    con.commit()
    con.execute("detach s")
    con.execute("vacuum")
    con.close()
    print(f"{taken} winners taken")


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--margin", type=float, default=0.01,
                    help="share of copy bandwidth a new winner must gain to replace one")
    args = ap.parse_args()
    main(args.src, args.dst, args.margin)
