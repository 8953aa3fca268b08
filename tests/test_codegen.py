"""Tests of LayerNorm kernel rendering (autonorm.ops.layer_norm.codegen): pure and deterministic."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import jinja2
import jinja2.meta
import numpy as np
import pytest

import autonorm
from autonorm.codegen.environment import SHARED_TEMPLATES
from autonorm.codegen.kernel import LaunchPlan
from autonorm.dtypes import DTYPES
from autonorm.errors import ConfigError
from autonorm.numerics import to_float64
from autonorm.ops.layer_norm.codegen import (
    BULK_TEMPLATE,
    KERNEL_TEMPLATES,
    TEMPLATE,
    TEMPLATE_DIR,
    code_version,
    kernel_name,
    render,
    template_environment,
    templates_hash,
)
from autonorm.ops.layer_norm.config import KernelConfig
from autonorm.ops.layer_norm.plan import (
    bulk_occupancy,
    derive_plan,
    fills_async,
    fuses_passes,
    holds_fp32_row,
    min_blocks_per_sm,
    prefetches,
    smem_bytes,
    unrolls_store,
)
from autonorm.ops.layer_norm.problem import Problem
from autonorm.ops.layer_norm.space import enumerate_space
from autonorm.runtime.limits import H200, DeviceLimits

ROOT = Path(__file__).resolve().parents[1]
HIDDEN_SIZES = (1, 7, 768, 1000, 4096, 16384, 65536)
SEED = 20261129


def sampled_sweep(n: int = 200, seed: int = SEED) -> list[tuple[KernelConfig, Problem]]:
    """``n`` random valid (config, problem) pairs across dtypes and hidden sizes."""
    rng = random.Random(seed)
    spaces = {
        (h, dt): enumerate_space(Problem(h, dt)) for h in HIDDEN_SIZES for dt in DTYPES
    }
    keys = sorted(spaces)
    out = []
    for i in range(n):
        hidden, dtype = keys[i % len(keys)]  # every (hidden, dtype) gets its share
        affine = rng.choice([(True, True), (True, True), (True, False), (False, True),
                             (False, False)])
        problem = Problem(hidden, dtype, *affine)
        # A cache kind first, then a config of it: the bulk-copy kernel (its own template) is a
        # small share of the space and would be left to chance.
        configs = spaces[(hidden, dtype)]
        cache = rng.choice(sorted({c.cache for c in configs}))
        out.append((rng.choice([c for c in configs if c.cache == cache]), problem))
    return out


@pytest.fixture(scope="module")
def sweep() -> list[tuple[KernelConfig, Problem]]:
    return sampled_sweep()


def test_sampled_sweep_renders(sweep):
    assert len(sweep) == 200
    for cfg, problem in sweep:
        k = render(cfg, problem)
        assert k.config == cfg and k.problem == problem
        assert k.name == kernel_name(cfg, problem)
        assert re.fullmatch(r"autonorm_ln_[0-9a-f]{16}", k.name)
        src = k.source
        assert f"{k.name}(const " in src
        assert 'extern "C" __global__' in src
        assert cfg.label() in src
        assert f"constexpr int N = {problem.hidden};" in src
        assert f"__launch_bounds__({cfg.threads}, " in src
        assert "{{" not in src and "{%" not in src and "{#" not in src  # nothing left unrendered
        assert src.count("{") == src.count("}")
        assert ("__cluster_dims__" in src) == (cfg.cluster > 1)
        assert ("const Vec wv" in src) == problem.has_weight
        assert ("const Vec bv" in src) == problem.has_bias
        plan = k.launch
        assert plan.threads == cfg.threads
        assert plan.cluster == cfg.cluster
        assert plan.rows_per_block == cfg.rows_per_block
        if cfg.cache == "bulk":
            # A persistent grid sized by occupancy: the plan carries the kernel's
            # __launch_bounds__ minimum, never the config's 0.
            assert plan.resident
            assert cfg.blocks_per_sm == 0
            assert plan.blocks_per_sm == min_blocks_per_sm(cfg, problem)
            assert plan.blocks_per_sm == bulk_occupancy(cfg, problem)[0] >= 1
            assert f"__launch_bounds__({cfg.threads}, {plan.blocks_per_sm})" in src
            assert "cp.async.bulk" in src
        else:
            assert not plan.resident
            assert plan.blocks_per_sm == cfg.blocks_per_sm
            assert "cp.async.bulk" not in src
            blocks = min_blocks_per_sm(cfg, problem)
            assert f"__launch_bounds__({cfg.threads}, {blocks})" in src
            if cfg.max_regs:  # the bound caps a thread's registers at max_regs
                assert H200.regs_per_sm // (blocks * cfg.threads) == cfg.max_regs
        assert plan.smem_bytes == smem_bytes(cfg, problem)
        assert len(k.source_hash) == 64
    covered = {(c.cache, c.stats, c.cluster > 1) for c, _ in sweep}
    assert len(covered) >= 8, covered  # the sample reaches most variants
    assert any(c.cache == "bulk" for c, _ in sweep)  # the bulk-copy kernel too


def test_sample_covers_all_hidden_sizes_and_dtypes(sweep):
    assert {(p.hidden, p.dtype) for _, p in sweep} == {
        (h, dt) for h in HIDDEN_SIZES for dt in DTYPES
    }


def test_render_is_deterministic(sweep):
    for cfg, problem in sweep[:50]:
        a, b = render(cfg, problem), render(cfg, problem)
        assert a.source.encode() == b.source.encode()
        assert a == b


_CHILD = """
import hashlib, json, sys
from autonorm.ops.layer_norm.codegen import render
from autonorm.ops.layer_norm import KernelConfig, Problem
pairs = json.loads(sys.stdin.read())
out = []
for cfg, prob in pairs:
    k = render(KernelConfig.from_dict(cfg), Problem(**prob))
    out.append([k.name, hashlib.sha256(k.source.encode()).hexdigest()])
