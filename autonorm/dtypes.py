"""The dtypes autonorm computes in, their sizes and the names a user may give them.

Pure logic: no CuPy, no GPU.
"""

from __future__ import annotations

from typing import Literal

DTypeName = Literal["float32", "float16", "bfloat16"]

DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16")

ITEMSIZE: dict[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2}

# Short names accepted on the command line and in the Python API.
DTYPE_ALIASES: dict[str, str] = {
    "fp32": "float32", "f32": "float32", "float": "float32", "float32": "float32",
    "fp16": "float16", "f16": "float16", "half": "float16", "float16": "float16",
    "bf16": "bfloat16", "bfloat16": "bfloat16",
}

# The short name of each dtype (kernel names, tables).
SHORT_DTYPES: dict[str, str] = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def normalize_dtype(dtype: object) -> str:
    """Return the canonical dtype name ('float32', 'float16' or 'bfloat16').

    Args:
        dtype: a name such as "bf16", or any object whose ``str()`` or ``name`` is one.

    Raises:
        ValueError: the dtype is not supported.

    """
    name = getattr(dtype, "name", None) or str(dtype)
    name = name.replace("torch.", "").lower()
    try:
        return DTYPE_ALIASES[name]
    except KeyError:
        raise ValueError(
            f"unsupported dtype {dtype!r}: autonorm supports float32, float16 and bfloat16"
        ) from None
