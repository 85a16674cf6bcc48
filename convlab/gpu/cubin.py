"""What a compiled kernel costs: registers, shared and local memory, spills, and the occupancy
they allow, read from the cubin NVRTC produced (no GPU needed).

Where each number comes from:
- registers per thread: EIATTR_REGCOUNT (0x2f) in the cubin's `.nv.info` section, one
  (symbol index, count) record per function;
- static shared memory: the size of the kernel's `.nv.shared.<kernel>` section. On sm_90 that
  section also holds the 1 KB the driver reserves per block (the cubin then has a
  `.nv.shared.reserved.0` section), which is subtracted here and added back, like every other
  architecture's, by the occupancy rule below;
- local memory per thread (stack frame: spilled registers and local arrays): EIATTR_FRAME_SIZE
  (0x11) / EIATTR_MAX_STACK_SIZE (0x23) of the kernel's symbol;
- __launch_bounds__: EIATTR_MAX_THREADS (0x05); barriers: bits 20-26 of the `.text.<kernel>`
  section's flags;
- spill stores and loads: only ptxas says them, in its `-v` log, which NVRTC returns when
  compiled with `--ptxas-options=-v` (NVRTC 12.x; tested in tests/test_cubin.py).
The .nv.info record layout (a format byte, an attribute byte, a 16-bit size, then the value) is
NVIDIA's undocumented but stable cubin format, as cuobjdump -elf prints it.

Occupancy follows the CUDA Occupancy Calculator (cuda_occupancy.h in the CUDA toolkit,
cudaOccMaxActiveBlocksPerMultiprocessor): blocks per SM are the least of the block limit, the
warp limit, the registers (allocated per warp in units of 256, in 4 sub-partitions of the
register file) and shared memory (static + dynamic + 1 KB reserved per block, in units of
128 bytes, out of the SM's largest carveout). Per-architecture limits from the CUDA C
Programming Guide, "Technical Specifications per Compute Capability", and cuda_occupancy.h.
"""

from __future__ import annotations

import re
import struct
from dataclasses import asdict, dataclass

from .jit import NvrtcResult

EIATTR_MAX_THREADS = 0x05
EIATTR_FRAME_SIZE = 0x11
EIATTR_MIN_STACK_SIZE = 0x12
EIATTR_MAX_STACK_SIZE = 0x23
EIATTR_REGCOUNT = 0x2F
EIFMT_SVAL = 4
SHT_NOBITS = 8
PTXAS_VERBOSE = "--ptxas-options=-v"


@dataclass(frozen=True)
class ArchLimits:
    arch: str
    max_blocks_per_sm: int
    max_warps_per_sm: int
    shared_per_sm: int  # the largest shared-memory carveout
    shared_per_block_optin: int
    registers_per_sm: int = 65536
    registers_per_block: int = 65536
    max_registers_per_thread: int = 255
    register_unit: int = 256  # registers are allocated per warp in these units
    sub_partitions: int = 4
    shared_unit: int = 128
    reserved_shared_per_block: int = 1024
    shared_per_block_default: int = 48 * 1024
    max_threads_per_block: int = 1024
    barriers_per_block_slot: int = 2  # barriers per SM = this x max_blocks_per_sm


ARCH_LIMITS = {
    "sm_80": ArchLimits("sm_80", 32, 64, 164 * 1024, 163 * 1024),
    "sm_86": ArchLimits("sm_86", 16, 48, 100 * 1024, 99 * 1024, barriers_per_block_slot=1),
    "sm_89": ArchLimits("sm_89", 24, 48, 100 * 1024, 99 * 1024, barriers_per_block_slot=1),
    "sm_90": ArchLimits("sm_90", 32, 64, 228 * 1024, 227 * 1024),
}


# --- compiling with the compiler's messages ----------------------------------------------------

# --- reading the cubin -------------------------------------------------------------------------

@dataclass
class Section:
    name: str
    type: int
    flags: int
    offset: int
    size: int
    info: int


