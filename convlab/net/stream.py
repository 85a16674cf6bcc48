"""A dataset streamed through a network: batches of 8-bit images copied on one stream while the
batch before computes on a second and the predictions of the one before that come back on a
third.

The dataset sits in pinned (page-locked) host memory, decoded once, so the DMA engine reads a
batch straight from it: a host copy per batch (20 MB for alexnet at batch 128) took longer than
the GPU's pass and bounded the stream. A batch whose images are not contiguous there (it wraps
the end of the dataset) is gathered first into one of two pinned slot buffers by worker threads.

Per batch i, slot s = i % SLOTS (`drive`, shared with the PyTorch stream in net.torch_stream):
    host        waits until batch i-SLOTS has left slot s's pinned buffer; finds batch i in the
                pinned dataset or gathers it into that buffer
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
from typing import Protocol

import numpy as np

from ..kernels.igemm.staging import stage_dtype
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
    fill_ms: float  # host: gathering into a pinned slot buffer (wall clock; 0: none needed)
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


class PinnedBatches:
    """Batch i of a stream in pinned host memory: a slice of the pinned dataset `source` where
    its images lie contiguous there, else gathered into the slot's pinned buffer by worker
    threads. `source` and `buffers` are NumPy arrays or PyTorch tensors; `numpy` views one as
    the other."""

    def __init__(self, pool: ImagePool, source, buffers: list, numpy, threads: ThreadPoolExecutor,
                 workers: int):
        self.pool, self.source, self.buffers, self.numpy = pool, source, buffers, numpy
        self.threads, self.workers = threads, workers
        self.batch = len(buffers[0])
        self.read = list(buffers)  # the pinned memory each slot's copy reads

    def load(self, i: int, slot: int) -> float:
        """Make batch i what the slot's copy reads; milliseconds spent gathering it."""
        first = contiguous_start(i, self.batch, len(self.source))
        if first is not None:
            self.read[slot] = self.source[first:first + self.batch]
            return 0.0
        t0 = time.perf_counter()
        self.pool.fill(self.numpy(self.buffers[slot]), i * self.batch, self.numpy(self.source),
                       self.threads, self.workers)
        self.read[slot] = self.buffers[slot]
        return (time.perf_counter() - t0) * 1e3


def contiguous_start(i: int, batch: int, size: int) -> int | None:
    """Where batch i of a stream cycling through `size` images starts in them, if its images
    lie contiguous there (else None: it wraps the end)."""
    start = i * batch % size
    return start if start + batch <= size else None


class Stages(Protocol):
    """One library's work on a stream's batches, each on its own CUDA stream (net.torch_stream
    implements it for PyTorch)."""

    def load(self, i: int, slot: int) -> float:
        """Host: make batch i, in pinned memory, what the slot's copy reads; milliseconds
        spent gathering it (0 when it is read straight from the pinned dataset)."""

    def copy(self, slot: int) -> None:
        """Enqueue the HtoD copy of the slot's batch on the copy stream."""

    def compute(self, slot: int) -> None:
        """Enqueue the pass over the slot's device input on the compute stream."""

    def back(self, slot: int) -> None:
        """Enqueue the DtoH copy of the slot's predictions on the back stream."""

    def predictions(self, slot: int) -> np.ndarray:
        """The slot's predictions on the host, once its copy back has ended."""


@dataclass
class Streams:
    """The three CUDA streams of a stream, as CuPy streams (events are recorded on them)."""

    copy: object
    compute: object
    back: object


def time_alone(stages: Stages, streams: Streams, runs: int = ISOLATED_RUNS) -> tuple[float, float]:
    """Median ms of one batch's HtoD copy, and of one pass, each with nothing else running."""
    import cupy

    stages.load(0, 0)
    a, b = cupy.cuda.Event(), cupy.cuda.Event()
    copies, passes = [], []
    for _ in range(runs + 1):
        for stream, work, times in ((streams.copy, stages.copy, copies),
                                    (streams.compute, stages.compute, passes)):
            a.record(stream)
            work(0)
            b.record(stream)
            b.synchronize()
            times.append(cupy.cuda.get_elapsed_time(a, b))
    return float(np.median(copies[1:])), float(np.median(passes[1:]))


