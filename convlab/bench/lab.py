"""One run: model x kernel x batch. Load the input, plan the network, time and verify every
layer, run it end to end from host images to host predictions, and return a result record."""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from .. import tuning
from ..errors import ConvlabError, DeviceMemoryError
from ..gpu import (cache_dir, gpu_available, hardware, nvtx, require_cupy, timer,
                  unavailable_reason)
from ..gpu.elements import FLOAT16, values
from ..gpu.isolate import DEFAULT_TIMEOUT_S, gpu_wait, run_isolated
from ..kernels import VARIANTS, Variant, get_variant
from ..models import FASHION_MNIST, IMAGENET, ModelSpec, Weights, get_model, load_weights
from ..net import data, imagenet, torch_forward
from ..net.network import ConvStep, Network, Step
from ..net.plan import NetworkPlan, plan_network
from ..net.pipeline import Pipeline
from ..net.torch_forward import candidates, fastest
from ..ops import reference_for
from ..oracle.reference import forward
from ..oracle.verify import Check, compare, poison, random_problem
from ..shapes import ConvShape
from ..userkernel.kernelfile import KernelFile, load_kernel_file
from ..userkernel.sanitize import DEFAULT_BATCH as SANITIZE_BATCH
from . import guard
from .records import FailedRun, LayerResult, RunResult, StepTime

MAX_BATCH = data.TEST_SET_SIZE
MAX_IMAGENET_BATCH = 4096  # random AlexNet inputs: 618 KB each on the host, again on the device
VERIFY_IMAGES = 32  # conv outputs checked against float64 per layer: these first images + the last
IMAGENET_INPUT_SEED = 227  # the fixed random batch `run` and `compare` feed AlexNet
BREAKDOWN_PASSES = 10  # forward passes timed step by step for the per-layer breakdown
MIN_HOST_PASSES = 1  # on the CPU a pass can take seconds: passes go on while the budget lasts


DEFAULT_BATCH = {FASHION_MNIST: MAX_BATCH, IMAGENET: 128}
# For models with general layers: the first of these that computes every conv layer on this GPU
# is the default GPU kernel, the fastest general fp32 variant first (AlexNet's forward at batch
# 128 on an H100: wgmma-3xtf32 2.864 ms (Hopper only; 2026-11-25), channels-last-3xtf32 3.453,
# pipelined-3xtf32 3.840 (2026-11-25).
GENERAL_DEFAULTS = ("wgmma-3xtf32", "channels-last-3xtf32", "pipelined-3xtf32", "implicit-gemm",
                    "naive")


def default_batch(spec: ModelSpec) -> int:
    return DEFAULT_BATCH[spec.task]


def default_kernel(spec: ModelSpec) -> tuple[str, str | None]:
    """The kernel `run` uses without --kernel, and a note when that is the CPU for lack of a GPU.
    The course's models get `tiled`, the course's own first fast kernel."""
    if not gpu_available():
        return "cpu", f"running the cpu variant: no usable GPU; {unavailable_reason()}"
    if spec.task == FASHION_MNIST:
        return "tiled", None
    shapes = spec.conv_shapes(1).values()
    for name in GENERAL_DEFAULTS:
        if name in VARIANTS and all(VARIANTS[name].supports(s) for s in shapes):
            return name, None
    return "naive", None


def max_batch(spec: ModelSpec) -> int:
    return MAX_IMAGENET_BATCH if spec.task == IMAGENET else MAX_BATCH


def check_batch(batch: int, spec: ModelSpec) -> None:
    limit = max_batch(spec)
    if not 1 <= batch <= limit:
        what = "the test set's size" if limit == MAX_BATCH else "the random input batch's limit"
        raise ConvlabError(f"batch must be between 1 and {limit} ({what}), got {batch}")


def parse_batches(text: str, spec: ModelSpec | None) -> list[int]:
    """'10,100,1000' -> [10, 100, 1000] (sorted, unique), each checked against the model's limit
    (with no model, for a --layer of random inputs, only that each is at least 1)."""
    parts = [p.strip() for p in str(text).split(",")]
    if not any(parts):
        raise ConvlabError("--batch needs at least one batch size, e.g. 10,100,1000,10000")
    if not all(parts):
        raise ConvlabError(f"--batch '{text}' has an empty entry: write batch sizes between "
                           "commas, e.g. 10,100,1000")
    try:
        batches = [int(p) for p in parts]
    except ValueError:
        raise ConvlabError(f"--batch takes comma-separated integers; got '{text}'") from None
    for b in batches:
        if spec is not None:
            check_batch(b, spec)
        elif b < 1:
            raise ConvlabError(f"--batch sizes must be 1 or more, got {b}")
    return sorted(set(batches))


# --- inputs ---------------------------------------------------------------------------------

