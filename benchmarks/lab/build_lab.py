"""Build the lab kernel's cubins here (nvcc, sm_90) and record ptxas registers and spills."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from lab_configs import smem_bytes

HERE = Path(__file__).parent
OUT = HERE / "cubins"


def name_of(c: dict) -> str:
    return "dt{DT}_n{N}_t{THREADS}_r{R}_s{S}_c{C}_w{WREG}_e{EVICT}_cs{STCS}_rc{RCACHE}".format(**c)


def minb(c: dict) -> int:
    sm = smem_bytes(c["DT"], c["N"], c["THREADS"], c["R"], c["S"], c["C"])
    return max(1, min(2048 // c["THREADS"], (228 * 1024) // (sm + 1024), 8))


def build(c: dict) -> dict:
    name = name_of(c)
    c = dict(c, MINB=minb(c))
    defs = [f"-D{k}={v}" for k, v in c.items()]
    cmd = ["nvcc", "-cubin", "-arch=sm_90", "-std=c++17", "-O3", "-Xptxas", "-v", *defs,
           str(HERE / "ln_bulk.cu"), "-o", str(OUT / f"{name}.cubin")]
    p = subprocess.run(cmd, capture_output=True, text=True)
    log = p.stderr
    regs = re.search(r"Used (\d+) registers", log)
    spill = re.search(r"(\d+) bytes spill stores", log)
    return dict(c, name=name, ok=p.returncode == 0, regs=int(regs.group(1)) if regs else None,
                spill=int(spill.group(1)) if spill else None,
                smem=smem_bytes(c["DT"], c["N"], c["THREADS"], c["R"], c["S"], c["C"]),
                err=log[-400:] if p.returncode else "")


if __name__ == "__main__":
    OUT.mkdir(exist_ok=True)
    sel = json.load(open(sys.argv[1]))
    import os

    with ThreadPoolExecutor(int(os.environ.get('JOBS', '4'))) as ex:
        res = list(ex.map(build, sel))
    json.dump(res, open(OUT / "manifest.json", "w"), indent=0)
    bad = [r for r in res if not r["ok"]]
    sp = [r for r in res if r["spill"]]
    print(len(res), "built;", len(bad), "failed;", len(sp), "spill")
    for r in bad[:3]:
        print(r["name"], r["err"])
