"""`convlab check FILE`: compile a kernel file for each layer it would run, show the compiler's
messages at the user's own file and line, and what each kernel costs in registers, shared and
local memory, spills and occupancy. Needs NVRTC, not a GPU."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ..gpu import cubin, gpu_available
from ..gpu.jit import CHECK_ARCH, NvrtcResult, check_arch, nvrtc_compile
from ..kernels.base import Support
from ..shapes import ConvShape
from ..tables import Col, fitted_table
from .kernelfile import LINEINFO, KernelFile, load_kernel_file


@dataclass
class KernelReport:
    resources: cubin.KernelResources
    occupancy: cubin.Occupancy | None
    note: str = ""  # why occupancy is missing

    def as_dict(self) -> dict:
        return {"resources": self.resources.as_dict(),
                "occupancy": self.occupancy.as_dict() if self.occupancy else None,
                "note": self.note}


@dataclass
class LayerReport:
    layer: str
    shape: ConvShape
    support: Support
    options: tuple[str, ...] = ()
    compiled: bool = False
    kernels: list[KernelReport] = field(default_factory=list)


@dataclass
class CheckReport:
    path: Path
    arch: str
    kernel: KernelFile
    layers: list[LayerReport]
    messages: list[str]  # compiler errors and warnings, located in the user's files

    @property
    def runnable(self) -> bool:
        """Whether any layer can run the kernel at all."""
        return any(layer.support for layer in self.layers)

    @property
    def ok(self) -> bool:
        return self.runnable and all(layer.compiled for layer in self.layers if layer.support)


def target_arch() -> str:
    """The GPU's architecture when there is one, else sm_90 (what convlab builds for)."""
    if not gpu_available():
        return CHECK_ARCH
    import cupy

    return f"sm_{cupy.cuda.Device().compute_capability}"


def locate_messages(log: str, program: str, display: str, offset: int) -> str:
    """NVRTC names lines `program(LINE)`; rewrite them as `display:LINE` in the user's file."""
    pattern = re.compile(r"(?m)^[^\n(]*?" + re.escape(program) + r"\((\d+)\)")
    return pattern.sub(lambda m: f"{display}:{int(m.group(1)) + offset}", log)


def _launch(variant, shape: ConvShape, kernel: cubin.KernelResources) -> tuple[int | None, int | None, str]:
    """(threads per block, dynamic shared bytes, note) of a launch, as far as they are known."""
    hook = getattr(variant, "launch_resources", None)
    if hook is not None:
        threads, shared = hook(shape)
        return threads, shared, ""
    if re.search(r"extern\s+__shared__", variant.source):
        return kernel.max_threads, None, ("dynamic shared memory unknown: define "
                                          "launch_resources(shape, epilogue) in the .py")
    if kernel.max_threads is None:
        return None, 0, ("block size unknown: give the kernel __launch_bounds__ or define "
                         "launch_resources(shape, epilogue) in the .py")
    return kernel.max_threads, 0, "block size taken from __launch_bounds__"


def check_file(path: str | Path, shapes: dict[str, ConvShape], arch: str | None = None) -> CheckReport:
    """Compile the kernel file for every layer shape it supports and report its resources:
    for `arch`, else the target its variant names (sm_90a for a wgmma rung's), else the GPU's."""
    kernel = load_kernel_file(path)
    variant = kernel.variant
    arch = check_arch(arch) if arch else (variant.arch or target_arch())
    limits = cubin.ARCH_LIMITS.get(arch.rstrip("af"))  # sm_90a has sm_90's limits
    display, offset = kernel.source_location()
    program = Path(display).name if not display.startswith("<") else f"{variant.name}.cu"
    compiled: dict[tuple[str, ...], NvrtcResult] = {}
    messages: list[str] = []
    layers = []
    for layer, shape in shapes.items():
        support = variant.supports(shape)
        report = LayerReport(layer, shape, support)
        layers.append(report)
        if not support:
            continue
        options = tuple(variant.compile_options(shape))
        if LINEINFO not in options:
            options += (LINEINFO,)
        report.options = options
        if options not in compiled:
            result = nvrtc_compile(program, variant.source, options + (cubin.PTXAS_VERBOSE,), arch)
            compiled[options] = result
            text = locate_messages(cubin.strip_ptxas_report(result.log), program, display, offset)
            if text and text not in messages:
                messages.append(text)
        result = compiled[options]
        if result.cubin is None:
            continue
        report.compiled = True
        for resources in cubin.resources(result).values():
            threads, shared, note = _launch(variant, shape, resources)
            occ = None
            if limits is None:
                note = f"no occupancy limits known for {arch}"
            elif threads is not None and shared is not None:
                occ = cubin.occupancy(resources, threads, shared, limits)
            report.kernels.append(KernelReport(resources, occ, note))
    return CheckReport(Path(path), arch, kernel, layers, messages)


