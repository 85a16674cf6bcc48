"""pipelined: CUTLASS-style implicit-GEMM convolution on tensor cores, one source, four maths.

MODE 0 TF32 (mma.m16n8k8), 1 error-compensated 3xTF32, 2 FP16 and 3 BF16 (mma.m16n8k16, FP32
accumulation). The kernel is composed from the pieces in `kernels/igemm/` (mainloop, gather,
split-K reduce, epilogue). The tiling (block tile, warp grid, K-tile, stages, split-K, gather
order) is a compile-time choice: `configs()` lists the ones worth trying for a shape,
`configured()` fixes one, and without a fixed one a cost model (`igemm.cost.estimate`) picks it.
"""

from ..gpu.elements import ELEMENT_SOURCE
from .general import EPILOGUE_SOURCE
from .igemm import epilogue, gather, mainloop, splitk, tile_walks

SOURCE = (r"""
// pipelined: changes from tensorcore -- that kernel staged a block's input rows in shared memory
// once and gathered every MMA operand from there through an offset table: two shared loads per
// MMA kept it bound by the load/store unit (29% of its floor). Here each operand tile is copied
// global -> shared with cp.async, STAGES tiles in flight, one barrier per K-tile, and read back
// in fragment form with a single conflict-free load per fragment register (A: one 16-byte load,
// packed by the host in fragment order; B: rows padded to BN+8 so the 32 lanes of a fragment
// read hit 32 banks; FP16: ldmatrix.trans). Warp tiles up to 64x64 feed 32 MMAs per 16 fragment
// loads, so the tensor pipe, not shared memory, sets the pace. The im2col operand B is gathered
// on the fly: with GATHER_TAP the K order is (channel chunk, filter tap, channel), so a
// thread's BK/..-element column of a K-tile shares one tap: one bounds test and one address per
// column, then a 4-byte cp.async per element at a compile-time stride (src-size 0 writes the
// zeros of the padding); otherwise (few channels, e.g. AlexNet conv1) K runs in the weights'
// own (c, p, q) order and a table gives each k its offset and (p, q). Groups, M-tiles, N-tiles
// and K-splits are one launch; split-K partial tiles are reduced by the last block to finish,
// in split order (deterministic). The epilogue stages the tile in shared memory so stores run
// along pixels, adds the bias and applies ReLU.
//
// Compile-time: C H W M KH KW STRIDE PAD_H PAD_W DIL G (shape), HAS_BIAS RELU, MODE, BM BN BK
// WARPS_M WARPS_N STAGES SPLIT_K GATHER_TAP (tiling), NHWC 0 (channels_last.py composes the
// NHWC kernel), IN_HALF 0, OUT_HALF and BF16_BITS (the output as fp16 or bf16 bits, for a conv
// of that class after it: `writing`), and PERSISTENT 0, PINGPONG 0, SWIZZLE 0, CLUSTER 1 and
// GATHER_TMA 0: the shared pieces and the kernel's entry read the wgmma schedules' switches
// too, and every build passes them, so no piece defaults one.
"""
          + mainloop.GEOMETRY + mainloop.INSTRUCTIONS + tile_walks.SOURCE + splitk.SPLIT_K_LAST
          + gather.NCHW_GATHER
          + EPILOGUE_SOURCE + ELEMENT_SOURCE + epilogue.KEPT_SOURCE + epilogue.STAGED_STORE
          + mainloop.filled(mainloop.GRID_KERNEL, BODY=gather.START + mainloop.LOAD_A
                            + gather.LOAD_TILE + mainloop.COMPUTE + mainloop.PIPELINE
                            + splitk.SPLIT_K_REDUCE + epilogue.STORE_STAGED)
          + mainloop.GRID_ENTRY)

import dataclasses  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import numpy as np  # noqa: E402

from ..errors import ConvlabError  # noqa: E402
from ..gpu.elements import (BFLOAT16, FLOAT16, FLOAT32, HALF_TYPES,  # noqa: E402
                             element_defines)
from ..shapes import NCHW, SQUARE_FEATURES, ConvShape, memory_view  # noqa: E402
from .base import (ADD_RELU, RELU, Arithmetic, Op, Support, Variant, check_inputs,  # noqa: E402
                   check_supported, device_weights, direct_arithmetic, split_tf32_arithmetic)
from .igemm.cost import diverse, estimate, ranked  # noqa: E402
from .igemm.gather import gather_table  # noqa: E402
from .igemm.mma_sync import FAMILIES  # noqa: E402
from .igemm.packing import pack_weights  # noqa: E402
from .igemm.staging import NchwStaging, stage_dtype  # noqa: E402
from .igemm.splitk import installed_scratch  # noqa: E402
from .igemm.tiling import (MAX_CONFIGS, MODES, Tiling, k_step, m_tiles, n_tiles,  # noqa: E402
                           output_tiles, shape_problem, smem_bytes, tiling_problem)

