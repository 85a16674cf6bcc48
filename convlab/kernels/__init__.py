"""The registry of convolution variants, in ladder order."""

from ..errors import ConvlabError
from .base import ADD_RELU, RELU, TANH_POOL, Op, Support, Variant, takes_tunings
from .channels_last import NHWC_ACTIVATIONS
from .constant import Constant
from .cpu import Cpu
from .cudnn import reference_rows
from .depthwise import Depthwise, DepthwiseBF16, DepthwiseFP16
from .fused import Fused
from .im2col import Im2col
from .implicit_gemm import ImplicitGemm
from .naive import Naive
from .pipelined import NCHW_ACTIVATIONS, Form, Pipelined
from .register_tiled import RegisterTiled
from .tensorcore import TensorCore
from .tensorcore_3xtf32 import TensorCore3xTF32
from .tiled import Tiled
from .unrolled import Unrolled
from .wgmma import Wgmma
from .winograd import Winograd

# The implicit-GEMM families on tensor cores, one row a registered variant: the family (the MMA
# it issues), the activations it reads, and its Form (name, line, precision class, maths).
_SPLIT = "split TF32 operands (3 MMAs per step): FP32-level accuracy"
_M16N8K16 = "inputs and filters (m16n8k16, ldmatrix), FP32 accumulation"
IGEMM_FORMS = (
    (Pipelined, NCHW_ACTIVATIONS, Form(
        "pipelined", "cp.async-pipelined implicit GEMM, mma.sync TF32, tuned tiles, split-K",
        "tf32", "tf32")),
    (Pipelined, NCHW_ACTIVATIONS, Form(
        "pipelined-3xtf32", f"pipelined with {_SPLIT}", "fp32", "3xtf32")),
    (Pipelined, NCHW_ACTIVATIONS, Form(
        "pipelined-fp16", f"pipelined on fp16 {_M16N8K16}", "fp16", "fp16")),
    (Pipelined, NCHW_ACTIVATIONS, Form(
        "pipelined-bf16", f"pipelined on bf16 {_M16N8K16}", "bf16", "bf16")),
    (Pipelined, NHWC_ACTIVATIONS, Form(
        "channels-last", "pipelined implicit GEMM over NHWC: 16-byte cp.async rows, TF32",
        "tf32", "tf32")),
    (Pipelined, NHWC_ACTIVATIONS, Form(
        "channels-last-3xtf32", f"channels-last with {_SPLIT}", "fp32", "3xtf32")),
    (Pipelined, NHWC_ACTIVATIONS, Form(
        "channels-last-fp16", f"channels-last on fp16 {_M16N8K16}", "fp16", "fp16")),
    (Pipelined, NHWC_ACTIVATIONS, Form(
        "channels-last-bf16", f"channels-last on bf16 {_M16N8K16}", "bf16", "bf16")),
    (Wgmma, NHWC_ACTIVATIONS, Form(
        "wgmma", "channels-last implicit GEMM on Hopper wgmma (sm_90a), swizzled smem, TF32",
        "tf32", "tf32")),
    (Wgmma, NHWC_ACTIVATIONS, Form(
        "wgmma-3xtf32", "wgmma with split TF32 operands (3 products per step): FP32-level "
        "accuracy", "fp32", "3xtf32")),
    (Wgmma, NHWC_ACTIVATIONS, Form(
        "wgmma-split-bf16", "wgmma, split operands: the big product in TF32, the cross products "
        "in BF16 (FP32-level accuracy, 2/3 of 3xTF32's tensor time)", "fp32", "3xtf32",
        cross_bf16=True)),
    (Wgmma, NHWC_ACTIVATIONS, Form(
        "wgmma-fp16", "channels-last implicit GEMM on Hopper wgmma (sm_90a), fp16 in, FP32 "
        "accumulation", "fp16", "fp16")),
    (Wgmma, NHWC_ACTIVATIONS, Form(
        "wgmma-bf16", "channels-last implicit GEMM on Hopper wgmma (sm_90a), bf16 in, FP32 "
        "accumulation", "bf16", "bf16")),
)
_IGEMM = {form.name: family(form, activations) for family, activations, form in IGEMM_FORMS}

VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Cpu(), Naive(), Tiled(), Constant(), Unrolled(), RegisterTiled(), Im2col(), Winograd(),
        ImplicitGemm(), TensorCore(), TensorCore3xTF32(), *_IGEMM.values(),
        Depthwise(), DepthwiseFP16(), DepthwiseBF16(), Fused(), *reference_rows(),
    )
}

# The reference rows of each precision class: cuDNN in both layouts and, on 1x1 layers with
# stride 1, cuBLAS's GEMM (kernels.cudnn.CublasGemm); a speedup divides by the fastest.
CUDNN_ROWS = {precision: tuple(v.name for v in reference_rows() if v.precision == precision)
              for precision in ("fp32", "tf32", "fp16", "bf16")}
REFERENCE_VARIANTS = tuple(name for rows in CUDNN_ROWS.values() for name in rows)


def get_variant(name: str) -> Variant:
    try:
        return VARIANTS[name]
    except KeyError:
        raise ConvlabError(
            f"unknown kernel '{name}'; choose one of: {', '.join(VARIANTS)}") from None


def kernel_variants() -> list[Variant]:
    """The variants with CUDA source of their own (everything but cpu and the cuDNN rows)."""
    return [v for v in VARIANTS.values() if v.source]


__all__ = ["ADD_RELU", "RELU", "TANH_POOL", "takes_tunings", "Op", "Support", "Variant",
           "VARIANTS", "REFERENCE_VARIANTS", "CUDNN_ROWS", "IGEMM_FORMS", "get_variant",
           "kernel_variants"]
