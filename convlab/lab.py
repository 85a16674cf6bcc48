"""One run: model x kernel x batch. Load the data, plan the network, time and verify each conv
layer, measure accuracy end to end, and return a result record."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from . import data, measure
from .errors import ConvlabError
from .gpu import require_cupy
from .kernels import Variant, get_variant
from .models import get_model, load_weights
from .network import ConvStep, Network
from .shapes import ConvShape
from .verify import Check, compare, poison, reference_output

MAX_BATCH = data.TEST_SET_SIZE
VERIFY_IMAGES = 32  # conv outputs checked against float64 per layer: these first images + the last


def check_batch(batch: int) -> None:
    if not 1 <= batch <= MAX_BATCH:
        raise ConvlabError(f"batch must be between 1 and {MAX_BATCH} (the test set's size), got {batch}")


@dataclass
class LayerResult:
    name: str
    label: str
    shape: ConvShape
    epilogue: str | None
    timing: measure.Timing
    check: Check
    compile_s: float

    @property
    def gflops(self) -> float:
        return measure.gflops(self.shape, self.timing.median_ms)

    @property
    def gbps(self) -> float:
        return measure.gbps(self.shape, self.timing.median_ms, self.epilogue)

    def as_dict(self) -> dict:
        return {"name": self.name, "label": self.label, "shape": self.shape.as_dict(),
                "epilogue": self.epilogue, "timing": self.timing.as_dict(),
                "gflops": self.gflops, "gbps": self.gbps, "check": self.check.as_dict(),
                "compile_s": self.compile_s}


@dataclass
class RunResult:
    model: str
    kernel: str
    precision: str
    batch: int
    layers: list[LayerResult]
    accuracy: float
    expected_accuracy: float
    predictions_differ: int
    compile_s: float
    end_to_end_s: float
    wall_s: float
    device: dict | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        layers_ok = all(layer.check.passed for layer in self.layers)
        if self.precision == "fp32":
            return layers_ok and self.predictions_differ == 0
        return layers_ok

    def as_dict(self) -> dict:
        return {"model": self.model, "kernel": self.kernel, "precision": self.precision,
                "batch": self.batch, "passed": self.passed,
                "layers": [layer.as_dict() for layer in self.layers],
                "accuracy": self.accuracy, "expected_accuracy": self.expected_accuracy,
                "predictions_differ": self.predictions_differ, "compile_s": self.compile_s,
                "end_to_end_s": self.end_to_end_s, "wall_s": self.wall_s,
                "device": self.device, "notes": self.notes}


def verify_step(step: ConvStep, precision: str) -> Check:
    """Check the layer's current output on a sample of images against float64."""
    result = step.op.output(step.output)
    B = step.shape.B
    idx = sorted(set(range(min(B, VERIFY_IMAGES))) | {B - 1})
    def host(a):
        a = a[idx]
        return a.get() if hasattr(a, "get") else np.asarray(a)
    x = host(step.input)
    ref = reference_output(x, step.weights, step.shape.with_batch(len(idx)), step.epilogue,
                           step.bias)
    return compare(host(result), ref, precision)


def time_and_verify(step: ConvStep, variant: Variant,
                    policy: measure.TimingPolicy) -> tuple[measure.Timing, Check]:
    """Time the step's op, then verify the output of its last timed run: the output is poisoned
    after warm-up, so nothing left over from warm-up can pass."""
    timer = measure.time_device if variant.on_gpu else measure.time_host
    timing = timer(lambda: step.op(step.input, step.output), policy,
                   after_warmup=lambda: poison(step.output))
    return timing, verify_step(step, variant.precision)


def run(model: str, kernel: str, batch: int, policy: measure.TimingPolicy | None = None,
        on_event: Callable[[str, object], None] | None = None) -> RunResult:
    """Run `model` on the first `batch` test images with `kernel` computing its conv layers."""
    start = time.perf_counter()
    emit = on_event or (lambda name, payload=None: None)
    check_batch(batch)
    spec = get_model(model)
    variant = get_variant(kernel)
    if variant.on_gpu:
        require_cupy(f"kernel '{kernel}'")
    for name, shape in spec.conv_shapes(batch).items():
        support = variant.supports(shape)
        if not support:
            raise ConvlabError(f"kernel '{kernel}' does not support layer {name} "
                               f"({shape.describe()}): {support.reason}")
    policy = policy or measure.TimingPolicy()

    emit("loading-data")
    images, labels = data.load_test_set(batch)
    x = data.prepare_input(images, spec.input_size)
    emit("loaded-data")
    emit("loading-model")
    weights = load_weights(model)
    network = Network(weights, variant, batch)  # compiles every conv layer's kernel
    emit("loaded-model")

    xp = network.xp
    network.forward(xp.asarray(x))  # warm-up, and every conv layer's input for the timings
    layers = []
    for step in network.conv_steps:
        timing, check = time_and_verify(step, variant, policy)
        layer = LayerResult(step.layer.name, step.label, step.shape, step.epilogue, timing, check,
                            step.op.compile_seconds)
        layers.append(layer)
        emit("layer", layer)

    for step in network.conv_steps:
        poison(step.output)
    t0 = time.perf_counter()
    predictions = network.predict(x)
    end_to_end = time.perf_counter() - t0

    reference = weights.reference_predictions[:batch]
    result = RunResult(
        model=model, kernel=kernel, precision=variant.precision, batch=batch, layers=layers,
        accuracy=float((predictions == labels).mean()),
        expected_accuracy=float((reference == labels).mean()),
        predictions_differ=int((predictions != reference).sum()),
        compile_s=network.compile_seconds, end_to_end_s=end_to_end,
        wall_s=time.perf_counter() - start,
        device=measure.device_info() if variant.on_gpu else None,
    )
    emit("done", result)
    return result


def run_layer(shape: ConvShape, kernel: str | Variant, policy: measure.TimingPolicy | None = None,
              epilogue: str | None = None, seed: int | None = None) -> LayerResult:
    """Time one conv layer alone, on fresh random inputs, and verify the last timed output."""
    from .verify import random_problem

    variant = get_variant(kernel) if isinstance(kernel, str) else kernel
    kernel = variant.name
    if variant.on_gpu:
        require_cupy(f"kernel '{kernel}'")
    support = variant.supports(shape)
    if not support:
        raise ConvlabError(f"kernel '{kernel}' does not support {shape.describe()}: {support.reason}")
    x, w, b = random_problem(shape, np.random.default_rng(seed))
    op = variant.prepare(shape, w, epilogue, b)
    xp = np
    if variant.on_gpu:
        import cupy as xp
    step = ConvStep(layer=None, shape=shape, op=op, weights=w, bias=b, epilogue=epilogue,
                    input=xp.asarray(x), output=xp.empty(op.output_shape, dtype=xp.float32))
    timing, check = time_and_verify(step, variant, policy or measure.TimingPolicy())
    label = "layer + tanh + pool" if epilogue else "layer"
    return LayerResult("layer", label, shape, epilogue, timing, check, op.compile_seconds)
