"""winograd: F(2x2, 3x3) minimal filtering, a cuBLAS batched SGEMM between two transform kernels.

Precision class, decided by the verification rule before any GPU run. winograd_transforms.emulate
repeats the kernels' float32 arithmetic in NumPy (same matrices, same operation order, the GEMM in
float32); max bound_ratio under verify.compare(..., "fp32") over 3 draws of 4 images x 32
channels (random_problem data: mixed-sign x in [-1, 1), or same-sign x in [0, 1) with |w|; or
"zero patches": x nonzero only at rows and columns = 2 mod 4, so whole output windows and their
neighbours differ in magnitude):

    layer (n = C/G*9 + bias)   data          direct fp32   F(2x2)   F(3x3)    F(4x4)
    conv3  256->384 (2305)     mixed-sign    0.002         0.005    0.021     0.051
                               same-sign     0.021         0.068    0.084     0.072
                               zero patches  0.002         0.014    89        26
    conv4/5 C/G=192 (1729)     mixed-sign    0.003         0.005    0.045     0.080
                               same-sign     0.024         0.085    0.084     0.077
                               zero patches  0.004         0.015    75        47
    ResNet 64->64 (576)        mixed-sign    0.012         0.014    0.063     0.23
                               same-sign     0.076         0.082    0.11      0.13
                               zero patches  0.011         0.026    3e29      1e29
    C=1 (10), C=3 (28)         mixed-sign    0.14, 0.10    1.2, 0.11  1.9, 0.64  20, 4.3

F(2x2) is fp32 class: every output's arithmetic touches only the inputs of its own 3x3 window
(B^T's rows for points 0, 1, -1 and A^T's rows never reach past it), so its error follows that
window, amplified by the transforms' small integer coefficients: 0.085 of the bound at most on
the target layers. Over few input channels the amplification is not averaged out: with C/G = 1
it exceeds the bound (up to 1.6 on random data, 10-500 on zero patches), with 2-4 it passes
random data but not zero patches (up to 7.2); from 8 channels per group the worst of all four
data kinds is 0.26 (random data 0.16), so supports() refuses layers with fewer
(MIN_GROUP_CHANNELS). The transforms pair each filter tap with every input of the window,
products a direct convolution never forms, so filters whose only nonzero tap meets zero inputs
(an exact-zero reference) get a small rounding error: the table above was made against a rule
with no allowance for that; the rule now grants every element a sixteenth of the layer's mean
bound (verify.FLOOR_SHARE, needed for cuDNN's FFT on zero patches too), which covers it.
F(4x4) (and F(3x3)) are not offered: their transforms mix all 36 (25) inputs of a tile into
every output, so rounding errors of inputs outside an output's window reach it. On dense random
data over many channels that stays inside the bound, but where a window is small beside large
neighbours it does not: 26-89x the bound on the AlexNet layers with a bias, and an output whose
window is all zeros (reference exactly 0, no bias) gets a nonzero error that no precision class
of the rule admits. Dense data over few channels fails too (4.3x at C=3, 20x at C=1). With the
floor, F(4x4) on zero patches still exceeds the bound over 8-16 channels (3.2x, 1.5x) and passes
from 64: not a rule for every layer the rung would be offered on.

Predicted times on the H100 (2,984 GB/s copy, 51.4 TFLOP/s SGEMM), batch 128 (ResNet: 64),
from bytes and FLOPs: input_transform moves x + V, output_transform P + y at copy bandwidth;
the GEMM (2.25x fewer multiplies than direct on full tiles, 1.94x on 13x13 where 7x7 tiles
cover 14x14) runs at 85-100% of the SGEMM rate:
    conv3  0.49-0.56 ms (cuDNN fp32 0.49)   conv4 0.41-0.46 (1.30)   conv5 0.30-0.33 (0.81)
    ResNet 64->64 56x56: 0.31-0.32 ms (cuDNN fp32 0.38)
conv3 is the close one: 19.7 GFLOP of GEMM alone is 0.38 ms at the full SGEMM rate, and the
transforms' 312 MB cost another 0.10 ms.
"""

from .general import EPILOGUE_SOURCE

