"""ResNet-50 and VGG-16 on the GPU: the new layer kernels (a padded max-pool, the global average
pool, the residual add) against float64 in both layouts and element types, and the whole
networks with every variant that runs their convs, every layer and step verified, top-1
against the unfolded float64 forward; PyTorch's candidates (batch norm in eval mode) agree."""

import numpy as np
import pytest

from convlab.bench import lab
from convlab.gpu import timer
from convlab.kernels import VARIANTS
from convlab.models import MODELS
from convlab.ops import (prepare_add, prepare_global_avg_pool, prepare_max_pool,
                         reference_add, reference_global_avg_pool, reference_max_pool)
from convlab.gpu.elements import BFLOAT16, values
from convlab.kernels.igemm.packing import to_bf16_bits
from convlab.oracle.verify import compare, poison
from convlab.shapes import NHWC, ConvShape, channels_last

pytestmark = pytest.mark.gpu
F16 = np.float16
BF16 = BFLOAT16  # bf16 bits


def _device(x, layout):
    """x (logical NCHW) on the device, its memory in `layout`."""
    import cupy

    d = cupy.asarray(x)
    if layout != NHWC:
        return d
    return channels_last(cupy.ascontiguousarray(d.transpose(0, 2, 3, 1)).reshape(d.shape))


def _empty(shape, dtype, layout):
    import cupy

    a = cupy.empty(shape, dtype)
    return channels_last(a) if layout == NHWC and len(shape) == 4 else a


def _host(y):
    """y on the host, contiguous, in the type it was stored in (compare reads bf16 bits)."""
    import cupy

    return cupy.asnumpy(cupy.ascontiguousarray(y))


def _typed(a, dtype):
    """Float values as `dtype`: bf16 bits rounded to nearest even, any other type by astype."""
    return to_bf16_bits(a) if np.dtype(dtype) == BF16 else a.astype(dtype)


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("shape,size,stride,pad", [((2, 64, 112, 112), 3, 2, 1),
                                                   ((3, 5, 9, 8), 3, 2, 1), ((1, 3, 7, 7), 2, 2, 1)])
def test_padded_max_pool_matches_float64(rng, layout, shape, size, stride, pad):
    x = rng.standard_normal(shape).astype(np.float32)
    op = prepare_max_pool(shape, size, stride, "relu", layout, pad=pad)
    y = _empty(op.output_shape, np.float32, layout)
    poison(y)
    op(_device(x, layout), y)
    check = compare(_host(y).astype(np.float32), reference_max_pool(x, size, stride, "relu", pad),
                    "fp32")
    assert check.passed, check.reason


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("in_dtype,out_dtype", [(np.float32, np.float32), (F16, np.float32),
                                                (np.float32, F16), (BF16, np.float32),
                                                (np.float32, BF16)])
def test_global_avg_pool_matches_float64(rng, layout, in_dtype, out_dtype):
    shape = (4, 2048, 7, 7)
    x = _typed(rng.standard_normal(shape), in_dtype)
    op = prepare_global_avg_pool(shape, layout, in_dtype, out_dtype)
    import cupy

    y = cupy.empty(op.output_shape, out_dtype)
    poison(y)
    op(_device(x, layout), y)
    check = compare(cupy.asnumpy(y), reference_global_avg_pool(x), "fp32")
    assert check.passed, check.reason


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("in_dtype,kept_dtype,out_dtype", [
    (np.float32, np.float32, np.float32), (np.float32, F16, F16), (F16, F16, F16),
    (np.float32, F16, np.float32), (BF16, BF16, BF16), (np.float32, BF16, np.float32)])
def test_residual_add_matches_float64(rng, layout, in_dtype, kept_dtype, out_dtype):
    shape = (2, 256, 14, 13)
    x = _typed(rng.standard_normal(shape), in_dtype)
    kept = _typed(rng.standard_normal(shape), kept_dtype)
    op = prepare_add(shape, "relu", layout, in_dtype, kept_dtype, out_dtype)
    y = _empty(shape, out_dtype, layout)
    poison(y)
    op.kept = _device(kept, layout)
    op(_device(x, layout), y)
    got = _host(y).astype(out_dtype)
    check = compare(got, reference_add(x, kept, "relu"),
                    "fp32")
    assert check.passed, check.reason