# --- presenting a report -------------------------------------------------------------------------

def _kb(nbytes: int | None) -> str:
    if nbytes is None:
        return "?"
    return f"{nbytes}" if nbytes < 1024 else f"{nbytes / 1024:.1f} KB"


SMEM_NOTE = "smem: static + dynamic shared memory per block"
SPILL_NOTE = "spills: bytes stored/loaded to local memory per thread by register spills"
OCCUPANCY_NOTE = "occupancy: blocks per SM x warps per block, share of the SM's warp slots"


def report_table(report: CheckReport, width: int | None = None, wide: bool = False):
    """A table fitted to `width` (one row per layer and kernel) and the notes below it: why a
    layer was skipped or did not compile."""
    from rich.text import Text


    # Registers, shared memory, spills and occupancy are what `check` is for: key columns,
    # short enough to fit 80 columns beside a long kernel name.
    cols = [Col("layer", "left"), Col("shape", "left", key=False, wrap=True, priority=2),
            Col("kernel", "left"), Col("regs"), Col("smem", note=SMEM_NOTE),
            Col("spills", note=SPILL_NOTE), Col("occupancy", note=OCCUPANCY_NOTE),
            Col("block", key=False, priority=1), Col("local", key=False, priority=3),
            Col("limited by", "left", key=False, wrap=True, wrap_width=12, priority=0)]
    rows, notes = [], []
    for layer in report.layers:
        label, shape = layer.layer, layer.shape.brief()
        if not layer.support or not layer.compiled:
            status = (Text("not supported", style="yellow") if not layer.support
                      else Text("did not compile", style="red"))
            rows.append([label, shape, status] + ["-"] * (len(cols) - 3))
            if not layer.support:
                notes.append(f"{layer.layer}: not supported: {layer.support.reason}")
            continue
        for k in layer.kernels:
            r, occ = k.resources, k.occupancy
            spills = Text("?" if r.spill_stores is None else f"{r.spill_stores}/{r.spill_loads} B",
                          style="red" if r.spill_stores else "")
            if occ is None:
                occupancy, limit, block, dynamic = "?", k.note, "?", "?"
            elif occ.blocks_per_sm == 0:
                occupancy, limit = Text("cannot launch", style="red"), occ.reason
                block, dynamic = str(occ.threads_per_block), _kb(occ.dynamic_shared)
            else:
                occupancy = f"{occ.blocks_per_sm}x{occ.threads_per_block // 32}w {occ.percent:.0f}%"
                limit = ", ".join(occ.limited_by) + (f"; {k.note}" if k.note else "")
                block, dynamic = str(occ.threads_per_block), _kb(occ.dynamic_shared)
            rows.append([label, shape, r.name, str(r.registers),
                         f"{_kb(r.static_shared)}+{dynamic}", spills, occupancy, block,
                         _kb(r.local_bytes), limit])
            label = shape = ""
    title = (f"{report.path} on {report.arch}: {report.kernel.variant.name} "
             f"({report.kernel.variant.precision})")
    return fitted_table(title, cols, rows, width, wide, title_justify="left"), notes


def report_dict(report: CheckReport) -> dict:
    """The report as JSON: the kernel file's record (hash and text) included."""
    return {"path": str(report.path), "arch": report.arch, "ok": report.ok,
            "messages": report.messages, "kernel_file": report.kernel.record(),
            "layers": [{"layer": layer.layer, "shape": layer.shape.as_dict(),
                        "supported": bool(layer.support), "reason": layer.support.reason,
                        "options": list(layer.options), "compiled": layer.compiled,
                        "kernels": [k.as_dict() for k in layer.kernels]}
                       for layer in report.layers]}
