"""depthwise: a direct convolution over NHWC for depthwise layers (one input and one output
channel a group), on CUDA cores, in FP32, FP16 and BF16 storage with FP32 arithmetic."""

from ..gpu.elements import ELEMENT_SOURCE
from .general import EPILOGUE_SOURCE

SOURCE = (r"""
// depthwise: changes from wgmma -- a depthwise layer is no GEMM worth the tensor cores: each
// output channel reads one input channel, so its reduction is the K*K taps alone. The implicit
// GEMM pads that one channel to a 128-byte chunk and fills one row of a 64-row filter tile per
// group: 2.6-3.6 ms on a layer whose bytes take 0.05 (H200, 2026-11-26). Here a block owns a
// tile of ROWS x COLS output pixels by LANES*VEC channels. It copies the input patch under it
// (((ROWS-1)*STRIDE+K) x ((COLS-1)*STRIDE+K) pixels of those channels, contiguous in NHWC)
// into shared memory with cp.async: every copy in flight at once, 16 bytes each where the
// channels allow whatever a thread's vector, taps past the input zero-filled by the copy
// itself. Then each thread computes VEC channels of one output column over the ROWS rows from
// it, its filters in registers, walking the patch's rows once and adding each into every
// output row whose window holds it. DRAM sees the input about once (the halos are read again
// from L2) and the output once: the layer is bound by memory, as cuDNN's is. A first version
// without the patch, each thread loading its own window through L1, reached 88% of the copy
// rate in fp32 but 60% in fp16 on an H100 (2026-11-26): its loads in flight were limited by
// its registers, and halving the bytes per load halved the bytes in flight.
//
// Compile-time: C (= M, the channels and groups), CP (the staged input's channels per pixel,
// C padded to 8 bytes), H, W, K, STRIDE, PAD, HO, WO, VEC (channels a thread), LANES (threads
// along the channels), COLS (output columns a block, one per thread), ROWS (output rows a
// block, all of a thread's), COPY_VEC (elements a copy: it divides LANES*VEC and CP, so a
// copy that starts below C ends within the staged pixel), MODE (the staged input: 0 float32,
// 1 fp16, 2 bf16 bits), HAS_BIAS, RELU, OUT_HALF.
""" + EPILOGUE_SOURCE + ELEMENT_SOURCE + r"""
template <int BYTES> struct raw;
template <> struct raw<2> { typedef unsigned short t; };
template <> struct raw<4> { typedef unsigned int t; };
template <> struct raw<8> { typedef uint2 t; };
template <> struct raw<16> { typedef uint4 t; };

#if MODE == 0
typedef float elem_t;
#define ELEM_BYTES 4
#else
typedef unsigned short elem_t;
#define ELEM_BYTES 2
#endif

__device__ __forceinline__ float element(elem_t e)
{
#if MODE == 0
    return e;
#elif MODE == 1
    float v;
    asm("cvt.f32.f16 %0, %1;" : "=f"(v) : "h"(e));
    return v;
#else
    return bf16_to_float(e);
#endif
}

#define IN_BYTES (VEC * ELEM_BYTES)
#define COPY_BYTES (COPY_VEC * ELEM_BYTES)
// An fp32 output of 8 fp16 channels is 32 bytes: stored as 16-byte vectors.
#define OUT_ELEM_BYTES (OUT_HALF ? 2 : 4)
#define OUT_BYTES (VEC * OUT_ELEM_BYTES < 16 ? VEC * OUT_ELEM_BYTES : 16)
#define OUT_STEP (OUT_BYTES / OUT_ELEM_BYTES)
typedef raw<IN_BYTES>::t in_vec;
typedef raw<COPY_BYTES>::t copy_vec;
typedef raw<OUT_BYTES>::t out_vec;
#define CB (LANES * VEC)
#define CHUNKS ((C + CB - 1) / CB)
#define SPAN_H ((ROWS - 1) * STRIDE + K)
#define SPAN_W ((COLS - 1) * STRIDE + K)

// COPY_VEC elements of the patch: copied asynchronously (zero-filled outside the input), or,
// as one 2-byte element (a block of an odd count of 16-bit channels), below cp.async's 4-byte
// minimum, through a register.
__device__ __forceinline__ void copy_vector(elem_t* dst, const elem_t* src, bool inside)
{
#if COPY_BYTES >= 4
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;"
                 :: "r"(s), "l"(src), "n"(COPY_BYTES), "r"(inside ? COPY_BYTES : 0));
#else
    *reinterpret_cast<copy_vec*>(dst) = inside ? __ldg(reinterpret_cast<const copy_vec*>(src))
                                               : (copy_vec)0;
#endif
}

extern "C" __global__ void __launch_bounds__(LANES * COLS)
conv_forward(const elem_t* __restrict__ x, const float* __restrict__ w,
             const float* __restrict__ bias, out_t* __restrict__ y)
{
    extern __shared__ __align__(16) unsigned char shared[];
    elem_t* patch = reinterpret_cast<elem_t*>(shared);  // [SPAN_H][SPAN_W][CB]
    const int c0 = (blockIdx.x % CHUNKS) * CB;
    const int ow0 = (blockIdx.x / CHUNKS) * COLS, oh0 = blockIdx.y * ROWS;
    const long long b = blockIdx.z;
    const int ih0 = oh0 * STRIDE - PAD, iw0 = ow0 * STRIDE - PAD;
    const elem_t* image = x + b * ((long long)H * W * CP);

    for (int i = threadIdx.x; i < SPAN_H * SPAN_W * (CB / COPY_VEC); i += LANES * COLS) {
        const int part = i % (CB / COPY_VEC), pixel = i / (CB / COPY_VEC);
        const int ih = ih0 + pixel / SPAN_W, iw = iw0 + pixel % SPAN_W, c = c0 + part * COPY_VEC;
        const bool inside = c < C && (unsigned)ih < (unsigned)H && (unsigned)iw < (unsigned)W;
        copy_vector(patch + pixel * CB + part * COPY_VEC,
                    inside ? image + ((long long)ih * W + iw) * CP + c : x, inside);
    }
#if COPY_BYTES >= 4
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;" ::: "memory");
#endif
    __syncthreads();

    const int lane = threadIdx.x % LANES, col = threadIdx.x / LANES;
    const int m0 = c0 + lane * VEC, ow = ow0 + col;
    if (m0 >= C || ow >= WO) return;  // no barrier follows
    float f[K * K][VEC];
#pragma unroll
    for (int t = 0; t < K * K; ++t)
#pragma unroll
        for (int e = 0; e < VEC; ++e) f[t][e] = __ldg(w + t * C + m0 + e);
    float acc[ROWS][VEC];
#pragma unroll
    for (int j = 0; j < ROWS; ++j)
#pragma unroll
        for (int e = 0; e < VEC; ++e) acc[j][e] = 0.0f;

    const elem_t* mine = patch + col * STRIDE * CB + lane * VEC;
#pragma unroll
    for (int r = 0; r < SPAN_H; ++r) {
#pragma unroll
        for (int q = 0; q < K; ++q) {
            union {
                in_vec r;
                elem_t e[VEC];
            } u;
            u.r = *reinterpret_cast<const in_vec*>(mine + (r * SPAN_W + q) * CB);
            float v[VEC];
#pragma unroll
            for (int e = 0; e < VEC; ++e) v[e] = element(u.e[e]);
#pragma unroll
            for (int j = 0; j < ROWS; ++j) {
                const int p = r - j * STRIDE;  // the filter row patch row r is to output row j
                if (p >= 0 && p < K) {
#pragma unroll
                    for (int e = 0; e < VEC; ++e) acc[j][e] = fmaf(f[p * K + q][e], v[e], acc[j][e]);
                }
            }
        }
    }

#pragma unroll
    for (int j = 0; j < ROWS; ++j) {
        const int oh = oh0 + j;
        if (oh >= HO) break;
        out_t* out = y + ((b * HO + oh) * WO + ow) * (long long)C + m0;
#pragma unroll
        for (int c = 0; c < VEC; c += OUT_STEP) {
            union {
                out_vec r;
                out_t e[OUT_STEP];
            } u;
#pragma unroll
            for (int e = 0; e < OUT_STEP; ++e)
                u.e[e] = to_out(finish_output(acc[j][c + e], bias, m0 + c + e));
            *reinterpret_cast<out_vec*>(out + c) = u.r;
        }
    }
}
""")

