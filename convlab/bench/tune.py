"""`convlab tune`: search a variant's tiling space for one layer and remember the winner.

Every configuration in `variant.configs(shape, epilogue)` is compiled, verified and timed by
`lab.run_layer` (the variant's first configuration is its own heuristic choice, the baseline the
others are measured against), each in a child process of its own (convlab.gpu.isolate): a candidate
that faults leaves the CUDA context unusable, one that hangs never returns, and either would
otherwise end the sweep or fail every candidate after it. A configuration that fails to compile,
to verify or to run, or that crashes or hangs its process, is a FAIL row with its reason and
the sweep goes on. The fastest verified one is stored in convlab/tuning.py's on-disk cache,
which the variants read. Compiling is most of a sweep's time and needs no GPU of its own, so
with `jobs` > 1 the candidates are first compiled on that many child processes at once (into
CuPy's on-disk kernel cache), then timed one at a time, the GPU to themselves.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from .. import tuning
from ..errors import ConvlabError, KernelCompileError
from ..gpu import unavailable_reason
from ..gpu.isolate import run_isolated, sigterm_interrupts, stop_status
from ..gpu.roofline import gflops
from ..gpu.timer import Timing, TimingPolicy
from ..kernels import VARIANTS, get_variant
from ..kernels.igemm.tiling import Tiling
from ..oracle.verify import Check
from ..plot import require_pyplot, save_figure
from ..shapes import ConvShape
from ..tables import Col, fitted_table
from . import lab, suites

PASS, FAIL = "PASS", "FAIL"


def config_text(config: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in config.items())


def config_brief(config: dict) -> str:
    """A tiling as tables print it (Tiling.brief: '128x256x64 8x1w s4 k1 tma ws'), another
    config as config_text's key=value pairs."""
    try:
        return Tiling.from_dict(config).brief()
    except (TypeError, ValueError):
        return config_text(config)


# --- the sweep ------------------------------------------------------------------------------

@dataclass
class Candidate:
    config: dict
    status: str = PASS
    reason: str = ""
    timing: Timing | None = None
    bound_ratio: float | None = None
    max_rel_error: float | None = None
    compile_s: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status == PASS and self.timing is not None

    def config_brief(self) -> str:
        return config_brief(self.config)

    @property
    def median_ms(self) -> float | None:
        return self.timing.median_ms if self.passed else None

    def as_dict(self) -> dict:
        return {"config": self.config, "status": self.status, "reason": self.reason,
                "timing": self.timing.as_dict() if self.timing else None,
                "bound_ratio": self.bound_ratio, "max_rel_error": self.max_rel_error,
                "compile_s": self.compile_s}


@dataclass
class TuneResult:
    variant: str
    precision: str
    shape: ConvShape
    epilogue: str | None
    device: str
    source_hash: str
    candidates: list[Candidate] = field(default_factory=list)
    cache_path: str | None = None  # where the best configuration was stored
    cache_error: str = ""
    interrupted: str = ""  # how far the sweep got when Ctrl-C or SIGTERM stopped it
    stop_status: int = 0  # then the shell's exit status for that signal (130, 143)

    @property
    def best(self) -> Candidate | None:
        passed = [c for c in self.candidates if c.passed]
        return min(passed, key=lambda c: c.median_ms) if passed else None

    @property
    def baseline(self) -> Candidate | None:
        """The variant's own first choice (configs()[0]), if it passed."""
        first = self.candidates[0] if self.candidates else None
        return first if first is not None and first.passed else None

    def as_dict(self) -> dict:
        best = self.best
        return {"variant": self.variant, "precision": self.precision,
                "shape": self.shape.as_dict(), "epilogue": self.epilogue, "device": self.device,
                "source_hash": self.source_hash,
                "best": best.config if best else None,
                "best_ms": best.median_ms if best else None,
                "candidates": [c.as_dict() for c in self.candidates],
                "cache_path": self.cache_path, "cache_error": self.cache_error,
                **({"interrupted": self.interrupted} if self.interrupted else {})}


