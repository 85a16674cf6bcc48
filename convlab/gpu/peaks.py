"""The device's ceilings: copy bandwidth, cuBLAS SGEMM and the tensor-core instructions' issue
rates, measured once per device and driver and cached on disk; the roofline floor of a layer
is the larger of its bytes over the copy bandwidth and its FLOPs over its class's rate."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from ..shapes import ConvShape
from . import cache_dir, compute_capability
from .hardware import device_info
from .hopper import WGMMA_PTX
from .jit import load_module
from .roofline import element_bytes, traffic_bytes
from .timer import TimingPolicy, time_device

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
            WgmmaOp<BN, ModeElement<MODE>::type>::mma<0>(
                acc, swizzle128_desc(a + s * 32), swizzle128_desc(b + s * 32), 1);
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
