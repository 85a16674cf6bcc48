"""NVTX ranges named after the network's steps, so Nsight Systems shows "conv1", "pool1", ...
on its timeline.

The `nvtx` package (an optional extra) is used when it is installed; without it `annotate` is a
no-op. NVTX calls cost next to nothing when no tool is attached, so the ranges stay on in every
run: `network.annotate = nvtx.annotate`.
"""

from __future__ import annotations

import contextlib
from typing import ContextManager

DOMAIN = "convlab"

_module = None
_looked = False


def _nvtx():
    global _module, _looked
    if not _looked:
        try:
            import nvtx as module
        except ImportError:
            module = None
        _module, _looked = module, True
    return _module


def available() -> bool:
    """Whether the nvtx package is installed (ranges are emitted)."""
    return _nvtx() is not None


def annotate(label: str) -> ContextManager:
    """An NVTX range named `label` in the "convlab" domain, or a no-op without the package."""
    module = _nvtx()
    if module is None:
        return contextlib.nullcontext()
    return module.annotate(message=label, domain=DOMAIN)
