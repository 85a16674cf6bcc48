"""A dataset streamed through a network: batches of 8-bit images copied on one stream while the
batch before computes on a second and the predictions of the one before that come back on a
third, through double-buffered pinned host buffers.

Per batch i, slot s = i % SLOTS:
    host        waits until batch i-SLOTS has left host buffer s, then fills it (worker threads)
    copy        waits until batch i-SLOTS's pass has read device buffer s; HtoD copy of batch i
    compute     waits for the copy and for batch i-SLOTS's predictions to have left; replays the
                graph of slot s: ingest (bytes -> the first conv's input), the network, top-1
    copy back   waits for the pass; DtoH copy of batch i's predictions
Every one of those is bracketed by CUDA events, so each batch's copy, pass and copy back are
timed where they ran and the timeline can be drawn. The copy and the pass are also timed alone
(not overlapped) before the stream runs: the stream cannot beat max(copy, pass) per batch, and
the ratio to that is how close it comes.

With upload="float32" the same images are normalised on the host (ops.ingest.normalize, once
per distinct image) and cross as float32: the path the 8-bit upload must reproduce bit for bit.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

import numpy as np

from ..kernels.igemm.packing import stage_dtype
from ..ops.ingest import Ingest, InputTransform, Target, as_images, normalize
from ..shapes import channels_last
from .network import ConvStep, Network
from .pipeline import capture, pinned_empty, top1_kernel

SLOTS = 2
UPLOADS = ("uint8", "float32")
ISOLATED_RUNS = 10


@dataclass
class ImagePool:
    """The dataset in host memory: distinct images, cycled when more are streamed."""

    images: np.ndarray  # uint8 (P, rows, cols[, channels])
    labels: np.ndarray | None  # class of each image, where known
    description: str  # where the images came from, for the record

    def indices(self, start: int, count: int) -> np.ndarray:
        return (start + np.arange(count)) % len(self.images)

    def fill(self, out: np.ndarray, start: int, source: np.ndarray, pool: ThreadPoolExecutor,
             workers: int) -> None:
        """out[k] = source[(start + k) % P], copied by `workers` threads (NumPy releases the GIL
        for the copies, so they run in parallel)."""
        segments, k = [], 0
        while k < len(out):
            first = (start + k) % len(source)
            n = min(len(out) - k, len(source) - first)
            segments.append((k, first, n))
            k += n
        jobs = []
        for k, first, n in segments:
            step = -(-n // workers)
            for j in range(0, n, step):
                m = min(step, n - j)
                jobs.append(pool.submit(np.copyto, out[k + j:k + j + m],
                                        source[first + j:first + j + m]))
        for job in jobs:
            job.result()


@dataclass
class BatchTimes:
    """One batch in the stream: milliseconds from the stream's start (CUDA events)."""

    index: int
    slot: int
    fill_ms: float  # host: filling the pinned buffer (wall clock)
    copy: tuple[float, float]
    forward: tuple[float, float]
    back: tuple[float, float]

    @property
    def copy_ms(self) -> float:
        return self.copy[1] - self.copy[0]

    @property
    def forward_ms(self) -> float:
        return self.forward[1] - self.forward[0]

    @property
    def back_ms(self) -> float:
        return self.back[1] - self.back[0]

    def as_dict(self) -> dict:
        return {**asdict(self), "copy_ms": self.copy_ms, "forward_ms": self.forward_ms,
                "back_ms": self.back_ms}


@dataclass
class StreamTimes:
    """A timed stream of `images` images in batches of `batch`."""

    batch: int
    images: int
    upload: str
    wall_ms: float  # host: first fill to last prediction on the host
    copy_alone_ms: float  # median HtoD copy of one batch, nothing else running
    forward_alone_ms: float  # median pass (ingest, network, top-1), nothing else running
    upload_bytes: int  # per batch
    batches: list[BatchTimes] = field(default_factory=list)

    @property
    def batch_ms(self) -> float:
        """The time per batch in the stream."""
        return self.wall_ms / len(self.batches)

    @property
    def images_per_s(self) -> float:
        return self.images / (self.wall_ms / 1e3)

    @property
    def bound_ms(self) -> float:
        return max(self.copy_alone_ms, self.forward_alone_ms)

    @property
    def ratio(self) -> float:
        """Time per batch over max(copy, forward) alone: 1.0 is perfect overlap."""
        return self.batch_ms / self.bound_ms

    def median(self, what: str) -> float:
        return float(np.median([getattr(b, what) for b in self.batches]))

    def as_dict(self) -> dict:
        return {"batch": self.batch, "images": self.images, "upload": self.upload,
                "images_per_s": self.images_per_s, "batch_ms": self.batch_ms,
                "copy_ms": self.copy_alone_ms, "forward_ms": self.forward_alone_ms,
                "ratio": self.ratio, "wall_ms": self.wall_ms, "upload_bytes": self.upload_bytes,
                "stream_copy_ms": self.median("copy_ms"),
                "stream_forward_ms": self.median("forward_ms"),
                "stream_back_ms": self.median("back_ms"), "fill_ms": self.median("fill_ms"),
                "timeline": [b.as_dict() for b in self.batches]}


