"""wgmma: the swizzled A image, the tiling rules, the registry's GPU check and the cubin cache,
on any machine. The swizzle is decoded here from its definition (byte m*128 + (k*e ^ 16*(m%8))
of a tile), independently of `swizzle_tiles`' reshapes."""

import dataclasses
import os
import re

import numpy as np
import pytest

from convlab.errors import ConvlabError
from convlab.gpu import hardware, jit, tensormap
from convlab.gpu.cubin import kernel_resources
from convlab.kernels import base, get_variant, wgmma as W
from convlab.kernels.igemm import packing, tiling, wgmma
from convlab.models import get_model
from convlab.shapes import ConvShape

VARIANTS_W = [get_variant(name) for name in ("wgmma", "wgmma-3xtf32", "wgmma-split-bf16",
                                              "wgmma-fp16", "wgmma-bf16")]
SHAPES = [*get_model("alexnet").conv_shapes(128).values(),
          ConvShape(64, 64, 56, 56, 64, 3, pad=1),
          ConvShape(1, 3, 33, 31, 24, 7, stride=2, pad=3, bias=True),  # 7x7 stem, 3 channels
          ConvShape(2, 16, 9, 9, 16, 3, pad=1, groups=16, bias=True),  # depthwise
          ConvShape(3, 40, 7, 7, 24, 1, stride=2),  # 1x1, stride 2
          ConvShape(1, 1, 28, 28, 50, 5),
          ConvShape(128, 9216, 1, 1, 4096, 1, bias=True)]  # fc6 as a 1x1 conv


@pytest.fixture(autouse=True)
def any_gpu(monkeypatch, private_cache):
    """supports() judges the shape alone, as on a Hopper GPU, whichever GPU this machine has;
    the tilings are the cost model's, not a tuning cache's."""
    monkeypatch.setattr(base, "compute_capability", lambda: None)


