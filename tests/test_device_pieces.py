"""The implicit-GEMM families' gathers and epilogues are types with a small interface: each
compiles, with the declarations it builds on (the tile geometry, the instructions, the tile
walks, the element types) and a layer's switches, in a kernel of its own that calls only that
interface, none of the family's kernels beside it. A piece that reached for a kernel's locals
(`tid`, `acc`, `off`, `smem`) or opened a brace the kernel closes would not."""

import pytest

from convlab.gpu import jit
from convlab.gpu.elements import ELEMENT_SOURCE
from convlab.kernels import base, get_variant
from convlab.kernels.general import EPILOGUE_SOURCE
from convlab.kernels.igemm import epilogue, gather, gather_nhwc, mainloop, persistent, tile_walks
from convlab.kernels.igemm import wgmma as wgmma_pieces
from convlab.shapes import ConvShape

FOUNDATION = (mainloop.GEOMETRY + mainloop.INSTRUCTIONS + tile_walks.SOURCE + EPILOGUE_SOURCE
              + ELEMENT_SOURCE + epilogue.KEPT_SOURCE)
# The wgmma family's instructions: the register store's 16-byte paths use them.
HOPPER = wgmma_pieces.INSTRUCTIONS + persistent.INSTRUCTIONS

LAYER = ConvShape(2, 64, 9, 9, 96, 3, pad=1, bias=True)
TABLE_LAYER = ConvShape(2, 3, 11, 11, 24, 3, stride=2)  # fewer channels than a K-tile

GRID_UNIT = "    const TileUnit unit = GridWalk<SPLIT_K, MTILES, KTILES>::unit();\n"


@pytest.fixture(autouse=True)
def any_gpu(monkeypatch, private_cache):
    monkeypatch.setattr(base, "compute_capability", lambda: None)


def switches(variant_name: str, shape: ConvShape, epilogue_name=None, schedule="grid",
             gather_name=None, **overrides) -> tuple[str, ...]:
    """The -D switches of the variant's first tiling of that schedule and gather on `shape`,
    with `overrides` in place of some."""
    variant = get_variant(variant_name)
    tiling = next(t for t in variant.configs(shape, epilogue_name)
                  if getattr(t, "schedule", "grid") == schedule
                  and (gather_name is None or t.gather == gather_name))
    options = variant.configured(tiling).compile_options(shape, epilogue_name)
    replaced = {f"-D{name}=" for name in overrides}
    return (*(o for o in options if not any(o.startswith(r) for r in replaced)),
            *(f"-D{name}={value}" for name, value in overrides.items()))


def assert_compiles_in_a_kernel_of_its_own(name: str, source: str, options: tuple[str, ...],
                                           arch: str = "sm_90a") -> None:
    result = jit.nvrtc_compile(f"{name}.cu", source, options, arch)
    assert result.cubin is not None, result.log


def only(kernel_name: str, body: str, parameters: str = "") -> str:
    return (f'extern "C" __global__ void {kernel_name}(const elem_t* __restrict__ x, '
            "const int4* __restrict__ table, const float* __restrict__ bias, "
            "out_t* __restrict__ y, const kept_t* __restrict__ kept, int batch"
            f"{parameters})\n{{\n"
            "    extern __shared__ __align__(16) float smem[];\n"
            "    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;\n"
            "    const int npix = batch * HWO;\n" + GRID_UNIT + body + "}\n")


@pytest.mark.parametrize("variant_name, shape", [
    ("channels-last-fp16", LAYER), ("channels-last", TABLE_LAYER), ("wgmma-3xtf32", LAYER)])
def test_the_channels_last_gather_compiles_alone(variant_name, shape):
    kernel = only("nhwc_gather", (
        "    NhwcGather<BN_ROWS> rows(tid);\n"
        "    rows.start(unit, npix);\n"
        "    rows.load(smem, 0, x, table, unit.kbeg);\n"
        "    const NhwcGather<BN_ROWS> started(tid, unit, npix);\n"
        "    started.load(smem, 1, x, table, unit.kbeg);\n"
        "    cp_async_commit();\n    cp_async_wait<0>();\n"))
    assert_compiles_in_a_kernel_of_its_own(
        "nhwc_gather", FOUNDATION + gather_nhwc.NHWC_GATHER + kernel, switches(variant_name, shape))


@pytest.mark.parametrize("variant_name, shape", [
    ("pipelined", LAYER), ("pipelined", TABLE_LAYER), ("pipelined-fp16", LAYER),
    ("pipelined-bf16", TABLE_LAYER)])