from dataclasses import dataclass, replace  # noqa: E402

import numpy as np  # noqa: E402

from ..errors import ConvlabError  # noqa: E402
from ..gpu.elements import FLOAT16, FLOAT32, STAGE_MODES, element_defines  # noqa: E402
from ..shapes import SQUARE_FEATURES, NHWC, ConvShape, is_channels_last  # noqa: E402
from .base import (RELU, Arithmetic, Config, Op, Support, Variant, blocks,  # noqa: E402
                   check_inputs, check_supported)
from .general import device_bias, layer_defines  # noqa: E402
from .igemm.packing import to_bf16_bits  # noqa: E402
from .igemm.staging import ChannelsLastStaging, stage_dtype  # noqa: E402
from .igemm.tiling import element_bytes, padded_group_channels  # noqa: E402

# Filter registers a thread holds (K*K taps of VEC channels): the heuristic's budget, and any
# tile's. Accumulators (ROWS rows of VEC channels) at most MAX_ACCUMULATORS.
FILTER_REGISTERS = 32
MAX_FILTER_REGISTERS = 128
MAX_ACCUMULATORS = 64
MAX_THREADS = 1024
MAX_SMEM = 200 * 1024
# The heuristic's patch: four blocks an SM. On an H100 (2026-11-26) the strided 3x3 layer's
# fp16 sweep was fastest at a 36 KB patch (8 rows), 8% ahead of the 72 KB one (16 rows).
PATCH_BUDGET = 48 * 1024
MAX_GRID_YZ = 65535
ROW_CHOICES = (4, 8, 16)
COL_CHOICES = (8, 16)


