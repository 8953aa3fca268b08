"""Lab only: where a wide-row kernel's time goes, from %globaltimer stamps inside the kernel.

The bulk winners at 32768-65536 run 84-89% of a same-bytes copy (NOTES 53); the fwd winner at
bf16 16384 92.8%. Three places could hold the missing 10%: the start (every block waits for its
first tile before anything is written), the steady state (a block waits on its next tile's
mbarrier: too few bytes in flight), the end (the rows do not divide by the blocks: 2048 rows over
132 blocks is 15.5 rounds, so half the SMs idle through the last one). Thread 0 of every block
stamps its entry, its SM, every tile's wait (before and after the mbarrier) and its exit into a
__device__ array; the product's rendered source gets the stamps by text insertion. Each kernel is
launched alone after a read of 4x the L2, 7 times; the run of median duration is analysed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from pathlib import Path

import cupy
import numpy as np

from autonorm import codegen, compiler
from autonorm.device import query_device
from autonorm.space import KernelConfig, Problem

W = 2 + 2 * 64 + 2  # entry, exit, (before, after) wait for 64 tiles, smid, tiles
MAX_BLOCKS = 4096
PLAN = [
    ("bfloat16", 32768, "t512v8r1-bulk-two_pass-c1-p0-s2"),
    ("float16", 32768, "t512v8r1-bulk-two_pass-c1-p0-s3"),
    ("bfloat16", 65536, "t512v8r1-bulk-two_pass-c2-p0-s2"),
    ("float32", 65536, "t512v4r1-bulk-two_pass-c4-p0-s2"),
    ("float32", 32768, "t512v4r1-bulk-two_pass-c2-p0-s2"),
    ("bfloat16", 16384, "t256v8r1-smem-two_pass-c1-p0-m64"),
]

PRELUDE = f"""
__device__ unsigned long long an_tl[{MAX_BLOCKS * W}];
__device__ unsigned long long an_tx[{MAX_BLOCKS * 128}];  // cluster exchange: (before, after) a tile
__device__ __forceinline__ unsigned long long an_now() {{
  unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t;
}}
"""
ENTRY = f"""
  if (threadIdx.x == 0) {{
    unsigned an_sm; asm volatile("mov.u32 %0, %%smid;" : "=r"(an_sm));
    an_tl[blockIdx.x * {W} + 0] = an_now();
    an_tl[blockIdx.x * {W} + {W - 2}] = an_sm;
  }}
