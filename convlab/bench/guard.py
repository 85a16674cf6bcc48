"""Defences that keep a timed kernel honest: it must do the whole job on every timed run.

Timing runs the same op many times, which invites kernels (deliberate or not) that skip work
the check will not see. Each defence answers one way of skipping:

- Input rotation (InputRotation): the timed runs cycle through ROTATION input buffers with
  different contents (the real input with its images rolled and mirrored), and right before
  the last timed sample (a single launch) the buffer it reads is refilled with contents no run
  has seen. Only that launch's output is verified, so a kernel that computes on its first call
  only, or only for an input pointer it has not seen, or that copies a result cached on an
  earlier call, is caught.
- The verified sample (verify_output): SAMPLE_IMAGES images drawn at random for every problem
  (a layer's random inputs, fresh on every run) are checked whole, and every image's first
  and last output rows are checked too (a random subset of channels per image when all of
  them would cost more than ROW_BUDGET multiply-adds), so a kernel that computes only the
  images or elements a fixed sample would look at is caught;
  verify="full" checks every output. Variants timed on one problem (a comparison's rows of a
  layer, autotune's candidates) share one draw (Sample), and with it the float64 references of
  the sample, kept with the input they were computed from and reused only for an input equal
  to it.
- Work outside the timed stream (StreamWatch, wall_check): after each sample's stop event has
  completed, a device-wide synchronize must return at once (outstanding work means the op
  launched on another stream, past the stop event); and the op's CUDA-event time must account
  for the device-synchronised wall time of the same runs.
- Lower precision than declared: the error bound of the declared precision (verify.py) does
  this; nothing here.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import numpy as np

from ..gpu.elements import values
from ..gpu.isolate import gpu_wait
from ..gpu.jit import load_module
from ..oracle.diagnose import diagnose
from ..oracle.reference import max_pool, windows
from ..oracle.verify import Check, Reference, compare, reference_output

ROTATION = 3
SAMPLE_IMAGES = 32
ROW_BUDGET = 100_000_000  # float64 multiply-adds for the first/last rows of every image
ROW_IMAGES = 64  # images whose windows are unfolded at once
FULL_CHUNK = 64  # images per reference computation with verify="full"
VERIFY_MODES = ("sample", "full")
# After a stop event completed, a device-wide synchronize on an idle device returns in a few
# microseconds; work still running takes this long at least before it is flagged...
OUTSTANDING_MIN_MS = 0.05
# ...and must be this share of the op's event time (so jitter on a long op is no finding).
OUTSTANDING_SHARE = 0.25
WALL_RUNS = 10
# Other processes' kernels on the same GPU delay ours too; the lower quartiles above absorb a
# sporadic neighbour, not one that keeps the GPU busy for the whole check.
SHARED_GPU = " (or another process kept this GPU busy throughout: rerun on an idle GPU)"
WALL_SLACK_MS = 0.05  # host timer jitter and synchronisation latency
WALL_SLACK_SHARE = 0.5


# --- input rotation ----------------------------------------------------------------------------

def _content(xp, x, j: int):
    """Input contents number j: the batch rolled by j images and mirrored one of four ways (so
    contents differ even for a batch of one image)."""
    out = xp.roll(x, j, axis=0) if x.shape[0] > 1 else x
    if j % 4 in (1, 3):
        out = out[..., ::-1]
    if j % 4 in (2, 3):
        out = out[..., ::-1, :]
    # Always a copy: refresh_next overwrites buffers in place, and x is the caller's (in a
    # network, its own input buffer); ascontiguousarray would hand x itself back for j = 0.
    return xp.array(out, copy=True)


class InputRotation:
    """ROTATION input buffers of different contents, launched in turn by `launch`."""

    def __init__(self, x, stage: Callable, count: int = ROTATION):
        self.xp = _array_module(x)
        self.source = x
        self.stage = stage
        self.buffers = [_content(self.xp, x, j) for j in range(count)]
        self.staged = [stage(b) for b in self.buffers]
        self.contents = list(range(count))  # which contents each buffer holds
        self.next = 0
        self.last: int | None = None

    def launch(self, op, y) -> None:
        i = self.next
        op(self.staged[i], y)
        self.last, self.next = i, (i + 1) % len(self.buffers)

    def refresh_next(self) -> None:
        """Give the buffer the next launch reads contents no launch has read, at its old address."""
        i = self.next
        fresh = max(self.contents) + 1
        self.xp.copyto(self.buffers[i], _content(self.xp, self.source, fresh))
        staged = self.stage(self.buffers[i])
        if staged is not self.buffers[i]:
            self.xp.copyto(self.staged[i], staged)
        self.contents[i] = fresh

    @property
    def last_input(self):
        """The float32 input of the last launch."""
        return self.buffers[self.last]


def _array_module(a):
    if isinstance(a, np.ndarray):
        return np
    import cupy

    return cupy


def host(a) -> np.ndarray:
    return a.get() if hasattr(a, "get") else np.asarray(a)


def host_values(a) -> np.ndarray:
    """An operand on the host as the values it holds (bf16 bits decoded): what a reference
    computes from. Outputs stay as stored: the check allows their type's last rounding."""
    return values(host(a))


