"""RMSNorm forward, a kernel family on LayerNorm's kernels.

``y = x / sqrt(mean(x^2) + eps) * w`` over the last dimension, with fp32 statistics. The row
and bulk-copy kernels, their configuration, search space, rules and launch plan are
:mod:`autonorm.ops.layer_norm`'s: the templates take the statistic (``norm``) and the weight's
form (``weight_offset``) from the problem. This package holds what is RMSNorm's own:
:mod:`.problem`, :mod:`.reference` (float64) and :mod:`.family`.
"""
