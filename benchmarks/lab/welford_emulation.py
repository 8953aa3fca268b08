"""Emulate the fp32 Welford kernel's arithmetic in float32 on the CPU, on the verifier's own cases.

Each thread of a row runs Welford over its vectors in the kernel's order, lanes merge by the
xor butterfly of ``reduce.welford`` (Chan's formula, fma-contracted as nvcc does by default),
warps merge in order, then cluster ranks in order; the row is normalized as the template does.
Inputs, affine and the error measure are the product's (``verify.make_cases``,
``verify.make_affine``, ``reference.measure_error``), so figures compare with the GPU tests'.

Two variants:

- ``shipped``: the template of 341d520c2938 (the shift is the row's first element for every
  thread; the row's mean is a float relative to it).
- ``rebased``: each thread starts from the row's first element and moves its shift to its
  running mean after each vector (TwoSum); partials carry (shift, mean) as an unevaluated sum
  re-based after each merge, and the row is normalized about the final shift. Predicted in
  NOTES.md 22, landed for fp32 in 6a9b9c9c284a and measured on the H200 (NOTES.md 26).

First the shipped variant is checked against the H200's figures for the same configurations
(tests of 2026-11-29, ``measured/h200_2026-11-29_s4/gpu_tests_a_before_welford_rule.log``); only
if it reproduces them is the rebased prediction worth anything.

    python benchmarks/lab/welford_emulation.py
"""

from __future__ import annotations

import numpy as np

from autonorm.reference import layer_norm_reference, measure_error
from autonorm.space import KernelConfig, Problem, derive_shape
from autonorm.verify import OUTLIER_CASE, make_affine, make_cases

F = np.float32