def _add_relu_variants():
    """(variant, shape) for each store of the add-relu epilogue: the persistent schedule's
    16-byte paths (fp16 output; float32 output of tf32, bf16 and fp16 maths, float32 and fp16
    kept), in both warp-specialised schedules (persistent, pingpong), 3xTF32's element stores
    (its filters packed twice, and held once as a network's small batches take them), the grid
    schedule's staged store; on output channels and pixels that end mid-tile, and for float32
    output, channels off 16 bytes (element stores)."""
    from convlab.kernels import ADD_RELU

    variants = {**VARIANTS, "filters-once": VARIANTS["wgmma-3xtf32"].holding_filters_once()}
    cases = []
    for name, out, kept in (("wgmma-fp16", F16, F16), ("wgmma-fp16", F16, np.float32),
                            ("wgmma", np.float32, np.float32), ("wgmma", np.float32, F16),
                            ("wgmma-fp16", np.float32, F16), ("wgmma-bf16", np.float32, np.float32),
                            ("wgmma-bf16", BF16, BF16), ("wgmma-bf16", np.float32, BF16),
                            ("wgmma-3xtf32", np.float32, np.float32),
                            ("filters-once", np.float32, np.float32),
                            ("channels-last-fp16", F16, F16)):
        odd = (ConvShape(2, 32, 9, 10, 66, 1, bias=True),) if out == np.float32 else ()
        for shape in (ConvShape(3, 64, 13, 11, 200, 1, bias=True),
                      ConvShape(2, 64, 12, 20, 72, 3, pad=1, bias=True), *odd):
            v = variants[name].writing(out).adding(kept)
            tilings = {t.schedule: t for t in reversed(v.configs(shape, ADD_RELU))}
            tilings.update({t.schedule: t for t in reversed(v.ranked(shape))
                            if t.schedule == "pingpong"})
            cases += [(v.configured(t), shape) for t in tilings.values()]
    return cases


ADD_RELU_CASES = _add_relu_variants()


@pytest.mark.parametrize("variant,shape", ADD_RELU_CASES,
                         ids=[f"{v.name}{'-filters-once' if v.filters_once else ''}-"
                              f"{v.tiling.schedule}-out{v.output_dtype.itemsize * 8}-"
                              f"kept{v.kept_dtype.itemsize * 8}-{s.brief()}"
                              for v, s in ADD_RELU_CASES])
def test_conv_add_relu_epilogue_matches_float64(rng, variant, shape):
    """A residual block's last conv with the block's add and ReLU in its stores: the kept
    activation added before the ReLU, in every schedule's store."""
    import cupy

    from convlab.kernels import ADD_RELU
    from convlab.oracle.verify import random_problem, reference_output

    x, w, b = random_problem(shape, rng, signed=True)
    kept = _typed(rng.standard_normal(shape.output_shape), variant.kept_dtype)
    op = variant.prepare(shape, w, ADD_RELU, b)
    op.kept = _device(kept, NHWC)
    got = _host(op.run_once(x, cupy))
    assert got.dtype == variant.output_dtype
    ref = reference_output(x, w, shape, ADD_RELU, b, values(kept).astype(np.float64))
    check = compare(got, ref, variant.precision)
    assert check.passed, check.reason
    # the add is there: the output is far nearer the reference with it than without (bf16's
    # bound at 576 terms is wider than the kept activation, so the bound cannot tell)
    without = reference_output(x, w, shape, "relu", b)
    y = values(got).astype(np.float64)
    assert np.abs(y - ref.values).mean() < np.abs(y - without.values).mean() / 4
    if variant.maths == "tf32":  # the next tf32 conv reads it exact
        assert not (got.view(np.uint32) & TF32_DROPPED).any()


TF32_DROPPED = (1 << 13) - 1  # the float32 bits a TF32 operand does not hold


