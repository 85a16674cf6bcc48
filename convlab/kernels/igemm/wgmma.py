"""The Hopper mainloop: warpgroup MMAs (`wgmma.mma_async`, sm_90a) reading both operands from
128-byte-swizzled shared memory through descriptors, one group of them in flight while the next
K-tile's copies land. Beside it the host side of that layout: the filters packed as the swizzled
shared-memory image of each A tile, the tiling rules and the tilings worth trying.

The accumulators of a warpgroup's m64nN product sit in each warp as those of a 16 x N mma.sync
warp tile (warp w of the group holds rows 16w..16w+15): with WARPS_M = NWARPS and WARPS_N = 1
the mma.sync pieces' epilogue and split-K reduce take them unchanged.
"""

import itertools
from functools import lru_cache

import numpy as np

from ...gpu.hardware import H100
from ...gpu.hopper import WGMMA_NS, WGMMA_PTX
from ...shapes import ConvShape
from . import cost
from .tiling import (MAX_SMEM, Tiling, a_parts, channel_vector, element_bytes, k_tiles,
                     output_tiles, shape_problem)

ROW_BYTES = 128  # one swizzle atom row, BK elements: a K-tile
SWIZZLE_ALIGN = 1024  # an atom (8 rows) is 1 KB: tiles start on 1 KB, the host asks for 1 KB more
INSTRUCTIONS = WGMMA_PTX

COMPUTE = r"""
    float acc[MF][NF][4];
#pragma unroll
    for (int j = 0; j < NF; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[0][j][e] = 0.0f;
    fence_operands(acc);

    // Warpgroup wg multiplies rows 64wg..64wg+63 of the A tile by the whole B tile into d; each
    // k-step moves the descriptors 32 bytes along the 128-byte rows (the swizzle acts on address
    // bits 4-6 against 7-9, which a step inside the row leaves alone).
    const unsigned wg_rows = (warp / 4) * 64 * 128;
    auto compute = [&](int stage, float (&d)[MF][NF][4]) {
        const unsigned sa = smem_u32(smem + stage * STAGE_WORDS) + wg_rows;
        const unsigned sb = smem_u32(smem + stage * STAGE_WORDS + A_WORDS);
        wgmma_fence();
#pragma unroll
        for (int s = 0; s < KSTEPS; ++s) {
#if MODE == 1
            // 3xTF32: each operand is a big + small TF32 pair (A's small tile follows its big
            // one, as B's does); small x big and big x small first, the big product last. The
            // K-tile's first product starts a fresh partial sum.
            wgmma_tile(d, swizzle128_desc(sa + BM * 128 + s * 32), swizzle128_desc(sb + s * 32),
                       s > 0);
            wgmma_tile(d, swizzle128_desc(sa + s * 32), swizzle128_desc(sb + B_WORDS * 4 + s * 32));
#endif
            wgmma_tile(d, swizzle128_desc(sa + s * 32), swizzle128_desc(sb + s * 32));
        }
        wgmma_commit();
    };
#if MODE <= 1
    // wgmma reads a TF32 operand by dropping each float's low 13 bits; the filters are rounded
    // (3xTF32: split) on the host, and each thread rounds the B vectors it copied to nearest
    // once they land (3xTF32: and writes the rounded residual to B's small tile). One vector
    // access per copy, as it was copied: a warp's lanes cover whole 128-byte rows.
#if VEC == 4
    typedef float4 vec_t;
#else
    typedef float2 vec_t;
#endif
    auto round_b = [&](int stage) {
        float* sb = smem + stage * STAGE_WORDS + A_WORDS;
#pragma unroll
        for (int i = 0; i < BN_ROWS; ++i) {
            vec_t* p = reinterpret_cast<vec_t*>(sb + (B_VEC_OFFSET(row0 + i * ROW_STEP, kc)) / 4);
            vec_t v = *p;
            float* f = reinterpret_cast<float*>(&v);
#if MODE == 1
            vec_t r;
            float* small = reinterpret_cast<float*>(&r);
#endif
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                const float big = __uint_as_float(to_tf32(f[e]));
#if MODE == 1
                small[e] = __uint_as_float(to_tf32(f[e] - big));
#endif
                f[e] = big;
            }
            *p = v;
#if MODE == 1
            p[B_WORDS / VEC] = r;
#endif
        }
    };
#endif
"""

