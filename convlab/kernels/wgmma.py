"""wgmma: the channels-last implicit GEMM on Hopper's warpgroup MMAs (sm_90a), in FP16, BF16,
TF32, 3xTF32 and 3xTF32 with its cross products in BF16. Same gather, staging, split-K reduce
and epilogue as `channels-last`; a different mainloop (igemm.wgmma) and shared-memory layout
(128-byte swizzle instead of padded rows), and a second schedule a tiling may pick: persistent
and warp-specialised (igemm.persistent)."""

from ..gpu.elements import ELEMENT_SOURCE
from .general import EPILOGUE_SOURCE
from .igemm import epilogue, gather_nhwc, halo, mainloop, persistent, splitk, tile_walks, wgmma

TILING_KERNEL = r"""
// The tiling's schedule, its template instantiated with its pieces: the host's HALO and
// PERSISTENT name the schedule, GATHER_TMA the persistent kernel's gather (the copy engine's
// im2col, or the loader threads'). Only the template named is instantiated; the others are
// parsed too, which is why every build passes every schedule's switches.
template <bool If, class Then, class Else> struct Choice { using type = Then; };
template <class Then, class Else> struct Choice<false, Then, Else> { using type = Else; };

using TilingKernel = typename Choice<
    HALO != 0, HaloKernel<HALO_ROWS, PATCH_STAGES>,
    typename Choice<PERSISTENT != 0,
                    PersistentKernel<PersistentWalk<SPLIT_K, MTILES, KTILES, G, BN>,
                                     typename Choice<GATHER_TMA != 0, Im2colGather,
                                                     NhwcGather<BN_ROWS>>::type>,
                    GridKernel<GridWalk<SPLIT_K, MTILES, KTILES>>>::type>::type;
"""

