"""The backward kernels' search space, its default and the search's seeds.

Pure logic: no CuPy, no GPU.
"""

from __future__ import annotations

import dataclasses
import itertools

from autonorm.errors import ConfigError
from autonorm.ops.norm_backward.config import ACCS, BLOCKS_PER_SM, CACHES, THREADS, VECS
from autonorm.ops.norm_backward.config import BackwardConfig as Config
from autonorm.ops.norm_backward.plan import MAX_ITERS, check, derive_plan, register_cap
from autonorm.ops.norm_backward.problem import BackwardProblem

# The default's preferences: rows held in registers, then sums in registers, shared memory, L2.
_ACC_RANK = {"registers": 0, "smem": 1, "global": 2}

# Threads per SM the default aims at: enough warps in flight to cover the loads' latency.
TARGET_THREADS_PER_SM = 1024

# The default keeps this headroom under the register cap of its occupancy: the estimate runs
# up to 19% under what ptxas allocates (nvcc 13.0, sm_90: 108 estimated, spilling at 128).
DEFAULT_REG_HEADROOM = 1.25

# The headroom the default's prefetching form needs (nvcc 13.0, sm_90, every default from 1 to
# 65536 elements: 126 estimated spilled at a cap of 128, 112 fit in 124).
PREFETCH_REG_HEADROOM = 1.1


def enumerate_space(problem: BackwardProblem, device: object) -> list[Config]:
    """Return every valid configuration for ``problem`` on ``device``, in a fixed order."""
    configs = []
    for threads, vec, cache, acc, blocks, prefetch in itertools.product(
        THREADS, VECS, CACHES, ACCS, BLOCKS_PER_SM, (False, True)
    ):
        config = Config(threads, vec, cache, acc, blocks, prefetch)
        if not check(config, problem, device):
            configs.append(config)
    return configs


def _score(config: Config, problem: BackwardProblem, device: object) -> tuple:
    """Sort key of the default (smaller is better)."""
    plan = derive_plan(config, problem)
    cap = register_cap(config, device)
    return (
        # Long loops only where nothing shorter runs (a reloaded row's loops may be long: rows
        # of odd sizes past 16K elements have nothing else).
        plan.iters > MAX_ITERS,
        plan.regs * DEFAULT_REG_HEADROOM > cap,
        config.cache != "registers",
        _ACC_RANK[config.acc],
        config.vec * problem.itemsize != 16,  # 16-byte accesses
        not plan.even,
        abs(config.threads * config.blocks_per_sm - TARGET_THREADS_PER_SM),
        plan.iters,
        config.threads,
    )


def default_config(problem: BackwardProblem, device: object, rows: int | None = None) -> Config:
    """Return the untuned default: the space's best configuration by :func:`_score`.

    Raises:
        autonorm.errors.ConfigError: no configuration can run the problem.
    """
    space = enumerate_space(problem, device)
    if not space:
        raise ConfigError(f"no backward kernel can run {problem.describe()}")
    base = min((c for c in space if not c.prefetch), key=lambda c: _score(c, problem, device))
    # The same kernel with two rows a block in flight, where its registers allow: x1.20-1.47
    # over it at bf16 and fp32 4096 (H200, docs/backward.md).
    prefetching = dataclasses.replace(base, prefetch=True)
    fits = derive_plan(prefetching, problem).regs * PREFETCH_REG_HEADROOM <= register_cap(
        base, device)
    return prefetching if fits and not check(prefetching, problem, device) else base


def seed_configs(
    problem: BackwardProblem, device: object, rows: int | None = None
) -> list[Config]:
    """Return the search's starting points: the default, then its neighbours in occupancy."""
    default = default_config(problem, device, rows)
    seeds = [default]
    for blocks in BLOCKS_PER_SM:
        other = dataclasses.replace(default, blocks_per_sm=blocks)
        if other != default and not check(other, problem, device):
            seeds.append(other)
    return seeds
