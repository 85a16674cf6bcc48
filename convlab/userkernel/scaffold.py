"""`convlab new NAME [--from VARIANT]`: a kernel file to start from, copied from a shipped rung.

naive and tiled launch with geometry a header can state, so they become a lone NAME.cu. The
other rungs pick tilings, stage weights or size shared memory in Python: their NAME.cu comes
with a NAME.py whose Variant subclasses the rung's class and compiles NAME.cu instead of the
built-in source, so it launches exactly like the rung until the user changes it. A wgmma
rung's NAME.cu holds only the family's mainloop step and includes the rest from the library
(`#include <convlab/wgmma>`: userkernel.library).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConvlabError
from ..kernels import VARIANTS, get_variant
from ..kernels.base import Variant
from ..kernels.igemm.wgmma import MAINLOOP_STEP
from ..kernels.wgmma import Wgmma
from .kernelfile import KernelFileError, find_parameters

DEFAULT_FROM = "naive"
# The general-layer switches (kernels/general.layer_defines) as header expressions.
LAYER_DEFINES = "STRIDE=stride, PAD=pad, GROUPS=groups, HAS_BIAS=bias, RELU=relu"


@dataclass(frozen=True)
class HeaderLaunch:
    """How a rung launches, in the header's terms."""

    block: str
    grid: str
    defines: str
    features: str = "stride, pad, groups, bias"
    epilogues: str = "relu"
    requires: tuple[str, ...] = ()
    extra_args: dict[str, str] = field(default_factory=dict)  # parameters not matched by name


HEADER_LAUNCHES = {
    "naive": HeaderLaunch("256", "ceil(B*M*Ho*Wo / 256)", LAYER_DEFINES),
    # A fixed 16x16 tile (the built-in picks one per shape); the input patch and the filter
    # must fit the 48 KB of static shared memory.
    "tiled": HeaderLaunch("TILE, TILE", "B, M, ceil(Ho/TILE) * ceil(Wo/TILE)",
                          "TILE=16, K=K, " + LAYER_DEFINES,
                          requires=("4 * (((TILE-1)*stride + K)**2 + K*K) <= 48*1024",),
                          extra_args={"tiles_w": "ceil(Wo/TILE)"}),
}

# For `convlab check`'s occupancy: threads per block and dynamic shared memory of the rungs
# whose NAME.py can compute them (others fall back to __launch_bounds__).
LAUNCH_RESOURCES = {
    "register-tiled": ("from convlab.kernels.register_tiled import filter_smem_bytes",
                       "return self.block, filter_smem_bytes(shape, self.tiling(shape, epilogue)[1])"),
    "constant": ("from convlab.kernels.tiled import pick_tile",
                 "tile = pick_tile(shape)\n        return tile * tile, 0"),
}


# What a wgmma rung's NAME.cu holds instead of the family's 2,000 lines.
WGMMA_BODY = """
// The wgmma family's kernels, all but their mainloop step: the gathers that fill each stage's
// shared memory, the grid, persistent and halo schedules, split-K and the epilogues
// (`convlab show wgmma-fp16` prints them). Every schedule calls mainloop_step, below, for each
// K-tile; as written it is the library's own, and builds the rung's machine code.
#include <convlab/wgmma>
""" + MAINLOOP_STEP


@dataclass
class Scaffold:
    files: list[Path]
    next_commands: list[str]


def _check_name(name: str) -> str:
    if name.lower().endswith(".cu"):
        name = name[:-3]
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ConvlabError(f"'{name}' is not a usable kernel name: use letters, digits and _ "
                           "(it names NAME.cu and the Python class of its launch code)")
    if name in VARIANTS:
        raise ConvlabError(f"'{name}' is a built-in variant's name; choose another NAME")
    return name


def _source_variant(name: str) -> Variant:
    variant = get_variant(name)
    if not variant.source:
        choices = ", ".join(n for n, v in VARIANTS.items() if v.source)
        raise ConvlabError(f"'{name}' has no CUDA source to start from; --from takes one of: {choices}")
    return variant


def _preamble(name: str, origin: str, launch_note: str) -> str:
    return (f"// {name}.cu: a convlab kernel file, started from the '{origin}' rung "
            f"(`convlab new {name} --from {origin}`).\n"
            f"{launch_note}"
            "// `convlab check` compiles it and shows registers, shared memory and occupancy;\n"
            "// the `// convlab:` lines are its header (format: docs/kernel-files.md).\n")


def header_args(variant: Variant, launch: HeaderLaunch) -> str:
    params = find_parameters(Path(variant.name), variant.source, "conv_forward", None)
    named = {"k": "k", "w": "w", "x": "x", "y": "y", "bias": "bias"}
    args = []
    for p in params:
        if p.name in launch.extra_args:
            args.append(launch.extra_args[p.name])
        else:
            args.append(named.get(p.name, p.name))
    return ", ".join(args)


