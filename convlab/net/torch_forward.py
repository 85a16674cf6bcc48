"""The same network in PyTorch, on the same weights and device input, at PyTorch's best: the
speed to beat end to end. A PyTorch user after speed reaches for channels-last tensors, CUDA
graphs and `torch.compile`, so each of those is a candidate, in the precision class of the run
being compared (fp32 with TF32 off, tf32, fp16, bf16), and the fastest is the baseline.

Candidates: layout (NCHW, channels-last) x mode (eager, a captured CUDA graph, torch.compile in
its default mode), and torch.compile's max-autotune mode (Triton conv and GEMM templates timed
against cuDNN's, CUDA graphs) in channels-last, the layout its user picks for speed; it compiles
for minutes (more than five for AlexNet in fp32 on an H100), so it is not timed in NCHW. Each is
warmed up (cuDNN's algorithm search, compilation) before it is timed
with timer.time_device, and its top-1 predictions are checked against the reference's. The
input's conversion to the candidate's dtype and layout is staging, outside the time. PyTorch is
optional; without it (or without CUDA) this reports why. A candidate that fails (torch.compile
without a working compiler toolchain, say) is reported with its error, not raised.
"""

from __future__ import annotations

import importlib.util
import warnings
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np

from ..errors import ConvlabError
from ..gpu.isolate import gpu_wait
from ..models import LRN, Conv, Dense, Flatten, MaxPool, ReLU, Softmax, Tanh, Weights

LAYOUTS = ("nchw", "nhwc")
MODES = ("eager", "graph", "compile", "max-autotune")
MODE_WORDS = {"eager": "eager", "graph": "CUDA graph", "compile": "torch.compile",
              "max-autotune": "torch.compile max-autotune"}
LAYOUT_WORDS = {"nchw": "NCHW", "nhwc": "channels-last"}
# precision class -> (torch dtype name, TF32 allowed)
DTYPES = {"fp32": ("float32", False), "tf32": ("float32", True), "fp16": ("float16", False),
          "bf16": ("bfloat16", False)}
GRAPH_WARMUP = 3


def check_installed(option: str = "--pytorch") -> None:
    """A ConvlabError naming the extra when PyTorch is not installed (without importing it)."""
    if importlib.util.find_spec("torch") is None:
        raise ConvlabError(f"{option} times PyTorch beside our forward pass, and PyTorch is not "
                           f'installed: pip install -e ".[train]"')


