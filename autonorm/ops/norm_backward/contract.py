"""How to launch an exported backward kernel: the manifest's ``how_to_launch``.

A backward export holds the kernel and a host launcher (:mod:`.launcher`) that launches it as
the runtime does in process. A caller who launches the kernel from code of their own needs the
same rules: the kernel's blocks meet at a grid barrier, so launching more of them than can be
resident at once hangs the GPU. The manifest therefore spells out what the runtime does
(:meth:`autonorm.codegen.kernel.LaunchPlan.grid`, :mod:`.workload`): the parameters, the grid
rule with this kernel's numbers, and the two buffers a launch needs.
"""

from __future__ import annotations

from typing import Any

# The kernel's parameters in order (KERNEL_ABI), each with what the caller passes.
PARAMETERS = (
    ("x", "the forward's input (after a residual add: the returned h), rows x hidden"),
    ("dy", "the gradient of the forward's output, rows x hidden"),
    ("weight", "the weight (hidden), or null without one"),
    ("dx", "out: the input's gradient in x's dtype, rows x hidden (after an add, h's too)"),
    ("dweight", "out: the weight's gradient in x's dtype (hidden), or null without a weight"),
    ("dbias", "out: the bias's gradient in x's dtype (hidden), or null without a bias"),
    ("partials", "fp32 scratch of partials_floats elements"),
    ("dh", "after a residual add the returned h's gradient, added to dx; else null"),
    ("rows", "int: the rows of x"),
    ("eps", "float: the forward's eps"),
    ("counter", "unsigned*: the grid barrier's counter (see counter)"),
)


def grid_terms(plan: Any) -> dict[str, Any]:
    """Return the numbers of ``plan``'s grid rule, as the manifest gives them.

    ``barrier``: the blocks meet at a grid barrier (the problem has column sums). The grid is
    then also held to ``blocks_per_sm`` blocks an SM, and past one row it has at least
    ``least_clusters_past_one_row`` clusters and one a row up to ``spread_rows``; without a
    barrier those two terms do not apply.
    """
    return {
        "single": plan.single,
        "barrier": plan.barrier,
        "rows_per_cluster": plan.rows_per_block,
        "spread_rows": plan.spread_rows,
        "least_clusters_past_one_row": -(-plan.reduce_tiles // plan.cluster),
        "blocks_per_sm": max(plan.blocks_per_sm, 1),
    }


def grid_rule(plan: Any) -> str:
    """Return the grid of ``plan`` in words, with :func:`grid_terms`' numbers."""
    if plan.single:
        return f"always {plan.cluster} blocks: one cluster, whatever the rows"
    terms = grid_terms(plan)
    unit = "blocks" if plan.cluster == 1 else f"clusters of {plan.cluster} blocks"
    cap = f"SMs * {terms['blocks_per_sm']}" + (f" / {plan.cluster}" if plan.cluster > 1 else "")
    tiles = f"ceil(rows / {terms['rows_per_cluster']})"
    if not plan.barrier:
        # No column sums: no barrier, and a persistent grid that strides over the rows.
        return (
            f"{unit}: min({tiles}, max(1, R)), R being what the CUDA occupancy API says can be "
            f"resident at once ({cap} where it cannot tell); they stride over the rows"
        )
    more = (f"max({tiles}, min(rows, {terms['spread_rows']}), "
            f"{terms['least_clusters_past_one_row']})")
    query = ("cudaOccupancyMaxActiveClusters" if plan.cluster > 1
             else "cudaOccupancyMaxActiveBlocksPerMultiprocessor x SMs")
    return (
        f"{unit}: min(T, max(1, R)) with T = {tiles} for one row and {more} for more, and R "
        f"the fewer of {cap} and what the CUDA occupancy API says can be resident at once "
        f"({query}); SMs are those the context may use (fewer for an MPS client with a reduced "
        "active-thread percentage, or in a green context). Never more: the blocks wait for "
        "each other at a grid barrier, and a block that cannot be resident never arrives"
    )


def how_to_launch(problem: Any, plan: Any, launcher: str) -> dict[str, Any]:
    """Return the manifest's ``how_to_launch`` of a backward kernel of ``problem``.

    Args:
        problem: what the kernel computes.
        plan: its launch plan.
        launcher: the exported host function that launches it as the runtime does.
    """
    return {
        "launcher": launcher,
        "parameters": [{"name": name, "pass": what} for name, what in PARAMETERS],
        "block_threads": plan.threads,
        "cluster_blocks": plan.cluster,
        "dynamic_smem_bytes": plan.smem_bytes,
        "grid": grid_rule(plan),
        "grid_terms": grid_terms(plan),
        "partials_floats": (
            f"max(1, min(rows, clusters) * {problem.sums * problem.hidden}, "
            f"{4 if problem.sums else 0} * rows), clusters being the grid's (blocks without a "
            "cluster)"
        ),
        "counter": (
            "one unsigned int in global memory, zero before the first launch; each launch "
            "leaves it zero. Launches that may run at once (on other streams) need one each"
        ),
    }
