"""The one cost model that ranks implicit-GEMM tilings for a layer, every family alike
(`estimate`, `ranked`), and the short, varied list the tuner tries (`diverse`).

A tiling's modelled time is the busiest SM's: `ceil(tiles / SMS)` waves of blocks, each block's
K-loop and epilogue as its schedule runs them (`Schedule.busy`), at least the DRAM floor, plus
split-K's partial tiles through memory and an add-relu epilogue's exposed read of its kept
activation (`Schedule.kept_read`), all SPILL_PENALTY times over where the schedule expects the
tiling to spill. A family of kernels, one MMA instruction's over one activation layout
(`Family`: the mma.sync kernels in igemm.mma_sync, the wgmma ones in igemm.wgmma), says which
tilings it can run on a layer, which schedule runs each, and how ranking breaks ties. Its rates
are the H100's, calibrated on what `convlab tune` measured."""

from __future__ import annotations

from functools import lru_cache

from ...gpu.hardware import H100
from ...shapes import ConvShape
from .tiling import Tiling, a_parts, element_bytes, k_tiles, output_tiles

# H100 SXM figures every family's schedules share (only ratios matter): shared-memory and L2
# bytes per SM per cycle, DRAM bytes per cycle for the whole GPU, the clock, and the latency a
# K-tile's loads must hide (from L2, and from DRAM under a streaming load): the tuner's sweeps
# (checked by bench/calibration.py against results/h100/channels-last-20261125) set these two.
SMS = H100.sms
SMEM_BYTES_PER_CYCLE = 128
L2_BYTES_PER_CYCLE = 48
DRAM_BYTES_PER_CYCLE = 1700
LOAD_LATENCY = 1000
DRAM_LATENCY = 3000
CLOCK_MHZ = 1755
# A tiling its schedule expects to spill registers (Schedule.spills) takes this much longer.
SPILL_PENALTY = 1.3


class Schedule:
    """What the cost model asks of a schedule: how many of a tiling's blocks an SM runs at once,
    the busiest SM's cycles for its K-loops and epilogues, whether it spills, and the exposed
    time of an add-relu epilogue's kept read."""

    name = ""

    def resident(self, shape: ConvShape, t: Tiling, maths: str) -> int:
        """Blocks of `t` an SM runs at once."""
        raise NotImplementedError

    def busy(self, shape: ConvShape, t: Tiling, maths: str, waves: int, resident: int,
             k_count: float, epilogue: float) -> float:
        """Cycles of the busiest SM: `waves` blocks a slot, `resident` of them at once, each
        `k_count` K-tiles and an epilogue of `epilogue` cycles."""
        raise NotImplementedError

    def spills(self, shape: ConvShape, t: Tiling, maths: str) -> bool:
        """Whether `t`'s threads are expected to spill registers (SPILL_PENALTY)."""
        return False

    def kept_read(self, shape: ConvShape, t: Tiling, kept_bytes: int) -> float:
        """Cycles an add-relu epilogue waits for its kept activation (elements of `kept_bytes`
        bytes), beyond the K-loops."""
        raise NotImplementedError(f"the {self.name} schedule's kept read was never measured")


class Family:
    """One family of kernels (one MMA instruction over one activation layout) as the cost model
    sees it: the tilings it can run on a layer, the schedule that runs each, and how ranking
    breaks a tie in modelled time."""

    def candidates(self, shape: ConvShape, maths: str) -> list[Tiling]:
        raise NotImplementedError

    def schedule_of(self, t: Tiling) -> Schedule:
        raise NotImplementedError

    def tie_break(self, t: Tiling) -> tuple:
        raise NotImplementedError