def unavailable_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed (pip install -e \".[train]\")"
    if not torch.cuda.is_available():
        return "PyTorch has no CUDA device"
    return None


@dataclass
class TorchRow:
    """One PyTorch candidate for the whole forward pass."""

    precision: str
    layout: str
    mode: str
    ms: float | None = None  # per forward pass, device-resident input
    differ: int | None = None  # top-1 predictions that differ from the reference's
    error: str = ""  # why it was not measured

    @property
    def label(self) -> str:
        return f"{self.precision}, {LAYOUT_WORDS[self.layout]}, {MODE_WORDS[self.mode]}"

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TorchRow":
        return cls(**d)


def allowed_differ(precision: str, batch: int) -> int:
    """Top-1 flips a candidate may have and still be a baseline: none in fp32, as for our own
    fp32 variants; 1% of the batch in the reduced-precision classes (near-ties flip there)."""
    return 0 if precision == "fp32" else max(1, batch // 100)


def fastest(rows: list[TorchRow], batch: int) -> TorchRow | None:
    """The fastest candidate whose predictions hold (a miscompiled one is no baseline)."""
    valid = [r for r in rows if r.ms is not None
             and r.differ is not None and r.differ <= allowed_differ(r.precision, batch)]
    return min(valid, key=lambda r: r.ms, default=None)


def _error(exc: Exception) -> str:
    first = (str(exc).splitlines() or [""])[0][:200]
    return f"{type(exc).__name__}: {first}"


def _set_precision(torch, tf32: bool) -> None:
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32


def network_function(weights: Weights, precision: str = "fp32", layout: str = "nchw"):
    """(forward(x) -> probabilities, stage(cupy x) -> x as forward reads it): the model in
    PyTorch's functional ops, its weights on the device in the class's dtype (conv weights in
    the layout)."""
    import torch
    import torch.nn.functional as F

    dtype = getattr(torch, DTYPES[precision][0])
    memory = torch.channels_last if layout == "nhwc" else torch.contiguous_format
    t = {}
    for k, v in weights.arrays.items():
        if k == "reference_predictions":
            continue
        tensor = torch.from_dlpack(_device(v)).to(dtype)
        t[k] = tensor.contiguous(memory_format=memory) if tensor.dim() == 4 else tensor
    layers = weights.spec.layers

    def forward(xt):
        a = xt
        for layer in layers:
            if isinstance(layer, Conv):
                a = F.conv2d(a, t[f"{layer.name}.weight"], t.get(f"{layer.name}.bias"),
                             stride=layer.stride, padding=layer.pad, groups=layer.groups)
            elif isinstance(layer, ReLU):
                a = F.relu(a)
            elif isinstance(layer, Tanh):
                a = torch.tanh(a)
            elif isinstance(layer, LRN):
                a = F.local_response_norm(a, layer.size, layer.alpha, layer.beta, layer.k)
            elif isinstance(layer, MaxPool):
                a = F.max_pool2d(a, layer.size, layer.step)
            elif isinstance(layer, Flatten):
                a = a.flatten(1)  # logical (C, H, W) order in either layout, as the weights expect
            elif isinstance(layer, Dense):
                a = F.linear(a, t[f"{layer.name}.weight"], t[f"{layer.name}.bias"])
            elif isinstance(layer, Softmax):
                a = F.softmax(a, dim=1)
        return a

    def stage(x):
        return torch.from_dlpack(x).to(dtype).contiguous(memory_format=memory)

    return forward, stage


def layout_modes(layout: str) -> tuple[str, ...]:
    """The modes timed in `layout`: max-autotune in channels-last only."""
    return MODES if layout == "nhwc" else tuple(m for m in MODES if m != "max-autotune")


def _runner(torch, forward, xt, mode: str, tf32: bool) -> Callable[[], object]:
    """A function that launches one forward pass of `mode` and returns its output tensor."""
    _set_precision(torch, tf32)
    if mode == "eager":
        def run():
            _set_precision(torch, tf32)
            return forward(xt)

        return run
    if mode in ("compile", "max-autotune"):
        # Every candidate compiles the same code object with new closures, each a Dynamo cache
        # entry; past its limit (8) Dynamo runs eager without failing. A multi-batch run makes
        # three a batch: each compile starts from an empty cache.
        torch._dynamo.reset()
        compiled = torch.compile(forward, mode=None if mode == "compile" else mode)

        def run():
            _set_precision(torch, tf32)
            return compiled(xt)

        with warnings.catch_warnings():  # Inductor's advice to allow TF32 in an fp32 run
            warnings.filterwarnings("ignore", message=".*TensorFloat32", category=UserWarning)
            run()  # compiles here, outside any timing
        return run
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # cuDNN's algorithm search and allocations before capture
        for _ in range(GRAPH_WARMUP):
            forward(xt)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = forward(xt)

    def replay():
        graph.replay()
        return out

    return replay


def candidates(weights: Weights, x, precision: str, reference_top1: np.ndarray,
               time_fn: Callable[[Callable[[], object]], float]) -> list[TorchRow]:
    """Every layout x mode for the precision class, each timed by time_fn(launch) -> ms and
    checked against `reference_top1` on the device input x (CuPy)."""
    import torch

    tf32 = DTYPES[precision][1]
    rows = []
    for layout in LAYOUTS:
        try:
            forward, stage = network_function(weights, precision, layout)
            xt = stage(x)
        except Exception as exc:  # noqa: BLE001 - a layout PyTorch cannot run is reported
            rows += [TorchRow(precision, layout, mode, error=_error(exc))
                     for mode in layout_modes(layout)]
            continue
        for mode in layout_modes(layout):
            row = TorchRow(precision, layout, mode)
            try:
                with gpu_wait():  # graph capture and compilation synchronise the device
                    run = _runner(torch, forward, xt, mode, tf32)
                row.ms = time_fn(run)
                with gpu_wait():
                    top1 = run().float().argmax(dim=1).cpu().numpy()
                row.differ = int((top1 != reference_top1).sum())
            except Exception as exc:  # noqa: BLE001 - a candidate PyTorch cannot run is reported
                row.ms, row.error = None, _error(exc)
            rows.append(row)
    return rows


def _device(array):
    import cupy

    return cupy.asarray(array)
