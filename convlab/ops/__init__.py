"""The network's non-convolution layers as lab kernels: CUDA C compiled at run time with NVRTC,
each with a float64 reference whose bound follows from the op's floating-point error."""

from .activation import prepare_activation, reference_activation
from .base import LayerOp
from .dense import DensePlan, plan_dense, prepare_dense, reference_dense
from .dense_cublas import prepare_dense_cublas
from .lrn import prepare_lrn, prepare_lrn_max_pool, reference_lrn, reference_lrn_max_pool
from .pool import prepare_max_pool, reference_max_pool
from .softmax import prepare_softmax, reference_softmax

__all__ = [
    "LayerOp", "DensePlan", "plan_dense",
    "prepare_activation", "reference_activation",
    "prepare_dense", "prepare_dense_cublas", "reference_dense",
    "prepare_lrn", "prepare_lrn_max_pool", "reference_lrn", "reference_lrn_max_pool",
    "prepare_max_pool", "reference_max_pool",
    "prepare_softmax", "reference_softmax",
]
