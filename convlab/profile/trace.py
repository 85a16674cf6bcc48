"""`convlab profile`: where the time of a forward pass goes, from a CUPTI activity trace.

The network runs under CUPTI activity tracing (NVIDIA's cupti-python bindings), which sees the
whole process: every kernel, memcpy and memset on the GPU and every CUDA runtime and driver API
call, CuPy's and PyTorch's alike. The network enters `annotate(step.label)` around each step's
launches; there we open an NVTX range and push a CUPTI external correlation id, so every GPU
activity maps to the step that launched it. Our kernels are named after their variant and step
("register-tiled conv1"), library kernels (cuDNN, cuBLAS) keep their own name with the step
beside it ("implicit_convolve_sgemm [conv1]").

Time windows on CUPTI's clock split the trace into phases: warm-up (the network built - kernels
compiled and loaded, device and pinned host buffers allocated - and its first forward pass),
N steady-state forward passes, and teardown (the network released and the memory pools emptied,
so that every batch size starts from nothing, as a program run once per batch size would). An
API call belongs to the window it starts in, a GPU activity to the window of the call that
launched it.

The tables are nvprof's: Time(%), Time, Calls, Avg, Min, Max, Name, sorted by time, with the rows
that together make up a threshold percentage of the time marked (profile_report renders them).
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import ctypes.util
import gc
import re
import shlex
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Callable

from .. import __version__
from ..bench import lab, results
from ..bench.results import git_commit
from ..errors import ConvlabError, GPUUnavailable
from ..gpu import gpu_available, hardware, nvtx, unavailable_reason
from ..kernels import VARIANTS, get_variant
from ..models import ModelSpec, get_model
from ..net.pipeline import Pipeline

SCHEMA_VERSION = 1
RECORD_KIND = "profile"
PHASES = ("warm-up", "steady", "teardown")
DEFAULT_KERNEL = "tiled"
DEFAULT_PASSES = 10
DEFAULT_THRESHOLD = 90.0

# Time categories of the batch breakdown (the AlexNet assignment's columns), in table order.
GPU_CATEGORIES = {"htod": "HtoD", "conv": "conv", "pool": "pool", "lrn": "LRN", "fc": "FC",
                  "other": "other GPU", "dtoh": "DtoH"}
API_CATEGORIES = {"device_alloc": "device alloc/free", "pinned": "pinned alloc/free",
                  "sync": "sync", "module": "module load", "other_api": "other API"}
STEP_CATEGORIES = {"conv": "conv", "pool": "pool", "lrn": "lrn", "fc": "fc"}  # the rest: other

# API names by category, matched as prefixes (so cuMemAlloc_v2 and cudaMallocAsync count too);
# pinned comes first because cudaMallocHost and cudaFreeHost also start like device calls.
_API_PATTERNS = (
    ("pinned", re.compile(r"^(cudaHostAlloc|cudaMallocHost|cudaFreeHost|cudaHostRegister|"
                          r"cudaHostUnregister|cuMemHostAlloc|cuMemAllocHost|cuMemFreeHost|"
                          r"cuMemHostRegister|cuMemHostUnregister)")),
    ("device_alloc", re.compile(r"^(cudaMalloc|cudaFree|cuMemAlloc|cuMemFree|cuMemCreate|"
                                r"cuMemRelease|cuMemMap|cuMemUnmap|cuMemAddressReserve|"
                                r"cuMemAddressFree)")),
    ("sync", re.compile(r"^(cudaDeviceSynchronize|cudaStreamSynchronize|cudaEventSynchronize|"
                        r"cudaThreadSynchronize|cuCtxSynchronize|cuStreamSynchronize|"
                        r"cuEventSynchronize)")),
    ("module", re.compile(r"^(cuModuleLoad|cuModuleUnload|cuLibraryLoad|cuLibraryUnload|"
                          r"cudaLibraryLoad|cudaLibraryUnload)")),
)

COPY_NAMES = {"HtoD": "[CUDA memcpy HtoD]", "DtoH": "[CUDA memcpy DtoH]",
              "DtoD": "[CUDA memcpy DtoD]", "HtoH": "[CUDA memcpy HtoH]",
              "PtoP": "[CUDA memcpy PtoP]"}
MEMSET_NAME = "[CUDA memset]"


# --- dependencies: a GPU, and cupti-python that matches the driver ---------------------------

CUPTI_PACKAGE = "cupti-python"
OLDEST_CUPTI_DRIVER = (12, 6)  # the first cupti-python release is 12.6


def cupti_library_package(major: int) -> str:
    """The pip package with libcupti for a CUDA major (12 carries a -cu12 suffix, 13 none)."""
    return "nvidia-cuda-cupti-cu12" if major == 12 else "nvidia-cuda-cupti"


def install_command(driver: tuple[int, int]) -> str:
    """The pip line that installs CUPTI for this driver: the driver's major, at most its minor."""
    major, minor = driver
    spec = f"=={major}.0.*" if minor == 0 else f">={major}.0,<{major}.{minor + 1}"
    return f'pip install "{CUPTI_PACKAGE}{spec}" "{cupti_library_package(major)}{spec}"'


