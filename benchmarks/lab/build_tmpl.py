"""Build the product template's kernels with load/store cache-hint variants (lab 2).

Takes each shape's top trials from the shipped DB, renders them with autonorm.codegen, patches
the x loads / y stores to the hinted forms and compiles cubins with nvcc here.
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from autonorm import codegen
from autonorm.space import H200, KernelConfig, Problem

HERE = Path(__file__).parent
OUT = HERE / "cubins"
SHAPES = [("bfloat16", h) for h in (768, 1024, 2048, 4096, 8192, 16384, 32768, 65536)] + [
    ("float32", h) for h in (1024, 4096, 16384, 32768, 65536)]
LOADS = {
    "ld0": "*reinterpret_cast<const Vec*>(p)",
    "ldcs": "__ldcs_vec(p)",
    "ldnc": "__ldnc_vec(p)",
}
HELPERS = r"""
__device__ __forceinline__ Vec __ldcs_vec(const T* p) {
  float4 f = __ldcs(reinterpret_cast<const float4*>(p)); return *reinterpret_cast<Vec*>(&f); }
__device__ __forceinline__ Vec __ldnc_vec(const T* p) {
  float4 f; asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.f32 {%0,%1,%2,%3}, [%4];"
    : "=f"(f.x), "=f"(f.y), "=f"(f.z), "=f"(f.w) : "l"(p));
  return *reinterpret_cast<Vec*>(&f); }
__device__ __forceinline__ void __stcs_vec(T* p, const Vec& v) {
  __stcs(reinterpret_cast<float4*>(p), *reinterpret_cast<const float4*>(&v)); }
"""


def top_configs(db: sqlite3.Connection, dtype: str, hidden: int, k: int = 5) -> list[dict]:
    rows = db.execute(
        "select config, max(share) s from trials where dtype=? and hidden=? and status='ok' "
        "group by config order by s desc limit ?", (dtype, hidden, k)).fetchall()
    return [json.loads(r[0]) for r in rows]


def variant(source: str, ld: str, st: str) -> str:
    marker = "__device__ __forceinline__ void store_vec"
    i = source.index(marker)
    j = source.index("\n", i)
    src = source[: j + 1] + HELPERS + (
        f"__device__ __forceinline__ Vec load_x(const T* p) {{ return {LOADS[ld]}; }}\n"
        "__device__ __forceinline__ void store_y(T* p, const Vec& v) { "
        + ("__stcs_vec(p, v);" if st == "stcs" else "*reinterpret_cast<Vec*>(p) = v;") + " }\n"
    ) + source[j + 1:]
    src = re.sub(r"load_vec\((xr|nx) ", r"load_x(\1 ", src)
    src = src.replace("store_vec(yr ", "store_y(yr ")
    return src


def build(item):
    name, src, meta = item
    path = OUT / f"{name}.cu"
    path.write_text(src)
    p = subprocess.run(["nvcc", "-cubin", "-arch=sm_90", "-std=c++17", "-O3", "-Xptxas", "-v",
                        str(path), "-o", str(OUT / f"{name}.cubin")], capture_output=True, text=True)
    path.unlink()
    spill = re.search(r"(\d+) bytes spill stores", p.stderr)
    return dict(meta, name=name, ok=p.returncode == 0, spill=int(spill.group(1)) if spill else 0,
                err=p.stderr[-300:] if p.returncode else "")


def main():
    OUT.mkdir(exist_ok=True)
    db = sqlite3.connect(HERE.parent.parent / "tuning_db" / "autonorm.db")
    items = []
    for dtype, hidden in SHAPES:
        problem = Problem(hidden, dtype)
        for cfg in top_configs(db, dtype, hidden):
            config = KernelConfig.from_dict(cfg)
            if config.vec * problem.itemsize != 16:
                continue
            rk = codegen.render(config, problem, H200)
            for ld in LOADS:
                for st in ("st0", "stcs"):
                    name = f"tm_{dtype}_{hidden}_{config.label()}_{ld}_{st}"
                    items.append((name, variant(rk.source, ld, st), dict(
                        kind="tmpl", dtype=dtype, N=hidden, config=cfg, ld=ld, st=st,
                        kernel=rk.name, threads=rk.launch.threads, smem=rk.launch.smem_bytes,
                        cluster=rk.launch.cluster, rows_per_block=rk.launch.rows_per_block,
                        blocks_per_sm=rk.launch.blocks_per_sm)))
    with ThreadPoolExecutor(3) as ex:
        res = list(ex.map(build, items))
    json.dump(res, open(OUT / "manifest_tmpl.json", "w"))
    print(len(res), "built", sum(not r["ok"] for r in res), "failed",
          sum(r["spill"] > 0 for r in res), "spilled")
    for r in res:
        if not r["ok"]:
            print(r["name"], r["err"])
            break


if __name__ == "__main__":
    main()
