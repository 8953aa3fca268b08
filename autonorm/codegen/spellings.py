"""How the kernel templates spell each dtype in CUDA C++: its type and its conversions.

One table for every family's rendering and for the export launchers.

Pure logic: no CuPy, no GPU.
"""

from __future__ import annotations

CTYPES = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16"}

# The 16-bit types as C sees them: cuda_fp16.h and cuda_bf16.h define __half and __nv_bfloat16
# for C++ only, and these two-byte structs for any compiler (an exported header's C form).
C_CTYPES = {"float32": "float", "float16": "__half_raw", "bfloat16": "__nv_bfloat16_raw"}

TO_FLOAT = {"float32": "a", "float16": "__half2float(a)", "bfloat16": "__bfloat162float(a)"}

FROM_FLOAT = {
    "float32": "a",
    "float16": "__float2half_rn(a)",
    "bfloat16": "__float2bfloat16_rn(a)",
}

# Two fp32 values to one 32-bit pair of a 16-bit type, in one conversion instruction.
FROM_FLOAT2 = {"float32": "", "float16": "__floats2half2_rn", "bfloat16": "__floats2bfloat162_rn"}


def dtype_names(dtype: str) -> dict[str, str]:
    """Return a template's names for ``dtype``.

    They are ``ctype``, ``to_float``, ``from_float`` and ``from_float2``.
    """
    return {
        "ctype": CTYPES[dtype],
        "to_float": TO_FLOAT[dtype],
        "from_float": FROM_FLOAT[dtype],
        "from_float2": FROM_FLOAT2[dtype],
    }


def element_names(dtype: str, basename: str) -> dict[str, str]:
    """Return an exported header's names for ``dtype``: ``elem``, ``c_ctype``.

    A 16-bit export declares its functions with ``<basename>_elem`` (``elem``): CUDA's type in
    C++ and, in C, the two-byte struct CUDA's header gives C (``c_ctype``), so C callers and
    binding generators that parse the header as C can include it. fp32's declarations stay
    ``float``.
    """
    elem = "float" if dtype == "float32" else f"{basename}_elem"
    return {"elem": elem, "c_ctype": C_CTYPES[dtype]}