def drive(stages: Stages, streams: Streams, count: int) -> tuple[np.ndarray, list[BatchTimes],
                                                                  float]:
    """Stream `count` batches (see the module docstring): every prediction in order, each
    batch's times, and the wall-clock milliseconds from the first load to the last prediction
    on the host."""
    import cupy

    ev = [[cupy.cuda.Event() for _ in range(6)] for _ in range(count)]
    start = cupy.cuda.Event()
    chunks: list[np.ndarray | None] = [None] * count
    fills = []
    for stream in (streams.copy, streams.compute, streams.back):
        stream.synchronize()

    def harvest(j: int) -> None:
        ev[j][5].synchronize()
        chunks[j] = stages.predictions(j % SLOTS).copy()

    t0 = time.perf_counter()
    start.record(streams.copy)
    for i in range(count):
        s = i % SLOTS
        if i >= SLOTS:  # batch i-SLOTS has left slot s's pinned buffer
            ev[i - SLOTS][1].synchronize()
        fills.append(stages.load(i, s))
        if i >= SLOTS:
            streams.copy.wait_event(ev[i - SLOTS][3])
        ev[i][0].record(streams.copy)
        stages.copy(s)
        ev[i][1].record(streams.copy)
        streams.compute.wait_event(ev[i][1])
        if i >= SLOTS:
            streams.compute.wait_event(ev[i - SLOTS][5])
        ev[i][2].record(streams.compute)
        stages.compute(s)
        ev[i][3].record(streams.compute)
        streams.back.wait_event(ev[i][3])
        if i >= SLOTS:  # batch i-SLOTS's predictions leave host buffer s first
            harvest(i - SLOTS)
        ev[i][4].record(streams.back)
        stages.back(s)
        ev[i][5].record(streams.back)
    for j in range(max(0, count - SLOTS), count):
        harvest(j)
    wall = (time.perf_counter() - t0) * 1e3
    elapsed = cupy.cuda.get_elapsed_time
    batches = [BatchTimes(i, i % SLOTS, fills[i],
                          (elapsed(start, e[0]), elapsed(start, e[1])),
                          (elapsed(start, e[2]), elapsed(start, e[3])),
                          (elapsed(start, e[4]), elapsed(start, e[5])))
               for i, e in enumerate(ev)]
    return np.concatenate(chunks), batches, wall


class StreamedPipeline:
    """Streams an ImagePool through a Network planned for the batch size."""

    def __init__(self, network: Network, transform: InputTransform, pool: ImagePool,
                 upload: str = "uint8", workers: int = 8):
        import cupy

        if upload not in UPLOADS:
            raise ValueError(f"upload {upload!r}: one of {', '.join(UPLOADS)}")
        self.network, self.transform, self.pool, self.upload = network, transform, pool, upload
        self.batch = network.batch
        # Every thread gathers: choosing fewer by timing gathers alone picked 4 of 16 on the
        # H100 host, whose gathers then took 4.3 ms a batch inside the stream against 1.5 with 16.
        self.workers = max(1, workers)
        images = as_images(pool.images)
        # the float32 path is normalised on the host once per distinct image
        source = normalize(images, transform) if upload == "float32" else images
        self.source = pinned_empty(source.shape, source.dtype)
        self.source[...] = source
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
        self.streams = Streams(*(cupy.cuda.Stream(non_blocking=True) for _ in range(3)))
        self._top1 = top1_kernel()
        for slot in range(SLOTS):  # warm-up: module loads and first touches stay out
            with self.streams.compute:
                self._pass(slot)
        self.streams.compute.synchronize()
        self.graphs = []
        if network.capturable:
            self.graphs = [capture(self.streams.compute, lambda s=slot: self._pass(s))
                           for slot in range(SLOTS)]
            for graph in self.graphs:
                graph.upload(self.streams.compute)
            self.streams.compute.synchronize()
        self.threads = ThreadPoolExecutor(self.workers)  # last: nothing above can leave it running
        self.host = PinnedBatches(pool, self.source, self.host_in, np.asarray, self.threads,
                                  self.workers)

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

    def load(self, i: int, slot: int) -> float:
        return self.host.load(i, slot)

    def copy(self, slot: int) -> None:
        self.dev_in[slot].set(self.host.read[slot], self.streams.copy)

    def compute(self, slot: int) -> None:
        if self.graphs:
            self.graphs[slot].launch(self.streams.compute)
        else:
            with self.streams.compute:
                self._pass(slot)

    def back(self, slot: int) -> None:
        self.dev_out[slot].get(self.streams.back, out=self.host_out[slot], blocking=False)

    def predictions(self, slot: int) -> np.ndarray:
        return self.host_out[slot]

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

    def run(self, images: int) -> tuple[np.ndarray, StreamTimes]:
        """Stream `images` images (a multiple of the batch size) from the pool's start; returns
        every image's predicted class and the timings."""
        if images % self.batch:
            raise ValueError(f"{images} images is not a whole number of batches of {self.batch}")
        copy_alone, forward_alone = time_alone(self, self.streams)
        predictions, batches, wall = drive(self, self.streams, images // self.batch)
        times = StreamTimes(self.batch, images, self.upload, wall, copy_alone, forward_alone,
                            self.upload_bytes, batches)
        return predictions, times

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
