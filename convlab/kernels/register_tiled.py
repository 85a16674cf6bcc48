"""register-tiled: each thread computes a column strip of outputs for several channels."""

from .general import EPILOGUE_SOURCE

SOURCE = r"""
// register-tiled: changes from unrolled -- a thread no longer computes one output but a strip
// of TH outputs down one column for MT output channels (MT x TH accumulators in registers).
// Each input value it loads feeds MT FMAs for each of up to K filter rows (the strip's input
// window is loaded once per filter column), and each filter tap feeds TH FMAs, instead of one
// each. The block's MT filters are staged in shared memory transposed to [c][p][q][m] and
// padded to a multiple of 4 channels, so one 16-byte broadcast load fetches a tap of four
// channels for the whole warp. Consecutive threads take consecutive columns: input loads and
// output stores stay coalesced. Grid: x over (image, strip, column), y over channel blocks.
// General layers: a block's MT channels lie in one group (MT divides M/GROUPS) and read that
// group's C/GROUPS input channels; with stride S the window is (TH-1)*S+K rows; zero padding
// is a predicate on each window load (window rows and columns outside the image read as 0);
// the store adds the bias and the fused ReLU. With stride 1 and no padding the window loads
// are exactly the plain kernel's.
// Compile-time: C, H, W, M, K, TH, MT, MT4 (MT rounded up to 4), NSTRIP, BLOCK, MINB (the
// blocks per SM the register allocation must leave room for; 0 leaves it to the compiler),
// STRIDE, PAD, GROUPS, HAS_BIAS, RELU.
#define HO ((H + 2 * PAD - K) / STRIDE + 1)
#define WO ((W + 2 * PAD - K) / STRIDE + 1)
#define KK (K * K)
#define CG (C / GROUPS)
#define MG (M / GROUPS)
#define WIN ((TH - 1) * STRIDE + K)  // input rows a strip's window spans

#if MINB > 0
#define BOUNDS __launch_bounds__(BLOCK, MINB)
#else
#define BOUNDS __launch_bounds__(BLOCK)
#endif
""" + EPILOGUE_SOURCE + r"""
extern __shared__ float4 filters_smem[];  // C/GROUPS*K*K taps x MT4/4 float4

__device__ __forceinline__ void load_filters(const float* __restrict__ k, int m0)
{
    float* ws = reinterpret_cast<float*>(filters_smem);
    for (int i = threadIdx.x; i < CG * KK * MT4; i += BLOCK) {
        const int mm = i % MT4, tap = i / MT4;
        ws[i] = (mm < MT) ? k[(m0 + mm) * (CG * KK) + tap] : 0.0f;
    }
    __syncthreads();
}

// Image b's input channels of the group that output channel m0 belongs to.
__device__ __forceinline__ const float* group_input(const float* __restrict__ x, long long b, int m0)
{
    return x + b * (C * H * W) + (GROUPS > 1 ? m0 / MG * (CG * H * W) : 0);
}

// acc[m][r] = sum_{c,p,q} x[c][(h0+r)*S+p-PAD][col*S+q-PAD] * k[m0+m][c][p][q] for the group's
// input channels at xb (zero outside the image). Output row r with filter row p reads window
// row r*S+p, so for each (c, q) the thread loads the WIN input rows its strip touches once and
// reuses each for up to K filter rows: WIN loads instead of TH*K.
__device__ __forceinline__ void conv_strip(const float* __restrict__ xb, int h0, int col,
                                           float (&acc)[MT][TH])
{
#if STRIDE == 1 && PAD == 0
    // Window rows past the image (only reached by rows past the output, which callers do not
    // store) are clamped to the last input row so nothing reads out of bounds.
    int roff[WIN];
#pragma unroll
    for (int i = 0; i < WIN; ++i) roff[i] = min(h0 + i, H - 1) * W + col;
#else
    // Window row i is input row row0 + i; rows i in [lo, hi) lie inside the image, the others
    // are padding or (past the output) unused, and read as zero.
    const int row0 = h0 * STRIDE - PAD, col0 = col * STRIDE - PAD;
    const int base = row0 * W + col0;
    const int lo = PAD > 0 ? -row0 : 0, hi = H - row0;
#endif
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int r = 0; r < TH; ++r) acc[m][r] = 0.0f;
#pragma unroll 1
    for (int c = 0; c < CG; ++c) {
#pragma unroll 1
        for (int q = 0; q < K; ++q) {
            const float* xq = xb + c * (H * W) + q;
            const float4* wq = filters_smem + (c * KK + q) * (MT4 / 4);
            float in[WIN];
#if STRIDE == 1 && PAD == 0
#pragma unroll
            for (int i = 0; i < WIN; ++i) in[i] = __ldg(xq + roff[i]);
#else
            const bool col_inside = PAD == 0 || (unsigned)(col0 + q) < (unsigned)W;
#pragma unroll
            for (int i = 0; i < WIN; ++i)
                in[i] = (col_inside && i >= lo && i < hi) ? __ldg(xq + (base + i * W)) : 0.0f;
#endif
#pragma unroll
            for (int p = 0; p < K; ++p)
#pragma unroll
                for (int m4 = 0; m4 < MT4 / 4; ++m4) {
                    const float4 wv = wq[p * K * (MT4 / 4) + m4];
                    const float tap[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        if (m4 * 4 + e < MT) {
#pragma unroll
                            for (int r = 0; r < TH; ++r)
                                acc[m4 * 4 + e][r] = fmaf(in[r * STRIDE + p], tap[e],
                                                          acc[m4 * 4 + e][r]);
                        }
                    }
                }
        }
    }
}

extern "C" __global__ void BOUNDS
conv_forward(const float* __restrict__ x, const float* __restrict__ k,
             const float* __restrict__ bias, float* __restrict__ y, int B)
{
    const int m0 = blockIdx.y * MT;
    load_filters(k, m0);
    const long long t = (long long)blockIdx.x * BLOCK + threadIdx.x;
    if (t >= (long long)B * NSTRIP * WO) return;
    const int col = (int)(t % WO);
    const int h0 = (int)((t / WO) % NSTRIP) * TH;
    const long long b = t / (WO * NSTRIP);
    float acc[MT][TH];
    conv_strip(group_input(x, b, m0), h0, col, acc);
    float* yb = y + (b * M + m0) * (HO * WO) + h0 * WO + col;
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int r = 0; r < TH; ++r)
            if (h0 + r < HO) yb[m * (HO * WO) + r * WO] = finish_output(acc[m][r], bias, m0 + m);
}
"""

