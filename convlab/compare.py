"""`convlab compare`: every chosen variant x batch size x conv layer, verified, then timed.

A row's speed counts only after the variant passed on fresh random inputs (several draws, like
KernelBench's correctness trials) and its last timed output on real data passed again. A FAIL
row keeps its reason and is never ranked. cuDNN rows (through PyTorch, when importable) come
from the same process and the same device arrays.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from . import lab, measure
from .errors import ConvlabError
from .kernels import REFERENCE_VARIANTS, TANH_POOL, VARIANTS, get_variant
from .models import Conv, get_model
from .network import fusable
from .shapes import ConvShape
from .verify import compare as compare_output
from .verify import random_problem, reference_output

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
RANDOM_TRIALS = 3
RANDOM_TRIAL_BATCH = 9  # images per random trial: small, and no multiple of any block size
CUDNN_FUSED = "cudnn"   # the reference for fused rows: conv, tanh and pool as 3 PyTorch calls


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
    timing: measure.Timing | None = None
    max_rel_error: float | None = None
    accuracy: float | None = None
    predictions_differ: int | None = None
    floor_ms: float | None = None
    floor_bound: str = ""
    speedup_naive: float | None = None
    speedup_cudnn: float | None = None
    best: bool = False

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
        return measure.gflops(self.shape, self.median_ms) if self.valid else None

    @property
    def gbps(self) -> float | None:
        return measure.gbps(self.shape, self.median_ms, self.epilogue) if self.valid else None

    @property
    def pct_floor(self) -> float | None:
        if not self.valid or self.floor_ms is None:
            return None
        return 100.0 * self.floor_ms / self.median_ms

    def as_dict(self) -> dict:
        return {
            "variant": self.variant, "precision": self.precision, "batch": self.batch,
            "layer": self.layer, "label": self.label, "shape": self.shape.as_dict(),
            "epilogue": self.epilogue, "status": self.status, "reason": self.reason,
            "timing": self.timing.as_dict() if self.timing else None,
            "max_rel_error": self.max_rel_error, "accuracy": self.accuracy,
            "predictions_differ": self.predictions_differ, "floor_ms": self.floor_ms,
            "floor_bound": self.floor_bound, "speedup_naive": self.speedup_naive,
            "speedup_cudnn": self.speedup_cudnn, "best": self.best,
            "gflops": self.gflops, "gbps": self.gbps, "pct_floor": self.pct_floor,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Row":
        timing = measure.Timing.from_dict(d["timing"]) if d.get("timing") else None
        return cls(d["variant"], d["precision"], d["batch"], d["layer"], d["label"],
                   ConvShape(**d["shape"]), d.get("epilogue"), d["status"], d.get("reason", ""),
                   timing, d.get("max_rel_error"), d.get("accuracy"), d.get("predictions_differ"),
                   d.get("floor_ms"), d.get("floor_bound", ""), d.get("speedup_naive"),
                   d.get("speedup_cudnn"), d.get("best", False))


@dataclass
class Comparison:
    model: str | None
    batches: list[int]
    kernels: list[str]
    rows: list[Row] = field(default_factory=list)
    ceilings: dict | None = None
    device: dict | None = None
    policy: dict | None = None


def parse_layer(spec: str) -> ConvShape:
    """'B,C,H,W,M,K' -> ConvShape, with a clear error for anything else."""
    parts = [p.strip() for p in spec.split(",")]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        values = []
    if len(values) != 6:
        raise ConvlabError(f"--layer takes six integers B,C,H,W,M,K (e.g. 10000,1,28,28,50,5); got '{spec}'")
    return ConvShape(*values)


def parse_batches(spec: str) -> list[int]:
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    if not parts:
        raise ConvlabError("--batch needs at least one batch size, e.g. 10,100,1000,10000")
    try:
        batches = [int(p) for p in parts]
    except ValueError:
        raise ConvlabError(f"--batch takes comma-separated integers; got '{spec}'") from None
    for b in batches:
        lab.check_batch(b)
    return sorted(set(batches))


def parse_kernels(spec: str | None, shapes: list[ConvShape]) -> list[str]:
    """'all' (or nothing): every variant that supports the layers, plus the cuDNN rows."""
    if spec is None or spec.strip() == "all":
        names = [n for n, v in VARIANTS.items() if v.on_gpu and n not in REFERENCE_VARIANTS
                 and all(v.supports(s) for s in shapes)]
    else:
        names = [n.strip() for n in spec.split(",") if n.strip()]
        if not names:
            raise ConvlabError("--kernels needs at least one variant name, or 'all'")
        for n in names:
            get_variant(n)
    for ref in REFERENCE_VARIANTS:
        if ref not in names:
            names.append(ref)
    return names


def random_trials(variant, shapes: dict[str, ConvShape], epilogues: dict[str, str | None],
                  trials: int = RANDOM_TRIALS) -> tuple[bool, str]:
    """Run the variant on fresh random problems for every layer; the first failure's reason."""
    import cupy

    rng = np.random.default_rng()
    for name, full in shapes.items():
        shape = full.with_batch(min(full.B, RANDOM_TRIAL_BATCH))
        for _ in range(trials):
            x, w, b = random_problem(shape, rng, signed=bool(rng.integers(2)))
            op = variant.prepare(shape, w, epilogues.get(name), b)
            y = cupy.full(op.output_shape, cupy.nan, dtype=cupy.float32)
            op(cupy.asarray(x), y)
            check = compare_output(cupy.asnumpy(op.output(y)),
                                   reference_output(x, w, shape, epilogues.get(name), b),
                                   variant.precision)
            if not check.passed:
                return False, f"random inputs, {name} {shape.describe()}: {check.reason}"
    return True, ""