SOURCE = r"""
// winograd: changes from im2col -- fewer multiplies instead of a faster multiply. For a 3x3
// stride-1 layer each 2x2 output tile is A^T [ (G g G^T) .* (B^T d B) ] A over its 4x4 input
// tile d (Lavin & Gray 2016): 16 multiplies per tile and channel pair instead of 36, 2.25x fewer.
// Per transform position (16 of them) the products summed over input channels form a GEMM, so
// the work is: input_transform (x read once, zero padding as a predicate on the loads) writes
// V[position][c][tile]; one cuBLAS strided-batched SGEMM over (position, group) computes
// P[position][m][tile] = U[position][m][c of m's group] V[position][c][tile], with U = G g G^T
// transformed once on the host in float64; output_transform reads the 16 positions of a tile,
// applies A^T . A, adds the bias, applies the ReLU and writes y. Grouped layers need nothing in
// the kernels: channel c = g*C/G + c' and m = g*M/G + m', so V and P viewed as [position*G]
// [C/G or M/G][tile] are the per-group GEMM operands as they lie. Not F(4x4, 3x3), 4x fewer
// multiplies: its error fails the fp32 rule (the module's docstring has the numbers). The batch
// runs in chunks that bound the workspace (V and P).
// Compile-time: C, H, W, M, PAD, TILE (output tile side), BLOCK, BT_VALUES and AT_VALUES (the
// data-side transform matrices as brace initializers, from winograd_transforms.py), HAS_BIAS,
// RELU.
#define ALPHA (TILE + 2)
#define HO (H + 2 * PAD - 2)
#define WO (W + 2 * PAD - 2)
#define TILES_W ((WO + TILE - 1) / TILE)
#define TILES ((HO + TILE - 1) / TILE * TILES_W)  // tiles per image
""" + EPILOGUE_SOURCE + r"""
// sum_j c[j] * t[j] as fused multiply-adds in j order. The coefficients are compile-time
// constants and the loop is unrolled, so zero terms vanish and +-1 terms become adds.
template <int N>
__device__ __forceinline__ float dot_row(const float (&c)[N], const float (&t)[N])
{
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < N; ++j)
        if (c[j] != 0.0f) acc = fmaf(c[j], t[j], acc);
    return acc;
}

// One thread per (input channel, tile of the chunk); consecutive threads take consecutive tiles,
// so each of the thread's ALPHA*ALPHA stores is coalesced across the warp.
extern "C" __global__ void __launch_bounds__(BLOCK)
input_transform(const float* __restrict__ x, float* __restrict__ v, int b0, int tiles)
{
    constexpr float BT[ALPHA][ALPHA] = BT_VALUES;
    const int n = blockIdx.x * BLOCK + threadIdx.x;
    if (n >= tiles) return;
    const int c = blockIdx.y;
    const int t = n % TILES;
    const int h0 = t / TILES_W * TILE - PAD, w0 = t % TILES_W * TILE - PAD;
    const float* xc = x + ((long long)(b0 + n / TILES) * C + c) * (H * W);
    float d[ALPHA][ALPHA];
#pragma unroll
    for (int i = 0; i < ALPHA; ++i)
#pragma unroll
        for (int j = 0; j < ALPHA; ++j) {
            const int row = h0 + i, col = w0 + j;
            d[i][j] = ((unsigned)row < H && (unsigned)col < W) ? __ldg(xc + row * W + col) : 0.0f;
        }
    float s[ALPHA][ALPHA];  // B^T d
#pragma unroll
    for (int i = 0; i < ALPHA; ++i)
#pragma unroll
        for (int k = 0; k < ALPHA; ++k) {
            float column[ALPHA];
#pragma unroll
            for (int j = 0; j < ALPHA; ++j) column[j] = d[j][k];
            s[i][k] = dot_row(BT[i], column);
        }
    const long long plane = (long long)C * tiles;
    float* vc = v + (long long)c * tiles + n;
#pragma unroll
    for (int i = 0; i < ALPHA; ++i)
#pragma unroll
        for (int l = 0; l < ALPHA; ++l) vc[(i * ALPHA + l) * plane] = dot_row(BT[l], s[i]);
}

// One thread per (output channel, tile of the chunk): reads the tile's ALPHA*ALPHA products
// (coalesced across the warp), writes its TILE x TILE outputs with bias and ReLU.
extern "C" __global__ void __launch_bounds__(BLOCK)
output_transform(const float* __restrict__ p, const float* __restrict__ bias,
                 float* __restrict__ y, int b0, int tiles)
{
    constexpr float AT[TILE][ALPHA] = AT_VALUES;
    const int n = blockIdx.x * BLOCK + threadIdx.x;
    if (n >= tiles) return;
    const int m = blockIdx.y;
    const long long plane = (long long)M * tiles;
    const float* pm = p + (long long)m * tiles + n;
    float q[ALPHA][ALPHA];
#pragma unroll
    for (int i = 0; i < ALPHA; ++i)
#pragma unroll
        for (int j = 0; j < ALPHA; ++j) q[i][j] = __ldg(pm + (i * ALPHA + j) * plane);
    float s[TILE][ALPHA];  // A^T q
#pragma unroll
    for (int i = 0; i < TILE; ++i)
#pragma unroll
        for (int k = 0; k < ALPHA; ++k) {
            float column[ALPHA];
#pragma unroll
            for (int j = 0; j < ALPHA; ++j) column[j] = q[j][k];
            s[i][k] = dot_row(AT[i], column);
        }
    const int t = n % TILES;
    const int h0 = t / TILES_W * TILE, w0 = t % TILES_W * TILE;
    float* ym = y + ((long long)(b0 + n / TILES) * M + m) * (HO * WO);
#pragma unroll
    for (int i = 0; i < TILE; ++i)
#pragma unroll
        for (int l = 0; l < TILE; ++l)
            if (h0 + i < HO && w0 + l < WO)
                ym[(h0 + i) * WO + w0 + l] = finish_output(dot_row(AT[l], s[i]), bias, m);
}
"""

