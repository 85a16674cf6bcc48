"""channels-last: the pipelined implicit GEMM over NHWC activations, in TF32, 3xTF32, FP16 and
BF16 (kernels.IGEMM_FORMS registers them as `pipelined.Pipelined` reading NHWC_ACTIVATIONS).
Same mainloop, split-K reduce and tiling space as `pipelined`; a different gather
(igemm.gather_nhwc), epilogue (NHWC stores) and staging (the input transposed, converted and
channel-padded once, where it enters). The wgmma family reads the same activations."""

from ..gpu.elements import ELEMENT_SOURCE
from .general import EPILOGUE_SOURCE
from .igemm import epilogue, gather_nhwc, mainloop, splitk, tile_walks

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
          + mainloop.GEOMETRY + mainloop.INSTRUCTIONS + tile_walks.SOURCE + splitk.SPLIT_K_LAST
          + gather_nhwc.NHWC_GATHER
          + EPILOGUE_SOURCE + ELEMENT_SOURCE + epilogue.KEPT_SOURCE + epilogue.STAGED_STORE
          + mainloop.filled(mainloop.GRID_KERNEL, BODY=gather_nhwc.START + mainloop.LOAD_A
                            + gather_nhwc.LOAD_TILE
                            + mainloop.COMPUTE + mainloop.PIPELINE + splitk.SPLIT_K_REDUCE
                            + epilogue.STORE_STAGED)
          + mainloop.GRID_ENTRY)

from dataclasses import replace  # noqa: E402

import numpy as np  # noqa: E402

from ..shapes import FEATURES, NHWC, ConvShape, is_channels_last  # noqa: E402
from .base import ADD_RELU, RELU  # noqa: E402
from .igemm.staging import ChannelsLastStaging  # noqa: E402
from .igemm.tiling import Tiling, channel_vector, padded_group_channels  # noqa: E402


class NhwcActivations:
    """Channels-last activations: a pixel's channels contiguous, each group's channels padded
    to whole 16-byte vectors (AlexNet's conv1: 3 -> 4), the input staged once where it enters."""

    layout = NHWC
    source = SOURCE
    # The NHWC gather finds each tap's offset from KH, KW and DIL: rectangular and dilated
    # filters cost nothing beyond the square ones (the NCHW family keeps square filters).
    general = frozenset(FEATURES)
    # An FC layer is a 1x1 convolution of a batch of 1x1 images, whose input a flatten of NHWC
    # activations lays out as this kernel reads it: the same GEMM on tensor cores, in the
    # variant's precision (as PyTorch's TF32 and fp16 networks run their FC layers).
    runs_dense = True
    # A residual block's add and ReLU in the stores of the conv that ends it (igemm.epilogue's
    # KEPT_SOURCE): the kept activation is channels-last, as the output.
    epilogues = (RELU, ADD_RELU)

    def kernel_shape(self, shape: ConvShape, maths: str) -> ConvShape:
        cg = padded_group_channels(shape.Cg, maths)
        return shape if cg == shape.Cg else replace(shape, C=cg * shape.groups)

    def defines(self, k: ConvShape, maths: str) -> dict[str, int]:
        return {"NHWC": 1, "VEC": channel_vector(k.Cg, maths)}

    def gather_table(self, shape: ConvShape, t: Tiling, maths: str) -> np.ndarray:
        return gather_nhwc.gather_table(shape, t, channel_vector(shape.Cg, maths))

    def stager(self, shape: ConvShape, maths: str):
        """NCHW or channels-last float32 in; NHWC out, converted and channel-padded (an input
        that is already what the kernel reads passes through untouched)."""
        return ChannelsLastStaging(shape, self.kernel_shape(shape, maths).Cg, maths)

    def input_problem(self, x, k: ConvShape, name: str) -> str:
        if x.ndim != 4 or x.shape[1] != k.C or not is_channels_last(x):
            return (f"'{name}' reads a channels-last input of {k.C} channels, got "
                    f"shape {tuple(x.shape)}, strides {tuple(x.strides)}: pass op.stage(x)")
        return ""


NHWC_ACTIVATIONS = NhwcActivations()