@dataclass(frozen=True)
class BlockTile(Config):
    """A block's output tile: `rows` x `cols` pixels; each thread computes `vec` neighbouring
    channels of one column over all the rows (lanes() threads share the channels)."""
    vec: int
    rows: int
    cols: int


def widest_vector(maths: str) -> int:
    return 16 // element_bytes(maths)


def lanes(shape: ConvShape, vec: int, maths: str) -> int:
    """Threads along the channels: the layer's vectors split into the fewest chunks of at most
    a warp's 32, evenly (144 channels of 2: three chunks of 24, not 32 + 32 + 8), rounded up
    to whole 16-byte copies where the pixels are (144 of 1: 32, not 29)."""
    vectors = blocks(shape.C, vec)
    even = blocks(vectors, blocks(vectors, 32))
    if shape.C % widest_vector(maths):
        return even
    unit = max(1, widest_vector(maths) // vec)
    return min(32, blocks(even, unit) * unit)


def patch_bytes(shape: ConvShape, t: BlockTile, maths: str) -> int:
    """The shared-memory patch: the input pixels under the tile, lanes()*vec channels each."""
    span_h = (t.rows - 1) * shape.stride + shape.K
    span_w = (t.cols - 1) * shape.stride + shape.K
    return span_h * span_w * lanes(shape, t.vec, maths) * t.vec * element_bytes(maths)


def copy_vector(shape: ConvShape, t: BlockTile, maths: str, staged: int) -> int:
    """Elements a patch copy moves: the widest power of two up to 16 bytes that divides both a
    block's channels and the staged pixel's (`staged`)."""
    block = lanes(shape, t.vec, maths) * t.vec
    vec = widest_vector(maths)
    while block % vec or staged % vec:
        vec //= 2
    return vec


def tile_problem(t: BlockTile, maths: str, shape: ConvShape | None = None) -> str:
    """Why `t` cannot run (on `shape`, where given), or ""."""
    widest = widest_vector(maths)
    if any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in (t.vec, t.rows, t.cols)):
        return "vec, rows and cols must be positive integers"
    if t.vec > widest or t.vec & (t.vec - 1):
        return f"vec must be a power of two up to {widest} (a 16-byte vector)"
    if t.vec * t.rows > MAX_ACCUMULATORS:
        return f"vec x rows = {t.vec * t.rows} accumulators, more than {MAX_ACCUMULATORS}"
    if shape is None:
        return ""
    if shape.C % t.vec:
        return f"vec {t.vec} does not divide the {shape.C} channels"
    if t.vec > 1 and t.vec * shape.K * shape.K > MAX_FILTER_REGISTERS:
        return (f"vec {t.vec} holds {t.vec * shape.K * shape.K} filter registers at "
                f"{shape.K}x{shape.K}, more than {MAX_FILTER_REGISTERS}")
    if lanes(shape, t.vec, maths) * t.cols > MAX_THREADS:
        return f"{lanes(shape, t.vec, maths) * t.cols} threads a block, more than {MAX_THREADS}"
    if patch_bytes(shape, t, maths) > MAX_SMEM:
        return f"a {patch_bytes(shape, t, maths)}-byte patch, more than {MAX_SMEM}"
    return ""