@pytest.mark.parametrize("name,kept_dtype", [("wgmma", np.float32), ("wgmma-fp16", F16)])
def test_a_float32_add_relu_with_a_kept_view_off_16_bytes_stores_elements(rng, name, kept_dtype):
    """A kept activation that does not start on 16 bytes (a caller's view) sends the float32
    store to its element fallback, which adds each kept element as it stores it."""
    import cupy

    from convlab.kernels import ADD_RELU
    from convlab.oracle.verify import random_problem, reference_output

    shape = ConvShape(3, 64, 13, 11, 200, 1, bias=True)
    variant = VARIANTS[name].adding(kept_dtype)
    tiling = next(t for t in variant.configs(shape, ADD_RELU) if t.schedule == "persistent")
    x, w, b = random_problem(shape, rng, signed=True)
    kept = rng.standard_normal(shape.output_shape).astype(kept_dtype)
    nhwc = cupy.asarray(np.ascontiguousarray(kept.transpose(0, 2, 3, 1)))
    memory = cupy.empty(nhwc.size + 1, kept_dtype)
    view = memory[1:].reshape(nhwc.shape)
    view[...] = nhwc
    assert view.data.ptr % 16
    op = variant.configured(tiling).prepare(shape, w, ADD_RELU, b)
    op.kept = channels_last(view.reshape(kept.shape))
    got = _host(op.run_once(x, cupy)).astype(np.float32)
    ref = reference_output(x, w, shape, ADD_RELU, b, kept.astype(np.float64))
    check = compare(got, ref, variant.precision)
    assert check.passed, check.reason


@pytest.mark.parametrize("schedule", ["grid", "persistent", "halo"])
def test_a_tf32_conv_writes_its_output_rounded_to_tf32(rng, schedule):
    """wgmma in tf32 rounds what it stores to TF32 (to nearest): the next conv's wgmma then
    reads its operand exact instead of dropping the low bits, and the output still passes its
    check."""
    import cupy

    from convlab.kernels import RELU
    from convlab.oracle.verify import random_problem, reference_output

    shape = ConvShape(2, 64, 12, 20, 72, 3, pad=1, bias=True)
    variant = VARIANTS["wgmma"]
    tiling = next(t for t in variant.configs(shape) if t.schedule == schedule)
    x, w, b = random_problem(shape, rng, signed=True)
    op = variant.configured(tiling).prepare(shape, w, RELU, b)
    got = _host(op.run_once(x, cupy)).astype(np.float32)
    check = compare(got, reference_output(x, w, shape, RELU, b), "tf32")
    assert check.passed, check.reason
    assert np.count_nonzero(got) > got.size // 4  # not only the ReLU's zeros
    assert not (got.view(np.uint32) & TF32_DROPPED).any()


def test_a_shortcut_kept_in_the_other_layout_is_converted_for_the_add(tmp_path, monkeypatch):
    """wgmma-split-bf16 leaves reductions under 1,024 terms to the NCHW `naive`: a shortcut
    that wgmma ran (layer4's downsample) meets a block body naive ran, and is converted."""
    monkeypatch.setenv("CONVLAB_CACHE_DIR", str(tmp_path))
    plan = lab.network_plan(MODELS["resnet50"], "wgmma-split-bf16", 2, "naive")
    assert plan.convs["layer4.0.downsample.0"].variant.name == "wgmma-split-bf16"
    assert plan.convs["layer4.0.conv3"].variant.name == "naive"
    result = lab.run(plan, timer.TimingPolicy(warmup=1, min_runs=2, max_runs=3))
    failures = [f"{x.label}: {x.check.reason}" for x in (*result.layers, *result.steps)
                if x.check and not x.check.passed]
    assert not failures, failures
    assert result.predictions_differ == 0


NETWORK_VARIANTS = ["wgmma-fp16", "wgmma", "wgmma-split-bf16", "wgmma-bf16",
                    "channels-last-fp16", "register-tiled"]


@pytest.mark.parametrize("model", ["resnet50", "vgg16"])
@pytest.mark.parametrize("name", NETWORK_VARIANTS)
def test_network_top1_matches_float64(model, name, tmp_path, monkeypatch):
    """The whole network at batch 4 with the variant in its convs (the general fp32 one where
    it refuses a layer): every conv layer and every other step verified, top-1 equal to the
    unfolded float64 forward's in fp32 and tf32."""
    monkeypatch.setenv("CONVLAB_CACHE_DIR", str(tmp_path))
    variant = VARIANTS[name]
    policy = timer.TimingPolicy(warmup=1, min_runs=2, max_runs=3)
    fallback = "wgmma-3xtf32" if name == "wgmma-split-bf16" else None
    plan = lab.network_plan(MODELS[model], variant, 4, fallback)
    result = lab.run(plan, policy)
    failures = [f"{layer.label}: {layer.check.reason}" for layer in result.layers
                if not layer.check.passed]
    failures += [f"{s.label}: {s.check.reason}" for s in result.steps
                 if s.check and not s.check.passed]
    assert not failures, failures
    print(f"{model} {name}: forward {result.forward_ms:.3f} ms (graph {result.graph}), "
          f"peak {result.peak_bytes / 2**20:.0f} MiB, {result.predictions_differ} top-1 differ, "
          f"fallback {result.fallback_layers}")
    assert result.peak_bytes > 0
    if variant.precision in ("fp32", "tf32"):
        assert result.predictions_differ == 0
    else:
        assert result.predictions_differ <= 1