# A null pointer, for the kernel parameters a launch's build never reads (the gather table of
# a tap gather, the bias of a conv without one, split-K's arrays when unsplit, the kept
# activation of a conv that adds none): a placeholder array would hold 512 bytes of the pool
# for each, in every op. CuPy passes a NumPy scalar's 8 bytes as they are.
UNREAD = np.uint64(0)

# --- the variants -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Form:
    """One registered member of an implicit-GEMM family (kernels.IGEMM_FORMS): its name and
    line, its precision class, the maths its MMAs do (igemm.tiling.MODES) and, for the fp32
    class on wgmma, whether 3xTF32's cross products run in BF16."""

    name: str
    summary: str
    precision: str
    maths: str
    cross_bf16: bool = False

    def arithmetic(self, shape: ConvShape) -> Arithmetic:
        """What the floor counts: three TF32 products per FP32 one for 3xTF32, one TF32 and
        two BF16 products (counted as two TF32 ones' worth) with the cross products in BF16."""
        if self.cross_bf16:
            return Arithmetic("tf32", 2 * shape.flops, "TF32+2xBF16")
        if self.maths == "3xtf32":
            return split_tf32_arithmetic(shape)
        return direct_arithmetic(shape, self.precision)


class NchwActivations:
    """The activations as the network holds them (NCHW): the kernel reads the layer as it is,
    square filters only, a gather table where K runs in the weights' own order, and fp16/bf16
    inputs converted once outside the kernel."""

    layout = NCHW
    source = SOURCE
    general = SQUARE_FEATURES
    runs_dense = False
    epilogues = (RELU,)

    def kernel_shape(self, shape: ConvShape, maths: str) -> ConvShape:
        return shape

    def defines(self, k: ConvShape, maths: str) -> dict[str, int]:
        return {"NHWC": 0}

    def gather_table(self, shape: ConvShape, t: Tiling, maths: str) -> np.ndarray:
        return gather_table(shape, t)

    def stager(self, shape: ConvShape, maths: str):
        """The Op's stage_input: fp16/bf16 conversion of the NCHW input (None for 4-byte maths)."""
        if maths not in ("fp16", "bf16"):
            return None
        return NchwStaging(maths)

    def input_problem(self, x, k: ConvShape, name: str) -> str:
        return ""


NCHW_ACTIVATIONS = NchwActivations()


