"""Winograd's minimal filtering F(m x m, 3 x 3): its transform matrices, built exactly from
interpolation points, and a NumPy model of the `winograd` variant's arithmetic.

One output tile of m x m is A^T [ (G g G^T) * (B^T d B) ] A, with d the (m+2) x (m+2) input tile
and g the 3x3 filter (cross-correlation, as everywhere in convlab). The matrices come from
Toom-Cook on the points p_0 .. p_{m} plus infinity (Lavin & Gray, "Fast Algorithms for
Convolutional Neural Networks", 2016): A^T holds powers of the points, G evaluates the filter
polynomial at them, B^T is the transposed inverse Vandermonde matrix. Each row of B^T is scaled
to end in 1 and G takes the inverse scale, so the data-side matrices carry the small integers
and the filter-side one the fractions (filters are transformed once, in float64, on the host).
Everything is built in exact rationals, so the Winograd identity holds exactly and the tests
check it, and every coefficient the kernels use is exactly representable in float32.

`emulate` repeats the variant's float32 operations in the kernels' order (transforms as fused
multiply-adds in row order, zero coefficients skipped; the product in float32 by NumPy's
matmul), so its error predicts the variant's before any GPU runs; run in float64 it is a
convolution to float64 rounding.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

import numpy as np

R = 3  # filter size: the variant is F(m x m, 3 x 3)
# Finite interpolation points per output tile size m (infinity is always the last point).
# m = 2 is the variant's (see winograd.py for why F(4x4) and F(3x3) are not offered).
POINTS = {2: (0, 1, -1), 3: (0, 1, -1, 2), 4: (0, 1, -1, 2, -2)}


@dataclass(frozen=True)
class Transforms:
    m: int
    AT: np.ndarray  # m x a, Fractions
    G: np.ndarray  # a x 3, Fractions
    BT: np.ndarray  # a x a, Fractions

    @property
    def alpha(self) -> int:
        """Input tile side m + 2 (a x a transform positions)."""
        return self.m + R - 1

    def as_float(self, name: str, dtype=np.float64) -> np.ndarray:
        return getattr(self, name).astype(np.float64).astype(dtype)


def _inverse(matrix: list[list[Fraction]]) -> list[list[Fraction]]:
    """Gauss-Jordan inverse in exact rationals."""
    n = len(matrix)
    rows = [list(r) + [Fraction(int(i == j)) for j in range(n)] for i, r in enumerate(matrix)]
    for col in range(n):
        pivot = next(r for r in range(col, n) if rows[r][col] != 0)
        rows[col], rows[pivot] = rows[pivot], rows[col]
        lead = rows[col][col]
        rows[col] = [v / lead for v in rows[col]]
        for r in range(n):
            if r != col and rows[r][col] != 0:
                f = rows[r][col]
                rows[r] = [a - f * b for a, b in zip(rows[r], rows[col])]
    return [r[n:] for r in rows]


@lru_cache(maxsize=None)
def transform_matrices(m: int, points: tuple | None = None) -> Transforms:
    """A^T, G, B^T of F(m x m, 3 x 3) on `points` (default POINTS[m]) plus infinity."""
    pts = [Fraction(p) for p in (points or POINTS[m])]
    a = m + R - 1
    if len(pts) != a - 1 or len(set(pts)) != len(pts):
        raise ValueError(f"F({m}x{m}, 3x3) needs {a - 1} distinct finite points, got {points}")

    def powers(p, k):
        return [p ** i for i in range(k)]

    def at_infinity(k):
        return [Fraction(0)] * (k - 1) + [Fraction(1)]

    inverse = _inverse([powers(p, a) for p in pts] + [at_infinity(a)])
    AT = [[powers(p, m)[i] for p in pts] + [at_infinity(m)[i]] for i in range(m)]
    G = [powers(p, R) for p in pts] + [at_infinity(R)]
    BT = []
    for j in range(a):
        row = [inverse[i][j] for i in range(a)]
        scale = next(v for v in reversed(row) if v != 0)
        BT.append([v / scale for v in row])
        G[j] = [v * scale for v in G[j]]
    return Transforms(m, np.array(AT, dtype=object), np.array(G, dtype=object),
                      np.array(BT, dtype=object))


def c_initializer(matrix: np.ndarray) -> str:
    """A matrix of float32-exact coefficients as a C brace initializer (no spaces: a -D value)."""
    values = matrix.astype(np.float64)
    if not np.array_equal(values.astype(np.float32).astype(np.float64), values):
        raise ValueError("a data-side transform coefficient is not exact in float32")
    return "{" + ",".join("{" + ",".join(f"{float(v)!r}f" for v in row) + "}"
                          for row in values) + "}"


def weight_transform(weights: np.ndarray, m: int, dtype=np.float32) -> np.ndarray:
    """U[position][m][c] = (G g G^T)[position] for every filter, in float64, rounded once to
    `dtype`; position = row * a + column of the a x a transform."""
    t = transform_matrices(m)
    G = t.as_float("G")
    U = np.einsum("ip,mcpq,jq->ijmc", G, np.asarray(weights, dtype=np.float64), G)
    return np.ascontiguousarray(U.reshape(t.alpha * t.alpha, *weights.shape[:2]), dtype=dtype)


def _combine(coefficients, terms, dtype):
    """sum_j c_j * t_j as the kernels compute it: acc = fma(c_j, t_j, acc) from acc = 0, in j
    order, skipping zero coefficients. float32 FMAs are modelled in float64 and rounded once (the
    product of a float32 and a small dyadic coefficient is exact in float64, so this is the FMA
    up to a double rounding in rare ties)."""
    acc = None
    for c, t in zip(coefficients, terms):
        if c == 0:
            continue
        if dtype == np.float32:
            total = float(c) * t.astype(np.float64)
            if acc is not None:
                total += acc.astype(np.float64)
            acc = total.astype(np.float32)
        else:
            acc = float(c) * t + (0.0 if acc is None else acc)
    return acc


def emulate(x: np.ndarray, w: np.ndarray, shape, m: int = 2, bias: np.ndarray | None = None,
            relu: bool = False, dtype=np.float32) -> np.ndarray:
    """The variant's output for a 3x3 stride-1 layer, computed in NumPy in `dtype` with the
    kernels' transforms and operation order (see the module docstring)."""
    t = transform_matrices(m)
    a, P = t.alpha, t.alpha * t.alpha
    B, C, H, W = x.shape
    Gr, Cg, Mg = shape.groups, shape.Cg, shape.Mg
    th, tw = -(-shape.Ho // m), -(-shape.Wo // m)
    p = shape.pad
    padded = np.zeros((B, C, th * m + 2, tw * m + 2), dtype=dtype)
    rows, cols = min(H, th * m + 2 - p), min(W, tw * m + 2 - p)
    padded[:, :, p:p + rows, p:p + cols] = x[:, :, :rows, :cols]
    d = np.lib.stride_tricks.sliding_window_view(padded, (a, a), axis=(2, 3))[:, :, ::m, ::m]
    BT, AT = t.BT, t.AT
    # B^T d, then (B^T d) B: s[i][k] = sum_j BT[i][j] d[j][k]; v[i][l] = sum_k s[i][k] BT[l][k]
    s = [[_combine(BT[i], [d[..., j, k] for j in range(a)], dtype) for k in range(a)]
         for i in range(a)]
    v = np.stack([np.stack([_combine(BT[l], s[i], dtype) for l in range(a)], -1)
                  for i in range(a)], -2)  # B, C, th, tw, a, a
    v = v.reshape(B, Gr, Cg, th * tw, P).transpose(4, 1, 2, 0, 3).reshape(P, Gr, Cg, B * th * tw)
    U = weight_transform(w, m, dtype).reshape(P, Gr, Mg, Cg)
    product = np.matmul(U, v).reshape(a, a, shape.M, B, th, tw)
    # A^T M, then (A^T M) A
    s = [[_combine(AT[i], [product[j, k] for j in range(a)], dtype) for k in range(a)]
         for i in range(m)]
    y = np.stack([np.stack([_combine(AT[l], s[i], dtype) for l in range(m)], -1)
                  for i in range(m)], -2)  # M, B, th, tw, m, m
    y = y.transpose(1, 0, 2, 4, 3, 5).reshape(B, shape.M, th * m, tw * m)
    y = y[:, :, :shape.Ho, :shape.Wo]
    if bias is not None:
        y = y + np.asarray(bias, dtype=dtype)[None, :, None, None]
    if relu:
        y = np.maximum(y, 0)
    return np.ascontiguousarray(y, dtype=dtype)
