"""Merge winners (and their trials) from a tuning DB into the shipped one, keeping the better.

    python benchmarks/lab/merge_db.py SRC.db tuning_db/autonorm.db

A key (device, version, dtype, hidden, affine, rows bucket) takes SRC's winner when the shipped
DB has none for it or SRC's measured share of copy bandwidth is higher. Only same-version rows
are merged: a winner tuned on other templates is not comparable.
"""

from __future__ import annotations

import json
import sqlite3
import sys

KEY = ("device", "version", "dtype", "hidden", "has_weight", "has_bias", "rows_bucket")


def main(src: str, dst: str) -> None:
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
        if new_share > old_share:
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
    main(*sys.argv[1:3])