def failure_reason(exc: BaseException) -> str:
    """One line saying why a candidate failed (the compiler's first error for a compile error)."""
    if isinstance(exc, KernelCompileError):
        lines = [ln.strip() for ln in exc.log.splitlines() if ln.strip()]
        first = next((ln for ln in lines if "error" in ln), lines[0] if lines else "")
        return f"does not compile: {first}"
    text = str(exc).strip().splitlines()
    detail = text[0] if text else ""
    return detail if isinstance(exc, ConvlabError) else f"{type(exc).__name__}: {detail}"


def _variants_with_configs(shape: ConvShape, epilogue: str | None) -> list[str]:
    names = []
    for name, v in VARIANTS.items():
        with contextlib.suppress(Exception):
            if v.supports(shape) and (epilogue is None or epilogue in v.epilogues) \
                    and v.configs(shape, epilogue):
                names.append(name)
    return names


def variant_spec(variant) -> dict:
    """How a child process finds the variant again (rebuilt_variant): a registered one by its
    name (a family's members share one class, told apart by their Form), else by its class."""
    spec = {"module": type(variant).__module__, "class": type(variant).__qualname__,
            "output_dtype": np.dtype(variant.output_dtype).name}
    if VARIANTS.get(variant.name) is not None and type(VARIANTS[variant.name]) is type(variant):
        spec["name"] = variant.name
    return spec


def rebuilt_variant(spec: dict):
    """variant_spec's variant, as the registry holds it or as its class builds it, writing
    what the original writes (an fp16 conv's output for the conv after it)."""
    if "name" in spec:
        variant = VARIANTS[spec["name"]]
    else:
        variant = getattr(importlib.import_module(spec["module"]), spec["class"])()
    return variant.writing(spec.get("output_dtype", variant.output_dtype))


def measure_candidate(variant: dict, config: dict, shape: dict, epilogue: str | None,
                      policy: dict) -> dict:
    """One candidate, run in an isolated child (tune calls it through isolate.run_isolated):
    the variant is rebuilt (rebuilt_variant) and configured with `config`. Returns the timing, the check
    and the compile time, or {"error": reason} for an error the child survived."""
    try:
        layer = lab.run_layer(ConvShape(**shape), rebuilt_variant(variant).configured(config),
                              TimingPolicy(**policy), epilogue)
    except Exception as exc:  # the parent lists it as a FAIL row
        return {"error": failure_reason(exc)}
    return {"timing": layer.timing.as_dict(), "check": layer.check.as_dict(),
            "compile_s": layer.compile_s}


def build_candidate(variant: dict, config: dict, shape: dict, epilogue: str | None) -> float:
    """Compile one candidate, in an isolated child (prebuild calls it through
    isolate.run_isolated); returns the seconds NVRTC took. The module lands in CuPy's on-disk
    cache, where the candidate's measurement finds it."""
    return rebuilt_variant(variant).configured(config).compile(ConvShape(**shape),
                                                               epilogue).seconds


def default_jobs() -> int:
    """Compile processes for a sweep: one per core, at most 8 (more only queue on NVRTC)."""
    return max(1, min(8, os.cpu_count() or 1))


def prebuild(variant, configs: list[dict], shape: ConvShape, epilogue: str | None,
             jobs: int) -> list[float | None]:
    """Compile every configuration on `jobs` child processes at once; per configuration the
    compile seconds, or None where it did not compile (its measurement then fails with the
    compiler's reason, as it would without prebuilding)."""
    spec = variant_spec(variant)

    def build(config: dict) -> float | None:
        record = run_isolated("convlab.bench.tune:build_candidate",
                              {"variant": spec, "config": config, "shape": shape.as_dict(),
                               "epilogue": epilogue})
        return record["result"] if record["status"] == "ok" else None

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(build, configs))


