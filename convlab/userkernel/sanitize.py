"""`--sanitize`: one launch of a kernel under NVIDIA's compute-sanitizer, its first errors
reported at the user's own file and line.

The launch is exercise.exercise in an isolated child (convlab.gpu.isolate) with compute-sanitizer
as the command prefix; kernel files compile with -lineinfo, so the sanitizer names source
lines. Tools: memcheck (out-of-bounds and misaligned accesses, the default), racecheck (shared
memory races), initcheck (reads of uninitialised device memory), synccheck (barrier misuse).
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import ConvlabError
from ..gpu import require_cupy
from ..gpu.isolate import run_isolated
from ..net.plan import NetworkPlan
from ..shapes import ConvShape
from .kernelfile import load_kernel_file

TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")
SANITIZER_TIMEOUT_S = 300.0  # instrumented kernels run 10-100x slower than plain ones
FIRST_ERRORS = 5
ERROR_EXIT = 86
WHERE_TO_GET = ("compute-sanitizer was not found on PATH, in /usr/local/cuda/bin or in a pip "
                "package: it comes with the CUDA Toolkit "
                "(https://developer.nvidia.com/cuda-downloads), or pip install "
                "nvidia-cuda-sanitizer-api-cu12")
_PREFIX = "========="
# "at conv_forward+0x2d0 in mine.cu:52" (CUDA 12) or "at 0x2d0 in mine.cu:52:conv_forward"
_LOCATION = re.compile(r"at (?:(?P<kernel>\S+?)\+0x[0-9a-fA-F]+|0x[0-9a-fA-F]+)"
                       r"(?: in (?P<file>[^\s:]+):(?P<line>\d+)(?::(?P<kernel2>.+))?)?")
_NOT_ERRORS = ("COMPUTE-SANITIZER", "ERROR SUMMARY", "RACECHECK SUMMARY", "LEAK SUMMARY",
               "Saved host backtrace", "Target application returned")


def find_compute_sanitizer() -> str | None:
    """compute-sanitizer on PATH, in the CUDA toolkit, or from the pip package."""
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    candidates = ["/usr/local/cuda/bin/compute-sanitizer"]
    if os.environ.get("CUDA_HOME"):
        candidates.insert(0, os.path.join(os.environ["CUDA_HOME"], "bin", "compute-sanitizer"))
    for entry in sys.path:
        for pattern in ("nvidia/cuda_sanitizer_api/bin/compute-sanitizer",
                        "nvidia/cu*/bin/compute-sanitizer"):
            candidates += sorted(glob.glob(os.path.join(entry, pattern)))
    return next((c for c in candidates if os.path.isfile(c) and os.access(c, os.X_OK)), None)


def sanitizer_command(tool: str, executable: str | None = None) -> list[str]:
    """The command prefix that runs a process under compute-sanitizer's `tool`."""
    if tool not in TOOLS:
        raise ConvlabError(f"unknown sanitizer tool '{tool}'; choose one of: {', '.join(TOOLS)}")
    executable = executable or find_compute_sanitizer()
    if executable is None:
        raise ConvlabError(WHERE_TO_GET)
    command = [executable, "--tool", tool, "--print-limit", str(4 * FIRST_ERRORS),
               "--error-exitcode", str(ERROR_EXIT)]
    if tool == "racecheck":
        command += ["--racecheck-report", "hazard"]
    return command


@dataclass
class Location:
    kernel: str
    file: str | None
    line: int | None

    def __str__(self) -> str:
        where = f" at {self.file}:{self.line}" if self.file else " (no line info)"
        return f"{self.kernel or 'kernel'}{where}"


@dataclass
class SanitizerError:
    what: str  # "Invalid __global__ read of size 4 bytes"
    locations: list[Location] = field(default_factory=list)
    details: list[str] = field(default_factory=list)  # thread/block, address

    def __str__(self) -> str:
        where = "; ".join(str(loc) for loc in self.locations)
        return " ".join(p for p in (self.what, f"in {where}" if where else "",
                                    f"({'; '.join(self.details)})" if self.details else "") if p)


def parse_output(text: str, display: str | None = None, offset: int = 0) -> tuple[list[SanitizerError], str]:
    """Errors and the summary line of compute-sanitizer output. With `display`, source files
    ending in .cu (the program NVRTC compiled) become display:LINE+offset."""
    errors: list[SanitizerError] = []
    summary = ""
    current: SanitizerError | None = None
    in_backtrace = False
    for raw in text.splitlines():
        if not raw.startswith(_PREFIX):
            continue
        body = raw[len(_PREFIX):]
        stripped = body.strip()
        if not stripped:
            current, in_backtrace = None, False
            continue
        if stripped.startswith(("ERROR SUMMARY", "RACECHECK SUMMARY")):
            summary = stripped
            continue
        indent = len(body) - len(body.lstrip(" "))
        if indent <= 1:
            in_backtrace = False
            if stripped.startswith(_NOT_ERRORS):
                current = None
                continue
            current = SanitizerError(_strip_location(stripped))
            errors.append(current)
            _add_locations(current, stripped, display, offset)
            continue
        if current is None:
            continue
        if stripped.startswith("Saved host backtrace") or stripped.startswith("Host Frame"):
            in_backtrace = True
        if in_backtrace or stripped.startswith("Device Frame"):
            continue
        if not _add_locations(current, stripped, display, offset):
            current.details.append(stripped)
    return errors, summary


