"""Fully connected layers: a register-blocked SGEMM of our own (split-K where the tile grid is
too small for the GPU), a GEMV for batches of at most 8, bias and activation in the epilogue."""

from .base import ACTIVATION_SOURCE

SOURCE = r"""
// dense: y[m][n] = act(sum_k x[m][k] * w[n][k] + bias[n]) with x (M, K) and w (N, K) both
// row-major, so both operands run along k in memory (a "TN" GEMM). Three kernels, chosen per
// (M, K, N) in Python and compiled with the sizes as constants:
//
// dense_gemm: a BM x BN tile of y per block, BK = 8 k-steps per shared-memory stage. Each of
// the (BM/8)*(BN/8) threads keeps an 8 x 8 register tile of accumulators: rows tm*4+0..3 and
// BM/2+tm*4+0..3, columns tn*4+0..3 and BN/2+tn*4+0..3. Per k-step it reads 2 float4 of x and
// 2 float4 of w from shared memory and issues 64 FMAs: 16 FMAs per shared load, where one
// output per thread would issue 1. Splitting a thread's 8 rows (and columns) into two groups
// of 4 half a tile apart makes a warp's float4 reads of one k-row contiguous (conflict-free),
// and the epilogue's float4 stores coalesced. The operands are read from global memory as
// float4 along k (each thread one or more 16-byte pieces of a row) and stored transposed,
// [k][m] and [k][n], padded by 4 floats so the transposing stores hit 32 distinct banks and
// the float4 reads stay aligned. Double buffering: the next stage's global loads are issued
// into registers before the current stage's FMAs and stored to the other shared buffer after
// them, so memory latency hides behind arithmetic and one barrier per stage suffices (a buffer
// is rewritten one stage after it was read, behind the barrier that ended that stage).
// With SPLITS > 1 the grid's z dimension splits k into ranges of KSPLIT (a multiple of BK):
// where M and N give too few tiles to fill the SMs (AlexNet's FC layers at batch 128: 32 tiles
// of 128 x 128 for 132 SMs), each block sums one range into its own slice of a workspace and
// dense_splitk_reduce adds the slices in a fixed order (no atomics: the result does not depend
// on scheduling), adds the bias and applies the activation.
//
// dense_gemv: for M <= 8 the layer is a matrix-vector product bound by reading w once (151 MB
// for AlexNet's fc6), and a GEMM tile would waste all but M of its rows. A block takes ROWS
// rows of w; its WARPS warps split k in interleaved 128-float chunks, each lane reading float4
// (a warp reads 512 contiguous bytes of each row per step, all M rows of x alongside, which the
// L1 serves to every warp). Each warp holds ROWS x M partial sums, reduces them with shuffles,
// and one thread per output adds the warps' sums, the bias and the activation. w is read with
// evict-first loads: it is streamed once and should not push x out of the cache.
//
// Compile-time: M, K, N, ACT, VEC_K (K % 4 == 0: float4 loads along k), VEC_N (N % 4 == 0:
// float4 stores), and BM, BN, BK, KSPLIT, SPLITS (GEMM) or MB, ROWS, WARPS (GEMV). Element
// offsets of x, w and y are 64-bit.
""" + ACTIVATION_SOURCE + r"""
#ifdef BM
#define THREADS ((BM / 8) * (BN / 8))
#define TPN (BN / 8)
#define PAD 4

// Four consecutive k of row r of a row-major (rows x K) operand, zero past the row count and
// past kend (the end of this block's k range; with VEC_K, k and kend are multiples of 4).
__device__ __forceinline__ float4 load4(const float* __restrict__ src, int r, int rows, int k,
                                        int kend)
{
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (r < rows) {
        const float* p = src + (long long)r * K + k;
#if VEC_K
        if (k < kend) v = __ldg(reinterpret_cast<const float4*>(p));
#else
        if (k < kend) v.x = __ldg(p);
        if (k + 1 < kend) v.y = __ldg(p + 1);
        if (k + 2 < kend) v.z = __ldg(p + 2);
        if (k + 3 < kend) v.w = __ldg(p + 3);
#endif
    }
    return v;
}

// A TILE_ROWS x BK slice (rows r0.., k k0..) into registers: TILE_ROWS*BK/4 float4 over THREADS
// threads, thread f of the slice taking row f / (BK/4), k (f % (BK/4)) * 4.
template <int TILE_ROWS>
__device__ __forceinline__ void load_tile(const float* __restrict__ src, int rows, int r0, int k0,
                                          int kend, float4 (&reg)[TILE_ROWS * BK / 4 / THREADS])
{
#pragma unroll
    for (int i = 0; i < TILE_ROWS * BK / 4 / THREADS; ++i) {
        const int f = threadIdx.x + i * THREADS;
        reg[i] = load4(src, r0 + f / (BK / 4), rows, k0 + (f % (BK / 4)) * 4, kend);
    }
}

// The same slice from registers into shared memory, transposed to [k][row].
template <int TILE_ROWS>
__device__ __forceinline__ void store_tile(float (*dst)[TILE_ROWS + PAD],
                                           const float4 (&reg)[TILE_ROWS * BK / 4 / THREADS])
{
#pragma unroll
    for (int i = 0; i < TILE_ROWS * BK / 4 / THREADS; ++i) {
        const int f = threadIdx.x + i * THREADS;
        const int r = f / (BK / 4);
        const int k = (f % (BK / 4)) * 4;
        dst[k][r] = reg[i].x;
        dst[k + 1][r] = reg[i].y;
        dst[k + 2][r] = reg[i].z;
        dst[k + 3][r] = reg[i].w;
    }
}

// Four outputs of one row, columns col..col+3: the final values (bias, activation) or, for a
// split-K slice, the raw partial sums.
__device__ __forceinline__ void store4(float* __restrict__ out, const float* __restrict__ bias,
                                       int row, int col, float4 v)
{
    float* dst = out + (long long)row * N + col;
#if VEC_N
    if (col < N) {
#if SPLITS == 1
        const float4 b = __ldg(reinterpret_cast<const float4*>(bias + col));
        v = make_float4(activate(v.x + b.x), activate(v.y + b.y), activate(v.z + b.z),
                        activate(v.w + b.w));
#endif
        *reinterpret_cast<float4*>(dst) = v;
    }
#else
    const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j)
        if (col + j < N) {
#if SPLITS == 1
            dst[j] = activate(e[j] + __ldg(bias + col + j));
#else
            dst[j] = e[j];
#endif
        }
#endif
}

extern "C" __global__ void __launch_bounds__(THREADS, 512 / THREADS)
dense_gemm(const float* __restrict__ x, const float* __restrict__ w,
           const float* __restrict__ bias, float* __restrict__ out)
{
    __shared__ __align__(16) float As[2][BK][BM + PAD];
    __shared__ __align__(16) float Bs[2][BK][BN + PAD];
    const int tn = threadIdx.x % TPN;
    const int tm = threadIdx.x / TPN;
    const int n0 = blockIdx.x * BN;
    const int m0 = blockIdx.y * BM;
    const int kbeg = blockIdx.z * KSPLIT;
    const int kend = min(K, kbeg + KSPLIT);
    const int stages = (kend - kbeg + BK - 1) / BK;

    float4 ra[BM * BK / 4 / THREADS], rb[BN * BK / 4 / THREADS];
    load_tile<BM>(x, M, m0, kbeg, kend, ra);
    load_tile<BN>(w, N, n0, kbeg, kend, rb);
    store_tile<BM>(As[0], ra);
    store_tile<BN>(Bs[0], rb);
    __syncthreads();

    float acc[8][8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;

    for (int t = 0; t < stages; ++t) {
        const int s = t & 1;
        const bool more = t + 1 < stages;
        if (more) {
            load_tile<BM>(x, M, m0, kbeg + (t + 1) * BK, kend, ra);
            load_tile<BN>(w, N, n0, kbeg + (t + 1) * BK, kend, rb);
        }
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            const float4 a0 = *reinterpret_cast<const float4*>(&As[s][kk][tm * 4]);
            const float4 a1 = *reinterpret_cast<const float4*>(&As[s][kk][BM / 2 + tm * 4]);
            const float4 b0 = *reinterpret_cast<const float4*>(&Bs[s][kk][tn * 4]);
            const float4 b1 = *reinterpret_cast<const float4*>(&Bs[s][kk][BN / 2 + tn * 4]);
            const float a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
            const float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
            for (int i = 0; i < 8; ++i)
#pragma unroll
                for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        if (more) {
            store_tile<BM>(As[s ^ 1], ra);
            store_tile<BN>(Bs[s ^ 1], rb);
        }
        __syncthreads();
    }

    float* dst = out + (long long)blockIdx.z * M * N;  // slice z of the workspace, or y itself
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int row = m0 + (i < 4 ? tm * 4 + i : BM / 2 + tm * 4 + i - 4);
        if (row < M) {
            store4(dst, bias, row, n0 + tn * 4,
                   make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]));
            store4(dst, bias, row, n0 + BN / 2 + tn * 4,
                   make_float4(acc[i][4], acc[i][5], acc[i][6], acc[i][7]));
        }
    }
}

#if SPLITS > 1
// The split-K slices summed in order z = 0, 1, ..., then the bias and the activation.
extern "C" __global__ void __launch_bounds__(256)
dense_splitk_reduce(const float* __restrict__ partial, const float* __restrict__ bias,
                    float* __restrict__ y)
{
    const long long i = (long long)blockIdx.x * 256 + threadIdx.x;
    if (i >= (long long)M * N) return;
    float s = partial[i];
#pragma unroll
    for (int z = 1; z < SPLITS; ++z) s += partial[(long long)z * M * N + i];
    y[i] = activate(s + __ldg(bias + i % N));
}
#endif
#endif

#ifdef MB
extern "C" __global__ void __launch_bounds__(WARPS * 32)
dense_gemv(const float* __restrict__ x, const float* __restrict__ w,
           const float* __restrict__ bias, float* __restrict__ y)
{
    __shared__ float partial[WARPS][ROWS * MB];
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int n0 = blockIdx.x * ROWS;
    // Rows past N (the last block) re-read row N-1 and store nothing.
    const float* wr[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) wr[r] = w + (long long)min(n0 + r, N - 1) * K;
    float acc[ROWS][MB];
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int m = 0; m < MB; ++m) acc[r][m] = 0.0f;

#if VEC_K
    for (int k = (warp * 32 + lane) * 4; k < K; k += WARPS * 128) {
        float4 xv[MB];
#pragma unroll
        for (int m = 0; m < MB; ++m)
            xv[m] = __ldg(reinterpret_cast<const float4*>(x + (long long)m * K + k));
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const float4 wv = __ldcs(reinterpret_cast<const float4*>(wr[r] + k));
#pragma unroll
            for (int m = 0; m < MB; ++m) {
                float a = fmaf(wv.x, xv[m].x, acc[r][m]);
                a = fmaf(wv.y, xv[m].y, a);
                a = fmaf(wv.z, xv[m].z, a);
                acc[r][m] = fmaf(wv.w, xv[m].w, a);
            }
        }
    }
#else
    for (int k = warp * 32 + lane; k < K; k += WARPS * 32) {
        float xv[MB];
#pragma unroll
        for (int m = 0; m < MB; ++m) xv[m] = __ldg(x + (long long)m * K + k);
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const float wv = __ldcs(wr[r] + k);
#pragma unroll
            for (int m = 0; m < MB; ++m) acc[r][m] = fmaf(wv, xv[m], acc[r][m]);
        }
    }
#endif

#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int m = 0; m < MB; ++m) {
            float v = acc[r][m];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (lane == 0) partial[warp][m * ROWS + r] = v;
        }
    __syncthreads();
    if (threadIdx.x < ROWS * MB) {
        const int m = threadIdx.x / ROWS;
        const int n = n0 + threadIdx.x % ROWS;
        float s = partial[0][threadIdx.x];
#pragma unroll
        for (int v = 1; v < WARPS; ++v) s += partial[v][threadIdx.x];
        if (n < N) y[(long long)m * N + n] = activate(s + __ldg(bias + n));
    }
}
#endif
"""