def _in_process(variant, config: dict, shape: ConvShape, epilogue: str | None,
                policy: TimingPolicy) -> Candidate:
    try:
        layer = lab.run_layer(shape, variant.configured(config), policy, epilogue)
    except Exception as exc:  # a broken candidate is a FAIL row, never the end of the sweep
        return Candidate(config, FAIL, failure_reason(exc))
    return _candidate(config, layer.timing, layer.check, layer.compile_s)


def _isolated(variant, config: dict, shape: ConvShape, epilogue: str | None,
              policy: TimingPolicy) -> Candidate:
    spec = variant_spec(variant)
    record = run_isolated("convlab.bench.tune:measure_candidate",
                          {"variant": spec, "config": config, "shape": shape.as_dict(),
                           "epilogue": epilogue, "policy": dataclasses.asdict(policy)})
    value = record["result"] if record["status"] == "ok" else {"error": record["reason"]}
    if "error" in value:
        return Candidate(config, FAIL, value["error"])
    return _candidate(config, Timing.from_dict(value["timing"]), Check(**value["check"]),
                      value["compile_s"])


def _candidate(config: dict, timing: Timing, check: Check, compile_s: float) -> Candidate:
    return Candidate(config, PASS if check.passed else FAIL, "" if check.passed else check.reason,
                     timing, check.bound_ratio, check.max_rel_error, compile_s)


