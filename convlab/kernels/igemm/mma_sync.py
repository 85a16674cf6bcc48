"""The mma.sync kernels (the pipelined and channels-last families) as the cost model
(igemm.cost) sees them: one schedule, a block per output tile and K-split whose warps all gather
and multiply (`WarpTiles`), the registers and blocks per SM it is modelled to take, and the
tilings worth trying (`MmaSync.candidates`); `FAMILIES` holds one per activation layout."""

import itertools
import math

from ...gpu.hardware import H100
from ...shapes import NCHW, NHWC, ConvShape
from ..base import blocks
from . import cost
from .tiling import (HALF_MATHS, Tiling, a_parts, channel_vector, element_bytes, k_step,
                     shape_problem, smem_bytes, tiling_problem, vector_rows)

# H100 SXM figures of the mma.sync kernels (only ratios matter): MMA instructions an SM retires
# per cycle (322 TFLOP/s of m16n8k8 TF32 = 2,048 FLOP each, 132 SMs, ~1.76 GHz; the m16n8k16
# 16-bit MMA is assumed to take the same time for twice the work), warp instructions issued per
# SM per cycle, and the warps an SM needs in flight to keep its tensor cores busy: ncu shows a
# one-block-per-SM tile stalled on MMA dependencies, and the tuner's sweeps (checked by
# bench/calibration.py against results/h100/channels-last-20261125) set that count.
MMA_PER_CYCLE = 0.68
ISSUE_PER_CYCLE = 4
WARPS_FOR_PEAK = 8
BARRIER_CYCLES = 30
REGISTERS = H100.limits.registers_per_sm
# Fraction of the binding rate a well-fed pipeline sustains (issue conflicts, tails).
SUSTAINED = 0.85


def gather_options(shape: ConvShape, maths: str, layout: str) -> list[tuple[str, int]]:
    """(gather, bk) pairs worth trying, best first: tap order with a bk that divides the group's
    channels; else whichever of tap (channels padded to bk) and table (reduction padded to bk)
    pads less, the table's lookups counted as 25% more work (5% reading NHWC: one per
    vector)."""
    step = k_step(maths)
    sizes = [bk for bk in (32, 64, 16, 48) if bk % step == 0]
    exact = [("tap", bk) for bk in sizes if shape.Cg % bk == 0]
    if exact:
        return exact[:2]
    kk = shape.taps
    options = [("tap", bk) for bk in sizes[:2]]
    options += [("table", bk) for bk in (32, 16) if bk % step == 0]

    def work(option):
        gather, bk = option
        if gather == "tap":
            padded = blocks(shape.Cg, bk) * bk * kk
        else:
            padded = blocks(shape.Cg * kk, bk) * bk
        table_cost = 1.05 if layout == NHWC else 1.25
        return padded * (table_cost if gather == "table" else 1.0)

    return sorted(options, key=work)[:2]


