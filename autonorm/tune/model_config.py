"""The norms a model's Hugging Face style ``config.json`` describes, for ``autonorm tune --config``.

Each config, and each nested one of a composite model (CLIP's text and vision towers, an
encoder and a decoder), gives its hidden size, dtype, norm (RMSNorm or LayerNorm) and eps, from
its keys or its ``model_type`` (docs/tuning.md, "Tuning a model"); :mod:`.plan` turns them into
shapes to tune.

Pure logic: no GPU, no Optuna.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autonorm.dtypes import normalize_dtype

# Where models keep their width, in the order they are tried: DistilBERT's `dim` comes before
# `hidden_dim`, which DistilBERT uses for its feed-forward width.
HIDDEN_KEYS = ("hidden_size", "d_model", "n_embd", "dim", "hidden_dim")

# The key that holds a model's eps, and the norm it implies.
EPS_KEYS = {"rms_norm_eps": "rms_norm", "layer_norm_eps": "layer_norm",
            "layer_norm_epsilon": "layer_norm", "layernorm_epsilon": "layer_norm"}

# Models whose norm is RMSNorm whatever their eps key says (T5 names it layer_norm_epsilon).
RMS_MODEL_TYPES = frozenset({
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma",
    "gemma2", "gemma3", "gemma3_text", "phi3", "deepseek_v2", "deepseek_v3", "t5", "mt5",
})

# RMSNorm models that scale by 1 + weight (Gemma's form: the weight stored as its offset from one).
OFFSET_MODEL_TYPES = frozenset({"gemma", "gemma2", "gemma3", "gemma3_text"})

# LayerNorm models whose config.json holds no eps: the eps their code builds the norm with
# (autonorm/tuning_db/models.json's eps_from).
LAYER_NORM_EPS = {"bart": 1e-5, "mbart": 1e-5, "whisper": 1e-5, "opt": 1e-5,
                  "distilbert": 1e-12, "siglip": 1e-6, "siglip_vision_model": 1e-6,
                  "siglip_text_model": 1e-6}

# Nested configurations of composite models (CLIP's text and vision towers, encoder-decoders).
SUB_CONFIG_KEYS = ("encoder", "decoder")


class PlanError(ValueError):
    """A plan option or model config that cannot be read; ``option`` names the option."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(message)
        self.option = option


@dataclass(frozen=True)
class ModelNorm:
    """One norm a model config describes.

    Attributes:
        op: the kernel family of the norm (``layer_norm``, ``rms_norm``).
        hidden: the size it normalizes over.
        dtype: the config's torch_dtype, canonical; None when it names none.
        eps: the norm's eps; None when neither the config nor its model type says it.
        where: the config (and nested config) it was read from.
        weight_offset: the norm scales by 1 + weight (Gemma's RMSNorm).

    """

    op: str
    hidden: int
    dtype: str | None
    eps: float | None
    where: str
    weight_offset: bool = False



def _dtype_of(config: dict[str, Any], where: str) -> str | None:
    for key in ("torch_dtype", "dtype"):
        value = config.get(key)
        if value is None or value == "auto":
            continue
        try:
            return normalize_dtype(value)
        except ValueError:
            raise PlanError("--config", f"{where}: {key} {value!r} is not a dtype autonorm "
                                        "tunes (float32, float16, bfloat16); give --dtype"
                            ) from None
    return None


