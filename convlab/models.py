"""The course's models: layer specs, and the trained weights shipped with convlab."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

from .errors import ConvlabError, DataError
from .shapes import ConvShape

ACCURACY_BATCHES = (10, 100, 1000, 10000)
WEIGHTS_FORMAT = 1


@dataclass(frozen=True)
class Conv:
    name: str
    in_channels: int
    out_channels: int
    kernel: int
    stride: int = 1
    pad: int = 0

    def describe(self) -> str:
        return f"conv {self.in_channels}->{self.out_channels} {self.kernel}x{self.kernel}"

    def shape(self, batch: int, height: int, width: int) -> ConvShape:
        return ConvShape(batch, self.in_channels, height, width, self.out_channels, self.kernel,
                         self.stride, self.pad)


@dataclass(frozen=True)
class Tanh:
    def describe(self) -> str:
        return "tanh"


@dataclass(frozen=True)
class MaxPool:
    size: int = 2

    def describe(self) -> str:
        return f"max-pool {self.size}x{self.size}/{self.size}"


@dataclass(frozen=True)
class Flatten:
    def describe(self) -> str:
        return "flatten"


@dataclass(frozen=True)
class Dense:
    name: str
    in_features: int
    out_features: int

    def describe(self) -> str:
        return f"FC {self.in_features}->{self.out_features}"


@dataclass(frozen=True)
class Softmax:
    def describe(self) -> str:
        return "softmax"


Layer = Conv | Tanh | MaxPool | Flatten | Dense | Softmax


@dataclass(frozen=True)
class ModelSpec:
    name: str
    input_size: int
    layers: tuple
    origin: str
    course_accuracy: float

    @property
    def conv_layers(self) -> list[Conv]:
        return [layer for layer in self.layers if isinstance(layer, Conv)]

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        shapes: dict[str, tuple[int, ...]] = {}
        for layer in self.layers:
            if isinstance(layer, Conv):
                shapes[f"{layer.name}.weight"] = (
                    layer.out_channels, layer.in_channels, layer.kernel, layer.kernel)
            elif isinstance(layer, Dense):
                shapes[f"{layer.name}.weight"] = (layer.out_features, layer.in_features)
                shapes[f"{layer.name}.bias"] = (layer.out_features,)
        return shapes

    def conv_shapes(self, batch: int) -> dict[str, ConvShape]:
        """The shape each conv layer sees for a batch, following the spatial size through the net."""
        shapes = {}
        channels, size = 1, self.input_size
        for layer in self.layers:
            if isinstance(layer, Conv):
                shape = layer.shape(batch, size, size)
                shapes[layer.name] = shape
                channels, size = shape.M, shape.Ho
            elif isinstance(layer, MaxPool):
                size //= layer.size
        return shapes

    def describe(self) -> str:
        return ", ".join(layer.describe() for layer in self.layers)


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="ece408-high",
            input_size=28,
            layers=(
                Conv("conv", 1, 50, 5), Tanh(), MaxPool(2), Flatten(),
                Dense("fc1", 7200, 500), Tanh(), Dense("fc2", 500, 10), Softmax(),
            ),
            origin="ECE408 Fall 2017 high-accuracy model (course reported 0.8562 on 10k)",
            course_accuracy=0.8562,
        ),
        ModelSpec(
            name="ece408-low",
            input_size=28,
            layers=(
                Conv("conv", 1, 50, 5), Tanh(), MaxPool(2), Flatten(),
                Dense("fc1", 7200, 500), Tanh(), Dense("fc2", 500, 10), Softmax(),
            ),
            origin="ECE408 Fall 2017 low-accuracy model, deliberately under-trained "
                   "(course reported 0.629 on 10k)",
            course_accuracy=0.629,
        ),
        ModelSpec(
            name="ece408",
            input_size=48,
            layers=(
                Conv("conv1", 1, 12, 7), Tanh(), MaxPool(2), Conv("conv2", 12, 24, 7), Flatten(),
                Dense("fc1", 5400, 160), Tanh(), Dense("fc2", 160, 10), Softmax(),
            ),
            origin="ECE408 Spring 2018 model, Fashion-MNIST upsampled to 48x48 "
                   "(course reported 0.8451 on 10k)",
            course_accuracy=0.8451,
        ),
    )
}


def get_model(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise ConvlabError(f"unknown model '{name}'; choose one of: {', '.join(MODELS)}") from None


@dataclass
class Weights:
    """A model's trained parameters (float32, C-contiguous) and the metadata stored beside them."""

    spec: ModelSpec
    arrays: dict[str, np.ndarray]
    meta: dict = field(default_factory=dict)

    @property
    def expected_accuracy(self) -> dict[int, float]:
        return {int(k): float(v) for k, v in self.meta.get("expected_accuracy", {}).items()}

    @property
    def reference_predictions(self) -> np.ndarray:
        """The CPU reference's predicted class for each of the 10,000 test images."""
        return self.arrays["reference_predictions"]


def weights_path(name: str) -> Path:
    return Path(str(resources.files("convlab") / "assets" / "weights" / f"{name}.npz"))


def save_weights(path: Path, spec: ModelSpec, arrays: dict[str, np.ndarray], meta: dict) -> None:
    payload = {key: np.ascontiguousarray(value) for key, value in arrays.items()}
    payload["meta"] = np.array(json.dumps({"format": WEIGHTS_FORMAT, "model": spec.name, **meta}))
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez_compressed(tmp, **payload)
    tmp.replace(path)


def load_weights(name: str, path: Path | None = None) -> Weights:
    """Load and validate a model's weights file; any defect raises DataError naming the file."""
    spec = get_model(name)
    path = path or weights_path(name)
    if not path.exists():
        raise DataError(f"{path}: no weights file for model '{name}' (train it with `convlab train`)")
    try:
        with np.load(path, allow_pickle=False) as npz:
            contents = {key: npz[key] for key in npz.files}
    except Exception as exc:  # zipfile, zlib and NumPy format errors all mean a corrupt file
        raise DataError(f"{path}: corrupt weights file ({type(exc).__name__}: {exc})") from None
    try:
        meta = json.loads(str(contents.pop("meta")))
    except (KeyError, ValueError):
        raise DataError(f"{path}: weights file has no readable metadata") from None
    if meta.get("format") != WEIGHTS_FORMAT or meta.get("model") != name:
        raise DataError(f"{path}: metadata says format {meta.get('format')} model {meta.get('model')!r}, "
                        f"expected format {WEIGHTS_FORMAT} model {name!r}")
    expected = dict(spec.parameter_shapes())
    expected["reference_predictions"] = (10_000,)
    arrays = {}
    for key, shape in expected.items():
        if key not in contents:
            raise DataError(f"{path}: missing array '{key}'")
        array = contents[key]
        if array.shape != shape:
            raise DataError(f"{path}: array '{key}' has shape {array.shape}, expected {shape}")
        if key != "reference_predictions":
            if array.dtype != np.float32:
                raise DataError(f"{path}: array '{key}' is {array.dtype}, expected float32")
            if not np.isfinite(array).all():
                raise DataError(f"{path}: array '{key}' holds non-finite values")
        arrays[key] = np.ascontiguousarray(array)
    return Weights(spec=spec, arrays=arrays, meta=meta)
