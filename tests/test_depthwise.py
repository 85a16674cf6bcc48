"""The depthwise variants without a GPU: which layers they take (and why not the others), the
tiles they and the tuner choose (each compiled), the filters as the kernel reads them, and
compare's default rows on a depthwise layer."""

import numpy as np
import pytest

from convlab.bench.compare import parse_kernels
from convlab.kernels import RELU
from convlab.kernels.depthwise import (BlockTile, Depthwise, DepthwiseBF16, DepthwiseFP16,
                                       copy_vector, heuristic_tile, lanes, patch_bytes,
                                       rounded_filters, tap_major, tile_problem)
from convlab.shapes import ConvShape

pytestmark = pytest.mark.usefixtures("private_cache")

DEPTHWISE = ConvShape(64, 128, 56, 56, 128, 3, pad=1, groups=128)
ALL = [Depthwise(), DepthwiseFP16(), DepthwiseBF16()]


@pytest.mark.parametrize("shape", [DEPTHWISE, ConvShape(2, 6, 11, 9, 6, 3, stride=2, groups=6),
                                   ConvShape(3, 7, 5, 6, 7, 7, pad=3, groups=7)],
                         ids=lambda s: s.brief())
def test_depthwise_layers_are_supported(shape):
    for variant in ALL:
        assert variant.supports(shape), variant.supports(shape).reason


@pytest.mark.parametrize("shape", [ConvShape(2, 8, 9, 9, 8, 3, groups=4),
                                   ConvShape(2, 3, 9, 9, 8, 3),
                                   ConvShape(2, 4, 9, 9, 8, 3, groups=4),
                                   ConvShape(10, 1, 28, 28, 50, 5)], ids=lambda s: s.brief())
def test_other_layers_are_refused_with_the_reason(shape):
    support = Depthwise().supports(shape)
    assert not support
    assert f"this layer has {shape.Cg} input and {shape.Mg} output channels" in support.reason
    assert "implicit GEMM" in support.reason


def test_the_heuristic_takes_two_channels_where_the_filters_fit():
    assert heuristic_tile(DEPTHWISE, "fp32") == BlockTile(2, 16, 8)
    assert heuristic_tile(DEPTHWISE, "fp16") == BlockTile(2, 16, 8)
    assert heuristic_tile(ConvShape(2, 96, 56, 56, 96, 5, pad=2, groups=96), "fp16").vec == 1
    assert heuristic_tile(ConvShape(2, 95, 56, 56, 95, 3, pad=1, groups=95), "fp32").vec == 1
    # 6 channels: 3 lanes of 2; 85 columns would make 255 threads, 7 cover the layer's
    assert heuristic_tile(ConvShape(2, 6, 9, 9, 6, 3, groups=6), "fp32") == BlockTile(2, 7, 7)
    # stride 2 at 5x5: 16 rows would make an 85 KB patch; 8 make 46 KB
    strided = ConvShape(64, 144, 56, 56, 144, 5, stride=2, pad=2, groups=144)
    assert heuristic_tile(strided, "fp32") == BlockTile(1, 8, 8)
    mobilenet = ConvShape(64, 128, 112, 112, 128, 3, stride=2, pad=1, groups=128)
    assert heuristic_tile(mobilenet, "fp16") == BlockTile(2, 8, 8)  # 36 KB, not 72
    # one channel, 11x11 at stride 4 on a wide image: 256 columns would be a 94 KB patch
    wide = ConvShape(1, 1, 24, 4000, 1, 11, stride=4, groups=1)
    assert heuristic_tile(wide, "fp32") == BlockTile(1, 4, 128)
    assert Depthwise().supports(wide)


def test_copies_are_16_bytes_where_the_channels_allow():
    seven = ConvShape(2, 96, 9, 9, 96, 7, pad=3, groups=96)
    assert copy_vector(seven, BlockTile(1, 8, 8), "fp16", 96) == 8  # 32 channels a block
    assert copy_vector(DEPTHWISE, BlockTile(2, 8, 8), "fp32", 128) == 4
    six = ConvShape(2, 6, 9, 9, 6, 3, groups=6)
    assert copy_vector(six, BlockTile(2, 4, 8), "fp16", 8) == 2  # 3 lanes of 2: 6 a block
    assert copy_vector(six, BlockTile(1, 4, 8), "fp32", 6) == 2  # 24-byte pixels
    one = ConvShape(2, 1, 9, 9, 1, 3, groups=1)
    assert copy_vector(one, BlockTile(1, 4, 8), "fp16", 4) == 1  # 2 bytes: through a register