from dataclasses import dataclass  # noqa: E402

import numpy as np  # noqa: E402

from ..gpu import hardware  # noqa: E402
from ..gpu.hardware import H100  # noqa: E402
from ..oracle.verify import Reference  # noqa: E402
from .base import (KernelSpec, LayerOp, activation_absolute, activation_label,  # noqa: E402
                   apply_activation, ceil_div, check_activation, compile_specs, spec)

GEMV_MAX_BATCH = 8  # up to here a batch is a few columns of a matrix-vector product
GEMV_ROWS = 4  # rows of w per block: each x load feeds 4 rows' FMAs
GEMV_WARPS = 8
BK = 8
# (BM, BN) tiles the GEMM is compiled for; 8 x 8 outputs per thread in all of them.
TILES = ((128, 128), (64, 128), (32, 128), (128, 64), (64, 64))
MIN_K_PER_SPLIT = 256  # 32 stages: a split's prologue and its workspace traffic stay small
MAX_REGISTERS = 128  # __launch_bounds__(THREADS, 512 / THREADS) caps every tile at 128
MAX_BLOCKS_PER_SM = 32  # sm_90
MAX_THREADS_PER_SM = 2048
REGISTERS_PER_SM = 65536
REDUCE_BLOCK = 256


@dataclass(frozen=True)
class DensePlan:
    """How a layer of (batch, inputs, outputs) is computed: 'gemv', or 'gemm' with a tile and
    k split into `splits` ranges of k_per_split."""

    kind: str
    tile_m: int = 0
    tile_n: int = 0
    splits: int = 1
    k_per_split: int = 0

    @property
    def threads(self) -> int:
        return GEMV_WARPS * 32 if self.kind == "gemv" else self.tile_m * self.tile_n // 64

    def describe(self) -> str:
        if self.kind == "gemv":
            return f"GEMV, {GEMV_ROWS} rows per block"
        split = f", split-K x{self.splits}" if self.splits > 1 else ""
        return f"GEMM {self.tile_m}x{self.tile_n} tiles{split}"