def test_the_nchw_gather_compiles_alone(variant_name, shape):
    """4-byte elements by cp.async (`load`); 2-byte ones through registers (`fetch`, `store`)."""
    two_bytes = "fp16" in variant_name or "bf16" in variant_name
    uses = ("    columns.fetch(x, table, unit.kbeg);\n    columns.store(smem);\n" if two_bytes
            else "    columns.load(smem, x, table, unit.kbeg);\n"
                 "    cp_async_commit();\n    cp_async_wait<0>();\n")
    kernel = only("nchw_gather", "    NchwGather columns(tid);\n"
                  "    columns.start(unit, npix);\n" + uses)
    assert_compiles_in_a_kernel_of_its_own(
        "nchw_gather", FOUNDATION + gather.NCHW_GATHER + kernel, switches(variant_name, shape),
        "sm_80")


@pytest.mark.parametrize("variant_name", ["wgmma-fp16", "wgmma"])
def test_the_copy_engines_gather_compiles_alone(variant_name):
    kernel = only("im2col_gather", (
        "    const Im2colGather box(unit);\n"
        "    box.load(smem_u32(smem), map, unit.kbeg, smem_u32(smem) + 65536);\n"),
        ", const __grid_constant__ TensorMap map")
    assert_compiles_in_a_kernel_of_its_own(
        "im2col_gather", FOUNDATION + HOPPER + persistent.IM2COL_GATHER + kernel,
        switches(variant_name, LAYER, schedule="persistent", gather_name="tma"))


ACCUMULATORS = ("    float acc[MF][NF][4];\n"
                "    for (int i = 0; i < MF; ++i)\n"
                "        for (int j = 0; j < NF; ++j)\n"
                "            for (int e = 0; e < 4; ++e) acc[i][j][e] = bias[(i + j + e) % 4];\n")


@pytest.mark.parametrize("variant_name, epilogue_name, arch", [
    ("pipelined", "relu", "sm_80"), ("channels-last-fp16", "add-relu", "sm_80"),
    ("wgmma-bf16", "add-relu", "sm_90a")])
def test_the_staged_store_compiles_alone(variant_name, epilogue_name, arch):
    """NCHW and NHWC (StagedStore<NHWC, BN>), the kept activation's add in NHWC."""
    kernel = only("staged_store", ACCUMULATORS + (
        "    StagedStore<NHWC, BN>::store(acc, smem, unit, npix, warp, lane, lane >> 2, lane & 3,\n"
        "                                 warp / WARPS_N, warp % WARPS_N, y, bias, kept);\n"))
    header = FOUNDATION + (HOPPER if arch == "sm_90a" else "")
    assert_compiles_in_a_kernel_of_its_own(
        "staged_store", header + epilogue.STAGED_STORE + kernel,
        switches(variant_name, LAYER, epilogue_name), arch)


@pytest.mark.parametrize("variant_name, epilogue_name, out_half", [
    ("wgmma-fp16", "add-relu", 1), ("wgmma-fp16", None, 1), ("wgmma", "add-relu", 0),
    ("wgmma-3xtf32", "relu", 0)])
def test_the_register_store_compiles_alone(variant_name, epilogue_name, out_half):
    """The warp-specialised schedules' store and kept prefetch, over any `pixel` map: the
    16-bit and float32 16-byte paths (VECTOR_STORE) and the element path."""
    kernel = only("register_store", ACCUMULATORS + (
        "    out_t* const ytile = y + (long long)unit.ntile * BN * M + unit.mtile * BM;\n"
        "    auto pixel = [&](int q, unsigned& at) {\n"
        "        at = q * M;\n        return unit.ntile * BN + q < npix;\n    };\n"
        "    prefetch_kept_tile(unit, ytile, pixel, warp % 4, lane, y, kept);\n"
        "    store_registers_nhwc(acc, unit, pixel, ytile, ytile + 16 * (warp % 4) + (lane >> 2),\n"
        "                         warp % 4, warp, lane, lane >> 2, lane & 3, smem_u32(smem), y,\n"
        "                         bias, kept);\n"))
    assert_compiles_in_a_kernel_of_its_own(
        "register_store",
        FOUNDATION + HOPPER + epilogue.PREFETCH_KEPT + epilogue.STORE_REGISTERS_NHWC + kernel,
        switches(variant_name, LAYER, epilogue_name, schedule="persistent",
                 OUT_HALF=out_half, KEPT_HALF=out_half))
