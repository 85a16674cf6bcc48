"""What is wrong with a wrong conv output: the pattern, not just the worst element.

Given the kernel's output (NaN where it never wrote), the float64 reference and its error
bound, and the problem itself, `diagnose` says which images, channels, rows and columns are
wrong (as ranges, and where wrong outputs concentrate), whether that region is an edge band (a
border of width K-1) or repeats with a tile period (a tiling bug), whether outputs were never
written, and whether the output equals the reference after a known mistake: shifted by one row
or column, transposed, a flipped filter (a convolution rather than a cross-correlation), a
transposed filter, output channels permuted, an input channel or a filter row, column or tap
left out, the bias or the ReLU missing. Last, whether the errors are rounding-sized (a
precision problem) or gross (a logic error).

Known mistakes are tried on at most ALTERNATIVE_IMAGES images that contain wrong outputs, in
float64 on the CPU, so a diagnosis costs a few reference convolutions of those images.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from .reference import conv2d_with_magnitude, conv_shape_args, max_pool, relu, windows
from ..gpu.elements import values
from .verify import Reference, unit_roundoff

ALTERNATIVE_IMAGES = 4
MATCH_FRACTION = 0.99  # an explanation must fit this share of the outputs it is compared on
# An image counts as wholly wrong with this share of its outputs wrong: a zeroed image's outputs
# whose references lie within their bounds of zero pass by coincidence, a few of each image
# (the CI run of 2026-11-28 met one of 147), and a per-image pattern needs no finer line.
WHOLE_IMAGE_FRACTION = 0.9
ROUNDING_RATIO = 100.0  # errors within this many bounds look like rounding, not a bug
COARSEST_ROUNDING = 2.0 ** -7  # coarser than bf16's 2^-8: no arithmetic rounds that badly
WINDOW_BUDGET = 20_000_000  # elements of the im2col windows the per-channel tests may build
MAX_RANGES = 8
PRECISION_UNITS = {"fp32": 24, "tf32/fp16": 11, "bf16": 8}


@dataclass
class Diagnosis:
    findings: list[str]  # sentences, the most telling first
    total: int
    wrong: int  # finite outputs outside their bound
    unwritten: int  # NaN or infinite outputs
    region: dict[str, str] = field(default_factory=dict)
    explanation: str | None = None  # the known mistake the output matches, if any

    @property
    def passed(self) -> bool:
        return not (self.wrong or self.unwritten)

    def text(self) -> str:
        return " ".join(self.findings)

    def as_dict(self) -> dict:
        return {"findings": self.findings, "total": self.total, "wrong": self.wrong,
                "unwritten": self.unwritten, "region": self.region,
                "explanation": self.explanation}


def ranges(indices: Sequence[int], limit: int = MAX_RANGES) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8'; long lists are cut after `limit` ranges."""
    values = sorted(set(int(i) for i in indices))
    if not values:
        return "none"
    spans, start, prev = [], values[0], values[0]
    for v in values[1:]:
        if v != prev + 1:
            spans.append((start, prev))
            start = v
        prev = v
    spans.append((start, prev))
    words = [f"{a}" if a == b else f"{a}-{b}" for a, b in spans[:limit]]
    if len(spans) > limit:
        words.append(f"... ({len(spans)} ranges, {len(values)} in all)")
    return ", ".join(words)


def _axis_words(name: str, indices: np.ndarray, size: int, labels: Sequence[int] | None = None) -> str:
    shown = [labels[i] for i in indices] if labels is not None else list(indices)
    if len(indices) == size:
        return f"all {size} {name}"
    return f"{name} {ranges(shown)} (of {size})"


def edge_band(indices: np.ndarray, size: int) -> tuple[int, int] | None:
    """(first, last): the bad indices are exactly the first `first` and the last `last` of the
    axis, together under half of it; None when they are not such a band."""
    bad = set(int(i) for i in indices)
    if not bad or len(bad) * 2 > size:
        return None
    first = 0
    while first in bad:
        first += 1
    last = 0
    while size - 1 - last in bad:
        last += 1
    if first + last != len(bad):
        return None
    return first, last


