"""Autotune on first use, as cuDNN's benchmark mode and Triton's autotune do: a layer whose
tunable variant has no tuning entry for it has its model's best few tilings compiled, verified
and timed on the device, and the fastest is kept in the per-GPU cache and run.

`Autotuner` is installed into convlab/tuning.py (`tuning.set_autotuner`), which calls it from
`first_use` before the lab prepares such a layer. For one layer it takes the first
`candidates` of `variant.configs()` (the variant's own choice first, then the rest in the
order its cost model ranks them), compiles them on `jobs` child processes at once (the tuner's
`prebuild`), then times them one after another in one child process of their own
(convlab.gpu.isolate: a candidate that faults or hangs ends that process, not the run), all on
one random problem, each verified against float64 as `convlab tune` verifies. The time budget
bounds the whole layer, compiling included: candidates past it are not timed, but the first
(the own choice) always is. The fastest verified candidate goes into the cache with "by":
"autotune" (a store is atomic and locked, so processes autotuning at once lose no entry) and
into this process's memory of what autotune chose, which `tuning.find` reads first. Ctrl-C or
SIGTERM stops it with nothing stored; a layer none of whose candidates passed keeps the
variant's own choice, and the report says so.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Callable

from .. import tuning
from ..errors import ConvlabError
from ..gpu.isolate import run_isolated
from ..gpu.timer import Timing, TimingPolicy
from ..oracle.verify import Check
from ..shapes import ConvShape
from . import lab
from .tune import (config_brief, default_jobs, failure_reason, prebuild, rebuilt_variant,
                   variant_spec)

DEFAULT_CANDIDATES = 4
DEFAULT_BUDGET_S = 30.0
# A candidate's timing: enough runs for a median within ~2%, a fraction of a second each.
POLICY = TimingPolicy(warmup=2, min_runs=5, max_runs=200, target_rse=0.02, budget_s=0.3)
# The timing child's own start (CUDA context, imports) and the last candidate's timing, beyond
# the budget, before the parent gives up on it.
CHILD_SLACK_S = 60.0


@dataclass
class Timed:
    """One candidate as the timing child saw it."""

    config: dict
    timing: Timing | None = None
    check: Check | None = None
    reason: str = ""

    @property
    def passed(self) -> bool:
        return self.timing is not None and self.check is not None and self.check.passed


@dataclass
class Outcome:
    """What autotune did for one layer: the one-line summary's material."""

    variant: str
    shape: ConvShape
    epilogue: str | None
    tried: list[Timed] = field(default_factory=list)
    offered: int = 0
    seconds: float = 0.0
    stored: str = ""  # the cache file it went into, or why it did not
    failure: str = ""  # why nothing was chosen (the own choice stays)

    @property
    def best(self) -> Timed | None:
        passed = [t for t in self.tried if t.passed]
        return min(passed, key=lambda t: t.timing.median_ms) if passed else None

    def summary(self) -> str:
        layer = f"{self.variant} on {self.shape.brief()} batch {self.shape.B}" + (
            f" + {self.epilogue}" if self.epilogue else "")
        best = self.best
        if best is None:
            why = self.failure or "no candidate passed verification"
            return f"autotune {layer}: {why}; it runs its own choice"
        own = self.tried[0] if self.tried and self.tried[0].passed else None
        if own is best:
            gain = ", its own choice"
        elif own is not None:
            gain = f", {own.timing.median_ms / best.timing.median_ms:.2f}x as fast as its own choice"
        else:
            gain = ""
        timed = f"{len(self.tried)} of {self.offered} timed" if len(self.tried) < self.offered \
            else f"{self.offered} timed"
        return (f"autotune {layer}: {config_brief(best.config)}, {best.timing.median_ms:.4f} ms"
                f"{gain} ({timed}, {self.seconds:.1f} s)")


def time_candidates(variant: dict, configs: list[dict], shape: dict, epilogue: str | None,
                    policy: dict, budget_s: float, seed: int | None = None) -> list[dict]:
    """The timing child's job: each configuration on one random problem, in order, until
    `budget_s` is spent (the first is always timed); per configuration its timing and check,
    or the reason it failed."""
    start = time.monotonic()
    layer = ConvShape(**shape)
    problem = None
    out = []
    for i, config in enumerate(configs):
        if i and time.monotonic() - start > budget_s:
            break
        try:
            candidate = rebuilt_variant(variant).configured(config)
            problem = problem or lab.LayerProblem.draw(layer, candidate.on_gpu, seed)
            result = lab.run_layer(layer, candidate, TimingPolicy(**policy), epilogue,
                                   problem=problem)
        except Exception as exc:  # a broken candidate fails alone
            out.append({"config": config, "error": failure_reason(exc)})
            continue
        out.append({"config": config, "timing": result.timing.as_dict(),
                    "check": result.check.as_dict()})
    return out