def fma(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 fused multiply-add: the float64 product of two floats is exact, one rounding."""
    return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(F)


def chan(n, m, m2, nb, mb, m2b):  # noqa: ANN001, ANN201
    """The template's chan_merge, element-wise (nb == 0 leaves the partial as it is)."""
    nn = F(n + nb)
    delta = F(mb - m)
    with np.errstate(invalid="ignore", divide="ignore"):
        fb = np.where(nb == 0, F(0), F(nb / nn)).astype(F)
    m_new = fma(delta, fb, m)
    m2_new = fma(F(F(delta * delta) * n), fb, F(m2 + m2b))
    keep = nb == 0
    return (np.where(keep, n, nn).astype(F), np.where(keep, m, m_new).astype(F),
            np.where(keep, m2, m2_new).astype(F))


def rebase(s, m):  # noqa: ANN001, ANN201
    """Fast2Sum: s + m as (S, e) with S = fl(s + m) and e the exact remainder."""
    big = np.abs(s) >= np.abs(m)
    hi, lo = np.where(big, s, m).astype(F), np.where(big, m, s).astype(F)
    total = F(hi + lo)
    return total, F(lo - F(total - hi))


def chan_rebased(n, s, m, m2, nb, sb, mb, m2b):  # noqa: ANN001, ANN201
    """Chan's merge of partials whose means are s + m and sb + mb, then re-based."""
    nn = F(n + nb)
    delta = F(F(sb - s) + F(mb - m))
    with np.errstate(invalid="ignore", divide="ignore"):
        fb = np.where(nb == 0, F(0), F(nb / nn)).astype(F)
    m_new = fma(delta, fb, m)
    m2_new = fma(F(F(delta * delta) * n), fb, F(m2 + m2b))
    s_new, m_new = rebase(s, m_new)
    keep = nb == 0
    pick = lambda a, b: np.where(keep, a, b).astype(F)  # noqa: E731
    n_, s_, m_, m2_ = pick(n, nn), pick(s, s_new), pick(m, m_new), pick(m2, m2_new)
    take = (n == 0) & (nb != 0)  # an empty partial takes the other as it is
    pick_b = lambda a, b: np.where(take, b, a).astype(F)  # noqa: E731
    return pick_b(n_, nb), pick_b(s_, sb), pick_b(m_, mb), pick_b(m2_, m2b)


def normalize(x: np.ndarray, w: np.ndarray, b: np.ndarray, config: KernelConfig,
              problem: Problem, variant: str) -> np.ndarray:
    """The kernel's output for rows ``x`` (float32), as the Welford template computes it."""
    shape = derive_shape(config, problem)
    g, v, iters, c = shape.threads_per_row, config.vec, shape.iters, config.cluster
    seg = problem.hidden // c
    rows = x.shape[0]
    row_shift = x[:, :1]
    parts = []
    for rank in range(c):
        xs = x[:, rank * seg:(rank + 1) * seg]
        nvec = seg // v
        lanes = np.arange(g)
        wn = np.zeros((rows, g), F)
        wm = np.zeros((rows, g), F)
        wm2 = np.zeros((rows, g), F)
        # every thread starts from the row's first element (its own first element did no better
        # in this emulation: 8e-8 to 1.42e-6 either way)
        shift = np.broadcast_to(row_shift, (rows, g)).astype(F).copy()
        for it in range(iters):
            j = it * g + lanes
            for k in range(v):
                live = j < nvec
                xf = xs[:, np.minimum(j, nvec - 1) * v + k]
                d = F(xf - shift)
                wn1 = F(wn + 1)
                delta = F(d - wm)
                wm1 = F(wm + F(delta / wn1))  # the kernel's __fdividef rounds within 2 ulp
                wm21 = fma(delta, F(d - wm1), wm2)
                wn, wm, wm2 = (np.where(live, a, b).astype(F)
                               for a, b in ((wn1, wn), (wm1, wm), (wm21, wm2)))
            if variant != "shipped":
                # after each vector the shift moves to the running mean: x - shift stays small
                # even when the thread's first element was an outlier
                shift, wm = rebase(shift, wm)
        s = shift
        # lanes: xor butterfly inside each warp (or sub-warp row)
        width = min(g, 32)
        o = width // 2
        while o:
            partner = lanes ^ o
            if variant == "shipped":  # noqa: SIM108
                wn, wm, wm2 = chan(wn, wm, wm2, wn[:, partner], wm[:, partner], wm2[:, partner])
            else:
                wn, s, wm, wm2 = chan_rebased(wn, s, wm, wm2, wn[:, partner], s[:, partner],
                                              wm[:, partner], wm2[:, partner])
            o //= 2
        # warps in order: lane 0 of each warp
        leaders = np.arange(0, g, 32) if g > 32 else np.array([0])
        acc = [a[:, leaders[0]] for a in (wn, s, wm, wm2)]
        for lead in leaders[1:]:
            other = [a[:, lead] for a in (wn, s, wm, wm2)]
            if variant == "shipped":
                n_, m_, m2_ = chan(acc[0], acc[2], acc[3], other[0], other[2], other[3])
                acc = [n_, acc[1], m_, m2_]
            else:
                acc = list(chan_rebased(*acc, *other))
        parts.append(acc)
    acc = parts[0]
    for other in parts[1:]:  # cluster ranks in order
        if variant == "shipped":
            n_, m_, m2_ = chan(acc[0], acc[2], acc[3], other[0], other[2], other[3])
            acc = [n_, acc[1], m_, m2_]
        else:
            acc = list(chan_rebased(*acc, *other))
    _, cshift, cmean, m2 = (a[:, None] for a in acc)
    var = F(m2 * F(1.0 / problem.hidden))
    rstd = F(F(1) / np.sqrt(F(var + F(1e-5))))
    y = F(F(F(x - cshift) - cmean) * rstd)
    return fma(y, w[None, :], b[None, :])


def rel_l2(label: str, hidden: int, variant: str, case_name: str = OUTLIER_CASE) -> float:
    """Relative L2 error of ``label`` on one verification case at ``hidden`` (fp32)."""
    problem = Problem(hidden, "float32")
    config = KernelConfig.from_label(label)
    case = next(c for c in make_cases(problem) if c.name == case_name)
    x = case.x.astype(F)
    w64, b64 = make_affine(problem, 1)
    w, b = w64.astype(F), b64.astype(F)
    y = normalize(x, w, b, config, problem, variant)
    ref = layer_norm_reference(x.astype(np.float64), w.astype(np.float64),
                               b.astype(np.float64), 1e-5)
    return measure_error(y.astype(np.float64), ref).rel_l2


# (hidden, label, rel_l2 measured on the H200 on the outlier case)
MEASURED = [
    (768, "t64v4r32-none-welford-c1-p4", 4.08e-6),
    (768, "t32v2r32-smem-welford-c1-p8", 7.34e-6),
    (1000, "t32v1r16-smem-welford-c1-p2", 6.77e-6),
    (4096, "t128v2r32-none-welford-c1-p1", 1.06e-5),
    (4096, "t128v4r1-smem-welford-c4-p0", 2.30e-6),
    (4096, "t1024v1r4-smem-welford-c1-p0", 2.15e-6),
    (4096, "t512v1r1-smem-welford-c1-p1", 3.35e-6),
    (4096, "t32v2r32-none-welford-c1-p2", 3.55e-5),
    (4096, "t256v4r1-registers-welford-c1-p0", 2.28e-6),
    (16384, "t256v1r1-none-welford-c1-p8", 4.43e-6),
    (16384, "t512v4r1-smem-welford-c2-p1", 5.42e-6),
    (16384, "t32v4r1-smem-welford-c2-p0", 4.83e-6),
    (65536, "t1024v4r1-none-welford-c1-p0", 1.80e-5),
    (65536, "t256v4r1-smem-welford-c2-p0", 1.01e-5),
    (65536, "t64v2r4-none-welford-c1-p4", 5.01e-5),
    (65536, "t128v4r1-none-welford-c4-p8", 8.67e-6),
]


OTHER_CASES = ("normal", "offset", "large", "tiny")


def main() -> None:
    print(f"{'hidden':>6} {'config':34s} {'H200':>9} {'shipped':>9} {'rebased':>9}  "
          f"other cases, shipped / rebased (worst)")
    for hidden, label, gpu in MEASURED:
        shipped = rel_l2(label, hidden, "shipped")
        rebased = rel_l2(label, hidden, "rebased")
        other_s = max(rel_l2(label, hidden, "shipped", c) for c in OTHER_CASES)
        other_r = max(rel_l2(label, hidden, "rebased", c) for c in OTHER_CASES)
        print(f"{hidden:6d} {label:34s} {gpu:9.2e} {shipped:9.2e} {rebased:9.2e}  "
              f"{other_s:9.2e} / {other_r:9.2e}", flush=True)


if __name__ == "__main__":
    main()
