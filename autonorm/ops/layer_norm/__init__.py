"""LayerNorm forward, the first kernel family: the row kernels and the bulk-copy kernel.

``y = (x - mean) / sqrt(var + eps) * weight + bias`` over the last dimension, with fp32
statistics around a per-row shift. The package's modules each hold one part of the family:
:mod:`.problem` (what is normalized), :mod:`.config` (one point of the template family),
:mod:`.plan` (what a configuration derives on a problem), :mod:`.rules` (validity),
:mod:`.space` (enumeration, the default and the search's seeds), :mod:`.codegen` (rendering),
:mod:`.reference` (float64) and :mod:`.verify` (the GPU check).
"""

from autonorm.codegen.kernel import DYNAMIC_MIN_TILES, LaunchPlan, RenderedKernel
from autonorm.dtypes import DTYPES, ITEMSIZE, SHORT_DTYPES, normalize_dtype
from autonorm.errors import ConfigError
from autonorm.ops.base import rows_bucket
from autonorm.ops.layer_norm.codegen import *  # noqa: F403
from autonorm.ops.layer_norm.config import *  # noqa: F403
from autonorm.ops.layer_norm.plan import *  # noqa: F403
from autonorm.ops.layer_norm.problem import Problem
from autonorm.ops.layer_norm.reference import *  # noqa: F403
from autonorm.ops.layer_norm.rules import *  # noqa: F403
from autonorm.ops.layer_norm.space import *  # noqa: F403
from autonorm.ops.layer_norm.verify import *  # noqa: F403
from autonorm.runtime.limits import H200, DeviceLimits