def sections(cubin: bytes) -> list[Section]:
    """The ELF64 section table of a cubin."""
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2:
        raise ValueError("not a 64-bit ELF cubin")
    shoff = struct.unpack_from("<Q", cubin, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    raw = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    names_at = raw[shstrndx][4]

    def name(offset):
        start = names_at + offset
        return cubin[start:cubin.index(b"\0", start)].decode()

    return [Section(name(r[0]), r[1], r[2], r[4], r[5], r[7]) for r in raw]


def code_sections(cubin: bytes) -> dict[str, bytes]:
    """The cubin's machine code, its .text sections by name: what two builds share when they
    run the same instructions, whatever their line tables and symbol names."""
    return {s.name: cubin[s.offset:s.offset + s.size] for s in sections(cubin)
            if s.name.startswith(".text")}


def _symbols(cubin: bytes, table: list[Section]) -> list[str]:
    symtab = next(s for s in table if s.name == ".symtab")
    strtab = next(s for s in table if s.name == ".strtab")
    out = []
    for i in range(symtab.size // 24):
        st_name = struct.unpack_from("<I", cubin, symtab.offset + 24 * i)[0]
        start = strtab.offset + st_name
        out.append(cubin[start:cubin.index(b"\0", start)].decode())
    return out


def _attributes(data: bytes):
    """(attribute, value bytes) records of a .nv.info section."""
    i = 0
    while i + 4 <= len(data):
        fmt, attr, size = data[i], data[i + 1], struct.unpack_from("<H", data, i + 2)[0]
        if fmt == EIFMT_SVAL:
            yield attr, data[i + 4:i + 4 + size]
            i += 4 + size
        else:  # the 16-bit field is the value itself
            yield attr, data[i + 2:i + 4]
            i += 4


@dataclass
class KernelResources:
    """One kernel's resources as compiled (per thread and per block)."""

    name: str
    registers: int
    static_shared: int
    local_bytes: int  # stack frame per thread
    barriers: int
    max_threads: int | None  # from __launch_bounds__
    spill_stores: int | None = None  # from ptxas -v, when it was asked for
    spill_loads: int | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def kernel_resources(cubin: bytes) -> dict[str, KernelResources]:
    """Every kernel (entry function) of a cubin, by name."""
    table = sections(cubin)
    by_name = {s.name: s for s in table}
    symbols = _symbols(cubin, table)
    per_symbol: dict[str, dict[int, int]] = {}
    info = by_name.get(".nv.info")
    if info is not None:
        for attr, value in _attributes(cubin[info.offset:info.offset + info.size]):
            if attr in (EIATTR_REGCOUNT, EIATTR_FRAME_SIZE, EIATTR_MIN_STACK_SIZE,
                        EIATTR_MAX_STACK_SIZE) and len(value) == 8:
                index, amount = struct.unpack("<II", value)
                per_symbol.setdefault(symbols[index], {})[attr] = amount
    reserved = any(s.name.startswith(".nv.shared.reserved") for s in table)
    kernels = {}
    for section in table:
        if not section.name.startswith(".nv.info."):
            continue
        name = section.name[len(".nv.info."):]
        attrs = per_symbol.get(name, {})
        max_threads = None
        for attr, value in _attributes(cubin[section.offset:section.offset + section.size]):
            if attr == EIATTR_MAX_THREADS and len(value) == 12:
                x, y, z = struct.unpack("<III", value)
                max_threads = x * y * z
        shared = by_name.get(f".nv.shared.{name}")
        static = shared.size if shared is not None else 0
        if reserved and static >= ArchLimits.reserved_shared_per_block:
            static -= ArchLimits.reserved_shared_per_block
        text = by_name.get(f".text.{name}")
        barriers = (text.flags >> 20) & 0x7F if text is not None else 0
        local = max(attrs.get(EIATTR_FRAME_SIZE, 0), attrs.get(EIATTR_MAX_STACK_SIZE, 0))
        registers = attrs.get(EIATTR_REGCOUNT, (text.info >> 24) if text is not None else 0)
        kernels[name] = KernelResources(name, registers, static, local, barriers, max_threads)
    return kernels


_PTXAS_FUNCTION = re.compile(r"Function properties for (\S+)")
_PTXAS_SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def ptxas_spills(log: str) -> dict[str, tuple[int, int]]:
    """(spill store bytes, spill load bytes) per function from ptxas's -v report."""
    spills, current = {}, None
    for line in log.splitlines():
        found = _PTXAS_FUNCTION.search(line)
        if found:
            current = found.group(1)
            continue
        found = _PTXAS_SPILLS.search(line)
        if found and current is not None:
            spills[current] = (int(found.group(1)), int(found.group(2)))
    return spills


def resources(compiled: NvrtcResult) -> dict[str, KernelResources]:
    """The kernels of a successful compile, with spills when the log reports them."""
    kernels = kernel_resources(compiled.cubin)
    for name, (stores, loads) in ptxas_spills(compiled.log).items():
        if name in kernels:
            kernels[name].spill_stores, kernels[name].spill_loads = stores, loads
    return kernels


def strip_ptxas_report(log: str) -> str:
    """The compiler's messages without ptxas's -v report (which the resource table shows)."""
    return "\n".join(line for line in log.splitlines()
                     if line.strip() and not line.startswith("ptxas")).strip()


# --- occupancy ---------------------------------------------------------------------------------

@dataclass
class Occupancy:
    threads_per_block: int
    dynamic_shared: int
    blocks_per_sm: int
    warps_per_sm: int
    max_warps_per_sm: int
    limited_by: list[str]  # the resources that allow only blocks_per_sm
    limits: dict[str, int]  # blocks per SM each resource allows
    reason: str = ""  # why no block fits, when blocks_per_sm is 0

    @property
    def percent(self) -> float:
        return 100.0 * self.warps_per_sm / self.max_warps_per_sm

    def as_dict(self) -> dict:
        return {**asdict(self), "percent": self.percent}


def _round_up(value: int, unit: int) -> int:
    return -(-value // unit) * unit


def occupancy(kernel: KernelResources, threads_per_block: int, dynamic_shared: int = 0,
              limits: ArchLimits = ARCH_LIMITS["sm_90"]) -> Occupancy:
    """Resident blocks and warps per SM for a launch of this kernel (cuda_occupancy.h's rule)."""
    warps = -(-threads_per_block // 32)
    allowed: dict[str, int] = {"blocks": limits.max_blocks_per_sm,
                               "warps": limits.max_warps_per_sm // warps}
    reason = ""
    regs_per_warp = _round_up(kernel.registers * 32, limits.register_unit)
    if threads_per_block > limits.max_threads_per_block:
        reason = f"{threads_per_block} threads exceed {limits.max_threads_per_block} per block"
    elif kernel.max_threads is not None and threads_per_block > kernel.max_threads:
        reason = (f"{threads_per_block} threads exceed the kernel's __launch_bounds__ "
                  f"({kernel.max_threads})")
    elif (kernel.registers > limits.max_registers_per_thread
          or regs_per_warp * _round_up(warps, limits.sub_partitions) > limits.registers_per_block):
        reason = f"{kernel.registers} registers x {threads_per_block} threads exceed a block's registers"
    if regs_per_warp:
        per_partition = limits.registers_per_sm // limits.sub_partitions // regs_per_warp
        allowed["registers"] = per_partition * limits.sub_partitions // warps
    used = kernel.static_shared + dynamic_shared
    shared = _round_up(used + limits.reserved_shared_per_block, limits.shared_unit)
    if used > limits.shared_per_block_optin:
        reason = reason or (f"{used} bytes of shared memory exceed "
                            f"{limits.shared_per_block_optin} per block")
    allowed["shared memory"] = limits.shared_per_sm // shared
    if kernel.barriers:
        allowed["barriers"] = limits.barriers_per_block_slot * limits.max_blocks_per_sm // kernel.barriers
    blocks = 0 if reason else min(allowed.values())
    limited_by = [k for k, v in allowed.items() if v == blocks] if blocks else []
    return Occupancy(threads_per_block, dynamic_shared, blocks, blocks * warps,
                     limits.max_warps_per_sm, limited_by, allowed, reason)
