"""wgmma: the swizzled A image, the tiling rules, the registry's GPU check and the cubin cache,
on any machine. The swizzle is decoded here from its definition (byte m*128 + (k*e ^ 16*(m%8))
of a tile), independently of `swizzle_tiles`' reshapes."""

import os

import numpy as np
import pytest

from convlab.errors import ConvlabError
from convlab.gpu import jit
from convlab.kernels import VARIANTS, base, wgmma as W
from convlab.kernels.igemm import packing, tiling, wgmma
from convlab.models import get_model
from convlab.shapes import ConvShape

VARIANTS_W = [W.Wgmma(), W.Wgmma3xTF32(), W.WgmmaFP16(), W.WgmmaBF16()]
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
        assert variant.supports(shape), (shape.brief(), variant.supports(shape).reason)
        t = variant.config_for(shape)
        assert not variant.tiling_problem(t) and not variant.shape_problem(shape, t)
        assert t.bk * tiling.element_bytes(variant.maths) == 128 and t.warps_n == 1
        assert all(not variant.tiling_problem(c) for c in variant.configs(shape))


def test_tiling_rules_name_what_is_wrong():
    fp16 = W.WgmmaFP16()
    assert "bk must be 64" in fp16.tiling_problem(tiling.Tiling(128, 128, 32, 8, 1, 4, 1, "tap"))
    assert "warpgroup" in fp16.tiling_problem(tiling.Tiling(128, 128, 64, 4, 2, 4, 1, "tap"))
    assert "bn must be one of" in fp16.tiling_problem(tiling.Tiling(64, 48, 64, 4, 1, 4, 1, "tap"))
    assert "stages" in fp16.tiling_problem(tiling.Tiling(64, 64, 64, 4, 1, 2, 1, "tap"))
    assert "shared memory" in fp16.tiling_problem(tiling.Tiling(128, 256, 64, 8, 1, 8, 1, "tap"))
    with pytest.raises(ValueError, match="bk must be 32"):
        W.Wgmma({"bm": 64, "bn": 64, "bk": 64, "warps_m": 4, "warps_n": 1, "stages": 3,
                 "split_k": 1, "gather": "tap"})


def test_the_registry_names_the_gpu_a_wgmma_variant_needs(monkeypatch):
    shape = ConvShape(2, 64, 9, 9, 32, 3, pad=1)
    monkeypatch.setattr(base, "compute_capability", lambda: (8, 0))
    support = VARIANTS["wgmma-fp16"].supports(shape)
    assert not support and "compute capability 9.0" in support.reason and "8.0" in support.reason
    assert VARIANTS["channels-last-fp16"].supports(shape)
    monkeypatch.setattr(base, "compute_capability", lambda: (9, 0))
    assert VARIANTS["wgmma-fp16"].supports(shape)


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
    variant = VARIANTS["wgmma-fp16"]
    shape = SHAPES[2]
    options = variant.compile_options(shape, "relu")
    assert jit.compile_cubin(variant.name, variant.source, options, "sm_90a")[:4] == b"\x7fELF"
    result = jit.nvrtc_compile("wgmma.cu", variant.source, options, "sm_90")
    assert result.cubin is None and "wgmma" in result.log


def test_3xtf32_packs_each_a_tile_as_a_big_then_a_small_swizzled_tile():
    """The kernel reads A's small tile BM*128 bytes after its big one: the host's image holds
    TF32 values at the descriptor's swizzled bytes that add up to the filters to ~2^-22."""
    variant = W.Wgmma3xTF32()
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


def test_3xtf32_tilings_keep_two_accumulator_sets_in_registers():
    variant = W.Wgmma3xTF32()
    wide = tiling.Tiling(64, 160, 32, 4, 1, 4, 1, "tap")
    assert "two accumulator sets" in variant.tiling_problem(wide)
    assert not W.Wgmma().tiling_problem(wide)
    assert not variant.tiling_problem(tiling.Tiling(64, 128, 32, 4, 1, 4, 1, "tap"))
    t = tiling.Tiling(128, 96, 32, 8, 1, 3, 1, "tap")
    assert variant.smem_bytes(t) == 2 * W.Wgmma().smem_bytes(t) - wgmma.SWIZZLE_ALIGN
    assert all(c.bn <= 128 for s in SHAPES for c in variant.configs(s))


@pytest.mark.parametrize("variant", VARIANTS_W, ids=lambda v: v.name)
def test_no_wgmma_waits_for_the_one_before(variant):
    """ptxas serializes every wgmma of a kernel (warning C7514) where other instructions read
    accumulators while a group may be in flight; the pipeline reads them only after
    wait_group 0. The default tiling of a 3x3 layer, the table-gathered stem and an FC layer."""
    shapes = [SHAPES[2], SHAPES[0], SHAPES[-1]]
    for shape in shapes:
        options = variant.compile_options(shape, "relu") + ("-Xptxas=-v",)
        log = jit.nvrtc_compile("wgmma.cu", variant.source, options, "sm_90a").log
        assert "C7514" not in log, f"{variant.name} {shape.brief()}: {log}"


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
