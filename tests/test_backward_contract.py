"""CPU: the manifest of an exported backward kernel says how to launch it without hanging.

A backward kernel's blocks meet at a grid barrier: a caller who launches it from code of their
own, not through the exported launcher, and launches more blocks than can be resident hangs the
GPU. The manifest's ``how_to_launch`` names the parameters in the kernel's order and gives the
grid rule in words and in numbers, which must give the runtime's own grid (``LaunchPlan.grid``)
at every row count.
"""

from __future__ import annotations

import re

import pytest

from autonorm.export import render_export
from autonorm.ops import registry
from autonorm.ops.norm_backward.family import KERNEL_ABI
from autonorm.runtime.limits import H200

SHAPES = [
    ("layer_norm_backward", {}, "bfloat16", 16384, 4096),
    ("layer_norm_backward", {}, "bfloat16", 4096, 16384),
    ("layer_norm_backward", {"residual": True}, "float32", 1024, 1),
    ("layer_norm_backward", {}, "float32", 4096, 8),
    ("rms_norm_backward", {}, "float16", 3001, 64),
    # No weight: no column sums, no barrier.
    ("rms_norm_backward", {"has_weight": False}, "bfloat16", 4096, 4096),
]


def grid_from_terms(terms: dict, cluster: int, rows: int, sms: int, resident: int) -> int:
    """The grid in blocks as a caller computes it from the manifest's numbers alone."""
    if terms["single"]:
        return cluster
    tiles = -(-rows // terms["rows_per_cluster"])
    cap = resident
    if terms["barrier"]:
        if rows > 1:
            tiles = max(tiles, min(rows, terms["spread_rows"]),
                        terms["least_clusters_past_one_row"])
        cap = min(resident, sms * terms["blocks_per_sm"] // cluster)
    return min(tiles, max(1, cap)) * cluster


@pytest.mark.parametrize(("op", "form", "dtype", "hidden", "rows"), SHAPES)
def test_the_manifest_gives_the_runtimes_grid(op, form, dtype, hidden, rows) -> None:  # noqa: ANN001
    family = registry.get(op)
    problem = family.problem(hidden=hidden, dtype=dtype, **form)
    exported = render_export(family.default(problem, H200, rows), problem, device=H200)
    how = exported.manifest["how_to_launch"]
    plan = exported.kernel.launch
    assert how["launcher"] == exported.manifest["function"]
    assert (how["block_threads"], how["cluster_blocks"], how["dynamic_smem_bytes"]) == (
        plan.threads, plan.cluster, plan.smem_bytes)
    for sms in (132, 66, 7):
        # What the occupancy API says can be resident: all of them, or fewer.
        for resident in (sms * 8 // plan.cluster, 3):
            for n in (1, 2, 5, 16, 17, 100, 4096, 10**6):
                expected = plan.grid(n, sms, resident)
                assert grid_from_terms(how["grid_terms"], plan.cluster, n, sms,
                                       resident) == expected, (n, sms, resident)
    if plan.single:
        assert how["grid"].startswith(f"always {plan.cluster} blocks")
    else:
        assert f"ceil(rows / {plan.rows_per_block})" in how["grid"]
        assert ("never arrives" in how["grid"]) == plan.barrier


def test_the_parameters_are_the_kernels_in_order() -> None:
    family = registry.get("layer_norm_backward")
    problem = family.problem(hidden=4096, dtype="bfloat16", residual=True)
    exported = render_export(family.default(problem, H200, 4096), problem, device=H200)
    names = [p["name"] for p in exported.manifest["how_to_launch"]["parameters"]]
    signature = exported.kernel.source.split(f"{exported.kernel.name}(", 1)[1].split(")", 1)[0]
    declared = re.findall(r"(\w+)\s*(?:,|$)", signature.replace("\n", " "))
    assert names == declared
    assert len(names) == len(KERNEL_ABI.params) + 1  # the counter: the workspace pointer


@pytest.mark.parametrize(("op", "form", "dtype", "hidden", "rows"), SHAPES)
def test_the_manifest_sizes_the_partials_as_the_runtime(op, form, dtype, hidden, rows) -> None:  # noqa: ANN001
    family = registry.get(op)
    problem = family.problem(hidden=hidden, dtype=dtype, **form)
    exported = render_export(family.default(problem, H200, rows), problem, device=H200)
    rule = exported.manifest["how_to_launch"]["partials_floats"]
    found = re.fullmatch(r"max\(1, min\(rows, clusters\) \* (\d+), (\d+) \* rows\), .*", rule)
    assert found, rule
    per_row, stats = map(int, found.groups())
    for n in (1, 2, 17, 4096):
        for clusters in (1, 3, 132, 1056):
            assert max(1, min(n, clusters) * per_row, stats * n) == problem.partial_floats(
                n, clusters), (n, clusters)