def load_input(spec: ModelSpec, batch: int) -> np.ndarray:
    """The network input a run uses: the first `batch` Fashion-MNIST test images, prepared for
    the model, or for ImageNet models the first `batch` images of a fixed random batch (values
    uniform in [-128, 128), like mean-subtracted 8-bit pixels; image i is the same at every
    batch size)."""
    check_batch(batch, spec)
    if spec.task == FASHION_MNIST:
        images, _ = data.load_test_set(batch)
        return data.prepare_input(images, spec.input_size)
    x = np.empty((batch, *spec.input_shape), dtype=np.float32)
    for i in range(batch):
        rng = np.random.default_rng([IMAGENET_INPUT_SEED, i])
        x[i] = rng.random(spec.input_shape, dtype=np.float32) * 256 - 128
    return x


def _digest(weights: Weights) -> str:
    h = hashlib.sha256()
    for key in sorted(weights.arrays):
        if key != "reference_predictions":
            h.update(key.encode())
            h.update(np.ascontiguousarray(weights.arrays[key]).tobytes())
    return h.hexdigest()[:16]


def reference_probabilities(weights: Weights, x: np.ndarray) -> np.ndarray:
    """The float64 forward pass of the whole network on the fixed random ImageNet batch x
    (load_input's), cached on disk per weights: image i is the same at every batch size, so a
    longer cached prefix serves every shorter batch."""
    folder = cache_dir()
    path = folder / f"reference-{weights.spec.name}-{_digest(weights)}-seed{IMAGENET_INPUT_SEED}.npy"
    known = np.zeros((0, 0))
    if path.exists():
        try:
            known = np.load(path)
        except (OSError, ValueError):
            known = np.zeros((0, 0))
    n = len(x)
    if len(known) < n:
        fresh = np.concatenate([forward(weights, x[i:i + 64], dtype=np.float64)
                                for i in range(len(known), n, 64)])
        known = fresh if len(known) == 0 else np.concatenate([known, fresh])
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.npy")
        np.save(tmp, known)
        os.replace(tmp, path)
    return known[:n]


def top1_flips(ref: np.ndarray, predictions: np.ndarray,
               max_error: float) -> tuple[list[dict], int]:
    """The images whose predicted class is not float64's, each with its float64 top-2 margin
    (the two largest probabilities' difference), and how many images of the batch have a
    margin below 2 * max_error, the most any class's probability moved: only those can flip.
    A flip outside them would be a wrong result, not rounding."""
    top2 = np.sort(ref, axis=1)[:, -2:]
    margins = top2[:, 1] - top2[:, 0]
    flips = [{"image": int(i), "margin": float(margins[i])}
             for i in np.flatnonzero(predictions != ref.argmax(axis=1))]
    return flips, int((margins < 2 * max_error).sum())


# --- verification and timing of one conv step -------------------------------------------------

def verify_step(step: ConvStep, precision: str, verify: str = "sample", x=None,
                sample: guard.Sample | None = None) -> Check:
    """Check the layer's current output against float64: with verify="sample", SAMPLE_IMAGES
    images drawn at random on every call (or `sample`'s draw, shared with the other variants
    checked on the same problem), whole, and every image's first and last output rows; with
    "full", every output. `x` is the input the output was computed from (default: the step's
    input). A failing check's reason ends with a diagnosis of the wrong outputs' pattern."""
    layer = guard.Layer(step.shape, step.weights, step.bias, step.epilogue, precision, step.kept)
    return guard.verify_output(layer, step.input if x is None else x, step.op.output(step.output),
                               verify, sample=sample)


def time_and_verify(step: ConvStep, variant: Variant, policy: timer.TimingPolicy,
                    verify: str = "sample", sample: guard.Sample | None = None,
                    ) -> tuple[timer.Timing, Check]:
    """Time the step's op, then verify the output of its last timed run, with the defences of
    convlab/bench/guard.py: the timed runs rotate between inputs of different contents; the last
    timed sample is one launch that reads contents no run has seen, into an output poisoned
    just before it (as after warm-up);
    the verified sample is drawn at random; on the GPU, work left outside the timed stream
    (still running after the stop event, or seen by a device-synchronised wall clock and not by
    the events) fails the check."""
    rotation = guard.InputRotation(step.input, step.op.stage)

    def launch() -> None:
        rotation.launch(step.op, step.output)

    def before_last() -> None:
        rotation.refresh_next()
        poison(step.output)

    if variant.on_gpu:
        watch = guard.StreamWatch()
        timing = timer.time_device(launch, policy, after_warmup=lambda: poison(step.output),
                                   before_last=before_last, after_sample=watch.after_sample)
    else:
        timing = timer.time_host(launch, policy, after_warmup=lambda: poison(step.output),
                                 before_last=before_last)
    check = verify_step(step, variant.precision, verify, rotation.last_input, sample)
    if variant.on_gpu:
        finding = watch.finding(timing.median_ms) or guard.wall_check(launch, timing.median_ms)
        if finding:
            check = guard.timer_failure(check, finding)
    return timing, check

