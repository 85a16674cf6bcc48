"""End to end: host images in, host predictions out, around a planned Network.

What each piece buys is measured by `lab.run` (and written up in results/NOTES.md):
- pinned host buffers: the copy engine reads page-locked memory directly; pageable memory is
  first copied by the driver into a staging buffer, in chunks, on the CPU;
- buffers allocated once per batch size (Network), so no cudaMalloc/cudaFreeHost inside a pass;
- a CUDA graph of the whole forward pass: one launch instead of one per layer, which is what
  bounds small batches;
- copies overlapped with compute: the batch is split into chunks, and chunk k+1's input is
  copied on a second stream while chunk k computes.
"""

from __future__ import annotations

import time

import numpy as np

from ..gpu.jit import load_module
from .network import Network

ARGMAX_SOURCE = r"""
// top1: the predicted class of each row of the probabilities, on the device, so only B ints
// cross back to the host. One warp per row: strided max, then a shuffle reduction that keeps
// the lowest index on ties (as NumPy's argmax does).
extern "C" __global__ void top1(const float* __restrict__ p, int* __restrict__ out, int rows, int n)
{
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    const float* r = p + (long long)row * n;
    float best = -__int_as_float(0x7f800000);  // -inf: NVRTC has no math.h constants
    int arg = 0x7fffffff;
    for (int i = lane; i < n; i += 32) {
        const float v = r[i];
        if (v > best) { best = v; arg = i; }
    }
    for (int off = 16; off > 0; off >>= 1) {
        const float ov = __shfl_down_sync(0xffffffffu, best, off);
        const int oa = __shfl_down_sync(0xffffffffu, arg, off);
        if (ov > best || (ov == best && oa < arg)) { best = ov; arg = oa; }
    }
    if (lane == 0) out[row] = arg;
}
"""


def top1_kernel():
    return load_module("pipeline:top1", ARGMAX_SOURCE, ("-std=c++17",), ("top1",)) \
        .module.get_function("top1")


def pinned_empty(shape: tuple, dtype=np.float32) -> np.ndarray:
    """A NumPy array in page-locked host memory (kept alive by the array's base)."""
    import cupy

    count = int(np.prod(shape))
    mem = cupy.cuda.alloc_pinned_memory(count * np.dtype(dtype).itemsize)
    return np.frombuffer(mem, dtype=dtype, count=count).reshape(shape)


def wall_times(run, repeats: int) -> list[float]:
    """Wall-clock milliseconds of `run` (which synchronises before it returns), after one
    untimed run: host images in, host predictions out."""
    run()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        samples.append((time.perf_counter() - t0) * 1e3)
    return samples


def capture(stream, work):
    """A CUDA graph of what `work` launches on `stream`. A capture that fails is ended before
    the error propagates, so the stream (and the next graph anyone captures) is left usable."""
    with stream:
        stream.begin_capture()
        try:
            work()
        except BaseException:
            stream.end_capture()
            raise
        return stream.end_capture()


