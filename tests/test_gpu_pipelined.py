"""GPU checks for the pipelined family and its channels-last and wgmma siblings: each variant
against float64 at its precision's bound.

Random general shapes (stride, padding, groups, bias, ReLU, odd sizes, batch 1-9), the AlexNet
layers at batch 2, several tilings each (split-K included), and for pipelined-3xtf32 the fp32
rule on mixed-sign data and its measured margin on same-sign data. Run with `pytest -m gpu -s`
to see the printed bound ratios.
"""

import dataclasses

import numpy as np
import pytest

from convlab.errors import ConvlabError
from convlab.kernels import RELU, get_variant, wgmma as W
from convlab.kernels.igemm import packing, staging, tiling, wgmma
from convlab.models import get_model
from convlab.oracle.verify import compare, poison, random_problem, reference_output
from convlab.shapes import ConvShape

pytestmark = pytest.mark.gpu

VARIANTS = [get_variant(n) for n in ("pipelined", "pipelined-3xtf32", "pipelined-fp16",
                                     "pipelined-bf16", "channels-last", "channels-last-3xtf32",
                                     "channels-last-fp16", "channels-last-bf16", "wgmma",
                                     "wgmma-3xtf32", "wgmma-split-bf16", "wgmma-fp16",
                                     "wgmma-bf16")]
FP32_CLASS = [get_variant(n) for n in ("pipelined-3xtf32", "channels-last-3xtf32", "wgmma-3xtf32",
                                       "wgmma-split-bf16")]
IDS = [v.name for v in VARIANTS]

GENERAL = [
    ConvShape(1, 3, 17, 13, 7, 3),
    ConvShape(2, 5, 19, 23, 9, 5, stride=2, pad=2, bias=True),
    ConvShape(3, 8, 31, 29, 12, 11, stride=4, pad=1, groups=2),
    ConvShape(4, 12, 9, 11, 20, 3, pad=1, groups=4, bias=True),
    ConvShape(5, 7, 14, 10, 33, 1, bias=True),
    ConvShape(6, 16, 8, 8, 48, 3, stride=2, pad=3, groups=2),
    ConvShape(7, 4, 6, 5, 8, 5, pad=2, groups=4, bias=True),
    ConvShape(8, 64, 7, 7, 65, 3, pad=1),  # full 32-channel chunks; M=65: several m-tiles
    ConvShape(9, 96, 5, 5, 40, 3, pad=1, groups=2, bias=True),  # 48 channels per group
    ConvShape(2, 33, 12, 12, 17, 2, stride=2),  # a partial channel chunk
    ConvShape(1, 1, 28, 28, 50, 5),
    ConvShape(9, 20, 3, 3, 10, 3, pad=1, groups=2),
    ConvShape(2, 16, 9, 9, 16, 3, pad=1, groups=16, bias=True),  # depthwise
    ConvShape(1, 3, 33, 31, 24, 7, stride=2, pad=3, bias=True),  # a 7x7 stem, 3 channels
    ConvShape(3, 40, 7, 7, 24, 1, stride=2),  # 1x1, stride 2
]
ALEXNET = get_model("alexnet").conv_shapes(2)


def run(variant, shape, x, w, b, epilogue):
    import cupy

    return cupy.asnumpy(variant.prepare(shape, w, epilogue, b).run_once(x, cupy))


def skip_off_its_gpu(variant, shape):
    if variant.compute_capability and not variant.supports(shape):
        pytest.skip(variant.supports(shape).reason)  # wgmma off a Hopper GPU


def check(variant, shape, rng, epilogue=RELU, signed=True):
    skip_off_its_gpu(variant, shape)
    x, w, b = random_problem(shape, rng, signed=signed)
    got = run(variant, shape, x, w, b, epilogue)
    result = compare(got, reference_output(x, w, shape, epilogue, b), variant.precision)
    config = variant.config_for(shape).brief()
    print(f"{variant.name} {shape.brief()} B{shape.B} [{config}]: bound ratio "
          f"{result.bound_ratio:.3g}, max rel {result.max_rel_error:.3g}")
    return result


@pytest.mark.parametrize("index", range(len(GENERAL)),
                         ids=[f"B{s.B}-{s.brief()}" for s in GENERAL])
@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_general_shapes(variant, index, rng):
    shape = GENERAL[index]
    result = check(variant, shape, rng, RELU if index % 2 else None, signed=index % 3 != 0)
    assert result.passed, result.reason


@pytest.mark.parametrize("layer", list(ALEXNET))
@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_alexnet_layers_at_batch_2(variant, layer, rng):
    result = check(variant, ALEXNET[layer], rng, RELU, signed=False)
    assert result.passed, result.reason


CONFIG_SHAPES = [ALEXNET["conv2"], ALEXNET["conv1"], GENERAL[3], GENERAL[9]]


@pytest.mark.parametrize("shape", CONFIG_SHAPES, ids=lambda s: f"B{s.B}-{s.brief()}")
@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_several_tilings(variant, shape, rng):
    """The first six tilings configs() offers, and its first split-K one, not only the
    heuristic's choice."""
    configs = variant.configs(shape, RELU)
    chosen = configs[:6] + [c for c in configs[6:] if c.split_k > 1][:1]
    failures = []
    for config in chosen:
        result = check(variant.configured(config), shape, rng, RELU)
        if not result.passed:
            failures.append(f"{tiling.Tiling.from_dict(config).brief()}: {result.reason}")
    assert not failures, "\n".join(failures)


WGMMA = [get_variant(n) for n in ("wgmma", "wgmma-3xtf32", "wgmma-split-bf16", "wgmma-fp16",
                                  "wgmma-bf16")]
# More output tiles than a persistent grid has blocks (at most two per SM): each block walks
# several tiles, its loaders running from one tile's K-tiles into the next one's.
MANY_TILES = [ConvShape(16, 32, 48, 48, 160, 3, pad=1, groups=2, bias=True),
              ConvShape(24, 64, 56, 56, 64, 3, pad=1)]


def persistent_tilings(variant, shape):
    """The cost model's first persistent tiling of each gather (cp.async, the copy engine's,
    alone or in two-block clusters) at each count of MMA warpgroups and of blocks per SM, with
    and without registers moved to the MMA warps (setmaxnreg)."""
    chosen = {}
    k = variant.kernel_shape(shape)
    for t in variant.ranked(shape):
        if t.schedule == "persistent":
            moved = wgmma.register_split(k, t, variant.maths)[0] > 0
            chosen.setdefault((t.gather, t.cluster, t.warps_m,
                               wgmma.blocks_per_sm(t, variant.maths), moved), t)
    return list(chosen.values())


