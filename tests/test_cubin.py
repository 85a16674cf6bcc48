"""Resources read from cubins (NVRTC, no GPU) and the occupancy they allow on sm_90."""

import re

import pytest

from convlab.gpu.cubin import (ARCH_LIMITS, PTXAS_VERBOSE, KernelResources, occupancy, ptxas_spills,
                               resources, strip_ptxas_report)
from convlab.gpu.jit import nvrtc_compile
from convlab.kernels import kernel_variants
from convlab.shapes import ConvShape

SM90 = ARCH_LIMITS["sm_90"]
SHAPE = ConvShape(100, 12, 21, 21, 24, 7)

SPILLING = r"""
// 64 values live at once under a 32-register cap (__launch_bounds__(1024, 2)): ptxas must spill.
extern "C" __global__ void __launch_bounds__(1024, 2) spills(float* y, int n)
{
    float v[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) v[i] = y[i * n + threadIdx.x];
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 64; ++i)
#pragma unroll
        for (int j = i + 1; j < 64; ++j) s += v[i] * v[j];
    y[threadIdx.x] = s;
}
"""

TWO_KERNELS = r"""
extern "C" __global__ void with_static(float* y)
{
    __shared__ float s[300];
    s[threadIdx.x] = y[threadIdx.x];
    __syncthreads();
    y[threadIdx.x] = s[299 - threadIdx.x];
}
extern __shared__ float dynamic_smem[];
extern "C" __global__ void with_dynamic(float* y)
{
    dynamic_smem[threadIdx.x] = y[threadIdx.x];
    __syncthreads();
    y[threadIdx.x] = dynamic_smem[threadIdx.x ^ 1];
}
"""


def kernel(registers=32, static=0, local=0, barriers=0, max_threads=None):
    return KernelResources("k", registers, static, local, barriers, max_threads)


def test_occupancy_by_warps_and_registers():
    occ = occupancy(kernel(32), 256)
    assert (occ.blocks_per_sm, occ.warps_per_sm, occ.percent) == (8, 64, 100.0)
    assert occ.limited_by == ["warps", "registers"]


def test_occupancy_register_allocation_granularity():
    # 168 registers x 32 lanes = 5376 per warp (a multiple of 256); 16384 per sub-partition
    # hold 3 warps, 12 per SM: 3 blocks of 4 warps.
    occ = occupancy(kernel(168), 128)
    assert (occ.blocks_per_sm, occ.warps_per_sm, occ.limited_by) == (3, 12, ["registers"])
    # 33 registers round up to 1280 per warp: 12 warps per sub-partition, 48 per SM.
    assert occupancy(kernel(33), 64).warps_per_sm == 48


def test_occupancy_by_shared_memory():
    # 100 KB dynamic + 1 KB reserved per block, in 228 KB: two blocks.
    occ = occupancy(kernel(32), 128, 100 * 1024)
    assert occ.blocks_per_sm == 2 and occ.limited_by == ["shared memory"]
    assert occupancy(kernel(32), 32, 0).limited_by == ["blocks"]


def test_launches_that_cannot_run():
    assert "per block" in occupancy(kernel(32), 128, 228 * 1024).reason
    assert occupancy(kernel(32), 2048).blocks_per_sm == 0
    assert "__launch_bounds__" in occupancy(kernel(32, max_threads=128), 256).reason
    assert occupancy(kernel(255), 1024).blocks_per_sm == 0  # 255 x 1024 registers > 65536


def test_named_barriers_limit_blocks():
    assert occupancy(kernel(16, barriers=16), 32).limits["barriers"] == 4


PTXAS_USED = re.compile(r"Used (\d+) registers")
PTXAS_SMEM = re.compile(r"(\d+) bytes smem")


@pytest.mark.parametrize("variant", kernel_variants(), ids=lambda v: v.name)
def test_cubin_numbers_agree_with_ptxas(variant):
    shape = SHAPE if variant.supports(SHAPE) else ConvShape(10, 1, 28, 28, 50, 5)
    compiled = nvrtc_compile(f"{variant.name}.cu", variant.source,
                             variant.compile_options(shape) + (PTXAS_VERBOSE,),
                             variant.arch or "sm_90")
    assert compiled.cubin is not None, compiled.log
    found = resources(compiled)
    assert set(found) == set(variant.kernels)
    blocks = compiled.log.split("Compiling entry function")[1:]
    for block in blocks:
        name = re.search(r"'([^']+)'", block).group(1)
        k = found[name]
        assert k.registers == int(PTXAS_USED.search(block).group(1))
        smem = PTXAS_SMEM.search(block)
        assert k.static_shared == (int(smem.group(1)) if smem else 0)
        assert k.spill_stores is not None


def test_shipped_kernels_differ_as_expected():
    by_name = {v.name: v for v in kernel_variants()}
    naive = resources(nvrtc_compile("naive.cu", by_name["naive"].source,
                                       by_name["naive"].compile_options(SHAPE) + (PTXAS_VERBOSE,)))
    rt = resources(nvrtc_compile("rt.cu", by_name["register-tiled"].source,
                                    by_name["register-tiled"].compile_options(SHAPE) + (PTXAS_VERBOSE,)))
    n, r = naive["conv_forward"], rt["conv_forward"]
    assert n.registers <= 48 and n.static_shared == 0 and n.barriers == 0
    assert r.registers > 2 * n.registers and r.max_threads == 128 and r.barriers >= 1


def test_spilling_kernel_shows_spills_and_local_memory():
    compiled = nvrtc_compile("spills.cu", SPILLING, ("-std=c++17", PTXAS_VERBOSE))
    k = resources(compiled)["spills"]
    assert k.registers <= 32 and k.max_threads == 1024
    assert k.spill_stores > 0 and k.spill_loads > 0 and k.local_bytes > 0
    assert ptxas_spills(compiled.log)["spills"] == (k.spill_stores, k.spill_loads)
    assert occupancy(k, 1024).blocks_per_sm == 2


def test_static_and_dynamic_shared_of_two_kernels():
    compiled = nvrtc_compile("two.cu", TWO_KERNELS, ("-std=c++17",))
    found = resources(compiled)
    assert found["with_static"].static_shared == 1200
    assert found["with_dynamic"].static_shared == 0
    assert found["with_static"].spill_stores is None  # no ptxas report asked for


def test_failed_compile_returns_the_log():
    compiled = nvrtc_compile("bad.cu", 'extern "C" __global__ void k() { nope; }', ())
    assert compiled.cubin is None and 'bad.cu(1): error: identifier "nope" is undefined' in compiled.log


def test_ptxas_report_is_stripped_from_messages():
    compiled = nvrtc_compile("w.cu", 'extern "C" __global__ void k(float* y) { int u = 1; y[0] = 1; }',
                                (PTXAS_VERBOSE,))
    text = strip_ptxas_report(compiled.log)
    assert "ptxas" not in text and "declared but never referenced" in text
