"""Timing a device op and the statistics of its samples.

Rules (DESIGN.md): device work is timed with CUDA events around the op after warm-up, so JIT
compilation, module load and allocation never land in a sample; runs repeat until the median is
known to about 1% (relative standard error) or a time budget is spent; reports give the median
with the minimum and a spread figure, and the number of runs behind them.

The host's dispatch stays out of every sample (method QUEUED): a sample is N back-to-back
launches between two events, all of them queued behind a spin kernel that keeps the GPU busy
until the host has issued the whole burst, so the interval holds device work only, however
slow the launch path (PyTorch's dispatch, DLPack, CuPy's argument packing). N is chosen so the
interval is about BURST_MS; the time reported is per launch. Each sample checks that the spin
really outlasted the host (the start event had not been reached when the last launch was
issued), and lengthens the spin and takes the sample again where it did not. The last sample,
whose output the lab verifies, is one launch, queued the same way. SINGLE is the old
method, kept to measure what it adds: an event, one launch, an event, on an idle GPU.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .isolate import gpu_wait
from .jit import load_module

# One sample's cost is unknown up front: the rule stops on precision, a run cap or a time budget.
DEFAULT_MIN_RUNS = 10
DEFAULT_MAX_RUNS = 2000
DEFAULT_TARGET_RSE = 0.01
DEFAULT_BUDGET_S = 2.0
DEFAULT_WARMUP = 3

QUEUED = "queued"  # N launches between two events, queued behind a spin kernel (default)
SINGLE = "single"  # an event, one launch, an event, on an idle GPU: the host's dispatch included
TIMING_METHODS = (QUEUED, SINGLE)
BURST_MS = 1.0  # a queued sample's interval: far above the events' 0.5 us resolution
MAX_LAUNCHES = 200  # per sample: well inside the launch queue, which blocks the host when full
SPIN_MARGIN = 2.0  # the spin lasts this many times the host's measured time to issue the burst
SPIN_FLOOR_MS = 0.05
MAX_SPIN_MS = 50.0  # a launch path slower than this per burst is host-bound: `drained` says so


def median_rse(samples) -> float:
    """Relative standard error of the median: 1.2533 * sigma / sqrt(n) / median, with sigma
    estimated robustly from the median absolute deviation (one outlier barely moves it)."""
    n = len(samples)
    if n < 2:
        return math.inf
    a = np.asarray(samples, dtype=np.float64)
    med = float(np.median(a))
    if med <= 0:
        return math.inf
    sigma = 1.4826 * float(np.median(np.abs(a - med)))
    return 1.2533 * sigma / math.sqrt(n) / med


def stop_reason(samples, elapsed_s: float, *, min_runs: int = DEFAULT_MIN_RUNS,
                max_runs: int = DEFAULT_MAX_RUNS, target_rse: float = DEFAULT_TARGET_RSE,
                budget_s: float = DEFAULT_BUDGET_S) -> str | None:
    """Why to stop now ("converged", "max-runs", "budget"), or None to take another sample."""
    n = len(samples)
    if n < min_runs:
        return None
    if median_rse(samples) <= target_rse:
        return "converged"
    if n >= max_runs:
        return "max-runs"
    if elapsed_s >= budget_s:
        return "budget"
    return None


@dataclass
class Timing:
    samples_ms: list[float]  # per launch
    stop: str = "converged"
    cold: bool = False
    clock: str = "cuda-events"
    # How samples were taken: QUEUED, SINGLE, or "host" for the CPU variant. Records written
    # before the method existed timed single launches.
    method: str = SINGLE
    launches: int = 1  # launches per sample (the interval over this is one sample)
    # Samples kept although the GPU caught up with the host before it had issued them (after
    # retakes with a longer spin, at MAX_SPIN_MS): their time holds some of the host's dispatch.
    drained: int = 0

    @property
    def n(self) -> int:
        return len(self.samples_ms)

    @property
    def median_ms(self) -> float:
        return float(np.median(self.samples_ms))

    @property
    def min_ms(self) -> float:
        return float(np.min(self.samples_ms))

    @property
    def spread_pct(self) -> float:
        """Interquartile range as a percentage of the median."""
        q1, q3 = np.percentile(self.samples_ms, [25, 75])
        return float((q3 - q1) / self.median_ms * 100) if self.median_ms > 0 else 0.0

    @property
    def rse(self) -> float:
        return median_rse(self.samples_ms)

    def as_dict(self) -> dict:
        return {"median_ms": self.median_ms, "min_ms": self.min_ms, "spread_pct": self.spread_pct,
                "rse": self.rse, "n": self.n, "stop": self.stop, "cold": self.cold,
                "clock": self.clock, "method": self.method, "launches": self.launches,
                "drained": self.drained, "samples_ms": list(map(float, self.samples_ms))}

    @classmethod
    def from_dict(cls, d: dict) -> "Timing":
        return cls(samples_ms=list(d["samples_ms"]), stop=d.get("stop", "converged"),
                   cold=d.get("cold", False), clock=d.get("clock", "cuda-events"),
                   method=d.get("method", "host" if d.get("clock") == "host" else SINGLE),
                   launches=d.get("launches", 1), drained=d.get("drained", 0))

    def describe(self) -> str:
        """How the samples were taken, in words a table's legend can use."""
        if self.method == QUEUED:
            return (f"CUDA events around {self.launches} back-to-back launch"
                    f"{'es' if self.launches > 1 else ''} queued behind a spin kernel "
                    "(host dispatch excluded), per launch")
        if self.method == SINGLE:
            return "CUDA events around one launch on an idle GPU (host dispatch included)"
        return "host clock"