KERNELS = (r"""
// wgmma: changes from channels-last -- that kernel fed mma.sync, a warp-wide 16x8 product whose
// operands each warp first loads into registers (ldmatrix, fragment loads): at one or two
// 8-warp blocks per SM the tensor pipe sat idle 40-60% of the time on the MMAs' dependencies
// (ncu: stall `wait`), and cuDNN's Hopper kernels run above mma.sync's peak. Here a warpgroup
// (4 warps) issues wgmma.mma_async: a 64xBNx16 product (64xBNx8 in TF32) read straight from
// shared memory through descriptors, asynchronous, so the copies of the next K-tiles and the
// MMAs of this one overlap without a register round trip, and one instruction does the work of
// BN/8 mma.sync per warp. Both operand tiles are stored K-major in rows of 128 bytes with
// 16-byte chunks XOR-swizzled by the row (the layout the descriptor's 128-byte swizzle mode
// reads, conflict-free without padding): the host packs each A tile in that image, the gather
// writes B's 16-byte cp.async copies to the swizzled chunk. A K-tile is one 128-byte row (64
// fp16/bf16 or 32 tf32 channels); one group of wgmmas stays in flight across K-tiles.
// 3xTF32 (the fp32 class) keeps both operands' small parts in shared memory too (the host
// splits the filters; each thread writes the rounded residual of the B vectors it copied, whose
// big part wgmma reads as they landed, truncated) and sums the three products of a K-tile (in
// the grid schedule, of a span of PART_KTILES K-tiles) apart, adding them to the total with
// FP32 adds, as channels-last-3xtf32 does.
//
// CROSS_BF16 (wgmma-split-bf16): 3xTF32's three TF32 products a step take 3x the tensor cores'
// time of TF32 (H100, 2026-11-26, no copies at all: 487 TFLOP/s of TF32 products issued, 162 of
// FP32 ones). The two cross products only correct the big one by ~2^-10 of it, so BF16
// (twice TF32's rate, FP32's exponent range) computes them within the fp32 bound on
// reductions of MIN_REDUCTION terms or more: A's second
// tile holds [big | small] in BF16 and B's [small | big], 64 elements a 128-byte row, one
// BF16 product over that doubled K giving big x small + small x big. Same shared memory and
// copies; 2/3 of the tensor time. H100, same tilings: conv2 0.589 -> 0.493 ms, conv3 0.360 ->
// 0.297, conv5 0.204 -> 0.170 (2026-11-26).
//
// PERSISTENT (the tiling's schedule): in the grid schedule every thread both copies and
// multiplies, so each block waits for its first K-tiles' loads before any MMA and the tensor
// cores idle through its epilogue; ncu on the ResNet 3x3 layer (9 K-tiles a tile in fp16) had
// them active 29% of cycles. Here a block per SM slot walks the tiles (or their K-splits as
// units of work, SPLIT_K > 1: igemm.splitk); a loader warpgroup
// gathers B with cp.async and brings A by the copy engine (cp.async.bulk), the stages passing
// to the MMA warpgroups and back on mbarriers, so the next tile's loads run during this tile's
// last MMAs and its epilogue, which stores from registers (no C tile in shared memory).
// setmaxnreg gives the MMA warps the loaders' spare registers where the launch's cap is below
// what they are modelled to need.
//
// GATHER_TMA (the tiling's gather "tma", persistent schedule): the loader warpgroup's threads
// each issued a cp.async per B row and vector (16 a K-tile on conv3's 128x256 fp16 tile),
// waited for them, fenced them for the async proxy and arrived on the stage's barrier; run
// back to back under the 700 W cap, those copies cost clock (2026-11-26: without B's gather
// VGG ran the same cycles 12% faster). Here one thread brings B by the copy engine's im2col
// mode (cp.async.bulk.tensor with a tensor map of the NHWC input, passed by value): a box of
// BN output pixels x BK channels at one tap, zeros outside the image, written in the 128-byte
// swizzle the wgmmas read; its bytes and A's complete the stage's barrier, so no loader waits
// to publish and every free stage is in flight. H100, tuner's timing: conv3 fp16 0.0592 ->
// 0.0532 ms, tf32 0.1052 -> 0.0977 on the same tiling (2026-11-26).
//
// PINGPONG (the tiling's schedule "pingpong"): in the persistent schedule the two MMA
// warpgroups share each 128-row tile, so both store it at once while the tensor cores wait.
// Here each takes a 64-row tile of its own, the block's units in turn, its K-loop starting
// once the other's has issued (named barriers), and stores while the other multiplies, as
// CUTLASS's ping-pong kernel schedule does; half the A rows a stage leave room for more
// stages. H200, against the own choice's one-warpgroup tiling (two blocks an SM, three
// stages): VGG-16's 64-channel 3x3 layer at batch 128, tf32 2.007 -> 1.772 ms, fp16 1.000
// -> 0.900 (2026-11-29, results/h200/pingpong-20261129/).
//
// HALO (the tiling's schedule "halo", stride 1): the persistent schedule still gathers each
// input pixel once per tap, K*K times a tile (ncu, ResNet 3x3 layer: L2 at 66%, the loaders
// waiting on their copies, the tensor pipe 39% active). Here a tile is HALO_ROWS whole output
// rows; the loaders copy their input patch once per channel chunk and every tap's wgmmas read
// it at a shift, the filters ride a ring of A buffers (resident where it holds them all). On
// an H100 the ResNet layer's TF32 ran 1.2x faster than persistent, fp16 no faster (2026-11-25).
//
// Compile-time: as channels-last, plus SWIZZLE 1; WARPS_M = 4 per warpgroup, WARPS_N = 1, BM
// = 64 per warpgroup, BK = 128 bytes of elements, BN one of wgmma's N (32..256 step 32; under
// HALO any multiple of 8, WGMMA_N + WGMMA_TAIL); PERSISTENT, PINGPONG (BM 64 with
// WARPS_M 8: a tile a warpgroup), MIN_BLOCKS (blocks per SM, 0: no bound), PRODUCER_REGS and
// CONSUMER_REGS (0: no setmaxnreg), STORE_SCRATCH, GATHER_TMA, CLUSTER (blocks a cluster);
// HALO, HALO_ROWS and PATCH_STAGES; WGMMA_N and WGMMA_TAIL (the MMA's N, and the halo's extra
// N); PART_KTILES (above 1 for 3xTF32 in the grid schedule) and CROSS_BF16. Every build passes
// each of them, 0 or 1 where its schedule or maths has no use for it, so no piece defaults
// one.
"""
          + mainloop.GEOMETRY + mainloop.INSTRUCTIONS + tile_walks.SOURCE + splitk.SPLIT_K_LAST
          + gather_nhwc.NHWC_GATHER
          + wgmma.INSTRUCTIONS
          + wgmma.MAINLOOP_STEP_DECLARATION + EPILOGUE_SOURCE + ELEMENT_SOURCE
          + epilogue.KEPT_SOURCE + persistent.INSTRUCTIONS + persistent.IM2COL_GATHER
          + epilogue.STAGED_STORE
          + epilogue.PREFETCH_KEPT + epilogue.STORE_REGISTERS_NHWC
          + halo.KERNEL + persistent.KERNEL
          + mainloop.filled(mainloop.GRID_KERNEL, BODY=gather_nhwc.START + mainloop.LOAD_A
                            + gather_nhwc.LOAD_TILE
                            + wgmma.COMPUTE + wgmma.PIPELINE + splitk.SPLIT_K_REDUCE
                            + epilogue.STORE_STAGED)
          + TILING_KERNEL + mainloop.ENTRY)