class Pipelined(Variant):
    """The implicit GEMM on `mma.sync`, one family for every maths and both layouts: a Form
    (name, precision, maths) and the activations it reads (NCHW here, channels-last in
    `channels_last`, which change the gather, the epilogue and the staging)."""

    config_type = Tiling
    output_dtypes = (FLOAT32, FLOAT16, BFLOAT16)
    # What each member takes from its Form and its activations, not from its class
    FROM_FORM = ("name", "summary", "precision", "maths", "layout", "general", "runs_dense",
                 "epilogues")

    def __init_subclass__(cls, **kwargs):
        """A subclass that sets one of FROM_FORM as a class attribute would see it silently
        replaced by its Form's: refused when the class is made, with what to write instead."""
        super().__init_subclass__(**kwargs)
        clashing = [attr for attr in cls.FROM_FORM if attr in cls.__dict__]
        if clashing:
            raise TypeError(f"{cls.__name__} sets {', '.join(clashing)} as class attributes; a "
                            f"{Pipelined.__name__} family member takes them from its Form and "
                            "activations: pass dataclasses.replace(form, "
                            f"{clashing[0]}=...) to its constructor instead (`convlab new` "
                            "writes it that way)")

    def __init__(self, form: Form, activations=NCHW_ACTIVATIONS,
                 config: Tiling | dict | None = None, output_dtype=FLOAT32,
                 kept_dtype=FLOAT32):
        """Without a config, each shape gets the cost model's first choice (`estimate`);
        `output_dtype`: float32, or float16 / bf16 bits for a conv of that class after it
        (`writing`);
        `kept_dtype`: what an add-relu epilogue's kept activation holds (`adding`)."""
        self.form, self.activations = form, activations
        self.name, self.summary = form.name, form.summary
        self.precision, self.maths = form.precision, form.maths
        self.layout, self.general = activations.layout, activations.general
        self.runs_dense, self.epilogues = activations.runs_dense, activations.epilogues
        self.output_dtype = np.dtype(output_dtype)
        self.kept_dtype = np.dtype(kept_dtype)
        if self.kept_dtype not in self.output_dtypes:
            raise ValueError("an add-relu epilogue adds "
                             f"{' or '.join(map(str, self.output_dtypes))} activations, "
                             f"not {self.kept_dtype}")
        self.tiling = None
        if config is not None:
            tiling = Tiling.of(config)
            problem = self.tiling_problem(tiling)
            if problem:
                raise ValueError(f"invalid {self.name} config {tiling.as_dict()}: {problem}")
            self.tiling = tiling

    @property
    def source(self) -> str:
        return self.activations.source

    def arithmetic(self, shape):
        return self.form.arithmetic(shape)

    def kernel_shape(self, shape: ConvShape) -> ConvShape:
        """The layer as the kernel computes it (channels-last kernels pad the channels)."""
        return self.activations.kernel_shape(shape, self.maths)

    def fixed_config(self):
        # every field, `rows` too: Tiling.as_dict leaves out a zero one, and a tiling fixed
        # whole must not take it from a cache entry
        return {} if self.tiling is None else dataclasses.asdict(self.tiling)

    def tiling_problem(self, t: Tiling) -> str:
        """Why this variant cannot compile `t`, or "" (shape-independent rules)."""
        return tiling_problem(t, self.maths, self.layout)

    def ranked(self, shape: ConvShape) -> tuple[Tiling, ...]:
        """Every tiling that fits the layer, the cost model's favourite first."""
        return ranked(self.kernel_shape(shape), self.maths, FAMILIES[self.layout])

    def tiling_estimate(self, shape: ConvShape, t: Tiling) -> float:
        """The cost model's microseconds for `t` on the layer (what `ranked` orders by)."""
        return estimate(self.kernel_shape(shape), t, self.maths, FAMILIES[self.layout])

    def smallest_tiling(self) -> Tiling:
        return Tiling(32, 32, k_step(self.maths), 1, 4, 2, 1, "table")

    def smem_bytes(self, t: Tiling, shape: ConvShape | None = None) -> int:
        """Dynamic shared memory a block of `t` takes (on the layer `shape`, where it varies)."""
        return smem_bytes(t, self.maths, self.layout)

    def packed_weights(self, weights, k: ConvShape, t: Tiling) -> np.ndarray:
        """The filters as the kernel's `wpack` reads them."""
        return pack_weights(weights, k, t, self.maths, self.layout)

    def default_config(self, shape, epilogue=None):
        best = self.ranked(shape)
        return best[0] if best else None

    def accepts(self, config, shape, epilogue=None):
        return not (self.tiling_problem(config) or self.shape_problem(shape, config))

    def shape_problem(self, shape: ConvShape, t: Tiling) -> str:
        return shape_problem(self.kernel_shape(shape), t, self.layout, self.maths)

    def supports(self, shape):
        base = super().supports(shape)
        if not base:
            return base
        t = self.config_for(shape)
        if t is None:  # no candidate fits: say why the smallest one does not
            smallest = self.smallest_tiling()
            return Support(False, f"no tiling fits: {self.shape_problem(shape, smallest)}")
        problem = self.shape_problem(shape, t)
        return Support(False, problem) if problem else Support(True)

    def configs(self, shape, epilogue=None):
        return diverse(self.ranked(shape), MAX_CONFIGS)

    def configured(self, config):
        return type(self)(self.form, self.activations, config, self.output_dtype, self.kept_dtype)

    def _writing(self, dtype):
        return type(self)(self.form, self.activations, self.tiling, dtype, self.kept_dtype)

    def adding(self, dtype) -> "Pipelined":
        """This variant with its add-relu epilogue reading a kept activation of `dtype` (float32,
        or fp16 / bf16 bits where the block's input was written for a conv of that class)."""
        dtype = np.dtype(dtype)
        if dtype == self.kept_dtype:
            return self
        return type(self)(self.form, self.activations, self.tiling, self.output_dtype, dtype)

    def defines(self, shape, epilogue=None):
        t = self.config_for(shape, epilogue)
        if t is None:
            raise ConvlabError(f"'{self.name}': {self.supports(shape).reason}")
        k = self.kernel_shape(shape)
        return {"PERSISTENT": 0, "PINGPONG": 0, "SWIZZLE": 0, "CLUSTER": 1, "GATHER_TMA": 0,
                "FILTERS_ONCE": 0,
                **self.layout_defines(k),
                "C": k.C, "H": k.H, "W": k.W, "M": k.M,
                "KH": k.Kh, "KW": k.Kw, "STRIDE": k.stride, "PAD_H": k.pad_h,
                "PAD_W": k.pad_w, "DIL": k.dilation, "G": k.groups,
                "HAS_BIAS": int(k.bias), "RELU": int(epilogue in (RELU, ADD_RELU)),
                "ADD_KEPT": int(epilogue == ADD_RELU),
                "KEPT_HALF": int(epilogue == ADD_RELU and self.kept_dtype in HALF_TYPES),
                "MODE": MODES[self.maths], "BM": t.bm, "BN": t.bn, "BK": t.bk,
                "WARPS_M": t.warps_m, "WARPS_N": t.warps_n, "STAGES": t.stages,
                "SPLIT_K": t.split_k, "GATHER_TAP": int(t.tap_order),
                **element_defines(FLOAT32, self.output_dtype,
                                  *([self.kept_dtype] if epilogue == ADD_RELU else []))}

    def layout_defines(self, k: ConvShape) -> dict[str, int]:
        return self.activations.defines(k, self.maths)

    def launch_grid(self, k: ConvShape, t: Tiling) -> tuple[int, int, int]:
        """A block per output tile and K-split, groups along y."""
        return (m_tiles(k, t) * n_tiles(k, t) * t.split_k, k.groups, 1)

    def input_dtype(self):
        return np.dtype(stage_dtype(self.maths))

    def gather_table(self, shape: ConvShape, t: Tiling) -> np.ndarray:
        return self.activations.gather_table(shape, t, self.maths)

    def stager(self, shape: ConvShape):
        return self.activations.stager(shape, self.maths)

    def input_argument(self, k: ConvShape, t: Tiling):
        """x -> a last kernel argument that depends on the input, for tilings that take one
        (None: none do here)."""
        return None

    def kept_problem(self, kept, shape: ConvShape) -> str:
        """Why the add-relu kernel cannot add the array `kept`, or "": it reads the output's
        shape, in the variant's memory format, as kept_dtype."""
        if kept.dtype != self.kept_dtype:
            return (f"'{self.name}' was compiled to add {self.kept_dtype} kept activations, got "
                    f"{kept.dtype}: prepare it with variant.adding({kept.dtype})")
        dense = memory_view(kept, self.layout).flags.c_contiguous
        if tuple(kept.shape) != shape.output_shape or not dense:
            return (f"'{self.name}' adds a kept activation of shape {shape.output_shape} laid out "
                    f"{self.layout}, got shape {tuple(kept.shape)}, strides {tuple(kept.strides)}")
        return ""

    def input_problem(self, x, k: ConvShape) -> str:
        """Why the kernel compiled for `k` cannot read the array x, or "" (a launch checks)."""
        dtype = np.dtype(self.input_dtype())
        if x.dtype != dtype:
            return f"'{self.name}' reads {dtype} input, got {x.dtype}: pass op.stage(x)"
        return self.activations.input_problem(x, k, self.name)

    def prepare(self, shape, weights, epilogue=None, bias=None):
        check_inputs(self, shape, epilogue, bias)
        check_supported(self, shape)
        import cupy

        t = self.config_for(shape, epilogue)
        k = self.kernel_shape(shape)
        compiled = self.compile(shape, epilogue)
        kernel = compiled.module.get_function("conv_forward")
        smem = self.smem_bytes(t, shape)
        kernel.max_dynamic_shared_size_bytes = smem
        wpack = cupy.asarray(self.packed_weights(weights, k, t))
        table = cupy.asarray(self.gather_table(k, t)) if t.gather == "table" else UNREAD
        bias_d = device_weights(bias) if bias is not None else UNREAD
        tiles = output_tiles(k, t)
        shared = installed_scratch() if t.split_k > 1 else None
        if shared is not None:
            shared.reserve(tiles * t.split_k * t.bm * t.bn, tiles)
            ws = counters = None
        elif t.split_k > 1:
            ws = cupy.empty(tiles * t.split_k * t.bm * t.bn, dtype=cupy.float32)
            counters = cupy.zeros(tiles, dtype=cupy.int32)
        else:
            ws = counters = UNREAD
        grid = self.launch_grid(k, t)
        block = (t.block_threads, 1, 1)
        batch = np.int32(shape.B)
        problem = self.input_problem
        input_argument = self.input_argument(k, t)
        kept_problem = self.kept_problem

        def launch(x, y, kept=None):
            message = problem(x, k) or (kept_problem(kept, shape) if kept is not None else "")
            if message:
                raise ConvlabError(message)
            partials, arrivals = shared.arrays() if shared is not None else (ws, counters)
            args = (x, wpack, table, bias_d, y, partials, arrivals, batch)
            if input_argument is not None:
                args += (input_argument(x),)
            # last: a kernel file written before the add-relu epilogue declares no such
            # parameter, and a launch's arguments past a kernel's own are not read
            args += (UNREAD if kept is None else kept,)
            kernel(grid, block, args, shared_mem=smem)

        return Op(launch, shape.output_shape, compiled.seconds, epilogue, self.stager(shape),
                  layout=self.layout, output_dtype=self.output_dtype,
                  shares_split_k=shared is not None)
