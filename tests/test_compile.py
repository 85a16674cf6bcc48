"""Every variant's CUDA source compiles with NVRTC for sm_90, on any machine (no GPU needed)."""

import pytest

from convlab.errors import KernelCompileError
from convlab.jit import build_options, compile_cubin, nvrtc_version
from convlab.kernels import kernel_variants
from convlab.shapes import ConvShape

SHAPES = [
    ConvShape(10000, 1, 28, 28, 50, 5),
    ConvShape(10000, 1, 48, 48, 12, 7),
    ConvShape(10000, 12, 21, 21, 24, 7),
    ConvShape(3, 3, 17, 13, 10, 3),
    ConvShape(1, 16, 14, 14, 65, 5),
]
CASES = [(v, s, e) for v in kernel_variants() for s in SHAPES for e in (None, *v.epilogues)
         if v.supports(s)]


def test_nvrtc_is_available():
    assert nvrtc_version() >= (12, 0)


@pytest.mark.parametrize("variant,shape,epilogue", CASES,
                         ids=[f"{v.name}-{s.brief()}-{e or 'conv'}" for v, s, e in CASES])
def test_variant_compiles_for_sm90(variant, shape, epilogue):
    cubin = compile_cubin(variant.name, variant.source, variant.compile_options(shape, epilogue))
    assert cubin[:4] == b"\x7fELF"


def test_every_kernel_variant_is_covered():
    assert {v.name for v, _, _ in CASES} == {v.name for v in kernel_variants()}


def test_compile_error_names_variant_and_shows_log():
    source = 'extern "C" __global__ void conv_forward(float* y) { y[0] = undefined_thing; }'
    with pytest.raises(KernelCompileError) as info:
        compile_cubin("broken", source, build_options({"K": 3}))
    message = str(info.value)
    assert "kernel 'broken' failed to compile" in message
    assert "undefined_thing" in message and "-DK=3" in message
