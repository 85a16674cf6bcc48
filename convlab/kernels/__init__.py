"""The registry of convolution variants, in ladder order."""

from ..errors import ConvlabError
from .base import RELU, TANH_POOL, Op, Support, Variant
from .channels_last import ChannelsLast, ChannelsLast3xTF32, ChannelsLastBF16, ChannelsLastFP16
from .constant import Constant
from .cpu import Cpu
from .cudnn import reference_rows
from .depthwise import Depthwise, DepthwiseBF16, DepthwiseFP16
from .fused import Fused
from .im2col import Im2col
from .implicit_gemm import ImplicitGemm
from .naive import Naive
from .pipelined import Pipelined, Pipelined3xTF32, PipelinedBF16, PipelinedFP16
from .register_tiled import RegisterTiled
from .tensorcore import TensorCore
from .tensorcore_3xtf32 import TensorCore3xTF32
from .tiled import Tiled
from .unrolled import Unrolled
from .wgmma import Wgmma, Wgmma3xTF32, WgmmaBF16, WgmmaFP16, WgmmaSplitBF16
from .winograd import Winograd

VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Cpu(), Naive(), Tiled(), Constant(), Unrolled(), RegisterTiled(), Im2col(), Winograd(),
        ImplicitGemm(), TensorCore(), TensorCore3xTF32(), Pipelined(), Pipelined3xTF32(),
        PipelinedFP16(), PipelinedBF16(), ChannelsLast(), ChannelsLast3xTF32(),
        ChannelsLastFP16(), ChannelsLastBF16(), Wgmma(), Wgmma3xTF32(), WgmmaSplitBF16(),
        WgmmaFP16(), WgmmaBF16(), Depthwise(), DepthwiseFP16(), DepthwiseBF16(), Fused(),
        *reference_rows(),
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


__all__ = ["RELU", "TANH_POOL", "Op", "Support", "Variant", "VARIANTS", "REFERENCE_VARIANTS",
           "CUDNN_ROWS", "get_variant", "kernel_variants"]