# --- the verified sample -------------------------------------------------------------------------

class Sample:
    """One random draw of the verified sample, shared by the variants checked on one problem,
    with the float64 references computed for it: the second variant's check reuses the first
    one's reference where its input is equal, element for element, to the one the reference
    was computed from (a variant that wrote into its input gets a fresh reference)."""

    def __init__(self, seed: int | None = None):
        self.seed = int(np.random.default_rng().integers(2**63)) if seed is None else seed
        self._kept: dict[tuple, tuple[tuple[np.ndarray, ...], Reference]] = {}

    def rng(self) -> np.random.Generator:
        return np.random.default_rng(self.seed)

    def reference(self, key: tuple, inputs: tuple[np.ndarray, ...],
                  compute: Callable[[], Reference]) -> Reference:
        kept = self._kept.get(key)
        if kept is not None and len(kept[0]) == len(inputs) and all(
                a.shape == b.shape and np.array_equal(a, b) for a, b in zip(kept[0], inputs)):
            return kept[1]
        ref = compute()
        self._kept[key] = (inputs, ref)
        return ref


def _reference(sample: Sample | None, key: tuple, inputs: tuple[np.ndarray, ...],
               compute: Callable[[], Reference]) -> Reference:
    return compute() if sample is None else sample.reference(key, inputs, compute)


def draw_images(batch: int, rng: np.random.Generator, count: int = SAMPLE_IMAGES) -> list[int]:
    """`count` distinct images at random (all of them in a small batch), sorted."""
    if batch <= count:
        return list(range(batch))
    return sorted(int(i) for i in rng.choice(batch, size=count, replace=False))


_INDEX = re.compile(r"y\[(\d+)((?:,\d+)*)\]")


def relabel(check: Check, rename: Callable[[tuple[int, ...]], tuple[int, ...]]) -> Check:
    """The check with every y[i,...] in its reason renamed (sample positions -> batch indices)."""
    def sub(match):
        index = tuple(int(v) for v in (match.group(1) + match.group(2)).split(","))
        return "y[" + ",".join(str(v) for v in rename(index)) + "]"

    return replace(check, reason=_INDEX.sub(sub, check.reason))


def merge(checks: Sequence[Check]) -> Check:
    """One check from several parts of the output: passes when all pass; the first failure's
    reason; the largest errors; the counts added up."""
    failed = [c for c in checks if not c.passed]
    first = failed[0] if failed else checks[0]
    return Check(not failed, max(c.max_rel_error for c in checks),
                 max(c.bound_ratio for c in checks), first.reason,
                 sum(c.unwritten for c in checks), sum(c.exceeded for c in checks), first.rule)


@dataclass
class Layer:
    """What verifying one conv layer's output needs."""

    shape: object  # ConvShape
    weights: np.ndarray
    bias: np.ndarray | None
    epilogue: str | None
    precision: str
    # The activation an add-relu epilogue added (its residual block's kept one), device or
    # host, the output's shape.
    kept: object = None

    def kept_of(self, images: Sequence[int]) -> np.ndarray | None:
        return None if self.kept is None else host_values(self.kept[list(images)])


