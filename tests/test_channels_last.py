"""The channels-last implicit GEMM without a GPU: its kernels compile for sm_90, its tiling
rules and cost model, and a NumPy model of its gather (the kernel's thread -> vector map, the
table, the padding) whose product with the packed filters is the convolution."""


import numpy as np
import pytest

from convlab.gpu.jit import build_options, compile_cubin
from convlab.kernels import RELU, get_variant
from convlab.kernels.base import StagedBuffer
from convlab.kernels.igemm import gather_nhwc, packing, staging, tiling
from convlab.models import Conv, get_model
from convlab.net.network import flattened_columns, half_next
from convlab.oracle.reference import conv2d_with_magnitude
from convlab.shapes import (NCHW, NHWC, ConvShape, channels_last, dense_in, is_channels_last,
                            memory_view)

VARIANTS = [get_variant(n) for n in ("channels-last", "channels-last-3xtf32",
                                     "channels-last-fp16", "channels-last-bf16")]
LAYERS = {**get_model("alexnet").conv_shapes(128),
          "resnet": ConvShape(64, 64, 56, 56, 64, 3, pad=1),
          "fc6": ConvShape(128, 9216, 1, 1, 4096, 1, bias=True)}  # an FC layer as a 1x1 conv
ODD_SHAPES = [
    ConvShape(3, 5, 17, 13, 7, 3, stride=2, pad=3),
    ConvShape(1, 8, 9, 11, 12, 5, pad=2, groups=4, bias=True),
    ConvShape(9, 1, 28, 28, 50, 5),
    ConvShape(2, 6, 10, 8, 10, 1, groups=2, bias=True),
    ConvShape(4, 12, 23, 19, 20, 7, stride=4, pad=1, groups=2),
    ConvShape(1, 32, 8, 8, 32, 3, pad=1, groups=32),  # depthwise
    ConvShape(2, 3, 30, 30, 16, 7, stride=2, pad=3),  # a 7x7 stem
]


@pytest.mark.slow
@pytest.mark.parametrize("layer", list(LAYERS))
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_configs_compile_for_sm90(variant, layer, compile_all):
    """The heuristic's tiling and two more for each layer (bf16: the heuristic's only)."""
    shape = LAYERS[layer]
    configs = variant.configs(shape, RELU)
    assert configs, f"no tiling for {layer}"
    configs = configs[:1] if variant.name == "channels-last-bf16" else configs[:3]
    cubins = compile_all([(variant.configured(c), shape, RELU) for c in configs])
    assert all(c[:4] == b"\x7fELF" for c in cubins)


@pytest.mark.slow
@pytest.mark.parametrize("shape", ODD_SHAPES, ids=lambda s: f"B{s.B}-{s.brief()}")
def test_odd_shapes_compile_for_sm90(shape, compile_all):
    cubins = compile_all([(v, shape, e) for v in VARIANTS for e in (None, RELU)])
    assert all(c[:4] == b"\x7fELF" for c in cubins)


@pytest.mark.parametrize("layer", list(LAYERS))
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_configs_are_valid_and_the_heuristic_is_the_first(variant, layer):
    shape = LAYERS[layer]
    kernel_shape = variant.kernel_shape(shape)
    configs = variant.configs(shape, RELU)
    assert 1 <= len(configs) <= tiling.MAX_CONFIGS and len(set(configs)) == len(configs)
    for t in configs:
        assert tiling.tiling_problem(t, variant.maths, NHWC) == ""
        assert tiling.shape_problem(kernel_shape, t, NHWC, variant.maths) == ""
        assert tiling.smem_bytes(t, variant.maths, NHWC) <= tiling.MAX_SMEM
        assert variant.configured(t).supports(shape)
    assert variant.config_for(shape) == configs[0]


@pytest.mark.slow
@pytest.mark.parametrize("shape", [LAYERS["conv3"], ODD_SHAPES[0], ODD_SHAPES[1]],
                         ids=lambda s: s.brief())