@pytest.mark.parametrize("dtype", [np.uint16, np.float32])
def test_swizzled_tiles_hold_each_element_where_the_descriptor_reads_it(dtype):
    e = np.dtype(dtype).itemsize
    bk = 128 // e
    t = tiling.Tiling(64, 64, bk, 4, 1, 3, 1, "tap")
    rng = np.random.default_rng(0)
    a = rng.integers(0, 60000, size=(2, 2 * t.bm, 3 * bk)).astype(dtype)
    packed = wgmma.swizzle_tiles(a, t)
    assert packed.shape == (2, 2, 3, t.bm * bk)
    raw = packed.view(np.uint8).reshape(2, 2, 3, t.bm * 128)
    for g, mt, kt, m, k in [(0, 0, 0, 0, 0), (1, 1, 2, 63, bk - 1), (0, 1, 1, 13, 5),
                            (1, 0, 2, 7, bk // 2), (0, 0, 1, 42, 3 * bk // 4 + 1)]:
        byte = m * 128 + ((k * e) ^ (16 * (m % 8)))
        value = raw[g, mt, kt, byte:byte + e].view(dtype)[0]
        assert value == a[g, mt * t.bm + m, kt * bk + k]
    # every element lands exactly once
    assert np.array_equal(np.sort(packed.reshape(-1)), np.sort(a.reshape(-1)))


@pytest.mark.parametrize("variant", VARIANTS_W, ids=lambda v: v.name)
def test_every_layer_gets_a_valid_tiling(variant):
    for shape in SHAPES:
        if variant.name == "wgmma-split-bf16" and shape.reduction < W.MIN_REDUCTION:
            assert "BF16 cross products" in variant.supports(shape).reason
            continue
        assert variant.supports(shape), (shape.brief(), variant.supports(shape).reason)
        t = variant.config_for(shape)
        assert not variant.tiling_problem(t) and not variant.shape_problem(shape, t)
        assert t.bk * tiling.element_bytes(variant.maths) == 128 and t.warps_n == 1
        assert all(not variant.tiling_problem(c) for c in variant.configs(shape))


def test_tiling_rules_name_what_is_wrong():
    fp16 = get_variant("wgmma-fp16")
    assert "bk must be 64" in fp16.tiling_problem(tiling.Tiling(128, 128, 32, 8, 1, 4, 1, "tap"))
    assert "warpgroup" in fp16.tiling_problem(tiling.Tiling(128, 128, 64, 4, 2, 4, 1, "tap"))
    assert "bn must be one of" in fp16.tiling_problem(tiling.Tiling(64, 48, 64, 4, 1, 4, 1, "tap"))
    assert "stages" in fp16.tiling_problem(tiling.Tiling(64, 64, 64, 4, 1, 2, 1, "tap"))
    assert "shared memory" in fp16.tiling_problem(tiling.Tiling(128, 256, 64, 8, 1, 8, 1, "tap"))
    with pytest.raises(ValueError, match="bk must be 32"):
        get_variant("wgmma").configured({"bm": 64, "bn": 64, "bk": 64, "warps_m": 4,
                                         "warps_n": 1, "stages": 3, "split_k": 1,
                                         "gather": "tap"})


def test_the_registry_names_the_gpu_a_wgmma_variant_needs(monkeypatch):
    shape = ConvShape(2, 64, 9, 9, 32, 3, pad=1)
    monkeypatch.setattr(base, "compute_capability", lambda: (8, 0))
    support = get_variant("wgmma-fp16").supports(shape)
    assert not support and "compute capability 9.0" in support.reason and "8.0" in support.reason
    assert get_variant("channels-last-fp16").supports(shape)
    monkeypatch.setattr(base, "compute_capability", lambda: (9, 0))
    assert get_variant("wgmma-fp16").supports(shape)


def test_the_cubin_cache_compiles_once(monkeypatch, tmp_path):
    monkeypatch.setenv("CONVLAB_CACHE_DIR", str(tmp_path))
    calls = []

    def fake(variant, source, options, arch):
        calls.append(arch)
        return b"\x7fELF" + " ".join(options).encode()

    monkeypatch.setattr(jit, "compile_cubin", fake)
    monkeypatch.setattr(jit, "nvrtc_version", lambda: (13, 0))  # part of the key; no NVRTC needed
    first = jit.cubin_file("v", "source", ("-DX=1",), "sm_90a")
    again = jit.cubin_file("v", "source", ("-DX=1",), "sm_90a")
    other = jit.cubin_file("v", "source", ("-DX=2",), "sm_90a")
    assert first == again and other != first and calls == ["sm_90a", "sm_90a"]
    assert first.parent == tmp_path / "cubin" and first.read_bytes() == b"\x7fELF-DX=1"
    assert sorted(p.name for p in first.parent.iterdir()) == sorted([first.name, other.name])


def test_the_wgmma_kernel_assembles_to_warpgroup_mmas():
    """The cubin for sm_90a holds the wgmma instructions (an sm_90 build rejects them)."""
    variant = get_variant("wgmma-fp16")
    shape = SHAPES[2]
    options = variant.compile_options(shape, "relu")
    assert jit.compile_cubin(variant.name, variant.source, options, "sm_90a")[:4] == b"\x7fELF"
    result = jit.nvrtc_compile("wgmma.cu", variant.source, options, "sm_90")
    assert result.cubin is None and "wgmma" in result.log


def test_3xtf32_packs_each_a_tile_as_a_big_then_a_small_swizzled_tile():
    """The kernel reads A's small tile BM*128 bytes after its big one: the host's image holds
    TF32 values at the descriptor's swizzled bytes that add up to the filters to ~2^-22."""
    variant = get_variant("wgmma-3xtf32")
    shape = ConvShape(2, 32, 6, 6, 70, 3, pad=1)
    t = tiling.Tiling(64, 32, 32, 4, 1, 3, 1, "tap")
    rng = np.random.default_rng(1)
    weights = rng.standard_normal(shape.weight_shape).astype(np.float32)
    packed = variant.packed_weights(weights, shape, t)
    a = packing.gemm_weights(weights, shape, t, "NHWC")
    assert packed.shape == (1, 2, 9, 2, t.bm * t.bk) and packed.dtype == np.float32
    raw = packed.view(np.uint8).reshape(1, 2, 9, 2, t.bm * 128)
    for mt, kt, m, k in [(0, 0, 0, 0), (1, 8, 5, 31), (0, 4, 63, 17), (1, 2, 9, 8)]:
        byte = m * 128 + ((k * 4) ^ (16 * (m % 8)))
        big, small = (raw[0, mt, kt, part, byte:byte + 4].view(np.float32)[0] for part in (0, 1))
        want = a[0, mt * t.bm + m, kt * t.bk + k]
        assert big.view(np.uint32) & 0x1FFF == 0 and small.view(np.uint32) & 0x1FFF == 0
        assert abs(np.float64(big) + np.float64(small) - want) <= 2.0 ** -21 * abs(want)
        assert want == 0 or abs(small) <= 2.0 ** -10 * abs(want)
    assert np.count_nonzero(packed[..., 1, :]) > 0.9 * np.count_nonzero(a)


def bf16_value(bits) -> np.float64:
    return np.float64((np.uint32(bits) << np.uint32(16)).view(np.float32))


def test_the_bf16_cross_products_pack_a_as_big_then_small_bf16_halves_of_each_row():
    """wgmma-split-bf16's A image: the big TF32 tile as 3xTF32's, then a tile of 128-byte
    rows of BF16, k 0-31 of the K-tile holding the big part and k 32-63 the residual, at the
    descriptor's swizzled bytes: one BF16 k16 product over the row is big x B's small + small
    x B's big, the row order of B's second tile in the kernel's split."""
    shape = ConvShape(2, 32, 6, 6, 70, 3, pad=1)
    t = tiling.Tiling(64, 32, 32, 4, 1, 3, 1, "tap")
    weights = np.random.default_rng(2).standard_normal(shape.weight_shape).astype(np.float32)
    packed = get_variant("wgmma-split-bf16").packed_weights(weights, shape, t)
    three = get_variant("wgmma-3xtf32").packed_weights(weights, shape, t)
    assert packed.shape == three.shape and np.array_equal(packed[..., 0, :], three[..., 0, :])
    a = packing.gemm_weights(weights, shape, t, "NHWC")
    raw = packed.view(np.uint8).reshape(1, 2, 9, 2, t.bm * 128)

    def at(mt, kt, part, m, k, e):  # element k of row m, at its swizzled bytes
        byte = m * 128 + ((k * e) ^ (16 * (m % 8)))
        return raw[0, mt, kt, part, byte:byte + e]

    for mt, kt, m, k in [(0, 0, 0, 0), (1, 8, 5, 31), (0, 4, 63, 17), (1, 2, 9, 8)]:
        want = np.float64(a[0, mt * t.bm + m, kt * t.bk + k])
        big = np.float64(at(mt, kt, 0, m, k, 4).view(np.float32)[0])
        high, low = (bf16_value(at(mt, kt, 1, m, j, 2).view(np.uint16)[0]) for j in (k, 32 + k))
        assert abs(high - big) <= 2.0 ** -8 * abs(big)  # BF16 rounds to nearest: 2^-8
        assert abs(low - (want - big)) <= 2.0 ** -8 * abs(want - big)


def test_the_bf16_cross_products_need_a_reduction_of_1024_terms():
    variant = get_variant("wgmma-split-bf16")
    small = ConvShape(2, 112, 6, 6, 64, 3, pad=1)  # 1,008 terms
    assert not variant.supports(small) and "1024" in variant.supports(small).reason
    assert variant.supports(ConvShape(2, 256, 6, 6, 64, 2))  # 1,024
    assert get_variant("wgmma-3xtf32").supports(small)
    assert variant.arithmetic(small).flops == 2 * small.flops  # TF32 + two BF16 at 2x the rate


def test_3xtf32_partial_sums_span_k_tiles_in_the_grid_schedule_only():
    """The grid schedule's 3xTF32 partial sum spans K-tiles by the rule (SPAN_TERMS_PER_ROOT_N
    * sqrt(n) terms, at least one K-tile, at most the layer's); the persistent one keeps a
    K-tile (PART_KTILES 1); TF32 never spans (1); the BF16 cross products turn on
    CROSS_BF16."""
    t = tiling.Tiling(64, 32, 32, 4, 1, 3, 1, "tap")
    assert wgmma.part_ktiles(64, t, 2) == 1  # 40 terms: under two K-tiles
    assert wgmma.part_ktiles(1200, t, 38) == 5  # 173 terms
    assert wgmma.part_ktiles(4608, t, 6) == 6  # 339 terms, but the layer has 6 K-tiles
    shape = ConvShape(2, 48, 9, 9, 128, 5, pad=2)  # 1,200 terms
    for variant in (get_variant(n) for n in ("wgmma-3xtf32", "wgmma-split-bf16")):
        grid = variant.configured(t).defines(shape)
        assert grid["PART_KTILES"] == 5
        assert variant.configured(persistent(t)).defines(shape)["PART_KTILES"] == 1
        assert grid.get("CROSS_BF16", 0) == (variant.name == "wgmma-split-bf16")
    assert get_variant("wgmma").configured(t).defines(shape)["PART_KTILES"] == 1


def test_3xtf32_tilings_keep_two_accumulator_sets_in_registers():
    variant = get_variant("wgmma-3xtf32")
    wide = tiling.Tiling(64, 160, 32, 4, 1, 4, 1, "tap")
    assert "two accumulator sets" in variant.tiling_problem(wide)
    assert not get_variant("wgmma").tiling_problem(wide)
    assert not variant.tiling_problem(tiling.Tiling(64, 128, 32, 4, 1, 4, 1, "tap"))
    t = tiling.Tiling(128, 96, 32, 8, 1, 3, 1, "tap")
    assert variant.smem_bytes(t) == 2 * get_variant("wgmma").smem_bytes(t) - wgmma.SWIZZLE_ALIGN
    assert all(c.bn <= 128 for s in SHAPES for c in variant.configs(s))


SERIALIZED = ("C7514", "C7517", "C7518")


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS_W, ids=lambda v: v.name)
def test_no_wgmma_waits_for_the_one_before(variant):
    """ptxas serializes every wgmma of a kernel where other instructions read accumulators
    while a group may be in flight (C7514), or where a wgmma or its wait sits in a branch
    (C7517: a wait injected, C7518: serialized; a 3xTF32 partial sum closed under a condition
    did both, 2026-11-26); the pipelines read them only after wait_group 0, outside branches.
    The default tiling of a 3x3 layer, the table-gathered stem and an FC layer, and a
    persistent tiling on a layer of an odd number of K-tiles."""
    odd = ConvShape(8, 32, 20, 20, 64, 3, pad=1)
    bk = wgmma.k_elements(variant.maths)
    one_warpgroup = persistent(tiling.Tiling(64, 64, bk, 4, 1, 3, 1, "tap"))
    for v, shape in [(variant, SHAPES[2]), (variant, SHAPES[0]), (variant, SHAPES[-1]),
                     (variant.configured(one_warpgroup), odd)]:
        options = v.compile_options(shape, "relu") + ("-Xptxas=-v",)
        log = jit.nvrtc_compile("wgmma.cu", v.source, options, "sm_90a").log
        assert not [c for c in SERIALIZED if c in log], f"{v.name} {shape.brief()}: {log}"


def persistent(t: tiling.Tiling) -> tiling.Tiling:
    return dataclasses.replace(t, schedule="persistent")


@pytest.mark.parametrize("variant", VARIANTS_W, ids=lambda v: v.name)
def test_the_persistent_schedule_builds_where_its_blocks_per_sm_leave_room(variant):
    """With one warpgroup of MMAs and with two: the widest persistent tiling given two blocks
    per SM and the narrowest given one build without serialized wgmmas (C7514). Two blocks of
    64x224 in fp16 (128 registers a thread) did not build (C7602) before the rule counted
    registers."""
    shape = SHAPES[5]  # the ResNet layer
    ranked = [t for t in variant.ranked(shape) if t.schedule == "persistent"]
    chosen = []
    for warps in (4, 8):
        mine = [t for t in ranked if t.warps_m == warps]
        two = [t for t in mine if wgmma.blocks_per_sm(t, variant.maths) == 2]
        one = [t for t in mine if wgmma.blocks_per_sm(t, variant.maths) == 1]
        chosen += [max(two, key=lambda t: t.bn)] if two else []
        chosen += [min(one, key=lambda t: (t.bn, -t.stages))] if one else []
    assert len(chosen) >= 2
    for t in chosen:
        v = variant.configured(t)
        options = v.compile_options(shape) + ("-Xptxas=-v",)
        assert "-DPERSISTENT=1" in options
        result = jit.nvrtc_compile("wgmma.cu", v.source, options, "sm_90a")
        assert result.cubin is not None, f"{t.brief()}: {result.log}"
        assert not [c for c in SERIALIZED if c in result.log], result.log


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS_W, ids=lambda v: v.name)
def test_the_persistent_split_k_builds_without_spills(variant):
    """The split-K reduce beside the accumulators: for each split count, the widest persistent
    tiling of two warpgroups and the cost model's first of one build with no spilled register
    and no serialized wgmma. Unrolled over the splits, the reduce spilled 1,140 bytes at
    128x256 with 8 splits; 3xTF32's two accumulator sets at 128x128 spilled 8 (that tiling is
    refused)."""
    shape = ConvShape(1, 512, 7, 7, 512, 3, pad=1, bias=True)
    chosen = {}
    for t in variant.ranked(shape):
        if t.schedule == "persistent" and t.split_k > 1:
            key = (t.split_k, t.warps_m)
            if key not in chosen or (t.warps_m == 8 and t.bn > chosen[key].bn):
                chosen[key] = t
    assert {t.split_k for t in chosen.values()} >= {2, 4, 8}
    for t in chosen.values():
        v = variant.configured(t)
        options = v.compile_options(shape, "relu") + ("-Xptxas=-v",)
        result = jit.nvrtc_compile("wgmma.cu", v.source, options, "sm_90a")
        assert result.cubin is not None, f"{t.brief()}: {result.log}"
        spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", result.log)]
        assert not any(spills), f"{t.brief()}: {result.log}"
        assert not [c for c in SERIALIZED if c in result.log], result.log