print(json.dumps(out))
"""


@pytest.mark.parametrize("hashseed", ["0", "4242"])
def test_render_is_deterministic_across_processes(sweep, hashseed):
    pairs = sweep[:40]
    payload = json.dumps([
        [c.to_dict(), {"hidden": p.hidden, "dtype": p.dtype, "has_weight": p.has_weight,
                       "has_bias": p.has_bias}]
        for c, p in pairs
    ])
    env = dict(os.environ, PYTHONHASHSEED=hashseed)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-c", _CHILD], input=payload, capture_output=True, text=True,
        env=env, check=False, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    here = []
    for c, p in pairs:
        k = render(c, p)
        here.append([k.name, hashlib.sha256(k.source.encode()).hexdigest()])
    assert json.loads(done.stdout) == here


def test_kernel_names_are_unique():
    problem = Problem(4096, "bfloat16")
    configs = enumerate_space(problem)
    names = {kernel_name(c, problem) for c in configs}
    assert len(names) == len(configs)
    # the same configuration on another problem is another kernel
    cfg = KernelConfig(threads=256, vec=4, cache="smem", stats="welford")
    problems = [
        Problem(4096, "bfloat16"), Problem(4096, "float16"), Problem(4096, "float32"),
        Problem(4100, "bfloat16"), Problem(4096, "bfloat16", has_weight=False),
        Problem(4096, "bfloat16", has_bias=False),
        Problem(4096, "bfloat16", has_weight=False, has_bias=False),
    ]
    rendered = [render(cfg, p) for p in problems]
    assert len({k.name for k in rendered}) == len(problems)
    assert len({k.source_hash for k in rendered}) == len(problems)


def test_different_configs_give_different_sources(sweep):
    by_name = {}
    for cfg, problem in sweep:
        k = render(cfg, problem)
        by_name.setdefault(k.name, (cfg, problem))
        assert by_name[k.name] == (cfg, problem)


def test_invalid_config_does_not_render():
    problem = Problem(4096, "float32")
    with pytest.raises(ConfigError, match="exceeds a 16-byte access"):
        render(KernelConfig(vec=8), problem)
    small = DeviceLimits(name="small", max_smem_optin=48 * 1024)
    cfg = KernelConfig(threads=256, vec=8, rows_per_block=2, cache="smem", stats="welford")
    big = Problem(16384, "bfloat16")
    render(cfg, big)
    with pytest.raises(ConfigError, match="shared memory"):
        render(cfg, big, small)


def test_naive_renders_only_when_allowed():
    problem = Problem(4096, "float32")
    naive = KernelConfig(threads=256, vec=4, cache="registers", stats="naive")
    with pytest.raises(ConfigError, match="stats must be one of"):
        render(naive, problem)
    k = render(naive, problem, allow_unstable=True)
    assert "DELIBERATELY UNSTABLE" in k.source
    assert "const float shift = 0.f;" in k.source
    assert "to_f(x[row_base])" not in k.source
    k2 = render(naive, problem, H200, allow_unstable=True)
    assert k2.source == k.source


@pytest.mark.parametrize(
    ("cache", "stats"),
    [("none", "welford"), ("registers", "welford"), ("smem", "welford"),
     ("registers", "two_pass"), ("smem", "two_pass")],  # two_pass without a cache is invalid
)
def test_stable_variants_shift_each_row(cache, stats):
    for dtype in DTYPES:
        problem = Problem(4096, dtype)
        vec = 4 if dtype == "float32" else 8
        k = render(KernelConfig(threads=256, vec=vec, cache=cache, stats=stats), problem)
        assert "const float shift = to_f(x[row_base]);" in k.source
        if stats == "welford":
            # the thread's shift starts at the row's and, in fp32, follows its running mean;
            # 16-bit rows keep it (the rebase cost bf16 x0.94; docs/accuracy.md)
            assert "float wn = 0.f, ws = shift," in k.source
            assert ("rebase(ws, wm);" in k.source) == (dtype == "float32")
            assert "xf - ws" in k.source
        elif dtype == "float32":
            assert "xf - shift" in k.source
        else:  # 16-bit: each vector summed, then shifted once, fused with the squares of
            # x - shift (plan.fuses_passes; docs/accuracy.md)
            assert "- (float)V * shift;" in k.source
            assert "s2 = fmaf(d, d, s2);" in k.source
            assert "if (s1 * mean > 0.9375f * s2)" in k.source
        # fp32 outputs subtract the mean before scaling (offset rows, 1e-7); 16-bit outputs fold
        # -mean * rstd into one fma on x - cshift; a fused two-pass over a row held as fp32 (fc)
        # keeps its x - shift for it (cshift = shift).
        held = holds_fp32_row(k.config, problem)
        xf = "fc[it][k]" if held else "elem(xv, k)"
        if dtype == "float32":
            normalize = "(elem(xv, k) - cshift) - cmean"
        elif held and stats == "two_pass":
            normalize = "fmaf(fc[it][k], rstd, nmr)"
            # the held row keeps x - shift, so normalization needs no shift of its own
            assert "fc[it][k] = d;" in k.source and "const float cshift" not in k.source
            assert "const float cmean = mean;  // mean of x - shift, as the held row is" in k.source
        else:
            normalize = f"fmaf({xf} - cshift, rstd, nmr)"
        assert normalize in k.source
        assert "DELIBERATELY UNSTABLE" not in k.source
        assert "const float shift = 0.f;" not in k.source


def test_fused_two_pass_only_where_its_guard_is_uniform():
    """16-bit two-pass kernels of the fwd template fuse their sums; fp32, bulk and clusters of
    multi-row blocks (whose barrier spans rows that may disagree on the guard) keep two passes."""
    bf16, fp32 = Problem(16384, "bfloat16"), Problem(16384, "float32")
    fused = KernelConfig(threads=256, vec=8, cache="smem", stats="two_pass")
    assert fuses_passes(fused, bf16)
    assert not fuses_passes(dataclasses.replace(fused, vec=4), fp32)
    assert not fuses_passes(dataclasses.replace(fused, stats="welford"), bf16)
    assert not fuses_passes(dataclasses.replace(fused, cache="bulk", stages=2), bf16)
    clustered = dataclasses.replace(fused, cluster=2)
    assert fuses_passes(clustered, bf16)  # one row a block: the cluster shares one row's totals
    assert not fuses_passes(dataclasses.replace(clustered, rows_per_block=2), bf16)
    for cfg, problem in [(fused, bf16), (dataclasses.replace(fused, vec=4), fp32),
                         (dataclasses.replace(fused, cache="bulk", stages=2), bf16)]:
        src = render(cfg, problem, H200).source
        # the guard and its second pass exist exactly where the passes are fused
        assert ("if (s1 * mean > 0.9375f * s2)" in src) == fuses_passes(cfg, problem)
        assert ("const float centre = shift + mean;" in src) != fuses_passes(cfg, problem)


def test_fp32_fuses_only_the_short_few_row_kernels():
    """fp32 fuses its sums where a row kernel holds two vectors a thread or fewer in registers
    with the weights loaded beside x (plan.lean_fp32), without the residual add; its shift is the
    mean of the row's first 8 elements, its guard 2 bits, its second pass the corrected two-pass.
    """
    short = KernelConfig(threads=128, vec=2, cache="registers", stats="two_pass")
    fp32 = Problem(490, "float32")
    plan = derive_plan(short, fp32, H200)
    assert plan.lean_fp32 and plan.shape.iters <= 2 and plan.fused_passes
    src = render(short, fp32, H200).source
    assert "for (int k = 0; k < 8; ++k) fshift += to_f(x[row_base + k]);" in src
    assert "fshift *= 0.125f;" in src
    assert "const float d = xf - fshift; s1 += d; s2 = fmaf(d, d, s2);" in src
    assert "if (s1 * mean > 0.75f * s2) {" in src
    assert "const float centre = fshift + mean;" in src  # the corrected two-pass, past the guard
    assert "0.9375f" not in src
    # A row of 5 elements takes the mean of all 5.
    tiny = render(KernelConfig(threads=32, vec=4, rows_per_block=32, cache="registers",
                               stats="two_pass"), Problem(5, "float32"), H200).source
    assert "k < 5; ++k) fshift" in tiny and "fshift *= 0.2f;" in tiny
    unfused = [
        (dataclasses.replace(short, early=True, threads=64, vec=4), Problem(2048, "float32")),
        (dataclasses.replace(short, cache="smem"), fp32),
        (dataclasses.replace(short, stats="welford"), fp32),
        (short, Problem(490, "float32", residual=True)),
        (dataclasses.replace(short, blocks_per_sm=2), fp32),  # a prefetched row: not lean
    ]
    for cfg, problem in unfused:
        assert not derive_plan(cfg, problem, H200).fused_passes, (cfg.label(), problem)
        assert "fshift" not in render(cfg, problem, H200).source, cfg.label()
    # 16-bit keeps its own fused form, about the first element.
    bf16 = render(short, Problem(490, "bfloat16"), H200).source
    assert "fshift" not in bf16 and "if (s1 * mean > 0.9375f * s2)" in bf16


@pytest.mark.parametrize("stats", ["welford", "two_pass"])
def test_prefetching_variant_shifts_each_row(stats):
    problem = Problem(4096, "bfloat16")
    cfg = KernelConfig(threads=256, vec=8, cache="registers", stats=stats, blocks_per_sm=2)
    assert prefetches(cfg)
    src = render(cfg, problem).source
    assert "const float shift = nshift;" in src  # the shift of the row loaded ahead
    assert "nshift = to_f(x[(size_t)row * N]);" in src
    assert "nshift = to_f(x[(size_t)nrow * N]);" in src
    assert ("xf - ws" if stats == "welford" else "- (float)V * shift;") in src
    plain = render(dataclasses.replace(cfg, blocks_per_sm=0), problem).source
    assert "nshift" not in plain and "const float shift = to_f(x[row_base]);" in plain
    naive = render(dataclasses.replace(cfg, stats="naive"), problem, allow_unstable=True).source
    assert "const float shift = 0.f;" in naive and "xf - shift" not in naive


def test_code_version():
    version = code_version()
    assert version.startswith(autonorm.__version__ + "+")
    assert re.fullmatch(re.escape(autonorm.__version__) + r"\+[0-9a-f]{12}", version)
    assert version.endswith(templates_hash())
    assert version == code_version()
    k = render(KernelConfig(), Problem(4096, "bfloat16"))
    assert f"rendered by autonorm {version}" in k.source


def _template_file(name: str) -> Path:
    """Where the family's environment finds ``name``: its own folder first, then the shared one."""
    for folder in (TEMPLATE_DIR, SHARED_TEMPLATES):
        if (folder / name).is_file():
            return folder / name
    raise AssertionError(f"template {name} is in neither {TEMPLATE_DIR} nor {SHARED_TEMPLATES}")