def _fused_layers(model: str | None, variant) -> dict[str, str | None]:
    """Which of the model's conv layers the network hands this variant as conv+tanh+pool."""
    if model is None or not variant.fuses_in_network:
        return {}
    layers = get_model(model).layers
    return {layer.name: TANH_POOL for i, layer in enumerate(layers)
            if isinstance(layer, Conv) and fusable(layers, i)}


def _rows_for_run(name, variant, batch, model, policy, shapes) -> list[Row]:
    epilogues = _fused_layers(model, variant)
    if variant.name not in REFERENCE_VARIANTS:
        ok, reason = random_trials(variant, shapes, epilogues)
        if not ok:
            return [Row(name, variant.precision, batch, layer, layer, shape, epilogues.get(layer),
                        FAIL, reason) for layer, shape in shapes.items()]
    rows = []
    if model is None:
        (layer_name, shape), = shapes.items()
        result = lab.run_layer(shape, name, policy)
        layers, accuracy, differ, run_ok = [result], None, None, True
    else:
        run = lab.run(model, name, batch, policy)
        layers, accuracy, differ = run.layers, run.accuracy, run.predictions_differ
        run_ok = variant.precision != "fp32" or differ == 0
    for layer in layers:
        status, reason = PASS, ""
        if not layer.check.passed:
            status, reason = FAIL, f"after timing: {layer.check.reason}"
        elif not run_ok:
            status, reason = FAIL, f"{differ} network predictions differ from the CPU reference"
        rows.append(Row(name, variant.precision, batch, layer.name, layer.label, layer.shape,
                        layer.epilogue, status, reason, layer.timing, layer.check.max_rel_error,
                        accuracy, differ))
    return rows


def _cudnn_fused_row(batch, layer_name, shape, policy) -> Row:
    variant = get_variant(CUDNN_FUSED)
    label = f"{layer_name} + tanh + pool (3 PyTorch calls)"
    support = variant.supports(shape)
    if not support:
        return Row(CUDNN_FUSED, variant.precision, batch, layer_name, label, shape, TANH_POOL, SKIP,
                   support.reason)
    try:
        result = lab.run_layer(shape, CUDNN_FUSED, policy, TANH_POOL)
    except Exception as exc:  # noqa: BLE001 - any failure of a reference row is reported, not fatal
        return Row(CUDNN_FUSED, variant.precision, batch, layer_name, label, shape, TANH_POOL, FAIL,
                   f"{type(exc).__name__}: {exc}")
    status = PASS if result.check.passed else FAIL
    return Row(CUDNN_FUSED, variant.precision, batch, layer_name, label, shape, TANH_POOL, status,
               result.check.reason, result.timing, result.check.max_rel_error)


