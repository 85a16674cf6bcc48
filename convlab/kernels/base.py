"""What every convolution variant provides, and the helpers their launch code shares.

A variant is its CUDA C source (a string at the top of its module) plus launch code. `prepare`
compiles and specialises once for one layer shape and one weight tensor, and returns an `Op`
that only launches: nothing inside an Op call compiles, allocates or copies weights, so timing
an Op times the kernel.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..jit import build_options, load_module
from ..shapes import ConvShape

TANH_POOL = "tanh-pool"  # conv, then tanh, then 2x2/2 max-pool: the ECE408 block


@dataclass(frozen=True)
class Support:
    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


SUPPORTED = Support(True)
PLAIN_ONLY = Support(False, "implements stride 1 and no padding only")


def pooled_shape(shape: ConvShape) -> tuple[int, int, int, int]:
    return (shape.B, shape.M, shape.Ho // 2, shape.Wo // 2)


@dataclass
class Op:
    """A prepared convolution: `op(x, y)` runs it on device (or host) arrays."""

    launch: Callable[[object, object], object]
    output_shape: tuple[int, ...]
    compile_seconds: float = 0.0
    epilogue: str | None = None
    # Variants that cannot write into a caller's buffer (cuDNN through PyTorch) return their own.
    _result: object = None

    def __call__(self, x, y):
        self._result = self.launch(x, y)

    def output(self, y):
        """The array holding the last call's result: y itself unless the launch returned another."""
        return y if self._result is None else self._result


class Variant:
    name: str = ""
    summary: str = ""
    precision: str = "fp32"
    source: str = ""
    kernels: tuple[str, ...] = ("conv_forward",)
    epilogues: tuple[str, ...] = ()  # epilogues prepare() accepts besides a plain conv
    fuses_in_network: bool = False  # the network hands it conv+tanh+pool where the model has that
    on_gpu: bool = True

    def supports(self, shape: ConvShape) -> Support:
        return SUPPORTED if shape.is_plain else PLAIN_ONLY

    def supports_epilogue(self, shape: ConvShape, epilogue: str) -> Support:
        if epilogue not in self.epilogues:
            return Support(False, f"'{self.name}' has no {epilogue} epilogue")
        if epilogue == TANH_POOL and (shape.Ho < 2 or shape.Wo < 2):
            return Support(False, "a 2x2 pool needs an output of at least 2x2")
        return Support(True)

    def defines(self, shape: ConvShape, epilogue: str | None = None) -> dict[str, int]:
        """Compile-time constants for this shape; empty for variants that take sizes at run time."""
        return {}

    def compile_options(self, shape: ConvShape, epilogue: str | None = None) -> tuple[str, ...]:
        return build_options(self.defines(shape, epilogue))

    def compile(self, shape: ConvShape, epilogue: str | None = None,
                kernels: tuple[str, ...] | None = None):
        return load_module(self.name, self.source, self.compile_options(shape, epilogue),
                           kernels or self.kernels)

    def prepare(self, shape: ConvShape, weights: np.ndarray, epilogue: str | None = None) -> Op:
        raise NotImplementedError

    def output_shape(self, shape: ConvShape, epilogue: str | None = None) -> tuple[int, ...]:
        return pooled_shape(shape) if epilogue == TANH_POOL else shape.output_shape


def blocks(n: int, per_block: int) -> int:
    return (n + per_block - 1) // per_block


def device_weights(weights: np.ndarray):
    import cupy

    return cupy.asarray(np.ascontiguousarray(weights, dtype=np.float32))


def check_epilogue(variant: Variant, epilogue: str | None) -> None:
    if epilogue is not None and epilogue not in variant.epilogues:
        raise ValueError(f"variant '{variant.name}' has no '{epilogue}' epilogue")


class ConstantWeights:
    """Weights held in a module's __constant__ array.

    Modules are cached per source and shape, so two prepared ops of one shape (two models, or a
    test's fresh weights) share one constant bank; each op re-uploads its weights when another
    op wrote the bank last. That happens outside any timing loop, which runs one op only.
    """

    _owner: dict[int, int] = {}
    _tokens = itertools.count()

    def __init__(self, module, symbol: str, weights: np.ndarray):
        self.pointer = module.get_global(symbol)
        self.weights = device_weights(weights)
        self.module_key = id(module)  # modules live in the JIT cache for the whole process
        self.token = next(self._tokens)

    def ensure(self) -> None:
        if ConstantWeights._owner.get(self.module_key) != self.token:
            self.pointer.copy_from_device(self.weights.data, self.weights.nbytes)
            ConstantWeights._owner[self.module_key] = self.token