# The family's kernels without their mainloop step, which a kernel file may write instead
# (`#include <convlab/wgmma>`: userkernel.library); the variants' source adds the library's.
SOURCE = KERNELS + wgmma.MAINLOOP_STEP

import copy  # noqa: E402
from dataclasses import replace  # noqa: E402
from functools import lru_cache  # noqa: E402

import numpy as np  # noqa: E402

from ..gpu import hardware, tensormap  # noqa: E402
from ..gpu.elements import FLOAT32  # noqa: E402
from ..shapes import NHWC, ConvShape  # noqa: E402
from .base import ADD_RELU, Support  # noqa: E402
from .channels_last import NHWC_ACTIVATIONS  # noqa: E402
from .igemm import learned  # noqa: E402
from .igemm.cost import diverse, estimate, ranked  # noqa: E402
from .igemm.packing import (cross_bf16, gemm_weights, last_tile_rows, operand_parts,  # noqa: E402
                            round_tf32, trim_last_tiles)
from .igemm.tiling import MAX_CONFIGS, Tiling, output_tiles  # noqa: E402
from .pipelined import Form, Pipelined  # noqa: E402

HALO_CONFIGS = 4
CLUSTER_CONFIGS = 4  # of MAX_CONFIGS; see Wgmma.configs


@lru_cache(maxsize=256)
def _offered(k: ConvShape, maths: str, kept_bytes: int = 0,
             adds: bool = False) -> tuple[Tiling, ...]:
    candidates = tuple(t for t in ranked(k, maths, wgmma.FAMILY, kept_bytes)
                       if t.schedule != "pingpong")
    if not candidates:
        return ()
    if kept_bytes:
        # The correction was fitted on convs without a kept read; the analytic model's charge
        # for it was measured (igemm.wgmma.KEPT_EXPOSURE) and keeps the correction to its first
        # tilings, blocks alone: over every candidate it took ResNet-50's first expansion to
        # 128x256, 1.23-1.34x slower fused than 128x128 on an H200.
        candidates = _spread(tuple(t for t in candidates if t.cluster == 1), 0)
    by_score = tuple(sorted(candidates, key=lambda t: learned.score(
        k, t, maths, estimate(k, t, maths, wgmma.FAMILY, kept_bytes))))
    chosen = set(_spread(by_score, CLUSTER_CONFIGS))
    offered = tuple(t for t in by_score if t in chosen)
    # The pingpong schedule is outside the correction's data: the own choice takes it by rule
    # (igemm.wgmma.preferred_pingpong on layers of many tiles, igemm.wgmma.one_wave_pingpong
    # on layers of one wave), never for a conv that adds a kept activation (its store's wait
    # for the kept read is unmeasured there), and the tuner tries the twin of the first
    # tiling that has one.
    preferred = None if adds else (wgmma.preferred_pingpong(k, offered[0], maths)
                                   or wgmma.one_wave_pingpong(k, offered[0], maths))
    base = offered[0] if preferred else next(
        (t for t in offered if wgmma.pingpong_twin(k, t, maths)), None)
    if base is None:
        return offered
    twin = preferred or wgmma.pingpong_twin(k, base, maths)
    if len(offered) >= MAX_CONFIGS:  # the twin takes the place of the last plain tiling
        last = [t for t in offered if t.schedule != "halo" and t.cluster == 1 and t != base][-1]
        offered = tuple(t for t in offered if t != last)
    return (twin, *offered) if preferred else (*offered, twin)