# --- building and running ---------------------------------------------------------------------

def _variant_for(kernel: str | Variant) -> Variant:
    variant = get_variant(kernel) if isinstance(kernel, str) else kernel
    if variant.on_gpu:
        require_cupy(f"kernel '{variant.name}'")
    return variant


def network_plan(spec: ModelSpec, kernel: str | Variant, batch: int,
                 fallback: str | Variant | None = None) -> NetworkPlan:
    """Who runs each layer of `spec` at `batch` (net.plan), or a ConvlabError naming every
    layer the kernel cannot compute when no fallback takes them."""
    check_batch(batch, spec)
    variant = _variant_for(kernel)
    fb = _variant_for(fallback) if fallback is not None else None
    return plan_network(spec, variant, batch, fb).check()


def build_network(spec: ModelSpec, kernel: str | Variant, batch: int,
                  weights: Weights | None = None,
                  fallback: str | Variant | None = None) -> Network:
    """`spec` at `batch` with `kernel` in its conv layers, built (compiles every kernel and
    allocates every buffer). With `fallback`, layers the kernel does not support use that one."""
    plan = network_plan(spec, kernel, batch, fallback)
    return Network(weights or load_weights(spec.name), plan)


def infer(weights: Weights, kernel: str, x: np.ndarray, chunk: int = 256) -> np.ndarray:
    """Class probabilities (float32, (N, classes)) for network input x, computed by `kernel`."""
    spec = weights.spec
    if x.ndim != 4 or x.shape[1:] != spec.input_shape:
        raise ConvlabError(f"model '{spec.name}' takes input of shape (N, {', '.join(map(str, spec.input_shape))}),"
                           f" got {x.shape}")
    out = []
    networks: dict[int, Network] = {}
    with within_device_memory(f"{spec.name} on {min(chunk, len(x))} images at once with "
                              f"'{kernel}'"):
        for i in range(0, len(x), chunk):
            part = np.ascontiguousarray(x[i:i + chunk], dtype=np.float32)
            net = networks.get(len(part)) or networks.setdefault(
                len(part), build_network(spec, kernel, len(part), weights))
            if net.on_gpu:
                net.input.set(part)
                out.append(net.xp.asnumpy(net.forward()))
            else:
                net.input[...] = part
                out.append(np.array(net.forward()))
    return np.concatenate(out).astype(np.float32)


def classify(kernel: str, paths: list[Path],
             weights: Weights) -> list[imagenet.Classified]:
    """Top-5 classes of every input file, the forward pass computed by `kernel`."""
    spec = weights.spec
    if spec.task != IMAGENET:
        raise ConvlabError(f"model '{spec.name}' classifies {spec.task}, not ImageNet images; "
                           "classify takes --model alexnet, resnet50 or vgg16")
    x, labels = imagenet.load_inputs(paths, spec)
    probabilities = infer(weights, kernel, x)
    return [imagenet.Classified(label, top)
            for label, top in zip(labels, imagenet.top_classes(probabilities))]


def _time_steps(network: Network, passes: int,
                budget_s: float = timer.DEFAULT_BUDGET_S) -> dict[str, list[float]]:
    """Per-step times inside whole forward passes (after the warm-up pass): CUDA events between
    steps on the GPU, each pass queued behind a spin kernel so the host's dispatch of one step
    never shows as another's time (as timer.time_device does); the host clock for the cpu
    variant, where passes stop early (after MIN_HOST_PASSES) once `budget_s` is spent."""
    samples: dict[str, list[float]] = {s.label: [] for s in network.steps}
    if not network.on_gpu:
        start = time.perf_counter()
        for i in range(passes):
            if i >= MIN_HOST_PASSES and time.perf_counter() - start > budget_s:
                break
            marks = {}
            network.forward(on_step=lambda step, when: marks.__setitem__((step.label, when),
                                                                           time.perf_counter()))
            for s in network.steps:
                samples[s.label].append((marks[(s.label, "end")] - marks[(s.label, "begin")]) * 1e3)
        return samples
    import cupy

    def one_pass(spin_ms: float | None) -> tuple[dict, bool, float]:
        marks = {}

        def mark(step, when):
            ev = cupy.cuda.Event()
            ev.record()
            marks[(step.label, when)] = ev

        if spin_ms is not None:
            timer.hold_device(spin_ms)
        issued = time.perf_counter()
        network.forward(on_step=mark)
        issued = (time.perf_counter() - issued) * 1e3
        queued = not marks[(network.steps[0].label, "begin")].done
        with gpu_wait():
            cupy.cuda.Device().synchronize()
        return marks, queued, issued

    host_ms = one_pass(None)[2]
    spin_ms = max(timer.SPIN_FLOOR_MS, timer.SPIN_MARGIN * host_ms)
    while len(samples[network.steps[0].label]) < passes:
        marks, queued, _ = one_pass(spin_ms)
        if not queued and spin_ms < timer.MAX_SPIN_MS:  # the GPU caught up: spin longer
            spin_ms = min(2 * spin_ms, timer.MAX_SPIN_MS)
            continue
        for s in network.steps:
            samples[s.label].append(cupy.cuda.get_elapsed_time(marks[(s.label, "begin")],
                                                               marks[(s.label, "end")]))
    return samples


