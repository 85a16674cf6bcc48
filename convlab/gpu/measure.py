"""Timing, its statistics, and the device ceilings that turn times into a roofline floor.

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

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ..shapes import FLOAT_BYTES, ConvShape
from . import compute_capability, require_cupy
from .hopper import WGMMA_PTX
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
    return load_module("measure:spin", SPIN_SOURCE, (), ("spin",)).module.get_function("spin")


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


# --- what the times mean --------------------------------------------------------------------

def element_bytes(precision: str) -> int:
    """Bytes an element of a precision class's inputs and outputs takes: fp16 and bf16 rows
    read and write 16-bit tensors (cuDNN's, and ours in a single-layer run)."""
    return 2 if precision in ("fp16", "bf16") else FLOAT_BYTES


def traffic_bytes(shape: ConvShape, epilogue: str | None = None,
                  element: int = FLOAT_BYTES) -> int:
    """Fewest bytes through device memory: inputs, weights and the output written, once each,
    `element` bytes each (a fused 2x2 pool writes a quarter of the conv's output; a fused ReLU
    writes all of it)."""
    elements = shape.min_bytes // FLOAT_BYTES
    if epilogue == "tanh-pool":
        elements -= shape.B * shape.M * shape.Ho * shape.Wo - shape.B * shape.M * (
            shape.Ho // 2) * (shape.Wo // 2)
    return element * elements


def gflops(shape: ConvShape, ms: float) -> float:
    return shape.flops / (ms * 1e-3) / 1e9


def gbps(shape: ConvShape, ms: float, epilogue: str | None = None,
         element: int = FLOAT_BYTES) -> float:
    return traffic_bytes(shape, epilogue, element) / (ms * 1e-3) / 1e9


# --- device ceilings ------------------------------------------------------------------------

# Tensor-core ceilings for the instructions the tensor-core variants use: every warp issues
# independent mma.sync operations on register fragments, nothing else. One kernel per
# instruction: (name, how the inputs are packed, mma shape and types, k of the shape).
MMA_PEAKS = {
    "tf32": ("mma_peak", "cvt.rna.tf32.f32 %0, %1;", "m16n8k8.row.col.f32.tf32.tf32.f32", 8),
    "fp16": ("mma_peak_f16", "cvt.rn.f16x2.f32 %0, %1, %1;", "m16n8k16.row.col.f32.f16.f16.f32", 16),
}
MMA_PEAK_TEMPLATE = r"""
extern "C" __global__ void NAME(float* out, int iters, float seed)
{
    unsigned int a[4], b[2];
    for (int i = 0; i < 4; ++i) asm("PACK" : "=r"(a[i]) : "f"(seed + i));
    for (int i = 0; i < 2; ++i) asm("PACK" : "=r"(b[i]) : "f"(seed - i));
    float d[8][4] = {};
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int j = 0; j < 8; ++j)
            asm volatile("mma.sync.aligned.SHAPE "
                         "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                         : "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
    float s = 0.0f;
    for (int j = 0; j < 8; ++j) s += d[j][0] + d[j][1] + d[j][2] + d[j][3];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
"""
MMA_PEAK_SOURCE = "".join(
    MMA_PEAK_TEMPLATE.replace("NAME", name).replace("PACK", pack).replace("SHAPE", shape)
    for name, pack, shape, _ in MMA_PEAKS.values())

# Hopper's warpgroup MMA (sm_90a): each warpgroup issues m64n256 wgmmas from a 128-byte-swizzled
# shared tile of small nonzero values, one group in flight, nothing else. MODE 2: fp16 (k16),
# MODE 0: tf32 (k8).
WGMMA_PEAK_SOURCE = r"""
#define BN 256
#define MF 1
#define NF 32
__device__ __forceinline__ unsigned smem_u32(const void* p)
{
    return (unsigned)__cvta_generic_to_shared(p);
}
""" + WGMMA_PTX + r"""
extern "C" __global__ void __launch_bounds__(128) wgmma_peak(float* out, int iters)
{
    __shared__ __align__(1024) unsigned tile[(64 + 256) * 32];  // A: 64 rows, B: 256, of 128 B
    for (int i = threadIdx.x; i < (64 + 256) * 32; i += 128)
        tile[i] = MODE == 0 ? __float_as_uint(1.0f + (i % 7) * 0.125f)
                            : 0x3C003C00u + (i % 5) * 0x00400040u;
    fence_proxy_async();
    __syncthreads();
    float acc[MF][NF][4];
    for (int j = 0; j < NF; ++j)
        for (int e = 0; e < 4; ++e) acc[0][j][e] = 0.0f;
    fence_operands(acc);
    const unsigned a = smem_u32(tile), b = a + 64 * 128;
    for (int it = 0; it < iters; ++it) {
        wgmma_fence();
#pragma unroll
        for (int s = 0; s < 4; ++s)
            wgmma_tile(acc, swizzle128_desc(a + s * 32), swizzle128_desc(b + s * 32));
        wgmma_commit();
        wgmma_wait<1>();
    }
    wgmma_wait<0>();
    fence_operands(acc);
    float sum = 0.0f;
    for (int j = 0; j < NF; ++j)
        for (int e = 0; e < 4; ++e) sum += acc[0][j][e];
    out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}
"""
WGMMA_PEAK_MODES = {"tf32": (0, 8), "fp16": (2, 16)}  # MODE, k of the instruction


@dataclass
class Ceilings:
    device: str
    copy_gbps: float  # device-to-device copy, bytes read + written per second
    fp32_gflops: float  # cuBLAS SGEMM 8192^3, FP32 (no TF32)
    tf32_gflops: float  # mma.sync m16n8k8 TF32 issue rate
    measured_at: str = ""
    details: dict = field(default_factory=dict)
    fp16_gflops: float | None = None  # mma.sync m16n8k16 f16 (and bf16) issue rate
    wgmma_tf32_gflops: float | None = None  # wgmma m64n256k8 tf32 (Hopper only)
    wgmma_fp16_gflops: float | None = None  # wgmma m64n256k16 f16 (Hopper only)

    def rate(self, precision: str) -> float:
        """The arithmetic ceiling of a precision class: its fastest instruction on this GPU
        (wgmma where measured). Ceilings saved before fp16 was measured fall back to twice the
        TF32 rate (Hopper's ratio for these instructions)."""
        if precision in ("fp16", "bf16"):
            return max(self.fp16_gflops or 2 * self.tf32_gflops, self.wgmma_fp16_gflops or 0.0)
        if precision == "tf32":
            return max(self.tf32_gflops, self.wgmma_tf32_gflops or 0.0)
        return self.fp32_gflops

    def floor_ms(self, shape: ConvShape, rate: str = "fp32", epilogue: str | None = None,
                 flops: float | None = None, element: int | None = None) -> tuple[float, str]:
        """max(bytes / copy bandwidth, FLOPs / rate) and which of the two binds; `flops` are
        what the variant issues at `rate` (default: the direct conv's), the bytes those of
        `element`-byte tensors (default: the rate's, 16-bit for fp16 and bf16; a 16-bit class
        computing in FP32, as the depthwise variants do, passes its own)."""
        element = element_bytes(rate) if element is None else element
        mem = traffic_bytes(shape, epilogue, element) / (self.copy_gbps * 1e9) * 1e3
        flops = shape.flops if flops is None else flops
        compute = flops / (self.rate(rate) * 1e9) * 1e3
        return (mem, "memory") if mem >= compute else (compute, "compute")

    def as_dict(self) -> dict:
        return asdict(self)


def _time_once(fn, repeats: int = 10) -> float:
    return time_device(fn, TimingPolicy(warmup=2, min_runs=repeats, max_runs=repeats)).median_ms


def measure_ceilings() -> Ceilings:
    import cupy

    device = device_info()["name"]
    n = 256 * 1024 * 1024  # 1 GiB of float32, far past the L2
    src = cupy.random.random(n, dtype=cupy.float32)
    dst = cupy.empty_like(src)
    ms = _time_once(lambda: cupy.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, src.nbytes,
                                                          3, 0))
    copy_gbps = 2 * src.nbytes / (ms * 1e-3) / 1e9
    del src, dst

    size = 8192
    a = cupy.random.random((size, size), dtype=cupy.float32)
    b = cupy.random.random((size, size), dtype=cupy.float32)
    c = cupy.empty_like(a)
    ms = _time_once(lambda: cupy.matmul(a, b, out=c))
    fp32 = 2 * size**3 / (ms * 1e-3) / 1e9
    del a, b, c

    module = load_module("ceiling:mma", MMA_PEAK_SOURCE, ("-std=c++17",),
                         tuple(peak[0] for peak in MMA_PEAKS.values())).module
    sms = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["multiProcessorCount"]
    blocks_, threads, iters = sms * 8, 256, 4096
    out = cupy.empty(blocks_ * threads, dtype=cupy.float32)
    rates = {}
    for precision, (name, _, _, k) in MMA_PEAKS.items():
        kernel = module.get_function(name)
        ms = _time_once(lambda: kernel((blocks_,), (threads,), (out, np.int32(iters), np.float32(1.5))))
        rates[precision] = blocks_ * threads / 32 * iters * 8 * (2 * 16 * 8 * k) / (ms * 1e-3) / 1e9
    wgmma = wgmma_rates(sms) if compute_capability() == (9, 0) else {}
    return Ceilings(device, round(copy_gbps, 1), round(fp32, 1), round(rates["tf32"], 1),
                    time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    {"copy_bytes": 2 * n * 4, "sgemm_size": size, "mma_blocks": blocks_},
                    round(rates["fp16"], 1), wgmma.get("tf32"), wgmma.get("fp16"))


def wgmma_rates(sms: int) -> dict[str, float]:
    """GFLOP/s of back-to-back m64n256 wgmmas, three warpgroups per SM (sm_90a): all resident
    at once (154 registers each), so there is no tail wave."""
    import cupy

    blocks_, iters = sms * 3, 4096
    out = cupy.empty(blocks_ * 128, dtype=cupy.float32)
    rates = {}
    for precision, (mode, k) in WGMMA_PEAK_MODES.items():
        kernel = load_module(f"ceiling:wgmma-{precision}", WGMMA_PEAK_SOURCE,
                             ("-std=c++17", f"-DMODE={mode}"), ("wgmma_peak",),
                             "sm_90a").module.get_function("wgmma_peak")
        ms = _time_once(lambda: kernel((blocks_,), (128,), (out, np.int32(iters))))
        rates[precision] = round(blocks_ * iters * 4 * (2 * 64 * 256 * k) / (ms * 1e-3) / 1e9, 1)
    return rates


def cache_dir() -> Path:
    """Where convlab keeps measured ceilings, tuning results and cached references."""
    return Path(os.environ.get("CONVLAB_CACHE_DIR", Path.home() / ".cache" / "convlab"))


def ceilings(refresh: bool = False) -> Ceilings:
    """The current device's ceilings, measured once and cached on disk per device and driver."""
    info = device_info()
    key = "".join(ch if ch.isalnum() else "-" for ch in
                  f"{info['name']}-{info['pci_bus_id']}-{info['driver']}")
    path = cache_dir() / f"ceilings-{key}.json"
    if not refresh and path.exists():
        try:
            cached = Ceilings(**json.loads(path.read_text()))
        except (ValueError, TypeError):
            cached = None  # an unreadable cache is measured again and overwritten
        # Ceilings saved before the wgmma rates were measured would keep a Hopper GPU's floors
        # on mma.sync's rates for good: those are measured again too.
        if cached is not None and not (cached.wgmma_fp16_gflops is None
                                       and compute_capability() == (9, 0)):
            return cached
    result = measure_ceilings()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result.as_dict(), indent=2))
    tmp.replace(path)
    return result


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