class Autotuner:
    """tuning's autotuner: tunes one layer when called, reporting through `report(event,
    payload)`: ("start", Outcome) before, ("compiled", Outcome) once the candidates are built,
    ("done", Outcome) after (its summary() is the one-line report)."""

    def __init__(self, candidates: int = DEFAULT_CANDIDATES, budget_s: float = DEFAULT_BUDGET_S,
                 jobs: int | None = None,
                 report: Callable[[str, Outcome], None] | None = None):
        if candidates < 1:
            raise ConvlabError(f"autotune needs at least one candidate a layer, not {candidates}")
        if not budget_s > 0:
            raise ConvlabError(f"the autotune budget must be a positive number of seconds, "
                               f"not {budget_s:g}")
        self.candidates = candidates
        self.budget_s = budget_s
        self.jobs = jobs or default_jobs()
        self.report = report or (lambda event, outcome: None)
        self.outcomes: list[Outcome] = []

    def __call__(self, variant, shape: ConvShape, epilogue: str | None) -> Outcome:
        start = time.monotonic()
        device = tuning.device_key()
        configs = [c.as_dict() for c in variant.configs(shape, epilogue)[:self.candidates]]
        outcome = Outcome(variant.name, shape, epilogue, offered=len(configs))
        self.outcomes.append(outcome)
        self.report("start", outcome)
        if device is None or not configs:
            outcome.failure = "no GPU to time on" if device is None else "no tiling fits"
            self.report("done", outcome)
            return outcome
        if self.jobs > 1 and variant.on_gpu and len(configs) > 1:
            prebuild(variant, configs, shape, epilogue, min(self.jobs, len(configs)))
        self.report("compiled", outcome)
        left = max(0.0, self.budget_s - (time.monotonic() - start))
        spec = variant_spec(variant)
        record = run_isolated("convlab.bench.autotune:time_candidates",
                              {"variant": spec, "configs": configs, "shape": shape.as_dict(),
                               "epilogue": epilogue, "policy": dataclasses.asdict(POLICY),
                               "budget_s": left},
                              limit_s=left + CHILD_SLACK_S)
        outcome.seconds = time.monotonic() - start
        if record["status"] != "ok":
            outcome.failure = f"the timing process ended: {record['reason']}"
        else:
            outcome.tried = [Timed(r["config"], Timing.from_dict(r["timing"]), Check(**r["check"]))
                             if "error" not in r else Timed(r["config"], reason=r["error"])
                             for r in record["result"]]
        best = outcome.best
        if best is not None:
            self._keep(variant, shape, epilogue, device, outcome, best)
        self.report("done", outcome)
        return outcome

    def _keep(self, variant, shape, epilogue, device, outcome: Outcome, best: Timed) -> None:
        digest = tuning.source_hash(variant)
        key = tuning.cache_key(device, variant.name, digest, shape, epilogue)
        tuning.remember(key, best.config)
        entry = {"device": device, "variant": variant.name, "source_hash": digest,
                 "shape": shape.as_dict(), "epilogue": epilogue, "config": best.config,
                 "median_ms": best.timing.median_ms, "tried": len(outcome.tried),
                 "passed": sum(t.passed for t in outcome.tried), "by": tuning.BY_AUTOTUNE,
                 "tuned_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        try:
            outcome.stored = str(tuning.store(key, entry))
        except OSError as exc:
            outcome.stored = (f"kept for this run only: could not write the tuning cache "
                              f"{tuning.cache_path()}: {exc}")


def enable(candidates: int = DEFAULT_CANDIDATES, budget_s: float = DEFAULT_BUDGET_S,
           jobs: int | None = None,
           report: Callable[[str, Outcome], None] | None = None) -> Autotuner:
    """Install an Autotuner for the rest of this process (or until disable())."""
    autotuner = Autotuner(candidates, budget_s, jobs, report)
    tuning.set_autotuner(autotuner)
    return autotuner


def disable() -> None:
    tuning.set_autotuner(None)