def gather_rows(t: Tiling, maths: str, layout: str, shape: ConvShape) -> int:
    """B elements (NCHW) or vectors (NHWC) a thread gathers per K-tile."""
    if layout == NHWC:
        return vector_rows(t, channel_vector(shape.Cg, maths))
    return t.rows_per_thread * (t.bn // t.column_threads)


def estimate_registers(t: Tiling, maths: str, layout: str, rows: int) -> int:
    mf, nf = t.wm // 16, t.wn // 8
    sets = 2 if maths == "3xtf32" else 1
    fragments = sets * (mf * 4 + nf * 2)
    if layout == NHWC:
        held = 4 * rows  # a 64-bit offset and a row origin per B row
    else:
        held = rows if maths in HALF_MATHS else 0  # fp16/bf16 B elements in flight
    return min(255, sets * t.accumulators + fragments + held + 40)


def blocks_per_sm(t: Tiling, maths: str, layout: str, rows: int) -> int:
    regs = -(-estimate_registers(t, maths, layout, rows) // 8) * 8
    by_regs = REGISTERS // (regs * t.threads)
    by_smem = H100.limits.shared_per_sm // (smem_bytes(t, maths, layout)
                                            + H100.limits.reserved_shared_per_block)
    return max(1, min(by_regs, by_smem, 64 // (t.threads // 32)))


class WarpTiles(cost.Schedule):
    """A block per output tile (and K-split); every warp gathers its share of B and multiplies
    its warp tile by mma.sync. A block's K-tile costs the largest of its MMA, shared-memory, L2
    and issue cycles, plus a barrier, the MMA rate scaled down when the SM holds fewer than
    WARPS_FOR_PEAK warps; its loads, issued stages-1 K-tiles ahead (1 for NCHW fp16/bf16), must
    also cover their latency (cost.load_latency), shared among the blocks resident on the SM.
    Each block also pays an unhidden pipeline fill and its epilogue."""

    name = "mma.sync grid"

    def __init__(self, layout: str):
        self.layout = layout

    def resident(self, shape, t, maths):
        return blocks_per_sm(t, maths, self.layout, gather_rows(t, maths, self.layout, shape))

    def busy(self, shape, t, maths, waves, resident, k_count, epilogue):
        layout = self.layout
        half = maths in HALF_MATHS
        e = element_bytes(maths)
        warps = t.threads // 32
        mf, nf = t.wm // 16, t.wn // 8
        steps = t.bk // k_step(maths)  # MMA k-steps per K-tile
        mult = 3 if maths == "3xtf32" else 1
        mma = warps * mf * nf * steps * mult
        smem_read = warps * steps * (mf * 512 * a_parts(maths) + nf * 256)
        smem_write = t.bm * t.bk * e * a_parts(maths) + t.bn * t.bk * e
        # A comes from L2 every K-tile; most of an NCHW gather hits L1 (each input feeds K*K
        # taps), while the 16-byte NHWC copies bypass L1 (.cg).
        l2 = t.bm * t.bk * e * a_parts(maths) + t.bn * t.bk * e / (1 if layout == NHWC else 3)
        frag_loads = mf * a_parts(maths) + (nf // 2 if half else 2 * nf)
        converts = {"tf32": 2 * nf, "3xtf32": 6 * nf + mf * nf * 4 / steps}.get(maths, 0)
        rows = gather_rows(t, maths, layout, shape)
        if layout == NHWC:
            per_element = 3.0  # an address, a bounds test and one cp.async per vector
        else:
            per_element = (2.5 if half else 1.2) + (8.0 if t.gather == "table" else 0.0)
        gather = warps * (rows * per_element + 12)
        issue = warps * steps * (mf * nf * mult + frag_loads + converts) + gather
        mma_rate = MMA_PER_CYCLE * min(1.0, resident * warps / WARPS_FOR_PEAK)
        k_tile = max(mma / mma_rate, (smem_read + smem_write) / cost.SMEM_BYTES_PER_CYCLE,
                     l2 / cost.L2_BYTES_PER_CYCLE,
                     issue / ISSUE_PER_CYCLE) / SUSTAINED + BARRIER_CYCLES
        ahead = 1 if half and layout == NCHW else t.stages - 1
        latency = cost.load_latency(shape, t, maths, k_count)
        k_tile = max(k_tile, latency / (ahead * resident))
        per_block = k_count * k_tile + (latency + epilogue) / resident
        return waves * per_block

    def spills(self, shape, t, maths):
        rows = gather_rows(t, maths, self.layout, shape)
        return estimate_registers(t, maths, self.layout, rows) >= 255


WARP_GRIDS = ((2, 2), (1, 4), (4, 1), (2, 4), (4, 2), (1, 8), (8, 1))


class MmaSync(cost.Family):
    """The mma.sync kernels over one activation layout."""

    def __init__(self, layout: str):
        self.layout = layout
        self.schedule = WarpTiles(layout)

    def candidates(self, shape, maths):
        """Every valid tiling with warp tiles of at least 32x32 (or 16x64), M-padding within
        15% of the least, and split-K only where the output tiles cannot fill two waves."""
        layout = self.layout
        waste = {bm: blocks(shape.Mg, bm) * bm for bm in (32, 64, 96, 128, 192, 256)}
        least = min(waste.values())
        bms = [bm for bm, padded in waste.items() if padded <= 1.15 * least]
        stage_options = (2,) if maths in HALF_MATHS and layout == NCHW else (2, 3, 4)
        found = []
        for (gather, bk), bm, bn, (wgm, wgn), stages in itertools.product(
                gather_options(shape, maths, layout), bms, (32, 64, 128, 256), WARP_GRIDS,
                stage_options):
            base = Tiling(bm, bn, bk, wgm, wgn, stages, 1, gather)
            if tiling_problem(base, maths, layout) or base.accumulators < 32:
                continue
            for s in cost.split_options(shape, base):
                t = Tiling(bm, bn, bk, wgm, wgn, stages, s, gather)
                if not shape_problem(shape, t, layout, maths):
                    found.append(t)
        return found

    def schedule_of(self, t):
        return self.schedule

    def tie_break(self, t):
        """Squarer warp tiles (fewer fragment loads per MMA), then more stages (slack for load
        latency the model does not see)."""
        return abs(math.log2(t.wm / t.wn)), -t.stages


FAMILIES = {layout: MmaSync(layout) for layout in (NCHW, NHWC)}
