"""The backward of LayerNorm and RMSNorm as kernel families.

``layer_norm_backward`` and ``rms_norm_backward``: dx of every row, and the weight and bias
gradients summed over the rows in a fixed order, tuned like the forward (docs/backward.md).
"""