@pytest.mark.parametrize("shape", GENERAL + list(ALEXNET.values()) + MANY_TILES,
                         ids=lambda s: f"B{s.B}-{s.brief()}")
@pytest.mark.parametrize("variant", WGMMA, ids=lambda v: v.name)
def test_the_persistent_schedule(variant, shape, rng):
    tilings = persistent_tilings(variant, shape)
    assert tilings
    check_tilings(variant, shape, tilings, rng)


# The fp32 class holding its filters once: the MMA threads split them in registers.
FILTERS_ONCE = [v.holding_filters_once() for v in WGMMA if v.maths == "3xtf32"]


@pytest.mark.parametrize("shape", GENERAL + list(ALEXNET.values()) + MANY_TILES,
                         ids=lambda s: f"B{s.B}-{s.brief()}")
@pytest.mark.parametrize("variant", FILTERS_ONCE, ids=lambda v: f"{v.name}-filters-once")
def test_the_fp32_class_holding_its_filters_once(variant, shape, rng):
    """The float32 filters, once, split in the MMA threads' registers (A_SPLIT_ON_CHIP), in
    the persistent tilings persistent_tilings picks (one and two warpgroups, split-K, one and
    two blocks an SM) and the pingpong ones: groups, channel and pixel tails, a group's last
    m-tile trimmed."""
    tilings = persistent_tilings(variant, shape) + [
        t for t in variant.ranked(shape) if t.schedule == "pingpong"][:2]
    assert tilings and variant.filters_once
    check_tilings(variant, shape, tilings, rng)


def check_tilings(variant, shape, tilings, rng):
    """Each tiling against float64; the failures listed together."""
    failures = []
    for t in tilings:
        result = check(variant.configured(t), shape, rng, RELU if shape.bias else None)
        if not result.passed:
            failures.append(f"{t.brief()}: {result.reason}")
    assert not failures, "\n".join(failures)


def check_relaunch_and_fp16(variant, t, shape, x, w, b):
    """Two launches of tiling t give the same bits (the barriers start each launch afresh),
    the float32 output matches float64, and an fp16 output is it rounded to nearest even
    (assert_rounded_to_fp16)."""
    import cupy

    single = variant.configured(t)
    outputs = {}
    for dtype in (np.float32, np.float32, np.float16):
        op = single.writing(dtype).prepare(shape, w, RELU, b)
        y = cupy.empty(op.output_shape, dtype=dtype)
        poison(y)
        op(op.stage(cupy.asarray(x)), y)
        outputs.setdefault(dtype, []).append(cupy.asnumpy(op.output(y)))
    first, second = outputs[np.float32]
    assert np.array_equal(first, second), t.brief()
    result = compare(first, reference_output(x, w, shape, RELU, b), single.precision)
    assert result.passed, f"{t.brief()}: {result.reason}"
    assert_rounded_to_fp16(outputs[np.float16][0], first, rounds_tf32(single, shape), t.brief())


def rounds_tf32(variant, shape) -> bool:
    return bool(variant.defines(shape, RELU).get("OUT_TF32"))


def assert_rounded_to_fp16(halves, floats, tf32_first, label=""):
    """The fp16 output is the float32 one rounded to nearest even. Where that float32 output is
    itself rounded to TF32 (`tf32_first`: wgmma's OUT_TF32, ties away), rounded again to fp16
    it may land one fp16 step off, where that rounding tied or below fp16's normal range."""
    assert halves.dtype == np.float16
    steps = np.abs(halves.view(np.uint16).astype(np.int32)
                   - floats.astype(np.float16).view(np.uint16).astype(np.int32))
    assert steps.max() <= (1 if tf32_first else 0), label


@pytest.mark.smoke
@pytest.mark.parametrize("variant", WGMMA, ids=lambda v: v.name)
def test_the_persistent_schedule_writes_fp16_and_runs_again(variant, rng):
    shape = MANY_TILES[0]
    skip_off_its_gpu(variant, shape)
    x, w, b = random_problem(shape, rng, signed=True)
    check_relaunch_and_fp16(variant, persistent_tilings(variant, shape)[0], shape, x, w, b)


# Too few output tiles to fill 132 SMs, where the persistent schedule splits K: a 7x7 grid of
# 512 channels (ResNet-50's last stage at batch 1), groups with an M tail and a pixel tail, a 1x1
# layer; each split count the model offers, with the tap gather and the copy engine's.
FEW_TILES = [ConvShape(1, 512, 7, 7, 512, 3, pad=1, bias=True),
             ConvShape(2, 256, 9, 9, 200, 3, pad=1, groups=2),
             ConvShape(3, 1024, 7, 7, 136, 1, bias=True)]


def persistent_split_tilings(variant, shape):
    """For each K-split above 1, gather and count of MMA warpgroups, a persistent tiling: the
    cost model's first with one warpgroup, the widest with two (the most registers beside the
    reduce)."""
    chosen = {}
    for t in variant.ranked(shape):
        if t.schedule == "persistent" and t.split_k > 1:
            key = (t.split_k, t.gather, t.warps_m)
            if key not in chosen or (t.warps_m == 8 and t.bn > chosen[key].bn):
                chosen[key] = t
    return list(chosen.values())


@pytest.mark.parametrize("shape", FEW_TILES, ids=lambda s: f"B{s.B}-{s.brief()}")
@pytest.mark.parametrize("variant", WGMMA, ids=lambda v: v.name)
def test_the_persistent_schedule_splits_k(variant, shape, rng):
    """Each block walks units of one tile's K-split; the last split of a tile to arrive adds
    the partial tiles and stores, whichever block it ran on."""
    skip_off_its_gpu(variant, shape)
    tilings = persistent_split_tilings(variant, shape)
    assert {t.split_k for t in tilings} >= {2, 4}
    check_tilings(variant, shape, tilings, rng)


# More units of work (a tile's K-split each) than the persistent grid's blocks: a block goes
# on from a split that was not its tile's last to its next unit, the stages' parity and the
# MMA threads' barrier carried over.
MANY_UNITS = ConvShape(4, 512, 7, 7, 512, 3, pad=1, bias=True)


def walking_several_units(variant, shape):
    """The persistent split tilings of `shape` with more units than blocks: the cost model's
    first of each gather and count of MMA warpgroups."""
    chosen = {}
    k = variant.kernel_shape(shape)
    for t in variant.ranked(shape):
        if (t.schedule == "persistent" and t.split_k > 1
                and tiling.output_tiles(k, t) * t.split_k > variant.launch_grid(k, t)[0]):
            chosen.setdefault((t.gather, t.warps_m), t)
    return list(chosen.values())