import contextlib  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import numpy as np  # noqa: E402

from .base import RELU, Arithmetic, Config, Op, Support, Variant, blocks, check_inputs  # noqa: E402
from .general import device_bias  # noqa: E402
from .winograd_transforms import c_initializer, transform_matrices, weight_transform  # noqa: E402

TILE = 2  # F(2x2, 3x3): see the module docstring for why not 4
POSITIONS = (TILE + 2) ** 2
MIN_GROUP_CHANNELS = 8  # below this the transforms' rounding exceeds the fp32 bound (docstring)
MAX_GRID_Y = 65535  # channels run along the grid's y dimension
BLOCKS = (128, 256)
WORKSPACE_BYTES = 256 * 1024 * 1024  # V and P of one chunk, the default bound
MAX_WORKSPACE_BYTES = 1024 * 1024 * 1024  # the largest chunk the tuner tries
CUBLAS_DEFAULT_MATH = 0  # cublasMath_t: FP32 routines compute in FP32


def tiles_per_image(shape) -> int:
    return -(-shape.Ho // TILE) * -(-shape.Wo // TILE)


def workspace_bytes(shape, chunk: int) -> int:
    """V (positions x C x tiles) and P (positions x M x tiles) for `chunk` images."""
    return 4 * POSITIONS * (shape.C + shape.M) * tiles_per_image(shape) * chunk


def balanced_chunk(batch: int, chunks: int) -> int:
    """Images per chunk when `batch` runs in `chunks` chunks of (nearly) equal size."""
    return -(-batch // min(batch, chunks))


@dataclass(frozen=True)
class WinogradConfig(Config):
    """Output tile (2: F(2x2,3x3)), images per chunk (one batched SGEMM each), threads per
    block of the transforms."""

    tile: int
    chunk: int
    block: int

    def problem(self) -> str:
        """Why no layer can run this config ('' when one can)."""
        if self.tile != TILE:
            return f"tile {self.tile}: only F({TILE}x{TILE},3x3) is implemented"
        if self.block not in BLOCKS:
            return f"block {self.block}: one of {', '.join(map(str, BLOCKS))}"
        if not isinstance(self.chunk, int) or self.chunk < 1:
            return f"chunk {self.chunk}: a whole number of images, 1 or more"
        return ""


def default_config(shape) -> WinogradConfig:
    """The fewest equal chunks whose workspace fits WORKSPACE_BYTES; 256 threads per block."""
    chunks = 1
    while chunks < shape.B and \
            workspace_bytes(shape, balanced_chunk(shape.B, chunks)) > WORKSPACE_BYTES:
        chunks += 1
    return WinogradConfig(TILE, balanced_chunk(shape.B, chunks), 256)


def valid_config(config: WinogradConfig, shape) -> bool:
    return not config.problem() and config.chunk <= shape.B


@contextlib.contextmanager
def fp32_gemm():
    """cupy.matmul on 3-D float32 arrays calls cublasGemmStridedBatchedEx with compute type
    CUDA_R_32F (CuPy 13-14; CUPY_TF32 and CuPy's compute-type table reach only its 2-D
    products), which cuBLAS runs in TF32 when the handle's math mode allows it. Pin both to
    FP32 for the call and restore what the process had."""
    import cupy
    from cupy._core import _routines_linalg as linalg

    handle = cupy.cuda.get_cublas_handle()
    mode = cupy.cuda.cublas.getMathMode(handle)
    compute = linalg.get_compute_type(np.float32)
    cupy.cuda.cublas.setMathMode(handle, CUBLAS_DEFAULT_MATH)
    linalg.set_compute_type(np.float32, linalg.COMPUTE_TYPE_DEFAULT)
    try:
        yield
    finally:
        linalg.set_compute_type(np.float32, compute)
        cupy.cuda.cublas.setMathMode(handle, mode)


class Winograd(Variant):
    name = "winograd"
    summary = "F(2x2,3x3): transform kernels around one cuBLAS batched SGEMM per chunk"
    source = SOURCE
    kernels = ("input_transform", "output_transform")
    general = frozenset({"pad", "groups", "bias"})
    epilogues = (RELU,)

    def __init__(self, chunk: int | None = None, block: int | None = None):
        """Fix the images per chunk or the threads per block instead of the per-shape choice."""
        self.chunk, self.block = chunk, block

    def arithmetic(self, shape):
        """The batched SGEMM's products: 16 transformed points per 2x2 output tile (a direct
        conv forms 36 products for the same four outputs); the transforms' few adds are left
        out, so the floor stays a lower bound."""
        tiles = -(-shape.Ho // 2) * -(-shape.Wo // 2)
        return Arithmetic("fp32", 2 * 16 * tiles * shape.B * shape.M * shape.Cg, "FP32 F(2x2)")

    def supports(self, shape):
        if shape.kernel_text() != "3x3" or shape.dilation != 1:
            dilated = f" dilated {shape.dilation}x" if shape.dilation != 1 else ""
            return Support(False, f"Winograd F(2x2,3x3) needs an undilated 3x3 kernel, not "
                                  f"{shape.kernel_text()}{dilated}")
        if shape.stride != 1:
            return Support(False, f"Winograd F(2x2,3x3) needs stride 1, not {shape.stride}")
        if shape.Cg < MIN_GROUP_CHANNELS:
            return Support(False, f"{shape.Cg} input channel(s) per group: below "
                                  f"{MIN_GROUP_CHANNELS} the transforms' rounding exceeds the "
                                  f"fp32 bound")
        if max(shape.C, shape.M) > MAX_GRID_Y:
            return Support(False, f"more than {MAX_GRID_Y} channels (the grid's y dimension)")
        return super().supports(shape)

    config_type = WinogradConfig

    def fixed_config(self):
        return {k: v for k, v in (("tile", TILE), ("chunk", self.chunk), ("block", self.block))
                if v is not None}

    def default_config(self, shape, epilogue=None):
        return default_config(shape)

    def accepts(self, config, shape, epilogue=None):
        return valid_config(config, shape)

    def configs(self, shape, epilogue=None):
        first = default_config(shape)
        chunks = sorted({first.chunk} | {balanced_chunk(shape.B, k) for k in (1, 2, 4, 8, 16)},
                        reverse=True)
        space = [WinogradConfig(TILE, c, b) for c in chunks for b in BLOCKS
                 if workspace_bytes(shape, c) <= MAX_WORKSPACE_BYTES]
        return [first] + [c for c in space if c != first]

    def configured(self, config):
        config = WinogradConfig.of(config)
        if config.problem():
            raise ValueError(f"not a winograd configuration: {config.problem()}")
        return Winograd(chunk=config.chunk, block=config.block)

    def defines(self, shape, epilogue=None):
        t = transform_matrices(TILE)
        return {"C": shape.C, "H": shape.H, "W": shape.W, "M": shape.M, "PAD": shape.pad,
                "TILE": TILE, "BLOCK": self.config_for(shape, epilogue).block,
                "BT_VALUES": c_initializer(t.BT), "AT_VALUES": c_initializer(t.AT),
                "HAS_BIAS": int(shape.bias), "RELU": int(epilogue == RELU)}

    def prepare(self, shape, weights, epilogue=None, bias=None):
        import cupy

        check_inputs(self, shape, epilogue, bias)
        config = self.config_for(shape, epilogue)
        chunk, block = config.chunk, config.block
        compiled = self.compile(shape, epilogue)
        input_transform = compiled.module.get_function("input_transform")
        output_transform = compiled.module.get_function("output_transform")
        G = shape.groups
        u = cupy.asarray(weight_transform(weights, TILE)).reshape(POSITIONS * G, shape.Mg, shape.Cg)
        b = device_bias(bias)
        per_image = tiles_per_image(shape)
        v_space = cupy.empty(POSITIONS * shape.C * per_image * chunk, dtype=cupy.float32)
        p_space = cupy.empty(POSITIONS * shape.M * per_image * chunk, dtype=cupy.float32)
        steps = []
        for b0 in range(0, shape.B, chunk):
            tiles = min(chunk, shape.B - b0) * per_image
            v = v_space[:POSITIONS * shape.C * tiles].reshape(POSITIONS * G, shape.Cg, tiles)
            p = p_space[:POSITIONS * shape.M * tiles].reshape(POSITIONS * G, shape.Mg, tiles)
            steps.append((np.int32(b0), np.int32(tiles), v, p, blocks(tiles, block)))

        def launch(x, y):
            with fp32_gemm():
                for b0, tiles, v, p, grid_x in steps:
                    input_transform((grid_x, shape.C), (block,), (x, v, b0, tiles))
                    cupy.matmul(u, v, out=p)
                    output_transform((grid_x, shape.M), (block,), (p, b, y, b0, tiles))

        # CuPy refuses cuBLAS calls during stream capture: no CUDA graph holds this op.
        return Op(launch, shape.output_shape, compiled.seconds, epilogue, capturable=False)