def gemv_plan() -> DensePlan:
    return DensePlan("gemv")


def gemm_plan(inputs: int, tile: tuple[int, int], splits: int = 1) -> DensePlan:
    """A GEMM plan with k cut into at most `splits` ranges of whole BK stages, none empty."""
    if tile not in TILES:
        raise ValueError(f"no GEMM tile {tile}; tiles: {TILES}")
    per_split = ceil_div(ceil_div(inputs, max(1, splits)), BK) * BK
    return DensePlan("gemm", tile[0], tile[1], ceil_div(inputs, per_split), per_split)


def resident_blocks(threads: int) -> int:
    """Blocks of a GEMM tile one SM holds: limited by threads and by registers at the cap."""
    return min(MAX_BLOCKS_PER_SM, MAX_THREADS_PER_SM // threads,
               REGISTERS_PER_SM // (threads * MAX_REGISTERS))


def pick_tile(batch: int, outputs: int) -> tuple[int, int]:
    """The smallest tile height that covers small batches (fewer zero rows computed), 128 from
    batch 65 on; 64 columns where the layer has at most 64 outputs."""
    if outputs <= 64:
        return (64, 64) if batch <= 64 else (128, 64)
    return (32 if batch <= 32 else 64 if batch <= 64 else 128), 128


def plan_dense(batch: int, inputs: int, outputs: int, sms: int = H100.sms) -> DensePlan:
    """GEMV up to GEMV_MAX_BATCH; else a GEMM tile, and split-K when the tiles fill fewer than
    the SMs' block slots: as many splits as fit the free slots, each at least MIN_K_PER_SPLIT
    long, so the grid is about one full wave."""
    if batch <= GEMV_MAX_BATCH:
        return gemv_plan()
    tile = pick_tile(batch, outputs)
    tiles = ceil_div(batch, tile[0]) * ceil_div(outputs, tile[1])
    slots = sms * resident_blocks(tile[0] * tile[1] // 64)
    splits = max(1, min(slots // tiles, inputs // MIN_K_PER_SPLIT))
    return gemm_plan(inputs, tile, splits)


def dense_kernels(batch: int, inputs: int, outputs: int, activation: str | None,
                  plan: DensePlan) -> list[KernelSpec]:
    """The kernels a prepared dense op launches, in order."""
    for n, what in ((batch, "batch"), (inputs, "inputs"), (outputs, "outputs")):
        if n < 1:
            raise ValueError(f"a dense layer needs a positive {what}, got {n}")
    defines = {"M": batch, "K": inputs, "N": outputs, "ACT": check_activation(activation),
               "VEC_K": int(inputs % 4 == 0), "VEC_N": int(outputs % 4 == 0)}
    if plan.kind == "gemv":
        if batch > GEMV_MAX_BATCH:
            raise ValueError(f"the GEMV takes at most {GEMV_MAX_BATCH} batch columns, got {batch}")
        defines |= {"MB": batch, "ROWS": GEMV_ROWS, "WARPS": GEMV_WARPS}
        return [spec("ops.dense", "dense_gemv", SOURCE, defines,
                     (ceil_div(outputs, GEMV_ROWS),), plan.threads)]
    if plan.k_per_split % BK or not (plan.splits - 1) * plan.k_per_split < inputs \
            <= plan.splits * plan.k_per_split:
        raise ValueError(f"{plan.describe()} with {plan.k_per_split} k per split does not cover "
                         f"{inputs} inputs exactly; make it with gemm_plan({inputs}, ...)")
    if ceil_div(batch, plan.tile_m) > 65535:
        raise ValueError(f"batch {batch} needs more than 65,535 rows of {plan.tile_m}-row tiles")
    defines |= {"BM": plan.tile_m, "BN": plan.tile_n, "BK": BK, "KSPLIT": plan.k_per_split,
                "SPLITS": plan.splits}
    grid = (ceil_div(outputs, plan.tile_n), ceil_div(batch, plan.tile_m), plan.splits)
    kernels = [spec("ops.dense", "dense_gemm", SOURCE, defines, grid, plan.threads)]
    if plan.splits > 1:
        kernels.append(spec("ops.dense", "dense_splitk_reduce", SOURCE, defines,
                            (ceil_div(batch * outputs, REDUCE_BLOCK),), REDUCE_BLOCK))
    return kernels


def dense_name(inputs: int, outputs: int, activation: str | None) -> str:
    name = f"FC {inputs}->{outputs}"
    return f"{name} + {activation_label(activation)}" if activation else name


def check_dense_weights(weight: np.ndarray, bias: np.ndarray) -> tuple[int, int]:
    if np.ndim(weight) != 2:
        raise ValueError(f"dense weights must be (out, in), got shape {np.shape(weight)}")
    outputs, inputs = np.shape(weight)
    if np.shape(bias) != (outputs,):
        raise ValueError(f"a bias of shape ({outputs},) is needed, got {np.shape(bias)}")
    return inputs, outputs


def prepare_dense(batch: int, weight: np.ndarray, bias: np.ndarray,
                  activation: str | None = None, *, plan: DensePlan | None = None) -> LayerOp:
    """y = activation(x @ weight.T + bias) for x (batch, in) on the device; weight (out, in)
    and bias (out,) are uploaded once, here. `plan` overrides the choice of plan_dense (tests
    run every path on one shape that way)."""
    import cupy

    inputs, outputs = check_dense_weights(weight, bias)
    plan = plan or plan_dense(batch, inputs, outputs, hardware.current().sms)
    specs = dense_kernels(batch, inputs, outputs, activation, plan)
    compiled = compile_specs(specs)
    w = cupy.asarray(np.ascontiguousarray(weight, dtype=np.float32))
    b = cupy.asarray(np.ascontiguousarray(bias, dtype=np.float32))
    (main_spec, main), *rest = compiled.kernels
    # float4 loads of x (VEC_K) and stores of y (VEC_N) fault on a misaligned view.
    vector_x, vector_y = inputs % 4 == 0, outputs % 4 == 0

    def check_alignment(x, y):
        if (vector_x and x.data.ptr % 16) or (vector_y and y.data.ptr % 16):
            raise ValueError("dense inputs and outputs must start on a 16-byte boundary")

    if plan.splits > 1:
        workspace = cupy.empty((plan.splits, batch, outputs), dtype=cupy.float32)
        reduce_spec, reduce = rest[0]

        def launch(x, y):
            check_alignment(x, y)
            main(main_spec.grid, main_spec.block, (x, w, b, workspace))
            reduce(reduce_spec.grid, reduce_spec.block, (workspace, b, y))
    else:
        def launch(x, y):
            check_alignment(x, y)
            main(main_spec.grid, main_spec.block, (x, w, b, y))

    return LayerOp(dense_name(inputs, outputs, activation), "fc", main_spec.function, launch,
                   (batch, outputs), compiled.seconds,
                   tuple(s.function for s, _ in rest))


def reference_dense(x: np.ndarray, weight: np.ndarray, bias: np.ndarray,
                    activation: str | None = None) -> Reference:
    """The float64 result. Each output sums in + 1 terms (the products and the bias) in some
    order, the GEMV's and split-K's included: the conv rule applies as it stands, with
    magnitude |x| @ |w|.T + |bias|. ReLU and tanh are 1-Lipschitz, so the sum's error passes
    through them no larger; tanhf adds its own (TANH_ABSOLUTE)."""
    x64 = np.asarray(x, dtype=np.float64)
    w64 = np.asarray(weight, dtype=np.float64)
    b64 = np.asarray(bias, dtype=np.float64)
    values = apply_activation(x64 @ w64.T + b64, activation)
    magnitude = np.abs(x64) @ np.abs(w64).T + np.abs(b64)
    return Reference(values, magnitude, w64.shape[1] + 1, activation_absolute(activation))