@pytest.mark.parametrize("variant", WGMMA, ids=lambda v: v.name)
def test_a_block_walks_several_split_units(variant, rng):
    skip_off_its_gpu(variant, MANY_UNITS)
    tilings = walking_several_units(variant, MANY_UNITS)
    assert tilings
    check_tilings(variant, MANY_UNITS, tilings, rng)


def launched_twice(op, x) -> list[np.ndarray]:
    """The op's outputs of two launches on one staged input, each into poisoned memory."""
    import cupy

    xs = op.stage(cupy.asarray(x))
    outputs = []
    for _ in range(2):
        y = cupy.empty(op.output_shape, dtype=op.output_dtype)
        poison(y)
        op(xs, y)
        outputs.append(cupy.asnumpy(op.output(y)))
    return outputs


@pytest.mark.smoke
@pytest.mark.parametrize("variant", WGMMA, ids=lambda v: v.name)
def test_a_persistent_split_k_runs_again_to_the_same_bits(variant, rng):
    """One prepared op launched twice, with the deepest split and with blocks walking several
    units: the arrival counts are back at zero after the first launch (else the second would
    miscount its splits), and the partial tiles are added in split order whatever order they
    arrive in, so the second launch gives the first one's bits; both within the bound."""
    for shape, t in ((FEW_TILES[0], max(persistent_split_tilings(variant, FEW_TILES[0]),
                                        key=lambda t: t.split_k)),
                     (MANY_UNITS, walking_several_units(variant, MANY_UNITS)[0])):
        skip_off_its_gpu(variant, shape)
        x, w, b = random_problem(shape, rng, signed=True)
        outputs = launched_twice(variant.configured(t).prepare(shape, w, RELU, b), x)
        assert np.array_equal(outputs[0], outputs[1]), t.brief()
        result = compare(outputs[1], reference_output(x, w, shape, RELU, b), variant.precision)
        assert result.passed, f"{t.brief()}: {result.reason}"


# Layers for the copy engine's im2col box of 128 bytes of channels (64 fp16 / 32 tf32): strides
# 1-4; pad 0-3, pad beyond the filter's reach (3 on a 3x3); 1x1, 3x3, 5x5, 7x7 and 11x11
# filters; odd, non-square and tiny images; groups; batch and channel tails; more tiles than
# the grid's blocks; and, last, layers of one group whose channels end in part of a box.
TMA_SHAPES = [ConvShape(3, 64, 9, 11, 40, 3, pad=1, bias=True),
              ConvShape(2, 128, 13, 13, 96, 3, pad=1, groups=2),
              ConvShape(5, 64, 17, 15, 72, 5, stride=2, pad=2, bias=True),
              ConvShape(4, 64, 23, 19, 64, 7, stride=2, pad=3),
              ConvShape(2, 64, 31, 29, 48, 11, stride=4, pad=2, bias=True),
              ConvShape(7, 64, 6, 5, 130, 3, pad=3),
              ConvShape(6, 192, 8, 8, 64, 1, stride=2),
              ConvShape(1, 64, 5, 4, 24, 3, stride=3, pad=1),
              ConvShape(9, 64, 12, 12, 64, 3, bias=True),
              MANY_TILES[1],
              # 32 of a box of 64 16-bit channels; 24 of 32 TF32 ones and of 64 16-bit ones;
              # 160 as two and a half 16-bit boxes
              ConvShape(3, 32, 9, 11, 40, 3, pad=1, bias=True),
              ConvShape(4, 24, 10, 10, 40, 1),
              ConvShape(2, 160, 9, 9, 64, 1, Kw=7, pad_w=3, bias=True)]
TMA_VARIANTS = [get_variant(n) for n in ("wgmma", "wgmma-fp16", "wgmma-bf16")]


def float32_output(op, x):
    """The prepared op's float32 output on input `x`, written over a poisoned buffer."""
    import cupy

    y = cupy.empty(op.output_shape, dtype=np.float32)
    poison(y)
    op(op.stage(cupy.asarray(x)), y)
    return cupy.asnumpy(op.output(y))


def narrowest_and_widest(tilings):
    """Of each count of MMA warpgroups, the narrowest N (fewest stages) and the widest (most
    stages)."""
    chosen = []
    for warps in (4, 8):
        mine = [t for t in tilings if t.warps_m == warps]
        if mine:
            chosen += [min(mine, key=lambda t: (t.bn, t.stages)),
                       max(mine, key=lambda t: (t.bn, -t.stages))]
    assert chosen
    return chosen


@pytest.mark.parametrize("shape", [pytest.param(s, marks=pytest.mark.smoke)
                                   if i in (3, 9, 10) else s for i, s in enumerate(TMA_SHAPES)],
                         ids=lambda s: f"B{s.B}-{s.brief()}")
@pytest.mark.parametrize("variant", TMA_VARIANTS, ids=lambda v: v.name)
def test_the_tma_gather_lands_what_the_cp_async_gather_does(variant, shape, rng):
    """The copy engine's im2col box puts in shared memory what the loaders' cp.async copies
    put there, so each persistent "tma" tiling's output has the bits of its "tap" twin's (one
    and two warpgroups, the narrowest and widest N), and matches float64; a second input
    buffer gets its own map."""
    skip_off_its_gpu(variant, shape)
    chosen = narrowest_and_widest(
        [t for t in variant.ranked(shape) if t.gather == "tma" and t.cluster == 1])
    x, w, b = random_problem(shape, rng, signed=True)
    x2 = rng.standard_normal(x.shape).astype(np.float32)
    epilogue = RELU if shape.bias else None
    failures = []
    for t in dict.fromkeys(chosen):
        outputs = []
        for gather in ("tap", "tma"):
            op = variant.configured(dataclasses.replace(t, gather=gather)).prepare(
                shape, w, epilogue, b)
            outputs += [float32_output(op, data) for data in (x, x2)]
        if not (np.array_equal(outputs[0], outputs[2]) and np.array_equal(outputs[1], outputs[3])):
            failures.append(f"{t.brief()}: not the tap gather's bits")
        result = compare(outputs[2], reference_output(x, w, shape, epilogue, b), variant.precision)
        if not result.passed:
            failures.append(f"{t.brief()}: {result.reason}")
    assert not failures, "\n".join(failures)