def test_pytorch_runs_resnet50_with_batch_norm_in_eval_mode(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setenv("CONVLAB_CACHE_DIR", str(tmp_path))
    policy = timer.TimingPolicy(warmup=1, min_runs=2, max_runs=3)
    result = lab.run(lab.network_plan(MODELS["resnet50"], "wgmma", 4), policy,
                     compare_torch=True)
    rows = {(r["layout"], r["mode"]): r for r in result.torch_rows}
    for layout in ("nchw", "nhwc"):
        eager = rows[(layout, "eager")]
        assert eager["ms"] is not None and eager["differ"] == 0, eager
        # ResNet-50's float32 weights alone are ~100 MB; the channels-last peak once missed
        # the weights that stayed in CuPy's memory (53 MiB at batch 1)
        assert eager["peak_bytes"] > 100 * 2**20, eager
    assert result.torch_ms is not None


@pytest.mark.parametrize("name,half", [("wgmma-fp16", F16), ("wgmma-bf16", BF16)])
def test_a_16_bit_network_holds_its_projection_shortcuts_as_16_bit(tmp_path, monkeypatch, name,
                                                                  half):
    """wgmma-fp16 writes each downsample conv's output as fp16 (the block's input was kept
    fp16), wgmma-bf16 as bf16 bits; the steps' outputs, the stem's converted input and the one
    workspace the split-K convs share at batch 1 are views of one arena, and the network still
    computes the float64 forward's classes."""
    from convlab.net.network import Network

    monkeypatch.setenv("CONVLAB_CACHE_DIR", str(tmp_path))
    plan = lab.network_plan(MODELS["resnet50"], name, 1)
    net = Network(lab.load_weights("resnet50"), plan)
    shortcuts = [s for s in net.steps if ".downsample." in s.label]
    assert len(shortcuts) == 4
    assert all(s.output.dtype == half for s in shortcuts), [s.output.dtype for s in shortcuts]
    # every conv and the FC layer after the stem read a 16-bit activation as it is: no
    # conversion pass
    import cupy

    net.forward(cupy.asarray(np.random.default_rng(0).random(net.input.shape, np.float32)))
    assert all(s.staged is s.input for s in net.conv_steps[1:]), [
        s.label for s in net.conv_steps[1:] if s.staged is not s.input]
    assert len({s.output.data.mem.ptr for s in net.steps}) == 1
    split = [s.label for s in net.conv_steps
             if s.variant.config_for(s.shape, s.epilogue).split_k > 1]
    assert split and net.split_k.floats > 0, split
    # the stem's converted images and the split-K workspace are views of the same arena
    stem = net.conv_steps[0]
    assert stem.staged is not stem.input and stem.staged.dtype == half
    arena = net.steps[0].output.data.mem.ptr
    assert stem.staged.data.mem.ptr == arena and net.split_k.arrays()[0].data.mem.ptr == arena
    result = lab.run(plan, timer.TimingPolicy(warmup=1, min_runs=2, max_runs=3))
    failures = [f"{x.label}: {x.check.reason}" for x in (*result.layers, *result.steps)
                if x.check and not x.check.passed]
    assert not failures, failures
    assert result.predictions_differ == 0
    # each layer records the tiling its step ran: an add-relu conv's, adding 16-bit, is its own
    recorded = {layer.label: layer.config for layer in result.layers}
    fused = [s for s in net.conv_steps if s.adds_kept]
    assert fused and all(s.variant.kept_dtype == half for s in fused)
    for s in net.conv_steps:
        assert recorded[s.label] == s.variant.config_for(s.shape, s.epilogue).as_dict(), s.label