@pytest.mark.parametrize("variant", VARIANTS_W, ids=lambda v: v.name)
def test_setmaxnreg_moves_registers_to_the_mma_warps_where_the_cap_is_short(variant):
    """Two warpgroups of MMAs at bn 256 (128 for 3xTF32) need more than the 168 registers the
    launch gives each of 384 threads: the loaders give some up (setmaxnreg), and ptxas takes it
    (no C7508, "ignored"); one warpgroup at bn 64 fits the cap and gets no setmaxnreg."""
    shape = SHAPES[2]
    two = persistent(tiling.Tiling(128, 128 if variant.maths == "3xtf32" else 256,
                                   wgmma.k_elements(variant.maths), 8, 1, 3, 1, "tap"))
    loaders, mma = wgmma.register_split(shape, two, variant.maths)
    assert 0 < loaders < 168 < mma and loaders * 128 + mma * 256 <= 168 * 384
    one = dataclasses.replace(two, bm=64, warps_m=4, bn=64)
    assert wgmma.register_split(shape, one, variant.maths) == (0, 0)
    v = variant.configured(two)
    options = v.compile_options(shape, "relu") + ("-Xptxas=-v",)
    assert f"-DCONSUMER_REGS={mma}" in options
    result = jit.nvrtc_compile("wgmma.cu", v.source, options, "sm_90a")
    assert result.cubin is not None, result.log
    assert not [c for c in SERIALIZED + ("C7508",) if c in result.log], result.log


def test_the_fp16_store_builds_in_16_byte_vectors():
    """fp16 output of the persistent schedule goes out 8 channels a 16-byte store after a
    transpose through shared memory (stmatrix), in STORE_SCRATCH bytes a warp past the
    barriers: on the VGG 3x3 tiling the tuner ships (128x256, 168 registers a thread) it builds
    with no spills and no serialized wgmma."""
    shape = ConvShape(16, 128, 112, 112, 128, 3, pad=1)
    t = persistent(tiling.Tiling(128, 256, 64, 8, 1, 4, 1, "tap"))
    v = get_variant("wgmma-fp16").configured(t).writing(np.dtype(np.float16))
    options = v.compile_options(shape) + ("-Xptxas=-v",)
    assert "-DOUT_HALF=1" in options and f"-DSTORE_SCRATCH={wgmma.STORE_SCRATCH}" in options
    result = jit.nvrtc_compile("wgmma.cu", v.source, options, "sm_90a")
    assert result.cubin is not None, result.log
    assert " 0 bytes spill stores" in result.log, result.log
    assert not [c for c in SERIALIZED + ("C7508",) if c in result.log], result.log


def test_persistent_blocks_per_sm_count_the_accumulators():
    fp16 = tiling.Tiling(64, 192, 64, 4, 1, 3, 1, "tap", "persistent")
    assert wgmma.blocks_per_sm(fp16, "fp16") == 2  # 96 accumulators + 24 <= 128 registers
    assert wgmma.blocks_per_sm(dataclasses.replace(fp16, bn=224), "fp16") == 1
    assert wgmma.blocks_per_sm(dataclasses.replace(fp16, bn=224, schedule="grid"), "fp16") == 2
    two = tiling.Tiling(128, 96, 32, 8, 1, 3, 1, "tap", "persistent")
    assert wgmma.blocks_per_sm(two, "tf32") == 2  # 48 + 24 <= 80
    assert wgmma.blocks_per_sm(dataclasses.replace(two, bn=128), "tf32") == 1
    assert wgmma.blocks_per_sm(dataclasses.replace(two, bn=64), "3xtf32") == 1  # 2 x 32 + 24


def test_persistent_tilings_split_k_where_the_grid_ones_do_and_only_wgmma_runs_them():
    t = persistent(tiling.Tiling(64, 128, 64, 4, 1, 4, 1, "tap"))
    assert not get_variant("wgmma-fp16").tiling_problem(t)
    assert not get_variant("wgmma-fp16").tiling_problem(dataclasses.replace(t, split_k=2))
    halo = tiling.Tiling(64, 64, 64, 4, 1, 4, 2, "tap", "halo", 2)
    assert "no split-K" in get_variant("wgmma-fp16").tiling_problem(halo)
    split_3xtf32 = dataclasses.replace(t, bm=128, warps_m=8, bk=32, split_k=2)
    assert "at most 96" in get_variant("wgmma-3xtf32").tiling_problem(split_3xtf32)
    assert not get_variant("wgmma-3xtf32").tiling_problem(dataclasses.replace(split_3xtf32, bn=96))
    assert not get_variant("wgmma-3xtf32").tiling_problem(  # one warpgroup
        dataclasses.replace(split_3xtf32, bm=64, warps_m=4))
    assert "schedule must be" in get_variant("wgmma-fp16").tiling_problem(
        dataclasses.replace(t, schedule="stream-k"))
    channels_last = get_variant("channels-last-fp16")
    assert "needs wgmma" in channels_last.tiling_problem(
        persistent(tiling.Tiling(64, 128, 64, 4, 1, 4, 1, "tap")))
    assert t.brief() == "64x128x64 4x1w s4 k1 tap ws" and t.block_threads == 256
    # a cache entry written before the schedule existed reads as the grid schedule
    saved = {k: v for k, v in t.as_dict().items() if k != "schedule"}
    assert tiling.Tiling.from_dict(saved).schedule == "grid"
    for shape in SHAPES:
        ranked = get_variant("wgmma-fp16").ranked(shape)
        assert any(c.schedule == "persistent" for c in ranked)
        assert ({c.split_k for c in ranked if c.schedule == "grid"}
                == {c.split_k for c in ranked if c.schedule == "persistent"})
    small = ConvShape(1, 512, 7, 7, 512, 3, pad=1)  # 4 tiles of 128 x 128 for 132 SMs
    assert {(c.split_k, c.gather) for c in get_variant("wgmma-fp16").ranked(small)
            if c.schedule == "persistent"} >= {(8, "tap"), (8, "tma")}


def test_the_persistent_schedule_keeps_no_c_tile_and_fills_the_gpu_once(monkeypatch):
    """Stages and barriers only (its epilogue stores from registers); as many blocks as the
    SMs hold at once, or one per tile where there are fewer."""
    monkeypatch.setattr(hardware, "current", lambda: hardware.H100)  # 132 SMs, any host
    fp16 = get_variant("wgmma-fp16")
    t = persistent(tiling.Tiling(64, 128, 64, 4, 1, 4, 1, "tap"))
    stages = 4 * (64 + 128) * 128 + 16 * 4  # and the store's scratch, 4 warps', but in 3xTF32
    assert fp16.smem_bytes(t) == stages + 4 * wgmma.STORE_SCRATCH + wgmma.SWIZZLE_ALIGN
    tf32 = dataclasses.replace(t, bk=32)
    assert get_variant("wgmma").smem_bytes(tf32) == fp16.smem_bytes(t)
    assert get_variant("wgmma-3xtf32").smem_bytes(tf32) == (
        4 * (64 + 128) * 2 * 128 + 16 * 4 + wgmma.SWIZZLE_ALIGN)
    assert wgmma.blocks_per_sm(t, "fp16") == 2
    big = ConvShape(64, 64, 56, 56, 64, 3, pad=1)
    assert fp16.launch_grid(big, t) == (2 * 132, 1, 1)
    small = ConvShape(2, 64, 9, 9, 32, 3, pad=1, groups=2)
    assert fp16.launch_grid(small, t) == (2 * 2, 1, 1)  # 2 groups x 162 pixels / bn 128
    assert fp16.launch_grid(small, dataclasses.replace(t, schedule="grid")) == (2, 2, 1)
    # a unit of work is a tile's K-split
    assert fp16.launch_grid(small, dataclasses.replace(t, split_k=3)) == (3 * 2 * 2, 1, 1)


def test_a_wgmma_gather_with_too_many_rows_per_thread_is_refused():
    """AlexNet conv1 in fp16 (4 channels: 8-byte vectors, 16 to a 128-byte row) on a 64x192
    tile: 24 rows for each of 128 threads, beyond the 16 a thread keeps origins for. The check
    was once skipped for wgmma (it named the layout "NHWC" where the rule expects "nhwc")."""
    fp16 = get_variant("wgmma-fp16")
    conv1 = get_model("alexnet").conv_shapes(128)["conv1"]
    t = tiling.Tiling(64, 192, 64, 4, 1, 3, 1, "table")
    assert not fp16.tiling_problem(t)
    assert "rows" in fp16.shape_problem(conv1, t)
    assert not fp16.shape_problem(conv1, dataclasses.replace(t, bn=128))


