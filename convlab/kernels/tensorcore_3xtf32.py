"""tensorcore-3xtf32: the tensorcore kernel with error-compensated TF32: FP32-level accuracy on
mixed-sign data, labelled tf32 because it does not hold the FP32 bound on every input."""

from .tensorcore import BODY, HEADER

COMMENT = r"""
// tensorcore-3xtf32: changes from tensorcore -- each operand is split into a TF32 part and a
// TF32 residual, f = big + small, and three products are accumulated: small*big, big*small,
// big*big (small terms first). Only small*small, about 2^-22 of the product, is dropped, so the
// products are as good as FP32's, on the tensor cores: three mma instructions per k-step
// instead of one, a trade that pays where FP32 FMAs are the bottleneck (CUTLASS calls this
// 3xTF32). The sums are not: the tensor cores truncate inside their accumulation, and this
// kernel carries one accumulator through every k-step, so on data whose products all have one
// sign the error grows like n*u. Measured on an H100: 1.5x the FP32 bound at C*K*K = 4,608 and
// 2.0x at 9,216 (within it on mixed-sign data), so the variant is labelled by the class it
// always meets, tf32 (pipelined-3xtf32 rounds each K-tile into its sum and holds FP32). The host splits the filters into
// their two parts; the inputs are staged unrounded and split in registers. Tiling, general
// layers (stride, padding, groups, bias + ReLU) and the staging of the input as tensorcore.
"""

MMA_STEP = r"""
#define A_PARTS 2
#define STAGE(v) (v)

__device__ __forceinline__ void mma_step(float (&acc)[MF][NF][4], const float4 (&a)[A_PARTS][MF],
                                         const float (&b)[NF][2])
{
    unsigned int ah[MF][4], al[MF][4], bh[NF][2], bl[NF][2];
#pragma unroll
    for (int i = 0; i < MF; ++i) {
        as_bits(a[0][i], ah[i]);
        as_bits(a[1][i], al[i]);
    }
#pragma unroll
    for (int j = 0; j < NF; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            bh[j][e] = to_tf32(b[j][e]);
            bl[j][e] = to_tf32(b[j][e] - __uint_as_float(bh[j][e]));
        }
#pragma unroll
    for (int i = 0; i < MF; ++i)
#pragma unroll
        for (int j = 0; j < NF; ++j) {
            mma_tf32(acc[i][j], al[i], bh[j]);
            mma_tf32(acc[i][j], ah[i], bl[j]);
            mma_tf32(acc[i][j], ah[i], bh[j]);
        }
}
"""

SOURCE = COMMENT + HEADER + MMA_STEP + BODY

from .base import split_tf32_arithmetic  # noqa: E402
from .tensorcore import TensorCore, round_tf32  # noqa: E402


class TensorCore3xTF32(TensorCore):
    name = "tensorcore-3xtf32"
    summary = "tensorcore with split TF32 operands (3 MMAs per step); tf32 class (see its source)"
    precision = "tf32"
    source = SOURCE

    def arithmetic(self, shape):
        return split_tf32_arithmetic(shape)

    def filter_parts(self, weights):
        big = round_tf32(weights)
        return [big, round_tf32(weights - big)]
