"""The pipelined variants' config, `Tiling`, and its rules: what a tiling needs of the maths
(tiling_problem) and of a layer (shape_problem), the shared memory it takes and the tiles a
layer splits into."""

from dataclasses import dataclass, fields

from ...shapes import NCHW, NHWC, ConvShape
from ..base import Config, blocks

MODES = {"tf32": 0, "3xtf32": 1, "fp16": 2, "bf16": 3}
HALF_MATHS = ("fp16", "bf16")
# Dynamic shared memory per block: sm_90 allows 227 KB in all, and split-K adds a static word.
MAX_SMEM = 226 * 1024
INT32_MAX = 2**31 - 1
INVALID_TAP = 1 << 28  # the (p, q) a table gives k past the reduction: fails every bounds test
MAX_CONFIGS = 16  # configs() returns the cost model's best this many
# Accumulator registers a thread may hold: 64x64 warp tiles; 3xTF32 keeps a second set per
# K-tile (the round-to-nearest tile sum), so its warp tiles stop at 64x32.
MAX_ACC = {"tf32": 128, "3xtf32": 64, "fp16": 128, "bf16": 128}
# fp16/bf16 B elements a thread carries in registers from one K-tile's loads to its stores:
# beyond 32, a 64x64 warp tile's 128 accumulators no longer fit beside them (ptxas spills).
MAX_IN_FLIGHT = 32
# B rows a thread of a channels-last gather copies: each keeps a 64-bit offset and two ints.
MAX_VECTOR_ROWS = 8
# wgmma's threads hold at most 128 accumulators (the mma.sync kernels' 64x64 warp tiles, 128,
# beside 8 rows) and its persistent schedule's loaders none: 16 rows (64 registers).
MAX_WGMMA_ROWS = 16
# Threads of the persistent schedule's loader warpgroup.
LOADERS = 128