def _referenced_templates(name: str) -> set[str]:
    """The templates ``name`` imports or includes, read from its Jinja syntax tree."""
    env = template_environment()
    tree = env.parse(_template_file(name).read_text())
    found = set(jinja2.meta.find_referenced_templates(tree))
    assert None not in found, f"{name} imports a template by a computed name"
    return found


def test_templates_hash_covers_the_kernel_templates():
    names = sorted(KERNEL_TEMPLATES)
    assert {TEMPLATE, BULK_TEMPLATE, "reduce.cuh.j2", "convert.cuh.j2"} <= set(names)
    # Host-side export templates are not part of a kernel's device code.
    assert not any(n.startswith("export") for n in names)
    # Each kernel template lives beside the family, the device code they share in the shared
    # folder; the hash reads the file the environment renders from.
    assert _template_file(TEMPLATE).parent == TEMPLATE_DIR
    assert _template_file("reduce.cuh.j2").parent == SHARED_TEMPLATES
    digest = hashlib.sha256()
    for name in names:
        digest.update(name.encode())
        digest.update(_template_file(name).read_bytes())
    assert templates_hash() == digest.hexdigest()[:12]


def test_templates_hash_covers_every_template_a_kernel_imports():
    # A kernel template's imports shape its code: an import left out of the hash would let a
    # changed kernel keep the studies measured on the old one.
    seen: set[str] = set()
    todo = [TEMPLATE, BULK_TEMPLATE]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        assert name in KERNEL_TEMPLATES, f"a kernel imports {name}, which is not hashed"
        todo.extend(_referenced_templates(name))
    assert seen == set(KERNEL_TEMPLATES)  # and nothing is hashed that no kernel renders from
    assert "reduce.cuh.j2" in _referenced_templates(TEMPLATE)


