"""What every non-convolution layer op provides, and the helpers the op modules share.

An op module holds CUDA C source as a string, a pure-Python plan that turns a layer's shape into
kernels (source, compile-time defines, grid, block), a `prepare_*` function that compiles the
plan once and returns a `LayerOp` that only launches, and a float64 `reference_*` whose
`Reference` carries the rounding-error bound the op's output must meet. The plans need neither
CuPy nor a GPU, so CPU-only CI compiles every kernel configuration a plan can choose with NVRTC.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..gpu.elements import FLOAT32
from ..gpu.jit import build_options, load_module
from ..oracle.verify import ALLOWED_ULPS
from ..shapes import LAYOUTS, NCHW

# Activations an op can apply to its result, as the ACT compile-time constant.
ACTIVATIONS = {None: 0, "relu": 1, "tanh": 2}
ACTIVATION_LABELS = {"relu": "ReLU", "tanh": "tanh"}

# |tanh| < 1 (tanhf returns at most 1.0), where an ulp is at most 2^-24: the allowed tanhf error
# as an absolute term.
TANH_ABSOLUTE = ALLOWED_ULPS["tanhf"] * 2.0 ** -24

# One source fragment every op that applies an activation includes; ACT selects it at compile time.
ACTIVATION_SOURCE = r"""
// ACT: 0 none, 1 ReLU, 2 tanh (CUDA's tanhf, not a fast approximation: within 2 ulps).
__device__ __forceinline__ float activate(float v)
{
#if ACT == 1
    return fmaxf(v, 0.0f);
#elif ACT == 2
    return tanhf(v);
#else
    return v;
#endif
}
"""


@dataclass
class LayerOp:
    """A prepared layer: `op(x, y)` launches its kernels on device arrays on the current stream.

    Nothing inside a call compiles, allocates, copies weights or synchronises, so an op can be
    timed with CUDA events and captured into a CUDA graph. Like a conv variant's kernels.Op, it
    is what a network step launches (net.network.StepOp); the difference is how one is made: a
    conv variant is a registered `Variant` the user picks, a layer op comes from the one
    `prepare_*` function of its layer. `extra_kernels` names the kernels a
    call launches after `kernel` (split-K's reduction, the bias epilogue after cuBLAS), so a
    profile can map those to this op as well.
    """

    name: str  # what tables show, e.g. "max-pool 3x3/2", "FC 9216->4096 + ReLU"
    category: str  # pool, lrn, fc, softmax, activation (profile categories)
    kernel: str  # the CUDA kernel function launched (first, where there are several)
    launch: Callable[[object, object], None]
    output_shape: tuple[int, ...]
    compile_seconds: float = 0.0
    extra_kernels: tuple[str, ...] = ()
    capturable: bool = True  # launches on the given buffers only
    layout: str = NCHW  # the memory format of its 4-D input and output (shapes.NCHW / NHWC)
    output_dtype: np.dtype = FLOAT32

    def __call__(self, x, y):
        self.launch(x, y)


@dataclass(frozen=True)
class KernelSpec:
    """One kernel as NVRTC sees it, with its launch geometry: what prepare compiles and launches
    and what the CPU tests compile with compile_cubin."""

    module: str  # the name the JIT caches and reports it under, e.g. "ops.pool"
    function: str  # extern "C" kernel name
    source: str
    defines: tuple[tuple[str, int], ...]
    grid: tuple[int, ...]
    block: tuple[int, ...]

    @property
    def options(self) -> tuple[str, ...]:
        return build_options(dict(self.defines))


def spec(module: str, function: str, source: str, defines: dict[str, int], grid: tuple[int, ...],
         block: int) -> KernelSpec:
    return KernelSpec(module, function, source, tuple(sorted(defines.items())), tuple(grid),
                      (block,))


@dataclass
class Compiled:
    """A plan's kernels loaded on the device: each KernelSpec with its cupy.RawKernel."""

    kernels: list[tuple[KernelSpec, object]]
    seconds: float


def compile_specs(specs: list[KernelSpec]) -> Compiled:
    """Compile (or fetch from the JIT cache) every kernel of a plan, outside any timed region."""
    loaded, seconds = [], 0.0
    for s in specs:
        compiled = load_module(s.module, s.source, s.options, (s.function,))
        loaded.append((s, compiled.module.get_function(s.function)))
        seconds += compiled.seconds
    return Compiled(loaded, seconds)


def ceil_div(n: int, d: int) -> int:
    return -(-n // d)


def check_layout(layout: str) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; known: {', '.join(LAYOUTS)}")
    return layout


def check_activation(activation: str | None) -> int:
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; known: None, "
                         f"{', '.join(a for a in ACTIVATIONS if a)}")
    return ACTIVATIONS[activation]


def activation_label(activation: str | None) -> str:
    return ACTIVATION_LABELS[activation] if activation else ""


def check_shape(shape, ndim: int, what: str) -> tuple[int, ...]:
    shape = tuple(int(v) for v in shape)
    if len(shape) != ndim or min(shape) < 1:
        raise ValueError(f"{what} needs a shape of {ndim} positive sizes, got {shape}")
    return shape


def check_int32(n: int, what: str) -> None:
    """Offsets the kernels keep in 32 bits (within one image or one weight row)."""
    if n >= 2 ** 31:
        raise ValueError(f"{what} has {n} elements; the kernels index them in 32 bits")


def apply_activation(values: np.ndarray, activation: str | None) -> np.ndarray:
    """The float64 definition of each activation."""
    if activation == "relu":
        return np.maximum(values, 0.0)
    if activation == "tanh":
        return np.tanh(values)
    return values


def activation_absolute(activation: str | None) -> float:
    """What an activation adds to an element's bound. ReLU is exact and tanh 1-Lipschitz, so an
    error in the activation's argument passes through no larger; tanhf adds its own error."""
    return TANH_ABSOLUTE if activation == "tanh" else 0.0