def test_lanes_and_patch_follow_the_tile():
    assert lanes(DEPTHWISE, 2, "fp32") == 32 and lanes(DEPTHWISE, 8, "fp16") == 16
    assert lanes(ConvShape(1, 6, 5, 5, 6, 3, groups=6), 2, "fp32") == 3  # fewer than 16 bytes
    assert lanes(ConvShape(1, 144, 5, 5, 144, 3, groups=144), 2, "fp16") == 24  # 3 chunks of 24
    assert lanes(ConvShape(1, 70, 5, 5, 70, 3, groups=70), 2, "fp32") == 18  # 2 of 18: one partial
    # 144 of 1 in 5 chunks would be 29 lanes, copied 4 bytes at a time: rounded to 32 (16 B)
    assert lanes(ConvShape(1, 144, 5, 5, 144, 5, groups=144), 1, "fp32") == 32
    assert lanes(ConvShape(1, 144, 5, 5, 144, 5, groups=144), 1, "fp16") == 32
    # (8-1)*1+3 rows x (8-1)*1+3 columns x 64 channels x 4 bytes
    assert patch_bytes(DEPTHWISE, BlockTile(2, 8, 8), "fp32") == 10 * 10 * 64 * 4
    s2 = ConvShape(1, 32, 17, 17, 32, 3, stride=2, pad=1, groups=32)
    assert patch_bytes(s2, BlockTile(4, 4, 8), "fp16") == 9 * 17 * 32 * 2  # 8 lanes of 4


@pytest.mark.parametrize("variant", ALL, ids=lambda v: v.name)
def test_every_config_runs_the_layer_and_the_heuristic_comes_first(variant):
    configs = variant.configs(DEPTHWISE)
    assert configs[0] == heuristic_tile(DEPTHWISE, variant.maths)
    assert len(set(configs)) == len(configs) > 10
    assert all(not tile_problem(c, variant.maths, DEPTHWISE) for c in configs)
    assert max(c.vec for c in configs) == 16 // (4 if variant.maths == "fp32" else 2)


@pytest.mark.slow
@pytest.mark.parametrize("variant", ALL, ids=lambda v: v.name)
def test_every_config_compiles_with_either_output(variant, compile_all):
    """16-byte vectors of fp16 input with an fp32 output store 32 bytes a row: two vectors."""
    shape = ConvShape(2, 64, 12, 10, 64, 3, stride=2, pad=1, groups=64, bias=True)
    jobs = [(v.configured(c), shape, RELU) for c in variant.configs(shape)
            for v in (variant, variant.writing(np.float16))]
    assert all(cubin[:4] == b"\x7fELF" for cubin in compile_all(jobs))


def test_a_tile_that_cannot_run_is_refused():
    with pytest.raises(ValueError, match="power of two"):
        Depthwise({"vec": 3, "rows": 4, "cols": 8})
    with pytest.raises(ValueError, match="up to 4"):
        Depthwise({"vec": 8, "rows": 4, "cols": 8})
    assert "does not divide" in tile_problem(BlockTile(4, 2, 8), "fp32",
                                             ConvShape(1, 6, 5, 5, 6, 3, groups=6))
    assert "filter registers" in tile_problem(BlockTile(4, 2, 8), "fp32",
                                              ConvShape(1, 8, 9, 9, 8, 7, groups=8))
    assert "patch" in tile_problem(BlockTile(4, 16, 512), "fp32",
                                   ConvShape(1, 8, 9, 900, 8, 3, groups=8))
    assert not Depthwise().accepts(BlockTile(8, 2, 8), DEPTHWISE)


def test_filters_are_tap_major_at_the_class_precision():
    shape = ConvShape(1, 4, 5, 5, 4, 3, groups=4)
    w = np.arange(36, dtype=np.float32).reshape(4, 1, 3, 3) + np.float32(1 / 3)
    packed = tap_major(w, shape)
    assert packed.shape == (9, 4)
    assert packed[5, 2] == w[2, 0, 1, 2]
    assert np.array_equal(rounded_filters(w, "fp16"), w.astype(np.float16).astype(np.float32))
    bf16 = rounded_filters(w, "bf16")
    assert np.all(bf16.view(np.uint32) & 0xFFFF == 0)
    assert np.all(np.abs(bf16 - w) <= np.abs(w) * 2.0**-8)
    assert np.array_equal(rounded_filters(w, "fp32"), w)


def test_defines_pad_the_staged_pixel_to_8_bytes():
    shape = ConvShape(2, 7, 9, 9, 7, 3, groups=7)
    assert Depthwise().defines(shape)["CP"] == 8  # 28 bytes -> 32
    assert DepthwiseFP16().defines(shape)["CP"] == 8  # 14 bytes -> 16
    assert Depthwise().defines(DEPTHWISE)["CP"] == 128


def test_compare_offers_the_depthwise_rows_on_a_depthwise_layer_only():
    names = parse_kernels(None, [DEPTHWISE])
    assert {"depthwise", "depthwise-fp16", "depthwise-bf16"} <= set(names)
    assert "depthwise" not in parse_kernels(None, [ConvShape(2, 8, 9, 9, 8, 3)])