def estimate(shape: ConvShape, t: Tiling, maths: str, family: Family,
             kept_bytes: int = 0) -> float:
    """Modelled microseconds of `t` on the layer, for ranking: the busiest SM's waves of blocks
    (Schedule.busy), at least the DRAM floor; split-K's partial tiles written and read back;
    with `kept_bytes` (an add-relu epilogue reading a kept activation of that element size),
    the kept read's exposed time (Schedule.kept_read); SPILL_PENALTY where it spills."""
    schedule = family.schedule_of(t)
    tiles = output_tiles(shape, t) * t.split_k
    waves = -(-tiles // SMS)
    resident = min(schedule.resident(shape, t, maths), waves)
    k_count = k_tiles(shape, t) / t.split_k
    epilogue = 2 * t.bm * t.bn * 4 / SMEM_BYTES_PER_CYCLE
    total = max(schedule.busy(shape, t, maths, waves, resident, k_count, epilogue),
                dram_bytes(shape, maths) / DRAM_BYTES_PER_CYCLE)
    if t.split_k > 1:
        total += tiles * t.bm * t.bn * 8 / DRAM_BYTES_PER_CYCLE
    if kept_bytes:
        total += schedule.kept_read(shape, t, kept_bytes)
    if schedule.spills(shape, t, maths):
        total *= SPILL_PENALTY
    return total / CLOCK_MHZ


@lru_cache(maxsize=512)
def ranked(shape: ConvShape, maths: str, family: Family,
           kept_bytes: int = 0) -> tuple[Tiling, ...]:
    """The family's candidates for the layer by modelled time (`estimate`'s, `kept_bytes` as
    there), ties broken by the family (Family.tie_break), then by name."""
    def key(t):
        return (round(estimate(shape, t, maths, family, kept_bytes), 2), *family.tie_break(t),
                t.brief())
    return tuple(sorted(family.candidates(shape, maths), key=key))


def dram_bytes(shape: ConvShape, maths: str) -> float:
    """Bytes the layer must move through device memory: inputs and weights in the kernel's
    element type (the weights twice for 3xTF32: big and small parts), float32 bias and
    outputs."""
    e = element_bytes(maths)
    inputs = shape.B * shape.C * shape.H * shape.W
    weights = shape.M * shape.Cg * shape.taps * a_parts(maths)
    outputs = shape.B * shape.M * shape.Ho * shape.Wo
    return e * (inputs + weights) + 4 * (outputs + shape.M)


def load_latency(shape: ConvShape, t: Tiling, maths: str, k_count: float) -> float:
    """Cycles a K-tile's loads take to land: L2's latency where the blocks reread what other
    blocks brought in, growing toward DRAM's loaded latency as the share of bytes loaded that
    no other block has loaded (the layer's bytes over all blocks' loads) grows: a
    fully-connected layer streams its weights once."""
    e = element_bytes(maths)
    loaded = (output_tiles(shape, t) * t.split_k * k_count
              * (t.bm * a_parts(maths) + t.bn) * t.bk * e)
    unique = min(1.0, dram_bytes(shape, maths) / loaded)
    return LOAD_LATENCY + unique * (DRAM_LATENCY - LOAD_LATENCY)


def split_options(shape: ConvShape, base: Tiling) -> list[int]:
    """K-splits worth trying for `base`: 1, and 2, 4 or 8 where the output tiles cannot fill
    two waves and each split keeps at least 4 K-tiles."""
    if output_tiles(shape, base) >= 2 * SMS:
        return [1]
    return [1] + [s for s in (2, 4, 8) if k_tiles(shape, base) >= 4 * s]


def diverse(tilings: tuple[Tiling, ...], count: int, per_block_tile: int = 2) -> list[Tiling]:
    """The first `count` of `tilings`, at most `per_block_tile` of each block tile and split,
    so a short list still spans the space."""
    seen: dict[tuple, int] = {}
    chosen = []
    for t in tilings:
        key = (t.bm, t.bn, t.bk, t.gather, t.split_k, t.schedule)
        if seen.get(key, 0) < per_block_tile:
            seen[key] = seen.get(key, 0) + 1
            chosen.append(t)
            if len(chosen) == count:
                break
    return chosen
