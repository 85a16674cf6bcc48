"""Compile a variant's CUDA C source for one layer shape, and cache the result.

On a GPU machine the source goes through cupy.RawModule (NVRTC inside CuPy) with the shape's
compile-time constants as -D defines; a variant that names an architecture-specific target
(sm_90a, for wgmma) is compiled by NVRTC directly into an on-disk cubin cache and loaded from
there. On any machine, `compile_cubin` runs the same source and options through NVRTC directly
(NVIDIA's cuda-bindings), for sm_90 (or the variant's target), so CPU-only CI proves that
every variant compiles.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Mapping

from ..errors import ConvlabError, KernelCompileError
from . import cache_dir, require_cupy

CHECK_ARCH = "sm_90"
BASE_OPTIONS = ("-std=c++17",)


def build_options(defines: Mapping[str, int | float | str]) -> tuple[str, ...]:
    """NVRTC options for a set of compile-time constants, in a stable order (a cache key)."""
    return BASE_OPTIONS + tuple(f"-D{name}={value}" for name, value in sorted(defines.items()))


@dataclass
class CompiledModule:
    module: object  # cupy.RawModule
    seconds: float  # NVRTC compile + module load, 0.0 when it came from this process's cache
    cached: bool


_modules: dict[tuple[str, str, tuple[str, ...], str | None], object] = {}


def load_module(variant: str, source: str, options: tuple[str, ...],
                kernels: tuple[str, ...], arch: str | None = None) -> CompiledModule:
    """Compile (or fetch from the cache) and load a module, resolving `kernels` so that
    compilation and module load both happen here, never inside a timed region. With `arch`
    (sm_90a, for wgmma) NVRTC builds the cubin for that target through
    `cubin_file`; otherwise CuPy's RawModule builds it for the current GPU."""
    key = (variant, source, options, arch)
    if key in _modules:
        return CompiledModule(_modules[key], 0.0, True)
    cupy = require_cupy(f"kernel '{variant}'")
    start = time.perf_counter()
    if arch is None:
        module = cupy.RawModule(code=source, options=options)
        try:
            module.compile()
            for name in kernels:
                module.get_function(name)
        except cupy.cuda.compiler.CompileException as exc:
            raise KernelCompileError(variant, str(exc), options) from None
    else:
        module = cupy.RawModule(path=str(cubin_file(variant, source, options, arch)))
        for name in kernels:
            module.get_function(name)
    seconds = time.perf_counter() - start
    _modules[key] = module
    return CompiledModule(module, seconds, False)


def cubin_cache_dir() -> Path:
    return cache_dir() / "cubin"


def private_temp_dir() -> Path | None:
    """This user's folder for cubins in the temporary directory, made readable by this user
    only; None where that name is taken by someone else's (another user could plant a cubin
    under the name a kernel's would have)."""
    user = f"-{os.getuid()}" if hasattr(os, "getuid") else ""
    path = Path(tempfile.gettempdir()) / f"convlab-cubin{user}"
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        info = path.stat()
    except OSError:
        return None
    if hasattr(os, "getuid") and (info.st_uid != os.getuid() or info.st_mode & 0o077):
        return None
    return path