from dataclasses import dataclass  # noqa: E402

import numpy as np  # noqa: E402

from ..gpu.hardware import H100  # noqa: E402
from ..shapes import SQUARE_FEATURES  # noqa: E402
from .base import (RELU, TANH_POOL, Config, Op, Support, Variant, blocks,  # noqa: E402
                   check_inputs, device_weights)
from .general import device_bias, layer_defines  # noqa: E402

ACCUMULATORS = 128  # MT*TH registers per thread; more starts to spill on sm_90
CAPS = (0, 2, 3)  # MINB values the course sweeps found worth trying (results/NOTES.md)
MAX_WINDOW = 40  # input rows a strip's window may span (registers, beside the accumulators)
# (C, H, W, M, K) -> (TH, MT, MINB): the fastest verified tiling per course layer, measured on an
# H100 with scripts/sweep.py (results/NOTES.md). Other shapes use pick_tiling's estimate.
TUNED = {
    (1, 28, 28, 50, 5): (8, 10, 3),
    (1, 48, 48, 12, 7): (6, 12, 3),
    (12, 21, 21, 24, 7): (5, 24, 3),
}
MAX_FILTER_SMEM = 160 * 1024
SM_SMEM = H100.limits.shared_per_block_optin  # what the blocks resident on one SM can share


def _round4(n: int) -> int:
    return (n + 3) // 4 * 4


def window_rows(shape, th: int) -> int:
    """Input rows the window of a TH-row strip spans."""
    return (th - 1) * shape.stride + shape.K


def filter_smem_bytes(shape, mt: int) -> int:
    return 4 * shape.Cg * shape.K * shape.K * _round4(mt)