def _strip_location(line: str) -> str:
    return re.sub(r"\s+at\s+(\S+\+)?0x.*$", "", line).removeprefix("Error: ").strip()


def _add_locations(error: SanitizerError, line: str, display: str | None, offset: int) -> bool:
    found = False
    for match in _LOCATION.finditer(line):
        file, number = match.group("file"), match.group("line")
        kernel = match.group("kernel") or match.group("kernel2") or ""
        line_no = int(number) if number else None
        if file and display and file.endswith(".cu"):
            file, line_no = display, line_no + offset
        error.locations.append(Location(kernel, file, line_no))
        found = True
    return found


@dataclass
class SanitizeReport:
    tool: str
    clean: bool
    errors: list[SanitizerError]
    summary: str
    status: str  # the isolated job's status
    reason: str  # the job's failure, when it failed

    def lines(self, first: int = FIRST_ERRORS) -> list[str]:
        if self.clean:
            return [f"compute-sanitizer {self.tool}: no errors ({self.summary or 'clean'})"]
        out = [f"compute-sanitizer {self.tool}: {self.summary or 'errors'}"]
        out += [f"  {e}" for e in self.errors[:first]]
        if len(self.errors) > first:
            out.append(f"  ... and {len(self.errors) - first} more")
        if self.reason:
            out.append(f"  the run itself: {self.reason}")
        return out

    def as_dict(self) -> dict:
        return {"tool": self.tool, "clean": self.clean, "summary": self.summary,
                "status": self.status, "reason": self.reason,
                "errors": [asdict(e) for e in self.errors]}


def sanitize(shape: ConvShape, kernel_file: str | Path | None = None, variant: str | None = None,
             tool: str = "memcheck", epilogue: str | None = None,
             timeout_s: float = SANITIZER_TIMEOUT_S, config: dict | None = None) -> SanitizeReport:
    """One checked launch of a kernel file (or a built-in variant, in `config` if given: a
    tunable variant's config as a dict) under compute-sanitizer."""
    command = sanitizer_command(tool)
    display, offset = None, 0
    if kernel_file is not None:
        display, offset = load_kernel_file(kernel_file).source_location()
    args = {"shape": shape.as_dict(), "kernel_file": None if kernel_file is None else str(kernel_file),
            "variant": variant, "epilogue": epilogue, "config": config}
    job = run_isolated("convlab.userkernel.exercise:exercise", args, timeout_s=timeout_s,
                       limit_s=max(timeout_s, 60.0) * 3, prefix=command)
    errors, summary = parse_output(job["stdout"] + "\n" + job["stderr"], display, offset)
    clean = not errors and job["returncode"] != ERROR_EXIT and job["status"] == "ok"
    return SanitizeReport(tool, clean, errors, summary, job["status"],
                          "" if job["status"] == "ok" else job["reason"])


# --- every conv layer of a model (`convlab run --sanitize`) ---------------------------------------

DEFAULT_BATCH = 16  # run --sanitize without --batch: instrumented launches are 10-100x slower,
# and each is checked against a float64 reference on the host


@dataclass
class LayerReport:
    layer: str
    shape: ConvShape
    epilogue: str | None
    report: SanitizeReport | None  # None when the kernel does not run this layer
    skipped: str = ""  # why it does not

    @property
    def clean(self) -> bool:
        return self.report is None or self.report.clean

    def lines(self) -> list[str]:
        title = f"{self.layer} ({self.shape.brief()}" + (f", {self.epilogue})" if self.epilogue else ")")
        if self.report is None:
            return [f"{title}: not run ({self.skipped})"]
        first, *rest = self.report.lines()
        return [f"{title}: {first}", *rest]

    def as_dict(self) -> dict:
        return {"layer": self.layer, "shape": self.shape.as_dict(), "epilogue": self.epilogue,
                "skipped": self.skipped, "report": self.report.as_dict() if self.report else None}


def sanitize_model(plan: NetworkPlan, kernel_file: str | Path | None = None,
                   tool: str = "memcheck", timeout_s: float = SANITIZER_TIMEOUT_S) -> list[LayerReport]:
    """Each conv layer of the planned network (net.plan) under compute-sanitizer: one checked
    launch of the kernel file (or the built-in variant) with the epilogue the network hands it
    there; a layer the variant refuses is reported with the reason."""
    sanitizer_command(tool)  # a missing tool is reported before anything runs
    require_cupy("compute-sanitizer")
    reports = []
    for decision in plan.convs.values():
        if not decision.support:
            reports.append(LayerReport(decision.name, decision.shape, None, None,
                                       decision.support.reason))
            continue
        report = sanitize(decision.shape, kernel_file=kernel_file,
                          variant=None if kernel_file is not None else plan.variant.name,
                          tool=tool, epilogue=decision.lone_epilogue, timeout_s=timeout_s)
        reports.append(LayerReport(decision.name, decision.shape, decision.lone_epilogue, report))
    return reports
