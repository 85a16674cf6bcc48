"""The records a run produces: per-layer results, per-step times, the whole run, and a kernel
file's run that ended without a result. The lab builds them, `results` saves them and `report`
renders them; they hold numbers and names, nothing that needs a GPU."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from ..gpu import roofline, timer
from ..models import get_model
from ..oracle.verify import Check
from ..shapes import ConvShape

@dataclass
class LayerResult:
    name: str
    label: str
    shape: ConvShape
    epilogue: str | None
    timing: timer.Timing
    check: Check
    compile_s: float
    variant: str = ""
    note: str = ""  # what the op chose when prepared (Op.note)
    # Bytes of each element the layer reads (its input as staged: 2 for fp16 and bf16
    # variants, 4 for the rest and for kernel files, which take float32 tensors). GB/s counts
    # every element at that size, as compare's rows do by class: an approximation where a
    # 16-bit layer writes float32 (bf16 variants, an fp16 layer before a float32 one).
    element_bytes: int = 4
    # Where the variant's tiling came from (tuning.Choice: own, shipped, cached, autotuned;
    # "" for a variant without one), and the tiling itself (its dict; None without one).
    choice: str = ""
    config: dict | None = None

    @property
    def gflops(self) -> float:
        return roofline.gflops(self.shape, self.timing.median_ms)

    @property
    def gbps(self) -> float:
        return roofline.gbps(self.shape, self.timing.median_ms, self.epilogue,
                             self.element_bytes)

    def as_dict(self) -> dict:
        return {"name": self.name, "label": self.label, "shape": self.shape.as_dict(),
                "epilogue": self.epilogue, "timing": self.timing.as_dict(),
                "gflops": self.gflops, "gbps": self.gbps, "check": self.check.as_dict(),
                "compile_s": self.compile_s, "variant": self.variant, "note": self.note,
                "element_bytes": self.element_bytes, "choice": self.choice,
                "config": self.config}

    @classmethod
    def from_dict(cls, d: dict) -> "LayerResult":
        return cls(name=d["name"], label=d["label"], shape=ConvShape(**d["shape"]),
                   epilogue=d["epilogue"], timing=timer.Timing.from_dict(d["timing"]),
                   check=Check(**d["check"]), compile_s=d["compile_s"],
                   variant=d.get("variant", ""), note=d.get("note", ""),
                   element_bytes=d.get("element_bytes", 4), choice=d.get("choice", ""),
                   config=d.get("config"))


@dataclass
class StepTime:
    """One step of the forward pass, timed inside whole passes (CUDA events between steps)."""

    label: str
    category: str
    kernel: str
    median_ms: float
    check: Check | None = None

    def as_dict(self) -> dict:
        return {"label": self.label, "category": self.category, "kernel": self.kernel,
                "median_ms": self.median_ms,
                "check": self.check.as_dict() if self.check is not None else None}

    @classmethod
    def from_dict(cls, d: dict) -> "StepTime":
        return cls(label=d["label"], category=d["category"], kernel=d["kernel"],
                   median_ms=d["median_ms"],
                   check=Check(**d["check"]) if d.get("check") is not None else None)


@dataclass
class RunResult:
    model: str
    kernel: str
    precision: str
    batch: int
    layers: list[LayerResult]
    accuracy: float | None  # Fashion-MNIST models: against the labels
    expected_accuracy: float | None  # the CPU reference's accuracy on the same images
    predictions_differ: int  # against the CPU reference (Fashion-MNIST) or float64 top-1 (ImageNet)
    compile_s: float
    end_to_end_s: float  # host images in, host predictions out (pinned, graph when possible)
    wall_s: float
    device: dict | None = None
    notes: list[str] = field(default_factory=list)
    steps: list[StepTime] = field(default_factory=list)
    forward_ms: float | None = None  # device-resident forward pass, all steps
    graph: bool = False  # forward_ms and end_to_end_s come from CUDA graph replays
    eager_forward_ms: float | None = None
    htod_ms: float | None = None
    dtoh_ms: float | None = None
    max_prob_error: float | None = None  # ImageNet: max |p - p_float64| over the batch
    # ImageNet: the images whose top-1 is not float64's, each with its float64 top-2 margin
    # (lab.top1_flips), and how many images' margins are below 2 * max_prob_error
    top1_flips: list[dict] = field(default_factory=list)
    near_ties: int | None = None
    torch_ms: float | None = None  # PyTorch's fastest candidate (torch_rows) for the same pass
    torch_note: str = ""  # which candidate that was, or why PyTorch was not measured
    torch_rows: list[dict] = field(default_factory=list)  # torch_forward.TorchRow.as_dict()s
    fallback_layers: list[str] = field(default_factory=list)
    kernel_file: dict | None = None  # a kernel file's record (userkernel.KernelFile.record())
    step_passes: int = 0  # whole forward passes the per-step times are the median of
    # Device bytes the network holds from CuPy's pool once built and run (weights, input,
    # every shared buffer and workspace). Not counted: what a pass allocates and frees again
    # (a layout conversion between variants, the arrays cuDNN's rows return through PyTorch).
    peak_bytes: int | None = None

    @property
    def task(self) -> str:
        return get_model(self.model).task

    @property
    def passed(self) -> bool:
        layers_ok = all(layer.check.passed for layer in self.layers)
        steps_ok = all(s.check is None or s.check.passed for s in self.steps)
        if self.precision == "fp32":
            return layers_ok and steps_ok and self.predictions_differ == 0
        return layers_ok and steps_ok

    def time_in(self, category: str) -> float:
        return sum(s.median_ms for s in self.steps if s.category == category)

    def as_dict(self) -> dict:
        return {"model": self.model, "kernel": self.kernel, "precision": self.precision,
                "batch": self.batch, "passed": self.passed,
                "layers": [layer.as_dict() for layer in self.layers],
                "steps": [s.as_dict() for s in self.steps],
                "accuracy": self.accuracy, "expected_accuracy": self.expected_accuracy,
                "predictions_differ": self.predictions_differ,
                "max_prob_error": self.max_prob_error, "top1_flips": self.top1_flips,
                "near_ties": self.near_ties, "compile_s": self.compile_s,
                "forward_ms": self.forward_ms, "graph": self.graph,
                "eager_forward_ms": self.eager_forward_ms, "htod_ms": self.htod_ms,
                "dtoh_ms": self.dtoh_ms, "end_to_end_s": self.end_to_end_s,
                "torch_ms": self.torch_ms, "torch_note": self.torch_note,
                "torch_rows": self.torch_rows,
                "fallback_layers": self.fallback_layers, "wall_s": self.wall_s,
                "device": self.device, "notes": self.notes, "kernel_file": self.kernel_file,
                "step_passes": self.step_passes, "peak_bytes": self.peak_bytes}

    @classmethod
    def from_dict(cls, d: dict) -> "RunResult":
        """The result as_dict() gave (a run in a child process sends it that way)."""
        lists = {"layers": LayerResult, "steps": StepTime}
        plain = {f.name for f in fields(cls)} - set(lists)
        return cls(**{k: v for k, v in d.items() if k in plain},
                   **{k: [kind.from_dict(item) for item in d[k]] for k, kind in lists.items()})


@dataclass
class FailedRun:
    """A kernel file's run that ended without a result: its child process faulted (the CUDA
    error), hung in a device wait, died, or read a file that changed meanwhile."""

    model: str
    kernel: str
    precision: str
    batch: int
    status: str  # isolate's "error", "hang", "timeout" or "crash"; "changed"
    reason: str
    kernel_file: dict
    wall_s: float
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return False

    def as_dict(self) -> dict:
        return {"model": self.model, "kernel": self.kernel, "precision": self.precision,
                "batch": self.batch, "passed": False, "status": self.status,
                "reason": self.reason, "wall_s": self.wall_s, "notes": self.notes,
                "kernel_file": self.kernel_file}

    @classmethod
    def from_dict(cls, d: dict) -> "FailedRun":
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})