@pytest.mark.parametrize("bulk", [False, True])
def test_16bit_outputs_convert_in_pairs_and_fold_the_mean(bulk):
    # 16-bit stores convert two values per instruction and normalize with one fma on x - shift;
    # fp32 keeps ((x - shift) - mean) * rstd (offset rows, 1e-7; docs/accuracy.md).
    cache = dict(cache="bulk", stages=2) if bulk else dict(cache="smem")
    for dtype, pair in (("bfloat16", "__floats2bfloat162_rn"), ("float16", "__floats2half2_rn"),
                        ("float32", None)):
        problem = Problem(8192, dtype)
        vec = 16 // problem.itemsize
        cfg = KernelConfig(threads=256, vec=vec, stats="two_pass", **cache)
        src = render(cfg, problem, H200).source
        if pair:
            assert f"= {pair}(o[k], o[k + 1]);" in src
            assert "const float nmr = -cmean * rstd;" in src
            # two passes centre pass 2 on shift + mean; fused ones stay about the shift
            assert ("const float centre = shift + mean;" in src) != fuses_passes(cfg, problem)
        else:
            assert "__floats2" not in src and "nmr" not in src
            assert "- cshift) - cmean) * rstd;" in src
            assert "s3 += d;" in src  # corrected two-pass


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_bulk_y_stores_stream_only_from_clusters(dtype):
    # Evict-first y stores pay in clustered bulk kernels (c4/c8 ran x0.55-0.97 with plain ones)
    # and cost unclustered ones 0.3-3.5% (H200, docs/bulk-kernel.md); the fwd kernel stores
    # plainly.
    problem = Problem(16384, dtype)
    vec = 16 // problem.itemsize

    def source(cache: str, cluster: int) -> str:
        extra = dict(stages=2) if cache == "bulk" else {}
        cfg = KernelConfig(threads=512, vec=vec, cache=cache, cluster=cluster,
                           stats="two_pass", **extra)
        return render(cfg, problem, H200).source

    assert "__stcs(" not in source("bulk", 1)
    assert "= *reinterpret_cast<const float4*>(&out);" in source("bulk", 1)
    for cluster in (2, 4):
        assert "__stcs(reinterpret_cast<float4*>(yr" in source("bulk", cluster)
    assert "__stcs(" not in source("smem", 1)