def _major_minor(version: str) -> tuple[int, int]:
    parts = re.findall(r"\d+", version)
    return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0


def version_problem(driver: tuple[int, int], cupti_version: str | None,
                    library_version: str | None) -> str | None:
    """Why the installed CUPTI cannot trace on this driver (one line that says what to install),
    or None when it can. Both packages need the driver's major and at most its minor."""
    shown = f"{driver[0]}.{driver[1]}"
    if driver < OLDEST_CUPTI_DRIVER:
        return (f"convlab profile needs cupti-python, which needs a CUDA driver of "
                f"{OLDEST_CUPTI_DRIVER[0]}.{OLDEST_CUPTI_DRIVER[1]} or newer; this one is {shown}")
    fix = install_command(driver)
    if cupti_version is None:
        return f"convlab profile needs {CUPTI_PACKAGE} for the CUDA {shown} driver: {fix}"
    for package, version in ((CUPTI_PACKAGE, cupti_version),
                             (cupti_library_package(driver[0]), library_version)):
        if version is None:
            continue
        major, minor = _major_minor(version)
        if major != driver[0] or minor > driver[1]:
            return (f"{package} {version} does not match the CUDA {shown} driver (it needs major "
                    f"{driver[0]} and minor at most {driver[1]}): {fix}")
    return None


def installed_version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def driver_version(cupy) -> tuple[int, int]:
    v = cupy.cuda.runtime.driverGetVersion()
    return v // 1000, v % 1000 // 10


def require_gpu():
    """CuPy with a GPU behind it, or one line saying what is missing."""
    if not gpu_available():
        raise GPUUnavailable(f"convlab profile traces GPU work and needs a CUDA GPU: "
                             f"{unavailable_reason()}")
    import cupy

    return cupy


def load_cupti(cupy):
    """The cupti.cupti module, once its version is known to fit the driver."""
    driver = driver_version(cupy)
    problem = version_problem(driver, installed_version(CUPTI_PACKAGE),
                              installed_version(cupti_library_package(driver[0])))
    if problem:
        raise ConvlabError(problem)
    try:
        from cupti import cupti
    except (ImportError, OSError) as exc:
        raise ConvlabError(f"cupti-python does not load ({type(exc).__name__}: {exc}): "
                           f"{install_command(driver)}") from None
    return cupti


# --- names ---------------------------------------------------------------------------------

_RUNTIME_VERSION_TAG = re.compile(r"_v\d{4,5}$")


def api_name(name: str, runtime: bool) -> str:
    """CUPTI names runtime calls with the CUDA version that introduced them (cudaMalloc_v3020);
    nvprof showed the function's name. Driver names are the exported symbols (cuMemAlloc_v2)."""
    return _RUNTIME_VERSION_TAG.sub("", name) if runtime else name


@lru_cache(maxsize=1)
def _cxa_demangle():
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("stdc++") or "libstdc++.so.6")
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    fn = lib.__cxa_demangle
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    libc.free.argtypes = [ctypes.c_void_p]
    return fn, libc.free


def demangle(name: str) -> str:
    """The C++ name of a mangled symbol (libstdc++'s demangler), or the name itself."""
    if not name.startswith("_Z"):
        return name
    found = _cxa_demangle()
    if found is None:
        return name
    fn, free = found
    status = ctypes.c_int()
    ptr = fn(name.encode(), None, None, ctypes.byref(status))
    if not ptr:
        return name
    try:
        return ctypes.string_at(ptr).decode(errors="replace") if status.value == 0 else name
    finally:
        free(ptr)


_OPEN = {")": "(", ">": "<", "}": "{"}


def _strip_trailing_group(text: str, close: str) -> tuple[str, str]:
    """Split `text` ending in a balanced group closed by `close` into (head, group contents)."""
    opener = _OPEN[close]
    depth = 0
    for i in range(len(text) - 1, -1, -1):
        if text[i] == close:
            depth += 1
        elif text[i] == opener:
            depth -= 1
            if depth == 0:
                return text[:i], text[i + 1:-1]
    return text, ""