def test_fp16_outputs_compile_for_sm90(shape, compile_all):
    """Every variant of the implicit GEMM can store fp16 for an fp16 conv after it (split-K
    included: the odd grouped shape's tiling splits K)."""
    jobs = [(v.writing(np.float16), shape, e) for v in VARIANTS + [get_variant("pipelined-fp16")]
            for e in (None, RELU)]
    assert all(dict(v.defines(sh, e))["OUT_HALF"] == 1 for v, sh, e in jobs)
    assert all(c[:4] == b"\x7fELF" for c in compile_all(jobs))


def test_writing_keeps_the_tiling_and_refuses_other_types():
    t = tiling.Tiling(64, 64, 32, 2, 2, 3, 1, "tap")
    variant = get_variant("channels-last-fp16").configured(t)
    half = variant.writing(np.float16)
    assert half.output_dtype == np.float16 and half.tiling == t and half.name == variant.name
    assert half.writing(np.float32).output_dtype == np.float32
    assert half.configured(t).output_dtype == np.float16
    assert variant.writing(np.float32) is variant
    with pytest.raises(ValueError, match="not float64"):
        variant.writing(np.float64)


def test_a_single_fp16_layer_writes_fp16_as_cudnns_fp16_rows_do():
    """A layer timed alone (`compare --layer`) stores what cuDNN's fp16 rows store: fp16, half
    the output bytes of float32. Other precisions, and cuDNN's own rows, are left as they are."""
    from convlab.bench.lab import layer_variant
    from convlab.kernels import VARIANTS

    for name in ("channels-last-fp16", "wgmma-fp16", "pipelined-fp16"):
        assert layer_variant(VARIANTS[name]).output_dtype == np.float16
    for name in ("wgmma", "wgmma-bf16", "channels-last-3xtf32", "cudnn-nhwc-fp16", "tiled"):
        assert layer_variant(VARIANTS[name]) is VARIANTS[name]


def test_16_bit_activations_run_from_an_op_to_the_16_bit_conv_after_it():
    """In alexnet, an activation is written as fp16 where the next conv (or FC layer the
    variant runs) reads fp16 channels-last and only max-pools, ReLUs or a flatten stand
    between: before pool1/pool2 (the LRN + pool steps write it), after conv3 and conv4 (their
    ReLUs fused), and with the FC layers run by the variant after conv5, pool5, fc6 and fc7;
    never before an LRN or the softmax, for our own FC kernels, a tf32 conv, or in NCHW. A bf16
    conv reads bf16 bits in the same places."""
    layers = get_model("alexnet").layers

    def half_at(variant, layout=NHWC, dense=True, dtype=np.float16):
        def variant_for(layer):
            return variant if dense or isinstance(layer, Conv) else None

        return [j for j in range(1, len(layers) + 1)
                if half_next(layers, j, layout, variant_for) == dtype]

    index = {getattr(layer, "name", None): j for j, layer in enumerate(layers)}
    assert half_at(get_variant("channels-last-fp16"), dense=False) == [3, 4, 7, 8, 9, 10, 11, 12]
    with_dense = half_at(get_variant("channels-last-fp16"))
    assert with_dense == [3, 4, 7, 8, 9, 10, 11, 12] + list(range(13, index["fc8"] + 1))
    assert index["conv1"] + 2 not in with_dense  # conv1's output meets norm1
    assert index["fc8"] + 1 not in with_dense  # fc8's output meets the softmax
    assert half_at(get_variant("channels-last-bf16"), dtype=np.uint16) == with_dense
    assert half_at(get_variant("channels-last-bf16")) == []
    for name in ("channels-last", "pipelined-fp16", "pipelined-bf16"):
        assert not any(half_next(layers, j, NHWC, lambda layer: get_variant(name))
                       for j in range(len(layers) + 1)), name
    assert half_at(get_variant("channels-last-fp16"), layout=NCHW) == []


def test_channels_last_variants_run_fc_layers_as_1x1_convolutions():
    fc6 = ConvShape(128, 9216, 1, 1, 4096, 1, bias=True)
    for variant in VARIANTS:
        assert variant.runs_dense and variant.supports(fc6)
    assert not get_variant("pipelined-fp16").runs_dense


