"""The grid tune_grid.py tunes: its ops, its shapes, and the list of widely used models' norms.

Pure logic: no GPU. ``autonorm/tuning_db/models.json`` lists the models' hidden sizes and where
each comes from; ``tune_grid.py --models`` tunes those sizes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

from autonorm.ops import registry

NORMS = ("layer_norm", "rms_norm")
MODEL_FIELDS = ("name", "hidden", "norm", "eps", "source")


class GridOp(NamedTuple):
    """An op of the grid: its kernel family, the problem fields it fixes, the models it serves."""

    family: str
    fields: dict[str, Any]
    norm: str  # models.json's norm whose hidden sizes --models tunes for it


# RMSNorm as most models run it: a weight that scales as is. Gemma's 1 + weight is a problem of
# its own (weight_offset), left to `autonorm tune --weight-offset`.
OPS = {
    "layer_norm": GridOp("layer_norm", {}, "layer_norm"),
    "rms_norm": GridOp("rms_norm", {"has_weight": True, "weight_offset": False,
                                    "residual": False}, "rms_norm"),
    "add_rms_norm": GridOp("rms_norm", {"has_weight": True, "weight_offset": False,
                                        "residual": True}, "rms_norm"),
    # LayerNorm after the fused residual add, with weight and bias (autonorm.add_layer_norm).
    "add_layer_norm": GridOp("layer_norm", {"residual": True}, "layer_norm"),
    # The fused adds with a float32 residual stream beside 16-bit x (residual_dtype; no fp32
    # shapes: a float32 x's residual is the plain add's).
    "add_rms_norm_f32res": GridOp("rms_norm", {"has_weight": True, "weight_offset": False,
                                               "residual": True, "residual_dtype": "float32"},
                                  "rms_norm"),
    "add_layer_norm_f32res": GridOp("layer_norm", {"residual": True,
                                                   "residual_dtype": "float32"}, "layer_norm"),
    # The backwards (dx, dweight and dbias in one launch), of the forwards' plain forms.
    "layer_norm_backward": GridOp("layer_norm_backward", {}, "layer_norm"),
    "rms_norm_backward": GridOp("rms_norm_backward", {"has_weight": True,
                                                      "weight_offset": False}, "rms_norm"),
}


class Shape(NamedTuple):
    """One shape of the grid: an op of :data:`OPS` at a dtype, hidden size and row count."""

    op: str
    dtype: str
    hidden: int
    rows: int


def load_models(path: Path) -> list[dict]:
    """Read a list of models' norm shapes (``autonorm/tuning_db/models.json``) and check each.

    Raises:
        OSError: the file cannot be read.
        ValueError: it is not such a list; the message names the first bad entry.

    """
    try:
        models = json.loads(Path(path).read_text())["models"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"{path} is not a JSON object with a 'models' list ({exc})") from exc
    if not isinstance(models, list) or not models:
        raise ValueError(f"{path}: 'models' must be a non-empty list")
    for i, model in enumerate(models):
        name = model.get("name", "?") if isinstance(model, dict) else repr(model)
        where = f"{path}: entry {i} ({name})"
        if not isinstance(model, dict) or any(k not in model for k in MODEL_FIELDS):
            raise ValueError(f"{where} needs the fields {', '.join(MODEL_FIELDS)}")
        hidden, eps = model["hidden"], model["eps"]
        if not isinstance(hidden, int) or isinstance(hidden, bool) or hidden < 1:
            raise ValueError(f"{where}: hidden must be a positive integer, got {hidden!r}")
        if model["norm"] not in NORMS:
            raise ValueError(f"{where}: norm must be one of {', '.join(NORMS)}")
        if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps > 0:
            raise ValueError(f"{where}: eps must be a positive number, got {eps!r}")
        if not str(model["source"]).startswith("https://"):
            raise ValueError(f"{where}: source must be the https URL of the model's config")
    return models


def norm_hidden_sizes(models: list[dict], norm: str = "layer_norm") -> list[int]:
    """Return the hidden sizes of the models of ``norm``, each once, smallest first."""
    return sorted({m["hidden"] for m in models if m["norm"] == norm})


def problem_of(shape: Shape) -> Any:
    """Return the problem a shape tunes (its family's :class:`~autonorm.ops.base.Problem`)."""
    grid_op = OPS[shape.op]
    family = registry.get(grid_op.family)
    return family.problem(hidden=shape.hidden, dtype=shape.dtype, **grid_op.fields)
