"""The same stream in PyTorch, as a PyTorch user would build it for speed: the dataset's 8-bit
images in pinned memory, `non_blocking` copies on a copy stream, conversion and normalisation on
the device, the network in its fastest form (torch_forward's candidates: NCHW or channels-last,
eager, CUDA graph or torch.compile) on a compute stream, predictions back on a third. Driven and
timed by net.stream's own loop (`drive`, `time_alone`), so both streams are measured alike."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..gpu import timer
from ..models import Weights
from ..ops.ingest import InputTransform, as_images, normalize
from .stream import (SLOTS, ImagePool, PinnedBatches, StreamTimes, Streams, drive,
                     time_alone)
from .torch_forward import (DTYPES, _runner, allowed_differ, candidates, fastest_here,
                            network_function, unavailable_reason)

__all__ = ["stream", "unavailable_reason"]


def _normaliser(torch, transform: InputTransform):
    """bytes (N, rows, cols, channels) on the device -> float32 NCHW, in PyTorch's ops."""
    import torch.nn.functional as F

    channels = list(transform.channels)
    mean = torch.tensor(transform.mean, device="cuda").view(1, -1, 1, 1)
    scale = torch.tensor(transform.scale, device="cuda").view(1, -1, 1, 1)

    def run(u):
        x = u.permute(0, 3, 1, 2)[:, channels].float()
        x = (x - mean) / scale
        if transform.resample:
            x = F.interpolate(x, size=(transform.size, transform.size), mode="bilinear",
                              align_corners=False)
        return x

    return run


class TorchStages:
    """net.stream.Stages in PyTorch: the network `run` reads `xt`."""

    def __init__(self, torch, pool: ImagePool, batch: int, to_input, run, xt,
                 threads: ThreadPoolExecutor, workers: int):
        self.torch, self.batch = torch, batch
        self.to_input, self.run, self.xt = to_input, run, xt
        u8 = as_images(pool.images)
        self.source = torch.empty(u8.shape, dtype=torch.uint8, pin_memory=True)
        self.source.numpy()[...] = u8
        shape = (batch, *u8.shape[1:])
        self.host_in = [torch.empty(shape, dtype=torch.uint8, pin_memory=True)
                        for _ in range(SLOTS)]
        self.host = PinnedBatches(pool, self.source, self.host_in, lambda t: t.numpy(), threads,
                                  workers)
        self.dev_in = [torch.empty(shape, dtype=torch.uint8, device="cuda") for _ in range(SLOTS)]
        self.host_out = [torch.empty(batch, dtype=torch.int64, pin_memory=True)
                         for _ in range(SLOTS)]
        self.dev_out = [torch.empty(batch, dtype=torch.int64, device="cuda")
                        for _ in range(SLOTS)]
        self.torch_streams = [torch.cuda.Stream() for _ in range(3)]

    def streams(self) -> Streams:
        import cupy

        return Streams(*(cupy.cuda.ExternalStream(s.cuda_stream) for s in self.torch_streams))

    def load(self, i: int, slot: int) -> float:
        return self.host.load(i, slot)

    def copy(self, slot: int) -> None:
        with self.torch.cuda.stream(self.torch_streams[0]):
            self.dev_in[slot].copy_(self.host.read[slot], non_blocking=True)

    def compute(self, slot: int) -> None:
        with self.torch.cuda.stream(self.torch_streams[1]):
            self.xt.copy_(self.to_input(self.dev_in[slot]))
            self.dev_out[slot].copy_(self.run().argmax(dim=1))

    def back(self, slot: int) -> None:
        with self.torch.cuda.stream(self.torch_streams[2]):
            self.host_out[slot].copy_(self.dev_out[slot], non_blocking=True)

    def predictions(self, slot: int) -> np.ndarray:
        return self.host_out[slot].numpy()


def stream(weights: Weights, transform: InputTransform, pool: ImagePool, batch: int,
           images: int, precision: str, reference_top1: np.ndarray, workers: int,
           policy: timer.TimingPolicy) -> dict:
    """The PyTorch stream of `images` images at `batch`, in the fastest of PyTorch's forms for
    the precision class (chosen on the first batch, whose predictions must match
    `reference_top1` as closely as the class allows): a row like StreamTimes.as_dict() with the
    candidate's label, or the reason none ran."""
    import cupy
    import torch

    first = as_images(pool.images[pool.indices(0, batch)])
    x = cupy.asarray(normalize(first, transform))
    rows = candidates(weights, x, precision, reference_top1, policy)
    best = fastest_here(rows, batch)
    table = [r.as_dict() for r in rows]
    if best is None:
        return {"batch": batch, "error": "no PyTorch candidate ran with its predictions intact",
                "candidates": table}
    forward, stage = network_function(weights, precision, best.layout)
    xt = stage(x)
    run = _runner(torch, forward, xt, best.mode, DTYPES[precision][1])
    with ThreadPoolExecutor(workers) as threads:
        stages = TorchStages(torch, pool, batch, _normaliser(torch, transform), run, xt, threads,
                             workers)
        streams = stages.streams()
        stages.load(0, 0)
        for slot in range(SLOTS):  # warm-up
            stages.dev_in[slot].copy_(stages.host.read[0])
            stages.compute(slot)
        torch.cuda.synchronize()
        copy_alone, forward_alone = time_alone(stages, streams)
        predictions, batches, wall = drive(stages, streams, images // batch)
    times = StreamTimes(batch, images, "uint8", wall, copy_alone, forward_alone,
                        stages.host_in[0].numel(), batches)
    differ = int((predictions[:batch] != reference_top1).sum())
    return {**times.as_dict(), "label": best.label, "candidates": table,
            "differ": differ, "allowed_differ": allowed_differ(precision, batch)}