def _sampler(network: Network) -> Callable:
    """a -> its sampled images on the host: the first VERIFY_IMAGES and the last."""
    B = network.batch
    idx = sorted(set(range(min(B, VERIFY_IMAGES))) | {B - 1})

    def host(a):
        a = a[idx]
        return network.xp.asnumpy(a) if network.on_gpu else np.asarray(a)

    return host


def _layer_step_operands(step: Step, network: Network) -> tuple:
    """A non-conv step's input and kept activation on the sampled images, in float64, taken
    before its launch: an elementwise step may write its output over its input."""
    host = _sampler(network)
    kept = None if step.kept is None else values(host(step.kept)).astype(np.float64)
    return values(host(step.input)).astype(np.float64), kept


def _verify_layer_step(step: Step, network: Network, operands: tuple) -> Check:
    """A non-conv step's output on the sampled images against its float64 reference from
    `operands` (_layer_step_operands; our layer kernels all compute in float32)."""
    x, kept = operands
    arrays = step.arrays if step.arrays is not None else network.weights.arrays
    ref = reference_for(step.layers, x, arrays, kept)
    return compare(_sampler(network)(step.result()), ref, "fp32")


def _check_layer_steps(network: Network,
                       time_conv: Callable[[ConvStep], None] | None = None) -> dict[str, Check]:
    """One pass: every non-conv step verified (_verify_layer_step) as its launch ends, on its
    operands as they were when it began, and `time_conv(step)` called on each conv step before
    its launch: a step's input and kept activation are there then, before a later step (or
    the step itself, writing in place) reuses their buffers."""
    checks: dict[str, Check] = {}
    operands: dict[str, tuple] = {}

    def each(step: Step, when: str) -> None:
        if step.is_conv:
            if when == "begin" and time_conv is not None:
                time_conv(step)
        elif when == "begin":
            operands[step.label] = _layer_step_operands(step, network)
        else:
            checks[step.label] = _verify_layer_step(step, network, operands.pop(step.label))

    network.forward(on_step=each)
    return checks


def run(plan: NetworkPlan, policy: timer.TimingPolicy | None = None,
        on_event: Callable[[str, object], None] | None = None, weights: Weights | None = None,
        compare_torch: bool = False, graph: bool = True, verify: str = "sample") -> RunResult:
    """Run the planned network (network_plan) on its batch of images: _run, with the device
    running out of memory told in one line."""
    with within_device_memory(f"{plan.spec.name} at batch {plan.batch} with "
                              f"'{plan.variant.name}'"):
        return _run(plan, policy, on_event, weights, compare_torch, graph, verify)