PIPELINE = r"""
    // STAGES-2 K-tiles of copies in flight and one group of wgmmas. At step it the barrier says
    // that tile it has landed (each thread waited for its copies and fenced them) and that every
    // warpgroup has retired tile it-2's wgmmas (wait_group 1 after issuing tile it-1), so tile
    // it-2's stage, (it + STAGES - 2) % STAGES, takes tile it + STAGES - 2.
    const int kbeg = (int)((long long)split * KTILES / SPLIT_K);
    const int nk = (int)((long long)(split + 1) * KTILES / SPLIT_K) - kbeg;
#pragma unroll
    for (int s = 0; s < STAGES - 2; ++s) {
        if (s < nk) load_tile(s, kbeg + s);
        cp_async_commit();
    }
#if MODE == 1
    // 3xTF32: a K-tile's products go to a fresh partial sum, added to the running one with FP32
    // adds (round to nearest) once its group retires: the tensor cores' truncating accumulation
    // then spans one K-tile, not the whole reduction (as in the mma.sync kernel). Two partial
    // sums take turns, so tile it's wgmmas run while tile it-1's sum is added.
    float part0[MF][NF][4], part1[MF][NF][4];
    auto add_partial = [&](float (&p)[MF][NF][4]) {
        fence_operands(p);
#pragma unroll
        for (int j = 0; j < NF; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[0][j][e] += p[0][j][e];
    };
#pragma unroll
    for (int j = 0; j < NF; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) part0[0][j][e] = part1[0][j][e] = 0.0f;
    fence_operands(part0);
    fence_operands(part1);
#endif
    auto step = [&](int it, float (&d)[MF][NF][4], float (&retired)[MF][NF][4]) {
        cp_async_wait<STAGES - 3>();
#if MODE <= 1
        round_b(it % STAGES);
#endif
        fence_proxy_async();
        __syncthreads();
        const int ahead = it + STAGES - 2;
        if (ahead < nk) load_tile(ahead % STAGES, kbeg + ahead);
        cp_async_commit();
        compute(it % STAGES, d);
        wgmma_wait<1>();
#if MODE == 1
        if (it > 0) add_partial(retired);
#endif
    };
#if MODE == 1
    for (int it = 0; it < nk; it += 2) {
        step(it, part0, part1);
        if (it + 1 < nk) step(it + 1, part1, part0);
    }
    wgmma_wait<0>();
    if (nk & 1)
        add_partial(part0);
    else if (nk > 0)
        add_partial(part1);
#else
    for (int it = 0; it < nk; ++it) step(it, acc, acc);
    wgmma_wait<0>();
#endif
    fence_operands(acc);
    cp_async_wait<0>();
    __syncthreads();  // every warpgroup is done with the stages before the C tile overwrites them
"""


# --- the host side ------------------------------------------------------------------------------

