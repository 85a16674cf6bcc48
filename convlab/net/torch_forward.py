"""The same network in PyTorch, on the same weights and device input, at PyTorch's best: the
speed to beat end to end. A PyTorch user after speed reaches for channels-last tensors, CUDA
graphs and `torch.compile`, so each of those is a candidate, in the precision class of the run
being compared (fp32 with TF32 off, tf32, fp16, bf16), and the fastest is the baseline.

Candidates: layout (NCHW, channels-last) x mode (eager, a captured CUDA graph, torch.compile in
its default mode), and torch.compile's max-autotune mode (Triton conv and GEMM templates timed
against cuDNN's, CUDA graphs) in channels-last, the layout its user picks for speed. Each is
warmed up (cuDNN's algorithm search, compilation) before it is timed
with timer.time_device, and its top-1 predictions are checked against the reference's.
max-autotune compiles for minutes (an fp32 AlexNet run with it in-process did not end within
9.5 minutes on an H100, 2026-11-28), so it is compiled and timed in a child process
(gpu.isolate) that is ended once it has taken COMPILE_BUDGET_S, and the candidate is then
reported as skipped with that reason. The
input's conversion to the candidate's dtype and layout is staging, outside the time. PyTorch is
optional; without it (or without CUDA) this reports why. A candidate that fails (torch.compile
without a working compiler toolchain, say) is reported with its error, not raised.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
import warnings
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np

from ..errors import ConvlabError
from ..gpu import timer
from ..gpu.isolate import gpu_wait, run_isolated
from ..models import (LRN, BatchNorm, Conv, Dense, Flatten, GlobalAvgPool, MaxPool, ReLU,
                      Softmax, Tanh, Weights, get_model, run_layers)
from ..oracle.verify import unit_roundoff

LAYOUTS = ("nchw", "nhwc")
MODES = ("eager", "graph", "compile", "max-autotune")
MODE_WORDS = {"eager": "eager", "graph": "CUDA graph", "compile": "torch.compile",
              "max-autotune": "torch.compile max-autotune"}
LAYOUT_WORDS = {"nchw": "NCHW", "nhwc": "channels-last"}
# precision class -> (torch dtype name, TF32 allowed)
DTYPES = {"fp32": ("float32", False), "tf32": ("float32", True), "fp16": ("float16", False),
          "bf16": ("bfloat16", False)}
GRAPH_WARMUP = 3
# Seconds a candidate timed in a child (ISOLATED_MODES) may take, its compile included, before
# it is ended and skipped. Where both finished, max-autotune was at most 0.4% faster than the
# default compile, which takes seconds (AlexNet at batch 128: slower in fp16 and bf16 on an
# H100 on 2026-11-28, 4.045 against 4.061 ms in fp32 on an H200 on 2026-11-26).
COMPILE_BUDGET_S = 300.0
BUDGET_ENV = "CONVLAB_COMPILE_BUDGET_S"  # sets another budget (seconds) for a run or a machine


def compile_budget_s() -> float:
    """COMPILE_BUDGET_S, or the seconds BUDGET_ENV names (a ConvlabError if it names none)."""
    text = os.environ.get(BUDGET_ENV, "").strip()
    if not text:
        return COMPILE_BUDGET_S
    try:
        budget = float(text)
    except ValueError:
        budget = -1.0
    if not budget > 0:
        raise ConvlabError(f"{BUDGET_ENV}={text!r}: expected a number of seconds above 0")
    return budget
ISOLATED_MODES = ("max-autotune",)
INPUT_KEY = "__input__"  # the network input, beside the weights in the child's .npz


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
    # The most PyTorch's allocator held allocated while the candidate was built (compiled,
    # captured) and ran, its weights and input included
    peak_bytes: int | None = None

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
    fp32 variants. In the reduced-precision classes near-ties flip, about in proportion to the
    rounding error where their float64 margins lie densely near zero: 1% of the batch at fp16's
    and tf32's unit roundoff, so 8% in bf16 (8 times theirs; PyTorch's bf16 ResNet-50 flipped 8
    to 10 of 128 in every candidate on an H200, 2026-11-28). A miscompiled candidate flips most
    of them."""
    if precision == "fp32":
        return 0
    times_fp16 = round(unit_roundoff(precision) / unit_roundoff("fp16"))
    return max(1, batch * times_fp16 // 100)


def fastest_here(rows: list[TorchRow], batch: int) -> TorchRow | None:
    """The fastest candidate this process may build again: a candidate timed in a child
    (ISOLATED_MODES) would compile again here without its budget."""
    return fastest([r for r in rows if r.mode not in ISOLATED_MODES], batch)


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
    the layout); batch norm unfolded, in eval mode, as a PyTorch user deploys it."""
    import torch
    import torch.nn.functional as F

    dtype = getattr(torch, DTYPES[precision][0])
    memory = torch.channels_last if layout == "nhwc" else torch.contiguous_format
    t = {}
    # Copies, in every class: a float32 tensor taken from CuPy as it is lives in CuPy's memory,
    # which PyTorch's peak does not count (ResNet-50's tf32 channels-last eager peak at batch 1
    # read 53 MiB, under its 98 MiB of weights; H200, 2026-11-28).
    for k, v in weights.arrays.items():
        if k == "reference_predictions":
            continue
        tensor = torch.from_dlpack(_device(v)).to(dtype, copy=True)
        t[k] = tensor.contiguous(memory_format=memory) if tensor.dim() == 4 else tensor
    layers = weights.spec.layers

    def apply(layer, a):
        if isinstance(layer, BatchNorm):
            return F.batch_norm(a, t[f"{layer.name}.running_mean"], t[f"{layer.name}.running_var"],
                                t[f"{layer.name}.weight"], t[f"{layer.name}.bias"],
                                training=False, eps=layer.eps)
        if isinstance(layer, GlobalAvgPool):
            return F.adaptive_avg_pool2d(a, 1).flatten(1)
        if isinstance(layer, Conv):
            return F.conv2d(a, t[f"{layer.name}.weight"], t.get(f"{layer.name}.bias"),
                            stride=layer.stride, padding=layer.pad, groups=layer.groups)
        if isinstance(layer, ReLU):
            return F.relu(a)
        if isinstance(layer, Tanh):
            return torch.tanh(a)
        if isinstance(layer, LRN):
            return F.local_response_norm(a, layer.size, layer.alpha, layer.beta, layer.k)
        if isinstance(layer, MaxPool):
            return F.max_pool2d(a, layer.size, layer.step, layer.pad)
        if isinstance(layer, Flatten):
            return a.flatten(1)  # logical (C, H, W) order in either layout, as the weights expect
        if isinstance(layer, Dense):
            return F.linear(a, t[f"{layer.name}.weight"], t[f"{layer.name}.bias"])
        if isinstance(layer, Softmax):
            return F.softmax(a, dim=1)
        raise TypeError(f"no PyTorch definition for layer {layer!r}")

    def forward(xt):
        return run_layers(layers, xt, apply)

    def stage(x):
        return torch.from_dlpack(x).to(dtype, copy=True).contiguous(memory_format=memory)

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
               policy: timer.TimingPolicy) -> list[TorchRow]:
    """Every layout x mode for the precision class, each timed with `policy` and checked
    against `reference_top1` on the device input x (CuPy); ISOLATED_MODES in a child process
    under COMPILE_BUDGET_S."""
    rows = []
    for layout in LAYOUTS:
        here = [m for m in layout_modes(layout) if m not in ISOLATED_MODES]
        rows += _layout_rows(weights, x, precision, layout, here, reference_top1, policy)
        rows += [isolated_row(weights, x, precision, layout, mode, reference_top1, policy)
                 for mode in layout_modes(layout) if mode in ISOLATED_MODES]
    return rows


def _layout_rows(weights: Weights, x, precision: str, layout: str, modes: list[str],
                 reference_top1: np.ndarray, policy: timer.TimingPolicy) -> list[TorchRow]:
    import torch

    tf32 = DTYPES[precision][1]
    start = torch.cuda.memory_allocated()
    try:
        forward, stage = network_function(weights, precision, layout)
        xt = stage(x)
    except Exception as exc:  # noqa: BLE001 - a layout PyTorch cannot run is reported
        return [TorchRow(precision, layout, mode, error=_error(exc)) for mode in modes]
    held = torch.cuda.memory_allocated() - start  # the weights and the input
    rows = []
    for mode in modes:
        row = TorchRow(precision, layout, mode)
        try:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            with gpu_wait():  # graph capture and compilation synchronise the device
                run = _runner(torch, forward, xt, mode, tf32)
                run()
                torch.cuda.synchronize()
            row.peak_bytes = held + torch.cuda.max_memory_allocated() - before
            row.ms = timer.time_device(run, policy).median_ms
            with gpu_wait():
                top1 = run().float().argmax(dim=1).cpu().numpy()
            row.differ = int((top1 != reference_top1).sum())
        except Exception as exc:  # noqa: BLE001 - a candidate PyTorch cannot run is reported
            row.ms, row.error = None, _error(exc)
        rows.append(row)
    return rows


def isolated_row(weights: Weights, x, precision: str, layout: str, mode: str,
                  reference_top1: np.ndarray, policy: timer.TimingPolicy,
                  budget_s: float | None = None) -> TorchRow:
    """One candidate compiled and timed in a child process, ended after `budget_s`
    (compile_budget_s()): the weights and input cross in a temporary .npz."""
    budget_s = compile_budget_s() if budget_s is None else budget_s
    with tempfile.TemporaryDirectory(prefix="convlab-torch-") as tmp:
        path = os.path.join(tmp, "problem.npz")
        arrays = {k: v for k, v in weights.arrays.items() if k != "reference_predictions"}
        np.savez(path, **arrays, **{INPUT_KEY: x.get() if hasattr(x, "get") else x})
        job = run_isolated(f"{__name__}:child_row", {
            "npz_path": path, "model": weights.spec.name, "precision": precision,
            "layout": layout, "mode": mode, "reference_top1": np.asarray(reference_top1).tolist(),
            "policy": vars(policy).copy()}, timeout_s=budget_s, limit_s=budget_s)
    if job["status"] == "ok":
        return TorchRow.from_dict(job["result"])
    if job["status"] in ("timeout", "hang"):
        error = (f"skipped: not done within its budget of {budget_s:.0f} s (compiling and "
                 f"timing it in a child process)")
    else:
        error = f"{job['status']} in its child process: {job['reason']}"
    return TorchRow(precision, layout, mode, error=error)


def child_row(npz_path: str, model: str, precision: str, layout: str, mode: str,
              reference_top1: list[int], policy: dict) -> dict:
    """isolated_row's job, in the child: the candidate's TorchRow as a dict."""
    import cupy

    with np.load(npz_path) as npz:
        arrays = {key: npz[key] for key in npz.files}
    x = cupy.asarray(arrays.pop(INPUT_KEY))
    (row,) = _layout_rows(Weights(get_model(model), arrays), x, precision, layout, [mode],
                          np.asarray(reference_top1), timer.TimingPolicy(**policy))
    return row.as_dict()


def _device(array):
    import cupy

    return cupy.asarray(array)