def _spread(tilings: tuple[Tiling, ...], clusters: int) -> list[Tiling]:
    """MAX_CONFIGS of `tilings`, first first, spread over block tiles (`diverse`): up to
    HALO_CONFIGS of the halo schedule and `clusters` two-block clusters among them."""
    halo_tilings = diverse(tuple(t for t in tilings if t.schedule == "halo"), HALO_CONFIGS)
    cluster_tilings = diverse(tuple(t for t in tilings if t.cluster > 1), clusters)
    others = diverse(tuple(t for t in tilings if t.schedule != "halo" and t.cluster == 1),
                     MAX_CONFIGS - len(halo_tilings) - len(cluster_tilings))
    return others + halo_tilings + cluster_tilings


class Wgmma(Pipelined):
    """The implicit GEMM on Hopper's `wgmma`, one family for every maths (kernels.IGEMM_FORMS),
    over channels-last activations. Its fp32 class has two forms: 3xTF32, and
    `wgmma-split-bf16` (Form.cross_bf16), which forms 3xTF32's two cross products in BF16 at
    twice TF32's rate: one TF32 and two BF16 products a step take the tensor cores 2/3 of
    3xTF32's time. BF16 keeps FP32's exponent range; it rounds to 2^-8, so a cross product (a
    residual of up to 2^-10 of its operand, times the other) errs by up to ~2^-16.8 of the
    product it corrects (2^-17.1 the largest over 200,000 random pairs, 2^-16.8 found by a
    search over the bits). Rounding to nearest, those errors take either sign and add as
    sqrt(n); only where every product is the same (constant data) do they add as n, to at most
    2^-16.8 * sum|x*w| against the bound's 8 * sqrt(n) * 2^-24 * sum|x*w|: 0.55 of it at
    MIN_REDUCTION terms, fewer than which stay on 3xTF32."""

    source = SOURCE
    arch = "sm_90a"
    compute_capability = (9, 0)

    def __init__(self, form: Form, activations=NHWC_ACTIVATIONS,
                 config: Tiling | dict | None = None, output_dtype=FLOAT32,
                 kept_dtype=FLOAT32):
        if activations is not NHWC_ACTIVATIONS:
            raise ValueError("the wgmma kernel reads channels-last activations only")
        super().__init__(form, activations, config, output_dtype, kept_dtype)

    def holding_filters_once(self) -> "Wgmma":
        """The fp32 class with its warp-specialised tilings' packs holding each filter once, as
        float32, which the MMA threads split in registers (the kernel's FILTERS_ONCE): half the
        filters' memory, for time. On an H200 the shipped persistent fp32 tilings ran 1.06-1.14x
        (3xTF32) and 1.16-1.19x (BF16 cross products) slower so, and ResNet-50 at batch 1 took
        0.541 ms against 0.515 with 108 against 206 MiB held (2026-11-29,
        results/h200/fp32-filters-in-registers-20261129/), so a network takes it only where its
        filters outweigh its activations (net.network.filters_outweigh_activations). Other
        maths and the grid schedule hold what they held."""
        if self.maths != "3xtf32" or self.filters_once:
            return self
        held = copy.copy(self)
        held.filters_once = True
        return held

    def _keeping_filters_once(self, variant: "Wgmma") -> "Wgmma":
        if self.filters_once and variant is not self:
            variant = variant.holding_filters_once()
        return variant

    def configured(self, config):
        return self._keeping_filters_once(super().configured(config))

    def _writing(self, dtype):
        return self._keeping_filters_once(super()._writing(dtype))

    def adding(self, dtype):
        return self._keeping_filters_once(super().adding(dtype))

    @property
    def fuses_adds(self) -> bool:
        """Whether a network hands it its residual blocks' adds (every NHWC variant computes
        them; this is where it pays): the maths whose register store adds the kept vectors 16
        bytes at a time (igemm.wgmma.VECTOR_STORE_MATHS). ResNet-50 at batch 128 on an H200
        (2026-11-28, results/h200/resnet50-fused-adds-20261128/): fp16 3.99 ms with them,
        1.18x PyTorch's best; tf32, whose float32 stores then went an element at a time, 8.79
        ms with them, 0.95x PyTorch's best, its first 1x1 expansion taking 0.73 ms fused where
        the same-sized downsample conv alone took 0.15 ms. With 16-byte float32 stores, tf32
        took 5.94 ms, 1.39x, and that expansion 0.28 ms
        (results/h200/resnet50-tf32-fused-adds-20261128/). bf16, whose network hands bf16 bits
        from layer to layer, takes fp16's 16-bit path: 3.68 ms at batch 128, 1.49x
        (results/h200/resnet50-vgg16-bf16-activations-20261128/). 3xTF32 keeps its adds
        apart."""
        return self.maths in wgmma.VECTOR_STORE_MATHS

    def supports(self, shape):
        if self.form.cross_bf16 and shape.reduction < MIN_REDUCTION:
            return Support(False, f"a reduction of {shape.reduction} terms: the BF16 cross "
                                  f"products need at least {MIN_REDUCTION} for the fp32 bound")
        return super().supports(shape)

    def layout_defines(self, k: ConvShape) -> dict[str, int]:
        return {**super().layout_defines(k), "SWIZZLE": 1}

    def defines(self, shape, epilogue=None):
        """The schedule's, over the switches it leaves alone (no halo, no copy-engine gather,
        a block its own cluster, no bound on blocks per SM, no setmaxnreg, no store scratch,
        the tile's N one wgmma), and OUT_TF32 in tf32: every tf32 output is stored rounded to
        TF32 (gpu.elements' to_out), since a next tf32 conv reads it exact so; a pool or a
        layer compared alone gets the same rounding, within the tf32 bound."""
        t = self.config_for(shape, epilogue)
        return {**super().defines(shape, epilogue), "HALO": 0, "HALO_ROWS": 0, "PATCH_STAGES": 0,
                "GATHER_TMA": 0, "CLUSTER": 1, "MIN_BLOCKS": 0, "PRODUCER_REGS": 0,
                "CONSUMER_REGS": 0, "STORE_SCRATCH": 0, "PART_KTILES": 1, "WGMMA_N": t.bn,
                "WGMMA_TAIL": 0, "CROSS_BF16": int(self.form.cross_bf16),
                "FILTERS_ONCE": int(self.filters_once),
                **wgmma.schedule_of(t).defines(shape, self.kernel_shape(shape), t, self.maths),
                **({"OUT_TF32": 1} if self.maths == "tf32" else {})}

    def input_argument(self, k: ConvShape, t: Tiling):
        """The "tma" gather's im2col tensor map of the input, by value (gpu.tensormap)."""
        if t.gather != "tma":
            return None
        return tensormap.Im2colMaps(self.input_dtype(), k, t.bk, t.bn)

    def launch_grid(self, k: ConvShape, t: Tiling) -> tuple[int, int, int]:
        """Persistent and halo: as many blocks as the GPU holds at once (or units of work, a
        tile's K-split each, if fewer), in whole clusters."""
        if not wgmma.schedule_of(t).warp_specialised:
            return super().launch_grid(k, t)
        slots = hardware.current().sms * wgmma.blocks_per_sm(t, self.maths, k)
        return (min(output_tiles(k, t) * t.split_k, slots - slots % t.cluster), 1, 1)

    def tiling_problem(self, t: Tiling) -> str:
        return wgmma.tiling_problem(t, self.maths)

    def shape_problem(self, shape: ConvShape, t: Tiling) -> str:
        return wgmma.layer_problem(self.kernel_shape(shape), t, self.maths)

    def ranked(self, shape: ConvShape) -> tuple[Tiling, ...]:
        return ranked(self.kernel_shape(shape), self.maths, wgmma.FAMILY)

    def tiling_estimate(self, shape: ConvShape, t: Tiling) -> float:
        return estimate(self.kernel_shape(shape), t, self.maths, wgmma.FAMILY)

    def configs(self, shape, epilogue=None):
        """Every candidate ordered by the fitted correction (igemm.learned), so the first is
        the variant's own choice and autotune's first few are its best guesses; of them,
        MAX_CONFIGS spread over block tiles (`diverse`), HALO_CONFIGS kept for the halo
        schedule where the layer has halo tilings (its cost model is the youngest, and would
        otherwise leave it out of the tuner's runs on layers it ranks below the others) and
        CLUSTER_CONFIGS for two-block clusters, which the correction cannot tell from the same
        tiling a block alone: each follows its twin, the own choice is never one, and the tuner
        finds where they win. The pingpong schedule is outside the correction's data too: the
        own choice takes a one-warpgroup tiling's pingpong twin by rule on layers of many tiles
        (igemm.wgmma.preferred_pingpong), halves a two-warpgroup 128-row tile into a pingpong
        one on layers of one wave (igemm.wgmma.one_wave_pingpong), and otherwise the list ends
        with the twin of its first tiling that has one. The correction once ordered only the
        analytic model's first MAX_CONFIGS, which left out the 128x256 tilings that were
        fastest on large layers at batch 128: choosing over every candidate, the own choice
        changed on 61 of 200 tf32 and 65 of 200 fp16 suite cells and ran them 1.08x and 1.07x
        faster (geometric means; 13 of the 126 slower by over 3%, the worst 0.75x; H200,
        2026-11-29, results/h200/own-choice-20261129/). An add-relu conv that stores 16-byte
        vectors is ranked with its kept read (igemm.wgmma.KEPT_EXPOSURE), and the correction,
        fitted without one, orders only the first MAX_CONFIGS of that ranking, as before; one
        whose stores go an element at a time (3xTF32, or a group's channels off 16 bytes) is
        ranked as the plain conv: its read is unmeasured, and the vector stores' charge
        misranked it (ResNet-50's last expansion on an H200, whose
        float32 output went an element at a time: 0.044 ms ranked as the plain conv, 0.065 ms
        with the charge; with float32 16-byte stores, 0.046 ms with it)."""
        k = self.kernel_shape(shape)
        vectors = epilogue == ADD_RELU and wgmma.stores_vectors(k, self.maths, self.output_dtype)
        return list(_offered(k, self.maths, self.kept_dtype.itemsize if vectors else 0,
                             epilogue == ADD_RELU))

    def default_config(self, shape, epilogue=None):
        offered = self.configs(shape, epilogue)
        return offered[0] if offered else None

    def smallest_tiling(self) -> Tiling:
        return Tiling(64, 32, wgmma.k_elements(self.maths), 4, 1, 3, 1, "table")

    def smem_bytes(self, t: Tiling, shape: ConvShape | None = None) -> int:
        return wgmma.smem_bytes(t, self.maths, shape and self.kernel_shape(shape))

    def packed_weights(self, weights, k: ConvShape, t: Tiling) -> np.ndarray:
        """Each A part (packing.operand_parts) as the kernel's swizzled shared memory holds its
        tile: [G][MTILES][KTILES][parts][bm*bk], a group's last m-tile trimmed
        (packing.trim_last_tiles). With the cross products in BF16: A's TF32 big part, then
        [big | small] in BF16 per K-tile (packing.cross_bf16). Holding the filters once
        (holding_filters_once), the fp32 class's warp-specialised tilings pack the float32
        filters alone, which the kernel splits (A_SPLIT_ON_CHIP)."""
        a = gemm_weights(weights, k, t, NHWC)
        if self.filters_once and wgmma.schedule_of(t).warp_specialised:
            parts = [wgmma.swizzle_tiles(a.astype(np.float32), t)]
        elif self.form.cross_bf16:
            big = wgmma.swizzle_tiles(round_tf32(a), t)
            cross = wgmma.swizzle_tiles(cross_bf16(a, t.bk), replace(t, bk=2 * t.bk))
            parts = [big, cross.view(np.float32)]
        else:
            parts = [wgmma.swizzle_tiles(p, t) for p in operand_parts(a, self.maths)]
        rows = last_tile_rows(k, t, len(parts))
        return trim_last_tiles(np.stack(parts, axis=3), rows, t.bm)


# Reductions below this many terms stay on 3xTF32: the BF16 roundings' worst case (constant
# data) is 0.55 of the fp32 bound here, and 3xTF32's own arithmetic at most 0.15 of it on
# same-sign data (tests/test_gpu_pipelined.py).
MIN_REDUCTION = 1024
