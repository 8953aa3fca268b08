"""Render kernels from another template tree with autonorm's own codegen (lab scripts only).

ab_lab.py, sass_count.py and spill_sweep.py compare two template trees; this is the one place
that points codegen at a tree for the duration of a render.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from autonorm import codegen
from autonorm import config as an_config


@contextlib.contextmanager
def templates_from(tree: Path | str, tile_max: int | None = None) -> Iterator[None]:
    """Inside the block, codegen renders from ``tree``.

    Args:
        tree: a directory holding the kernel templates.
        tile_max: the tree's ``codegen.FP32_TILE_MAX`` (read at render time by
            ``codegen.holds_fp32_tile``; 0 for trees from before the fp32 tile), or None to keep
            the working tree's.
    """
    codegen.code_version()  # hash the working tree's templates before the swap (cached)
    saved = an_config.templates_dir, codegen.FP32_TILE_MAX
    an_config.templates_dir = lambda: Path(tree)  # type: ignore[assignment]
    if tile_max is not None:
        codegen.FP32_TILE_MAX = tile_max
    codegen.template_environment.cache_clear()  # the environment is cached per process
    try:
        yield
    finally:
        an_config.templates_dir, codegen.FP32_TILE_MAX = saved  # type: ignore[assignment]
        codegen.template_environment.cache_clear()


def renderer(tree: Path | str) -> Callable[[Any, Any, Any], codegen.RenderedKernel]:
    """A render function (``lab_eval.Render``: config, problem, limits) that renders ``tree``."""

    def render(config: Any, problem: Any, limits: Any) -> codegen.RenderedKernel:
        with templates_from(tree):
            return codegen.render(config, problem, limits)

    return render