def _top_level_split(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "(<{":
            depth += 1
        elif ch in ")>}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return parts


_GENERIC_KERNEL = re.compile(r"^(kernel\d*|device_kernel)$", re.IGNORECASE)


def short_kernel_name(symbol: str) -> str:
    """A library kernel's name as the course's reports showed it: demangled, without return
    type, parameters or template arguments ("implicit_convolve_sgemm"). A generic launcher
    (cutlass::Kernel2<Op>) keeps its first template argument, which says what it computes."""
    name = demangle(symbol)
    if name == symbol:
        return name
    if name.endswith(")"):
        name = _strip_trailing_group(name, ")")[0]
    if name.startswith("void "):
        name = name[len("void "):]
    if not name.endswith(">"):
        return name
    base, args = _strip_trailing_group(name, ">")
    if _GENERIC_KERNEL.match(base.rsplit("::", 1)[-1]) and args:
        first = _top_level_split(args)[0]
        if first.endswith(">"):
            first = _strip_trailing_group(first, ">")[0]
        return f"{base}<{first}>"
    return base


_KERNEL_DEFINITION = re.compile(
    r'extern\s+"C"\s+__global__\s+void\s+(?:\w+(?:\s*\([^)]*\))?\s+)?(\w+)\s*\(')


def kernel_functions(sources) -> frozenset[str]:
    """The extern "C" __global__ functions defined in CUDA C sources."""
    return frozenset(name for source in sources for name in _KERNEL_DEFINITION.findall(source))


def convlab_kernel_functions() -> frozenset[str]:
    """Every kernel function convlab defines: the variants' sources and the CUDA C strings of
    every convlab module loaded in this process (the other layers' kernels, the pipeline's)."""
    sources = [v.source for v in VARIANTS.values() if v.source]
    for name, module in list(sys.modules.items()):
        if module is not None and (name == "convlab" or name.startswith("convlab.")):
            sources += [value for value in vars(module).values()
                        if isinstance(value, str) and "__global__" in value]
    return kernel_functions(sources)


def api_category(name: str) -> str:
    for category, pattern in _API_PATTERNS:
        if pattern.match(name):
            return category
    return "other_api"


# --- the trace, as plain data ----------------------------------------------------------------

@dataclass
class Activity:
    """One CUPTI activity record, copied out of CUPTI's buffer."""

    kind: str  # "kernel", "memcpy", "memset", "runtime", "driver"
    name: str  # kernel symbol, API name, or copy direction ("HtoD") for a memcpy
    start: int  # ns, CUPTI's clock
    end: int
    correlation_id: int = 0
    bytes: int = 0

    @property
    def duration(self) -> int:
        return max(0, self.end - self.start)

    @property
    def is_api(self) -> bool:
        return self.kind in ("runtime", "driver")


@dataclass
class Window:
    phase: str
    start: int
    end: int

    @property
    def duration(self) -> int:
        return self.end - self.start


@dataclass
class Trace:
    activities: list[Activity] = field(default_factory=list)
    external: dict[int, int] = field(default_factory=dict)  # correlation id -> scope id
    scopes: dict[int, str] = field(default_factory=dict)  # scope id -> step label
    windows: list[Window] = field(default_factory=list)

    def label_of(self, activity: Activity) -> str | None:
        return self.scopes.get(self.external.get(activity.correlation_id, 0))


@dataclass(frozen=True)
class StepInfo:
    category: str  # conv, pool, lrn, fc, softmax, activation, copy
    kernel_label: str  # "register-tiled conv1"


def network_steps(network) -> dict[str, StepInfo]:
    return {s.label: StepInfo(s.category, s.kernel_label) for s in network.steps}


# --- aggregation -----------------------------------------------------------------------------

@dataclass
class Row:
    """Every activity of one name in one phase: nvprof's Calls, Time, Min, Max."""

    name: str
    category: str
    calls: int = 0
    total_ns: int = 0
    min_ns: int = 0
    max_ns: int = 0
    bytes: int = 0

    def add(self, ns: int, nbytes: int = 0) -> None:
        self.min_ns = ns if self.calls == 0 else min(self.min_ns, ns)
        self.max_ns = max(self.max_ns, ns)
        self.calls += 1
        self.total_ns += ns
        self.bytes += nbytes

    @property
    def avg_ns(self) -> float:
        return self.total_ns / self.calls if self.calls else 0.0

    def as_dict(self) -> dict:
        return {"name": self.name, "category": self.category, "calls": self.calls,
                "total_ns": self.total_ns, "min_ns": self.min_ns, "max_ns": self.max_ns,
                "bytes": self.bytes}

    @classmethod
    def from_dict(cls, d: dict) -> "Row":
        return cls(d["name"], d["category"], int(d["calls"]), int(d["total_ns"]),
                   int(d["min_ns"]), int(d["max_ns"]), int(d.get("bytes", 0)))


def sorted_rows(rows) -> list[Row]:
    """nvprof's order: most time first (ties by name, so the order is stable)."""
    return sorted(rows, key=lambda r: (-r.total_ns, r.name))


@dataclass
class PhaseProfile:
    phase: str
    window_ns: list[int]  # wall time of each window (each steady-state pass)
    gpu: list[Row]
    api: list[Row]

    @property
    def windows(self) -> int:
        return len(self.window_ns)

    @property
    def wall_ns(self) -> int:
        return sum(self.window_ns)

    @property
    def gpu_ns(self) -> int:
        return sum(r.total_ns for r in self.gpu)

    def category_ns(self) -> dict[str, int]:
        totals = dict.fromkeys(list(GPU_CATEGORIES) + list(API_CATEGORIES), 0)
        for row in self.gpu + self.api:
            totals[row.category] = totals.get(row.category, 0) + row.total_ns
        return totals

    def as_dict(self) -> dict:
        return {"phase": self.phase, "window_ns": self.window_ns,
                "gpu": [r.as_dict() for r in self.gpu], "api": [r.as_dict() for r in self.api]}

    @classmethod
    def from_dict(cls, d: dict) -> "PhaseProfile":
        return cls(d["phase"], [int(n) for n in d["window_ns"]],
                   [Row.from_dict(r) for r in d["gpu"]], [Row.from_dict(r) for r in d["api"]])


def kernel_names(kernels: list[tuple[str, str | None]], steps: dict[str, StepInfo],
                 ours: frozenset[str]) -> dict[tuple[str, str | None], str]:
    """Display names for (symbol, step label) pairs. Our kernels take the step's kernel label,
    with the function added where the step launches more than one function; library kernels
    keep their short name with the step in brackets. Names that would coincide get #2, #3."""
    per_step = defaultdict(set)
    for symbol, label in kernels:
        per_step[label].add(symbol)
    names = {}
    for symbol, label in sorted(set(kernels), key=lambda k: (k[1] or "", k[0])):
        step = steps.get(label) if label is not None else None
        if symbol in ours and step is not None:
            name = step.kernel_label
            if len(per_step[label]) > 1:
                name += f" ({symbol})"
        else:
            name = short_kernel_name(symbol)
            if label is not None:
                name += f" [{label}]"
        names[(symbol, label)] = name
    seen: dict[str, int] = {}
    for key in sorted(names, key=lambda k: (k[1] or "", k[0])):
        name = names[key]
        seen[name] = seen.get(name, 0) + 1
        if seen[name] > 1:
            names[key] = f"{name} #{seen[name]}"
    return names


def _gpu_category(activity: Activity, label: str | None, steps: dict[str, StepInfo]) -> str:
    if activity.kind == "memcpy":
        return {"HtoD": "htod", "DtoH": "dtoh"}.get(activity.name, "other")
    if activity.kind == "memset" or label is None or label not in steps:
        return "other"
    return STEP_CATEGORIES.get(steps[label].category, "other")


def aggregate(trace: Trace, steps: dict[str, StepInfo], ours: frozenset[str]) -> dict[str, PhaseProfile]:
    """The trace as one PhaseProfile per phase that has windows: rows per name, per-window wall."""
    windows = sorted(trace.windows, key=lambda w: w.start)
    starts = [w.start for w in windows]

    def window_at(t: int) -> int | None:
        i = bisect.bisect_right(starts, t) - 1
        return i if i >= 0 and t <= windows[i].end else None

    launched_in = {}
    for a in trace.activities:
        if a.is_api:
            launched_in[a.correlation_id] = window_at(a.start)
    gpu = [a for a in trace.activities if not a.is_api]
    symbols = kernel_names([(a.name, trace.label_of(a)) for a in gpu if a.kind == "kernel"],
                           steps, ours)
    rows: dict[str, dict[tuple[str, str], Row]] = {w.phase: {} for w in windows}
    for a in trace.activities:
        if not a.is_api and a.correlation_id in launched_in:
            w = launched_in[a.correlation_id]
        else:
            w = window_at(a.start)
        if w is None:
            continue
        if a.is_api:
            group, name, category = "api", a.name, api_category(a.name)
        else:
            label = trace.label_of(a)
            group, category = "gpu", _gpu_category(a, label, steps)
            if a.kind == "kernel":
                name = symbols[(a.name, label)]
            elif a.kind == "memcpy":
                name = COPY_NAMES.get(a.name, f"[CUDA memcpy {a.name}]")
            else:
                name = MEMSET_NAME
        phase_rows = rows[windows[w].phase]
        row = phase_rows.get((group, name))
        if row is None:
            row = phase_rows[(group, name)] = Row(name, category)
        row.add(a.duration, a.bytes)
    profiles = {}
    for phase in dict.fromkeys(w.phase for w in windows):
        phase_rows = rows[phase]
        profiles[phase] = PhaseProfile(
            phase, [w.duration for w in windows if w.phase == phase],
            sorted_rows(r for (g, _), r in phase_rows.items() if g == "gpu"),
            sorted_rows(r for (g, _), r in phase_rows.items() if g == "api"))
    return profiles


# --- percentages and the threshold marking -----------------------------------------------------

def percent_cells(rows: list[Row], decimals: int = 2) -> list[str]:
    """Each row's share of the total time, rounded so that the cells add up to exactly 100
    (largest remainders get the last units; integer arithmetic, so nothing drifts)."""
    total = sum(r.total_ns for r in rows)
    unit = 10 ** decimals
    if total == 0:
        return [f"{0:.{decimals}f}%" for _ in rows]
    scale = 100 * unit
    parts = [divmod(r.total_ns * scale, total) for r in rows]
    values = [q for q, _ in parts]
    short = scale - sum(values)
    for i in sorted(range(len(rows)), key=lambda i: -parts[i][1])[:short]:
        values[i] += 1
    return [f"{v // unit}.{v % unit:0{decimals}d}%" if decimals else f"{v}%" for v in values]


def marked(rows: list[Row], threshold: float) -> list[bool]:
    """For rows sorted by time: the fewest leading rows that together make up `threshold`
    percent of the total, and any row tied in time with the last of them."""
    total = sum(r.total_ns for r in rows)
    marks, before, last = [], 0, None
    for r in rows:
        if total > 0 and before * 100 < threshold * total:
            marks.append(True)
            last = r.total_ns
        else:
            marks.append(last is not None and r.total_ns == last)
        before += r.total_ns
    return marks


# --- records -----------------------------------------------------------------------------------

@dataclass
class Overhead:
    """The same forward pass timed untraced and traced (wall clock, host to host)."""

    profiled_ms: float  # median over the traced steady-state passes
    unprofiled_ms: float  # median over as many untraced passes
    passes: int

    @property
    def ratio(self) -> float:
        return self.profiled_ms / self.unprofiled_ms if self.unprofiled_ms > 0 else float("inf")

    def as_dict(self) -> dict:
        return {"profiled_ms": self.profiled_ms, "unprofiled_ms": self.unprofiled_ms,
                "passes": self.passes, "ratio": self.ratio}

    @classmethod
    def from_dict(cls, d: dict) -> "Overhead":
        return cls(float(d["profiled_ms"]), float(d["unprofiled_ms"]), int(d["passes"]))


@dataclass
class BatchProfile:
    batch: int
    phases: dict[str, PhaseProfile]
    overhead: Overhead | None = None

    @property
    def passes(self) -> int:
        steady = self.phases.get("steady")
        return steady.windows if steady else 0

    def as_dict(self) -> dict:
        return {"batch": self.batch, "passes": self.passes,
                "phases": {name: p.as_dict() for name, p in self.phases.items()},
                "overhead": self.overhead.as_dict() if self.overhead else None}

    @classmethod
    def from_dict(cls, d: dict) -> "BatchProfile":
        overhead = d.get("overhead")
        return cls(int(d["batch"]), {name: PhaseProfile.from_dict(p) for name, p in d["phases"].items()},
                   Overhead.from_dict(overhead) if overhead else None)


@dataclass
class Profile:
    model: str
    kernel: str
    threshold: float
    runs: list[BatchProfile]
    device: dict | None = None
    versions: dict = field(default_factory=dict)
    command: str = ""
    timestamp: str = ""
    git_commit: str | None = None
    convlab_version: str = __version__

    @property
    def batches(self) -> list[int]:
        return [run.batch for run in self.runs]

    def as_dict(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, "kind": RECORD_KIND,
                "convlab_version": self.convlab_version, "git_commit": self.git_commit,
                "timestamp": self.timestamp, "command": self.command, "model": self.model,
                "kernel": self.kernel, "batches": self.batches, "threshold": self.threshold,
                "device": self.device, "versions": self.versions,
                "runs": [run.as_dict() for run in self.runs]}

    @classmethod
    def from_dict(cls, d: dict) -> "Profile":
        return cls(d["model"], d["kernel"], float(d["threshold"]),
                   [BatchProfile.from_dict(r) for r in d["runs"]], d.get("device"),
                   d.get("versions") or {}, d.get("command", ""), d.get("timestamp", ""),
                   d.get("git_commit"), d.get("convlab_version", ""))


def load_record(path: Path) -> dict:
    """A saved profile record, checked: a DataError says what is wrong with the file."""
    return results.load_kind(path, RECORD_KIND, SCHEMA_VERSION, Profile.from_dict)


def record_name(record: dict) -> str:
    batches = "_".join(str(b) for b in record["batches"])
    stamp = record["timestamp"][:19].replace(":", "").replace("-", "")
    return f"profile-{record['model']}-{record['kernel']}-b{batches}-{stamp}"


def save(record: dict, folder: Path, markdown: str) -> tuple[Path, Path]:
    """The JSON record and its markdown beside it, each written atomically."""
    return results.save(record, folder, markdown, record_name(record))


# --- tracing -----------------------------------------------------------------------------------

BUFFER_BYTES = 8 * 1024 * 1024


class Tracer:
    """CUPTI activity tracing of this process, into plain Activity records.

    CUPTI takes one pair of buffer callbacks per process: they are registered once and deliver
    to whichever tracer is current. `window(phase)` marks a phase on CUPTI's clock; `scope(label)`
    tags every CUDA call inside it with the label's external correlation id."""

    _registered = False
    _current: "Tracer | None" = None

    def __init__(self, cupti, cupy):
        self.cupti = cupti
        self.cupy = cupy
        kind = cupti.ActivityKind
        self.kinds = (kind.CONCURRENT_KERNEL, kind.MEMCPY, kind.MEMSET, kind.RUNTIME, kind.DRIVER,
                      kind.EXTERNAL_CORRELATION)
        # CUSTOM0 and CUSTOM1 are PyTorch's (Kineto's); ours must not collide with them.
        self.scope_kind = cupti.ExternalCorrelationKind.CUSTOM2
        self.trace = Trace()
        self._scope_ids: dict[str, int] = {}
        self._api: list[tuple[str, int, int, int, int]] = []  # (kind, cbid, start, end, corr)
        self._api_names: dict[tuple[str, int], str] = {}

    # CUPTI calls these on its own thread; the records only live during the call, so every
    # field needed later is copied out here.
    @staticmethod
    def _buffer_requested():
        return BUFFER_BYTES, 0

    @staticmethod
    def _buffer_completed(activities):
        tracer = Tracer._current
        if tracer is not None:
            tracer._take(activities)

    def _take(self, activities) -> None:
        kind = self.cupti.ActivityKind
        copy_kind = self.cupti.ActivityMemcpyKind
        copies = {copy_kind.HTOD: "HtoD", copy_kind.DTOH: "DtoH", copy_kind.DTOD: "DtoD",
                  copy_kind.HTOH: "HtoH", copy_kind.PTOP: "PtoP"}
        out = self.trace.activities
        for a in activities:
            k = a.kind
            if k == kind.CONCURRENT_KERNEL:
                out.append(Activity("kernel", a.name, a.start, a.end, a.correlation_id))
            elif k == kind.MEMCPY:
                name = copies.get(a.copy_kind, copy_kind(a.copy_kind).name)
                out.append(Activity("memcpy", name, a.start, a.end, a.correlation_id, a.bytes))
            elif k == kind.MEMSET:
                out.append(Activity("memset", "", a.start, a.end, a.correlation_id, a.bytes))
            elif k in (kind.RUNTIME, kind.DRIVER):
                self._api.append(("runtime" if k == kind.RUNTIME else "driver", a.cbid, a.start,
                                  a.end, a.correlation_id))
            elif k == kind.EXTERNAL_CORRELATION and a.external_kind == self.scope_kind:
                self.trace.external[a.correlation_id] = a.external_id

    def _enable(self) -> None:
        for k in self.kinds:
            self.cupti.activity_enable(k)

    def _disable(self) -> None:
        for k in self.kinds:
            self.cupti.activity_disable(k)

    def start(self) -> "Tracer":
        Tracer._current = self
        try:
            if not Tracer._registered:
                self.cupti.activity_register_callbacks(Tracer._buffer_requested,
                                                       Tracer._buffer_completed)
                Tracer._registered = True
            self._enable()
        except self.cupti.cuptiError as exc:
            Tracer._current = None
            raise ConvlabError(f"CUPTI cannot trace this process ({exc}); another profiler "
                               "(Nsight Systems, Nsight Compute) attached to it would explain "
                               "that") from None
        return self

    @contextlib.contextmanager
    def paused(self):
        """No tracing inside (the untraced passes of the overhead measurement)."""
        self._disable()
        try:
            yield
        finally:
            self._enable()

    def stop(self) -> Trace:
        self.cupy.cuda.Device().synchronize()
        self.cupti.activity_flush_all(self.cupti.ActivityFlag.FLUSH_FORCED)
        self._disable()
        Tracer._current = None
        for kind, cbid, start, end, corr in self._api:
            self.trace.activities.append(
                Activity(kind, self._api_name(kind, cbid), start, end, corr))
        self._api.clear()
        self.trace.scopes = {i: label for label, i in self._scope_ids.items()}
        return self.trace

    def _api_name(self, kind: str, cbid: int) -> str:
        key = (kind, cbid)
        if key not in self._api_names:
            cupti = self.cupti
            runtime = kind == "runtime"
            domain = cupti.CallbackDomain.RUNTIME_API if runtime else cupti.CallbackDomain.DRIVER_API
            try:
                name = api_name(str(cupti.get_callback_name(domain, cbid)), runtime)
            except Exception:  # naming is cosmetic: a call CUPTI cannot name keeps its number
                name = f"{kind} call {cbid}"
            self._api_names[key] = name
        return self._api_names[key]

    @contextlib.contextmanager
    def window(self, phase: str):
        self.cupy.cuda.Device().synchronize()
        start = self.cupti.get_timestamp()
        try:
            yield
        finally:
            end = self.cupti.get_timestamp()
            self.trace.windows.append(Window(phase, start, end))
            self.cupy.cuda.Device().synchronize()

    @contextlib.contextmanager
    def scope(self, label: str):
        scope_id = self._scope_ids.setdefault(label, len(self._scope_ids) + 1)
        self.cupti.activity_push_external_correlation_id(self.scope_kind, scope_id)
        try:
            yield
        finally:
            self.cupti.activity_pop_external_correlation_id(self.scope_kind)

    @contextlib.contextmanager
    def annotate(self, label: str):
        """What the network enters around each step: an NVTX range and this tracer's scope."""
        with nvtx.annotate(label), self.scope(label):
            yield


# --- running the profile -----------------------------------------------------------------------

def _empty_memory_pools(cupy) -> None:
    gc.collect()
    cupy.get_default_memory_pool().free_all_blocks()
    cupy.get_default_pinned_memory_pool().free_all_blocks()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    return (ordered[n // 2] + ordered[(n - 1) // 2]) / 2


def profile_batch(cupti, cupy, spec: ModelSpec, kernel: str, batch: int,
                  passes: int) -> BatchProfile:
    """Warm-up, `passes` traced forward passes, as many untraced ones (the overhead), teardown.

    A pass is `run`'s: pinned host buffers, images copied in, every step, top-1 on the device,
    predictions copied out. Its steps are launched one by one, not replayed as a CUDA graph, so
    that each activity maps to the step that launched it (what the graph buys is small:
    scripts/pipeline_study.py measured 4% at batch 1 on an H100, nothing at 128)."""
    images = lab.load_input(spec, batch)
    tracer = Tracer(cupti, cupy).start()
    try:
        with tracer.window("warm-up"):
            network = lab.build_network(spec, kernel, batch)
            network.annotate = tracer.annotate
            pipe = Pipeline(network, pinned=True, graph=False)
            pipe.load(images)
            pipe.run()
        traced = []
        for _ in range(passes):
            with tracer.window("steady"):
                t0 = time.perf_counter()
                pipe.run()
                traced.append((time.perf_counter() - t0) * 1e3)
        with tracer.paused():
            network.annotate = nvtx.annotate
            untraced = []
            for _ in range(passes):
                t0 = time.perf_counter()
                pipe.run()
                untraced.append((time.perf_counter() - t0) * 1e3)
        steps = network_steps(network)
        with tracer.window("teardown"):
            del network, pipe
            _empty_memory_pools(cupy)
    finally:
        trace = tracer.stop()
    phases = aggregate(trace, steps, convlab_kernel_functions())
    return BatchProfile(batch, phases, Overhead(_median(traced), _median(untraced), passes))


def check_options(ncu: bool, layer: str | None) -> None:
    if layer and not ncu:
        raise ConvlabError("--ncu-layer goes with --ncu (it picks the kernel launch ncu profiles)")
    if ncu and not layer:
        raise ConvlabError("--ncu needs --ncu-layer: the layer whose kernel to profile, e.g. conv1")


def check_request(model: str, kernel: str, batches: str) -> tuple[ModelSpec, list[int]]:
    """The model and the batch sizes, once the model and kernel are known to make sense for a
    profile."""
    spec = get_model(model)
    if not get_variant(kernel).on_gpu:
        raise ConvlabError(f"kernel '{kernel}' runs on the CPU, and CUPTI traces GPU work: "
                           "choose a GPU kernel (convlab list shows them)")
    return spec, lab.parse_batches(batches, spec)


def versions(cupy, driver: tuple[int, int]) -> dict:
    runtime = cupy.cuda.runtime.runtimeGetVersion()
    found = {"cupti-python": installed_version(CUPTI_PACKAGE),
             "libcupti": installed_version(cupti_library_package(driver[0])),
             "CUDA driver": f"{driver[0]}.{driver[1]}",
             "CUDA runtime": f"{runtime // 1000}.{runtime % 1000 // 10}",
             "cupy": cupy.__version__, "nvtx": installed_version("nvtx")}
    torch = sys.modules.get("torch")
    if torch is not None:
        found["torch"] = torch.__version__
    return {name: v for name, v in found.items() if v is not None}


def run_profile(model: str, kernel: str, batches: str, passes: int = DEFAULT_PASSES,
                threshold: float = DEFAULT_THRESHOLD, command: str = "",
                on_batch: Callable[[int], None] | None = None) -> dict:
    """Profile the forward pass of `model` with `kernel` at each batch size; the record."""
    spec, sizes = check_request(model, kernel, batches)
    cupy = require_gpu()
    cupti = load_cupti(cupy)
    runs = []
    for batch in sizes:
        if on_batch:
            on_batch(batch)
        runs.append(profile_batch(cupti, cupy, spec, kernel, batch, passes))
    profile = Profile(model, kernel, threshold, runs, hardware.device_info(),
                      versions(cupy, driver_version(cupy)), command,
                      time.strftime("%Y-%m-%dT%H:%M:%S%z"), git_commit())
    return profile.as_dict()


# --- ncu: the command line that profiles one kernel launch -----------------------------------

@dataclass
class NcuTarget:
    step: str
    name: str  # as the profile tables show it
    symbol: str  # the launched function, as ncu's mangled kernel-name base sees it
    skip: int  # launches of that function before this one in a forward pass
    ours: bool
    command: str

    def as_dict(self) -> dict:
        return {"step": self.step, "name": self.name, "symbol": self.symbol, "skip": self.skip,
                "ours": self.ours, "command": self.command}


def match_step(labels: list[str], layer: str) -> str:
    """The step computing `layer`: its label, or the fused step it is part of (conv1 is in
    conv1+tanh+pool, pool1 in tanh1+pool1)."""
    if layer in labels:
        return layer
    found = [label for label in labels if layer in label.split("+")]
    if len(found) == 1:
        return found[0]
    raise ConvlabError(f"no layer '{layer}' in this network; its steps are: {', '.join(labels)}")


def ncu_command(symbol: str, skip: int, model: str, kernel: str, batch: int, step: str) -> str:
    report = re.sub(r"[^A-Za-z0-9_.-]", "-", f"convlab-{model}-{kernel}-b{batch}-{step}")
    argv = ["ncu", "--kernel-name-base", "mangled", "--kernel-name", f"regex:^{re.escape(symbol)}$",
            "--launch-skip", str(skip), "--launch-count", "1", "--set", "full", "-o", report,
            "convlab", "run", "--model", model, "--kernel", kernel, "--batch", str(batch)]
    return " ".join(shlex.quote(a) for a in argv)


def ncu_targets(trace: Trace, steps: dict[str, StepInfo], ours: frozenset[str], layer: str,
                model: str, kernel: str, batch: int) -> list[NcuTarget]:
    """The kernel launches of `layer`'s step in one traced forward pass, each with the number
    of launches of the same function before it in that pass (ncu's --launch-skip)."""
    label = match_step(list(steps), layer)
    launches = sorted((a for a in trace.activities if a.kind == "kernel"),
                      key=lambda a: (a.correlation_id, a.start))
    names = kernel_names([(a.name, trace.label_of(a)) for a in launches], steps, ours)
    seen: dict[str, int] = defaultdict(int)
    targets = []
    for a in launches:
        here = trace.label_of(a)
        if here == label:
            targets.append(NcuTarget(label, names[(a.name, here)], a.name, seen[a.name],
                                     a.name in ours,
                                     ncu_command(a.name, seen[a.name], model, kernel, batch, label)))
        seen[a.name] += 1
    if not targets:
        raise ConvlabError(f"step '{label}' launched no kernel in a forward pass")
    return targets


def find_ncu_targets(model: str, kernel: str, batches: str, layer: str | None) -> list[NcuTarget]:
    """Trace one forward pass after warm-up and find `layer`'s kernel launches."""
    check_options(True, layer)
    spec, sizes = check_request(model, kernel, batches)
    if len(sizes) != 1:
        raise ConvlabError("--ncu profiles one launch: give one --batch size")
    batch = sizes[0]
    cupy = require_gpu()
    cupti = load_cupti(cupy)
    network = lab.build_network(spec, kernel, batch)
    steps = network_steps(network)
    match_step(list(steps), layer)
    images = lab.load_input(spec, batch)
    network.predict(images)
    tracer = Tracer(cupti, cupy).start()
    try:
        network.annotate = tracer.annotate
        with tracer.window("steady"):
            network.predict(images)
    finally:
        trace = tracer.stop()
    return ncu_targets(trace, steps, convlab_kernel_functions(), layer, model, kernel, batch)
