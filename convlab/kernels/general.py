"""What the conv variants share to run general layers: stride, zero padding, groups, a bias and
a fused ReLU, all as compile-time switches.

Every switch is a -D define whose plain value (STRIDE 1, PAD 0, GROUPS 1, HAS_BIAS 0, RELU 0)
lets the compiler fold the general code away, so the course's layers compile to the same
instructions as before the generalisation.
"""

from __future__ import annotations

import numpy as np

from ..shapes import ConvShape
from .base import RELU, device_weights

# The store's epilogue, included by every source: the layer's bias, then the fused ReLU. For a
# plain conv both switches are 0 and the function is the identity.
EPILOGUE_SOURCE = r"""
__device__ __forceinline__ float finish_value(float v, float b)
{
    if (HAS_BIAS) v += b;
    // not fmaxf: a NaN (an element computed wrong) stays visible
    if (RELU) v = v < 0.0f ? 0.0f : v;
    return v;
}

__device__ __forceinline__ float finish_output(float v, const float* __restrict__ bias, int m)
{
    return finish_value(v, HAS_BIAS ? __ldg(bias + m) : 0.0f);
}
"""


def layer_defines(shape: ConvShape, epilogue: str | None) -> dict[str, int]:
    """The general-layer switches for this shape and epilogue."""
    return {"STRIDE": shape.stride, "PAD": shape.pad, "GROUPS": shape.groups,
            "HAS_BIAS": int(shape.bias), "RELU": int(epilogue == RELU)}


def device_bias(bias: np.ndarray | None):
    """The bias operand: the layer's bias on the device, or one zero that is never read (kernels
    compiled with HAS_BIAS 0 do not touch it) so every launch passes the same arguments."""
    return device_weights(np.zeros(1, np.float32) if bias is None else bias)
