"""The GPU figures that size work (SM count, shared memory, registers): one record per
architecture, and the current device's own figures when there is one; and the facts a record
keeps of the device it ran on (device_info).

`H100` is the machine convlab builds for and the one its static choices (the pipelined cost
model, tilings measured for the course's layers) were made on: code that plans without a GPU
(the CPU tests, `convlab check`) uses it. `current()` reads the device's figures the way llm.c's
setup_main does, for planners that size a grid to the GPU it runs on (the FC split-K and LRN
launches); without a GPU it is H100.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from . import gpu_available, require_cupy
from .cubin import ARCH_LIMITS, ArchLimits


@dataclass(frozen=True)
class Hardware:
    name: str
    sms: int
    limits: ArchLimits  # per-SM and per-block limits (cubin's occupancy rule uses the same)


H100 = Hardware("NVIDIA H100 SXM (sm_90)", 132, ARCH_LIMITS["sm_90"])


@lru_cache(maxsize=None)
def _device(device_id: int) -> Hardware:
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(device_id)
    name = props["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    arch = f"sm_{props['major']}{props['minor']}"
    limits = replace(ARCH_LIMITS.get(arch, H100.limits), arch=arch,
                     shared_per_sm=int(props["sharedMemPerMultiprocessor"]),
                     shared_per_block_optin=int(props["sharedMemPerBlockOptin"]),
                     registers_per_sm=int(props["regsPerMultiprocessor"]))
    return Hardware(name, int(props["multiProcessorCount"]), limits)


def current() -> Hardware:
    """The current device's figures, or H100's without a GPU."""
    if not gpu_available():
        return H100
    import cupy

    return _device(cupy.cuda.Device().id)


def device_info() -> dict:
    """Name, compute capability, memory and software versions of the current GPU."""
    import cupy

    require_cupy("this command")
    dev = cupy.cuda.Device()
    props = cupy.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    def version(v):
        return f"{v // 1000}.{v % 1000 // 10}"
    return {
        "name": name,
        "compute_capability": f"{props['major']}.{props['minor']}",
        "multiprocessors": props["multiProcessorCount"],
        "memory_gib": round(props["totalGlobalMem"] / 2**30, 1),
        "l2_mib": round(props["l2CacheSize"] / 2**20, 1),
        "pci_bus_id": dev.pci_bus_id,
        "driver": version(cupy.cuda.runtime.driverGetVersion()),
        "cuda_runtime": version(cupy.cuda.runtime.runtimeGetVersion()),
        "cupy": cupy.__version__,
    }