def finish(rows: list[Row], ceilings: measure.Ceilings | None) -> None:
    """Floors, speedups and the best row per layer, from the timed rows."""
    by_key = {r.key: r for r in rows}
    for r in rows:
        if ceilings is not None:
            r.floor_ms, r.floor_bound = ceilings.floor_ms(r.shape, r.precision, r.epilogue)
        if not r.valid:
            continue
        naive = by_key.get(("naive", r.batch, r.layer, r.epilogue))
        if naive is not None and naive.valid:
            r.speedup_naive = naive.median_ms / r.median_ms
        cudnn = by_key.get(("cudnn", r.batch, r.layer, r.epilogue))
        if cudnn is not None and cudnn.valid:
            r.speedup_cudnn = cudnn.median_ms / r.median_ms
    groups: dict[tuple, list[Row]] = {}
    for r in rows:
        if r.valid:
            groups.setdefault((r.batch, r.layer, r.epilogue), []).append(r)
    for group in groups.values():
        min(group, key=lambda r: r.median_ms).best = True


@dataclass
class Plan:
    model: str | None
    batches: list[int]
    kernels: list[str]
    shapes_for: Callable[[int], dict[str, ConvShape]]


def plan(kernels: str | None, model: str | None, layer: str | None, batches: str) -> Plan:
    """Validate the command's arguments before any timing starts."""
    if model is not None and layer is not None:
        raise ConvlabError("give --model or --layer, not both")
    batch_list = parse_batches(batches)
    if layer is not None:
        base = parse_layer(layer)
        model = None

        def shapes_for(b):
            return {"layer": base.with_batch(b)}
    else:
        model = model or "ece408-high"
        shapes_for = get_model(model).conv_shapes
    names = parse_kernels(kernels, list(shapes_for(batch_list[-1]).values()))
    return Plan(model, batch_list, names, shapes_for)


def execute(p: Plan, policy: measure.TimingPolicy,
            progress: Callable[[str, int, int], None] | None = None) -> Comparison:
    from .gpu import require_cupy

    require_cupy("convlab compare")
    ceilings = measure.ceilings()
    result = Comparison(p.model, p.batches, p.kernels, ceilings=ceilings.as_dict(),
                        device=measure.device_info(), policy=vars(policy).copy())
    total = len(p.batches) * len(p.kernels)
    step = 0
    for batch in p.batches:
        shapes = p.shapes_for(batch)
        fused_layers: set[str] = set()
        for name in p.kernels:
            step += 1
            if progress:
                progress(f"{name} @ batch {batch}", step, total)
            variant = get_variant(name)
            support = next((variant.supports(s) for s in shapes.values() if not variant.supports(s)), None)
            if support is not None:
                result.rows += [Row(name, variant.precision, batch, ln, ln, s, None, SKIP, support.reason)
                                for ln, s in shapes.items()]
                continue
            try:
                rows = _rows_for_run(name, variant, batch, p.model, policy, shapes)
            except ConvlabError as exc:
                rows = [Row(name, variant.precision, batch, ln, ln, s, None, FAIL, str(exc))
                        for ln, s in shapes.items()]
            except Exception as exc:  # noqa: BLE001 - a crashing variant is a FAIL row, not a crash
                rows = [Row(name, variant.precision, batch, ln, ln, s, None, FAIL,
                            f"{type(exc).__name__}: {exc}") for ln, s in shapes.items()]
            fused_layers |= {r.layer for r in rows if r.epilogue}
            result.rows += rows
        for layer_name in sorted(fused_layers):
            result.rows.append(_cudnn_fused_row(batch, layer_name, shapes[layer_name], policy))
    finish(result.rows, ceilings)
    return result