def heuristic_tile(shape: ConvShape, maths: str) -> BlockTile:
    """Two channels a thread where the channels and FILTER_REGISTERS allow (3x3), else one; as
    many columns as make 256 threads a block (or the layer's); 16 rows (or the layer's),
    halved down to 4 while the patch passes PATCH_BUDGET (strided layers), then the columns.
    The tile sweeps of 2026-11-26
    on an H100 (3x3, 5x5 and 7x7 depthwise layers, fp32 and fp16) had their fastest tiles
    there, or within 2% of it: wider vectors hold more filters, fewer blocks fit an SM, and
    the 16-byte copies do not need them."""
    vec = 2
    while vec > 1 and (shape.C % vec or vec * shape.K * shape.K > FILTER_REGISTERS):
        vec //= 2
    cols = max(1, min(256 // lanes(shape, vec, maths), shape.Wo))
    tile = BlockTile(vec, min(16, shape.Ho), cols)
    while patch_bytes(shape, tile, maths) > PATCH_BUDGET and (tile.rows > 4 or tile.cols > 1):
        tile = (BlockTile(vec, tile.rows // 2, cols) if tile.rows > 4
                else BlockTile(vec, tile.rows, tile.cols // 2))
    return tile


def grid(shape: ConvShape, t: BlockTile, maths: str) -> tuple[int, int, int]:
    """(channel chunks x column tiles, row tiles, images)."""
    chunks = blocks(shape.C, lanes(shape, t.vec, maths) * t.vec)
    return (chunks * blocks(shape.Wo, t.cols), blocks(shape.Ho, t.rows), shape.B)


def rounded_filters(weights: np.ndarray, maths: str) -> np.ndarray:
    """The filters at the precision the class stores them (fp16 or bf16 values), as float32."""
    w = np.asarray(weights, dtype=np.float32)
    if maths == "fp16":
        return w.astype(np.float16).astype(np.float32)
    if maths == "bf16":
        return (to_bf16_bits(w).astype(np.uint32) << 16).view(np.float32)
    return w


def tap_major(weights: np.ndarray, shape: ConvShape) -> np.ndarray:
    """(C, 1, K, K) -> [K*K][C]: a tap's filters for neighbouring channels are contiguous."""
    return np.ascontiguousarray(np.asarray(weights, np.float32).reshape(shape.M, -1).T)


class Depthwise(Variant):
    name = "depthwise"
    summary = "direct depthwise conv over NHWC, input patches in shared memory, CUDA-core FP32"
    precision = "fp32"
    maths = "fp32"
    source = SOURCE
    layout = NHWC
    general = SQUARE_FEATURES
    epilogues = (RELU,)
    output_dtypes = (FLOAT32, FLOAT16)
    config_type = BlockTile

    def __init__(self, config: BlockTile | dict | None = None, output_dtype=FLOAT32):
        """Without a config, each layer gets its tuned tile, else `heuristic_tile`'s."""
        self.output_dtype = np.dtype(output_dtype)
        self.tile = None
        if config is not None:
            tile = BlockTile.of(config)
            problem = tile_problem(tile, self.maths)
            if problem:
                raise ValueError(f"invalid {self.name} config {tile.as_dict()}: {problem}")
            self.tile = tile

    def _writing(self, dtype):
        return type(self)(self.tile, dtype)

    def configured(self, config):
        return type(self)(config, self.output_dtype)

    def fixed_config(self):
        return {} if self.tile is None else self.tile.as_dict()

    def default_config(self, shape, epilogue=None):
        return heuristic_tile(shape, self.maths)

    def accepts(self, config, shape, epilogue=None):
        return not tile_problem(config, self.maths, shape)

    def configs(self, shape, epilogue=None):
        """The heuristic's tile first, then every other of ROW_CHOICES x COL_CHOICES x the
        vectors that runs the layer."""
        first = heuristic_tile(shape, self.maths)
        vecs = [v for v in (1, 2, 4, 8) if v <= widest_vector(self.maths)]
        rows = sorted({min(r, shape.Ho) for r in ROW_CHOICES})
        tiles = [BlockTile(v, r, c) for v in vecs for r in rows for c in COL_CHOICES]
        return [first, *(t for t in tiles
                         if t != first and not tile_problem(t, self.maths, shape))]

    def arithmetic(self, shape):
        """FP32 FMAs on CUDA cores in every class: the 16-bit classes store 16-bit values only."""
        return Arithmetic("fp32", shape.flops, "FP32")

    def supports(self, shape):
        base = super().supports(shape)
        if not base:
            return base
        if shape.Cg != 1 or shape.Mg != 1:
            return Support(False, f"runs depthwise layers (one input and one output channel a "
                                  f"group); this layer has {shape.Cg} input and {shape.Mg} "
                                  f"output channels a group: the implicit GEMM variants run it")
        t = self.config_for(shape)
        problem = tile_problem(t, self.maths, shape)
        if problem:
            return Support(False, problem)
        if max(grid(shape, t, self.maths)[1:]) > MAX_GRID_YZ:
            return Support(False, f"more than {MAX_GRID_YZ} images or row tiles")
        return Support(True)

    def input_dtype(self):
        return np.dtype(stage_dtype(self.maths))

    def staged_channels(self, shape: ConvShape) -> int:
        return padded_group_channels(shape.C, self.maths)

    def defines(self, shape, epilogue=None):
        t = self.config_for(shape, epilogue)
        return {"C": shape.C, "CP": self.staged_channels(shape), "H": shape.H, "W": shape.W,
                "K": shape.K, "HO": shape.Ho, "WO": shape.Wo, "VEC": t.vec, "ROWS": t.rows,
                "COLS": t.cols, "LANES": lanes(shape, t.vec, self.maths),
                "COPY_VEC": copy_vector(shape, t, self.maths, self.staged_channels(shape)),
                "MODE": STAGE_MODES.get(self.maths, 0),
                **layer_defines(shape, epilogue), **element_defines(FLOAT32, self.output_dtype)}

    def prepare(self, shape, weights, epilogue=None, bias=None):
        check_inputs(self, shape, epilogue, bias)
        check_supported(self, shape)
        import cupy

        t = self.config_for(shape, epilogue)
        compiled = self.compile(shape, epilogue)
        kernel = compiled.module.get_function("conv_forward")
        smem = patch_bytes(shape, t, self.maths)
        kernel.max_dynamic_shared_size_bytes = smem
        w = cupy.asarray(tap_major(rounded_filters(weights, self.maths), shape))
        b = device_bias(bias)
        launch_grid = grid(shape, t, self.maths)
        block = (lanes(shape, t.vec, self.maths) * t.cols,)
        dtype, cp, maths = self.input_dtype(), self.staged_channels(shape), self.maths
        # The staging treats the layer as one group of C channels: no group is padded alone.
        ungrouped = replace(shape, groups=1)
        name = self.name

        def launch(x, y):
            if x.dtype != dtype or x.ndim != 4 or x.shape[1] != cp or not is_channels_last(x):
                raise ConvlabError(f"'{name}' reads a channels-last {dtype} input of {cp} "
                                   f"channels, got {x.dtype} of shape {tuple(x.shape)}, strides "
                                   f"{tuple(x.strides)}: pass op.stage(x)")
            kernel(launch_grid, block, (x, w, b, y), shared_mem=smem)

        return Op(launch, shape.output_shape, compiled.seconds, epilogue,
                  ChannelsLastStaging(ungrouped, cp, maths),
                  layout=NHWC, output_dtype=self.output_dtype)


class DepthwiseFP16(Depthwise):
    name = "depthwise-fp16"
    summary = "depthwise on fp16 inputs and filters, FP32 arithmetic on CUDA cores"
    precision = "fp16"
    maths = "fp16"


class DepthwiseBF16(Depthwise):
    name = "depthwise-bf16"
    summary = "depthwise on bf16 inputs and filters, FP32 arithmetic on CUDA cores"
    precision = "bf16"
    maths = "bf16"