def _run(plan: NetworkPlan, policy: timer.TimingPolicy | None = None,
         on_event: Callable[[str, object], None] | None = None, weights: Weights | None = None,
         compare_torch: bool = False, graph: bool = True, verify: str = "sample") -> RunResult:
    """Run the planned network (network_plan) on its batch of images; `verify` is
    time_and_verify's ("sample" or "full"). `on_event(name, payload)` hears loading-data,
    loaded-data, loading-model, loaded-model, "working" (what a long step does now: the
    warm-up pass, timing a layer, ...), "layer" (its LayerResult) and "done"."""
    start = time.perf_counter()
    emit = on_event or (lambda name, payload=None: None)
    spec, variant, batch = plan.spec, plan.variant, plan.batch
    for runner in filter(None, (variant, plan.fallback)):
        if runner.on_gpu:
            require_cupy(f"kernel '{runner.name}'")
    policy = policy or timer.TimingPolicy()

    emit("loading-data")
    x = load_input(spec, batch)
    emit("loaded-data")
    emit("loading-model")
    weights = weights or load_weights(spec.name)
    held = device_bytes() if variant.on_gpu else 0
    network = Network(weights, plan)  # compiles every layer's kernel
    network.annotate = nvtx.annotate  # layer names on an Nsight Systems timeline
    emit("loaded-model")

    _load(network, x)
    peak_bytes = None
    if network.on_gpu:  # NumPy's steps need no warm-up: the timing pass below is the first
        emit("working", "the warm-up pass")
        network.forward()  # cuDNN's searches, first launches, every conv's staging buffer
        peak_bytes = device_bytes() - held
    layers = []

    def time_conv(step: ConvStep) -> None:
        """Each conv step timed as the pass reaches it, its input fresh (buffers are shared:
        after the pass a later step may have written over it); the pass's own launch then
        computes its output from that input again."""
        emit("working", f"timing {step.label}")
        if network.on_gpu:  # the pass's launches so far, done before this step's timing
            with gpu_wait():
                import cupy

                cupy.cuda.get_current_stream().synchronize()
        step_variant = step.variant
        timing, check = time_and_verify(step, step_variant, policy, verify)
        config, choice = step_variant.resolve(step.shape, step.epilogue)
        layer = LayerResult(step.layer.name, step.label, step.shape, step.epilogue, timing, check,
                            step.op.compile_seconds, step_variant.name, step.op.note,
                            (step.input if step.staged is None else step.staged).dtype.itemsize,
                            choice, config and config.as_dict())
        layers.append(layer)
        emit("layer", layer)

    checks = _check_layer_steps(network, time_conv)

    emit("working", "timing whole passes step by step")
    times = _time_steps(network, BREAKDOWN_PASSES, policy.budget_s)
    steps = [StepTime(s.label, s.category, s.kernel_label, float(np.median(times[s.label])),
                      checks.get(s.label)) for s in network.steps]
    result = RunResult(model=spec.name, kernel=variant.name, precision=variant.precision,
                       batch=batch, layers=layers, accuracy=None, expected_accuracy=None,
                       predictions_differ=0, compile_s=network.compile_seconds,
                       end_to_end_s=0.0, wall_s=0.0, steps=steps,
                       fallback_layers=list(network.fallback_layers),
                       step_passes=len(next(iter(times.values()), [])), peak_bytes=peak_bytes)

    emit("working", "the end-to-end pass and its check")
    if network.on_gpu:  # poisons the conv outputs itself before the pass it checks
        probs, predictions = _device_end_to_end(network, x, result, policy, graph)
    else:  # the timed pass above was host images in, predictions out already
        probs = np.array(network.steps[-1].result())
        predictions = probs.argmax(axis=1)
        result.forward_ms = sum(st.median_ms for st in steps)
        result.end_to_end_s = result.forward_ms / 1e3

    if spec.task == FASHION_MNIST:
        _, labels = data.load_test_set(batch)
        reference = weights.reference_predictions[:batch]
        result.accuracy = float((predictions == labels).mean())
        result.expected_accuracy = float((reference == labels).mean())
        result.predictions_differ = int((predictions != reference).sum())
    else:
        ref = reference_probabilities(weights, x)
        reference = ref.argmax(axis=1)
        result.predictions_differ = int((predictions != reference).sum())
        result.max_prob_error = float(np.abs(probs.astype(np.float64) - ref).max())
        result.top1_flips, result.near_ties = top1_flips(ref, predictions,
                                                         result.max_prob_error)
    if compare_torch and network.on_gpu:
        _torch_time(weights, network, result, policy, reference)
    if network.fallback_layers:
        result.notes.append(fallback_note(network.fallback_layers, plan.fallback.name,
                                          variant.name))
    if any(getattr(step, "variant", variant).filters_once for step in network.steps):
        result.notes.append("filters held once: at this batch they outweigh the activations, "
                            "so the fp32 kernels split them as they multiply (less memory, a "
                            "slower forward)")
    result.device = hardware.device_info() if network.on_gpu else None
    result.wall_s = time.perf_counter() - start
    emit("done", result)
    return result


@contextlib.contextmanager
def within_device_memory(what: str):
    """CuPy running out of device memory inside the block, as one line naming `what` needed it,
    the allocation that failed, what convlab held, the GPU's memory and what to try (a
    DeviceMemoryError), not a traceback from inside a kernel's preparation."""
    try:
        yield
    except MemoryError as exc:
        if not type(exc).__module__.startswith("cupy"):
            raise  # the host's memory: its own message says so
        import cupy

        free, total = cupy.cuda.runtime.memGetInfo()
        held = cupy.get_default_memory_pool().total_bytes()
        gib = 2 ** 30
        raise DeviceMemoryError(
            f"{what} does not fit in this GPU's memory: {str(exc).rstrip('.')}; convlab held "
            f"{held / gib:.1f} GiB, the GPU has {total / gib:.1f} GiB ({free / gib:.1f} GiB "
            "free now). Try a smaller --batch.") from None


def device_bytes() -> int:
    """The bytes CuPy's memory pool has handed out and not taken back: before and after a
    network is built and has run, their difference is what the network holds (the pool is
    where every buffer, weight and workspace of ours comes from)."""
    import cupy

    cupy.cuda.Device().synchronize()
    return int(cupy.get_default_memory_pool().used_bytes())