@dataclass(frozen=True)
class Tiling(Config):
    """One point of the tiling space: block tile bm x bn x bk, a warps_m x warps_n warp grid,
    `stages` shared-memory buffers, `split_k` K-splits, and the gather order ("tap": K runs
    (channel chunk, tap, channel) and needs bk channels per chunk; "table": K in the weights'
    (c, p, q) order through an offset table; "tma": tap order, B brought by the copy engine's
    im2col mode, wgmma's persistent schedule only) and the schedule ("grid": a block per output
    tile, every thread both copies and multiplies; "persistent": wgmma only, a block per SM slot
    walks the tiles, a loader warpgroup copying for the MMA warpgroups; "halo": as persistent,
    but a tile is `rows` whole output rows whose input patch is copied once for all the taps,
    and `stages` counts A's buffers alone; "pingpong": as persistent, but each of the two MMA
    warpgroups takes a 64-row tile of its own, the block's tiles in turn). `cluster` 2 (the
    persistent schedule with the copy engine's gather): two blocks on neighbouring m-tiles of
    the same pixels, one B copy landing in both."""

    bm: int
    bn: int
    bk: int
    warps_m: int
    warps_n: int
    stages: int
    split_k: int
    gather: str
    schedule: str = "grid"
    rows: int = 0
    cluster: int = 1

    @property
    def tap_order(self) -> bool:
        """K runs (channel chunk, tap, channel): the "tap" gather's order, which "tma" keeps."""
        return self.gather in ("tap", "tma")

    def as_dict(self) -> dict:
        """Config's dict, less `rows` where the schedule has none (0) and `cluster` where a
        block is its own (1): tilings read in tables and caches as they did before the halo
        schedule and the clusters."""
        d = super().as_dict()
        if not self.rows:
            del d["rows"]
        if self.cluster == 1:
            del d["cluster"]
        return d

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n

    @property
    def loaders(self) -> int:
        """Threads that copy the operand tiles: all of them, or the loader warpgroup."""
        return self.threads if self.schedule == "grid" else LOADERS

    @property
    def block_threads(self) -> int:
        return self.threads + (0 if self.schedule == "grid" else LOADERS)

    @property
    def wm(self) -> int:
        """Rows a warp holds: under the pingpong schedule a warpgroup's four warps share a
        tile."""
        return self.bm * (2 if self.schedule == "pingpong" else 1) // self.warps_m

    @property
    def wn(self) -> int:
        return self.bn // self.warps_n

    @property
    def accumulators(self) -> int:
        return (self.wm // 16) * (self.wn // 8) * 4

    @property
    def column_threads(self) -> int:
        return min(self.threads, self.bn)

    @property
    def rows_per_thread(self) -> int:
        return self.bk * self.column_threads // self.threads

    def brief(self) -> str:
        """'128x128x32 2x2w s3 k1 tap' (' ws' after it: the persistent, warp-specialised
        schedule; ' pp': its ping-pong form; ' halo4': the halo schedule, 4 output rows a tile;
        ' c2' after that: two-block clusters): short enough for an 80-column table."""
        ws = {"grid": "", "persistent": " ws", "pingpong": " pp"}.get(
            self.schedule, f" {self.schedule}{self.rows}")
        cluster = f" c{self.cluster}" if self.cluster != 1 else ""
        return (f"{self.bm}x{self.bn}x{self.bk} {self.warps_m}x{self.warps_n}w s{self.stages} "
                f"k{self.split_k} {self.gather}{ws}{cluster}")


def k_step(maths: str) -> int:
    return 16 if maths in HALF_MATHS else 8


def a_parts(maths: str) -> int:
    return 2 if maths == "3xtf32" else 1


def element_bytes(maths: str) -> int:
    return 2 if maths in HALF_MATHS else 4


def smem_bytes(t: Tiling, maths: str, layout: str = NCHW) -> int:
    """The pipeline's stages, or the epilogue's C tile that reuses them, whichever is larger."""
    e = element_bytes(maths)
    if layout == NHWC:
        b_tile, c_tile = t.bn * (t.bk + 16 // e) * e, t.bn * (t.bm + 4) * 4
    else:
        b_tile, c_tile = t.bk * (t.bn + 8) * e, t.bm * (t.bn + 8) * 4
    return max(t.stages * (t.bm * t.bk * a_parts(maths) * e + b_tile), c_tile)


def padded_group_channels(cg: int, maths: str) -> int:
    """The channels per group a channels-last kernel reads: as many as the layer has when they
    fill 16-byte vectors, else rounded up to 8 bytes (AlexNet's 3-channel conv1: 4). The staged
    input and the filters carry the extra channels as zeros."""
    e = element_bytes(maths)
    return cg if cg % (16 // e) == 0 else blocks(cg, 8 // e) * (8 // e)


def channel_vector(cg: int, maths: str) -> int:
    """Elements per cp.async of a channels-last gather: 16 bytes, else 8 (Cg padded to 8)."""
    e = element_bytes(maths)
    return 16 // e if cg % (16 // e) == 0 else 8 // e


def tiling_problem(t: Tiling, maths: str, layout: str = NCHW) -> str:
    """Why `t` cannot be compiled for `maths`, or "" if it can (shape-independent rules)."""
    ints = {f.name: getattr(t, f.name) for f in fields(t)
            if f.name not in ("gather", "schedule", "rows")}
    bad = [n for n, v in ints.items() if not isinstance(v, int) or isinstance(v, bool) or v < 1]
    if bad:
        return f"{', '.join(bad)} must be positive integers"
    if t.gather == "tma":
        return "gather 'tma' (the copy engine's im2col) needs wgmma's persistent schedule"
    if t.gather not in ("tap", "table"):
        return f"gather must be 'tap' or 'table', not {t.gather!r}"
    if t.schedule in ("persistent", "pingpong", "halo"):
        return f"schedule must be 'grid' (the {t.schedule} schedule needs wgmma), not {t.schedule!r}"
    if t.schedule != "grid":
        return f"schedule must be 'grid', not {t.schedule!r}"
    if t.rows:
        return "rows must be 0 (rows are the halo schedule's, which needs wgmma)"
    if t.cluster != 1:
        return "cluster must be 1 (clusters are wgmma's persistent schedule's)"
    if t.warps_m * t.warps_n not in (4, 8):
        return "the warp grid must hold 4 or 8 warps (128 or 256 threads)"
    if t.bm % (16 * t.warps_m):
        return f"bm={t.bm} must be a multiple of 16*warps_m={16 * t.warps_m}"
    tile_n = 16 if maths in HALF_MATHS else 8  # ldmatrix.x4 loads two 8-column B tiles
    if t.bn % 32 or t.bn % (tile_n * t.warps_n):
        return f"bn={t.bn} must be a multiple of 32 and of {tile_n}*warps_n={tile_n * t.warps_n}"
    if t.bk % k_step(maths):
        return f"bk={t.bk} must be a multiple of the MMA's k={k_step(maths)}"
    if t.accumulators > MAX_ACC[maths]:
        return (f"a {t.wm}x{t.wn} warp tile needs {t.accumulators} accumulators per thread; "
                f"{maths} allows {MAX_ACC[maths]}")
    if t.stages < 2 or t.stages > 6:
        return "stages must be 2 to 6"
    if layout == NCHW:
        if t.bn % t.threads and t.threads % t.bn:
            return f"bn={t.bn} and the {t.threads} threads must divide one another"
        if t.bk % (t.threads // t.column_threads):
            return f"bk={t.bk} must split evenly over {t.threads // t.column_threads} thread rows"
        if maths in HALF_MATHS and t.stages != 2:
            return f"{maths} stages B through registers into 2 buffers: stages must be 2"
        in_flight = t.rows_per_thread * (t.bn // t.column_threads)
        if maths in HALF_MATHS and in_flight > MAX_IN_FLIGHT:
            return (f"each thread would hold {in_flight} B elements in registers between "
                    f"K-tiles; at most {MAX_IN_FLIGHT} (fewer bk*bn per thread)")
    if smem_bytes(t, maths, layout) > MAX_SMEM:
        return f"needs {smem_bytes(t, maths, layout)} bytes of shared memory; at most {MAX_SMEM}"
    return ""


def vector_rows(t: Tiling, vec: int) -> int:
    """B rows each loading thread of a channels-last gather copies (0: the copies do not split
    evenly over the loaders)."""
    chunks = t.bk // vec
    if t.bk % vec or t.loaders % chunks or t.bn % (t.loaders // chunks):
        return 0
    return t.bn // (t.loaders // chunks)


def k_tiles(shape: ConvShape, t: Tiling) -> int:
    kk = shape.taps
    if t.tap_order:
        return blocks(shape.Cg, t.bk) * kk
    return blocks(shape.Cg * kk, t.bk)


def m_tiles(shape: ConvShape, t: Tiling) -> int:
    return blocks(shape.Mg, t.bm)


def n_tiles(shape: ConvShape, t: Tiling) -> int:
    """Pixel tiles: bn pixels each, or under the halo schedule `rows` output rows of an image."""
    if t.schedule == "halo":
        return shape.B * blocks(shape.Ho, t.rows)
    return blocks(shape.B * shape.Ho * shape.Wo, t.bn)


def output_tiles(shape: ConvShape, t: Tiling) -> int:
    return shape.groups * m_tiles(shape, t) * n_tiles(shape, t)


def shape_problem(shape: ConvShape, t: Tiling, layout: str = NCHW, maths: str = "tf32",
                  max_rows: int = MAX_VECTOR_ROWS) -> str:
    """Why `t` cannot run `shape` (32-bit index limits, too many K-splits, a channels-last
    gather that does not split into 1 to `max_rows` rows per loading thread), or "". A
    channels-last `shape` is the one the kernel runs: its group channels already padded
    (padded_group_channels)."""
    if layout == NHWC:
        vec = channel_vector(shape.Cg, maths)
        rows = vector_rows(t, vec)
        if not 1 <= rows <= max_rows:
            return (f"{t.bk // vec} vectors per row of a {t.bn}x{t.bk} B tile do not split "
                    f"into 1 to {max_rows} rows for each of {t.loaders} loading threads")
    if shape.B * shape.Ho * shape.Wo + t.bn > INT32_MAX:
        return (f"B*Ho*Wo = {shape.B * shape.Ho * shape.Wo} pixels overflow the kernel's "
                f"32-bit pixel index")
    channels = blocks(shape.Cg, t.bk) * t.bk if t.tap_order else shape.Cg
    if channels * shape.H * shape.W > INT32_MAX:
        return "one group's input channels exceed the kernel's 32-bit in-image offsets"
    if t.split_k > k_tiles(shape, t):
        return f"split-K {t.split_k} exceeds the {k_tiles(shape, t)} K-tiles of this layer"
    if output_tiles(shape, t) * t.split_k > INT32_MAX:
        return (f"{output_tiles(shape, t)} tiles x {t.split_k} K-splits overflow the kernel's "
                f"32-bit index of its blocks' work")
    return ""
