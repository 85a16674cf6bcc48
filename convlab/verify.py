"""Checking a variant's output against the float64 reference, and saying precisely how it fails."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from .reference import conv2d_float64, max_pool

TOLERANCE = {"fp32": 1e-5, "tf32": 2e-3, "fp16": 1e-2}


def tolerance(precision: str) -> float:
    return TOLERANCE[precision]


def poison(array) -> None:
    """Fill an output buffer with NaN, so an element the kernel never writes cannot pass."""
    array.fill(np.nan)


@dataclass
class Check:
    passed: bool
    max_rel_error: float  # max |got - ref| / max |ref| over the written outputs; inf if any unwritten
    tolerance: float
    reason: str = ""
    unwritten: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


def _index(shape, flat: int) -> str:
    return "y[" + ",".join(str(int(i)) for i in np.unravel_index(flat, shape)) + "]"


def compare(got: np.ndarray, ref: np.ndarray, precision: str) -> Check:
    """max |got - ref| / max |ref| against the precision's tolerance; NaN/inf never passes."""
    tol = tolerance(precision)
    if got.shape != ref.shape:
        return Check(False, float("inf"), tol, f"output shape {got.shape}, expected {ref.shape}")
    got64 = np.asarray(got, dtype=np.float64)
    bad = ~np.isfinite(got64)
    unwritten = int(bad.sum())
    if unwritten:
        first = int(np.flatnonzero(bad)[0])
        return Check(False, float("inf"), tol,
                     f"{unwritten} of {got.size} outputs not written or not finite (first at "
                     f"{_index(got.shape, first)}, expected {ref.flat[first]:.6g}, got {got64.flat[first]})",
                     unwritten)
    scale = float(np.abs(ref).max()) or 1.0
    diff = np.abs(got64 - ref)
    worst = int(diff.argmax())
    err = float(diff.flat[worst]) / scale
    if err > tol:
        wrong = int((diff > tol * scale).sum())
        return Check(False, err, tol,
                     f"max relative error {err:.3g} > {tol:g} at {_index(got.shape, worst)}: expected "
                     f"{ref.flat[worst]:.6g}, got {got64.flat[worst]:.6g} ({wrong} of {got.size} "
                     f"outputs off by more than the tolerance)")
    return Check(True, err, tol)


def reference_output(x: np.ndarray, w: np.ndarray, shape, epilogue: str | None) -> np.ndarray:
    """The float64 result a variant should produce, with the epilogue applied if it has one."""
    ref = conv2d_float64(x, w, shape.stride, shape.pad)
    if epilogue is not None:
        ref = max_pool(np.tanh(ref), 2)
    return ref


def random_problem(shape, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Fresh inputs in [0, 1) like image pixels and zero-mean filters scaled like trained ones."""
    x = rng.random(shape.input_shape, dtype=np.float32)
    fan_in = shape.C * shape.K * shape.K
    w = (rng.standard_normal(shape.weight_shape) / np.sqrt(fan_in)).astype(np.float32)
    return x, w