def test_half_maths_pipeline_deeper_than_two_stages_over_nhwc():
    """16-byte copies let fp16 B skip the registers: more than 2 stages are valid, and the
    NCHW rule that forbids them still holds for pipelined-fp16."""
    t = tiling.Tiling(128, 128, 32, 2, 4, 4, 1, "tap")
    assert tiling.tiling_problem(t, "fp16", NHWC) == ""
    assert "stages must be 2" in tiling.tiling_problem(t, "fp16")
    with pytest.raises(ValueError, match="stages must be 2 to 6"):
        get_variant("channels-last-fp16").configured({**t.as_dict(), "stages": 7})


@pytest.mark.parametrize("cg,maths,padded,vec", [
    (3, "tf32", 4, 4), (3, "fp16", 4, 4), (256, "fp16", 256, 8), (48, "tf32", 48, 4),
    (6, "tf32", 6, 2), (12, "fp16", 12, 4), (1, "bf16", 4, 4), (5, "3xtf32", 6, 2)])
def test_channels_pad_to_whole_vectors(cg, maths, padded, vec):
    assert tiling.padded_group_channels(cg, maths) == padded
    assert tiling.channel_vector(padded, maths) == vec


@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (2, 1, 5, 7), (2, 6, 1, 1), (1, 4, 1, 9)])
def test_dense_in_finds_what_the_arrays_flags_do(shape):
    """Whether a dense array of one memory format is also dense in the other, without the
    array: as numpy finds it on the array itself (C or H*W of 1 makes the two orders one)."""
    nchw = np.zeros(shape, np.float32)
    nhwc = channels_last(np.zeros(shape, np.float32))
    for a, layout in ((nchw, NCHW), (nhwc, NHWC)):
        assert dense_in(NHWC, shape, layout) == is_channels_last(a), layout
        assert dense_in(NCHW, shape, layout) == a.flags.c_contiguous, layout


def test_a_staging_names_the_buffer_it_writes_before_any_input_exists():
    """ChannelsLastStaging and NchwStaging say what they write for an input of a type, shape and
    memory format (a network places it in its arena): the padded channels-last tensor of the
    maths' type, the NCHW one, or nothing where the kernel reads the input as it is."""
    shape = ConvShape(2, 6, 5, 7, 8, 3, pad=1, groups=2)  # 3 channels a group -> 4
    tf32 = staging.ChannelsLastStaging(shape, 4, "tf32")
    want = StagedBuffer((2, 8, 5, 7), np.dtype(np.float32), NHWC)
    assert tf32.buffer(np.float32, (2, 6, 5, 7), NCHW) == want
    assert tf32.buffer(np.float32, (2, 6, 5, 7), NHWC) == want  # padded all the same
    assert tf32.buffer(np.float32, (2, 8, 5, 7), NHWC) is None
    assert tf32.buffer(np.float32, (2, 8, 5, 7), NCHW) == want
    assert tf32.buffer(np.float32, (2, 8, 1, 1), NCHW) is None  # an FC input: both orders
    fp16 = staging.ChannelsLastStaging(ConvShape(2, 8, 5, 7, 8, 3), 8, "fp16")
    assert fp16.buffer(np.float16, (2, 8, 5, 7), NHWC) is None
    assert fp16.buffer(np.float32, (2, 8, 5, 7), NHWC) == StagedBuffer(
        (2, 8, 5, 7), np.dtype(np.float16), NHWC)
    assert staging.ChannelsLastStaging(shape, 4, "bf16").buffer(
        np.float32, (2, 6, 5, 7), NCHW).dtype == np.uint16
    nchw = staging.NchwStaging("fp16")
    assert nchw.buffer(np.float16, (2, 6, 5, 7), NCHW) is None
    assert nchw.buffer(np.float32, (2, 6, 5, 7), NCHW) == StagedBuffer(
        (2, 6, 5, 7), np.dtype(np.float16), NCHW)
    assert nchw.buffer(np.float16, (2, 6, 5, 7), NHWC) == StagedBuffer(
        (2, 6, 5, 7), np.dtype(np.float16), NCHW)
    raw = np.zeros(want.nbytes, np.uint8)
    view = want.view(raw)
    assert view.shape == (2, 8, 5, 7) and is_channels_last(view) and np.shares_memory(view, raw)
    view[1, 2, 3, 4] = 1.5
    assert raw.view(np.float32).reshape(2, 5, 7, 8)[1, 3, 4, 2] == 1.5