def pick_tiling(shape, even_rows: bool = False, rows_needed: int | None = None) -> tuple[int, int]:
    """Rows per thread (TH) and channels per thread (MT, a divisor of M/groups, so a block's
    channels share one group) for this shape.

    Per filter tap a thread issues WIN/K loads (its input window, loaded once per filter column)
    and MT4/4 shared loads to feed MT*TH FMAs; the score is that ratio, discounted by the rows
    computed past the output's height, and halved where the filters leave room for only one
    block per SM (then nothing hides the filter load and the barrier).
    """
    rows_needed = rows_needed or shape.Ho
    best, best_score = (1, 1), -1.0
    for th in range(2 if even_rows else 1, 9, 2 if even_rows else 1):
        window = window_rows(shape, th)
        if th > 1 and window > MAX_WINDOW:
            continue
        for mt in range(1, min(shape.Mg, 32) + 1):
            if shape.Mg % mt or mt * th > ACCUMULATORS:
                continue
            smem = filter_smem_bytes(shape, mt)
            if smem > MAX_FILTER_SMEM:
                continue
            waste = blocks(rows_needed, th) * th / rows_needed
            score = mt * th / (window / shape.K + _round4(mt) / 4) / waste
            score *= min(1.0, (SM_SMEM // smem) / 2)
            if score > best_score:
                best, best_score = (th, mt), score
    return best


def tuned_key(shape) -> tuple[int, int, int, int, int] | None:
    """The TUNED key of a layer with the course's geometry (stride 1, no padding, one group; a
    bias does not change the tiling); None for any other."""
    if shape.stride != 1 or shape.pad or shape.groups != 1:
        return None
    return (shape.C, shape.H, shape.W, shape.M, shape.K)


@dataclass(frozen=True)
class RegisterTiling(Config):
    """TH output rows x MT output channels per thread, MINB blocks per SM for the register cap
    (__launch_bounds__'s second argument; 0: no cap). The field names are the -D constants."""

    TH: int
    MT: int
    MINB: int


class RegisterTiled(Variant):
    name = "register-tiled"
    summary = "MT channels x TH rows per thread in registers; filters as shared float4 broadcasts"
    source = SOURCE
    general = SQUARE_FEATURES
    epilogues = (RELU,)

    def __init__(self, th: int | None = None, mt: int | None = None, block: int = 128,
                 min_blocks: int | None = None):
        """Fix the tiling or register cap instead of the per-shape choice (scripts/sweep.py
        measures the alternatives this way)."""
        self.th, self.mt, self.block, self.min_blocks = th, mt, block, min_blocks

    config_type = RegisterTiling

    def default_config(self, shape, epilogue=None) -> RegisterTiling:
        """Measured for the course's layers, estimated for any other: the default when nothing
        is tuned, and the tuner's starting point."""
        known = self.tuned(epilogue).get(tuned_key(shape))
        return RegisterTiling(*(known or (*self.estimate(shape, epilogue), 0)))

    def fixed_config(self):
        fixed = {"TH": self.th, "MT": self.mt, "MINB": self.min_blocks}
        return {k: v for k, v in fixed.items() if v is not None}

    def accepts(self, config, shape, epilogue=None):
        return config in self.configs(shape, epilogue)

    def configs(self, shape, epilogue=None) -> list[RegisterTiling]:
        """default_config first, then TH 2..8 (even where the epilogue pools) x the four largest
        divisors of M/groups up to 32 that fit the accumulators, the window and the shared
        memory x MINB in CAPS."""
        even = epilogue == TANH_POOL
        ths = [th for th in range(2, 9, 2 if even else 1) if window_rows(shape, th) <= MAX_WINDOW]
        mts = [mt for mt in range(min(shape.Mg, 32), 0, -1)
               if shape.Mg % mt == 0 and filter_smem_bytes(shape, mt) <= MAX_FILTER_SMEM][:4]
        space = [self.default_config(shape, epilogue)]
        for th in ths:
            for mt in mts:
                for minb in CAPS:
                    config = RegisterTiling(th, mt, minb)
                    if mt * th <= ACCUMULATORS and config not in space:
                        space.append(config)
        return space

    def configured(self, config) -> "RegisterTiled":
        config = RegisterTiling.of(config)
        return type(self)(th=config.TH, mt=config.MT, block=self.block, min_blocks=config.MINB)

    def tuned(self, epilogue=None) -> dict:
        return TUNED

    def estimate(self, shape, epilogue=None) -> tuple[int, int]:
        return pick_tiling(shape)

    def supports(self, shape):
        base = super().supports(shape)
        if not base:
            return base
        if filter_smem_bytes(shape, 1) > MAX_FILTER_SMEM:
            return Support(False, f"one channel's filters need {filter_smem_bytes(shape, 1)} bytes "
                                  f"of shared memory; the limit used is {MAX_FILTER_SMEM}")
        return Support(True)

    def tiling(self, shape, epilogue=None) -> tuple[int, int]:
        """(TH, MT) of the layer's config."""
        config = self.config_for(shape, epilogue)
        return config.TH, config.MT

    def defines(self, shape, epilogue=None):
        config = self.config_for(shape, epilogue)
        th, mt, minb = config.TH, config.MT, config.MINB
        return {"C": shape.C, "H": shape.H, "W": shape.W, "M": shape.M, "K": shape.K,
                "TH": th, "MT": mt, "MT4": _round4(mt), "NSTRIP": blocks(shape.Ho, th),
                "BLOCK": self.block, "MINB": minb, **layer_defines(shape, epilogue)}

    def prepare(self, shape, weights, epilogue=None, bias=None):
        check_inputs(self, shape, epilogue, bias)
        return self._prepare(shape, weights, epilogue, bias, "conv_forward",
                             columns=shape.Wo, strips=blocks(shape.Ho, self.tiling(shape, epilogue)[0]))

    def _prepare(self, shape, weights, epilogue, bias, kernel_name, columns, strips):
        compiled = self.compile(shape, epilogue, (kernel_name,))
        kernel = compiled.module.get_function(kernel_name)
        _, mt = self.tiling(shape, epilogue)
        smem = filter_smem_bytes(shape, mt)
        kernel.max_dynamic_shared_size_bytes = smem
        w = device_weights(weights)
        b = device_bias(bias)
        grid = (blocks(shape.B * strips * columns, self.block), shape.M // mt)
        batch = np.int32(shape.B)

        def launch(x, y):
            kernel(grid, (self.block,), (x, w, b, y, batch), shared_mem=smem)

        return Op(launch, self.output_shape(shape, epilogue), compiled.seconds, epilogue)