@dataclass
class TimingPolicy:
    warmup: int = DEFAULT_WARMUP
    min_runs: int = DEFAULT_MIN_RUNS
    max_runs: int = DEFAULT_MAX_RUNS
    target_rse: float = DEFAULT_TARGET_RSE
    budget_s: float = DEFAULT_BUDGET_S
    cold: bool = False  # flush the L2 cache before every sample (one launch per sample then)
    method: str = QUEUED
    burst_ms: float = BURST_MS

    def __post_init__(self):
        if self.method not in TIMING_METHODS:
            raise ValueError(f"timing method {self.method!r} is none of {', '.join(TIMING_METHODS)}")

    def stop(self, samples, elapsed_s: float) -> str | None:
        return stop_reason(samples, elapsed_s, min_runs=self.min_runs, max_runs=self.max_runs,
                           target_rse=self.target_rse, budget_s=self.budget_s)


class L2Flusher:
    """Writes a buffer twice the L2's size, evicting whatever an op left in the cache."""

    def __init__(self):
        import cupy

        device = cupy.cuda.Device()
        l2 = cupy.cuda.runtime.getDeviceProperties(device.id)["l2CacheSize"]
        self.buffer = cupy.empty(max(2 * l2, 1 << 20) // 4, dtype=cupy.float32)

    def __call__(self) -> None:
        self.buffer.fill(1.0)


SPIN_SOURCE = r"""
extern "C" __global__ void spin(unsigned long long ns)
{
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}
"""


def _spin_kernel():
    return load_module("timer:spin", SPIN_SOURCE, (), ("spin",)).module.get_function("spin")


def hold_device(ms: float) -> None:
    """Keep the current stream busy for `ms` milliseconds (one thread reading the global
    timer), so that work issued meanwhile queues up behind it and runs back to back."""
    _spin_kernel()((1,), (1,), (np.uint64(int(ms * 1e6)),))


class Burst:
    """Queued launches of `fn` between two events: `launches` per sample, behind a spin long
    enough for the host to issue them all (from the host time one launch took in warm-up)."""

    def __init__(self, fn: Callable[[], None], launches: int, host_ms: float):
        self.fn = fn
        self.launches = launches
        self.spin_ms = min(MAX_SPIN_MS, max(SPIN_FLOOR_MS, SPIN_MARGIN * host_ms * launches))

    def take(self, start, end) -> bool:
        """Record one sample; False when the GPU reached the start event before the host had
        issued the last launch (the spin was too short: it is doubled for the next try, up to
        MAX_SPIN_MS)."""
        hold_device(self.spin_ms)
        start.record()
        for _ in range(self.launches):
            self.fn()
        end.record()
        if not start.done:
            return True
        self.spin_ms = min(2 * self.spin_ms, MAX_SPIN_MS)
        return False

    @property
    def at_limit(self) -> bool:
        return self.spin_ms >= MAX_SPIN_MS


def _host_launch_ms(fn: Callable[[], None], runs: int) -> float:
    """The least host time of issuing `fn` (no waiting on the device): what a burst's spin
    must cover per launch."""
    import cupy

    times = []
    for _ in range(max(1, runs)):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
        with gpu_wait():
            cupy.cuda.Device().synchronize()
    return min(times)


def time_device(fn: Callable[[], None], policy: TimingPolicy | None = None,
                after_warmup: Callable[[], None] | None = None,
                before_last: Callable[[], None] | None = None,
                after_sample: Callable[[], None] | None = None) -> Timing:
    """Median-of-many CUDA-event timing of `fn` (which launches device work), per launch.

    With the QUEUED method (the default) each sample is a burst of launches queued behind a
    spin kernel (the module docstring says why); with SINGLE, one launch on an idle GPU; with
    `policy.cold`, one launch per sample after the L2 is flushed, still queued behind a spin.
    `after_warmup` runs between warm-up and the timed runs: the lab poisons the output there,
    so what is verified afterwards was written by a timed run, not left over from warm-up.
    `before_last` runs once the stop rule is met, before one last timed sample of a single
    launch (queued behind a spin like the others), and again before each retake of it: the lab
    gives that launch an input no run has seen, and verifies its output. `after_sample` runs
    after each sample's stop event has completed, outside the timed region. Waits on the device
    are marked for an isolating parent process (isolate.gpu_wait), which kills a run that hangs
    in one.
    """
    import cupy

    policy = policy or TimingPolicy()
    flush = L2Flusher() if policy.cold else None
    queued = policy.method == QUEUED
    if queued:
        _spin_kernel()  # compiled and loaded here, not inside a marked wait
    for _ in range(max(1, policy.warmup) - 1):
        fn()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    drained = 0

    def take(burst: Burst | None, before: Callable[[], None] | None = None) -> float:
        """One sample, per launch; a queued one the GPU caught up with is taken again with a
        longer spin, and kept as it is (counted in `drained`) once the spin is at its limit."""
        nonlocal drained
        while True:
            if before:
                before()
            if flush:
                flush()
            if burst is None:
                start.record()
                fn()
                end.record()
                taken = True
            else:
                taken = burst.take(start, end)
            with gpu_wait():
                end.synchronize()
            if taken or burst.at_limit:
                drained += not taken
                return cupy.cuda.get_elapsed_time(start, end) / (burst.launches if burst else 1)

    burst = last = None
    if queued:
        host_ms = _host_launch_ms(fn, 2)
        last = Burst(fn, 1, host_ms)
        once = take(last)
        launches = 1
        if not flush:  # a burst lasts about policy.burst_ms, its spin at most MAX_SPIN_MS
            launches = max(1, min(MAX_LAUNCHES, math.ceil(policy.burst_ms / max(once, 1e-4)),
                                  int(MAX_SPIN_MS / (SPIN_MARGIN * max(host_ms, 1e-6)))))
        burst = Burst(fn, launches, host_ms)
        drained = 0
    else:
        fn()
    if after_warmup:
        after_warmup()
    with gpu_wait():
        cupy.cuda.Device().synchronize()
    samples: list[float] = []
    t0 = time.perf_counter()
    while True:
        samples.append(take(burst))
        if after_sample:
            after_sample()
        reason = policy.stop(samples, time.perf_counter() - t0)
        if reason:
            if before_last:
                samples.append(take(last, before_last))
                if after_sample:
                    after_sample()
            return Timing(samples, reason, policy.cold, method=policy.method,
                          launches=burst.launches if burst else 1, drained=drained)


def time_host(fn: Callable[[], None], policy: TimingPolicy | None = None,
              after_warmup: Callable[[], None] | None = None,
              before_last: Callable[[], None] | None = None) -> Timing:
    """The same rule with the host clock, for the CPU variant."""
    policy = policy or TimingPolicy()
    for _ in range(min(policy.warmup, 1)):
        fn()
    if after_warmup:
        after_warmup()
    samples: list[float] = []

    def sample() -> None:
        s = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - s) * 1e3)

    t0 = time.perf_counter()
    while True:
        sample()
        reason = policy.stop(samples, time.perf_counter() - t0)
        if reason:
            if before_last:
                before_last()
                sample()
            return Timing(samples, reason, False, "host", method="host")