def cu_text(name: str, variant: Variant) -> tuple[str, str | None]:
    """NAME.cu's text, and NAME.py's text when the rung needs launch code."""
    launch = HEADER_LAUNCHES.get(variant.name)
    summary = f"// convlab: summary = {name}, started from {variant.name}: {variant.summary}\n"
    if launch is not None:
        lines = [f"// convlab: block = {launch.block}", f"// convlab: grid = {launch.grid}",
                 f"// convlab: defines = {launch.defines}",
                 f"// convlab: args = {header_args(variant, launch)}",
                 f"// convlab: features = {launch.features}",
                 f"// convlab: epilogues = {launch.epilogues}",
                 f"// convlab: precision = {variant.precision}"]
        lines += [f"// convlab: requires = {r}" for r in launch.requires]
        head = _preamble(name, variant.name, "") + summary + "\n".join(lines) + "\n"
        return head + variant.source, None
    note = (f"// {name}.py launches it exactly like {variant.name} (grid, block, shared memory,\n"
            "// compile-time constants); change it there when your kernel's launch changes.\n")
    head = _preamble(name, variant.name, note) + summary + f"// convlab: launch = {name}.py\n"
    body = WGMMA_BODY if isinstance(variant, Wgmma) else variant.source
    return head + body, py_text(name, variant)


def _class_name(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_") if part) or "Kernel"


def py_text(name: str, variant: Variant) -> str:
    cls = type(variant)
    module = cls.__module__
    resources = LAUNCH_RESOURCES.get(variant.name)
    imports = f"from {module} import {cls.__name__}\n"
    standard = "from pathlib import Path\n"
    if getattr(variant, "form", None):
        standard = "from dataclasses import replace\n" + standard
        imports = f"from convlab.kernels import get_variant\n{imports}"
    method = ""
    if resources is not None:
        imports += resources[0] + "\n"
        method = ("\n    def launch_resources(self, shape, epilogue=None):\n"
                  '        """Threads per block and dynamic shared memory bytes of a launch (for\n'
                  '        `convlab check`\'s occupancy)."""\n'
                  f"        {resources[1]}\n")
    source = "SOURCE_PATH.read_text()"
    if isinstance(variant, Wgmma):  # its #include <convlab/wgmma> expanded
        imports += "from convlab.userkernel.library import source_of\n"
        source = "source_of(SOURCE_PATH)"
    return (f'"""{name}: launch code for {name}.cu, started from convlab\'s {variant.name} '
            f'variant.\n\n'
            f"convlab loads this module for {name}.cu (its header says `launch = {name}.py`). The\n"
            f"class below launches {name}.cu exactly as convlab launches {variant.name} (see\n"
            f"{module.replace('.', '/')}.py): override defines() or prepare() here when your "
            f"kernel\nneeds other constants, another geometry or other arguments.\n"
            '"""\n\n'
            f"{standard}\n"
            f"{imports}\n"
            f'SOURCE_PATH = Path(__file__).with_name("{name}.cu")\n'
            + (_family_class(name, variant, method, source) if getattr(variant, "form", None)
               else _rung_class(name, variant, method)))


def _rung_class(name: str, variant: Variant, method: str) -> str:
    return ("\n\n"
            f"class {_class_name(name)}({type(variant).__name__}):\n"
            f'    name = "{name}"\n'
            f'    summary = "{name}.cu, launched like {variant.name}"\n'
            "    source = SOURCE_PATH.read_text()\n"
            "    source_path = SOURCE_PATH\n"
            f"{method}")


def _family_class(name: str, variant: Variant, method: str, source: str) -> str:
    """A family's member is its class with a Form (name, precision, maths) and the activations
    it reads: the kernel file's takes the rung's, under its own name."""
    return (f'ORIGIN = get_variant("{variant.name}")\n'
            f'FORM = replace(ORIGIN.form, name="{name}",\n'
            f'               summary="{name}.cu, launched like {variant.name}")\n\n\n'
            f"class {_class_name(name)}({type(variant).__name__}):\n"
            f"    source = {source}\n"
            "    source_path = SOURCE_PATH\n"
            f"{method}\n\n"
            f"VARIANT = {_class_name(name)}(FORM, ORIGIN.activations)\n")


def scaffold(name: str, origin: str | None = None, folder: Path | str = ".") -> Scaffold:
    """Write NAME.cu (and NAME.py where launch code is needed) into `folder`; never overwrite."""
    name = _check_name(name)
    variant = _source_variant(origin or DEFAULT_FROM)
    folder = Path(folder)
    try:
        cu, py = cu_text(name, variant)
    except KernelFileError as exc:
        raise ConvlabError(f"cannot scaffold from '{variant.name}': {exc}") from None
    targets = [(folder / f"{name}.cu", cu)] + ([(folder / f"{name}.py", py)] if py else [])
    for path, _ in targets:
        if path.exists():
            raise ConvlabError(f"{path} already exists; choose another NAME or remove it")
    for path, text in targets:
        path.write_text(text)
    cu_path = targets[0][0]
    return Scaffold([p for p, _ in targets], [
        f"convlab check {cu_path}",
        f"convlab run --kernel-file {cu_path}",
        f"convlab compare --kernel-file {cu_path} --kernels tiled,cudnn",
    ])
