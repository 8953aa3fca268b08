"""Configurations of the lab bulk-copy kernel to build and time (benchmarks/lab/ln_bulk.cu)."""

from __future__ import annotations

import json
import sys

ITEM = {0: 4, 1: 2, 2: 2}
SMEM_MAX = 227 * 1024


def smem_bytes(dt: int, n: int, threads: int, r: int, s: int, c: int) -> int:
    return s * r * (n // c) * ITEM[dt] + s * 8 + (64 + 2 * r * 4) * 4


def valid(dt, n, threads, r, s, c, wreg):
    item = ITEM[dt]
    seg = n // c
    if n % c or (seg * item) % 16:
        return False
    v = 16 // item
    nvec = seg // v
    if threads % r:
        return False
    g = threads // r
    if g & (g - 1) or g > nvec * 2:
        return False
    iters = -(-nvec // g)
    if iters > 16 or (wreg and iters > 8):
        return False
    return smem_bytes(dt, n, threads, r, s, c) <= SMEM_MAX


def configs():
    out = []
    shapes = [(2, h) for h in (2048, 4096, 8192, 16384, 32768, 65536)]
    shapes += [(0, h) for h in (4096, 16384, 32768, 65536)]
    for dt, n in shapes:
        item = ITEM[dt]
        row = n * item
        cand = []
        for c in (1, 2, 4, 8):
            seg_bytes = row // c
            if c > 1 and seg_bytes < 8192:
                continue
            if c == 1 and row > 160 * 1024:
                pass
            for threads in (128, 256, 512, 1024):
                for r in (1, 2, 4, 8, 16, 32):
                    tile = r * seg_bytes
                    if tile < 4096 and r < 32 or tile > 64 * 1024 and r > 1:
                        continue
                    for s in (1, 2, 3, 4, 6, 8):
                        tot = s * tile
                        if s > 1 and tot < 24 * 1024:
                            continue
                        if tot > 200 * 1024 or (s == 1 and row // c < 64 * 1024):
                            continue
                        for wreg, rc in ((0, 0), (1, 0), (0, 1), (1, 1)):
                            if rc and -(-(n // c) // (16 // ITEM[dt])) // (threads // r) > 8:
                                continue
                            if valid(dt, n, threads, r, s, c, wreg):
                                cand.append(dict(DT=dt, N=n, THREADS=threads, R=r, S=s, C=c,
                                                 WREG=wreg, EVICT=0, STCS=1, RCACHE=rc))
        out.extend(cand)
    return out


if __name__ == "__main__":
    cs = configs()
    if len(sys.argv) > 1 and sys.argv[1] == "count":
        from collections import Counter
        print(len(cs), Counter((c["DT"], c["N"]) for c in cs))
    else:
        json.dump(cs, sys.stdout)