def fallback_note(layers: list[str], fallback: str, kernel: str) -> str:
    if len(layers) == 1:
        return f"layer {layers[0]} ran with '{fallback}' ('{kernel}' does not support it)"
    return f"layers {', '.join(layers)} ran with '{fallback}' ('{kernel}' does not support them)"


def _load(network: Network, x: np.ndarray) -> None:
    if network.on_gpu:
        network.input.set(x)
    else:
        network.input[...] = x


def _device_end_to_end(network: Network, x: np.ndarray, result: RunResult,
                       policy: timer.TimingPolicy, graph: bool):
    """Device-resident forward time (eager and, when capturable, graph replay), copy times, and
    the host-to-host pass that yields the predictions."""
    import cupy

    eager = timer.time_device(lambda: network.forward(), _whole_pass_policy(policy))
    result.eager_forward_ms = eager.median_ms
    pipe = Pipeline(network, pinned=True, graph=graph)
    result.graph = pipe.graph is not None
    if pipe.graph is not None:
        replay = timer.time_device(lambda: pipe.graph.launch(cupy.cuda.get_current_stream()),
                                   _whole_pass_policy(policy))
        result.forward_ms = replay.median_ms
    else:
        result.forward_ms = eager.median_ms
    pipe.load(x)
    htod, dtoh = pipe.time_copies()
    result.htod_ms, result.dtoh_ms = float(np.median(htod)), float(np.median(dtoh))
    result.end_to_end_s = float(np.median(pipe.time_run())) / 1e3
    predictions = checked_pass(network, pipe)
    probs = cupy.asnumpy(network.steps[-1].result())
    return probs, predictions


def checked_pass(network: Network, pipe) -> np.ndarray:
    """The pipeline's host-to-host pass after the conv outputs are poisoned, so predictions
    come from outputs this pass wrote. The poison goes on the pipeline's own stream: that
    stream does not wait for the default stream, where a fill could land in the middle of the
    pass (NaN in a few images' conv outputs, or all of them, after the pass had read some)."""
    with pipe.stream:
        for s in network.conv_steps:
            poison(s.output)
    return pipe.run()


