"""Finding CuPy and a usable GPU, with messages that say what to do when either is missing; and
where convlab keeps what it measured or built for this machine (cache_dir)."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from ..errors import GPUUnavailable

INSTALL_HINT = ('install CuPy for your CUDA major: pip install -e ".[cuda12]" or '
                'pip install -e ".[cuda13]"')


@lru_cache(maxsize=1)
def _probe() -> tuple[object | None, str]:
    try:
        import cupy
    except ImportError:
        return None, f"CuPy is not installed ({INSTALL_HINT})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDARuntimeError without a driver, OSError without libcuda
        return None, f"CuPy found no usable CUDA GPU ({type(exc).__name__}: {exc})"
    if count < 1:
        return None, "CuPy found no CUDA GPU on this machine"
    return cupy, ""


def gpu_available() -> bool:
    return _probe()[0] is not None


def unavailable_reason() -> str:
    return _probe()[1]


def require_cupy(what: str = "this command"):
    """CuPy with a usable GPU behind it, or GPUUnavailable saying what to install or use instead."""
    cupy, reason = _probe()
    if cupy is None:
        raise GPUUnavailable(f"{what} needs a CUDA GPU: {reason}.")
    return cupy


def compute_capability() -> tuple[int, int] | None:
    """The current GPU's (major, minor), or None without a usable GPU."""
    cupy = _probe()[0]
    if cupy is None:
        return None
    return _capability(cupy.cuda.Device().id)


@lru_cache(maxsize=None)
def _capability(device_id: int) -> tuple[int, int]:
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(device_id)
    return props["major"], props["minor"]


def cache_dir() -> Path:
    """Device ceilings, tunings, compiled cubins and float64 references: CONVLAB_CACHE_DIR,
    default ~/.cache/convlab."""
    return Path(os.environ.get("CONVLAB_CACHE_DIR", Path.home() / ".cache" / "convlab"))
