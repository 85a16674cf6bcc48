"""The network's non-convolution layers as lab kernels: CUDA C compiled at run time with NVRTC,
each with a float64 reference whose bound follows from the op's floating-point error."""

from ..models import LRN, AddKept, Dense, GlobalAvgPool, MaxPool, ReLU, Softmax, Tanh
from ..oracle.lrn import reference_lrn, reference_lrn_max_pool
from .activation import prepare_activation, reference_activation
from .base import LayerOp
from .dense import DensePlan, plan_dense, prepare_dense, reference_dense
from .dense_cublas import prepare_dense_cublas
from .lrn import prepare_lrn, prepare_lrn_max_pool
from .pool import (prepare_global_avg_pool, prepare_max_pool, reference_global_avg_pool,
                   reference_max_pool)
from .residual import AddOp, prepare_add, reference_add
from .softmax import prepare_softmax, reference_softmax



def reference_for(layers: tuple, x, arrays: dict, kept=None):
    """The float64 Reference of a network step of non-conv layers (one layer, or a fused pair:
    activation + max-pool, LRN + max-pool, FC + activation, residual add + activation) on input
    x (and `kept`, a residual add's shortcut), with the error bound of the op that computes
    it."""
    kinds = {ReLU: "relu", Tanh: "tanh"}
    first, last = layers[0], layers[-1]
    activation = next((kinds[type(layer)] for layer in layers if type(layer) in kinds), None)
    if isinstance(first, Dense):
        return reference_dense(x, arrays[f"{first.name}.weight"], arrays[f"{first.name}.bias"],
                               activation)
    if isinstance(first, LRN) and isinstance(last, MaxPool):
        return reference_lrn_max_pool(x, first.size, first.alpha, first.beta, first.k,
                                      last.size, last.step)
    if isinstance(first, LRN):
        return reference_lrn(x, first.size, first.alpha, first.beta, first.k)
    if isinstance(first, AddKept):
        return reference_add(x, kept, activation)
    if isinstance(first, GlobalAvgPool):
        return reference_global_avg_pool(x)
    if isinstance(last, MaxPool):
        return reference_max_pool(x, last.size, last.step, activation, last.pad)
    if isinstance(first, Softmax):
        return reference_softmax(x)
    if activation is not None and len(layers) == 1:
        return reference_activation(x, activation)
    raise TypeError(f"no reference for the layers {layers!r}")


__all__ = [
    "LayerOp", "DensePlan", "plan_dense",
    "prepare_activation", "reference_activation",
    "prepare_dense", "prepare_dense_cublas", "reference_dense",
    "prepare_lrn", "prepare_lrn_max_pool", "reference_lrn", "reference_lrn_max_pool",
    "prepare_max_pool", "reference_max_pool", "prepare_global_avg_pool",
    "reference_global_avg_pool", "AddOp", "prepare_add", "reference_add",
    "prepare_softmax", "reference_softmax", "reference_for",
]