class Pipeline:
    """Run a Network from host images to host predictions on one stream.

    `pinned`: host buffers page-locked (else ordinary NumPy arrays); `graph`: replay a CUDA
    graph of the forward pass and the top-1 kernel (else launch each step)."""

    def __init__(self, network: Network, pinned: bool = True, graph: bool = True):
        import cupy

        if not network.on_gpu:
            raise ValueError("Pipeline drives a GPU network")
        self.network = network
        self.stream = cupy.cuda.Stream(non_blocking=True)
        shape = network.input.shape
        alloc = pinned_empty if pinned else (lambda s, dtype=np.float32: np.empty(s, dtype))
        self.host_in = alloc(shape)
        self.host_out = alloc((shape[0],), np.int32)
        self.dev_out = cupy.empty((shape[0],), dtype=cupy.int32)
        self.pinned = pinned
        self._top1 = top1_kernel()
        self.graph = None
        with self.stream:
            self._device_pass()  # warm-up: module loads and first-touch costs stay out
        self.stream.synchronize()
        if graph and network.capturable:
            self.graph = capture(self.stream, self._device_pass)
            self.graph.upload(self.stream)
            self.stream.synchronize()

    def _device_pass(self) -> None:
        probs = self.network.forward()
        rows, n = probs.shape
        self._top1(((rows + 7) // 8,), (256,), (probs, self.dev_out, np.int32(rows), np.int32(n)))

    def load(self, images: np.ndarray) -> None:
        """Put a batch into the host input buffer (outside any timing: the lab generates or
        decodes images there once)."""
        np.copyto(self.host_in, images, casting="same_kind")

    def run(self) -> np.ndarray:
        """HtoD copy, forward, top-1, DtoH copy, synchronise; returns the host predictions."""
        with self.stream:
            with self.network.scope("input copy"):
                self.network.input.set(self.host_in, self.stream)
            if self.graph is not None:
                with self.network.scope("forward (CUDA graph)"):
                    self.graph.launch(self.stream)
            else:
                self._device_pass()
            with self.network.scope("output copy"):
                self.dev_out.get(self.stream, out=self.host_out)
        self.stream.synchronize()
        return self.host_out.copy()

    def time_run(self, repeats: int = 10) -> list[float]:
        return wall_times(self.run, repeats)

    def time_copies(self, repeats: int = 10) -> tuple[list[float], list[float]]:
        """CUDA-event milliseconds of the input copy (HtoD) and the predictions copy (DtoH)."""
        import cupy

        marks = [cupy.cuda.Event() for _ in range(3)]
        htod, dtoh = [], []
        for _ in range(repeats + 1):
            with self.stream:
                marks[0].record(self.stream)
                self.network.input.set(self.host_in, self.stream)
                marks[1].record(self.stream)
                self.dev_out.get(self.stream, out=self.host_out)
                marks[2].record(self.stream)
            marks[2].synchronize()
            htod.append(cupy.cuda.get_elapsed_time(marks[0], marks[1]))
            dtoh.append(cupy.cuda.get_elapsed_time(marks[1], marks[2]))
        return htod[1:], dtoh[1:]


class OverlappedPipeline:
    """The batch in chunks: chunk k+1's input copies on a second stream while chunk k computes.

    `network` is planned for the chunk size; two device input buffers alternate, each with a
    CUDA graph (forward pass + top-1) reading it when the network can be captured."""

    def __init__(self, network: Network, chunks: int):
        import cupy

        self.network = network
        self.chunks = chunks
        chunk = network.batch
        self.copy_stream = cupy.cuda.Stream(non_blocking=True)
        self.compute_stream = cupy.cuda.Stream(non_blocking=True)
        self.inputs = [network.input, cupy.empty_like(network.input)]
        self.top = [cupy.empty((chunk,), dtype=cupy.int32) for _ in range(2)]
        self.host_in = pinned_empty((chunk * chunks, *network.input.shape[1:]))
        self.host_out = pinned_empty((chunk * chunks,), np.int32)
        self.copied = [cupy.cuda.Event(), cupy.cuda.Event()]
        self.consumed = [cupy.cuda.Event(), cupy.cuda.Event()]
        self._top1 = top1_kernel()
        self.graphs = []
        for buf in range(2):
            with self.compute_stream:
                self._chunk_pass(buf)
            self.compute_stream.synchronize()
        if network.capturable:
            self.graphs = [capture(self.compute_stream, lambda b=buf: self._chunk_pass(b))
                           for buf in range(2)]
            self.compute_stream.synchronize()

    def _chunk_pass(self, buf: int) -> None:
        probs = self.network.forward(self.inputs[buf])
        rows, n = probs.shape
        self._top1(((rows + 7) // 8,), (256,), (probs, self.top[buf], np.int32(rows), np.int32(n)))

    def load(self, images: np.ndarray) -> None:
        np.copyto(self.host_in, images, casting="same_kind")

    def run(self) -> np.ndarray:
        chunk = self.network.batch
        for k in range(self.chunks):
            buf = k % 2
            with self.copy_stream:
                if k >= 2:  # the compute of chunk k-2 must have read this buffer first
                    self.copy_stream.wait_event(self.consumed[buf])
                self.inputs[buf].set(self.host_in[k * chunk:(k + 1) * chunk], self.copy_stream)
                self.copied[buf].record(self.copy_stream)
            with self.compute_stream:
                self.compute_stream.wait_event(self.copied[buf])
                if self.graphs:
                    self.graphs[buf].launch(self.compute_stream)
                else:
                    self._chunk_pass(buf)
                self.top[buf].get(self.compute_stream, out=self.host_out[k * chunk:(k + 1) * chunk])
                self.consumed[buf].record(self.compute_stream)
        self.compute_stream.synchronize()
        return self.host_out.copy()

    def time_run(self, repeats: int = 5) -> list[float]:
        return wall_times(self.run, repeats)