# Layers whose groups split into an even count of m-tiles, for two-block clusters: two tiles of
# 64 or 128 channels (a partial second one at 130), groups, strides, a 1x1, batch and pixel
# tails, and more tiles than the grid holds.
CLUSTER_SHAPES = [ConvShape(3, 64, 9, 11, 128, 3, pad=1, bias=True),
                  ConvShape(2, 128, 13, 13, 256, 3, pad=1, groups=2),
                  ConvShape(7, 64, 6, 5, 130, 3, pad=3),
                  ConvShape(5, 64, 17, 15, 256, 5, stride=2, pad=2, bias=True),
                  ConvShape(6, 192, 8, 8, 128, 1, stride=2),
                  ConvShape(24, 64, 56, 56, 128, 3, pad=1)]


@pytest.mark.parametrize("shape", [pytest.param(s, marks=pytest.mark.smoke) if i in (2, 5) else s
                                   for i, s in enumerate(CLUSTER_SHAPES)],
                         ids=lambda s: f"B{s.B}-{s.brief()}")
@pytest.mark.parametrize("variant", TMA_VARIANTS, ids=lambda v: v.name)
def test_a_cluster_computes_the_bits_of_its_blocks_alone(variant, shape, rng):
    """Two blocks on neighbouring m-tiles take one B copy into both stages: each cluster
    tiling's output (one and two warpgroups, the narrowest and widest N) has the bits of the
    same tiling run a block alone, twice in a row (the cluster's barriers start each launch
    afresh), and matches float64; the first one's 16-bit output (the stores' 16-byte path) is
    its float32 output rounded."""
    skip_off_its_gpu(variant, shape)
    chosen = narrowest_and_widest([t for t in variant.ranked(shape) if t.cluster == 2])
    x, w, b = random_problem(shape, rng, signed=True)
    epilogue = RELU if shape.bias else None
    failures = []
    for t in dict.fromkeys(chosen):
        outputs = []
        for cluster in (1, 2, 2):
            op = variant.configured(dataclasses.replace(t, cluster=cluster)).prepare(
                shape, w, epilogue, b)
            outputs.append(float32_output(op, x))
        if not (np.array_equal(outputs[0], outputs[1]) and np.array_equal(outputs[1], outputs[2])):
            failures.append(f"{t.brief()}: not the bits of its blocks alone")
        result = compare(outputs[1], reference_output(x, w, shape, epilogue, b), variant.precision)
        if not result.passed:
            failures.append(f"{t.brief()}: {result.reason}")
    assert not failures, "\n".join(failures)
    check_relaunch_and_fp16(variant, chosen[0], shape, x, w, b)


@pytest.mark.smoke
def test_the_tma_gather_names_an_input_off_16_bytes(rng):
    """The copy engine reads from a 16-byte boundary: an input view 8 bytes into its buffer
    is refused with the reason, not read wrong."""
    import cupy

    shape = TMA_SHAPES[0]
    variant = get_variant("wgmma-fp16")
    skip_off_its_gpu(variant, shape)
    t = next(t for t in variant.ranked(shape) if t.gather == "tma")
    x, w, b = random_problem(shape, rng, signed=True)
    op = variant.configured(t).prepare(shape, w, None, b)
    staged = op.stage(cupy.asarray(x))
    buffer = cupy.empty(staged.size + 4, dtype=staged.dtype)
    view = buffer[4:].reshape(shape.B, shape.H, shape.W, shape.C).transpose(0, 3, 1, 2)
    view[...] = staged
    assert view.data.ptr % 16 == 8
    y = cupy.empty(op.output_shape, dtype=np.float32)
    with pytest.raises(ConvlabError, match="starts on 16 bytes"):
        op(view, y)


# Stride-1 layers whose groups hold whole 128-byte channel chunks, for the halo schedule: pad
# 0, 1 and 2; 1x1, 3x3 and 5x5; odd and non-square images; groups; several m-tiles (M=130);
# three fp16 chunks (192 channels); row counts that leave a short last row block; more tiles
# than the grid's blocks (each block walks a run of them, its filters resident or not).
HALO_SHAPES = [ConvShape(3, 64, 9, 11, 40, 3, pad=1, bias=True),
               ConvShape(2, 128, 13, 13, 96, 3, pad=1, groups=2),
               ConvShape(4, 64, 10, 7, 130, 5, pad=2, bias=True),
               ConvShape(5, 64, 12, 12, 64, 3),
               ConvShape(6, 64, 8, 8, 72, 1, bias=True),
               ConvShape(2, 192, 6, 6, 64, 3, pad=1),
               ConvShape(16, 64, 28, 28, 64, 3, pad=1),
               MANY_TILES[1]]
HALO_VARIANTS = [get_variant(n) for n in ("wgmma", "wgmma-fp16", "wgmma-bf16")]


def halo_tilings(variant, shape):
    """The cost model's first halo tiling at each count of MMA warpgroups, of blocks per SM,
    with filters resident or not and with registers moved or not; and the most rows a tile."""
    chosen = {}
    k = variant.kernel_shape(shape)
    halo = [t for t in variant.ranked(shape) if t.schedule == "halo"]
    for t in halo:
        resident = t.stages == tiling.k_tiles(k, t)
        moved = wgmma.register_split(k, t, variant.maths)[0] > 0
        chosen.setdefault((t.warps_m, wgmma.blocks_per_sm(t, variant.maths, k), resident, moved),
                          t)
    if halo:
        chosen.setdefault("rows", max(halo, key=lambda t: t.rows))
    return list(chosen.values())


@pytest.mark.parametrize("shape", HALO_SHAPES + list(ALEXNET.values()),
                         ids=lambda s: f"B{s.B}-{s.brief()}")
@pytest.mark.parametrize("variant", HALO_VARIANTS, ids=lambda v: v.name)
def test_the_halo_schedule(variant, shape, rng):
    tilings = halo_tilings(variant, shape)
    if not tilings:
        assert shape.stride != 1 or shape.Cg * tiling.element_bytes(variant.maths) % 128
        pytest.skip("no halo tiling: stride > 1 or partial 128-byte channel chunks")
    check_tilings(variant, shape, tilings, rng)


@pytest.mark.smoke
@pytest.mark.parametrize("variant", HALO_VARIANTS, ids=lambda v: v.name)
def test_the_halo_schedule_writes_fp16_and_runs_again(variant, rng):
    """As the persistent schedule's, with resident filters and with a ring of A buffers."""
    shape = HALO_SHAPES[6]
    skip_off_its_gpu(variant, shape)
    k = variant.kernel_shape(shape)
    halo = [t for t in variant.ranked(shape) if t.schedule == "halo"]
    resident = next(t for t in halo if t.stages == tiling.k_tiles(k, t))
    ring = next(t for t in halo if t.stages < tiling.k_tiles(k, t))
    x, w, b = random_problem(shape, rng, signed=True)
    for t in (resident, ring):
        check_relaunch_and_fp16(variant, t, shape, x, w, b)


