"""`convlab compare`: every chosen variant x batch size x conv layer, verified, then timed.

A row's speed counts only after the variant passed on fresh random inputs (several draws, like
KernelBench's correctness trials) and its last timed output on real data passed again. A FAIL
row keeps its reason and is never ranked. cuDNN rows (through PyTorch, when importable) come
from the same process and the same device arrays. Kernel files (--kernel-file) get the same
rows from a child process (convlab.gpu.isolate), one per batch size: a fault, a hang or a crash
there makes that run's rows FAIL with the reason, and the comparison goes on.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from typing import Callable, Sequence

import numpy as np

from ..errors import ConvlabError
from ..gpu import gpu_available, hardware, peaks, require_cupy, roofline, timer
from ..gpu.isolate import (DEFAULT_TIMEOUT_S, gpu_wait, run_isolated, sigterm_interrupts,
                           stop_status)
from ..kernels import CUDNN_ROWS, REFERENCE_VARIANTS, RELU, TANH_POOL, VARIANTS, get_variant
from ..kernels.base import Arithmetic, direct_arithmetic
from ..models import DEFAULT_MODEL, Conv, ModelSpec, ReLU, Weights, get_model
from ..net.plan import plan_network
from ..oracle.verify import compare as compare_output, random_problem, reference_output
from ..shapes import FLOAT_BYTES, ConvShape, parse_layer
from ..userkernel.kernelfile import load_kernel_file
from . import guard, lab, suites
from .guard import host

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
COMPARE_JOB = "convlab.bench.filejobs:compare_rows"
RANDOM_TRIALS = 3
RANDOM_TRIAL_BATCH = 9  # images per random trial: small, and no multiple of any block size
# Without --batch: a --layer's batch sizes, and the default model's when --model is not given
# (a named model gets its run's batch size).
SWEEP_BATCHES = "10,100,1000,10000"
FALLBACK = "naive"  # computes the layers a compared variant cannot, so the rest can be timed


@dataclass
class Row:
    variant: str
    precision: str
    batch: int
    layer: str
    label: str
    shape: ConvShape
    epilogue: str | None = None
    status: str = PASS
    reason: str = ""
    timing: timer.Timing | None = None
    max_rel_error: float | None = None
    accuracy: float | None = None
    predictions_differ: int | None = None
    floor_ms: float | None = None
    floor_bound: str = ""
    speedup_naive: float | None = None
    speedup_cudnn: float | None = None
    best: bool = False
    bound_ratio: float | None = None  # worst |err| / bound of the verified output
    cudnn_basis: str = ""  # the cuDNN row speedup_cudnn divides by: the fastest of the class
    note: str = ""  # what the op chose when prepared (cuDNN: fused conv-bias-ReLU or not)
    floor_basis: str = ""  # the arithmetic floor_ms counts (FP32, 3xTF32, FP32 F(2x2), ...)
    choice: str = ""  # where the row's tiling came from (tuning.Choice), "" without one
    config: dict | None = None  # the tiling the row ran (its dict), None without one

    @property
    def key(self) -> tuple:
        return (self.variant, self.batch, self.layer, self.epilogue)

    @property
    def valid(self) -> bool:
        return self.status == PASS and self.timing is not None

    @property
    def median_ms(self) -> float | None:
        return self.timing.median_ms if self.valid else None

    @property
    def gflops(self) -> float | None:
        return roofline.gflops(self.shape, self.median_ms) if self.valid else None

    @property
    def gbps(self) -> float | None:
        if not self.valid:
            return None
        return roofline.gbps(self.shape, self.median_ms, self.epilogue,
                             roofline.element_bytes(self.precision))

    @property
    def pct_floor(self) -> float | None:
        if not self.valid or self.floor_ms is None:
            return None
        return 100.0 * self.floor_ms / self.median_ms

    def as_dict(self) -> dict:
        """Every field by name (the timing and shape as their own dicts), plus the derived
        figures a reader of the JSON wants without recomputing them."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["shape"] = self.shape.as_dict()
        d["timing"] = self.timing.as_dict() if self.timing else None
        d.update(gflops=self.gflops, gbps=self.gbps, pct_floor=self.pct_floor)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Row":
        """The row as_dict() gave, by field name (fields a record predates take defaults)."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in d.items() if k in known}
        values["shape"] = ConvShape(**d["shape"])
        values["timing"] = timer.Timing.from_dict(d["timing"]) if d.get("timing") else None
        return cls(**values)


@dataclass
class Comparison:
    model: str | None
    batches: list[int]
    kernels: list[str]
    rows: list[Row] = field(default_factory=list)
    ceilings: dict | None = None
    device: dict | None = None
    policy: dict | None = None
    kernel_files: list[dict] = field(default_factory=list)  # userkernel.KernelFile.record()s
    interrupted: str = ""  # how far the runs got when Ctrl-C or SIGTERM stopped them
    stop_status: int = 0  # then the shell's exit status for that signal (130, 143)
    other_gpus: dict[str, str] = field(default_factory=dict)  # variants for another GPU: why
    suite: str | None = None  # the layer suite compared (bench.suites), if one was
    classes: list[str] = field(default_factory=list)  # a suite's precision classes


def parse_kernels(spec: str | None, shapes: list[ConvShape], partial: bool = False,
                  precisions: Sequence[str] = ()) -> list[str]:
    """'all' (or nothing): every variant that supports the layers (with `partial`, a model's
    layers: any of them, the others showing as SKIP), plus the cuDNN rows, in both layouts, of
    fp32, tf32 and the precisions present (those of the named variants and `precisions`, the
    kernel files')."""
    if spec is None or spec.strip() == "all":
        fits = any if partial else all
        names = [n for n, v in VARIANTS.items() if v.on_gpu and n not in REFERENCE_VARIANTS
                 and fits(v.supports(s) for s in shapes)]
    else:
        names = [n.strip() for n in spec.split(",") if n.strip()]
        if not names:
            raise ConvlabError("--kernels needs at least one variant name, or 'all'")
        for n in names:
            get_variant(n)
    precisions = {VARIANTS[n].precision for n in names} | set(precisions)
    for precision, refs in CUDNN_ROWS.items():
        needed = precision in ("fp32", "tf32") or precision in precisions
        names += [ref for ref in refs if needed and ref not in names
                  and any(VARIANTS[ref].fits(s) for s in shapes)]
    return names


def for_other_gpus(spec: str | None) -> dict[str, str]:
    """With 'all': the variants left out because they run on another GPU (wgmma needs Hopper),
    each with the reason, so that a table without them says why."""
    if spec is not None and spec.strip() != "all":
        return {}
    problems = {name: v.gpu_problem() for name, v in VARIANTS.items() if v.on_gpu}
    return {name: problem for name, problem in problems.items() if problem}


@dataclass
class SharedLayer:
    """What the variants compared on one layer share, drawn by the first that needs it and
    dropped with the layer: its timed problem on each device (lab.LayerProblem, with its
    verified sample), and the random trials' problems with their float64 references, by
    epilogue (read-only: a variant that writes into them fails)."""

    problems: dict[bool, lab.LayerProblem] = field(default_factory=dict)
    trials: dict[str | None, list] = field(default_factory=dict)

    def problem(self, shape: ConvShape, on_gpu: bool) -> lab.LayerProblem:
        if on_gpu not in self.problems:
            self.problems[on_gpu] = lab.LayerProblem.draw(shape, on_gpu)
        return self.problems[on_gpu]


def random_trials(variant, shapes: dict[str, ConvShape], epilogues: dict[str, str | None],
                  trials: int = RANDOM_TRIALS, shared: SharedLayer | None = None,
                  ) -> tuple[bool, str]:
    """Run the variant on random problems for every layer, drawn on every run; the first
    failure's reason. With `shared` (a layer's), the trial problems and their references are
    the ones the layer's other variants ran on."""
    xp = np
    if variant.on_gpu:
        import cupy as xp
    rng = np.random.default_rng()
    for name, full in shapes.items():
        shape = full.with_batch(min(full.B, RANDOM_TRIAL_BATCH))
        epilogue = epilogues.get(name)
        drawn = None if shared is None else shared.trials.setdefault(epilogue, [])
        for i in range(trials):
            if drawn is not None and i < len(drawn):
                x, w, b, ref = drawn[i]
            else:
                x, w, b = random_problem(shape, rng, signed=bool(rng.integers(2)))
                ref = reference_output(x, w, shape, epilogue, b)
                if drawn is not None:
                    for array in (x, w, b):
                        if array is not None:
                            array.setflags(write=False)
                    drawn.append((x, w, b, ref))
            got = variant.prepare(shape, w, epilogue, b).run_once(x, xp)
            if variant.on_gpu:
                with gpu_wait():  # in an isolated child the parent times it: a hang ends here
                    xp.cuda.Device().synchronize()
            check = compare_output(host(got), ref, variant.precision)
            if not check.passed:
                return False, f"random inputs, {name} {shape.describe()}: {check.reason}"
    return True, ""


def _natural_epilogues(spec: ModelSpec) -> dict[str, str]:
    """Conv layers followed by a ReLU: where a variant cannot run, its SKIP row joins the table
    of the layer with its ReLU fused, as the variants that run it have."""
    layers = spec.inference().layers  # batch norm folded: a conv's ReLU follows it directly
    return {layer.name: RELU for layer, nxt in zip(layers, layers[1:])
            if isinstance(layer, Conv) and isinstance(nxt, ReLU)}


def variant_rows(variant, batch: int, spec: ModelSpec | None, policy: timer.TimingPolicy,
                 shapes: dict[str, ConvShape], weights: Weights | None = None,
                 verify: str = "sample", epilogues: dict[str, str | None] | None = None,
                 shared: SharedLayer | None = None) -> list[Row]:
    """The variant's rows at one batch size: random trials, then the timed and verified run
    of the model (or each layer alone, with `epilogues`' epilogue where the variant has it, on
    `shared`'s problem for its device); an error is FAIL rows with its message."""
    try:
        return _rows_for_run(variant, batch, spec, policy, shapes, weights, verify,
                             epilogues or {}, shared)
    except ConvlabError as exc:
        reason = str(exc)
    except Exception as exc:  # noqa: BLE001 - a crashing variant is a FAIL row, not a crash
        reason = f"{type(exc).__name__}: {exc}"
    return failed_rows(variant, batch, shapes, reason)


def failed_rows(variant, batch: int, shapes: dict[str, ConvShape], reason: str) -> list[Row]:
    """One FAIL row per layer, all for the same reason."""
    return [Row(variant=variant.name, precision=variant.precision, batch=batch, layer=ln,
                label=ln, shape=s, status=FAIL, reason=reason) for ln, s in shapes.items()]


def _layer_epilogues(variant, shapes: dict[str, ConvShape],
                     wanted: dict[str, str | None]) -> dict[str, str | None]:
    """Single layers' epilogues: the one asked for where the variant has it."""
    return {name: epilogue for name, epilogue in wanted.items()
            if epilogue is not None and name in shapes
            and variant.supports_epilogue(shapes[name], epilogue)}


def _rows_for_run(variant, batch, spec, policy, shapes, weights=None, verify="sample",
                  wanted=None, shared=None) -> list[Row]:
    name = variant.name
    if spec is not None:
        # A reference row that applies to some layers only (cuBLAS's GEMM: the 1x1 ones) runs
        # the network with the others on the fallback, as a variant that refuses them does.
        # Each conv is timed against cuDNN's same conv: a residual add stays a step of its own.
        network = plan_network(spec, variant, batch, get_variant(FALLBACK), fuse_adds=False)
        verdicts = {ln: network.convs[ln].support for ln in shapes}
        epilogues = {ln: d.epilogue for ln, d in network.convs.items() if d.variant is variant}
        natural = _natural_epilogues(spec)
    else:
        verdicts = {ln: variant.supports(s) for ln, s in shapes.items()}
        epilogues = _layer_epilogues(variant, shapes, wanted or {})
        natural = dict(wanted or {})
    supported = {ln: s for ln, s in shapes.items() if verdicts[ln]}
    skipped = [Row(variant=name, precision=variant.precision, batch=batch, layer=ln, label=ln,
                   shape=s, epilogue=natural.get(ln), status=SKIP, reason=verdicts[ln].reason)
               for ln, s in shapes.items() if ln not in supported]
    if not supported:
        return skipped
    if variant.name not in REFERENCE_VARIANTS:
        ok, reason = random_trials(variant, supported, epilogues, shared=shared)
        if not ok:
            return skipped + [Row(variant=name, precision=variant.precision, batch=batch,
                                  layer=layer, label=layer, shape=shape,
                                  epilogue=epilogues.get(layer), status=FAIL, reason=reason)
                              for layer, shape in supported.items()]
    rows = skipped
    if spec is None:
        layers = []
        for layer_name, shape in supported.items():
            problem = None if shared is None else shared.problem(shape, variant.on_gpu)
            result = lab.run_layer(shape, variant, policy, epilogues.get(layer_name),
                                   verify=verify, problem=problem)
            result.name = result.label = layer_name
            layers.append(result)
        accuracy, differ, run_ok = None, None, True
    else:
        partial = bool(network.fallback_layers) or set(supported) != set(network.convs)
        run = lab.run(network.check(), policy, weights=weights, verify=verify)
        layers = [layer for layer in run.layers if layer.name in supported]
        accuracy, differ = run.accuracy, run.predictions_differ
        if partial:  # the network's predictions are partly another variant's
            accuracy, differ = None, None
        run_ok = variant.precision != "fp32" or not differ
    for layer in layers:
        status, reason = PASS, ""
        if not layer.check.passed:
            status, reason = FAIL, f"after timing: {layer.check.reason}"
        elif not run_ok:
            status, reason = FAIL, f"{differ} network predictions differ from the CPU reference"
        rows.append(Row(variant=name, precision=variant.precision, batch=batch, layer=layer.name,
                        label=layer.label, shape=layer.shape, epilogue=layer.epilogue,
                        status=status, reason=reason, timing=layer.timing,
                        max_rel_error=layer.check.max_rel_error, accuracy=accuracy,
                        predictions_differ=differ, bound_ratio=layer.check.bound_ratio,
                        note=layer.note, choice=layer.choice, config=layer.config))
    return rows


def _cudnn_fused_row(name: str, batch, layer_name, shape, policy, verify="sample") -> Row:
    """cuDNN row `name` for conv + tanh + 2x2 pool, as PyTorch users write it: three calls."""
    variant = get_variant(name)
    row = Row(variant=name, precision=variant.precision, batch=batch, layer=layer_name,
              label=f"{layer_name} + tanh + pool (3 PyTorch calls)", shape=shape,
              epilogue=TANH_POOL)
    support = variant.supports(shape)
    if not support:
        return replace(row, status=SKIP, reason=support.reason)
    try:
        result = lab.run_layer(shape, name, policy, TANH_POOL, verify=verify)
    except Exception as exc:  # noqa: BLE001 - any failure of a reference row is reported, not fatal
        return replace(row, status=FAIL, reason=f"{type(exc).__name__}: {exc}")
    return replace(row, status=PASS if result.check.passed else FAIL, reason=result.check.reason,
                   timing=result.timing, max_rel_error=result.check.max_rel_error,
                   bound_ratio=result.check.bound_ratio)


def best_cudnn(rows: list[Row], row: Row) -> Row | None:
    """The fastest verified reference row of `row`'s precision class for the same layer, batch
    and epilogue (cuDNN in both layouts, cuBLAS's GEMM where it applies): what a speedup
    divides by."""
    names = CUDNN_ROWS.get(row.precision, CUDNN_ROWS["fp32"])
    rivals = [r for r in rows if r.variant in names and r.valid
              and (r.batch, r.layer, r.epilogue) == (row.batch, row.layer, row.epilogue)]
    return min(rivals, key=lambda r: r.median_ms, default=None)


def arithmetic_of(row: Row) -> Arithmetic:
    """What the row's variant issues (a kernel file's: a direct conv at its precision)."""
    variant = VARIANTS.get(row.variant)  # kernel files never take a built-in's name
    if variant is None:
        return direct_arithmetic(row.shape, row.precision)
    return variant.arithmetic(row.shape)


def finish(rows: list[Row], ceilings: peaks.Ceilings | None) -> None:
    """Floors, speedups and the best row per layer, from the timed rows (also what a saved
    record is re-derived with when loaded, so old records follow today's rules)."""
    by_key = {r.key: r for r in rows}
    for r in rows:
        if ceilings is not None:
            arithmetic = arithmetic_of(r)
            r.floor_ms, r.floor_bound = ceilings.floor_ms(
                r.shape, arithmetic.rate, r.epilogue, arithmetic.flops,
                roofline.element_bytes(r.precision))
            r.floor_basis = "copy" if r.floor_bound == "memory" else arithmetic.label
        r.speedup_naive = r.speedup_cudnn = None
        r.cudnn_basis, r.best = "", False
        if not r.valid:
            continue
        naive = by_key.get(("naive", r.batch, r.layer, r.epilogue))
        if naive is not None and naive.valid:
            r.speedup_naive = naive.median_ms / r.median_ms
        cudnn = best_cudnn(rows, r)
        if cudnn is not None:
            r.speedup_cudnn, r.cudnn_basis = cudnn.median_ms / r.median_ms, cudnn.variant
    groups: dict[tuple, list[Row]] = {}
    for r in rows:
        if r.valid:
            groups.setdefault((r.batch, r.layer, r.epilogue), []).append(r)
    for group in groups.values():
        min(group, key=lambda r: r.median_ms).best = True


@dataclass
class Plan:
    spec: ModelSpec | None  # None: single layers (--layer, --suite)
    batches: list[int]
    kernels: list[str]
    shapes_for: Callable[[int], dict[str, ConvShape]]
    weights: Weights | None = None
    kernel_files: list = field(default_factory=list)  # userkernel.KernelFiles, run isolated
    weights_path: str | None = None  # where a kernel file's child process loads `weights` from
    verify: str = "sample"  # lab.time_and_verify's mode
    timeout_s: float | None = None  # a kernel file's longest device wait (isolate's default)
    other_gpus: dict[str, str] = field(default_factory=dict)  # 'all' left these out: why
    suite: str | None = None  # a layer suite's name (bench.suites)
    classes: list[str] = field(default_factory=list)  # a suite's precision classes
    epilogues: dict[str, str | None] = field(default_factory=dict)  # a suite layer's epilogue

    @property
    def model(self) -> str | None:
        return None if self.spec is None else self.spec.name


def layer_bytes(shape: ConvShape) -> int:
    """Device memory a --layer row holds at once: the rotated inputs the timer reads in turn,
    the staged input, the output and the weights (float32), and as much again for the cuDNN
    rows' own copies."""
    floats = ((guard.ROTATION + 1) * int(np.prod(shape.input_shape))
              + int(np.prod(shape.output_shape)) + int(np.prod(shape.weight_shape)))
    return 2 * FLOAT_BYTES * floats


def check_layer_memory(shape: ConvShape) -> None:
    """A --layer batch too large for the GPU's memory is an error before anything runs (its
    inputs are random, so the test set's size does not limit it; memory does)."""
    if not gpu_available():
        return
    import cupy

    free, total = cupy.cuda.runtime.memGetInfo()
    need = layer_bytes(shape)
    if need > free:
        raise ConvlabError(f"--batch {shape.B} with --layer {shape.brief()} needs about "
                           f"{need / 2**30:.1f} GiB of device memory (inputs, outputs, the timer's "
                           f"rotated copies); the GPU has {free / 2**30:.1f} GiB free of "
                           f"{total / 2**30:.1f}")


def suite_plan(suite: str, kernels: str | None, batches: str | None, classes: str | None,
               verify: str = "sample") -> Plan:
    """A layer suite's comparison: its layers at their batches (or at `batches`), each with
    the epilogue its network fuses, timed by the suite's variants of `classes` (or the named
    `kernels`) beside the cuDNN rows of those classes."""
    layers = suites.get_suite(suite)
    wanted = suites.parse_classes(classes)
    forced = lab.parse_batches(batches, None) if batches is not None else None
    at = {layer.label: forced or list(layer.batches) for layer in layers}
    batch_list = sorted({b for bs in at.values() for b in bs})
    for layer in layers:
        check_layer_memory(layer.at(max(at[layer.label])))

    def shapes_for(batch):
        return {layer.label: layer.at(batch) for layer in layers if batch in at[layer.label]}

    if kernels is None or kernels.strip() == "all":
        names = suites.suite_kernels(wanted)
    else:
        names = [n.strip() for n in kernels.split(",") if n.strip()]
        for n in names:
            get_variant(n)
        wanted = [c for c in suites.CLASSES if c in {VARIANTS[n].precision for n in names}]
    names += [ref for c in wanted for ref in CUDNN_ROWS[c]]
    return Plan(None, batch_list, names, shapes_for, verify=verify, suite=suite.strip().lower(),
                classes=wanted, epilogues={layer.label: layer.epilogue for layer in layers})


def plan(kernels: str | None, model: str | None, layer: str | None, batches: str | None,
         bias: bool = False, weights: Weights | None = None,
         kernel_files: Sequence[str | os.PathLike] = (),
         weights_path: str | os.PathLike | None = None, verify: str = "sample",
         timeout_s: float | None = None) -> Plan:
    """Validate the command's arguments before any timing starts (kernel files are loaded
    here: a file that cannot be is an error before anything runs). Without `batches`: the
    layer's own batch (its B), a named model's default batch size, else SWEEP_BATCHES."""
    if model is not None and layer is not None:
        raise ConvlabError("give --model or --layer, not both")
    if bias and layer is None:
        raise ConvlabError("--bias goes with --layer (a model's layers have the bias they have)")
    if layer is not None:
        base = parse_layer(layer, bias)
        batch_list = lab.parse_batches(str(base.B) if batches is None else batches, None)
        check_layer_memory(base.with_batch(batch_list[-1]))
        spec = None

        def shapes_for(b):
            return {"layer": base.with_batch(b)}
    else:
        spec = get_model(model or DEFAULT_MODEL)
        if batches is None:
            batches = str(lab.default_batch(spec)) if model else SWEEP_BATCHES
        batch_list = lab.parse_batches(batches, spec)
        shapes_for = spec.conv_shapes
    files = [load_kernel_file(path) for path in kernel_files]
    seen: dict[str, object] = {}
    for loaded in files:
        other = seen.setdefault(loaded.variant.name, loaded)
        if other is not loaded and other.path.resolve() == loaded.path.resolve():
            raise ConvlabError(f"kernel file {loaded.path} is given twice")
        if other is not loaded:
            raise ConvlabError(f"kernel files {other.path} and {loaded.path} are both named "
                               f"'{loaded.variant.name}': rename one")
    names = parse_kernels(kernels, list(shapes_for(batch_list[-1]).values()), spec is not None,
                          [loaded.variant.precision for loaded in files])
    return Plan(spec, batch_list, names, shapes_for, weights, files,
                None if weights_path is None else str(weights_path), verify, timeout_s,
                for_other_gpus(kernels))


def kernel_file_rows(kernel_file, batch: int, shapes: dict[str, ConvShape], p: Plan,
                     policy: timer.TimingPolicy) -> list[Row]:
    """A kernel file's rows at one batch size, from variant_rows in a child process: a fault,
    a hang, a crash, or a file that changed meanwhile makes every row FAIL with the reason.
    Compiler messages name lines of the user's file."""
    variant = kernel_file.variant
    job = run_isolated(COMPARE_JOB, {
        "kernel_file": str(kernel_file.path), "batch": batch,
        "shapes": {name: shape.as_dict() for name, shape in shapes.items()}, "model": p.model,
        "policy": vars(policy).copy(), "weights_path": p.weights_path, "verify": p.verify,
    }, timeout_s=DEFAULT_TIMEOUT_S if p.timeout_s is None else p.timeout_s)
    if job["status"] == "ok":
        reason = kernel_file.changed(job["result"]["sha256"])
        if reason is None:
            return [replace(row, reason=kernel_file.locate(row.reason))
                    for row in map(Row.from_dict, job["result"]["rows"])]
    elif job.get("user_error"):
        reason = kernel_file.locate(job["message"])
    else:
        reason = job["reason"]
    return failed_rows(variant, batch, shapes, reason)


def applies(name: str, shape: ConvShape, p: Plan) -> bool:
    """Whether the planned variant gets a row for the layer: a reference row where it applies
    to such a layer at all (cuBLAS's GEMM: 1x1 layers), a suite's own variants where they are
    meant for it (bench.suites), anything else everywhere (a refusal is a SKIP row)."""
    if name in REFERENCE_VARIANTS:
        return VARIANTS[name].fits(shape)
    return p.suite is None or suites.meant_for(name, shape)


def _steps(p: Plan, batch: int, shapes: dict[str, ConvShape]):
    """(entry, the layers it runs, SharedLayer or None) for each variant run at one batch size.
    A model's network runs whole, a variant at a time; single layers run a layer at a time,
    every variant of a layer on what it shares (SharedLayer). Kernel files run last, in child
    processes, all layers at once."""
    if p.spec is not None:
        for entry in p.kernels:
            yield entry, {ln: s for ln, s in shapes.items() if applies(entry, s, p)}, None
    else:
        for ln, s in shapes.items():
            shared = SharedLayer()
            for entry in p.kernels:
                if applies(entry, s, p):
                    yield entry, {ln: s}, shared
    for kernel_file in p.kernel_files:
        yield kernel_file, shapes, None


def execute(p: Plan, policy: timer.TimingPolicy,
            progress: Callable[[str, int, int], None] | None = None) -> Comparison:
    """Every planned run; Ctrl-C or SIGTERM ends them early with the rows finished so far kept
    and `interrupted` saying how far they got."""
    require_cupy("convlab compare")
    ceilings = peaks.ceilings()
    file_names = [f.variant.name for f in p.kernel_files]
    result = Comparison(p.model, p.batches, p.kernels + file_names, ceilings=ceilings.as_dict(),
                        device=hardware.device_info(), policy=vars(policy).copy(),
                        kernel_files=[f.record() for f in p.kernel_files],
                        other_gpus=dict(p.other_gpus), suite=p.suite, classes=list(p.classes))
    total = sum(1 for b in p.batches for _ in _steps(p, b, p.shapes_for(b)))
    done = 0
    try:
        with sigterm_interrupts():
            for batch in p.batches:
                shapes = p.shapes_for(batch)
                fused_layers: set[str] = set()
                for entry, mine, shared in _steps(p, batch, shapes):
                    isolated = not isinstance(entry, str)
                    if progress:
                        name = entry.variant.name if isolated else entry
                        where = (" (child process)" if isolated else
                                 f": {next(iter(mine))}" if shared is not None else "")
                        progress(f"{name} @ batch {batch}{where}", done + 1, total)
                    if isolated:
                        rows = kernel_file_rows(entry, batch, shapes, p, policy)
                    else:
                        rows = variant_rows(get_variant(entry), batch, p.spec, policy, mine,
                                            p.weights, p.verify, p.epilogues,
                                            shared) if mine else []
                    fused_layers |= {r.layer for r in rows if r.epilogue == TANH_POOL}
                    result.rows += rows
                    done += 1
                for name in (k for k in p.kernels if k in REFERENCE_VARIANTS):
                    for layer_name in sorted(ln for ln in fused_layers
                                             if VARIANTS[name].fits(shapes[ln])):
                        result.rows.append(_cudnn_fused_row(name, batch, layer_name,
                                                            shapes[layer_name], policy, p.verify))
    except KeyboardInterrupt as stop:
        result.interrupted = f"stopped after {done} of {total} variant runs"
        result.stop_status = stop_status(stop)
    finish(result.rows, ceilings)
    return result


# --- a suite's summary: each class's cells against cuDNN ------------------------------------

@dataclass
class ClassSummary:
    """One precision class of a suite run: per (layer, batch) cell, the fastest of our
    verified rows of the class (or of a more accurate one standing in: suites.STANDS_IN) over
    the fastest reference row of the class (cuDNN's, or cuBLAS's GEMM where it applies)."""

    precision: str
    ratios: list[tuple[str, int, float, str]] = field(default_factory=list)  # layer, batch, x, choice
    missing: int = 0  # cells without a verified row on one side

    @property
    def cells(self) -> int:
        return len(self.ratios)

    @property
    def behind(self) -> int:
        return sum(r < 1.0 for _, _, r, _ in self.ratios)

    @property
    def geomean(self) -> float | None:
        if not self.ratios:
            return None
        return float(np.exp(np.mean([np.log(r) for _, _, r, _ in self.ratios])))

    @property
    def worst(self) -> tuple[str, int, float, str] | None:
        return min(self.ratios, key=lambda r: r[2], default=None)

    def choices(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for *_, choice in self.ratios:
            counts[choice or "-"] = counts.get(choice or "-", 0) + 1
        return counts

    def as_dict(self) -> dict:
        worst = self.worst
        return {"precision": self.precision, "cells": self.cells, "behind_cudnn": self.behind,
                "geomean_x_cudnn": self.geomean, "missing": self.missing,
                "worst": None if worst is None else {"layer": worst[0], "batch": worst[1],
                                                     "x_cudnn": worst[2]},
                "choices": self.choices()}


def class_summaries(comparison: Comparison) -> list[ClassSummary]:
    """A suite run's ClassSummary per class it compared (empty for other comparisons)."""
    if comparison.suite is None:
        return []
    cells: dict[tuple[str, int], list[Row]] = {}
    for row in comparison.rows:
        cells.setdefault((row.layer, row.batch), []).append(row)
    out = []
    for precision in comparison.classes:
        summary = ClassSummary(precision)
        cudnn_names = CUDNN_ROWS[precision]
        for (layer, batch), rows in cells.items():
            ours = [r for r in rows if r.valid and r.variant not in REFERENCE_VARIANTS
                    and r.precision in suites.STANDS_IN[precision]]
            best = min(ours, key=lambda r: r.median_ms, default=None)
            theirs = [r for r in rows if r.valid and r.variant in cudnn_names
                      and best is not None and r.epilogue == best.epilogue]
            if best is None or not theirs:
                summary.missing += 1
                continue
            basis = min(theirs, key=lambda r: r.median_ms)
            summary.ratios.append((layer, batch, basis.median_ms / best.median_ms, best.choice))
        out.append(summary)
    return out