def test_short_16bit_register_rows_are_held_as_fp32():
    bf16, fp32 = Problem(1024, "bfloat16"), Problem(1024, "float32")
    short = KernelConfig(threads=128, vec=8, rows_per_block=4, cache="registers")  # 4 vectors
    assert holds_fp32_row(short, bf16)
    assert "float fc[ITERS][V];" in render(short, bf16, H200).source
    assert not holds_fp32_row(dataclasses.replace(short, vec=4), fp32)
    assert not holds_fp32_row(dataclasses.replace(short, cache="smem"), bf16)
    # 64 elements per thread (8 vectors of 8) would double a row's registers: kept packed.
    assert not holds_fp32_row(short, Problem(2048, "bfloat16"))
    wide = KernelConfig(threads=128, vec=8, cache="registers")
    src = render(wide, Problem(8192, "bfloat16"), H200).source  # 8 vectors per thread
    assert "fc[" not in src and "elem(xv, k)" in src


def test_long_smem_rows_are_filled_by_cp_async():
    bf16 = Problem(16384, "bfloat16")
    long_row = KernelConfig(threads=256, vec=8, cache="smem", max_regs=64)  # 8 vectors
    assert fills_async(long_row, bf16)
    src = render(long_row, bf16, H200).source
    assert "cp.async.cg.shared.global" in src and "cp.async.wait_all" in src
    assert "store_vec(srow" not in src
    # 4 vectors per thread: the plain fill already has them all in flight (unroll 4)
    short = KernelConfig(threads=128, vec=8, rows_per_block=4, cache="smem", max_regs=64)
    bf16_768 = Problem(768, "bfloat16")
    assert not fills_async(short, bf16_768)
    src = render(short, bf16_768, H200).source
    assert "cp.async" not in src and "store_vec(srow" in src
    # 8-byte vectors copy with .ca; one 16-bit element (2 bytes) is not a cp.async size
    assert "cp.async.ca.shared.global [%0], [%1], 8;" in render(
        dataclasses.replace(long_row, vec=4, max_regs=0), bf16, H200).source
    single = KernelConfig(threads=64, vec=1, cache="smem")
    assert not fills_async(single, Problem(1000, "bfloat16"))
    assert fills_async(single, Problem(1000, "float32"))
    # cp.async needs compute capability 8.0
    assert not fills_async(long_row, bf16, DeviceLimits(cc=75))
    assert "cp.async" not in render(long_row, bf16, DeviceLimits(cc=75)).source
    # other row caches never use it
    for cache in ("registers", "none"):
        assert not fills_async(dataclasses.replace(long_row, cache=cache, max_regs=0), bf16)