def check_images(layer: Layer, x, out, images: Sequence[int], layer_mean: float | None = None,
                 sample: Sample | None = None) -> tuple[Check, np.ndarray, np.ndarray, Reference]:
    """Whole output maps of the given images against float64: (check, host input, host output,
    reference), with y[...] in the reason naming batch indices. `layer_mean`: the layer's mean
    sum|x*w| for the bound's floor (default: these images'). `sample`: where a reference of
    the same images and input may be kept."""
    x_h = host_values(x[list(images)])
    got = host(out[list(images)])
    kept = layer.kept_of(images)
    ref = _reference(sample, ("images", tuple(images), layer.epilogue),
                     (x_h,) if kept is None else (x_h, kept),
                     lambda: reference_output(x_h, layer.weights,
                                              layer.shape.with_batch(len(images)),
                                              layer.epilogue, layer.bias, kept))
    ref = replace(ref, layer_mean=layer_mean)
    check = compare(got, ref, layer.precision)
    return relabel(check, lambda i: (images[i[0]], *i[1:])), x_h, got, ref


def _conv_rows(epilogue: str | None, out_row: int) -> tuple[int, int]:
    """(first conv row, count) an output row needs: a pooled row needs two conv rows."""
    if epilogue == "tanh-pool":
        return 2 * out_row, 2
    return out_row, 1