def _whole_pass_policy(policy: timer.TimingPolicy) -> timer.TimingPolicy:
    return timer.TimingPolicy(warmup=2, min_runs=max(5, policy.min_runs // 2),
                              max_runs=policy.max_runs, target_rse=policy.target_rse,
                              budget_s=policy.budget_s, cold=policy.cold)


def _torch_time(weights: Weights, network: Network, result: RunResult,
                policy: timer.TimingPolicy, reference_top1: np.ndarray) -> None:
    """PyTorch's candidates for the same pass in the run's precision class (torch_forward), and
    the fastest as the run's PyTorch time."""
    reason = torch_forward.unavailable_reason()
    if reason:
        result.torch_note = reason
        return
    rows = candidates(weights, network.input, result.precision, reference_top1,
                      _whole_pass_policy(policy))
    result.torch_rows = [row.as_dict() for row in rows]
    best = fastest(rows, network.batch)
    if best is None:
        result.torch_note = "no PyTorch candidate ran with its predictions intact: " + "; ".join(
            f"{row.label}: {row.error or f'{row.differ} top-1 differ'}" for row in rows)
        return
    result.torch_ms = best.ms
    result.torch_note = f"fastest of {len(rows)}: {best.label}"


@dataclass
class LayerProblem:
    """A layer's random input, filters and bias, the input where the variants read it (on the
    device for GPU variants): several variants or tilings timed on one problem share them, and
    one draw of the verified sample with its float64 references (guard.Sample)."""

    shape: ConvShape
    x: object
    weights: np.ndarray
    bias: np.ndarray | None
    sample: guard.Sample = field(default_factory=guard.Sample)

    @classmethod
    def draw(cls, shape: ConvShape, on_gpu: bool, seed: int | None = None) -> "LayerProblem":
        x, w, b = random_problem(shape, np.random.default_rng(seed))
        for array in (x, w, b):  # shared by the variants timed on it: none may write into them
            if array is not None:
                array.setflags(write=False)
        if on_gpu:
            import cupy

            x = cupy.asarray(x)
        return cls(shape, x, w, b)


def run_layer(shape: ConvShape, kernel: str | Variant, policy: timer.TimingPolicy | None = None,
              epilogue: str | None = None, seed: int | None = None,
              verify: str = "sample", problem: LayerProblem | None = None) -> LayerResult:
    """Time one conv layer alone, on fresh random inputs (or `problem`'s), and verify the last
    timed output (`verify` as in `run`)."""
    variant = layer_variant(_variant_for(kernel))
    kernel = variant.name
    support = variant.supports(shape)
    if not support:
        raise ConvlabError(f"kernel '{kernel}' does not support {shape.describe()}: {support.reason}")
    problem = problem or LayerProblem.draw(shape, variant.on_gpu, seed)
    w, b = problem.weights, problem.bias
    tuning.first_use(variant, shape, epilogue)
    op = variant.prepare(shape, w, epilogue, b)
    xp = np
    if variant.on_gpu:
        import cupy as xp
    xd = xp.asarray(problem.x)
    step = ConvStep(label="layer", category="conv", kernel_label=f"{kernel} layer", op=op,
                    shape=shape, weights=w, bias=b, epilogue=epilogue, input=xd,
                    staged=op.stage(xd), output=xp.empty(op.output_shape, dtype=op.output_dtype))
    timing, check = time_and_verify(step, variant, policy or timer.TimingPolicy(), verify,
                                    problem.sample)
    label = "layer" + (f" + {epilogue}" if epilogue else "")
    note = op.note
    if op.output_dtype == FLOAT16:
        note = "; ".join(filter(None, [note, "fp16 output, as cuDNN's fp16 rows write"]))
    config, choice = variant.resolve(shape, epilogue)
    return LayerResult("layer", label, shape, epilogue, timing, check, op.compile_seconds, kernel,
                       note, step.staged.dtype.itemsize, choice, config and config.as_dict())


def layer_variant(variant: Variant) -> Variant:
    """The variant as a single layer runs it: an fp16 variant that can store fp16 does, as
    cuDNN's fp16 rows store theirs and as the network's fp16 layers hand theirs on (a float32
    output would be twice the bytes of theirs)."""
    if variant.precision == "fp16" and FLOAT16 in variant.output_dtypes:
        return variant.writing(FLOAT16)
    return variant


# --- kernel files: the same run, in a child process -------------------------------------------

RUN_JOB = "convlab.bench.filejobs:run_model"


def run_kernel_file(plan: "RunPlan", on_event: Callable[[str, object], None] | None = None,
                    ) -> Iterator[RunResult | FailedRun]:
    """`run` for each of the plan's batch sizes with its kernel file (userkernel.KernelFile),
    each batch in a child process (convlab.gpu.isolate): a fault, a device wait longer than the
    plan's timeout (a hang) or a crash ends that batch as a FailedRun and the next batch goes
    on. An error the user can act on (a compile error) is raised here with the file's own line
    numbers, as a built-in's run raises it. Events: "isolated" (batch) before each child, then
    "layer" and "done" as `run` emits them, or "failed". Each batch's result is yielded as it
    ends."""
    emit = on_event or (lambda name, payload=None: None)
    kernel_file, model = plan.kernel_file, plan.spec.name
    args = {"kernel_file": str(kernel_file.path), "model": model,
            "policy": vars(plan.policy).copy(), "weights_path": plan.weights_path,
            "fallback": None if plan.fallback is None else plan.fallback.name,
            "compare_torch": plan.pytorch, "graph": plan.graph, "verify": plan.verify}
    for batch in plan.batches:
        emit("isolated", batch)
        job = run_isolated(RUN_JOB, {**args, "batch": batch},
                           timeout_s=DEFAULT_TIMEOUT_S if plan.timeout_s is None else plan.timeout_s)
        result = _kernel_file_result(job, kernel_file, model, batch)
        if isinstance(result, FailedRun):
            emit("failed", result)
        else:
            for layer in result.layers:
                emit("layer", layer)
            emit("done", result)
        yield result


def _kernel_file_result(job: dict, kernel_file, model: str, batch: int) -> RunResult | FailedRun:
    variant = kernel_file.variant
    if job["status"] == "error" and job.get("user_error"):
        raise ConvlabError(kernel_file.locate(job["message"]))
    if job["status"] != "ok":
        return FailedRun(model, variant.name, variant.precision, batch, job["status"],
                         job["reason"], kernel_file.record(), job["wall_s"])
    changed = kernel_file.changed(job["result"]["sha256"])
    if changed:
        return FailedRun(model, variant.name, variant.precision, batch, "changed", changed,
                         kernel_file.record(), job["wall_s"])
    result = RunResult.from_dict(job["result"]["run"])
    result.kernel_file = kernel_file.record()
    result.wall_s = job["wall_s"]  # the child's whole life: start-up and compilation included
    result.notes.append(f"kernel file {kernel_file.path} (sha256 {kernel_file.sha256[:12]}) ran "
                        "in a child process")
    return result


# --- `convlab run`: the options, checked, as one plan ------------------------------------------

@dataclass
class RunPlan:
    """What `convlab run` was asked for, checked and decided before anything loads or runs:
    the model, and for each batch size who runs each layer (net.plan)."""
    spec: ModelSpec
    networks: list[NetworkPlan]  # one per batch size, ascending
    weights: Weights
    fallback: Variant | None = None  # as asked: a batch's plan names it only where it runs
    kernel_file: KernelFile | None = None  # run in a child process
    weights_path: str | None = None
    note: str | None = None  # why the kernel is what it is (no GPU: the cpu variant)
    policy: timer.TimingPolicy = field(default_factory=timer.TimingPolicy)
    pytorch: bool = False
    graph: bool = True
    verify: str = "sample"
    timeout_s: float | None = None
    sanitize: str | None = None  # a compute-sanitizer tool: one checked launch, nothing timed

    @property
    def variant(self) -> Variant:
        return self.networks[0].variant

    @property
    def batches(self) -> list[int]:
        return [network.batch for network in self.networks]


def plan_run(model: str, kernel: str | None = None, kernel_file=None, batches: str | None = None,
             weights_path=None, fallback: str | None = None, repeat: int | None = None,
             cold: bool = False, pytorch: bool = False, graph: bool = True,
             verify: str | None = None, timeout_s: float | None = None,
             sanitize: str | None = None, save: bool = False) -> RunPlan:
    """The options of `convlab run` as a plan, or a ConvlabError naming the option at fault or
    every layer the kernel cannot compute (a sanitizer run reports those layer by layer)."""
    spec = get_model(model)
    if kernel is not None and kernel_file is not None:
        raise ConvlabError("give --kernel or --kernel-file, not both")
    if timeout_s is not None and kernel_file is None and sanitize is None:
        raise ConvlabError("--timeout goes with --kernel-file or --sanitize (the built-in kernels "
                           "run in this process)")
    if sanitize is not None:
        unused = [option for option, given in (
            ("--fallback", fallback is not None), ("--repeat", repeat is not None),
            ("--cold", cold), ("--pytorch", pytorch), ("--no-graph", not graph),
            ("--verify", verify is not None), ("--save", save)) if given]
        if unused:
            raise ConvlabError(f"--sanitize makes one checked launch per layer and times nothing: "
                               f"leave out {', '.join(unused)}")
    verify = verify or "sample"
    default = SANITIZE_BATCH if sanitize is not None else default_batch(spec)
    batch_list = parse_batches(str(default) if batches is None else batches, spec)
    weights = load_weights(model, weights_path)  # a wrong file fails before anything runs
    loaded = load_kernel_file(kernel_file) if kernel_file is not None else None
    note = None
    if loaded is None and kernel is None:
        kernel, note = default_kernel(spec)
    variant = loaded.variant if loaded is not None else get_variant(kernel)
    if pytorch:
        torch_forward.check_installed()
        if not variant.on_gpu:
            why = note or f"kernel '{variant.name}' runs on the CPU"
            raise ConvlabError(f"--pytorch times PyTorch on the GPU beside our forward pass, "
                               f"and this run is on the CPU: {why}")
    fb = get_variant(fallback) if fallback is not None else None
    networks = [plan_network(spec, variant, batch, fb) for batch in batch_list]
    if sanitize is None:
        for network in networks:
            network.check()
    policy = timer.TimingPolicy(min_runs=repeat or (10 if variant.on_gpu else 3), cold=cold)
    return RunPlan(spec, networks, weights, fb, loaded,
                   None if weights_path is None else str(weights_path), note, policy, pytorch,
                   graph, verify, timeout_s, sanitize)


class RunInterrupted(Exception):
    """An interrupt (Ctrl-C, or a time limit's SIGINT) after at least one of a run's batches
    ended: the batches that ended, so they are shown and kept, and those that did not."""

    def __init__(self, results: list, left: list[int]):
        super().__init__(f"interrupted before batch {', '.join(map(str, left))}")
        self.results, self.left = results, left


def execute_run(plan: RunPlan, on_event: Callable | None = None) -> list["RunResult"]:
    """The plan's runs, one per batch size, with the plan's notes on each result; interrupted
    after one or more ended, RunInterrupted with those."""
    if plan.kernel_file is not None:
        runs = run_kernel_file(plan, on_event)
    else:
        runs = (run(network, plan.policy, on_event, plan.weights, plan.pytorch, plan.graph,
                    plan.verify) for network in plan.networks)
    results: list = []
    try:
        for result in runs:
            results.append(result)
    except KeyboardInterrupt:
        if not results:
            raise
        left = plan.batches[len(results):]
        for result in results:
            result.notes.append(f"the run was interrupted before batch "
                                f"{', '.join(map(str, left))}")
        raise RunInterrupted(_with_plan_notes(results, plan), left) from None
    return _with_plan_notes(results, plan)


def _with_plan_notes(results: list, plan: RunPlan) -> list:
    for result in results:
        if plan.note:
            result.notes.append(plan.note)
        if plan.policy.cold:
            result.notes.append("L2 cache flushed before every timed run (--cold)")
    return results