@pytest.mark.parametrize("maths", ["tf32", "3xtf32", "fp16", "bf16"])
def test_the_input_staging_kernel_compiles_for_sm90(maths):
    for c, groups in ((3, 1), (6, 2), (64, 1), (1, 1)):
        gc = tiling.padded_group_channels(c // groups, maths)
        options = staging.defines(c, groups, gc, 227 * 227, tiling.channel_vector(gc, maths), maths)
        assert compile_cubin("stage-nhwc", staging.SOURCE, build_options(options))


def test_conv1_runs_on_four_padded_channels():
    variant = get_variant("channels-last-fp16")
    conv1 = LAYERS["conv1"]
    assert variant.kernel_shape(conv1).C == 4
    assert variant.defines(conv1)["C"] == 4 and variant.defines(conv1)["VEC"] == 4
    assert get_variant("channels-last").kernel_shape(LAYERS["conv3"]) == LAYERS["conv3"]


# --- the gather, modelled in NumPy ------------------------------------------------------------

def gathered_rows(x_nhwc: np.ndarray, shape: ConvShape, t: tiling.Tiling, maths: str, g: int):
    """B^T [pixels][KT*bk] for group g as the kernel's threads copy it: thread tid copies
    vector kc = tid % KCHUNKS of rows tid // KCHUNKS + i*ROW_STEP, from offset off + shift
    (off holds the vector's channels in tap order, the table's shift in table order), or zeros where the tap, the channel or k is out of range. Every element is written once."""
    vec = tiling.channel_vector(shape.Cg, maths)
    chunks = t.bk // vec
    step = t.threads // chunks
    rows = tiling.vector_rows(t, vec)
    assert rows >= 1
    H, W, C, K, kk = shape.H, shape.W, shape.C, shape.K, shape.K * shape.K
    npix = shape.B * shape.Ho * shape.Wo
    ntiles = -(-npix // t.bn)
    kt_count = tiling.k_tiles(shape, t)
    flat = x_nhwc.reshape(-1)
    out = np.full((ntiles * t.bn, kt_count * t.bk), np.nan)
    table = gather_nhwc.gather_table(shape, t, vec) if t.gather == "table" else None
    for ntile in range(ntiles):
        for tid in range(t.threads):
            kc, row0 = tid % chunks, tid // chunks
            for i in range(rows):
                n = ntile * t.bn + row0 + i * step
                if n < npix:
                    b, r = divmod(n, shape.Ho * shape.Wo)
                    ho, wo = divmod(r, shape.Wo)
                    ih0, iw0 = ho * shape.stride - shape.pad, wo * shape.stride - shape.pad
                    off = ((b * H + ih0) * W + iw0) * C + g * shape.Cg
                    off += kc * vec if t.gather == "tap" else 0
                else:
                    ih0, iw0, off = -(1 << 29), 0, 0
                for kt in range(kt_count):
                    if t.gather == "tap":
                        cc, tap = divmod(kt, kk)
                        p, q = divmod(tap, K)
                        shift = (p * W + q) * C + cc * t.bk
                        used = cc * t.bk + kc * vec < shape.Cg
                    else:
                        shift, p, q, used = table[kt * chunks + kc]
                    ok = used and 0 <= ih0 + p < H and 0 <= iw0 + q < W
                    k0 = kt * t.bk + kc * vec
                    assert np.isnan(out[n, k0:k0 + vec]).all()
                    out[n, k0:k0 + vec] = flat[off + shift:off + shift + vec] if ok else 0.0
    assert not np.isnan(out).any()
    return out[:npix]


GATHER_CASES = [
    (ConvShape(2, 6, 9, 7, 20, 3, pad=1, groups=2, bias=True), "tf32",
     tiling.Tiling(32, 32, 16, 2, 2, 3, 1, "table")),
    (ConvShape(1, 3, 23, 23, 40, 11, stride=4), "fp16", tiling.Tiling(64, 32, 32, 2, 2, 3, 1, "table")),
    (ConvShape(1, 40, 5, 5, 48, 3, pad=1, groups=2), "tf32", tiling.Tiling(96, 64, 16, 2, 2, 2, 1, "tap")),
    (ConvShape(2, 48, 6, 5, 16, 3, pad=2, stride=2), "fp16", tiling.Tiling(32, 64, 32, 1, 4, 4, 1, "tap")),
    (ConvShape(1, 8, 4, 4, 8, 3, pad=1, groups=8), "3xtf32", tiling.Tiling(32, 32, 8, 1, 4, 2, 1, "table")),
]


@pytest.mark.parametrize("shape,maths,t", GATHER_CASES, ids=lambda c: getattr(c, "brief", lambda: str(c))())
def test_gathered_gemm_equals_the_convolution(shape, maths, t, rng):
    """The packed filters' A times the gathered B is the convolution (float64, so only the
    summation order differs), with C padded the way the staging pads it."""
    x = rng.standard_normal(shape.input_shape)
    w = rng.standard_normal(shape.weight_shape).astype(np.float32)
    ref, magnitude = conv2d_with_magnitude(x, w, shape.stride, shape.pad, shape.groups)
    cg = tiling.padded_group_channels(shape.Cg, maths)
    k = ConvShape(shape.B, cg * shape.groups, shape.H, shape.W, shape.M, shape.K, shape.stride,
                  shape.pad, shape.groups, shape.bias)
    padded = np.zeros((shape.B, shape.groups, cg, shape.H, shape.W))
    padded[:, :, :shape.Cg] = x.reshape(shape.B, shape.groups, shape.Cg, shape.H, shape.W)
    x_nhwc = padded.reshape(shape.B, k.C, shape.H, shape.W).transpose(0, 2, 3, 1).copy()
    a = packing.gemm_weights(w, k, t, NHWC).astype(np.float64)
    y = np.empty_like(ref)
    for g in range(shape.groups):
        out = a[g, :shape.Mg] @ gathered_rows(x_nhwc, k, t, maths, g).T
        y[:, g * shape.Mg:(g + 1) * shape.Mg] = (
            out.reshape(shape.Mg, shape.B, shape.Ho, shape.Wo).transpose(1, 0, 2, 3))
    assert (np.abs(y - ref) <= 1e-12 * magnitude + 1e-300).all()


def test_gather_table_marks_vectors_past_the_reduction():
    shape = ConvShape(1, 4, 6, 6, 8, 3)
    t = tiling.Tiling(32, 32, 16, 1, 4, 2, 1, "table")
    table = gather_nhwc.gather_table(shape, t, 4)
    assert table.shape == (tiling.k_tiles(shape, t) * t.bk // 4, 4)
    assert (table[:9, 3] == 1).all() and (table[9:, 3] == 0).all()
    assert (table[9:, 1] == tiling.INVALID_TAP).all()
    assert table[4].tolist() == [(1 * 6 + 1) * 4, 1, 1, 1]  # tap 4 = (1, 1), channel 0


# --- memory formats --------------------------------------------------------------------------

def test_channels_last_views_keep_the_logical_shape(rng):
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    buffer = np.ascontiguousarray(x.transpose(0, 2, 3, 1)).reshape(x.shape)
    view = channels_last(buffer)
    assert view.shape == x.shape and np.array_equal(view, x)
    assert is_channels_last(view) and not is_channels_last(x)
    assert memory_view(view, NHWC).flags.c_contiguous


def test_fc_columns_permute_to_a_channels_last_flatten(rng):
    a = rng.standard_normal((3, 4, 5, 6))
    w = rng.standard_normal((7, 4 * 5 * 6))
    nchw = a.reshape(3, -1) @ w.T
    nhwc = a.transpose(0, 2, 3, 1).reshape(3, -1) @ flattened_columns(w, a.shape).T
    assert np.allclose(nchw, nhwc, rtol=1e-12, atol=1e-12)