def cubin_file(variant: str, source: str, options: tuple[str, ...], arch: str) -> Path:
    """compile_cubin into a file of an on-disk cache keyed by the source, options, target and
    NVRTC version (what CuPy's kernel cache does for RawModule): the tuner's compile processes
    fill it, its measurements load from it. Written to a temporary file and renamed into place,
    so a reader never sees half a cubin; without a writable cache, private_temp_dir()."""
    text = "\0".join((source, *options, arch, ".".join(map(str, nvrtc_version()))))
    name = f"{hashlib.sha256(text.encode()).hexdigest()[:32]}.cubin"
    cache = cubin_cache_dir()
    if (cache / name).is_file():
        return cache / name
    fallback = private_temp_dir()
    if fallback is not None and (fallback / name).is_file():
        return fallback / name
    cubin = compile_cubin(variant, source, options, arch)
    for directory in (cache, fallback):
        if directory is None:
            continue
        path = directory / name
        temporary = path.with_name(f"{name}.{os.getpid()}.{threading.get_ident()}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            temporary.write_bytes(cubin)
            os.replace(temporary, path)
            return path
        except OSError:
            continue
        finally:
            with contextlib.suppress(OSError):
                temporary.unlink(missing_ok=True)
    raise ConvlabError(f"kernel '{variant}': nowhere to write its cubin ({cache} and a private "
                       f"folder in the temporary directory are not writable)")


# --- NVRTC without CuPy or a GPU (the CPU-side compile check) ---------------------------------

@lru_cache(maxsize=1)
def _nvrtc():
    """NVIDIA's NVRTC bindings (cuda-bindings), once they have found a libnvrtc: CUDA 13's or
    CUDA 12's, whichever a pip wheel or the toolkit put on this machine."""
    missing = 'NVRTC not found: pip install -e ".[dev]" installs it (cuda-bindings and NVRTC)'
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        raise ConvlabError(missing) from None
    try:
        nvrtc.nvrtcVersion()
    except RuntimeError as exc:  # cuda.pathfinder found no libnvrtc
        raise ConvlabError(f"{missing}: {exc}") from None
    return nvrtc


def _checked(program: str, options: tuple[str, ...], result):
    """The values of an NVRTC call's (status, *values), or KernelCompileError naming the
    status when it is not success."""
    status, *values = result
    if status != _nvrtc().nvrtcResult.NVRTC_SUCCESS:
        name = _nvrtc().nvrtcGetErrorString(status)[1].decode()
        raise KernelCompileError(program, f"NVRTC returned {name}", options)
    if len(values) < 2:
        return values[0] if values else None
    return tuple(values)


def nvrtc_version() -> tuple[int, int]:
    return _checked("nvrtc", (), _nvrtc().nvrtcVersion())


def supported_archs() -> list[int]:
    """The compute capabilities this NVRTC builds for, as 75, 80, 90, ..."""
    return list(_checked("nvrtc", (), _nvrtc().nvrtcGetSupportedArchs()))


ARCH_PATTERN = re.compile(r"(sm|compute)_(\d+)[af]?")


def check_arch(arch: str, option: str = "--arch") -> str:
    """`arch` when NVRTC builds for it (sm_90, sm_90a, compute_90), else a ConvlabError that
    names `option` and the architectures there are."""
    supported = supported_archs()
    match = ARCH_PATTERN.fullmatch(arch)
    if match and int(match.group(2)) in supported:
        return arch
    major, minor = nvrtc_version()
    names = ", ".join(f"sm_{a}" for a in supported)
    raise ConvlabError(f"{option} '{arch}': NVRTC {major}.{minor} builds for {names} (an 'a' "
                       f"suffix, e.g. sm_90a, adds the architecture-specific instructions)")


@dataclass
class NvrtcResult:
    cubin: bytes | None  # None when compilation failed
    log: str  # NVRTC's messages, on success too (warnings, ptxas -v when asked for)


def nvrtc_compile(program: str, source: str, options: tuple[str, ...],
                  arch: str = CHECK_ARCH) -> NvrtcResult:
    """NVRTC for `arch`, naming the program `program` (its messages read `program(LINE): ...`)."""
    nvrtc = _nvrtc()
    argv = [option.encode() for option in (*options, f"-arch={arch}")]
    handle = _checked(program, options,
                      nvrtc.nvrtcCreateProgram(source.encode(), program.encode(), 0, [], []))
    # NVRTC writes into the buffers it is handed: they are bytearrays, never bytes (a bytes
    # object of one byte is CPython's shared singleton, and an empty log is one byte long).
    try:
        status, = nvrtc.nvrtcCompileProgram(handle, len(argv), argv)
        log = bytearray(_checked(program, options, nvrtc.nvrtcGetProgramLogSize(handle)))
        _checked(program, options, nvrtc.nvrtcGetProgramLog(handle, log))
        text = log.rstrip(b"\0").decode(errors="replace")
        if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            return NvrtcResult(None, text)
        cubin = bytearray(_checked(program, options, nvrtc.nvrtcGetCUBINSize(handle)))
        _checked(program, options, nvrtc.nvrtcGetCUBIN(handle, cubin))
        return NvrtcResult(bytes(cubin), text)
    finally:
        nvrtc.nvrtcDestroyProgram(handle)


def compile_cubin(variant: str, source: str, options: tuple[str, ...],
                  arch: str = CHECK_ARCH) -> bytes:
    """Compile with NVRTC for `arch` and return the cubin; KernelCompileError carries the log."""
    result = nvrtc_compile(f"{variant}.cu", source, options, arch)
    if result.cubin is None:
        raise KernelCompileError(variant, result.log, tuple(options) + (f"-arch={arch}",))
    return result.cubin