"""
WAIT = "    mbar_wait(&bars[s], (unsigned)((k / S) & 1));\n"
XWAIT = "    mbar_wait(&xbar[xb], (unsigned)((k >> 1) & 1));\n"


def instrument(source: str) -> str:
    """Insert the stamps into a rendered kernel (bulk: per tile; every kernel: entry, exit)."""
    head, sep, rest = source.partition('extern "C" __global__')
    assert sep, "no kernel"
    src = head + PRELUDE + sep + rest
    marker = "  using namespace "
    i = src.index(marker)
    j = src.index("\n", i) + 1
    src = src[:j] + ENTRY + src[j:]
    if WAIT in src:
        stamped = (
            f"    if (tid == 0 && k < 64) an_tl[blockIdx.x * {W} + 2 + 2 * k] = an_now();\n"
            + WAIT
            + f"    if (tid == 0 && k < 64) {{ an_tl[blockIdx.x * {W} + 3 + 2 * k] = an_now();"
            f" an_tl[blockIdx.x * {W} + {W - 1}] = k + 1; }}\n"
        )
        src = src.replace(WAIT, stamped)
    if XWAIT in src:  # session 15: what a clustered kernel's exchange costs a tile
        src = src.replace(XWAIT, (
            "    if (tid == 0 && k < 64) an_tx[blockIdx.x * 128 + 2 * k] = an_now();\n" + XWAIT
            + "    if (tid == 0 && k < 64) an_tx[blockIdx.x * 128 + 2 * k + 1] = an_now();\n"))
    end = src.rstrip().rfind("}")
    exit_stamp = f"  if (threadIdx.x == 0) an_tl[blockIdx.x * {W} + 1] = an_now();\n"
    return src[:end] + exit_stamp + src[end:]


def run(dtype: str, hidden: int, label: str, flush, runs: int, tree: str = "") -> dict:
    info = query_device()
    problem = Problem(hidden, dtype, True, True)
    config = KernelConfig.from_label(label)
    if tree == "dyn":
        from dyn_lab import render_dyn

        rendered = render_dyn(config, problem, info.limits())
    elif tree:  # a template tree (session 13: templates_stagger)
        from tree_render import templates_from

        with templates_from(tree):
            rendered = codegen.render(config, problem, info.limits())
    else:
        rendered = codegen.render(config, problem, info.limits())
    rows = (1 << 26) // hidden
    np_dtype = {"bfloat16": None, "float16": cupy.float16, "float32": cupy.float32}[dtype]
    rng = cupy.random.default_rng(1)
    if np_dtype is None:  # bf16 as its bits: the top half of an fp32
        f = rng.standard_normal((rows, hidden), dtype=cupy.float32)
        x = (f.view(cupy.uint32) >> 16).astype(cupy.uint16)
        w = cupy.full(hidden, 0x3F80, cupy.uint16)
        b = cupy.zeros(hidden, cupy.uint16)
    else:
        x = rng.standard_normal((rows, hidden), dtype=cupy.float32).astype(np_dtype)
        w = cupy.ones(hidden, np_dtype)
        b = cupy.zeros(hidden, np_dtype)
    y = cupy.empty_like(x)
    out = {"dtype": dtype, "hidden": hidden, "label": label, "rows": rows, "tree": tree}
    for variant in ("plain", "stamped"):
        r = rendered if variant == "plain" else dataclasses.replace(
            rendered, source=instrument(rendered.source))
        k = compiler.compile_kernel(r)
        grid = k.grid(rows)
        out[f"{variant}_grid"] = grid
        out[f"{variant}_regs"] = k.attributes.get("num_regs")
        times = []
        stamps = []
        xstamps = []
        for _ in range(runs):
            flush()
            s, e = cupy.cuda.Event(), cupy.cuda.Event()
            s.record()
            k.launch_arrays(x, w, b, y, rows, 1e-5)
            e.record()
            e.synchronize()
            times.append(cupy.cuda.get_elapsed_time(s, e) * 1e3)
            if variant == "stamped":
                key = (r.source_hash, info.arch, compiler.cuda_version())
                mod = compiler._MODULES[key]  # noqa: SLF001
                g = mod.get_global("an_tl")
                arr = cupy.ndarray((MAX_BLOCKS * W,), cupy.uint64, g)
                stamps.append(arr[: grid * W].reshape(grid, W).get())
                arr[:] = 0
                gx = cupy.ndarray((MAX_BLOCKS * 128,), cupy.uint64, mod.get_global("an_tx"))
                xstamps.append(gx[: grid * 128].reshape(grid, 128).get())
                gx[:] = 0
        out[f"{variant}_us"] = times
        if variant == "stamped":
            pick = sorted(range(runs), key=lambda i: times[i])[runs // 2]
            out.update(analyse(stamps[pick], x.nbytes, grid, config))
            out.update(analyse_exchange(stamps[pick], xstamps[pick]))
    return out


COPY = f"""
__device__ unsigned long long an_tl[{MAX_BLOCKS * 2}];
__device__ __forceinline__ unsigned long long an_now() {{
  unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t;
}}
extern "C" __global__ void stamped_copy(const int4* __restrict__ src, int4* __restrict__ dst,
                                        long long n) {{
  if (threadIdx.x == 0) an_tl[blockIdx.x * 2] = an_now();
  const long long stride = (long long)gridDim.x * blockDim.x;
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {{
    const int4 a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
    dst[i] = a; dst[i + stride] = b; dst[i + 2 * stride] = c; dst[i + 3 * stride] = d;
  }}
  for (; i < n; i += stride) dst[i] = src[i];
  __syncthreads();
  if (threadIdx.x == 0) an_tl[blockIdx.x * 2 + 1] = an_now();
}}
"""


def run_copy(nbytes: int, flush, runs: int) -> dict:
    """A stamped grid-stride copy of nbytes / 2 bytes (nbytes moved), beside cudaMemcpy's time.

    The reference for the bulk kernels' event time against their span (first entry to last
    exit): how much of a launch lies outside the kernel's own stamps for a plain copy.
    """
    info = query_device()
    n16 = nbytes // 2 // 16
    src = cupy.ones(n16 * 4, cupy.int32)
    dst = cupy.empty_like(src)
    mod = cupy.RawModule(code=COPY)
    fn = mod.get_function("stamped_copy")
    g = mod.get_global("an_tl")
    arr = cupy.ndarray((MAX_BLOCKS * 2,), cupy.uint64, g)
    out = {}
    for blocks_per_sm in (2, 4):
        grid = info.sm_count * blocks_per_sm
        times, spans, tails = [], [], []
        for _ in range(runs):
            flush()
            s, e = cupy.cuda.Event(), cupy.cuda.Event()
            s.record()
            fn((grid,), (512,), (src, dst, cupy.int64(n16)))
            e.record()
            e.synchronize()
            times.append(cupy.cuda.get_elapsed_time(s, e) * 1e3)
            st = arr[: grid * 2].reshape(grid, 2).get().astype(np.int64)
            t0 = st[:, 0].min()
            spans.append((st[:, 1].max() - t0) / 1e3)
            tails.append((st[:, 1].max() - st[:, 1].min()) / 1e3)
            arr[:] = 0
        out[f"copy_{blocks_per_sm}x"] = {"event_us": statistics.median(times),
                                         "span_us": statistics.median(spans),
                                         "exit_spread_us": statistics.median(tails)}
    memcpy = []
    for _ in range(runs):
        flush()
        s, e = cupy.cuda.Event(), cupy.cuda.Event()
        s.record()
        dst.data.copy_from_device(src.data, src.nbytes)
        e.record()
        e.synchronize()
        memcpy.append(cupy.cuda.get_elapsed_time(s, e) * 1e3)
    out["memcpy_event_us"] = statistics.median(memcpy)
    return out


def analyse(st: np.ndarray, xbytes: int, grid: int, config: KernelConfig) -> dict:
    t0 = int(st[:, 0].min())
    us = lambda v: (v.astype(np.int64) - t0) / 1e3  # noqa: E731
    entry, exit_ = us(st[:, 0]), us(st[:, 1])
    res = {"span_us": float(exit_.max()),
           "entry_us": [float(np.median(entry)), float(entry.max())],
           "exit_us": [float(exit_.min()), float(np.median(exit_)), float(np.percentile(exit_, 90)),
                       float(exit_.max())]}
    ntiles = st[:, W - 1].astype(int)
    if ntiles.max() > 0:
        first = us(st[:, 3])
        waits, works, arrivals = [], [], []
        for blk in range(grid):
            n = min(int(ntiles[blk]), 64)
            before = us(st[blk, 2:2 + 2 * n:2])
            after = us(st[blk, 3:3 + 2 * n:2])
            arrivals += list(after)
            waits += list(after[1:] - before[1:])
            works += list(before[1:] - after[:-1])
        tile_bytes = xbytes / sum(int(t) for t in ntiles)
        hist = np.histogram(arrivals, bins=np.arange(0, res["span_us"] + 2, 2.0))[0]
        res.update({
            "tiles_per_block": [int(ntiles.min()), int(ntiles.max())],
            "first_arrival_us": [float(np.median(first)), float(first.max())],
            "steady_wait_us": [float(np.median(waits)), float(np.percentile(waits, 90))],
            "steady_work_us": [float(np.median(works)), float(np.percentile(works, 90))],
            "wait_share": float(sum(waits) / (sum(waits) + sum(works))),
            "arrived_gbps_per_2us": [float(h * tile_bytes / 2e-6 / 1e9) for h in hist],
        })
    # Blocks still running in each 2 us bin.
    edges = np.arange(0, res["span_us"] + 2, 2.0)
    res["running_per_2us"] = [int(((entry <= a) & (exit_ > a)).sum()) for a in edges]
    return res


def analyse_exchange(st: np.ndarray, sx: np.ndarray) -> dict:
    """Per tile of a clustered kernel: stats (tile landed -> exchange), the exchange's wait, and
    the rest (exchange done -> next tile's wait: normalize, store, refill)."""
    if not sx.any():
        return {}
    stats, xwait, rest = [], [], []
    for blk in range(st.shape[0]):
        n = min(int(st[blk, W - 1]), 64)
        landed = st[blk, 3:3 + 2 * n:2].astype(np.int64)
        nxt = st[blk, 2:2 + 2 * n:2].astype(np.int64)
        xb = sx[blk, 0:2 * n:2].astype(np.int64)
        xa = sx[blk, 1:2 * n:2].astype(np.int64)
        ok = (xb > 0) & (xa > 0)
        stats += list((xb - landed)[ok] / 1e3)
        xwait += list((xa - xb)[ok] / 1e3)
        rest += list((nxt[1:] - xa[:-1])[ok[:-1]] / 1e3)
    q = lambda v: [float(np.median(v)), float(np.percentile(v, 90)), float(np.sum(v) / st.shape[0])]  # noqa: E731
    return {"x_stats_us": q(stats), "x_wait_us": q(xwait), "x_rest_us": q(rest)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/out")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--tree", default="", help="'dyn' renders the bulk kernels from templates_dyn; "
                    "a directory renders them from that template tree")
    ap.add_argument("--only", default="", help="comma-separated hidden sizes to run")
    ap.add_argument("--configs", default="", help="dtype:hidden:label,... in place of PLAN")
    ap.add_argument("--copy", action="store_true",
                    help="also a stamped copy of the 2^26 bf16 elements' bytes (event vs span)")
    args = ap.parse_args()
    info = query_device()
    buf = cupy.ones(4 * info.l2_bytes // 4, cupy.float32)
    records = []
    if args.copy:
        rec = run_copy(2 * 2 * (1 << 26), lambda: buf.sum(), args.runs)
        print("copy (128 MiB read + 128 MiB written, as bf16 at 2^26 elements): " + json.dumps(rec), flush=True)
        records.append({"copy": rec})
    only = {int(h) for h in args.only.split(",") if h}
    plan = [(d, int(h), lab) for d, h, lab in (c.split(":") for c in args.configs.split(",") if c)]
    for dtype, hidden, label in plan or PLAN:
        if (only and hidden not in only) or (args.tree and "bulk" not in label):
            continue
        rec = run(dtype, hidden, label, lambda: buf.sum(), args.runs, args.tree)
        records.append(rec)
        print(f"\n{Path(args.tree).name if args.tree else 'prod'} {dtype} {hidden} {label} grid {rec['plain_grid']} regs {rec['plain_regs']}/"
              f"{rec['stamped_regs']}: plain {statistics.median(rec['plain_us']):.1f} us, stamped "
              f"{statistics.median(rec['stamped_us']):.1f} us, span {rec['span_us']:.1f}")
        for key in ("entry_us", "exit_us", "tiles_per_block", "first_arrival_us",
                    "steady_wait_us", "steady_work_us", "wait_share",
                    "x_stats_us", "x_wait_us", "x_rest_us"):
            if key in rec:
                v = rec[key]
                print(f"  {key:18s} " + (" ".join(f"{a:.2f}" for a in v) if isinstance(v, list)
                                         else f"{v:.3f}"))
        if "arrived_gbps_per_2us" in rec:
            print("  x arrival GB/s per 2 us: "
                  + " ".join(f"{g:.0f}" for g in rec["arrived_gbps_per_2us"]))
        print("  blocks running per 2 us: " + " ".join(str(n) for n in rec["running_per_2us"]))
        Path(args.out).mkdir(parents=True, exist_ok=True)
        tag = Path(args.tree).name if args.tree else ""
        json.dump(records, open(Path(args.out) / f"timeline_lab{tag}.json", "w"), indent=1)


if __name__ == "__main__":
    main()
