"""Every variant's CUDA source compiles with NVRTC for sm_90, on any machine (no GPU needed)."""

from unittest import mock

import pytest

from convlab.errors import KernelCompileError
from convlab.gpu.jit import build_options, compile_cubin, nvrtc_version
from convlab.kernels import RELU, base, kernel_variants
from convlab.models import MODELS
from convlab.shapes import ConvShape

SHAPES = [
    ConvShape(10000, 1, 28, 28, 50, 5),
    ConvShape(10000, 1, 48, 48, 12, 7),
    ConvShape(10000, 12, 21, 21, 24, 7),
    ConvShape(3, 3, 17, 13, 10, 3),
    ConvShape(1, 16, 14, 14, 65, 5),
]
# General layers, small enough to compile quickly: every stride/padding/groups/bias switch,
# a group boundary inside a channel block's reach, and a channel count that tensorcore stages
# in slabs.
GENERAL = [
    ConvShape(2, 4, 11, 19, 6, 5, stride=2, pad=1, groups=2, bias=True),
    ConvShape(3, 6, 9, 10, 8, 3, stride=3, pad=2, groups=2),
    ConvShape(1, 8, 7, 7, 12, 3, pad=1, groups=4, bias=True),
    ConvShape(2, 3, 23, 23, 16, 11, stride=4, bias=True),
    ConvShape(1, 4, 9, 9, 140, 3, pad=3, groups=2, bias=True),
    ConvShape(2, 512, 9, 9, 64, 3, pad=1, groups=2),
    # 1,153 terms, strided: wgmma-split-bf16 runs reductions of 1,024 terms or more
    ConvShape(2, 128, 13, 11, 32, 3, stride=2, pad=1, bias=True),
    # depthwise: one channel a group (the second compiled with a ReLU)
    ConvShape(2, 6, 11, 9, 6, 3, stride=2, pad=1, groups=6, bias=True),
    ConvShape(1, 16, 9, 9, 16, 5, pad=2, groups=16, bias=True),
    # rectangular and dilated (a 1x7 filter padded 0x3, taps 2 apart: 1,121 terms), and
    # dilated through the table gather (3 channels)
    ConvShape(2, 160, 9, 13, 24, 1, pad=0, Kw=7, pad_w=3, dilation=2, bias=True),
    ConvShape(2, 3, 13, 13, 16, 3, pad=2, dilation=2),
]
# AlexNet's conv layers at the largest batch (batch is not compiled in; ReLU is what they run).
ALEXNET = list(MODELS["alexnet"].conv_shapes(1024).values())
# supports() judges the shape alone here, as on the GPU each variant is built for: these
# checks compile every variant whatever GPU the machine has (wgmma's on an A100 too).
with mock.patch.object(base, "compute_capability", lambda: None):
    # The course's layers with the epilogues they run (ReLU, AlexNet's, is compiled on the layers below).
    CASES = [(v, s, e) for v in kernel_variants() for s in SHAPES for e in (None, *v.epilogues)
             if e != RELU and v.supports(s) and (e is None or v.supports_epilogue(s, e))]
    # The epilogue switches are a few lines of the store: each general shape is compiled with one
    # epilogue, taken in turn, so that every epilogue meets general shapes without compiling the
    # whole product (NVRTC takes seconds per case).
    CASES += [(v, s, e) for v in kernel_variants()
              for i, s in enumerate(GENERAL) for e in [(None, *v.epilogues)[i % (1 + len(v.epilogues))]]
              if v.supports(s) and (e is None or v.supports_epilogue(s, e))]
    CASES += [(v, s, RELU if RELU in v.epilogues else None) for v in kernel_variants() for s in ALEXNET
              if v.supports(s)]


# The tilings compiled are the cost model's, not those of a tuning cache on this machine.
pytestmark = pytest.mark.usefixtures("private_cache")


def test_nvrtc_is_available():
    assert nvrtc_version() >= (12, 0)


def test_a_clean_compile_leaves_the_interpreter_intact():
    """A kernel that compiles without a message has a log of one byte (its NUL). Handed to
    NVRTC as `b" " * 1`, that buffer was CPython's shared one-byte b" ", and NVRTC's NUL went
    into every b" " of the process: PyTorch's TorchScript then read source without spaces."""
    from convlab.gpu.jit import nvrtc_compile

    result = nvrtc_compile("k.cu", 'extern "C" __global__ void k(float* y) { y[0] = 1.0f; }',
                           ("-std=c++17",))
    assert result.cubin is not None and result.log == ""
    assert " ".encode()[0] == 32 and b" "[0] == 32 and b"x"[0] == 120


@pytest.mark.parametrize("missing", ["bindings", "library"])
def test_a_machine_without_nvrtc_is_told_what_to_install(monkeypatch, missing):
    """Without NVIDIA's bindings, or with them but no libnvrtc for them to load, one line
    that names the extra to install, not an ImportError or the loader's traceback."""
    import sys

    from cuda.bindings import nvrtc

    from convlab.errors import ConvlabError
    from convlab.gpu import jit

    if missing == "bindings":
        monkeypatch.setitem(sys.modules, "cuda.bindings", None)
    else:
        def not_found():
            raise RuntimeError('Failure finding "libnvrtc.so.13"')
        monkeypatch.setattr(nvrtc, "nvrtcVersion", not_found)
    jit._nvrtc.cache_clear()
    try:
        with pytest.raises(ConvlabError, match=r'pip install -e "\.\[dev\]"'):
            nvrtc_version()
    finally:
        jit._nvrtc.cache_clear()