@pytest.mark.parametrize("shape", GENERAL + list(ALEXNET.values()) + MANY_TILES + HALO_SHAPES,
                         ids=lambda s: f"B{s.B}-{s.brief()}")
def test_the_register_store_writes_fp16_as_the_float32_output_rounded(shape, rng):
    """The warp-specialised schedules' fp16 store: under the persistent schedule, where M and a
    group's channels are multiples of 8, 8 channels a 16-byte store after a transpose through
    shared memory (element stores elsewhere, for an odd last n-block, and under the halo
    schedule); channel tails (MG not a multiple of bm), pixel tails, groups. Each layer's
    persistent tilings (one and two warpgroups, one and two blocks per SM) and its first halo
    tiling: the fp16 bits equal the float32 output rounded."""
    variant = get_variant("wgmma-fp16")
    skip_off_its_gpu(variant, shape)
    halo = [t for t in variant.ranked(shape) if t.schedule == "halo"]
    x, w, b = random_problem(shape, rng, signed=True)
    for t in persistent_tilings(variant, shape) + halo[:1]:
        check_relaunch_and_fp16(variant, t, shape, x, w, b)


@pytest.mark.smoke
def test_the_fp16_register_store_takes_an_output_view_off_16_bytes(rng):
    """y a view 8 bytes into its buffer, where a 16-byte store would fault: the kernel stores
    element by element instead, and the bits equal those it writes to an aligned y."""
    import cupy

    shape = MANY_TILES[0]
    variant = get_variant("wgmma-fp16")
    skip_off_its_gpu(variant, shape)
    t = persistent_tilings(variant, shape)[0]
    x, w, b = random_problem(shape, rng, signed=True)
    op = variant.configured(t).writing(np.float16).prepare(shape, w, RELU, b)
    xs = op.stage(cupy.asarray(x))
    size = int(np.prod(op.output_shape))
    aligned = cupy.empty(op.output_shape, dtype=np.float16)
    buffer = cupy.empty(size + 8, dtype=np.float16)
    poison(aligned)
    poison(buffer)
    off = buffer[4:4 + size].reshape(op.output_shape)
    assert off.data.ptr % 16 == 8
    op(xs, aligned)
    op(xs, off)
    got, want = cupy.asnumpy(op.output(off)), cupy.asnumpy(op.output(aligned))
    assert not np.isnan(got).any(), "the view was not written"
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))