def ingest_target(network: Network):
    """(Target, groups) for the ingest kernel to write what the network's first conv reads, or
    None where that conv would not read it as it is (it converts float32 NCHW itself: cuDNN
    through PyTorch), so the ingest writes the float32 NCHW input."""
    first = network.steps[0]
    if not isinstance(first, ConvStep) or first.convert_to is not None:
        return None
    staged = first.op.stage(network.input)
    if staged is network.input:
        return Target(staged.shape[1], False, "fp32"), 1
    target = Target.of(staged)
    if first.op.stage(staged) is not staged:
        return None
    return target, first.shape.groups


class StreamedPipeline:
    """Streams an ImagePool through a Network planned for the batch size."""

    def __init__(self, network: Network, transform: InputTransform, pool: ImagePool,
                 upload: str = "uint8", workers: int = 8):
        import cupy

        if upload not in UPLOADS:
            raise ValueError(f"upload {upload!r}: one of {', '.join(UPLOADS)}")
        self.network, self.transform, self.pool, self.upload = network, transform, pool, upload
        self.batch = network.batch
        # Every thread fills: choosing fewer by timing fills alone picked 4 of 16 on the H100
        # host, whose fills then took 4.3 ms a batch inside the stream against 1.5 with 16.
        self.workers = max(1, workers)
        images = as_images(pool.images)
        if upload == "float32":  # the host path: normalised once per distinct image
            self.source = normalize(images, transform)
        else:
            self.source = images
        shape = (self.batch, *self.source.shape[1:])
        self.host_in = [pinned_empty(shape, self.source.dtype) for _ in range(SLOTS)]
        self.dev_in = [cupy.empty(shape, dtype=self.source.dtype) for _ in range(SLOTS)]
        self.host_out = [pinned_empty((self.batch,), np.int32) for _ in range(SLOTS)]
        self.dev_out = [cupy.empty((self.batch,), dtype=cupy.int32) for _ in range(SLOTS)]
        self.staged = [None] * SLOTS
        self.ingest = None
        if upload == "uint8":
            found = ingest_target(network)
            target, groups = found or (Target(network.input.shape[1], False, "fp32"), 1)
            self.ingest = Ingest(transform, target, groups)
            self.staged = [staged_array(network, target) for _ in range(SLOTS)]
        self.copy_stream = cupy.cuda.Stream(non_blocking=True)
        self.compute_stream = cupy.cuda.Stream(non_blocking=True)
        self.back_stream = cupy.cuda.Stream(non_blocking=True)
        self._top1 = top1_kernel()
        for slot in range(SLOTS):  # warm-up: module loads and first touches stay out
            with self.compute_stream:
                self._pass(slot)
        self.compute_stream.synchronize()
        self.graphs = []
        if network.capturable:
            self.graphs = [capture(self.compute_stream, lambda s=slot: self._pass(s))
                           for slot in range(SLOTS)]
            for graph in self.graphs:
                graph.upload(self.compute_stream)
            self.compute_stream.synchronize()
        self.threads = ThreadPoolExecutor(self.workers)  # last: nothing above can leave it running

    @property
    def upload_bytes(self) -> int:
        return self.host_in[0].nbytes

    def _pass(self, slot: int) -> None:
        if self.ingest is not None:
            self.ingest(self.dev_in[slot], self.staged[slot])
            x = self.staged[slot]
        else:
            x = self.dev_in[slot]
        probs = self.network.forward(x)
        rows, n = probs.shape
        self._top1(((rows + 7) // 8,), (256,), (probs, self.dev_out[slot], np.int32(rows),
                                                 np.int32(n)))

    def _launch(self, slot: int) -> None:
        if self.graphs:
            self.graphs[slot].launch(self.compute_stream)
        else:
            with self.compute_stream:
                self._pass(slot)

    def device_input(self, images: np.ndarray, slot: int = 0):
        """What slot `slot`'s pass reads for these host images (N = batch): for tests."""
        import cupy

        u = as_images(images)
        self.host_in[slot][...] = normalize(u, self.transform) if self.upload == "float32" else u
        self.dev_in[slot].set(self.host_in[slot])
        if self.ingest is None:
            return self.dev_in[slot]
        self.ingest(self.dev_in[slot], self.staged[slot])
        cupy.cuda.Device().synchronize()
        return self.staged[slot]

    def time_alone(self, runs: int = ISOLATED_RUNS) -> tuple[float, float]:
        """Median ms of one batch's HtoD copy, and of one pass, each with nothing else running."""
        import cupy

        self.pool.fill(self.host_in[0], 0, self.source, self.threads, self.workers)
        a, b = cupy.cuda.Event(), cupy.cuda.Event()
        copies, passes = [], []
        for _ in range(runs + 1):
            a.record(self.copy_stream)
            self.dev_in[0].set(self.host_in[0], self.copy_stream)
            b.record(self.copy_stream)
            b.synchronize()
            copies.append(cupy.cuda.get_elapsed_time(a, b))
            a.record(self.compute_stream)
            self._launch(0)
            b.record(self.compute_stream)
            b.synchronize()
            passes.append(cupy.cuda.get_elapsed_time(a, b))
        return float(np.median(copies[1:])), float(np.median(passes[1:]))

    def run(self, images: int) -> tuple[np.ndarray, StreamTimes]:
        """Stream `images` images (a multiple of the batch size) from the pool's start; returns
        every image's predicted class and the timings."""
        import cupy

        if images % self.batch:
            raise ValueError(f"{images} images is not a whole number of batches of {self.batch}")
        count = images // self.batch
        copy_alone, forward_alone = self.time_alone()
        ev = [[cupy.cuda.Event() for _ in range(6)] for _ in range(count)]
        start = cupy.cuda.Event()
        predictions = np.empty(images, dtype=np.int32)
        fills = []
        self.copy_stream.synchronize()
        self.compute_stream.synchronize()
        t0 = time.perf_counter()
        start.record(self.copy_stream)
        for i in range(count):
            s = i % SLOTS
            if i >= SLOTS:  # batch i-SLOTS has left host buffer s
                ev[i - SLOTS][1].synchronize()
            f0 = time.perf_counter()
            self.pool.fill(self.host_in[s], i * self.batch, self.source, self.threads,
                           self.workers)
            fills.append((time.perf_counter() - f0) * 1e3)
            if i >= SLOTS:
                self.copy_stream.wait_event(ev[i - SLOTS][3])
            ev[i][0].record(self.copy_stream)
            self.dev_in[s].set(self.host_in[s], self.copy_stream)
            ev[i][1].record(self.copy_stream)
            self.compute_stream.wait_event(ev[i][1])
            if i >= SLOTS:
                self.compute_stream.wait_event(ev[i - SLOTS][5])
            ev[i][2].record(self.compute_stream)
            self._launch(s)
            ev[i][3].record(self.compute_stream)
            self.back_stream.wait_event(ev[i][3])
            if i >= SLOTS:  # batch i-SLOTS's predictions leave host buffer s first
                self._harvest(i - SLOTS, ev, predictions)
            ev[i][4].record(self.back_stream)
            self.dev_out[s].get(self.back_stream, out=self.host_out[s], blocking=False)
            ev[i][5].record(self.back_stream)
        for j in range(max(0, count - SLOTS), count):
            self._harvest(j, ev, predictions)
        wall = (time.perf_counter() - t0) * 1e3
        elapsed = cupy.cuda.get_elapsed_time
        batches = [BatchTimes(i, i % SLOTS, fills[i],
                              (elapsed(start, e[0]), elapsed(start, e[1])),
                              (elapsed(start, e[2]), elapsed(start, e[3])),
                              (elapsed(start, e[4]), elapsed(start, e[5])))
                   for i, e in enumerate(ev)]
        times = StreamTimes(self.batch, images, self.upload, wall, copy_alone, forward_alone,
                            self.upload_bytes, batches)
        return predictions, times

    def _harvest(self, i: int, ev, predictions: np.ndarray) -> None:
        ev[i][5].synchronize()
        predictions[i * self.batch:(i + 1) * self.batch] = self.host_out[i % SLOTS]

    def close(self) -> None:
        self.threads.shutdown()


def staged_array(network: Network, target: Target):
    """A device array of the target's form for the network's batch (logical NCHW shape)."""
    import cupy

    b, _, h, w = network.input.shape
    dtype = stage_dtype(target.maths)
    if target.nhwc:
        return channels_last(cupy.empty((b, target.channels, h, w), dtype=dtype))
    return cupy.empty((b, target.channels, h, w), dtype=dtype)