def test_store_pass_unrolled_fully_only_where_measured():
    bf16 = Problem(16384, "bfloat16")
    winner = KernelConfig(threads=256, vec=8, cache="smem", stats="two_pass", max_regs=64)
    assert unrolls_store(winner, bf16)  # 8 vectors, cp.async fill, 256 threads, capped
    src = render(winner, bf16, H200).source
    full = "#pragma unroll\n    for (int it = 0; it < ITERS; ++it) {"
    assert src.count(full) == 1  # the store pass; the fill and both statistics passes stay 4 deep
    assert src.count("#pragma unroll 4\n    for (int it = 0; it < ITERS; ++it) {") == 3
    # 4 vectors (plain fill), 512 threads (spilled under NVRTC at 32768), uncapped, fp32,
    # more than 8 vectors: the store pass stays 4 deep
    assert not unrolls_store(winner, Problem(8192, "bfloat16"))
    assert not unrolls_store(dataclasses.replace(winner, threads=512), Problem(32768, "bfloat16"))
    assert not unrolls_store(dataclasses.replace(winner, max_regs=0), bf16)
    assert not unrolls_store(dataclasses.replace(winner, vec=4, max_regs=0),
                             Problem(8192, "float32"))
    assert not unrolls_store(dataclasses.replace(winner, threads=128), bf16)  # 16 vectors
    assert not unrolls_store(winner, bf16, DeviceLimits(cc=75))  # no cp.async fill
    plain = render(winner, Problem(8192, "bfloat16"), H200).source
    assert full not in plain


def test_weights_load_beside_x_at_two_vectors_a_thread_or_fewer():
    from autonorm.ops.layer_norm.plan import derive_plan

    bf16 = Problem(490, "bfloat16")
    two = KernelConfig(threads=128, vec=2, cache="registers", stats="two_pass")  # 2 vectors
    assert derive_plan(two, bf16, H200).early_affine
    src = render(two, bf16, H200).source
    # loaded after x's cache and before the first reduction; the store pass reads them
    assert src.index("wpre[it] = load_vec(wseg") < src.index("__shfl_xor_sync")
    assert src.index("bpre[it] = load_vec(bseg") < src.index("__shfl_xor_sync")
    assert "const Vec wv = wpre[it];" in src and "const Vec bv = bpre[it];" in src
    assert "wseg + (size_t)j * V" not in src[src.index("const float rstd"):]
    skewed = render(KernelConfig(threads=256, vec=2, cache="registers", stats="two_pass"),
                    Problem(1001, "float32"), H200).source
    assert "wpre[it] = load_shifted(wseg, j, h);" in skewed
    # With the residual add: after h's cache, which the statistics read
    added = render(two, Problem(490, "bfloat16", residual=True), H200).source
    assert added.index("keep_sum(") < added.index("wpre[it] = load_vec(wseg")
    assert added.index("bpre[it] = load_vec(bseg") < added.index("__shfl_xor_sync")
    # More vectors a thread, another row cache, a persistent grid, a register cap, a float32
    # residual beside 16-bit x, no weight or bias: the weights load in the store pass
    for config, problem in (
        (dataclasses.replace(two, threads=64), bf16),  # 4 vectors
        (dataclasses.replace(two, cache="smem"), bf16),
        (dataclasses.replace(two, blocks_per_sm=2), bf16),
        (dataclasses.replace(two, max_regs=64), bf16),
        (two, Problem(490, "bfloat16", residual=True, residual_dtype="float32")),
        (two, Problem(490, "bfloat16", has_weight=False, has_bias=False)),
    ):
        assert not derive_plan(config, problem, H200).early_affine, (config, problem)
        assert "wpre" not in render(config, problem, H200).source


def test_fp32_early_weight_kernels_take_rsqrtf_and_sum_squares_plainly():
    from autonorm.ops.layer_norm.plan import derive_plan
    from autonorm.ops.rms_norm.problem import Problem as RmsProblem

    two = KernelConfig(threads=256, vec=4, cache="registers", stats="two_pass")  # 2 vectors
    for problem in (RmsProblem(2048, "float32"), RmsProblem(2048, "float32", residual=True),
                    Problem(2048, "float32")):
        assert derive_plan(two, problem, H200).lean_fp32
        src = render(two, problem, H200).source
        assert "rsqrtf(var + eps)" in src and "1.0f / sqrtf" not in src
        assert "c2" not in src  # no compensation term
    # 16-bit early kernels, fp32 kernels of more vectors a thread and the bulk kernel keep IEEE
    # sqrt and division, and RMSNorm's compensated sum in fp32
    four = dataclasses.replace(two, threads=128)
    for config, problem in ((two, RmsProblem(4096, "bfloat16")),
                            (four, RmsProblem(2048, "float32")), (four, Problem(2048, "float32"))):
        assert not derive_plan(config, problem, H200).lean_fp32
        src = render(config, problem, H200).source
        assert "1.0f / sqrtf(var + eps)" in src and "rsqrtf(" not in src
    assert "c2 = (t - s2) - q" in render(four, RmsProblem(2048, "float32"), H200).source


