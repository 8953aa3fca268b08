"""autonorm: a code-generating CUDA autotuner for LayerNorm and RMSNorm.

``import autonorm`` works on a machine without a GPU: CuPy is imported only when a kernel is
compiled or launched.

Run from the parent directory of a checkout named ``autonorm``, ``import autonorm`` finds this
package, installed or installed editable from the checkout; an install reached only through an
import hook finds the checkout's root instead (then ``autonorm.layer_norm`` is missing), which
the command line reports and :mod:`autonorm.checkout` explains.
"""

from __future__ import annotations

__version__ = "0.1.0"

from typing import TYPE_CHECKING  # noqa: E402

from autonorm.errors import AutonormError  # noqa: E402

if TYPE_CHECKING:
    # What the lazy attributes below are, for type checkers (the package ships py.typed);
    # at run time each loads on first use.
    from autonorm.api import layer_norm, rms_norm
    from autonorm.api_add import add_layer_norm, add_rms_norm
    from autonorm.api_backward import layer_norm_backward, rms_norm_backward
    from autonorm.tune.first_use import tune_on_first_use

__all__ = [
    "AutonormError",
    "__version__",
    "add_layer_norm",
    "add_rms_norm",
    "layer_norm",
    "layer_norm_backward",
    "rms_norm",
    "rms_norm_backward",
    "tune_on_first_use",
]


def __getattr__(name: str):  # noqa: ANN202 - lazy attribute access (PEP 562)
    if name == "layer_norm":
        from autonorm.api import layer_norm

        return layer_norm
    if name == "rms_norm":
        from autonorm.api import rms_norm

        return rms_norm
    if name in ("layer_norm_backward", "rms_norm_backward"):
        from autonorm import api_backward

        return getattr(api_backward, name)
    if name == "add_rms_norm":
        from autonorm.api_add import add_rms_norm

        return add_rms_norm
    if name == "add_layer_norm":
        from autonorm.api_add import add_layer_norm

        return add_layer_norm
    if name == "tune_on_first_use":
        from autonorm.tune.first_use import tune_on_first_use

        return tune_on_first_use
    raise AttributeError(f"module 'autonorm' has no attribute {name!r}")
