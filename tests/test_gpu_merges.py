"""GPU: a broken cluster merge is rejected in every dtype, and every shipped winner passes.

The verifier's merge cases (autonorm.ops.layer_norm.cases: a step, a hot segment and a ramp
across each row) give a cluster's segments different means and spreads. Here each cluster
reduction of the kernels is broken by a patch of its rendered source, at the cluster sizes of the
shipped winners (2, 4 and 8), in fp32, fp16 and bf16: the bulk-copy kernel's Chan merge in the
shipped winners' own kernels, and the row kernel's cluster sums (two-pass) and Chan merge
(Welford). Each unpatched kernel must pass, each patched one must fail, on the merge cases.
Then every shipped winner, of every family, is verified on all its family's cases.

The patches are checked on the CPU as well (each must change its kernel's source exactly where
intended; a patch that matches nothing fails). Every kernel is compiled up front by a pool of
processes, so the GPU tests take seconds, not minutes.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Iterator

import pytest

from autonorm.ops.layer_norm.cases import Case, make_cases
from autonorm.ops.layer_norm.codegen import render
from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.problem import Problem
from autonorm.ops.layer_norm.rules import check
from autonorm.runtime.limits import H200

# A patch: (text of the rendered source, its replacement, how many times the text occurs).
Patch = tuple[str, str, int]

OWN_RANK_R = ("cluster.map_shared_rank(&cl_slot[cbuf * 4], r)",
              "cluster.map_shared_rank(&cl_slot[cbuf * 4], crank)")
CHAN_CALL = "chan_merge_shifted(wn, ws, wm, wm2, p[0], p[1], p[2], p[3]);"

# The bulk-copy kernel merges each segment's (shift, mean, M2) with Chan's formula, rank by rank.
BULK_BREAKS: dict[str, list[Patch]] = {
    # The merged mean stays rank 0's segment mean.
    "mean-merge": [("      m_acc = m_acc + delta * fb;\n", "      (void)fb;\n", 1)],
    # M2 merged without Chan's between-segment term.
    "no-between": [("m2_acc = m2_acc + m2b + delta * delta * n_acc * fb;",
                    "m2_acc = m2_acc + m2b;", 1)],
    # Each block normalizes about its own segment's mean (the merged variance).
    "own-mean": [("cmean = m_acc - (cshift - s0);", "(void)m_acc;", 1)],
}

# The fp32 row kernel, two-pass: pass 1's sum s1, then pass 2's (s2, s3) through one exchange;
# s3 corrects the mean, so breaking pass 1's exchange alone would be corrected away.
ROW_FP32_BREAKS: dict[str, list[Patch]] = {
    # Every exchange reads the block's own slot: each block normalizes with its own statistics.
    "own-stats": [(*OWN_RANK_R, 2)],
    # The mean's correction s3 is rank 0's alone (times the cluster size).
    "mean-merge": [("      s3 += p[1];\n",
                    "      s3 += cluster.map_shared_rank(&cl_slot[cbuf * 4], 0)[1];\n", 1)],
}

# The 16-bit row kernel, two-pass fused (plan.fuses_passes): (s1, s2) through one exchange, and
# s2 again where its second pass runs.
ROW_16_BREAKS: dict[str, list[Patch]] = {
    "own-stats": [(*OWN_RANK_R, 2)],
    # The mean's sum s1 is rank 0's alone (times the cluster size).
    "mean-merge": [("      s1 += p[0];\n",
                    "      s1 += cluster.map_shared_rank(&cl_slot[cbuf * 4], 0)[0];\n", 1)],
}

# The row kernel, Welford: the blocks' (count, shift, mean, M2) Chan-merged in rank order.
ROW_WELFORD_BREAKS: dict[str, list[Patch]] = {
    "own-stats": [("cluster.map_shared_rank(&cl_slot[cbuf * 4], 0)",
                   "cluster.map_shared_rank(&cl_slot[cbuf * 4], crank)", 1), (*OWN_RANK_R, 1)],
    # The cluster's merge without the mean's update: rank 0's mean stays.
    "mean-merge": [(CHAN_CALL,
                    "{ const float nn = wn + p[0]; const float delta = (p[1] - ws) + (p[2] - wm);"
                    " wm2 = wm2 + p[3] + delta * delta * wn * (p[0] / nn); wn = nn; }", 1)],
    # The cluster's merge without Chan's between-segment term.
    "no-between": [(CHAN_CALL,
                    "{ const float nn = wn + p[0]; const float delta = (p[1] - ws) + (p[2] - wm);"
                    " wm = wm + delta * (p[0] / nn); wm2 = wm2 + p[3]; wn = nn;"
                    " rebase(ws, wm); }", 1)],
}

_V = {"float32": 4, "float16": 8, "bfloat16": 8}


def _kernels() -> list[tuple[str, int, str, dict[str, list[Patch]]]]:
    """(dtype, hidden, config label, breaks) of every kernel whose merge is broken here."""
    kernels = [
        # The bulk-copy kernels of the shipped winners with a cluster, and a cluster of 2 in the
        # 16-bit dtypes, which no shipped winner has.
        ("bfloat16", 16384, "t256v8r1-bulk-two_pass-c2-p0-s2", BULK_BREAKS),
        ("bfloat16", 65536, "t256v8r1-bulk-two_pass-c4-p0-s3-k", BULK_BREAKS),
        ("bfloat16", 16384, "t128v8r1-bulk-two_pass-c8-p0-s1", BULK_BREAKS),
        ("float16", 16384, "t256v8r1-bulk-two_pass-c2-p0-s2", BULK_BREAKS),
        ("float16", 65536, "t256v8r1-bulk-two_pass-c4-p0-s2-k", BULK_BREAKS),
        ("float16", 16384, "t128v8r1-bulk-two_pass-c8-p0-s1", BULK_BREAKS),
        ("float32", 16384, "t256v4r1-bulk-two_pass-c2-p0-s2", BULK_BREAKS),
        ("float32", 32768, "t256v4r1-bulk-two_pass-c4-p0-s3-k", BULK_BREAKS),
        ("float32", 16384, "t128v4r1-bulk-two_pass-c8-p0-s1", BULK_BREAKS),
        ("float32", 65536, "t256v4r1-bulk-two_pass-c8-p0-s2-k", BULK_BREAKS),
    ]
    for dtype, v in _V.items():
        for cluster in (2, 4, 8):
            two_pass = ROW_FP32_BREAKS if dtype == "float32" else ROW_16_BREAKS
            # fp32 over 8 blocks of 256 threads holds two vectors a thread and fuses its sums
            # (plan.fuses_passes: one exchange, as 16-bit's); 128 threads keep the two-pass
            # exchanges these patches break.
            threads = 128 if dtype == "float32" and cluster == 8 else 256
            kernels.append((dtype, 16384,
                            f"t{threads}v{v}r1-registers-two_pass-c{cluster}-p0", two_pass))
            kernels.append(
                (dtype, 16384, f"t256v{v}r1-none-welford-c{cluster}-p0", ROW_WELFORD_BREAKS))
    return kernels


KERNELS = _kernels()
KERNEL_IDS = [f"{dtype}-{hidden}-{label}" for dtype, hidden, label, _ in KERNELS]


def patched(source: str, patches: list[Patch]) -> str:
    """Apply ``patches`` to ``source``; each text must occur exactly as often as stated."""
    out = source
    for old, new, count in patches:
        found = out.count(old)
        assert found == count, f"{old!r} occurs {found} times, expected {count}"
        out = out.replace(old, new)
    assert out != source, "the patch changed nothing"
    return out


def _is_merge_case(name: str) -> bool:
    return name.startswith(("step-", "hot-", "ramp"))


# --------------------------------------------------------------------------- CPU: the patches


@pytest.mark.parametrize(("dtype", "hidden", "label", "breaks"), KERNELS, ids=KERNEL_IDS)
def test_every_patch_breaks_its_kernel_where_intended(dtype, hidden, label, breaks):
    """Guards the GPU tests below: each config is valid and each patch applies exactly."""
    config = KernelConfig.from_label(label)
    problem = Problem(hidden, dtype)
    assert config.label() == label
    assert not check(config, problem, H200), check(config, problem, H200)
    source = render(config, problem, H200).source
    for fault, patches in breaks.items():
        out = patched(source, patches)
        for old, new, _ in patches:
            assert new in out and (old not in out or old in new), fault


def test_the_broken_kernels_cover_every_cluster_split_in_every_dtype():
    covered = {(dtype, KernelConfig.from_label(label).cache == "bulk",
                KernelConfig.from_label(label).cluster) for dtype, _, label, _ in KERNELS}
    for dtype in _V:
        for bulk in (True, False):
            assert {c for d, b, c in covered if (d, b) == (dtype, bulk)} == {2, 4, 8}


# --------------------------------------------------------------------------- GPU


@functools.cache
def _cases(problem: Problem) -> tuple[Case, ...]:
    return tuple(make_cases(problem))


def _shipped() -> list:
    from autonorm.store.db import TuningDB

    db = TuningDB.open_shipped()
    assert db is not None, "no shipped tuning database"
    try:
        return list(db.winners())
    finally:
        db.close()


@pytest.fixture(scope="module")
def compiled() -> Iterator[Callable]:
    """Compile every kernel of this module in a pool up front; return ``compile(rendered)``."""
    from autonorm.ops import registry
    from autonorm.runtime import compiler
    from autonorm.runtime.device import query_device

    info = query_device()
    limits = info.limits()
    sources = []
    for dtype, hidden, label, breaks in KERNELS:
        rendered = render(KernelConfig.from_label(label), Problem(hidden, dtype), limits)
        sources.append(rendered)
        for patches in breaks.values():
            sources.append(_replace(rendered, patched(rendered.source, patches)))
    for winner in _shipped():
        family = registry.get(winner.key.op)
        problem = family.problem(**json.loads(winner.key.problem))
        sources.append(family.render(family.config_from_dict(winner.config), problem, limits))
    pool = compiler.CompilePool(workers=max(1, min(16, (os.cpu_count() or 2) - 1)))
    for rendered in sources:
        pool.submit(rendered, info.arch)

    def compile_one(rendered):  # noqa: ANN001, ANN202
        error = pool.wait(rendered)
        assert error is None, f"{rendered.config.label()} does not compile:\n{error[-3000:]}"
        return compiler.compile_kernel(rendered)

    try:
        yield compile_one
    finally:
        pool.close()


def _replace(rendered, source: str):  # noqa: ANN001, ANN202
    import dataclasses

    return dataclasses.replace(rendered, source=source)


@pytest.mark.gpu
@pytest.mark.parametrize(("dtype", "hidden", "label", "breaks"), KERNELS, ids=KERNEL_IDS)
def test_a_broken_merge_is_rejected(compiled, dtype, hidden, label, breaks):
    from autonorm.ops.layer_norm.verify import verify
    from autonorm.runtime.device import query_device

    problem = Problem(hidden, dtype)
    rendered = render(KernelConfig.from_label(label), problem, query_device().limits())
    cases = _cases(problem)
    good = verify(compiled(rendered), problem, cases=cases)
    assert good.ok, f"{label} unpatched: {good.summary()}"
    passed = []
    for fault, patches in breaks.items():
        bad = verify(compiled(_replace(rendered, patched(rendered.source, patches))), problem,
                     cases=cases)
        merge_failures = [f for f in bad.failures if _is_merge_case(f.split(":")[0])]
        worst = max((e.rel_l2, name) for name, e in bad.errors.items() if _is_merge_case(name))
        print(f"\n{dtype} {hidden} {label} {fault}: {len(bad.failures)} cases failed, "
              f"worst merge case {worst[1]} rel_l2 {worst[0]:.2e}")
        if bad.ok or not merge_failures:
            passed.append(f"{fault}: {bad.summary()}")
    assert not passed, f"{label}: broken merges that the merge cases did not reject: {passed}"


@pytest.mark.gpu
def test_every_shipped_winner_passes_every_case(compiled):
    # Every family's winners, each verified as the tuner verifies a candidate: by its family's
    # workload (the forward norms on the cases above, merge cases among them; the backwards on
    # theirs). One row of timed input: verification runs on the cases' own rows.
    from autonorm.ops import registry
    from autonorm.runtime.device import query_device

    limits = query_device().limits()
    winners = _shipped()
    assert winners, "the shipped database has no winners"
    ops = {w.key.op for w in winners}
    assert {"layer_norm", "layer_norm_backward"} <= ops, ops
    failures = []
    worst: dict[str, tuple[float, str]] = {}
    for winner in winners:
        family = registry.get(winner.key.op)
        problem = family.problem(**json.loads(winner.key.problem))
        config = family.config_from_dict(winner.config)
        kernel = compiled(family.render(config, problem, limits))
        result = family.workload(problem, 1).verify(kernel)
        name = (f"{winner.key.op} {problem.describe()} rows<={winner.key.rows_bucket} "
                f"{config.label()}")
        if not result.ok:
            failures.append(f"{name}: {result.summary()}")
        assert result.errors, f"{name}: no case was checked"
        merges = [e.rel_l2 for case, e in result.errors.items() if _is_merge_case(case)]
        if merges:
            key = f"{winner.key.op} {problem.dtype}"
            worst[key] = max(worst.get(key, (0.0, "")), (max(merges), name))
    print(f"\n{len(winners)} shipped winners of {len(ops)} families verified on every case")
    for key, (err, name) in sorted(worst.items()):
        print(f"  {key}: worst merge-case rel_l2 {err:.2e} ({name})")
    assert not failures, "\n".join(failures)