def test_fp32_register_rows_clamp_their_partial_iteration():
    from autonorm.ops.layer_norm.plan import derive_plan
    from autonorm.ops.rms_norm.problem import Problem as RmsProblem

    config = KernelConfig(threads=128, vec=2, cache="registers", stats="two_pass")
    clamped = "const int j = min(it * G + lane, NVEC - 1);"
    # 490 elements: 245 vectors over 128 threads, the second iteration partial
    for problem in (Problem(490, "float32"), RmsProblem(490, "float32"),
                    RmsProblem(490, "float32", residual=True)):
        assert derive_plan(config, problem, H200).clamped_tail, problem
        src = render(config, problem, H200).source
        assert clamped in src and "if (j < NVEC) cache[it] =" not in src, problem
        # weight (and bias) go out before x, from clamped indices too
        assert src.index("wpre[it] = load_vec(wseg") < src.index("cache[ITERS];"), problem
        # the normalize pass stores only the row's own vectors
        assert "if (j < NVEC)" in src[src.index("__shfl_xor_sync"):], problem
    added = render(config, RmsProblem(490, "float32", residual=True), H200).source
    # h is stored only by the lanes in the row
    assert "if (it * G + lane < NVEC) store_vec(hr + (size_t)j * V, cache[it]);" in added
    assert "keep_sum(" not in added[added.index("cache[ITERS];"):]
    # 16-bit rows, whole iterations, skewed rows and other caches keep the guarded load
    for cfg, problem in (
        (config, Problem(490, "bfloat16")),
        (config, RmsProblem(490, "bfloat16")),
        (dataclasses.replace(config, threads=64), Problem(512, "float32")),  # even
        (config, Problem(491, "float32")),  # skewed
        (dataclasses.replace(config, cache="smem"), Problem(490, "float32")),
        (dataclasses.replace(config, blocks_per_sm=2), Problem(490, "float32")),  # prefetch
    ):
        assert not derive_plan(cfg, problem, H200).clamped_tail, (cfg, problem)
        assert clamped not in render(cfg, problem, H200).source, (cfg, problem)


# --------------------------------------------------------------------------- launch plans


def plan(rows_per_block=1, cluster=1, blocks_per_sm=0, threads=256) -> LaunchPlan:
    return LaunchPlan(threads=threads, smem_bytes=0, cluster=cluster,
                      rows_per_block=rows_per_block, blocks_per_sm=blocks_per_sm)


@pytest.mark.parametrize(
    ("rows", "rpb", "cluster", "blocks"),
    [(1, 1, 1, 1), (37, 1, 1, 37), (37, 4, 1, 10), (37, 32, 1, 2), (32, 32, 1, 1),
     (0, 1, 1, 1), (0, 4, 2, 2), (37, 1, 2, 74), (1000, 1, 8, 8000), (5, 1, 4, 20)],
)
def test_grid_one_tile_per_cluster(rows, rpb, cluster, blocks):
    assert plan(rpb, cluster).grid(rows, sm_count=132) == blocks


@pytest.mark.parametrize(
    ("rows", "rpb", "cluster", "bps", "sm", "blocks"),
    [
        (1 << 20, 1, 1, 1, 132, 132),
        (1 << 20, 1, 1, 4, 132, 528),
        (1 << 20, 4, 1, 8, 132, 1056),
        (1 << 20, 1, 2, 2, 132, 264),  # 132 clusters of 2
        (1 << 20, 1, 8, 1, 132, 128),  # 16 clusters of 8: rounded down to whole clusters
        (1 << 20, 1, 8, 1, 4, 8),  # fewer SMs than a cluster: still one cluster
        (10, 1, 1, 8, 132, 10),  # fewer tiles than the persistent grid
        (10, 4, 2, 8, 132, 6),  # 3 tiles, clusters of 2
        (0, 1, 4, 2, 132, 4),
    ],
)
def test_grid_persistent(rows, rpb, cluster, bps, sm, blocks):
    assert plan(rpb, cluster, bps).grid(rows, sm_count=sm) == blocks