def _hidden_of(config: dict[str, Any], where: str) -> int | None:
    for key in HIDDEN_KEYS:
        if key in config:
            value = config[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PlanError("--config", f"{where}: {key} must be a positive integer, "
                                            f"got {json.dumps(value)}")
            return value
    return None


def _norm_of(config: dict[str, Any], model_type: str, where: str) -> tuple[str, float | None]:
    """Say the norm of one (nested) config and its eps, from its keys or its model type."""
    eps_key = next((key for key in EPS_KEYS if key in config), None)
    eps = config.get(eps_key) if eps_key else LAYER_NORM_EPS.get(model_type)
    if eps is not None and (isinstance(eps, bool) or not isinstance(eps, (int, float))
                            or not math.isfinite(eps) or eps <= 0):
        raise PlanError("--config", f"{where}: {eps_key} must be a positive number, "
                                    f"got {json.dumps(eps)}")
    if model_type in RMS_MODEL_TYPES:
        return "rms_norm", eps
    if eps_key is not None:
        return EPS_KEYS[eps_key], eps
    if model_type in LAYER_NORM_EPS:
        return "layer_norm", eps
    raise PlanError("--config", f"{where}: cannot tell its norm (no {', '.join(EPS_KEYS)}, "
                                f"model_type {model_type or 'missing'}); give --op")


def norms_of_config(config: Any, name: str, *, op: str | None = None) -> list[ModelNorm]:
    """Return the norms a parsed Hugging Face style ``config.json`` describes.

    The config and each nested one (``text_config``, ``vision_config``, ``encoder``, ...) with
    a hidden size give one norm; a nested config takes its parent's dtype and model type
    where it names none.

    Args:
        config: the parsed JSON.
        name: what to call it in messages (its path).
        op: the norm to assume (``--op``), the eps still read where the config tells it;
            None: read the norm from the config.

    Raises:
        PlanError: not a JSON object, no hidden size anywhere, a value of the wrong type, a
            dtype autonorm does not tune, or a norm it cannot tell (without ``op``).

    """
    if not isinstance(config, dict):
        raise PlanError("--config", f"{name}: not a JSON object")
    found: list[ModelNorm] = []

    def visit(node: dict[str, Any], where: str, dtype: str | None, model_type: str) -> None:
        dtype = _dtype_of(node, where) or dtype
        kind = node.get("model_type")
        model_type = kind if isinstance(kind, str) else model_type
        hidden = _hidden_of(node, where)
        if hidden is not None:
            try:
                norm, eps = _norm_of(node, model_type, where)
            except PlanError:
                if op is None:
                    raise
                norm, eps = op, None  # --op names the norm the config does not tell
            norm = op or norm
            offset = norm == "rms_norm" and model_type in OFFSET_MODEL_TYPES
            found.append(ModelNorm(norm, hidden, dtype, eps, where, offset))
        for key, value in node.items():
            if isinstance(value, dict) and (key.endswith("_config") or key in SUB_CONFIG_KEYS):
                visit(value, f"{where}:{key}", dtype, model_type)

    visit(config, name, None, "")
    if not found:
        raise PlanError("--config", f"{name}: no hidden size ({', '.join(HIDDEN_KEYS)})")
    return found


def backward_norms(norms: Sequence[ModelNorm]) -> list[ModelNorm]:
    """Return the backward of each of a model's norms: the same shape, op ``<op>_backward``.

    Training runs a model's norms forward and backward; ``autonorm tune --backward --config``
    tunes the backward kernels of the norms the config describes, Gemma's ``1 + weight`` kept.
    """
    return [dataclasses.replace(n, op=f"{n.op}_backward") for n in norms]


def read_model_config(path: str | Path, *, op: str | None = None) -> list[ModelNorm]:
    """Read a model's ``config.json`` and return its norms (:func:`norms_of_config`).

    Raises:
        PlanError: the file cannot be read or parsed, or :func:`norms_of_config` refuses it.

    """
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise PlanError("--config", f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}"
                        ) from None
    try:
        config = json.loads(text)
    except ValueError as exc:
        raise PlanError("--config", f"{path}: not JSON: {exc}") from None
    return norms_of_config(config, str(path), op=op)


def read_norms(paths: Sequence[str | Path], *, op: str | None = None,
               backward: bool = False) -> list[ModelNorm]:
    """Read every model config of ``paths`` and return their norms, in order.

    Args:
        paths: the models' ``config.json`` files (``--config``).
        op: the op the norms are read as (``--op``), or None for what each config says; a
            backward family reads as its forward, whose name says whether Gemma's
            ``1 + weight`` applies.
        backward: return the backward of each norm (:func:`backward_norms`).

    Raises:
        PlanError: a file :func:`read_model_config` refuses.
    """
    forward = op.removesuffix("_backward") if op else None
    norms = [n for path in paths for n in read_model_config(path, op=forward)]
    return backward_norms(norms) if backward else norms
