"""Broken backward kernels the verifier must reject: the forms they are planted in and the edits.

Shared by the GPU test that verifies them (`test_gpu_backward.py`) and the CPU test that every
edit still applies to the source it is planted in (`test_backward_breaks.py`), so a template
change that moves an edit's text fails in CI rather than on the GPU.
"""

from __future__ import annotations

# An edit: (text in the rendered source, its replacement); a break is a tuple of edits.
Edit = tuple[str, str]

NO_SHIFT: Edit = ("const float shift = to_f(x", "const float shift = 0.f * to_f(x")

BREAKS: dict[str, tuple[Edit, ...]] = {
    "drop-mean": (("- c2", "- 0.f * c2"),),
    # Without its shift every offset row takes the second pass, which is exact only with its
    # mean's rounding corrected (a kernel without the shift alone verifies).
    "no-shift-uncorrected": (NO_SHIFT, ("      const float m = sr * INV_N;",
                                        "      const float m = 0.f * sr;")),
    "half-partials": (("p < parts; p += NW", "p < (parts + 1) / 2; p += NW"),),
    # One cluster's sums are the gradients (the one-row case): half of them is wrong there only.
    "one-cluster-sums": (("store_vec(dweight + crank * SEG + j * V, pack(o));",
                          "for (int k = 0; k < V; ++k) o[k] *= 0.5f;"
                          " store_vec(dweight + crank * SEG + j * V, pack(o));"),),
    # The one-pass statistics kept on rows whose shift lies far from the mean, and the second
    # pass's variance dropped there: the far-shift case fails both.
    "one-pass-always": (("if (!(cmean * cmean <= SHIFT_NEAR * var))", "if (false)"),),
    "second-pass-var": (("      var = fmaf(-m, m, s2 * INV_N);", "      (void)s2;"),),
}

# A bulk-copy kernel that refills a stage with the wrong row (one it has already taken).
BULK_BREAKS: dict[str, tuple[Edit, ...]] = {
    "stale-stage": (("row + S * takers,", "row + (S - 1) * takers,"),),
}

# A kernel holding its row in registers, a bulk-copy one of two stages (whole rows, split over
# a cluster, and holding its share of the row in fp32 registers).
BROKEN_CONFIGS: dict[str, dict] = {
    "registers": {"threads": 256, "vec": 4, "cache": "registers", "acc": "registers",
                  "blocks_per_sm": 1, "prefetch": True},
    "bulk": {"threads": 256, "vec": 4, "cache": "bulk", "acc": "registers", "blocks_per_sm": 2,
             "stages": 2},
    "cluster": {"threads": 256, "vec": 4, "cache": "bulk", "acc": "registers",
                "blocks_per_sm": 1, "stages": 2, "cluster": 2},
    "held": {"threads": 256, "vec": 4, "cache": "bulk", "acc": "registers", "blocks_per_sm": 1,
             "stages": 2, "hold": True},
}

# A held row split over a cluster of two whose sums meet lane by lane, and what breaks there:
# the warps' butterfly stopped a level short (half the warps' totals), the blocks' butterfly
# left out (each block its own totals), the second transposed level keeping the wrong half.
LANES_FORM = "lanes"
BROKEN_CONFIGS[LANES_FORM] = {"threads": 256, "vec": 4, "cache": "bulk", "acc": "registers",
                              "blocks_per_sm": 1, "stages": 2, "cluster": 2, "hold": True,
                              "lanes": True}
LANES_BREAKS: dict[str, tuple[Edit, ...]] = {
    "lanes-half-warps": (("for (int o = 4; o < 32; o <<= 1)",
                          "for (int o = 4; o < 16; o <<= 1)"),),
    "lanes-own-block": (("for (int o = 4; o < C * 4; o <<= 1)",
                         "for (int o = 4; o < 4; o <<= 1)"),),
    "lanes-wrong-half": (("(up8 ? tb : ta)", "(up8 ? ta : tb)"),),
}

# Two groups of a cluster of two blocks each, whose sums meet in distributed shared memory (one
# cluster) or in partials (the verifier's grid of three clusters); the last group's sums left
# out of that meeting is wrong at any grid.
GROUPS_FORM = "groups"
BROKEN_CONFIGS[GROUPS_FORM] = {"threads": 256, "vec": 4, "cache": "bulk", "acc": "registers",
                               "blocks_per_sm": 1, "stages": 2, "cluster": 2, "groups": 2}
GROUPS_BREAKS: dict[str, tuple[Edit, ...]] = {
    "drop-group": (("for (int r = 1; r < R; ++r)", "for (int r = 1; r < R - 1; ++r)"),),
}

# A held bulk kernel whose column sums are formed again from the rows (acc="reread"), and what
# breaks there: the tiles summing half the rows, each row with its neighbour's statistics, or
# the rows of a warp's vector loads left unmet (only every vec-th row summed).
REREAD_FORM = "reread"
BROKEN_CONFIGS[REREAD_FORM] = {"threads": 256, "vec": 4, "cache": "bulk", "acc": "reread",
                               "blocks_per_sm": 1, "stages": 2, "hold": True}
REREAD_BREAKS: dict[str, tuple[Edit, ...]] = {
    "reread-half-rows": (("p < rows; p += NW", "p < (rows + 1) / 2; p += NW"),),
    "reread-next-stats": (("__ldcg(stats + p)", "__ldcg(stats + (p + 1) % rows)"),),
    "reread-rows-unmet": (("for (int o = LPR; o < 32; o <<= 1)",
                           "for (int o = LPR; o < LPR; o <<= 1)"),),
}

ALL_BREAKS = {**BREAKS, **BULK_BREAKS, **LANES_BREAKS, **GROUPS_BREAKS, **REREAD_BREAKS}

# Every (form, break) planted, in LayerNorm backward at fp32 hidden 4096.
PLANTED: list[tuple[str, str]] = (
    [(f, n) for f in ("registers", "bulk", "cluster", "held") for n in BREAKS]
    + [(f, n) for f in ("bulk", "cluster", "held") for n in BULK_BREAKS]
    + [(GROUPS_FORM, n) for n in ("drop-mean", "no-shift-uncorrected", "half-partials",
                                  "stale-stage", "one-pass-always", *GROUPS_BREAKS)]
    + [(LANES_FORM, n) for n in ("drop-mean", "one-pass-always", "second-pass-var",
                                 *LANES_BREAKS)]
    + [(REREAD_FORM, n) for n in ("drop-mean", "no-shift-uncorrected", "one-pass-always",
                                  "second-pass-var", *REREAD_BREAKS)]
)


def plant(source: str, name: str) -> str:
    """Return ``source`` with break ``name``'s edits applied (each must find its text)."""
    for old, new in ALL_BREAKS[name]:
        if old not in source:
            raise ValueError(f"break {name!r}: {old!r} is not in the source")
        source = source.replace(old, new)
    return source