def tile_period(indices: np.ndarray, size: int) -> tuple[int, list[int]] | None:
    """(tile, residues): the bad indices are those whose index mod `tile` falls in a few
    residues at a tile's edge, repeating over at least two tiles. The smallest such tile."""
    bad = sorted(set(int(i) for i in indices))
    if len(bad) < 2:
        return None
    for tile in range(2, size // 2 + 1):
        residues = sorted({i % tile for i in bad})
        if len(residues) * 4 > tile or len({i // tile for i in bad}) < 2:
            continue
        at_end = residues == list(range(tile - len(residues), tile))
        at_start = residues == list(range(len(residues)))
        if not (at_end or at_start):
            continue
        expected = [i for i in range(size) if i % tile in residues]
        if bad == expected or (set(bad) <= set(expected) and len(bad) >= len(expected) - 1):
            return tile, residues
    return None


def _through_epilogue(values: np.ndarray, epilogue: str | None,
                      kept: np.ndarray | None = None) -> np.ndarray:
    if epilogue == "add-relu":
        return relu(values + kept)
    if epilogue == "relu":
        return relu(values)
    if epilogue == "tanh-pool":
        return max_pool(np.tanh(values), 2)
    return values


def _windows(x: np.ndarray, shape) -> np.ndarray:
    """im2col windows (b, C, Ho, Wo, Kh, Kw) of x, zero padded, strided and dilated."""
    a = conv_shape_args(shape)
    win = windows(x, shape.Kh, shape.Kw, a["stride"], a["pad"], a["dilation"])
    return win[:, :, :shape.Ho, :shape.Wo]


class _Problem:
    """The few images the known mistakes are tried on, and how to compare with the output."""

    def __init__(self, got, ref: Reference, x, w, shape, precision, bias, epilogue, rows,
                 kept=None):
        self.got = np.asarray(values(got), dtype=np.float64)[rows]
        self.ref = ref.values[rows]
        self.bound = ref.bound(precision)[rows]
        self.x = np.asarray(x, dtype=np.float64)[rows]
        self.w = np.asarray(w, dtype=np.float64)
        self.bias = None if bias is None else np.asarray(bias, dtype=np.float64)
        self.shape = shape.with_batch(len(rows))
        self.epilogue = epilogue
        self.kept = None if kept is None else np.asarray(kept, dtype=np.float64)[rows]
        self.conv, _ = conv2d_with_magnitude(self.x, self.w, **conv_shape_args(shape))

    def fits(self, candidate: np.ndarray, got=None, bound=None) -> float:
        """Share of outputs the candidate explains (within 4x the bound: the candidate's own
        magnitudes differ a little from the reference's)."""
        got = self.got if got is None else got
        bound = self.bound if bound is None else bound
        with np.errstate(invalid="ignore"):
            ok = np.abs(got - candidate) <= 4 * bound
        return float(ok.mean()) if ok.size else 0.0

    def finish(self, conv: np.ndarray, with_bias: bool = True) -> np.ndarray:
        if with_bias and self.bias is not None:
            conv = conv + self.bias[None, :, None, None]
        return _through_epilogue(conv, self.epilogue, self.kept)

    def convolve(self, w: np.ndarray) -> np.ndarray:
        values, _ = conv2d_with_magnitude(self.x, w, **conv_shape_args(self.shape))
        return self.finish(values)


def _alternatives(p: _Problem) -> list[tuple[str, Callable[[], float]]]:
    """(explanation, share of outputs it explains), most specific first."""
    shape, got, ref, bound = p.shape, p.got, p.ref, p.bound
    tries: list[tuple[str, Callable[[], float]]] = []
    if shape.Ho > 1:
        tries.append(("it matches the reference shifted by one row: output row h holds row h+1 "
                      "(an input or output row index off by one)",
                      lambda: p.fits(ref[:, :, 1:], got[:, :, :-1], bound[:, :, 1:])))
        tries.append(("it matches the reference shifted by one row: output row h holds row h-1 "
                      "(an input or output row index off by one)",
                      lambda: p.fits(ref[:, :, :-1], got[:, :, 1:], bound[:, :, :-1])))
    if shape.Wo > 1:
        tries.append(("it matches the reference shifted by one column: output column w holds "
                      "column w+1 (a column index off by one)",
                      lambda: p.fits(ref[..., 1:], got[..., :-1], bound[..., 1:])))
        tries.append(("it matches the reference shifted by one column: output column w holds "
                      "column w-1 (a column index off by one)",
                      lambda: p.fits(ref[..., :-1], got[..., 1:], bound[..., :-1])))
    if got.shape[-1] == got.shape[-2]:
        tries.append(("it matches the reference transposed: rows and columns of every output map "
                      "are swapped (h and w exchanged in the output index)",
                      lambda: p.fits(ref.swapaxes(-1, -2), got, bound.swapaxes(-1, -2))))
    if shape.taps > 1:
        tries.append(("it matches a convolution with the filter flipped (k[K-1-p][K-1-q]): "
                      "convlab's layers are cross-correlations, read k[m][c][p][q] unflipped",
                      lambda: p.fits(p.convolve(p.w[..., ::-1, ::-1]))))
    if shape.Kh == shape.Kw > 1:
        tries.append(("it matches the filter transposed (k[m][c][q][p]): p and q are exchanged "
                      "in the filter index", lambda: p.fits(p.convolve(p.w.swapaxes(-1, -2)))))
    if p.bias is not None:
        tries.append(("it matches the result without the bias: the bias was not added",
                      lambda: p.fits(p.finish(p.conv, with_bias=False))))
    if p.epilogue in ("relu", "add-relu"):
        tries.append(("it matches the result without the ReLU: negative outputs were not clamped",
                      lambda: p.fits(p.conv + (0 if p.bias is None else p.bias[None, :, None, None])
                                     + (0 if p.kept is None else p.kept))))
    if p.kept is not None:
        tries.append(("it matches the result without the kept activation: the residual add "
                      "was not done", lambda: p.fits(relu(p.conv + (
                          0 if p.bias is None else p.bias[None, :, None, None])))))
    return tries


def _missing_terms(p: _Problem) -> str | None:
    """An input channel, or a filter row, column or tap whose terms the kernel left out."""
    shape = p.shape
    if shape.B * shape.C * shape.Ho * shape.Wo * shape.taps > WINDOW_BUDGET:
        return None
    win = _windows(p.x, shape)  # (b, C, Ho, Wo, Kh, Kw)
    G, Cg, Mg = shape.groups, shape.Cg, shape.Mg
    w = p.w.reshape(G, Mg, Cg, shape.Kh, shape.Kw)
    win_g = win.reshape(win.shape[0], G, Cg, *win.shape[2:])
    per_tap = np.einsum("bgchwpq,gmcpq->bgmhwpq", win_g, w).reshape(
        win.shape[0], shape.M, shape.Ho, shape.Wo, shape.Kh, shape.Kw)
    full = per_tap.sum(axis=(-1, -2))
    Kh, Kw = shape.Kh, shape.Kw
    checks = []
    if Kh > 1:
        checks += [(f"filter row p={r} ({'the last' if r == Kh - 1 else 'the first'})",
                    per_tap[..., r, :].sum(-1)) for r in (Kh - 1, 0)]
    if Kw > 1:
        checks += [(f"filter column q={c} ({'the last' if c == Kw - 1 else 'the first'})",
                    per_tap[..., :, c].sum(-1)) for c in (Kw - 1, 0)]
    if shape.taps > 1:
        checks += [(f"the filter tap (p, q) = ({Kh - 1}, {Kw - 1})", per_tap[..., Kh - 1, Kw - 1])]
    for name, part in checks:
        if p.fits(p.finish(full - part)) >= MATCH_FRACTION:
            return (f"it matches the result with {name} left out of every sum: a loop bound "
                    "of K-1 instead of K, or a loop starting at 1?")
    if shape.Cg > 1:
        for c in (shape.Cg - 1, 0, *range(1, shape.Cg - 1)):
            part = np.einsum("bghwpq,gmpq->bgmhw", win_g[:, :, c], w[:, :, c]).reshape(full.shape)
            if p.fits(p.finish(full - part)) >= MATCH_FRACTION:
                which = "the last" if c == shape.Cg - 1 else "the first" if c == 0 else f"channel {c}"
                return (f"it matches the result with input channel {c} ({which} of each group) "
                        "left out: a channel loop bound or start off by one?")
    return None


def _permutation(p: _Problem) -> str | None:
    """Output channel m holds the reference's channel perm[m], for a permutation that is not the
    identity."""
    M = p.got.shape[1]
    if M < 2:
        return None
    got = np.moveaxis(p.got, 1, 0).reshape(M, -1)
    ref = np.moveaxis(p.ref, 1, 0).reshape(M, -1)
    bound = np.moveaxis(p.bound, 1, 0).reshape(M, -1)
    perm = []
    for m in range(M):
        with np.errstate(invalid="ignore"):
            fits = (np.abs(got[m][None, :] - ref) <= 4 * bound).mean(axis=1)
        best = int(fits.argmax())
        if fits[best] < MATCH_FRACTION:
            return None
        perm.append(best)
    if sorted(perm) != list(range(M)) or perm == list(range(M)):
        return None
    moved = [m for m in range(M) if perm[m] != m]
    if perm == list(range(M))[::-1]:
        how = "in reverse order"
    elif all(perm[m] == (m + perm[0]) % M for m in range(M)):
        how = f"rotated by {perm[0]}"
    else:
        pairs = ", ".join(f"{m}<-{perm[m]}" for m in moved[:MAX_RANGES])
        how = f"as got<-reference: {pairs}" + (" ..." if len(moved) > MAX_RANGES else "")
    return (f"its output channels are the reference's permuted ({how}; {len(moved)} of {M} "
            "channels moved): the output channel index is computed wrongly")


def _shape_words(bad: np.ndarray, labels: Sequence[int] | None, K: int) -> tuple[list[str], dict]:
    """Where the bad outputs are: ranges per axis, and where they concentrate."""
    B, M, Ho, Wo = bad.shape
    region = {}
    words = []
    axes = [("images", 0, B, labels), ("channels", 1, M, None), ("rows", 2, Ho, None),
            ("columns", 3, Wo, None)]
    for name, axis, size, names in axes:
        others = tuple(a for a in range(4) if a != axis)
        share = bad.mean(axis=others)
        hit = np.flatnonzero(share > 0)
        region[name] = _axis_words(name, hit, size, names)
        if name in ("rows", "columns") and size > 2 and len(hit) > 0:
            heavy = np.flatnonzero(share > (share.max() + share.min()) / 2) \
                if share.max() - share.min() > 0.3 else hit
            band = edge_band(heavy, size)
            if band is not None:
                first, last = band
                parts = ([f"the first {first}"] if first else []) + ([f"the last {last}"] if last else [])
                note = f" (a border of width K-1 = {K - 1})" if K > 1 and K - 1 in (first, last) else ""
                words.append(f"the wrong {name} are {' and '.join(parts)} {name}{note}")
                continue
            period = tile_period(heavy, size)
            if period is not None:
                tile, residues = period
                where = "last" if residues[-1] == tile - 1 else "first"
                words.append(f"the wrong {name} are the {where} {len(residues)} of every "
                             f"{tile}-{name[:-1]} tile ({ranges(heavy)}): a tile edge, where "
                             "a tile's halo or bounds are handled wrongly")
                continue
            if len(heavy) < len(hit):
                words.append(f"the errors concentrate in {name} {ranges(heavy)}")
    if B > 1:
        per_image = bad.reshape(B, -1).mean(axis=1)
        whole = np.flatnonzero(per_image >= WHOLE_IMAGE_FRACTION)
        clean = np.flatnonzero(per_image == 0.0)
        if len(whole) and len(whole) + len(clean) == B and len(clean):
            shown = [labels[i] for i in whole] if labels is not None else whole
            words.append(f"whole images are wrong ({ranges(shown)}) while the others are right")
    return words, region


def _effective_roundoff(err: np.ndarray, ref: Reference) -> float:
    """The unit roundoff u that input rounding would need to make errors this size: rounding
    both operands of each product in precision u gives an error of zero mean and standard
    deviation about (2u/sqrt(3)) * sqrt(sum (x*w)^2) ~ (2u/sqrt(3)) * sum|x*w| / sqrt(n)."""
    magnitude = ref.magnitude[np.isfinite(err)]
    err = err[np.isfinite(err)]
    keep = magnitude > 0
    if not keep.any():
        return math.nan
    scaled = err[keep] * math.sqrt(ref.length) / magnitude[keep]
    return float(np.sqrt(np.mean(scaled ** 2)) * math.sqrt(3) / 2)


def _rounding_sized(ratio: float, u: float) -> bool:
    return ratio <= ROUNDING_RATIO or (0 < u <= COARSEST_ROUNDING)


def _precision_words(ratio: float, precision: str, u: float) -> str:
    if _rounding_sized(ratio, u):
        bits = -math.log2(u) if u > 0 else -math.log2(unit_roundoff(precision) * ratio)
        closest = min(PRECISION_UNITS, key=lambda k: abs(PRECISION_UNITS[k] - bits))
        return (f"The errors are rounding-sized (the worst is {ratio:.3g}x the {precision} bound; "
                f"they fit a unit roundoff of about 2^-{bits:.0f}, like {closest} arithmetic): "
                f"a precision problem - lower-precision arithmetic than the declared {precision}, "
                "or an unusually long chain of roundings.")
    return (f"The errors are gross (up to {ratio:.3g}x the bound): a logic error, not rounding.")


def diagnose(got: np.ndarray, ref: Reference, x: np.ndarray, w: np.ndarray, shape,
             precision: str, bias: np.ndarray | None = None, epilogue: str | None = None,
             images: Sequence[int] | None = None, kept: np.ndarray | None = None) -> Diagnosis:
    """Describe how `got` differs from `ref`. x holds the images `got` was computed from (the
    same rows); `images` gives their indices in the batch, for the messages; `kept`, the
    activation an add-relu epilogue added to them."""
    got64 = np.asarray(values(got), dtype=np.float64)
    total = got64.size
    if got64.shape != ref.values.shape:
        return Diagnosis([f"The output has shape {got64.shape}, the reference {ref.values.shape}."],
                         total, total, 0)
    unwritten_mask = ~np.isfinite(got64)
    bound = ref.bound(precision)
    with np.errstate(invalid="ignore"):
        ratio = np.where(unwritten_mask, 0.0, np.abs(got64 - ref.values) / bound)
    wrong_mask = ratio > 1.0
    unwritten, wrong = int(unwritten_mask.sum()), int(wrong_mask.sum())
    labels = list(images) if images is not None else None
    if not wrong and not unwritten:
        return Diagnosis([f"All {total} outputs are within their bounds."], total, 0, 0)
    findings: list[str] = []
    region: dict[str, str] = {}
    K = max(shape.Kh, shape.Kw)
    if unwritten:
        nan = int(np.isnan(got64).sum())
        words, region = _shape_words(unwritten_mask, labels, K)
        what = "never written (still the NaN poison)" if nan == unwritten else \
            f"not finite ({nan} NaN: never written or computed as NaN; {unwritten - nan} infinite)"
        findings.append(f"{unwritten} of {total} outputs are {what}: "
                        f"{', '.join(region.values())}" + (f"; {'; '.join(words)}" if words else "") + ".")
    if wrong:
        words, wrong_region = _shape_words(wrong_mask, labels, K)
        region = region or wrong_region
        worst = np.unravel_index(int(ratio.argmax()), ratio.shape)
        image = labels[worst[0]] if labels is not None else worst[0]
        at = f"y[{image},{worst[1]},{worst[2]},{worst[3]}]"
        zeros = int((got64[wrong_mask] == 0).sum())
        findings.append(f"{wrong} of {total} outputs are wrong: {', '.join(wrong_region.values())}"
                        + (f"; {'; '.join(words)}" if words else "") + f". The worst is {at}: "
                        f"expected {ref.values[worst]:.6g}, got {got64[worst]:.6g}.")
        if zeros * 10 >= wrong * 9:
            findings.append(f"{zeros} of the wrong outputs are exactly 0: written, but never "
                            "computed (or their sum never accumulated).")
    max_ratio = float(ratio.max()) if wrong else 0.0
    with np.errstate(invalid="ignore"):
        u = _effective_roundoff(np.abs(got64 - ref.values), ref) if wrong else math.nan
    explanation = None
    if wrong and not _rounding_sized(max_ratio, u):
        rows = _images_with_errors(wrong_mask | unwritten_mask)
        problem = _Problem(got64, ref, x, w, shape, precision, bias, epilogue, rows, kept)
        explanation = _explain(problem)
        if explanation:
            findings.append(explanation[0].upper() + explanation[1:] + ".")
    if wrong:
        findings.append(_precision_words(max_ratio, precision, u))
    return Diagnosis(findings, total, wrong, unwritten, region, explanation)


def _images_with_errors(bad: np.ndarray) -> list[int]:
    per_image = bad.reshape(bad.shape[0], -1).any(axis=1)
    return [int(i) for i in np.flatnonzero(per_image)[:ALTERNATIVE_IMAGES]]


def _explain(problem: _Problem) -> str | None:
    if problem.fits(problem.ref) >= MATCH_FRACTION:
        return None  # the wrong outputs are too few to tell a pattern on these images
    for explanation, share in _alternatives(problem):
        if share() >= MATCH_FRACTION:
            return explanation
    return _permutation(problem) or _missing_terms(problem)