def tune(shape: ConvShape, kernel, epilogue: str | None = None,
         policy: TimingPolicy | None = None,
         on_step: Callable[[int, int, dict | None], None] | None = None,
         isolate: bool = True, jobs: int = 1) -> TuneResult:
    """Compile, verify and time every configuration of `kernel` (a name or a Variant) for
    `shape`; store the fastest verified one in the cache. on_step(done, total, config) is called
    before each candidate (config) and once at the end (None). With `isolate` (the default)
    each candidate runs in a child process, which finds the variant again (variant_spec);
    without, in this process (a fault can then spoil the candidates after it). With `jobs` > 1
    a GPU variant's candidates are compiled on that many processes first (`prebuild`).
    Ctrl-C or SIGTERM ends the sweep with the candidates timed so far and nothing stored (the
    fastest of part of the space is not the tuned choice); `interrupted` says how far it got."""
    variant = get_variant(kernel) if isinstance(kernel, str) else kernel
    support = variant.supports(shape)
    if not support:
        raise ConvlabError(f"kernel '{variant.name}' does not support {shape.describe()}: "
                           f"{support.reason}")
    if epilogue is not None and epilogue not in variant.epilogues:
        raise ConvlabError(f"kernel '{variant.name}' has no {epilogue} epilogue; leave out "
                           f"--epilogue or choose a kernel that has it")
    # The dict form from here on: records, the cache and the child process all take JSON.
    configs = [config.as_dict() for config in variant.configs(shape, epilogue)]
    if not configs:
        others = _variants_with_configs(shape, epilogue)
        raise ConvlabError(f"kernel '{variant.name}' has no tiling space to search; kernels with "
                           f"one for this layer: {', '.join(others) or 'none'}")
    device = tuning.device_key()
    if device is None:
        raise ConvlabError(f"tuning times kernels on a CUDA GPU: {unavailable_reason()}")
    policy = policy or TimingPolicy()
    step = on_step or (lambda done, total, config: None)
    result = TuneResult(variant.name, variant.precision, shape, epilogue, device,
                        tuning.source_hash(variant))
    run = _isolated if isolate else _in_process
    built: list[float | None] = [None] * len(configs)
    try:
        with sigterm_interrupts():
            if jobs > 1 and variant.on_gpu:
                step(0, len(configs),
                     {"compiling": f"{len(configs)} candidates on {jobs} processes"})
                built = prebuild(variant, configs, shape, epilogue, jobs)
            for i, config in enumerate(configs):
                step(i, len(configs), config)
                candidate = run(variant, config, shape, epilogue, policy)
                # The measurement found the module compiled: its compile time is the prebuild's.
                candidate.compile_s += built[i] or 0.0
                result.candidates.append(candidate)
    except KeyboardInterrupt as stop:
        result.interrupted = (f"stopped after {len(result.candidates)} of {len(configs)} "
                              "candidates")
        result.stop_status = stop_status(stop)
        return result
    step(len(configs), len(configs), None)
    best = result.best
    if best is not None:
        entry = {"device": device, "variant": variant.name, "source_hash": result.source_hash,
                 "shape": shape.as_dict(), "epilogue": epilogue, "config": best.config,
                 "median_ms": best.median_ms, "tried": len(configs),
                 "passed": sum(c.passed for c in result.candidates),
                 "tuned_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        key = tuning.cache_key(device, variant.name, result.source_hash, shape, epilogue)
        try:
            result.cache_path = str(tuning.store(key, entry))
        except OSError as exc:
            result.cache_error = f"could not write the tuning cache {tuning.cache_path()}: {exc}"
    return result


# --- what the sweep shows -------------------------------------------------------------------

def sweep_table(result: TuneResult, width: int | None = None, wide: bool = False):
    """One row per candidate, in the order tried; the best in bold green. Failure reasons are
    listed below the table (failure_lines)."""
    from rich.text import Text


    best = result.best
    cols = [Col("#"), Col("config", "left", wrap=True), Col("status", "left"), Col("Op Time ms"),
            Col("x best"), Col("min ms", key=False, priority=1),
            Col("GFLOP/s", key=False, priority=2), Col("err/bound", key=False, priority=3),
            Col("RSE", key=False, priority=4), Col("runs", key=False, priority=5),
            Col("compile s", key=False, priority=6)]
    rows = []
    for i, c in enumerate(result.candidates, 1):
        t = c.timing if c.passed else None
        style = "bold green" if c is best else None
        cells = [str(i), config_text(c.config), c.status,
                 "-" if t is None else f"{t.median_ms:.4f}",
                 "-" if t is None else f"{t.median_ms / best.median_ms:.2f}",
                 "-" if t is None else f"{t.min_ms:.4f}",
                 "-" if t is None else f"{gflops(result.shape, t.median_ms):,.0f}",
                 "-" if c.bound_ratio is None else f"{c.bound_ratio:.2g}",
                 "-" if t is None else f"{100 * t.rse:.1f}%", "-" if t is None else str(t.n),
                 "-" if c.timing is None else f"{c.compile_s:.2f}"]
        row = [Text(cell, style=style) for cell in cells]
        row[2] = Text(c.status, style="green" if c.passed else "bold red")
        rows.append(row)
    title = (f"{result.variant} ({result.precision}) on {result.device}: "
             f"{result.shape.describe()}{', + ' + result.epilogue if result.epilogue else ''}")
    return fitted_table(title, cols, rows, width, wide)


def failure_lines(result: TuneResult) -> list[str]:
    return [f"#{i} {config_text(c.config)}: {c.reason}"
            for i, c in enumerate(result.candidates, 1) if not c.passed]


def summary(result: TuneResult) -> str:
    best, base = result.best, result.baseline
    if result.interrupted:
        return (f"{result.interrupted}: the rows above are what was timed; nothing was stored "
                "in the tuning cache")
    if best is None:
        return "no configuration passed verification: nothing was stored"
    text = f"best: {config_text(best.config)}, {best.median_ms:.4f} ms"
    if base is not None and base is not best:
        text += f", {base.median_ms / best.median_ms:.2f}x faster than the default choice (#1)"
    elif base is best:
        text += ", the default choice (#1)"
    if result.cache_path:
        text += f"; stored in {result.cache_path}"
    return text


def plot_sweep(result: TuneResult, path: Path) -> Path:
    """A horizontal bar per candidate, in the order tried (#1, the default choice, on top):
    Op Time with its value, the best in green, FAILs marked with their status."""
    plt = require_pyplot()
    best = result.best
    n = len(result.candidates)
    fig, ax = plt.subplots(figsize=(11.0, 1.4 + 0.32 * n))
    heights = [c.median_ms if c.passed else 0.0 for c in result.candidates]
    colours = ["tab:green" if c is best else "tab:blue" if c.passed else "tab:red"
               for c in result.candidates]
    ax.barh(range(n), heights, color=colours)
    for i, c in enumerate(result.candidates):
        text = f" {c.median_ms:.4f}" if c.passed else f" {c.status}"
        ax.annotate(text, (heights[i], i), va="center", fontsize=8,
                    color="black" if c.passed else "tab:red")
    ax.set_yticks(range(n), [f"#{i + 1} {config_text(c.config)}"
                             for i, c in enumerate(result.candidates)], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.15 * max(heights + [1e-3]))
    ax.set_xlabel("Op Time (ms, median)")
    ax.set_title(f"convlab tune: {result.variant} on {result.shape.brief()} "
                 f"(batch {result.shape.B})\n{result.device}", fontsize=10)
    ax.grid(True, axis="x", alpha=0.3)
    return save_figure(fig, path)


# --- a suite's layers, one sweep each ---------------------------------------------------------

def suite_cells(suite: str, kernel, batches: list[int] | None = None):
    """(label, shape, epilogue) of every suite cell the variant runs: the layers it supports
    and is meant for (suites.meant_for), each with its network's epilogue where the variant
    has it."""
    variant = get_variant(kernel) if isinstance(kernel, str) else kernel
    out = []
    for layer, batch in suites.cells(suite, batches):
        shape = layer.at(batch)
        if not suites.meant_for(variant.name, shape) or not variant.supports(shape):
            continue
        epilogue = layer.epilogue if layer.epilogue in variant.epilogues else None
        out.append((f"{layer.label} b{batch}", shape, epilogue))
    if not out:
        raise ConvlabError(f"kernel '{variant.name}' runs none of suite {suite}'s layers")
    return out


def own_ratio(result: TuneResult) -> float | None:
    """The variant's own choice (candidate #1) over the best: 1.0 where it was the best."""
    best, base = result.best, result.baseline
    return None if best is None or base is None else base.median_ms / best.median_ms


def suite_table(labelled: list[tuple[str, TuneResult]], width: int | None = None,
                wide: bool = False):
    """One row per cell: the best tiling, its time and how far the own choice was from it."""
    cols = [Col("cell", "left", wrap=True), Col("best", "left", wrap=True), Col("ms"),
            Col("own / best"), Col("tried", key=False, priority=1)]
    rows = []
    for label, result in labelled:
        best, ratio = result.best, own_ratio(result)
        rows.append([label, "-" if best is None else best.config_brief(),
                     "-" if best is None else f"{best.median_ms:.4f}",
                     "-" if ratio is None else f"{ratio:.2f}",
                     f"{sum(c.passed for c in result.candidates)}/{len(result.candidates)}"])
    title = f"tuned: {labelled[0][1].variant} on {labelled[0][1].device}" if labelled else "tuned"
    return fitted_table(title, cols, rows, width, wide)


def suite_summary(labelled: list[tuple[str, TuneResult]]) -> str:
    ratios = [r for r in (own_ratio(result) for _, result in labelled) if r is not None]
    if not ratios:
        return "no cell had both its own choice and a best verified"
    near = sum(r <= 1.10 for r in ratios)
    close = sum(r <= 1.25 for r in ratios)
    return (f"the own choice was within 1.10x of the best on {near} of {len(ratios)} cells, "
            f"within 1.25x on {close}; worst {max(ratios):.2f}x")
