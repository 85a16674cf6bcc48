"""Host-side operand preparation: the filters as a GEMM operand in mma fragment order (split
into big and small TF32 parts for 3xTF32, bf16 bits for bf16), done once when an op is
prepared. The input's conversion is igemm.staging's."""

import numpy as np

from ...shapes import NCHW, NHWC, ConvShape
from ..base import blocks
from ..tensorcore import round_tf32
from .tiling import HALF_MATHS, Tiling, k_tiles, m_tiles

# --- host-side operand preparation -------------------------------------------------------------

def gemm_weights(weights: np.ndarray, shape: ConvShape, t: Tiling,
                 layout: str = NCHW) -> np.ndarray:
    """The filters as the kernel's A matrices, [G][MTILES*bm][KTILES*bk], zero-padded, with the
    columns in the kernel's k order: for "tap" k = (chunk*KK + tap)*bk + j holds channel
    chunk*bk + j at filter tap (p, q) = divmod(tap, Kw); for "table", (c, p, q) reading NCHW
    and (p, q, c) reading NHWC. Filters with fewer channels per group than `shape` (a
    channels-last kernel's padded channels) get zero filters for the rest."""
    G, Mg, Cg, kk = shape.groups, shape.Mg, shape.Cg, shape.taps
    given = np.asarray(weights, dtype=np.float32).reshape(G, Mg, -1, kk)
    w = np.zeros((G, Mg, Cg, kk), dtype=np.float32)
    w[:, :, :given.shape[2]] = given
    a = np.zeros((G, m_tiles(shape, t) * t.bm, k_tiles(shape, t) * t.bk), dtype=np.float32)
    if t.gather == "table" and layout == NHWC:
        a[:, :Mg, :Cg * kk] = w.transpose(0, 1, 3, 2).reshape(G, Mg, kk * Cg)
    elif t.tap_order:
        chunks = blocks(Cg, t.bk)
        padded = np.zeros((G, Mg, chunks * t.bk, kk), dtype=np.float32)
        padded[:, :, :Cg] = w
        tapwise = padded.reshape(G, Mg, chunks, t.bk, kk).transpose(0, 1, 2, 4, 3)
        a[:, :Mg] = tapwise.reshape(G, Mg, -1)
    else:
        a[:, :Mg, :Cg * kk] = w.reshape(G, Mg, Cg * kk)
    return a


def split_tf32(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """a = big + small (to ~2^-22 relative): both TF32 values, small = the rounded residual."""
    big = round_tf32(a)
    return big, round_tf32(a - big)


def to_bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns, rounding to nearest even (finite inputs)."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def cross_bf16(a: np.ndarray, bk: int) -> np.ndarray:
    """[G][rows][KTILES*bk] float32 -> [G][rows][KTILES*2*bk] bfloat16 bits: each K-tile's
    TF32 big part (split_tf32's) then its exact residual, each rounded to BF16: the A side of
    the cross terms big x small + small x big as one BF16 product over twice the K."""
    G, rows, cols = a.shape
    big = round_tf32(a)
    parts = [to_bf16_bits(p).reshape(G, rows, cols // bk, 1, bk) for p in (big, a - big)]
    return np.concatenate(parts, axis=3).reshape(G, rows, 2 * cols)


def fragment_order(a: np.ndarray, t: Tiling, half: bool) -> np.ndarray:
    """[G][rows][cols] -> [G][MTILES][KTILES][bm*bk] in mma fragment order (lane g*4+t).

    m16n8k8 TF32: lane (g, t) of row tile i, k-step s holds a0..a3 = (g, t), (g+8, t), (g, t+4),
    (g+8, t+4), i.e. register h + 2e for row g + 8h, k t + 4e. m16n8k16 16-bit: registers
    (g, 2t..2t+1), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..): half h + 2*e8 for row g + 8h,
    k 8*e8 + 2t + e1, with e1 the low/high half of the register.
    """
    G, rows, cols = a.shape
    mt, kt = rows // t.bm, cols // t.bk
    if half:
        v = a.reshape(G, mt, t.bm // 16, 2, 8, kt, t.bk // 16, 2, 4, 2)
        # axes: G, mt, i, h, g, kt, s, e8, t, e1 -> G, mt, kt, i, s, g, t, e8, h, e1
        v = v.transpose(0, 1, 5, 2, 6, 4, 8, 7, 3, 9)
    else:
        v = a.reshape(G, mt, t.bm // 16, 2, 8, kt, t.bk // 8, 2, 4)
        # axes: G, mt, i, h, g, kt, s, e, t -> G, mt, kt, i, s, g, t, e, h
        v = v.transpose(0, 1, 5, 2, 6, 4, 8, 7, 3)
    return np.ascontiguousarray(v).reshape(G, mt, kt, t.bm * t.bk)


def operand_parts(a: np.ndarray, maths: str) -> list[np.ndarray]:
    """The A operand as the maths' tensor cores read it: TF32-rounded (tf32), split big then
    small (3xtf32), or fp16 / bf16 bits."""
    if maths == "tf32":
        return [round_tf32(a)]
    if maths == "3xtf32":
        return list(split_tf32(a))
    if maths == "fp16":
        return [a.astype(np.float16).view(np.uint16)]
    return [to_bf16_bits(a)]


def pack_weights(weights: np.ndarray, shape: ConvShape, t: Tiling, maths: str,
                 layout: str = NCHW) -> np.ndarray:
    """What the kernel's `wpack` holds: per (group, m-tile, k-tile) the A parts in fragment
    order."""
    parts = operand_parts(gemm_weights(weights, shape, t, layout), maths)
    half = maths in HALF_MATHS
    return np.ascontiguousarray(np.stack([fragment_order(p, t, half) for p in parts], axis=3))


def last_tile_rows(shape: ConvShape, t: Tiling, parts: int) -> int:
    """The rows a group's last m-tile keeps of each K-tile in a wgmma pack (the kernel's
    A_LAST_ROWS): its output channels in whole 8-row swizzle atoms, or all bm rows where a
    K-tile holds two parts."""
    if parts > 1:
        return t.bm
    return blocks(shape.Mg - (m_tiles(shape, t) - 1) * t.bm, 8) * 8


def trim_last_tiles(tiles: np.ndarray, rows: int, bm: int) -> np.ndarray:
    """[G][MTILES][KTILES][...one K-tile] -> what the kernel reads (FilterTiles): every group's
    last m-tile, first in its group, keeps the first `rows` of bm rows of each K-tile. A copy
    moves a whole K-tile, so past the last trimmed one it reads the next m-tile's, or, where a
    group has one m-tile, a zero tail as long as the rows dropped. A swizzled K-tile lays its
    rows out one after another, so its first rows are a prefix."""
    if rows == bm:
        return np.ascontiguousarray(tiles)
    G, mt, kt = tiles.shape[:3]
    flat = tiles.reshape(G, mt, kt, -1)
    keep = flat.shape[-1] * rows // bm
    pieces = []
    for g in range(G):
        pieces += [flat[g, -1, :, :keep].ravel(), flat[g, :-1].ravel()]
    if mt == 1:
        pieces.append(np.zeros(flat.shape[-1] - keep, dtype=tiles.dtype))
    return np.concatenate(pieces)