def test_grid_properties():
    for rows in (0, 1, 2, 7, 37, 131, 132, 133, 1000, 4097, 1 << 20):
        for rpb in (1, 2, 4, 8, 16, 32):
            for cluster in (1, 2, 4, 8):
                tiles = max(1, -(-rows // rpb))
                for bps in (0, 1, 2, 4, 8):
                    for sm in (1, 8, 132):
                        g = plan(rpb, cluster, bps).grid(rows, sm)
                        assert g % cluster == 0 and g >= cluster
                        assert g <= tiles * cluster
                        if bps == 0:
                            assert g == tiles * cluster
                        else:
                            assert g <= max(sm * bps, cluster)


def test_rendered_plan_grid_matches_config():
    problem = Problem(65536, "bfloat16")
    cfg = KernelConfig(threads=512, vec=8, cache="smem", stats="two_pass", cluster=4,
                       blocks_per_sm=2)
    k = render(cfg, problem)
    assert k.launch.grid(4096, H200.sm_count) == 132 * 2  # 66 clusters of 4
    assert k.launch.smem_bytes == 65536 // 4 * 2 + 1056


# --------------------------------------------------------------------------- hardware limits


def _named_barrier_ids(cfg: KernelConfig, problem: Problem) -> range:
    """The ``bar.sync`` ids a rendered kernel can use (``group + 1`` for each row group)."""
    src = render(cfg, problem).source
    if 'asm volatile("bar.sync %0, %1;" :: "r"(group + 1)' not in src:
        return range(0)
    return range(1, cfg.rows_per_block + 1)


def test_named_barrier_ids_fit_the_hardware():
    # Found by this test: 1024 threads x 16 rows of 64 threads rendered bar.sync 16; the space
    # now rejects more than 15 multi-warp rows per block.
    bad = []
    bulk_checked = 0
    for dtype in DTYPES:
        problem = Problem(768, dtype)
        for cfg in enumerate_space(problem):
            if cfg.rows_per_block > 1 and cfg.threads_per_row > 32:
                if cfg.cache == "bulk":
                    # The bulk-copy kernel synchronises its rows with __syncthreads only.
                    src = render(cfg, problem).source
                    assert "bar.sync" not in src, cfg.label()
                    assert "__syncthreads();" in src, cfg.label()
                    bulk_checked += 1
                    continue
                ids = _named_barrier_ids(cfg, problem)
                assert ids, cfg.label()
                if max(ids) > 15:
                    bad.append((dtype, cfg.label()))
    assert not bad, f"{len(bad)} configs use barrier id 16: {bad[:4]}"
    assert bulk_checked, "no multi-warp, multi-row bulk-copy configuration was checked"


def test_bf16_vectors_widen_in_pairs():
    # A bf16 pair shares a 32-bit word: the low element widens with a shift, the high one with a
    # mask (one instruction each; extracting then shifting took two in the SASS). x, weight and
    # bias all go through elem(); fp16 and fp32 convert element by element as before.
    cfg = KernelConfig(128, 8, 4, "registers", "two_pass")
    bulk = KernelConfig(256, 8, 1, "bulk", "two_pass", 1, 0, 2)
    for c, problem in [(cfg, Problem(1024, "bfloat16")), (bulk, Problem(16384, "bfloat16"))]:
        src = render(c, problem, H200).source
        assert "(k & 1) ? (w & 0xffff0000u) : (w << 16)" in src
        assert re.search(r"elem\(wv, [kq]\)", src) and re.search(r"elem\(bv, [kq]\)", src)
        assert "to_f(xv" not in src and "to_f(wv" not in src and "to_f(bv" not in src
    for dtype in ("float16", "float32"):
        src = render(dataclasses.replace(cfg, vec=8 if dtype == "float16" else 4),
                     Problem(1024, dtype), H200).source
        assert "0xffff0000u" not in src and "return to_f(v.v[k]);" in src
    # a lone bf16 element (vec=1) has no pair to share a word with
    lone = KernelConfig(256, 1, 1, "registers", "two_pass")
    assert "0xffff0000u" not in render(lone, Problem(1024, "bfloat16"), H200).source


def test_bf16_pair_widening_is_the_exact_conversion():
    # The bit operations of elem() on every bf16 pattern, against reference.to_float64.
    bits = np.arange(1 << 16, dtype=np.uint32)
    words = bits | (bits[::-1] << 16)  # low element: bits, high element: reversed
    low = (words << 16).astype(np.uint32).view(np.float32)
    high = (words & np.uint32(0xFFFF0000)).view(np.float32)
    want_low = to_float64(bits.astype(np.uint16), "bfloat16")
    want_high = to_float64(bits[::-1].astype(np.uint16), "bfloat16")
    with np.errstate(invalid="ignore"):  # NaN patterns; assert_array_equal matches NaN to NaN
        np.testing.assert_array_equal(low.astype(np.float64), want_low)
        np.testing.assert_array_equal(high.astype(np.float64), want_high)