def test_the_cubin_cache_falls_back_to_a_folder_of_this_users(monkeypatch, tmp_path):
    """A cache where the write fails: the cubin goes to a folder of this user's in the
    temporary directory (readable by no one else: one shared by all could hold another user's
    file under the expected name), and no temporary file is left where the write failed."""
    monkeypatch.setenv("CONVLAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(jit.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(jit, "compile_cubin", lambda variant, source, options, arch: b"\x7fELF")
    monkeypatch.setattr(jit, "nvrtc_version", lambda: (13, 0))
    replace = os.replace

    def refuses_the_cache(src, dst):
        if str(dst).startswith(str(tmp_path / "cache")):
            raise OSError("read-only file system (test)")
        replace(src, dst)

    monkeypatch.setattr(jit.os, "replace", refuses_the_cache)
    path = jit.cubin_file("v", "source", (), "sm_90a")
    assert path.parent == tmp_path / "tmp" / f"convlab-cubin-{os.getuid()}"
    assert path.read_bytes() == b"\x7fELF" and [p.name for p in path.parent.iterdir()] == [path.name]
    assert path.parent.stat().st_mode & 0o777 == 0o700
    assert list((tmp_path / "cache" / "cubin").iterdir()) == []
    path.parent.chmod(0o777)  # a folder others may write to is not used
    assert jit.private_temp_dir() is None
    with pytest.raises(ConvlabError, match="nowhere to write its cubin"):
        jit.cubin_file("v", "other source", (), "sm_90a")


# --- the halo schedule --------------------------------------------------------------------------

RESNET = ConvShape(64, 64, 56, 56, 64, 3, pad=1)


def halo(bm, rows, stages, shape=RESNET, maths="fp16"):
    bn = wgmma.halo.halo_bn(shape, rows)
    return tiling.Tiling(bm, bn, wgmma.k_elements(maths), bm // 16, 1, stages, 1, "tap", "halo",
                         rows)


def test_a_halo_tile_is_whole_output_rows_on_the_padded_grid():
    """4 rows of the 56-wide ResNet layer span 4 x 58 - 2 grid positions (the last row's 2
    padding columns are never reached), 232 as wgmma's N; the patch holds what the last tap's
    rows reach (232 + 2 x 59, in 8s); a tile per 4 rows of each image."""
    t = halo(64, 4, 9)
    assert t.bn == 232 and wgmma.halo.patch_rows(RESNET, t.bn) == 352
    assert tiling.n_tiles(RESNET, t) == 64 * 14 and tiling.output_tiles(RESNET, t) == 64 * 14
    assert wgmma.smem_bytes(t, "fp16", RESNET) == 9 * 64 * 128 + 2 * 352 * 128 + 8 * 22 + 1024
    assert t.brief() == "64x232x64 4x1w s9 k1 tap halo4" and t.block_threads == 256
    assert tiling.Tiling.from_dict(t.as_dict()) == t and t.as_dict()["rows"] == 4
    grid = tiling.Tiling(64, 128, 64, 4, 1, 4, 1, "tap")
    assert "rows" not in grid.as_dict() and tiling.Tiling.from_dict(grid.as_dict()) == grid
    assert not get_variant("wgmma-fp16").tiling_problem(t)
    assert not get_variant("wgmma-fp16").shape_problem(RESNET, t)
    # 3 output rows of 13 + 2 columns: N 43 -> 48; a last row block of one row
    conv3 = get_model("alexnet").conv_shapes(128)["conv3"]
    assert wgmma.halo.halo_bn(conv3, 3) == 48
    assert tiling.n_tiles(conv3, halo(64, 3, 4, conv3)) == 128 * 5


def test_the_halo_schedule_refuses_what_it_cannot_run():
    fp16 = get_variant("wgmma-fp16")
    t = halo(64, 2, 4)
    assert "no split-K" in fp16.tiling_problem(dataclasses.replace(t, split_k=2))
    assert "3xTF32" in get_variant("wgmma-3xtf32").tiling_problem(halo(64, 2, 4, maths="3xtf32"))
    assert "gather 'tap'" in fp16.tiling_problem(dataclasses.replace(t, gather="table"))
    assert "bn must be 120" in fp16.shape_problem(RESNET, dataclasses.replace(t, bn=128))
    assert "stride 1" in fp16.shape_problem(dataclasses.replace(RESNET, stride=2), t)
    conv2 = get_model("alexnet").conv_shapes(128)["conv2"]  # 48 channels a group: 96 bytes
    assert "128-byte channel chunks" in fp16.shape_problem(conv2, t)
    assert "exceed the layer's 9 K-tiles" in fp16.shape_problem(RESNET, halo(64, 2, 10))
    assert "exceed the layer's 56 output rows" in fp16.shape_problem(
        RESNET, dataclasses.replace(t, rows=57))
    assert "shared memory" in fp16.shape_problem(RESNET, halo(128, 4, 9))
    # one A buffer on a 9-K-tile layer would deadlock: K-tile j's buffer is freed after j + 1
    assert "at least 2" in fp16.shape_problem(RESNET, halo(64, 2, 1))
    one_tile = ConvShape(2, 64, 8, 8, 64, 1)  # 1x1, 64 fp16 channels: one K-tile
    assert not fp16.shape_problem(one_tile, halo(64, 2, 1, one_tile))
    with pytest.raises(ValueError, match="pass its shape"):
        wgmma.smem_bytes(t, "fp16")
    grid = tiling.Tiling(64, 128, 64, 4, 1, 4, 1, "tap")
    assert "halo schedule's" in fp16.tiling_problem(dataclasses.replace(grid, rows=2))
    assert "needs wgmma" in get_variant("channels-last-fp16").tiling_problem(
        dataclasses.replace(grid, rows=2))
    assert "schedule must be 'grid', not 'foo'" in get_variant("channels-last-fp16").tiling_problem(
        dataclasses.replace(grid, schedule="foo"))
    assert not [c for c in fp16.ranked(conv2) if c.schedule == "halo"]


def test_the_tuner_is_offered_halo_tilings_where_a_layer_has_them(monkeypatch):
    monkeypatch.setattr(hardware, "current", lambda: hardware.H100)
    for variant in (get_variant(n) for n in ("wgmma-fp16", "wgmma")):
        configs = variant.configs(RESNET)
        assert len(configs) == tiling.MAX_CONFIGS
        assert sum(c.schedule == "halo" for c in configs) == W.HALO_CONFIGS
        t = next(c for c in configs if c.schedule == "halo")
        k = variant.kernel_shape(RESNET)
        assert variant.launch_grid(k, t) == (132 * wgmma.blocks_per_sm(t, variant.maths, k), 1, 1)
    small = ConvShape(2, 64, 5, 5, 64, 3, pad=1)  # 2 images x 1 row block < the SMs
    t = halo(64, 5, 4, small)
    assert get_variant("wgmma-fp16").launch_grid(small, t) == (2, 1, 1)


@pytest.mark.slow
@pytest.mark.parametrize("variant", [get_variant(n) for n in ("wgmma", "wgmma-fp16")],
                         ids=lambda v: v.name)
def test_halo_tilings_build_without_spills(variant):
    """Filters resident (a buffer per K-tile) and in a ring, two warpgroups with registers
    moved to them, an N past a multiple of 32 (a tail wgmma) and one below 32 (the tail
    alone): ptxas builds each without spilling or serialising the wgmmas."""
    tiny = ConvShape(2, 64, 6, 2, 64, 3, pad=1)  # 4-wide patch rows: N = 2 -> 8
    maths = variant.maths
    kt = tiling.k_tiles(RESNET, halo(64, 4, 2, maths=maths))
    chosen = [(RESNET, halo(64, 3, kt, maths=maths)), (RESNET, halo(64, 2, 4, maths=maths)),
              (RESNET, halo(128, 4, 4, maths=maths)), (tiny, halo(64, 1, 2, tiny, maths))]
    assert chosen[0][1].bn % 32 and chosen[3][1].bn == 8
    for shape, t in chosen:
        assert not variant.tiling_problem(t) and not variant.shape_problem(shape, t), t.brief()
        v = variant.configured(t)
        options = v.compile_options(shape, "relu") + ("-Xptxas=-v",)
        assert "-DHALO=1" in options
        result = jit.nvrtc_compile("wgmma.cu", v.source, options, "sm_90a")
        assert result.cubin is not None, f"{t.brief()}: {result.log}"
        assert " 0 bytes spill stores" in result.log, f"{t.brief()}: {result.log}"
        assert not [c for c in SERIALIZED + ("C7508",) if c in result.log], result.log



def tma(t: tiling.Tiling) -> tiling.Tiling:
    return dataclasses.replace(t, schedule="persistent", gather="tma")


def test_the_tma_gather_runs_in_the_persistent_schedule_on_boxes_of_bk_channels():
    """The copy engine's im2col box brings bk channels of one group at a time, into the
    persistent schedule's stages; 3xTF32 splits B as its copies land, which a copy engine
    cannot; the mma.sync family has no copy engine loader at all. A layer of one group may end
    in a part of a box (its zero fill), one of many groups may not (it would read the next
    group's channels), and no pixel may be a stride the copy engine cannot step."""
    t = tiling.Tiling(128, 128, 64, 8, 1, 4, 1, "tap")
    fp16 = get_variant("wgmma-fp16")
    assert not fp16.tiling_problem(tma(t))
    assert "pingpong schedules only" in fp16.tiling_problem(dataclasses.replace(t, gather="tma"))
    assert "pingpong schedules only" in fp16.tiling_problem(
        dataclasses.replace(tma(t), schedule="halo", rows=2))
    three = get_variant("wgmma-3xtf32")
    assert "3xTF32" in three.tiling_problem(tma(dataclasses.replace(t, bk=32)))
    assert "needs wgmma" in tiling.tiling_problem(dataclasses.replace(t, gather="tma"), "fp16")
    whole = ConvShape(8, 128, 14, 14, 64, 3, pad=1, groups=2)  # 64 channels a group
    part = ConvShape(8, 96, 14, 14, 64, 3, pad=1, groups=2)  # 48
    assert not fp16.shape_problem(whole, tma(t))
    assert "multiple" in fp16.shape_problem(part, tma(t))
    for channels in (32, 96, 160):
        assert not fp16.shape_problem(ConvShape(8, channels, 14, 14, 64, 3, pad=1), tma(t))
    stem = ConvShape(1, 3, 33, 31, 24, 7, stride=2, pad=3)  # its channels padded to 4
    assert "16 bytes" in fp16.shape_problem(stem, tma(t))
    assert not get_variant("wgmma").shape_problem(stem, tma(dataclasses.replace(t, bk=32)))
    far = ConvShape(1, 64, 8, 8, 64, 3, pad=130)
    assert "corners" in fp16.shape_problem(far, tma(t))
    assert "steps at most 8" in fp16.shape_problem(ConvShape(1, 64, 40, 40, 64, 9, stride=9),
                                                   tma(t))


@pytest.mark.parametrize("variant", [get_variant(n) for n in ("wgmma", "wgmma-fp16", "wgmma-bf16")],
                         ids=lambda v: v.name)
def test_the_tuner_is_offered_the_tma_gather_beside_the_tap_one(variant):
    """Every persistent and pingpong tap tiling of a layer with whole channel chunks has its
    "tma" twin, which packs the same filters, and each unsplit persistent one its two-block
    cluster where the layer's m-tiles pair up; the stem's 3 channels, padded to 8 bytes a
    pixel in 16 bits, get none; MobileNet-v2's 32 channels into 16 filters, half a 16-bit
    box, get their twins too."""
    def tma_twins(shape):
        ranked = variant.ranked(shape)
        taps = {dataclasses.replace(t, gather="tma") for t in ranked
                if t.schedule in ("persistent", "pingpong") and t.gather == "tap"}
        assert taps and taps == {t for t in ranked if t.gather == "tma" and t.cluster == 1}
        return ranked, taps
    conv3 = SHAPES[2]
    ranked, taps = tma_twins(conv3)
    pairs = {dataclasses.replace(t, cluster=2) for t in taps if t.schedule == "persistent"
             and t.split_k == 1 and -(-conv3.M // t.bm) % 2 == 0}
    assert pairs and pairs == {t for t in ranked if t.cluster == 2}
    assert any(t.gather == "tma" for t in variant.configs(conv3))
    assert any(t.gather == "tma" for t in variant.ranked(SHAPES[6])) == (variant.maths == "tf32")
    tma_twins(ConvShape(128, 32, 112, 112, 16, 1, bias=True))  # MobileNet-v2's pointwise
    t = next(iter(taps))
    w = np.random.default_rng(1).standard_normal((conv3.M, conv3.Cg, 3, 3))
    assert np.array_equal(packing.gemm_weights(w, conv3, t, "NHWC"),
                          packing.gemm_weights(w, conv3, dataclasses.replace(t, gather="tap"),
                                               "NHWC"))


@pytest.mark.parametrize("variant", [get_variant(n) for n in ("wgmma", "wgmma-fp16", "wgmma-bf16")],
                         ids=lambda v: v.name)
def test_the_tma_gather_builds_with_one_loader_thread(variant):
    """conv3's widest two-warpgroup tma tiling builds without spills or serialized wgmmas;
    its loaders keep TMA_LOADER_REGISTERS (no row origins) and the map is a kernel parameter."""
    shape = SHAPES[2]
    bn = 256 if variant.maths != "tf32" else 128
    t = tma(tiling.Tiling(128, bn, wgmma.k_elements(variant.maths), 8, 1, 4, 1, "tap"))
    loaders, _ = wgmma.register_split(shape, t, variant.maths)
    assert loaders in (0, wgmma.TMA_LOADER_REGISTERS)
    v = variant.configured(t)
    options = v.compile_options(shape, "relu") + ("-Xptxas=-v",)
    assert "-DGATHER_TMA=1" in options and "-DGATHER_TAP=1" in options
    result = jit.nvrtc_compile("wgmma.cu", v.source, options, "sm_90a")
    assert result.cubin is not None, result.log
    assert " 0 bytes spill stores" in result.log, result.log
    assert not [c for c in SERIALIZED + ("C7508",) if c in result.log], result.log


def test_the_im2col_map_describes_the_nhwc_input_and_its_windows(monkeypatch):
    """What the driver is asked to encode: dims C, W, H, N with byte strides, the box's
    corners -pad and pad - (K - 1), the stride as the traversal step, bk channels x bn pixels
    128-byte swizzled; a failure names the CUresult."""
    seen = {}

    def encode(out, dtype, rank, address, dims, strides, lows, highs, channels, pixels, steps,
               interleave, swizzle, promotion, fill):
        seen.update(dtype=dtype, rank=rank, address=address, dims=list(dims),
                    strides=list(strides), corners=(list(lows), list(highs)), steps=list(steps),
                    box=(channels, pixels), swizzle=swizzle, aligned=out % 64 == 0)
        return seen.get("result", 0)

    monkeypatch.setattr(tensormap, "_encoder", lambda: encode)
    shape = ConvShape(4, 64, 27, 31, 96, 5, stride=2, pad=2)
    encoded = tensormap.im2col_map(4096, np.float16, shape, 64, 128)
    assert encoded.nbytes == tensormap.MAP_BYTES and seen["aligned"]
    assert seen["dims"] == [64, 31, 27, 4] and seen["strides"] == [128, 31 * 128, 27 * 31 * 128]
    assert seen["corners"] == ([-2, -2], [-2, -2]) and seen["steps"] == [1, 2, 2, 1]
    assert seen["box"] == (64, 128) and seen["swizzle"] == tensormap.SWIZZLE_128B
    assert seen["dtype"] == tensormap.DATA_TYPES[np.dtype(np.float16)] and seen["rank"] == 4
    seen["result"] = 1
    with pytest.raises(ConvlabError, match="CUresult 1"):
        tensormap.im2col_map(4096, np.float32, shape, 32, 128)


def test_the_wgmma_family_refuses_activations_its_kernel_does_not_read():
    """Its source is the channels-last kernel whatever it is given: NCHW activations would
    have compiled it with NHWC 0."""
    from convlab.kernels.pipelined import NCHW_ACTIVATIONS

    with pytest.raises(ValueError, match="channels-last activations only"):
        W.Wgmma(get_variant("wgmma-fp16").form, NCHW_ACTIVATIONS)


CONDITIONAL = re.compile(r"^\s*#\s*(if|ifdef|ifndef|elif)\b", re.M)


def assert_compiles_alone(name: str, piece: str, kernel: str) -> None:
    """`piece` holds no preprocessor switch and, with `kernel` (which uses it) and no other
    source, compiles for sm_90a."""
    assert not CONDITIONAL.search(piece)
    result = jit.nvrtc_compile(f"{name}.cu", piece + kernel, ("-std=c++17",), "sm_90a")
    assert result.cubin is not None, result.log


def test_the_warpgroup_mma_piece_compiles_alone_and_holds_no_switches():
    """gpu.hopper's piece is types, not -D switches: every WgmmaOp a halo, grid or persistent
    tile may use, in each element type, and every WgmmaRegA (A from registers), instantiated by
    a kernel of its own, no other source."""
    from convlab.gpu import hopper

    calls = "".join(
        f"    WgmmaOp<{n}, {element}>::mma<{32 - n // 8}>(d, da, db, 1);\n"
        for element, _ in hopper.WGMMA_ELEMENTS.values()
        for n in hopper.WGMMA_TAILS + hopper.WGMMA_NS) + "".join(
        f"    WgmmaRegA<{n}, {hopper.WGMMA_ELEMENTS[kind][0]}>::mma<{32 - n // 8}>(d, r, db, 1);\n"
        for kind in hopper.REGISTER_A_ELEMENTS for n in hopper.WGMMA_NS)
    assert_compiles_alone("hopper", hopper.WGMMA_PTX, (
        'extern "C" __global__ void every_product(float* out, unsigned a)\n{\n'
        "    float d[1][32][4] = {};\n"
        "    const unsigned r[4] = {a, a + 1, a + 2, a + 3};\n"
        "    const unsigned long long da = swizzle128_desc(a), db = swizzle128_desc(a + 1024);\n"
        "    wgmma_fence();\n" + calls + "    wgmma_commit();\n    wgmma_wait<0>();\n"
        "    fence_operands(d);\n    out[threadIdx.x] = d[0][31][3];\n}\n"))


def test_the_tile_walks_compile_alone_and_hold_no_switches():
    """igemm.tile_walks is templates over the layer's constants, not -D switches: the grid,
    persistent and halo walks, each with its split-K slot where it has one, instantiated by a
    kernel of their own, no other source."""
    from convlab.kernels.igemm import tile_walks

    assert_compiles_alone("tile_walks", tile_walks.SOURCE, (
        'extern "C" __global__ void walks(long long* out, int npix, int batch)\n{\n'
        "    using Grid = GridWalk<3, 4, 9>;\n"
        "    const TileUnit g = Grid::unit();\n"
        "    long long sum = Grid::slot(g) + g.split + g.mtile + g.ntile + g.kbeg + g.kend;\n"
        "    const PersistentWalk<2, 4, 9, 2, 128> persistent(npix);\n"
        "    for (int u = persistent.first(); u < persistent.units; u = persistent.next(u)) {\n"
        "        const TileUnit p = persistent.unit(u);\n"
        "        sum += persistent.slot(p) + p.split + p.mtile + p.ntile + p.group + p.kend;\n"
        "    }\n"
        "    const HaloWalk<4, 9, 2, 7, 4> halo(batch);\n"
        "    for (int t = halo.first; t < halo.last; ++t) {\n"
        "        const TileUnit h = halo.unit(t);\n"
        "        sum += halo.filters(t) + h.mtile + h.group + h.image + h.h0 + h.kend;\n"
        "    }\n"
        "    out[threadIdx.x] = sum;\n}\n"))


def test_the_element_types_compile_alone():
    """gpu.elements' types need no switch: each converts both ways and the 16-bit ones unpack a
    pair, in a kernel of their own; ElementOf picks them by the switches' values."""
    from convlab.gpu.elements import ELEMENT_TYPES_SOURCE

    checks = "".join(
        f"    static_assert(Same<ElementOf<{half}, {bf16}, {tf32}>::type, {name}>::value, \"\");\n"
        for half, bf16, tf32, name in ((0, 0, 0, "Float32Element"), (0, 1, 0, "Float32Element"),
                                       (0, 0, 1, "Tf32RoundedElement"), (1, 0, 0, "Fp16Element"),
                                       (1, 1, 0, "Bf16Element"), (1, 0, 1, "Fp16Element")))
    assert_compiles_alone("elements", ELEMENT_TYPES_SOURCE, (
        "template <class A, class B> struct Same { enum { value = 0 }; };\n"
        "template <class A> struct Same<A, A> { enum { value = 1 }; };\n"
        'extern "C" __global__ void round_trips(float* y, unsigned pair)\n{\n' + checks
        + "    float lo, hi, lo2, hi2;\n"
        "    Fp16Element::unpack(pair, lo, hi);\n    Bf16Element::unpack(pair, lo2, hi2);\n"
        "    y[0] = Fp16Element::value(Fp16Element::from(y[1])) + lo + hi + lo2 + hi2\n"
        "        + Bf16Element::value(Bf16Element::from(y[2]))\n"
        "        + Tf32RoundedElement::from(y[3]) + Float32Element::from(y[4]);\n}\n"))


def cluster(t: tiling.Tiling) -> tiling.Tiling:
    return dataclasses.replace(t, schedule="persistent", gather="tma", cluster=2)


def test_a_cluster_pairs_the_m_tiles_of_the_copy_engines_gather():
    """Two blocks share each B copy: the persistent schedule with the copy engine's gather, no
    split-K, and a layer whose groups make an even count of m-tiles; the mma.sync family and
    other cluster sizes are refused with the reason."""
    fp16 = get_variant("wgmma-fp16")
    t = tiling.Tiling(128, 128, 64, 8, 1, 4, 1, "tap")
    assert not fp16.tiling_problem(cluster(t))
    for wrong in (dataclasses.replace(cluster(t), gather="tap"),
                  dataclasses.replace(cluster(t), split_k=2),
                  dataclasses.replace(t, cluster=2)):
        assert "shares the copy engine's B copy" in fp16.tiling_problem(wrong)
    assert "one of 1, 2" in fp16.tiling_problem(dataclasses.replace(cluster(t), cluster=4))
    assert "clusters are wgmma's" in get_variant("channels-last-fp16").tiling_problem(
        dataclasses.replace(t, cluster=2))
    assert not fp16.shape_problem(ConvShape(2, 64, 9, 9, 130, 3, pad=1), cluster(t))  # 2 tiles
    assert "makes" not in fp16.shape_problem(ConvShape(2, 64, 9, 9, 256, 3, pad=1), cluster(t))
    odd = fp16.shape_problem(ConvShape(2, 64, 9, 9, 128, 3, pad=1), cluster(t))
    assert "a cluster of 2 blocks takes 2 m-tiles of a group: 128 channels make 1" in odd
    grouped = ConvShape(2, 128, 9, 9, 256, 3, pad=1, groups=2)  # 128 channels a group
    assert "make 1" in fp16.shape_problem(grouped, cluster(t))
    assert not fp16.shape_problem(grouped, cluster(dataclasses.replace(t, bm=64, warps_m=4)))


def test_a_cluster_tiling_reads_and_launches_in_whole_clusters(monkeypatch):
    """Its dict names the cluster (a block alone's does not, as before clusters), its brief
    ends ' c2', its kernel is told CLUSTER, and its grid holds whole clusters."""
    monkeypatch.setattr(hardware, "current",
                        lambda: dataclasses.replace(hardware.H100, sms=131))
    fp16 = get_variant("wgmma-fp16")
    t = cluster(tiling.Tiling(128, 128, 64, 8, 1, 4, 1, "tap"))
    assert t.as_dict()["cluster"] == 2 and "cluster" not in dataclasses.replace(
        t, cluster=1).as_dict()
    assert tiling.Tiling.of(t.as_dict()) == t and t.brief().endswith(" tma ws c2")
    shape = ConvShape(64, 64, 56, 56, 256, 3, pad=1)
    assert "-DCLUSTER=2" in fp16.configured(t).compile_options(shape, "relu")
    assert "-DCLUSTER=1" in fp16.configured(dataclasses.replace(t, cluster=1)).compile_options(
        shape, "relu")
    assert wgmma.blocks_per_sm(t, "fp16") == 1
    assert fp16.launch_grid(shape, t) == (130, 1, 1)
    assert fp16.launch_grid(shape, dataclasses.replace(t, cluster=1)) == (131, 1, 1)
    few = ConvShape(1, 64, 8, 8, 256, 3, pad=1)  # 2 m-tiles x 1 pixel tile
    assert fp16.launch_grid(few, t) == (2, 1, 1)


@pytest.mark.parametrize("variant", [get_variant(n) for n in ("wgmma", "wgmma-fp16")],
                         ids=lambda v: v.name)
def test_a_cluster_tiling_builds_as_a_cluster_without_spills(variant):
    """The widest two-warpgroup cluster tiling builds without spills or serialized wgmmas."""
    bn = 256 if variant.maths != "tf32" else 128
    t = cluster(tiling.Tiling(128, bn, wgmma.k_elements(variant.maths), 8, 1, 4, 1, "tap"))
    shape = ConvShape(64, 128, 56, 56, 256, 3, pad=1)
    v = variant.configured(t)
    options = v.compile_options(shape, "relu") + ("-Xptxas=-v",)
    result = jit.nvrtc_compile("wgmma.cu", v.source, options, "sm_90a")
    assert result.cubin is not None, result.log
    assert " 0 bytes spill stores" in result.log, result.log
    assert not [c for c in SERIALIZED + ("C7508",) if c in result.log], result.log


def test_the_own_choice_is_the_corrections_best_of_every_candidate():
    """The fitted correction orders every candidate, not only the analytic model's first
    MAX_CONFIGS: on UNet's 256-channel 3x3 at batch 128 the analytic model ranks the 128x256
    tilings below its first 16, and the correction (and the H200) put them first. A cluster
    tiling follows its twin, a block alone, and is never the own choice; the tuner's list
    keeps CLUSTER_CONFIGS of them."""
    from convlab.kernels.igemm import learned

    shape = ConvShape(128, 256, 64, 64, 256, 3, pad=1, bias=True)
    for name in ("wgmma", "wgmma-fp16"):
        variant = get_variant(name)
        ranked = variant.ranked(shape)
        k = variant.kernel_shape(shape)

        def score(t):
            return learned.score(k, t, variant.maths, variant.tiling_estimate(shape, t))
        best = min((t for t in ranked if t.cluster == 1 and t.schedule != "pingpong"), key=score)
        offered = variant.configs(shape, "relu")
        assert offered[0] == best and best.bn == 256
        assert best not in tiling_diverse_first(ranked)
        clusters = [t for t in offered if t.cluster == 2]
        assert len(clusters) == W.CLUSTER_CONFIGS
        for t in clusters:
            assert offered.index(dataclasses.replace(t, cluster=1)) < offered.index(t)


def tiling_diverse_first(ranked):
    from convlab.kernels.igemm.cost import diverse

    return diverse(tuple(t for t in ranked if t.cluster == 1), tiling.MAX_CONFIGS)


def pingpong(t: tiling.Tiling) -> tiling.Tiling:
    return dataclasses.replace(t, bm=64, warps_m=8, schedule="pingpong")


def test_the_pingpong_schedule_refuses_what_it_cannot_run():
    """A 64-row tile a warpgroup, two warpgroups, no split-K, no clusters; its tilings are
    the one-warpgroup persistent ones' twins, the copy engine's gather among them."""
    fp16 = get_variant("wgmma-fp16")
    t = pingpong(tiling.Tiling(128, 256, 64, 8, 1, 5, 1, "tma"))
    assert not fp16.tiling_problem(t)
    assert "bm must be 64" in fp16.tiling_problem(dataclasses.replace(t, bm=128))
    assert "warps_m 8" in fp16.tiling_problem(dataclasses.replace(t, bm=64, warps_m=4))
    assert "no split-K" in fp16.tiling_problem(dataclasses.replace(t, split_k=2))
    assert "cluster" in fp16.tiling_problem(dataclasses.replace(t, cluster=2))
    assert "needs wgmma" in tiling.tiling_problem(t, "fp16")
    assert t.brief() == "64x256x64 8x1w s5 k1 tma pp"
    conv3 = SHAPES[2]
    ranked = fp16.ranked(conv3)
    pingpongs = {t for t in ranked if t.schedule == "pingpong"}
    ones = {pingpong(t) for t in ranked if t.schedule == "persistent" and t.warps_m == 4
            and t.split_k == 1 and t.cluster == 1}
    assert pingpongs == ones and {t.gather for t in pingpongs} == {"tap", "tma"}


@pytest.mark.parametrize("variant", VARIANTS_W, ids=lambda v: v.name)
def test_the_pingpong_schedule_builds_without_spills(variant):
    """Each warpgroup holds a 64 x bn tile, as in the persistent schedule's two-warpgroup
    tilings: the widest pingpong tiling of each gather builds with no spilled register and no
    serialized wgmma, with the add-relu epilogue where the variant fuses it."""
    shape = SHAPES[5]  # the ResNet layer
    widest = {}
    for t in variant.ranked(shape):
        if t.schedule == "pingpong" and (t.gather not in widest or t.bn > widest[t.gather].bn):
            widest[t.gather] = t
    assert widest
    for t in widest.values():
        v = variant.configured(t)
        epilogue = "add-relu" if v.fuses_adds else "relu"
        options = v.compile_options(shape, epilogue) + ("-Xptxas=-v",)
        assert "-DPINGPONG=1" in options
        result = jit.nvrtc_compile("wgmma.cu", v.source, options, "sm_90a")
        assert result.cubin is not None, f"{t.brief()}: {result.log}"
        spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", result.log)]
        assert not any(spills), f"{t.brief()}: {result.log}"
        assert not [c for c in SERIALIZED if c in result.log], result.log


@pytest.mark.parametrize("name", ["wgmma", "wgmma-fp16"])
def test_the_own_choice_takes_the_pingpong_twin_of_a_one_warpgroup_tiling_by_rule(name):
    """VGG-16's second 3x3 layer at batch 128 (64 channels: 18 K-tiles in tf32, 9 in fp16; the
    correction's choice one warpgroup at two blocks an SM): the own choice is that tiling's
    pingpong twin, N and gather kept, at the most stages. ResNet-50's stem (a short K-loop at
    two blocks an SM), a layer whose choice is the two-warpgroup 128-row tile, one too small
    for two tiles a block, and two whose twin would run one block an SM in place of two
    (AlexNet's conv4, 192 filters a group; Inception-v3's 5x5, whose 48 channels fill part of a
    K-tile, gathered by table in tf32 and by copy engine in 16 bits) keep the correction's
    choice, and the tuner is offered the twin last; so does an add-relu conv."""
    variant = get_variant(name)

    def few_tiles(k, twin):  # no twin (a K-split), or under two tiles a block
        return twin is None or tiling.output_tiles(k, twin) < 2 * 132 * wgmma.blocks_per_sm(
            twin, variant.maths, k)
    vgg = ConvShape(128, 64, 224, 224, 64, 3, pad=1, bias=True)
    chosen, plain = variant.configs(vgg, "relu")[:2]
    assert chosen.schedule == "pingpong" and chosen.bm == 64 and chosen.warps_m == 8
    assert (chosen.bn, chosen.gather) == (plain.bn, plain.gather) and plain.warps_m == 4
    assert chosen.stages == max(t.stages for t in variant.ranked(vgg) if t.schedule == "pingpong"
                                and (t.bn, t.gather) == (chosen.bn, chosen.gather))
    stem = ConvShape(128, 3, 224, 224, 64, 7, stride=2, pad=3, bias=True)
    wide = ConvShape(128, 256, 28, 28, 256, 3, pad=1, bias=True)
    small = ConvShape(1, 64, 56, 56, 64, 3, pad=1, bias=True)
    conv4 = ConvShape(128, 384, 13, 13, 384, 3, pad=1, groups=2, bias=True)
    inception = ConvShape(128, 48, 35, 35, 64, 5, pad=2, bias=True)

    def one_block_in_place_of_two(k, t):  # what the rule took before it counted filters
        twin = wgmma.pingpong_twin(k, t, variant.maths)
        return (t.warps_m == 4 and not few_tiles(k, twin)
                and tiling.k_tiles(k, t) >= wgmma.PINGPONG_MIN_KTILES
                and wgmma.blocks_per_sm(t, variant.maths, k) == 2
                and wgmma.blocks_per_sm(twin, variant.maths, k) == 1)
    premises = {  # why the rule passes each by
        stem: lambda k, t: (t.warps_m == 4 and tiling.k_tiles(k, t) < wgmma.PINGPONG_MIN_KTILES
                            and wgmma.blocks_per_sm(t, variant.maths, k) == 2),
        wide: lambda k, t: t.warps_m == 8,
        small: lambda k, t: few_tiles(k, wgmma.pingpong_twin(k, t, variant.maths)),
        conv4: lambda k, t: (one_block_in_place_of_two(k, t)
                             and k.Mg > wgmma.PINGPONG_MAX_FILTERS and t.gather != "table"),
        inception: lambda k, t: (one_block_in_place_of_two(k, t)
                                 and k.Mg <= wgmma.PINGPONG_MAX_FILTERS and k.Cg % t.bk != 0
                                 and t.gather == {"tf32": "table"}.get(variant.maths, "tma")),
    }
    for shape, premise in premises.items():
        offered = variant.configs(shape, "relu")
        k = variant.kernel_shape(shape)
        assert premise(k, offered[0]), (shape, offered[0])
        assert offered[0].schedule != "pingpong", shape
        assert all(t.schedule != "pingpong" for t in offered[:-1])
    assert variant.configs(wide, "relu")[-1].schedule == "pingpong"
    adding = variant.configs(vgg, "add-relu")
    assert adding[0].schedule != "pingpong"


@pytest.mark.parametrize("name", ["wgmma", "wgmma-fp16"])
def test_the_own_choice_halves_a_128_row_tile_into_a_pingpong_one_on_a_layer_of_one_wave(name):
    """VGG-16's 112x112 3x3 layer at batch 1 and ResNet-50's 14x14 3x3 layer at batch 32:
    the correction's choice is an unsplit 128-row tile of two warpgroups, and its tiles fit
    one wave; the own choice is the pingpong tile of 64 rows and twice its N (the same area),
    at its most stages, and the traded tiling comes second. The same VGG-16 layer at batch 4
    (more tiles than SMs), a tile 32 wide (under ONE_WAVE_MIN_N), a 5x5 layer whose 24
    channels fill part of a K-tile (gathered by copy engine in tf32, by table in 16 bits), an
    add-relu conv and a 3xTF32 variant keep the correction's choice."""
    variant = get_variant(name)
    for shape in (ConvShape(1, 64, 112, 112, 128, 3, pad=1, bias=True),
                  ConvShape(32, 256, 14, 14, 256, 3, pad=1, bias=True)):
        k = variant.kernel_shape(shape)
        chosen, traded = variant.configs(shape, "relu")[:2]
        assert (traded.bm, traded.warps_m, traded.split_k) == (128, 8, 1), traded
        assert tiling.output_tiles(k, traded) <= 132
        assert chosen.schedule == "pingpong" and (chosen.bm, chosen.split_k) == (64, 1)
        assert (chosen.bn, chosen.gather) == (2 * traded.bn, traded.gather)
        assert chosen.stages == max(t.stages for t in variant.ranked(shape)
                                    if t.schedule == "pingpong" and t.split_k == 1
                                    and (t.bn, t.gather) == (chosen.bn, chosen.gather))
    four = ConvShape(4, 64, 112, 112, 128, 3, pad=1, bias=True)
    narrow = ConvShape(1, 256, 56, 56, 512, 1, stride=2, bias=True)
    part = ConvShape(2, 24, 64, 64, 256, 5, pad=2, bias=True)
    for shape, premise in ((four, lambda k, t: tiling.output_tiles(k, t) > 132),
                           (narrow, lambda k, t: t.bn < wgmma.ONE_WAVE_MIN_N),
                           (part, lambda k, t: k.Cg % t.bk != 0 and t.bn >= 64
                            and tiling.output_tiles(k, t) <= 132)):
        k = variant.kernel_shape(shape)
        first = variant.configs(shape, "relu")[0]
        assert (first.bm, first.warps_m, first.split_k) == (128, 8, 1), (shape, first)
        assert premise(k, first), (shape, first)
    unet = ConvShape(1, 64, 128, 128, 128, 3, pad=1, bias=True)  # a halo tile, a row each
    halo = tiling.Tiling(128, 128, wgmma.k_elements(variant.maths), 8, 1, 6, 1, "tap", "halo",
                         rows=1)
    k = variant.kernel_shape(unet)
    assert wgmma.one_wave_pingpong(k, halo, variant.maths).bn == 256
    assert wgmma.one_wave_pingpong(k, dataclasses.replace(halo, rows=2), variant.maths) is None
    adding = ConvShape(4, 256, 56, 56, 128, 1, bias=True)  # the rule would take its tile
    first = variant.configs(adding, "add-relu")[0]
    assert wgmma.one_wave_pingpong(variant.kernel_shape(adding), first, variant.maths)
    assert first.schedule != "pingpong"
    fp32 = get_variant("wgmma-3xtf32")
    shape = ConvShape(1, 64, 112, 112, 128, 3, pad=1, bias=True)
    assert fp32.configs(shape, "relu")[0].schedule != "pingpong"
    assert wgmma.one_wave_pingpong(fp32.kernel_shape(shape), fp32.configs(shape, "relu")[0],
                                   fp32.maths) is None


def test_the_pingpong_rule_leaves_3xtf32_alone():
    """3xTF32's pingpong twins were never timed: its own choice on the layer where tf32 and
    fp16 take the twin stays the correction's, and the tuner is offered the twin last."""
    variant = get_variant("wgmma-3xtf32")
    vgg = ConvShape(128, 64, 224, 224, 64, 3, pad=1, bias=True)
    offered = variant.configs(vgg, "relu")
    assert offered[0].schedule != "pingpong" and offered[-1].schedule == "pingpong"


@pytest.mark.parametrize("name,shape", [
    ("wgmma", ConvShape(64, 4096, 1, 1, 1000, 1, bias=True)),
    ("wgmma-fp16", ConvShape(3, 32, 9, 9, 200, 3, pad=1, groups=2, bias=True)),
    ("wgmma-3xtf32", ConvShape(64, 4096, 1, 1, 1000, 1, bias=True)),
    ("channels-last", ConvShape(64, 4096, 1, 1, 1000, 1, bias=True)),
], ids=["fc-1000", "grouped-100", "3xtf32-two-parts", "mma-fragments"])
def test_the_kernel_steps_through_the_rows_the_host_packs(name, shape):
    """The device's A_LAST_ROWS (FilterTiles' step through a group's last m-tile) is the
    host's packing.last_tile_rows where the pack is trimmed, and a whole tile where it is not
    (3xTF32's two parts, the mma fragment packs): one build of each, asserted by the compiler."""
    variant = get_variant(name)
    k = variant.kernel_shape(shape)
    t = next(t for t in variant.ranked(shape) if k.Mg % t.bm)
    single = variant.configured(t)
    trimmed = name.startswith("wgmma") and single.maths != "3xtf32"
    rows = packing.last_tile_rows(k, t, 1) if trimmed else t.bm
    assert (rows < t.bm) == trimmed
    weights = np.ones(shape.weight_shape, dtype=np.float32)
    whole = k.groups * tiling.m_tiles(k, t) * t.bm * tiling.k_tiles(k, t) * t.bk
    packed = single.packed_weights(weights, k, t)
    assert (packed.size * packed.itemsize < whole * np.dtype(single.input_dtype()).itemsize
            * (2 if single.maths == "3xtf32" else 1)) == trimmed
    source = single.source + f'\nstatic_assert(A_LAST_ROWS == {rows}, "the host\'s rows");\n'
    options = single.compile_options(shape, None)
    arch = single.arch or jit.CHECK_ARCH
    assert jit.compile_cubin(single.name, source, options, arch)[:4] == b"\x7fELF"


@pytest.mark.parametrize("name", ["wgmma-3xtf32", "wgmma-split-bf16"])
def test_the_fp32_class_holding_its_filters_once_packs_them_once(name):
    """Held once (holding_filters_once), the fp32 class's warp-specialised packs are the
    float32 filters, swizzled as the stage holds them and a group's last m-tile trimmed as the
    other maths' are, which the MMA threads split (A_SPLIT_ON_CHIP, which the compiler checks);
    the grid schedule's packs, and every pack of the variant as registered, hold both parts,
    whole tiles. The flag survives a tiling, an output type and a kept type."""
    registered = get_variant(name)
    once = registered.holding_filters_once()
    assert once.filters_once and not registered.filters_once
    assert once.holding_filters_once() is once
    shape = ConvShape(2, 128, 9, 9, 200, 3, pad=1, bias=True)  # 1,152 terms, a part m-tile
    k = registered.kernel_shape(shape)
    weights = np.random.default_rng(3).standard_normal(shape.weight_shape).astype(np.float32)
    ranked = registered.ranked(shape)
    for schedule in ("persistent", "grid"):
        t = next(t for t in ranked if t.schedule == schedule and k.Mg % t.bm)
        for variant in (registered, once):
            single = variant.configured(t)
            assert single.filters_once == variant.filters_once
            split = variant.filters_once and schedule == "persistent"
            packed = single.packed_weights(weights, k, t)
            tile = t.bm * t.bk
            mtiles, ktiles = tiling.m_tiles(k, t), tiling.k_tiles(k, t)
            if split:
                rows = packing.last_tile_rows(k, t, 1)
                assert rows < t.bm
                assert packed.size == k.groups * ((mtiles - 1) * tile + rows * t.bk) * ktiles
                a = packing.gemm_weights(weights, k, t, "NHWC").astype(np.float32)
                whole = wgmma.swizzle_tiles(a, t)[:, :, :, None, :]
                assert np.array_equal(packed, packing.trim_last_tiles(whole, rows, t.bm))
            else:
                assert packed.size == 2 * k.groups * mtiles * tile * ktiles
            source = single.source + (
                f"\nstatic_assert(A_SPLIT_ON_CHIP == {int(split)} && "
                f"A_COPY_VECS == {tile // 4 * (1 if split else 2)}, \"pack\");\n")
            options = single.compile_options(shape, "relu")
            assert jit.compile_cubin(single.name, source, options, "sm_90a")[:4] == b"\x7fELF"
    assert once.writing(np.float16).filters_once and once.adding(np.float16).filters_once
    fp16 = get_variant("wgmma-fp16")
    assert fp16.holding_filters_once() is fp16


SAME_TYPE = """
template <class A, class B> struct Same { enum : bool { value = false }; };
template <class A> struct Same<A, A> { enum : bool { value = true }; };
"""


@pytest.mark.parametrize("schedule, gather, expected", [
    ("grid", "tap", "GridKernel<GridWalk<SPLIT_K, MTILES, KTILES>>"),
    ("persistent", "tap",
     "PersistentKernel<PersistentWalk<SPLIT_K, MTILES, KTILES, G, BN>, NhwcGather<BN_ROWS>>"),
    ("persistent", "tma",
     "PersistentKernel<PersistentWalk<SPLIT_K, MTILES, KTILES, G, BN>, Im2colGather>"),
    ("pingpong", "tap",
     "PersistentKernel<PersistentWalk<SPLIT_K, MTILES, KTILES, G, BN>, NhwcGather<BN_ROWS>>"),
    ("halo", "tap", "HaloKernel<{rows}, {patch_stages}>")])
def test_the_kernel_runs_the_template_of_the_tilings_schedule(schedule, gather, expected):
    """The one __global__ function runs the tiling's schedule: TilingKernel is that schedule's
    template with its walk and gather (the halo's with its rows and patch buffers), and the
    launch bounds are the schedule's threads and blocks per SM (none for the grid)."""
    variant = get_variant("wgmma-fp16")
    t = next((t for t in variant.ranked(RESNET)
              if t.schedule == schedule and t.gather == gather and t.cluster == 1), None)
    assert t, f"no {schedule} tiling gathering by {gather} on {RESNET.brief()}"
    expected = expected.format(rows=t.rows, patch_stages=wgmma.halo.PATCH_STAGES)
    warp_specialised = wgmma.schedule_of(t).warp_specialised
    threads = t.threads + (128 if warp_specialised else 0)
    min_blocks = wgmma.blocks_per_sm(t, "fp16", RESNET) if warp_specialised else 0
    built = variant.configured(t)
    assert built.source.count("__global__") == 1
    check = (SAME_TYPE + f'static_assert(Same<TilingKernel, {expected}>::value, "schedule");\n'
             f"static_assert(TilingKernel::threads == {threads} && "
             f'TilingKernel::min_blocks == {min_blocks}, "launch bounds");\n')
    result = jit.nvrtc_compile("wgmma.cu", built.source + check,
                               built.compile_options(RESNET), "sm_90a")
    assert result.cubin is not None, result.log
    assert kernel_resources(result.cubin)["conv_forward"].max_threads == threads
