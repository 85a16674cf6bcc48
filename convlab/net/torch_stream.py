"""The same stream in PyTorch, as a PyTorch user would build it for speed: pinned uint8 batches,
`non_blocking` copies on a copy stream, conversion and normalisation on the device, the network
in its fastest form (torch_forward's candidates: NCHW or channels-last, eager, CUDA graph or
torch.compile) on a compute stream, predictions back on a third. Timed like net.stream: each
batch's copy, pass and copy back with CUDA events, the copy and the pass alone first, the whole
stream by the host's clock."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np

from ..models import Weights
from ..ops.ingest import InputTransform, as_images, normalize
from .stream import ISOLATED_RUNS, SLOTS, BatchTimes, ImagePool, StreamTimes
from .torch_forward import (DTYPES, _runner, allowed_differ, candidates, fastest,
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


def stream(weights: Weights, transform: InputTransform, pool: ImagePool, batch: int,
           images: int, precision: str, reference_top1: np.ndarray, workers: int,
           time_fn: Callable[[Callable[[], object]], float]) -> dict:
    """The PyTorch stream of `images` images at `batch`, in the fastest of PyTorch's forms for
    the precision class (chosen on the first batch, whose predictions must match
    `reference_top1` as closely as the class allows): a row like StreamTimes.as_dict() with the
    candidate's label, or the reason none ran."""
    import cupy
    import torch

    first = as_images(pool.images[pool.indices(0, batch)])
    x = cupy.asarray(normalize(first, transform))
    rows = candidates(weights, x, precision, reference_top1, time_fn)
    best = fastest(rows, batch)
    table = [r.as_dict() for r in rows]
    if best is None:
        return {"batch": batch, "error": "no PyTorch candidate ran with its predictions intact",
                "candidates": table}
    forward, stage = network_function(weights, precision, best.layout)
    xt = stage(x)
    run = _runner(torch, forward, xt, best.mode, DTYPES[precision][1])
    to_input = _normaliser(torch, transform)
    u8 = as_images(pool.images)
    shape = (batch, *u8.shape[1:])
    host_in = [torch.empty(shape, dtype=torch.uint8, pin_memory=True) for _ in range(SLOTS)]
    dev_in = [torch.empty(shape, dtype=torch.uint8, device="cuda") for _ in range(SLOTS)]
    host_out = [torch.empty(batch, dtype=torch.int64, pin_memory=True) for _ in range(SLOTS)]
    dev_out = [torch.empty(batch, dtype=torch.int64, device="cuda") for _ in range(SLOTS)]
    copy_s, compute_s, back_s = (torch.cuda.Stream() for _ in range(3))
    threads = ThreadPoolExecutor(workers)

    def compute(slot):
        with torch.cuda.stream(compute_s):
            xt.copy_(to_input(dev_in[slot]))
            dev_out[slot].copy_(run().argmax(dim=1))

    def event():
        return torch.cuda.Event(enable_timing=True)

    try:
        pool.fill(host_in[0].numpy(), 0, u8, threads, workers)
        for slot in range(SLOTS):
            dev_in[slot].copy_(host_in[0])
            compute(slot)
        torch.cuda.synchronize()
        a, b = event(), event()
        copies, passes = [], []
        for _ in range(ISOLATED_RUNS + 1):
            with torch.cuda.stream(copy_s):
                a.record()
                dev_in[0].copy_(host_in[0], non_blocking=True)
                b.record()
            b.synchronize()
            copies.append(a.elapsed_time(b))
            with torch.cuda.stream(compute_s):
                a.record()
            compute(0)
            with torch.cuda.stream(compute_s):
                b.record()
            b.synchronize()
            passes.append(a.elapsed_time(b))

        count = images // batch
        ev = [[event() for _ in range(6)] for _ in range(count)]
        start = event()
        predictions = np.empty(images, dtype=np.int64)
        fills = []
        torch.cuda.synchronize()

        def harvest(j):
            ev[j][5].synchronize()
            predictions[j * batch:(j + 1) * batch] = host_out[j % SLOTS].numpy()

        t0 = time.perf_counter()
        with torch.cuda.stream(copy_s):
            start.record()
        for i in range(count):
            s = i % SLOTS
            if i >= SLOTS:
                ev[i - SLOTS][1].synchronize()
            f0 = time.perf_counter()
            pool.fill(host_in[s].numpy(), i * batch, u8, threads, workers)
            fills.append((time.perf_counter() - f0) * 1e3)
            with torch.cuda.stream(copy_s):
                if i >= SLOTS:
                    copy_s.wait_event(ev[i - SLOTS][3])
                ev[i][0].record()
                dev_in[s].copy_(host_in[s], non_blocking=True)
                ev[i][1].record()
            compute_s.wait_event(ev[i][1])
            if i >= SLOTS:
                compute_s.wait_event(ev[i - SLOTS][5])
            with torch.cuda.stream(compute_s):
                ev[i][2].record()
            compute(s)
            with torch.cuda.stream(compute_s):
                ev[i][3].record()
            back_s.wait_event(ev[i][3])
            if i >= SLOTS:
                harvest(i - SLOTS)
            with torch.cuda.stream(back_s):
                ev[i][4].record()
                host_out[s].copy_(dev_out[s], non_blocking=True)
                ev[i][5].record()
        for j in range(max(0, count - SLOTS), count):
            harvest(j)
        wall = (time.perf_counter() - t0) * 1e3
    finally:
        threads.shutdown()
    batches = [BatchTimes(i, i % SLOTS, fills[i], (start.elapsed_time(e[0]), start.elapsed_time(e[1])),
                          (start.elapsed_time(e[2]), start.elapsed_time(e[3])),
                          (start.elapsed_time(e[4]), start.elapsed_time(e[5])))
               for i, e in enumerate(ev)]
    times = StreamTimes(batch, images, "uint8", wall, float(np.median(copies[1:])),
                        float(np.median(passes[1:])), host_in[0].numel(), batches)
    differ = int((predictions[:batch] != reference_top1).sum())
    return {**times.as_dict(), "label": best.label, "candidates": table,
            "differ": differ, "allowed_differ": allowed_differ(precision, batch)}