@pytest.mark.slow
@pytest.mark.parametrize("variant,shape,epilogue", CASES,
                         ids=[f"{v.name}-{s.brief()}-{e or 'conv'}" for v, s, e in CASES])
def test_variant_compiles_for_sm90(variant, shape, epilogue):
    cubin = compile_cubin(variant.name, variant.source, variant.compile_options(shape, epilogue),
                          variant.arch or "sm_90")
    assert cubin[:4] == b"\x7fELF"


def test_every_kernel_variant_is_covered():
    assert {v.name for v, _, _ in CASES} == {v.name for v in kernel_variants()}


def test_every_general_feature_and_epilogue_is_compiled():
    """Each feature and epilogue a variant implements is compiled at least once, and each
    epilogue also on a general layer."""
    for variant in kernel_variants():
        cases = [(s, e) for v, s, e in CASES if v is variant]
        used = {f for s, _ in cases for f in s.features()}
        assert variant.general <= used, (variant.name, variant.general - used)
        general = {e for s, e in cases if not s.is_plain}
        assert set(variant.epilogues) <= general, (variant.name, set(variant.epilogues) - general)


def test_compile_error_names_variant_and_shows_log():
    source = 'extern "C" __global__ void conv_forward(float* y) { y[0] = undefined_thing; }'
    with pytest.raises(KernelCompileError) as info:
        compile_cubin("broken", source, build_options({"K": 3}))
    message = str(info.value)
    assert "kernel 'broken' failed to compile" in message
    assert "undefined_thing" in message and "-DK=3" in message


def test_end_to_end_top1_kernel_compiles():
    """The predictions kernel of the host-to-host pipeline (it once used INFINITY, which NVRTC
    does not define, and every GPU network run failed to compile it)."""
    from convlab.net.pipeline import ARGMAX_SOURCE

    assert compile_cubin("pipeline:top1", ARGMAX_SOURCE, ("-std=c++17",))[:4] == b"\x7fELF"


def test_ceiling_kernels_compile():
    """The mma.sync peak loops `convlab device` measures the TF32 and FP16 ceilings with."""
    from convlab.gpu.peaks import MMA_PEAKS, MMA_PEAK_SOURCE

    assert compile_cubin("ceiling:mma", MMA_PEAK_SOURCE, ("-std=c++17",))[:4] == b"\x7fELF"
    assert all(f'void {name}(' in MMA_PEAK_SOURCE for name, *_ in MMA_PEAKS.values())


def _add_relu_cases():
    """The add-relu epilogue in every store that has it: the grid schedule's staged one, the
    persistent and pingpong schedules' register one (its 16-byte path with 16-bit output and
    kept: fp16, and bf16 bits), the halo schedule's; output channels and pixels that end
    mid-tile."""
    from convlab.gpu.elements import BFLOAT16, FLOAT16
    from convlab.kernels import ADD_RELU, VARIANTS

    cases = []
    with mock.patch.object(base, "compute_capability", lambda: None):
        for name, half_type in (("wgmma-fp16", FLOAT16), ("wgmma", FLOAT16),
                                ("channels-last-fp16", FLOAT16), ("wgmma-bf16", BFLOAT16)):
            for shape in (ConvShape(3, 64, 13, 11, 200, 1, bias=True),
                          ConvShape(2, 64, 12, 20, 72, 3, pad=1, bias=True)):
                for half in (False, True):
                    v = VARIANTS[name]
                    v = v.writing(half_type).adding(half_type) if half else v
                    tilings = {t.schedule: t for t in reversed(v.configs(shape, ADD_RELU))}
                    tilings.update({t.schedule: t for t in reversed(v.ranked(shape))
                                    if t.schedule == "pingpong"})
                    cases += [(v.configured(t), shape) for t in tilings.values()]
    return cases


ADD_RELU_CASES = _add_relu_cases()


@pytest.mark.slow
@pytest.mark.parametrize("variant,shape", ADD_RELU_CASES,
                         ids=[f"{v.name}-{v.output_dtype}-{v.kept_dtype}-{v.tiling.schedule}-"
                              f"{s.brief()}" for v, s in ADD_RELU_CASES])
def test_the_add_relu_epilogue_compiles_in_every_store(variant, shape):
    options = variant.compile_options(shape, "add-relu")
    assert "-DADD_KEPT=1" in options
    cubin = compile_cubin(variant.name, variant.source, options, variant.arch or "sm_90")
    assert cubin[:4] == b"\x7fELF"


def test_every_schedule_compiles_the_add_relu_epilogue():
    assert {v.tiling.schedule for v, _ in ADD_RELU_CASES} >= {"grid", "persistent", "pingpong",
                                                               "halo"}