def edge_row_reference(layer: Layer, x_rows: np.ndarray, first_input_row: int, conv_row: int,
                       rows: int, pairs: np.ndarray, layer_mean: float | None = None,
                       kept: np.ndarray | None = None) -> Reference:
    """float64 values and magnitudes of `rows` conv rows starting at `conv_row` (through the
    epilogue), for (image, channel) pairs; x_rows holds input rows from `first_input_row` on
    (unpadded coordinates), enough for those rows. `layer_mean`: as in check_images; `kept`:
    an add-relu epilogue's kept activation at those rows and pairs, (pairs, rows, Wo)."""
    shape = layer.shape
    Kh, Kw, S, P = shape.Kh, shape.Kw, shape.stride, shape.pad_w
    top = conv_row * S - shape.pad_h  # first input row the window reads, maybe in the padding
    span = (rows - 1) * S + shape.span_h
    padded = np.zeros((x_rows.shape[0], x_rows.shape[1], span, shape.W + 2 * P))
    for i in range(span):
        src = top + i - first_input_row
        if 0 <= top + i < shape.H and 0 <= src < x_rows.shape[2]:
            padded[:, :, i, P:P + shape.W] = x_rows[:, :, src]
    win = windows(padded, Kh, Kw, S, 0, shape.dilation)
    win = win[:, :, :rows, :shape.Wo]  # (B, C, rows, Wo, Kh, Kw)
    G, Cg, taps = shape.groups, shape.Cg, shape.Cg * Kh * Kw
    w = np.asarray(layer.weights, dtype=np.float64).reshape(shape.M, taps)
    values = np.empty((len(pairs), rows * shape.Wo))
    magnitude = np.empty_like(values)
    for start in range(0, x_rows.shape[0], ROW_IMAGES):
        chunk = win[start:start + ROW_IMAGES]
        n = chunk.shape[0]
        # (image, group, output position, tap): each window as one row, a GEMM operand.
        patches = np.ascontiguousarray(
            chunk.reshape(n, G, Cg, rows, shape.Wo, Kh, Kw).transpose(0, 1, 3, 4, 2, 5, 6)
        ).reshape(n, G, rows * shape.Wo, taps)
        here = np.flatnonzero((pairs[:, 0] >= start) & (pairs[:, 0] < start + n))
        b, m = pairs[here, 0] - start, pairs[here, 1]
        operands = patches[b, m // shape.Mg]  # (pairs, positions, taps)
        values[here] = np.matmul(operands, w[m][:, :, None])[..., 0]
        magnitude[here] = np.matmul(np.abs(operands), np.abs(w[m])[:, :, None])[..., 0]
    values = values.reshape(len(pairs), rows, shape.Wo)
    magnitude = magnitude.reshape(len(pairs), rows, shape.Wo)
    if layer.bias is not None:
        bias = np.asarray(layer.bias, dtype=np.float64)[pairs[:, 1]]
        values += bias[:, None, None]
        magnitude += np.abs(bias)[:, None, None]
    absolute = 0.0
    if kept is not None:
        values += kept
        magnitude += np.abs(kept)
    if layer.epilogue in ("relu", "add-relu"):
        values = np.maximum(values, 0)
    elif layer.epilogue == "tanh-pool":
        values = max_pool(np.tanh(values)[:, None], 2)[:, 0]
        magnitude = max_pool(magnitude[:, None], 2)[:, 0]
        absolute = 1e-6
    return Reference(values, magnitude, shape.reduction, absolute, layer_mean)


def check_edge_rows(layer: Layer, x, out, rng: np.random.Generator,
                    layer_mean: float | None = None, sample: Sample | None = None) -> Check:
    """Every image's first and last output rows, for all channels or as many random channels
    per image as ROW_BUDGET allows. Edge rows are no fair sample of a layer's magnitudes
    (image borders are often black), so the bound's floor takes `layer_mean`, estimated on
    whole images."""
    shape = layer.shape
    B, M, rows_out = out.shape[0], out.shape[1], out.shape[2]
    per_pair = 2 * shape.Wo * shape.reduction * (2 if layer.epilogue == "tanh-pool" else 1)
    channels = max(1, min(M, ROW_BUDGET // max(1, B * per_pair)))
    if channels == M:
        pairs = np.array([(b, m) for b in range(B) for m in range(M)])
    else:
        pairs = np.array([(b, int(m)) for b in range(B)
                          for m in rng.choice(M, size=channels, replace=False)])
    parts = []
    for out_row in sorted({0, rows_out - 1}):
        conv_row, count = _conv_rows(layer.epilogue, out_row)
        lo = max(0, conv_row * shape.stride - shape.pad_h)
        hi = min(shape.H, (conv_row + count - 1) * shape.stride - shape.pad_h + shape.span_h)
        # a copy: the input's buffer is refilled later
        x_rows = np.array(host_values(x[:, :, lo:hi]))
        kept = None if layer.kept is None else \
            host_values(layer.kept[:, :, conv_row:conv_row + count])[pairs[:, 0], pairs[:, 1]]
        ref = _reference(sample, ("rows", out_row, layer.epilogue, layer_mean),
                         (x_rows, pairs) if kept is None else (x_rows, pairs, kept),
                         lambda: edge_row_reference(layer, x_rows, lo, conv_row, count, pairs,
                                                    layer_mean, kept))
        got_rows = host(out[:, :, out_row])  # (B, M, Wo')
        got = got_rows[pairs[:, 0], pairs[:, 1]][:, None, :]
        check = compare(got, ref, layer.precision)
        parts.append(relabel(check, lambda i, r=out_row: (int(pairs[i[0], 0]), int(pairs[i[0], 1]),
                                                          r, i[2])))
    return merge(parts)


def verify_output(layer: Layer, x, out, mode: str = "sample",
                  rng: np.random.Generator | None = None, sample: Sample | None = None) -> Check:
    """Check the op's output `out` (device or host) for input `x`. With mode "sample",
    SAMPLE_IMAGES random images whole plus every image's first and last rows; with "full",
    everything. `sample`: the draw (its rng, unless `rng` is given) and the references shared
    with other variants checked on the same problem. A failing check's reason ends with a
    diagnosis of the wrong outputs' pattern."""
    if mode not in VERIFY_MODES:
        raise ValueError(f"verify mode {mode!r} is none of {', '.join(VERIFY_MODES)}")
    rng = rng or (sample.rng() if sample is not None else np.random.default_rng())
    B = out.shape[0]
    chunks = [list(range(s, min(B, s + FULL_CHUNK))) for s in range(0, B, FULL_CHUNK)] \
        if mode == "full" else [draw_images(B, rng)]
    # The bound's floor is a share of the layer's mean sum|x*w|, estimated once on whole
    # images (the random sample, or the first chunk) and used for every part checked.
    parts, failed, layer_mean = [], None, None
    kept = sample if mode == "sample" else None  # "full" references are used once each
    for images in chunks:
        check, x_h, got, ref = check_images(layer, x, out, images, layer_mean, kept)
        layer_mean = ref.mean_magnitude()
        parts.append(check)
        if not check.passed and failed is None:
            failed = (images, x_h, got, ref)
    if mode == "sample" and B > len(chunks[0]):
        rows = check_edge_rows(layer, x, out, rng, layer_mean, sample)
        parts.append(rows)
        if not rows.passed and failed is None:
            found = _INDEX.search(rows.reason)
            images = [int(found.group(1))] if found else [0]
            failed = (images, *check_images(layer, x, out, images, layer_mean)[1:])
    check = merge(parts)
    if failed is not None:
        images, x_h, got, ref = failed
        found = diagnose(got, ref, x_h, layer.weights, layer.shape.with_batch(len(images)),
                         layer.precision, layer.bias, layer.epilogue, images,
                         layer.kept_of(images))
        check = replace(check, reason=f"{check.reason}. Diagnosis: {found.text()}")
    return check


# --- work outside the timed stream -------------------------------------------------------------

class StreamWatch:
    """After each timed sample (its stop event has completed), time a device-wide synchronize:
    on an idle device it returns at once; if work is still running, the op left it outside the
    timed stream."""

    def __init__(self):
        self.outstanding_ms: list[float] = []

    def after_sample(self) -> None:
        import cupy

        with gpu_wait():  # in an isolated child it messages the parent: keep that out of the time
            start = time.perf_counter()
            cupy.cuda.Device().synchronize()
            self.outstanding_ms.append((time.perf_counter() - start) * 1e3)

    def finding(self, event_median_ms: float) -> str | None:
        if not self.outstanding_ms:
            return None
        # The lower quartile: a kernel left running past its stop event leaves work at every
        # sample; another process sharing the GPU delays only some of them.
        outstanding = float(np.percentile(self.outstanding_ms, 25))
        if outstanding > max(OUTSTANDING_MIN_MS, OUTSTANDING_SHARE * event_median_ms):
            return (f"work outside the timed stream: after each run's stop event completed, the "
                    f"device was still busy for {outstanding:.3g} ms (lower quartile; the op's event time "
                    f"is {event_median_ms:.3g} ms); launch on the current stream only{SHARED_GPU}")
        return None


def _empty_launch_ms(runs: int) -> float:
    """Host time of launching an empty kernel and synchronising the device (the overhead any
    wall-clock measurement of one op includes)."""
    import cupy

    kernel = load_module("guard:empty", 'extern "C" __global__ void empty() {}', (),
                         ("empty",)).module.get_function("empty")
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        kernel((1,), (1,), ())
        cupy.cuda.Device().synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times))


def wall_check(fn: Callable[[], None], event_median_ms: float, runs: int = WALL_RUNS) -> str | None:
    """Compare the event time with a device-synchronised wall time of `runs` more runs: the
    device work of one run may not exceed what the events measured by more than host overheads."""
    import cupy

    overhead = _empty_launch_ms(runs)
    launch, wall = [], []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        launched = time.perf_counter()
        with gpu_wait():  # its messages to a parent process are not the op's time
            waited = time.perf_counter()
            cupy.cuda.Device().synchronize()
            done = time.perf_counter()
        launch.append((launched - start) * 1e3)
        wall.append((launched - start + done - waited) * 1e3)
    # Lower quartiles, for the reason StreamWatch.finding gives: work outside the timed stream
    # stretches every run, another process on the same GPU only some.
    wall_ms, launch_ms = float(np.percentile(wall, 25)), float(np.percentile(launch, 25))
    allowed = launch_ms + event_median_ms + overhead + max(WALL_SLACK_MS,
                                                           WALL_SLACK_SHARE * event_median_ms)
    if wall_ms > allowed:
        return (f"the device-synchronised wall time of a run ({wall_ms:.3g} ms, of which "
                f"{launch_ms:.3g} ms launching) exceeds its CUDA-event time ({event_median_ms:.3g} "
                "ms) by more than launch and synchronisation overheads: the op works outside "
                f"the timed stream or past its stop event{SHARED_GPU}")
    return None


TIMER_REASON = "timer: "  # how a check the timer's guard failed begins its reason
ALSO = "; also "  # what joins the output's own failure after it


def timer_failure(check: Check, finding: str) -> Check:
    return replace(check, passed=False, reason=f"{TIMER_REASON}{finding}"
                   + (f"{ALSO}{check.reason}" if check.reason else ""))

