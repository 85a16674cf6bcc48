"""channels-last: the pipelined implicit GEMM over NHWC activations, in TF32, 3xTF32, FP16 and
BF16. Same mainloop, split-K reduce and tiling space as `pipelined`; a different gather
(igemm.gather_nhwc), epilogue (NHWC stores) and staging (the input transposed, converted and
channel-padded once, where it enters)."""

from ..gpu.elements import ELEMENT_SOURCE
from .general import EPILOGUE_SOURCE
from .igemm import epilogue, gather_nhwc, mainloop, splitk

SOURCE = (r"""
// channels-last: changes from pipelined -- that kernel gathered B from NCHW, where the K
// elements of one pixel sit H*W apart: one 4-byte cp.async per element (and, for fp16/bf16,
// whose 2-byte elements cp.async cannot copy, a trip through registers that limited the
// pipeline to two stages and took registers from the accumulators). In NHWC a pixel's channels
// are contiguous, so with K ordered (channel chunk, tap, channel) a B row -- BK channels of one
// pixel at one tap -- is BK/VEC vector copies of 16 bytes: 4x (TF32) to 8x (FP16) fewer copy
// instructions, one bounds test per row, and every precision gets a STAGES-deep cp.async
// pipeline. The B tile is stored [n][k] with 16-byte row padding, the layout ldmatrix (without
// .trans) and the TF32 fragment reads want, conflict-free. The epilogue stages C transposed and
// writes each pixel's output channels contiguously: NHWC out, for the next layer to read.
// Layers with fewer than BK channels per group (conv1's 3) run K as (tap, channel) through a
// table of per-vector offsets; channel counts that do not fill 16-byte vectors are padded with
// zeros by the staging (to 8 bytes: 3 -> 4).
//
// Compile-time: as pipelined, plus NHWC 1 and VEC (elements per copy).
"""
          + mainloop.GEOMETRY + mainloop.INSTRUCTIONS + splitk.SPLIT_K_LAST + EPILOGUE_SOURCE
          + ELEMENT_SOURCE + mainloop.KERNEL_BEGIN + gather_nhwc.LOADER_LANE
          + gather_nhwc.ROW_ORIGINS + mainloop.LOAD_A + gather_nhwc.GATHER_B + mainloop.COMPUTE
          + mainloop.PIPELINE + splitk.SPLIT_K_REDUCE + epilogue.STORE_NHWC)

from dataclasses import replace  # noqa: E402

from ..shapes import FEATURES, NHWC, ConvShape, is_channels_last  # noqa: E402
from .base import split_tf32_arithmetic  # noqa: E402
from .igemm.packing import stage_channels_last  # noqa: E402
from .igemm.tiling import Tiling, channel_vector, padded_group_channels  # noqa: E402
from .pipelined import Pipelined  # noqa: E402


class ChannelsLast(Pipelined):
    name = "channels-last"
    summary = "pipelined implicit GEMM over NHWC: 16-byte cp.async rows, TF32"
    precision = "tf32"
    maths = "tf32"
    source = SOURCE
    layout = NHWC
    # The NHWC gather finds each tap's offset from KH, KW and DIL: rectangular and dilated
    # filters cost nothing beyond the square ones (the NCHW family keeps square filters).
    general = frozenset(FEATURES)
    # An FC layer is a 1x1 convolution of a batch of 1x1 images, whose input a flatten of NHWC
    # activations lays out as this kernel reads it: the same GEMM on tensor cores, in the
    # variant's precision (as PyTorch's TF32 and fp16 networks run their FC layers).
    runs_dense = True

    def kernel_shape(self, shape: ConvShape) -> ConvShape:
        cg = padded_group_channels(shape.Cg, self.maths)
        return shape if cg == shape.Cg else replace(shape, C=cg * shape.groups)

    def layout_defines(self, k: ConvShape) -> dict[str, int]:
        return {"NHWC": 1, "VEC": channel_vector(k.Cg, self.maths)}

    def gather_table(self, shape: ConvShape, t: Tiling):
        return gather_nhwc.gather_table(shape, t, channel_vector(shape.Cg, self.maths))

    def stager(self, shape: ConvShape):
        """NCHW or channels-last float32 in; NHWC out, converted and channel-padded (an input
        that is already what the kernel reads passes through untouched)."""
        cg = self.kernel_shape(shape).Cg
        maths = self.maths
        return lambda x, out: stage_channels_last(x, out, shape, cg, maths)

    def input_problem(self, x, k: ConvShape) -> str:
        problem = super().input_problem(x, k)
        if problem:
            return problem
        if x.ndim != 4 or x.shape[1] != k.C or not is_channels_last(x):
            return (f"'{self.name}' reads a channels-last input of {k.C} channels, got "
                    f"shape {tuple(x.shape)}, strides {tuple(x.strides)}: pass op.stage(x)")
        return ""


class ChannelsLast3xTF32(ChannelsLast):
    name = "channels-last-3xtf32"
    summary = "channels-last with split TF32 operands (3 MMAs per step): FP32-level accuracy"
    precision = "fp32"
    maths = "3xtf32"

    def arithmetic(self, shape):
        return split_tf32_arithmetic(shape)


class ChannelsLastFP16(ChannelsLast):
    name = "channels-last-fp16"
    summary = "channels-last on fp16 inputs and filters (m16n8k16, ldmatrix), FP32 accumulation"
    precision = "fp16"
    maths = "fp16"


class ChannelsLastBF16(ChannelsLast):
    name = "channels-last-bf16"
    summary = "channels-last on bf16 inputs and filters (m16n8k16, ldmatrix), FP32 accumulation"
    precision = "bf16"
    maths = "bf16"