def crossing_runs(variant, shape, t) -> int:
    """Blocks of the halo schedule whose contiguous run of tiles crosses from one (group,
    m-tile) to the next: where the filters are resident, such a block reloads them mid-run."""
    k = variant.kernel_shape(shape)
    ntiles = shape.B * -(-shape.Ho // t.rows)
    tiles = tiling.output_tiles(k, t)
    grid = variant.launch_grid(k, t)[0]
    runs = [(tiles * b // grid, tiles * (b + 1) // grid) for b in range(grid)]
    return sum((last - 1) // ntiles > first // ntiles for first, last in runs if last > first)


@pytest.mark.parametrize("variant", HALO_VARIANTS, ids=lambda v: v.name)
def test_resident_filters_reload_where_a_block_crosses_to_the_next_m_tile(variant, rng):
    """Five m-tiles (the last partial) and two groups: with the filters resident, a block whose
    run of tiles passes a (group, m-tile) boundary waits for every MMA thread to release the
    old filters, then copies the next ones; a slip there reads the wrong filters or hangs."""
    channels = 128 // tiling.element_bytes(variant.maths)
    for batch in range(5, 40):
        shape = ConvShape(batch, 2 * channels, 10, 10, 2 * 300, 3, pad=1, groups=2, bias=True)
        skip_off_its_gpu(variant, shape)
        k = variant.kernel_shape(shape)
        resident = [t for t in variant.ranked(shape) if t.schedule == "halo"
                    and t.stages == tiling.k_tiles(k, t) and t.warps_m == 4]
        t = resident[0]
        several = tiling.output_tiles(k, t) > 2 * variant.launch_grid(k, t)[0]
        if several and crossing_runs(variant, shape, t):
            break
    else:
        pytest.fail("no batch from 5 to 39 makes a block cross an m-tile boundary")
    check_tilings(variant, shape, [t], rng)


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_split_k_is_deterministic_and_rearms_its_counters(variant, rng):
    """Two runs give identical bits: the last block sums the partials in split order, and
    resets the tile counters for the next launch (else the second run would miscount)."""
    shape = ConvShape(2, 64, 9, 9, 32, 3, pad=1, bias=True)
    skip_off_its_gpu(variant, shape)
    config = next(c for c in variant.configs(shape, RELU) if c.split_k > 1)
    v = variant.configured(config)
    x, w, b = random_problem(shape, rng, signed=True)
    outputs = launched_twice(v.prepare(shape, w, RELU, b), x)
    assert np.array_equal(outputs[0], outputs[1])
    result = compare(outputs[1], reference_output(x, w, shape, RELU, b), v.precision)
    assert result.passed, result.reason


@pytest.mark.parametrize("layer", ["conv3", "conv4"])
@pytest.mark.parametrize("variant", FP32_CLASS, ids=lambda v: v.name)
def test_3xtf32_passes_the_fp32_rule_on_mixed_signs(variant, layer, rng):
    result = check(variant, ALEXNET[layer], rng, None, signed=True)
    assert result.passed, result.reason


@pytest.mark.parametrize("variant", FP32_CLASS, ids=lambda v: v.name)
def test_3xtf32_margin_on_same_sign_data_at_reduction_4608(variant, rng):
    """x, w >= 0 at n = 4,608: errors of one sign add up. The bound ratio is printed for the
    precision label; the assertion only separates arithmetic from a bug: one wrong or missing
    term is off by ~sum|x*w|/n, 1/(8 n^1.5 u) = 6.7x the fp32 bound here."""
    shape = ConvShape(2, 512, 6, 6, 64, 3, pad=1)
    assert shape.reduction == 4608
    skip_off_its_gpu(variant, shape)
    split = next(c for c in variant.configs(shape) if c.split_k > 1)
    unsplit = dataclasses.replace(split, split_k=1)  # one block sums all 4,608 terms
    for config in (unsplit, split):
        v = variant.configured(config)
        x = rng.random(shape.input_shape, dtype=np.float32)
        w = np.abs(rng.standard_normal(shape.weight_shape) / np.sqrt(4608)).astype(np.float32)
        result = compare(run(v, shape, x, w, None, None), reference_output(x, w, shape, None),
                         "fp32")
        print(f"{variant.name} same-sign n=4608 [{v.config_for(shape).brief()}]: bound ratio "
              f"{result.bound_ratio:.3g}, max rel {result.max_rel_error:.3g}, "
              f"{result.exceeded} elements over the fp32 bound")
        assert result.bound_ratio < 4.0, result.reason


SAME_SIGN_SHAPES = [ConvShape(2, 64, 6, 6, 64, 1), ConvShape(2, 64, 6, 6, 64, 2),
                    ConvShape(2, 32, 8, 8, 64, 3, pad=1), ConvShape(2, 48, 9, 9, 128, 5, pad=2),
                    ConvShape(2, 512, 6, 6, 64, 3, pad=1)]


@pytest.mark.parametrize("schedule", ["grid", "persistent"])
@pytest.mark.parametrize("variant", [get_variant(n) for n in ("wgmma-3xtf32",
                                                              "wgmma-split-bf16")],
                         ids=lambda v: v.name)
def test_wgmma_3xtf32_keeps_same_sign_error_a_fraction_of_the_bound(variant, schedule, rng):
    """x, w >= 0, where the tensor cores' truncating accumulation errs all one way, at n from
    64 to 4,608 (from 1,024 for the BF16 cross products): B's big part is truncated (by wgmma)
    and its residual rounded, the products summed apart a K-tile at a time (persistent) or a
    span of them (grid, part_ktiles). Measured on an H200 before the spans: at most 0.17 of
    the fp32 bound (n = 64). A dropped residual (TF32 arithmetic) passes 0.3 by far, and so
    does a partial sum carried through the whole reduction at the larger n (2.4x the bound
    modelled at n = 4,608). The schedule's first tiling, and for the grid the same split into
    up to four K-ranges."""
    skip_off_its_gpu(variant, SAME_SIGN_SHAPES[-1])
    for shape in SAME_SIGN_SHAPES:
        if variant.name == "wgmma-split-bf16" and shape.reduction < W.MIN_REDUCTION:
            continue
        ranked = [t for t in variant.ranked(shape) if t.schedule == schedule]
        tilings = ranked[:1]
        if schedule == "grid":
            k_tiles = tiling.k_tiles(variant.kernel_shape(shape), ranked[0])
            tilings.append(dataclasses.replace(ranked[0], split_k=min(4, k_tiles)))
        for t in tilings:
            x = rng.random(shape.input_shape, dtype=np.float32)
            w = np.abs(rng.standard_normal(shape.weight_shape)
                       / np.sqrt(shape.reduction)).astype(np.float32)
            got = run(variant.configured(t), shape, x, w, None, None)
            result = compare(got, reference_output(x, w, shape, None), "fp32")
            print(f"{variant.name} same-sign n={shape.reduction} [{t.brief()}]: bound ratio "
                  f"{result.bound_ratio:.3f}")
            assert result.bound_ratio < 0.3, f"n={shape.reduction} {t.brief()}: {result.reason}"


# Layers of at least 1,024 terms for the BF16 cross products: B's vectors of 2 channels (22
# a group) and of 4, the table and tap gathers, groups, strides, bias, tails.
SPLIT_SHAPES = [ConvShape(2, 22, 11, 11, 40, 7, pad=3, bias=True),
                ConvShape(3, 96, 9, 9, 72, 5, pad=2, groups=2),
                ConvShape(2, 128, 13, 11, 130, 3, stride=2, pad=1, bias=True),
                ConvShape(4, 48, 12, 12, 64, 5, pad=2)]


@pytest.mark.smoke
@pytest.mark.parametrize("shape", SPLIT_SHAPES, ids=lambda s: f"B{s.B}-{s.brief()}")
def test_the_bf16_cross_products_meet_the_fp32_bound(shape, rng):
    """wgmma-split-bf16 on each schedule's first tilings, a split-K one among them, against
    float64 on mixed-sign data: a cross term's layout wrong in A's packing or B's split (a
    swapped half, a swizzle phase) is off by ~2^-11 of a product, far over the bound."""
    variant = get_variant("wgmma-split-bf16")
    skip_off_its_gpu(variant, shape)
    ranked = variant.ranked(shape)
    tilings = ([t for t in ranked if t.schedule == "persistent"][:2]
               + [t for t in ranked if t.schedule == "grid" and t.split_k == 1][:2]
               + [t for t in ranked if t.split_k > 1][:1])
    check_tilings(variant, shape, tilings, rng)


@pytest.mark.parametrize("schedule", ["grid", "persistent"])
def test_the_bf16_cross_products_meet_the_fp32_bound_on_constant_data(schedule, rng):
    """Every product the same (a constant image under a constant filter), so the BF16
    roundings err all one way: their worst case, 0.55 of the bound at n = 1,024, is modelled
    in kernels.wgmma.Wgmma (Form.cross_bf16). Here at n = 1,024: the pair whose cross
    products err the most that a search over the bits found (2^-16.9 of the product), then
    four random pairs."""
    variant = get_variant("wgmma-split-bf16")
    shape = ConvShape(2, 256, 6, 6, 64, 2)
    assert shape.reduction == W.MIN_REDUCTION
    skip_off_its_gpu(variant, shape)
    t = next(t for t in variant.ranked(shape) if t.schedule == schedule)
    worst = 0.0
    pairs = [(np.uint32(0x3F809FEF).view(np.float32), np.uint32(0x3F808FF7).view(np.float32))]
    pairs += [(rng.random() + 0.5, rng.random() + 0.5) for _ in range(4)]
    for value, weight in pairs:
        x = np.full(shape.input_shape, value, dtype=np.float32)
        w = np.full(shape.weight_shape, weight / shape.reduction, dtype=np.float32)
        result = compare(run(variant.configured(t), shape, x, w, None, None),
                         reference_output(x, w, shape, None), "fp32")
        assert result.passed, result.reason
        worst = max(worst, result.bound_ratio)
    print(f"wgmma-split-bf16 constant data n={shape.reduction} [{t.brief()}]: bound ratio at "
          f"most {worst:.3f}")


def test_staging_converts_once_and_unstaged_input_is_refused(rng):
    import cupy

    shape = ConvShape(2, 8, 9, 9, 16, 3, pad=1)
    x, w, _ = random_problem(shape, rng, signed=True)
    x[0, 0, 0, :4] = [1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), 0.0]  # bf16 ties to even
    xd = cupy.asarray(x)
    fp16 = get_variant("pipelined-fp16").prepare(shape, w)
    staged = fp16.stage(xd)
    assert staged.dtype == np.float16 and np.array_equal(cupy.asnumpy(staged), x.astype(np.float16))
    bf16 = get_variant("pipelined-bf16").prepare(shape, w)
    staged = bf16.stage(xd)
    assert staged.dtype == np.uint16 and np.array_equal(cupy.asnumpy(staged), packing.to_bf16_bits(x))
    y = cupy.empty(shape.output_shape, dtype=cupy.float32)
    with pytest.raises(ConvlabError, match="op.stage"):
        fp16(xd, y)
    tf32 = get_variant("pipelined").prepare(shape, w)
    assert tf32.stage(xd) is xd


@pytest.mark.smoke
def test_channels_last_staging_transposes_pads_and_passes_staged_input_through(rng):
    """An NCHW float32 input becomes channels-last memory of the maths' type, each group's
    channels padded with zeros to whole vectors; an input that already is that is used as it
    is; an unstaged one is refused."""
    import cupy

    from convlab.shapes import channels_last, is_channels_last

    shape = ConvShape(2, 6, 5, 7, 8, 3, pad=1, groups=2)  # 3 channels per group -> 4
    x, w, _ = random_problem(shape, rng, signed=True)
    xd = cupy.asarray(x)
    fp16 = get_variant("channels-last-fp16").prepare(shape, w)
    staged = fp16.stage(xd)
    assert staged.dtype == np.float16 and staged.shape == (2, 8, 5, 7) and is_channels_last(staged)
    memory = cupy.asnumpy(staged.transpose(0, 2, 3, 1)).reshape(2, 5, 7, 2, 4)
    expected = x.transpose(0, 2, 3, 1).reshape(2, 5, 7, 2, 3).astype(np.float16)
    assert np.array_equal(memory[..., :3], expected) and (memory[..., 3] == 0).all()
    assert fp16.stage(staged) is staged
    nhwc = channels_last(cupy.ascontiguousarray(xd.transpose(0, 2, 3, 1)).reshape(x.shape))
    assert cupy.array_equal(fp16.stage(nhwc), staged)  # the same from channels-last float32
    y = cupy.empty(shape.output_shape, dtype=cupy.float32)
    with pytest.raises(ConvlabError, match="op.stage"):
        fp16(xd.astype(cupy.float16), y)
    even = ConvShape(2, 8, 5, 7, 8, 3, pad=1)
    tf32 = get_variant("channels-last").prepare(
        even, rng.standard_normal(even.weight_shape).astype(np.float32))
    nhwc = channels_last(cupy.ascontiguousarray(
        cupy.asarray(rng.standard_normal((2, 5, 7, 8), dtype=np.float32))).reshape(2, 8, 5, 7))
    assert tf32.stage(nhwc) is nhwc
    reused = tf32.stage(cupy.asarray(rng.standard_normal(even.input_shape, dtype=np.float32)),
                        reuse=True)
    again = tf32.stage(cupy.asarray(rng.standard_normal(even.input_shape, dtype=np.float32)),
                       reuse=True)
    assert again is reused  # a network's passes convert into one buffer: a graph replays it


@pytest.mark.smoke
@pytest.mark.parametrize("maths", ["tf32", "fp16"])
def test_staging_into_a_shared_buffer_writes_its_padding(maths, rng):
    """A network's arena hands a conv's staging a buffer other steps wrote before: converting a
    channels-last input (not the images' NCHW float32, whose kernel writes every channel), the
    staging zeroes the padding channels itself and writes into the buffer it was given."""
    import cupy

    from convlab.shapes import channels_last

    shape = ConvShape(2, 6, 5, 7, 8, 3, pad=1, groups=2)  # 3 channels a group -> 4
    x = rng.standard_normal(shape.input_shape).astype(np.float32)
    nhwc = channels_last(cupy.ascontiguousarray(cupy.asarray(x).transpose(0, 2, 3, 1))
                         .reshape(x.shape))
    dtype = staging.stage_dtype(maths)
    size = 2 * 8 * 5 * 7 * np.dtype(dtype).itemsize
    used = channels_last(cupy.full(size, 0xFF, dtype=np.uint8).view(dtype).reshape(2, 8, 5, 7))
    staged = staging.ChannelsLastStaging(shape, 4, maths)(nhwc, used)
    assert staged is used
    memory = cupy.asnumpy(staged.transpose(0, 2, 3, 1)).reshape(2, 5, 7, 2, 4)
    expected = x.transpose(0, 2, 3, 1).reshape(2, 5, 7, 2, 3).astype(dtype)
    assert np.array_equal(memory[..., :3], expected) and (memory[..., 3] == 0).all()


@pytest.mark.smoke
@pytest.mark.parametrize("maths", ["tf32", "fp16", "bf16"])
@pytest.mark.parametrize("shape", [ConvShape(3, 3, 13, 11, 8, 3), ConvShape(2, 64, 5, 3, 8, 1),
                                   ConvShape(2, 6, 4, 9, 8, 3, groups=2),
                                   ConvShape(1, 1, 7, 7, 4, 3), ConvShape(2, 40, 3, 5, 8, 1)],
                         ids=lambda s: s.brief())
def test_the_staging_kernel_writes_what_numpy_would(shape, maths, rng):
    """NCHW float32 images into the padded channels-last tensor by our kernel: every element the
    NumPy conversion of the same values (fp16 and bf16 rounded to nearest even, ties included),
    the padding zero though the buffer starts as NaN."""
    import cupy

    from convlab.shapes import channels_last

    x = rng.standard_normal(shape.input_shape).astype(np.float32)
    x.reshape(-1)[:4] = [1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -11, -(1 + 3 * 2 ** -11)]  # ties
    gc = tiling.padded_group_channels(shape.Cg, maths)
    dtype = staging.stage_dtype(maths)
    size = shape.B * shape.groups * gc * shape.H * shape.W
    nan = cupy.full(size * np.dtype(dtype).itemsize, 0xFF, dtype=np.uint8).view(dtype)  # all ones
    out = channels_last(nan.reshape(shape.B, shape.groups * gc, shape.H, shape.W))
    staged = staging.stage_channels_last(cupy.asarray(x), out, shape, gc, maths)
    assert staged is out
    values = {"fp16": lambda a: a.astype(np.float16), "bf16": packing.to_bf16_bits}.get(
        maths, lambda a: a)(x)
    expected = np.zeros((shape.B, shape.H, shape.W, shape.groups, gc), dtype=dtype)
    expected[..., :shape.Cg] = values.transpose(0, 2, 3, 1).reshape(
        shape.B, shape.H, shape.W, shape.groups, shape.Cg)
    memory = cupy.asnumpy(staged.transpose(0, 2, 3, 1)).reshape(expected.shape)
    assert np.array_equal(memory.view(np.uint8), expected.view(np.uint8))


@pytest.mark.parametrize("split", [False, True], ids=["one-split", "split-k"])
@pytest.mark.parametrize("variant", [pytest.param(v, marks=pytest.mark.smoke)
                                     if v.name == "channels-last-fp16" else v
                                     for v in VARIANTS], ids=IDS)
def test_an_fp16_output_is_the_float32_output_rounded(variant, split, rng):
    """`writing(float16)` stores what the float32 epilogue computes (bias, ReLU), rounded to
    nearest even: the bits the next fp16 conv's conversion would have made of it
    (assert_rounded_to_fp16)."""
    import cupy

    shape = ConvShape(2, 64, 9, 9, 32, 3, pad=1, bias=True)
    skip_off_its_gpu(variant, shape)
    config = next(c for c in variant.configs(shape, RELU) if c.split_k > 1)
    single = variant.configured(config if split else dataclasses.replace(config, split_k=1))
    half = single.writing(np.float16)
    x, w, b = random_problem(shape, rng, signed=True)
    outputs = []
    for v in (single, half):
        op = v.prepare(shape, w, RELU, b)
        assert op.output_dtype == v.output_dtype
        outputs.append(cupy.asnumpy(op.run_once(x, cupy)))
    assert_rounded_to_fp16(outputs[1], outputs[0], rounds_tf32(single, shape))
    result = compare(outputs[1], reference_output(x, w, shape, RELU, b), variant.precision)
    assert result.passed, result.reason


def pingpong_tilings(variant, shape):
    """The cost model's first pingpong tiling (igemm.wgmma.Pingpong) of each gather at each
    count of blocks per SM, with and without registers moved to the MMA warps."""
    chosen = {}
    k = variant.kernel_shape(shape)
    for t in variant.ranked(shape):
        if t.schedule == "pingpong":
            moved = wgmma.register_split(k, t, variant.maths)[0] > 0
            chosen.setdefault((t.gather, wgmma.blocks_per_sm(t, variant.maths), moved), t)
    return list(chosen.values())


@pytest.mark.parametrize("shape", GENERAL + list(ALEXNET.values()) + MANY_TILES,
                         ids=lambda s: f"B{s.B}-{s.brief()}")
@pytest.mark.parametrize("variant", WGMMA, ids=lambda v: v.name)
def test_the_pingpong_schedule(variant, shape, rng):
    """Two MMA warpgroups on tiles of their own, in turn: a block with one unit (one warpgroup
    idle), with several, odd and even counts; channel and pixel tails, groups."""
    tilings = pingpong_tilings(variant, shape)
    assert tilings
    check_tilings(variant, shape, tilings, rng)


@pytest.mark.smoke
@pytest.mark.parametrize("variant", WGMMA, ids=lambda v: v.name)
def test_the_pingpong_schedule_writes_fp16_and_runs_again(variant, rng):
    """Each warpgroup's register store (fp16's 16-byte path included) reads its own rows, and
    the stages' barriers, each released by one warpgroup, start each launch afresh."""
    shape = MANY_TILES[1]
    skip_off_its_gpu(variant, shape)
    tilings = pingpong_tilings(variant, shape)
    assert tilings
    x, w, b = random_problem(shape, rng, signed=True)
    for t in tilings:
        check_relaunch_and_fp16(variant, t, shape, x, w, b)


# The last FC layer of a 1,000-class network as a 1x1 conv (no whole m-tile at bm 64 or 128),
# and a grouped layer of several m-tiles a group, the last a part: the packs' trimmed m-tiles.
TRIMMED = [ConvShape(4, 256, 1, 1, 1000, 1, bias=True),
           ConvShape(3, 32, 9, 9, 200, 3, pad=1, groups=2, bias=True)]


@pytest.mark.smoke
@pytest.mark.parametrize("shape", TRIMMED, ids=lambda s: f"B{s.B}-{s.brief()}")
@pytest.mark.parametrize("variant", [get_variant(n) for n in ("wgmma", "wgmma-fp16",
                                                               "wgmma-bf16")],
                         ids=lambda v: v.name)
def test_an_op_holds_its_trimmed_filters_and_bias_and_nothing_else(variant, shape, rng):
    """Each schedule's first tiling reads a group's trimmed last m-tile right (its rows past
    the channels are another tile's, in no stored output), and the prepared op holds only the
    packed filters and the bias: no padded rows, no placeholder arrays (CuPy's pool rounds
    each array to 512 bytes, so placeholders would add 512 each)."""
    import cupy

    skip_off_its_gpu(variant, shape)
    k = variant.kernel_shape(shape)
    firsts = {}
    for t in variant.ranked(shape):
        firsts.setdefault((t.schedule, t.gather), t)
    x, w, b = random_problem(shape, rng, signed=True)
    pool = cupy.get_default_memory_pool()
    failures = []
    for t in firsts.values():
        single = variant.configured(t)
        rows = packing.last_tile_rows(k, t, 1)
        assert rows < t.bm, t.brief()  # the premise: a trimmed last m-tile
        cupy.cuda.Device().synchronize()
        before = pool.used_bytes()
        op = single.prepare(shape, w, RELU, b)
        held = pool.used_bytes() - before
        packed = single.packed_weights(w, k, t).nbytes
        table = single.gather_table(k, t).nbytes if t.gather == "table" else 0
        tiles = tiling.output_tiles(k, t)
        split = (tiles * t.split_k * t.bm * t.bn + tiles) * 4 if t.split_k > 1 else 0
        arrays = 2 + bool(table) + 2 * bool(split)  # each rounded up to 512 bytes
        assert 0 <= held - packed - b.nbytes - table - split < 512 * arrays, t.brief()
        assert packed < k.groups * tiling.m_tiles(k, t) * t.bm * tiling.k_tiles(k, t) * t.bk \
            * np.dtype(single.input_dtype()).itemsize, t.brief()
        y = cupy.empty(op.output_shape, dtype=np.float32)
        poison(y)
        op(op.stage(cupy.asarray(x)), y)
        result = compare(cupy.asnumpy(op.output(y)), reference_output(x, w, shape, RELU, b),
                         single.precision)
        if not result.passed:
            failures.append(f"{t.brief()}: {result.reason}")
        del op
    assert not failures, "\n".join(failures)