def swizzle_tiles(a: np.ndarray, t: Tiling) -> np.ndarray:
    """[G][MTILES*bm][KTILES*bk] elements -> [G][MTILES][KTILES][bm*bk]: each A tile as the
    kernel's shared memory holds it, rows of 128 bytes with 16-byte chunk c of row m at chunk
    c ^ (m % 8), so the kernel copies it as it is."""
    G, rows, cols = a.shape
    mt, kt = rows // t.bm, cols // t.bk
    per_chunk = 16 // a.itemsize
    v = a.reshape(G, mt, t.bm, kt, ROW_BYTES // 16, per_chunk).transpose(0, 1, 3, 2, 4, 5)
    m = np.arange(t.bm)[:, None]
    chunk = np.arange(ROW_BYTES // 16)[None, :]
    out = np.empty_like(v)
    out[:, :, :, m, chunk ^ (m % 8)] = v[:, :, :, m, chunk]
    return np.ascontiguousarray(out).reshape(G, mt, kt, t.bm * t.bk)


def smem_bytes(t: Tiling, maths: str) -> int:
    """The stages (A and B rows of 128 bytes, unpadded; both twice for 3xTF32's big and small
    parts) or the epilogue's C tile, plus the alignment slack."""
    stages = t.stages * (t.bm + t.bn) * a_parts(maths) * ROW_BYTES
    return max(stages, t.bn * (t.bm + 4) * 4) + SWIZZLE_ALIGN


def k_elements(maths: str) -> int:
    """BK: one 128-byte swizzle row of the element type."""
    return ROW_BYTES // element_bytes(maths)


def tiling_problem(t: Tiling, maths: str) -> str:
    """Why a wgmma kernel cannot be compiled with `t`, or ""."""
    if t.gather not in ("tap", "table"):
        return f"gather must be 'tap' or 'table', not {t.gather!r}"
    if t.warps_n != 1 or t.warps_m not in (4, 8):
        return "one or two warpgroups stacked along M: warps_m 4 or 8, warps_n 1"
    if t.bm != 16 * t.warps_m:
        return f"bm must be 64 per warpgroup: {16 * t.warps_m}"
    if t.bk != k_elements(maths):
        return f"bk must be {k_elements(maths)} (one 128-byte swizzle row of {maths})"
    if t.bn not in WGMMA_NS:
        return f"bn must be one of {', '.join(map(str, WGMMA_NS))}"
    if t.bn > MAX_BN.get(maths, t.bn):
        return (f"bn must be at most {MAX_BN[maths]} for {maths}: a thread holds three "
                f"accumulator sets of bn/2 registers (the sum and two K-tile partial sums)")
    if not 3 <= t.stages <= 8:
        return "stages must be 3 to 8 (two K-tiles beyond the one the wgmmas read)"
    if t.split_k < 1:
        return "split_k must be at least 1"
    if smem_bytes(t, maths) > MAX_SMEM:
        return f"needs {smem_bytes(t, maths)} bytes of shared memory; at most {MAX_SMEM}"
    return ""


def layer_problem(shape: ConvShape, t: Tiling, maths: str) -> str:
    """Why `t` cannot run the (channel-padded) layer, or "": the channels-last gather's rules,
    and rows a thread copies keeping one swizzle phase (8 | rows between them)."""
    problem = shape_problem(shape, t, "NHWC", maths)
    if problem:
        return problem
    step = t.threads // (t.bk // channel_vector(shape.Cg, maths))
    if step % 8:
        return f"the gather's row step {step} must be a multiple of 8 for the swizzle"
    return ""


# 3xTF32 adds two partial sums beside the running one: 3 * 96/2 = 144 registers at bn 96.
MAX_BN = {"3xtf32": 96}
# dense, per SM; 3xTF32 issues three TF32 products per step
WGMMA_FLOP_PER_CYCLE = {"fp16": 4096, "bf16": 4096, "tf32": 2048, "3xtf32": 2048 / 3}


def estimate(shape: ConvShape, t: Tiling, maths: str) -> float:
    """Modelled microseconds, for ranking: the busiest SM's waves of blocks, each K-tile the
    larger of the resident blocks' wgmma cycles (a narrow N re-reads A: less efficient) and
    the loads' latency over the STAGES-2 tiles in flight; at least the DRAM floor."""
    threads = t.threads
    registers = -(-((2 * a_parts(maths) - 1) * t.bn // 2 + 56) // 8) * 8
    resident = max(1, min(H100.limits.registers_per_sm // (registers * threads),
                          H100.limits.shared_per_sm // (smem_bytes(t, maths)
                                                        + H100.limits.reserved_shared_per_block),
                          2))
    tiles = output_tiles(shape, t) * t.split_k
    per_sm = -(-tiles // cost.SMS)
    resident = min(resident, per_sm)
    mma = 2 * t.bm * t.bn * t.bk / WGMMA_FLOP_PER_CYCLE[maths] * (1 + 32 / t.bn)
    k_count = k_tiles(shape, t) / t.split_k
    latency = cost.load_latency(shape, t, maths, k_count)
    k_tile = max(mma * resident, latency / (t.stages - 2)) / resident
    epilogue = 2 * t.bm * t.bn * 4 / cost.SMEM_BYTES_PER_CYCLE
    total = per_sm * (k_count * k_tile + (latency + epilogue) / resident)
    total = max(total, cost.dram_bytes(shape, maths) / cost.DRAM_BYTES_PER_CYCLE)
    if t.split_k > 1:
        total += tiles * t.bm * t.bn * 8 / cost.DRAM_BYTES_PER_CYCLE
    return total / cost.CLOCK_MHZ


def candidates(shape: ConvShape, maths: str) -> list[Tiling]:
    """Every valid tiling: one or two warpgroups, each N the instruction allows, 3-6 stages,
    the gather orders `cost.gather_options` would take, split-K where the tiles cannot fill two
    waves."""
    bk = k_elements(maths)
    gathers = ["tap"] if shape.Cg % bk == 0 else ["tap", "table"]
    found = []
    for gather, warps, bn, stages in itertools.product(gathers, (8, 4), WGMMA_NS, range(3, 7)):
        base = Tiling(16 * warps, bn, bk, warps, 1, stages, 1, gather)
        if tiling_problem(base, maths):
            continue
        splits = [1]
        if output_tiles(shape, base) < 2 * cost.SMS:
            splits += [s for s in (2, 4, 8) if k_tiles(shape, base) >= 4 * s]
        for s in splits:
            t = Tiling(base.bm, bn, bk, warps, 1, stages, s, gather)
            if not layer_problem(shape, t, maths):
                found.append(t)
    return found


@lru_cache(maxsize=256)
def ranked(shape: ConvShape, maths: str) -> tuple[Tiling, ...]:
    """Candidates by modelled time; ties to the wider N (fewer A re-reads), then more stages."""
    def key(t):
        return (round(estimate(shape, t, maths), 2), -t.bn, -t.stages, t.brief())
    return tuple(sorted(candidates(shape, maths), key=key))
