"""The course's models: layer specs, and the trained weights shipped with convlab."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
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
    groups: int = 1
    bias: bool = False

    def describe(self) -> str:
        extra = "".join(f" {word} {value}" for word, value, default in (
            ("stride", self.stride, 1), ("pad", self.pad, 0), ("groups", self.groups, 1))
            if value != default)
        return (f"conv {self.in_channels}->{self.out_channels} {self.kernel}x{self.kernel}{extra}"
                f"{' +bias' if self.bias else ''}")

    def shape(self, batch: int, height: int, width: int) -> ConvShape:
        return ConvShape(batch, self.in_channels, height, width, self.out_channels, self.kernel,
                         self.stride, self.pad, self.groups, self.bias)


@dataclass(frozen=True)
class Tanh:
    def describe(self) -> str:
        return "tanh"


@dataclass(frozen=True)
class ReLU:
    def describe(self) -> str:
        return "ReLU"


@dataclass(frozen=True)
class MaxPool:
    """size x size windows every `stride` pixels (default: size, non-overlapping); floor mode."""

    size: int = 2
    stride: int | None = None

    @property
    def step(self) -> int:
        return self.stride or self.size

    def out_size(self, n: int) -> int:
        return (n - self.size) // self.step + 1

    def describe(self) -> str:
        return f"max-pool {self.size}x{self.size}/{self.step}"


@dataclass(frozen=True)
class LRN:
    """Local response normalisation across channels, as Caffe defines it."""

    size: int = 5
    alpha: float = 1e-4
    beta: float = 0.75
    k: float = 1.0

    def describe(self) -> str:
        return f"LRN {self.size} (alpha {self.alpha:g}, beta {self.beta:g}, k {self.k:g})"


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


Layer = Conv | Tanh | ReLU | MaxPool | LRN | Flatten | Dense | Softmax

FASHION_MNIST = "fashion-mnist"
IMAGENET = "imagenet"


@dataclass(frozen=True)
class ModelSpec:
    name: str
    input_size: int
    layers: tuple
    origin: str
    course_accuracy: float | None = None
    input_channels: int = 1
    task: str = FASHION_MNIST  # fashion-mnist: trained weights shipped; imagenet: see weights.py

    @property
    def conv_layers(self) -> list[Conv]:
        return [layer for layer in self.layers if isinstance(layer, Conv)]

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return (self.input_channels, self.input_size, self.input_size)

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        shapes: dict[str, tuple[int, ...]] = {}
        for layer in self.layers:
            if isinstance(layer, Conv):
                shapes[f"{layer.name}.weight"] = (
                    layer.out_channels, layer.in_channels // layer.groups, layer.kernel,
                    layer.kernel)
                if layer.bias:
                    shapes[f"{layer.name}.bias"] = (layer.out_channels,)
            elif isinstance(layer, Dense):
                shapes[f"{layer.name}.weight"] = (layer.out_features, layer.in_features)
                shapes[f"{layer.name}.bias"] = (layer.out_features,)
        return shapes

    def trace(self, batch: int) -> list[tuple[object, tuple[int, ...], tuple[int, ...]]]:
        """(layer, input shape, output shape) for every layer at this batch size."""
        steps = []
        shape: tuple[int, ...] = (batch, *self.input_shape)
        for layer in self.layers:
            if isinstance(layer, Conv):
                out = layer.shape(batch, shape[2], shape[3]).output_shape
            elif isinstance(layer, MaxPool):
                out = (*shape[:2], layer.out_size(shape[2]), layer.out_size(shape[3]))
            elif isinstance(layer, Flatten):
                out = (batch, int(np.prod(shape[1:])))
            elif isinstance(layer, Dense):
                out = (batch, layer.out_features)
            else:
                out = shape
            steps.append((layer, shape, out))
            shape = out
        return steps

    def conv_shapes(self, batch: int) -> dict[str, ConvShape]:
        """The shape each conv layer sees for a batch, following the activations through the net."""
        return {layer.name: layer.shape(batch, before[2], before[3])
                for layer, before, _ in self.trace(batch) if isinstance(layer, Conv)}

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
        ModelSpec(
            name="alexnet",
            input_size=227,
            input_channels=3,
            task=IMAGENET,
            layers=(
                Conv("conv1", 3, 96, 11, stride=4, bias=True), ReLU(), LRN(), MaxPool(3, 2),
                Conv("conv2", 96, 256, 5, pad=2, groups=2, bias=True), ReLU(), LRN(),
                MaxPool(3, 2),
                Conv("conv3", 256, 384, 3, pad=1, bias=True), ReLU(),
                Conv("conv4", 384, 384, 3, pad=1, groups=2, bias=True), ReLU(),
                Conv("conv5", 384, 256, 3, pad=1, groups=2, bias=True), ReLU(), MaxPool(3, 2),
                Flatten(), Dense("fc6", 9216, 4096), ReLU(), Dense("fc7", 4096, 4096), ReLU(),
                Dense("fc8", 4096, 1000), Softmax(),
            ),
            origin="Caffe bvlc_alexnet (Krizhevsky et al. 2012, as released by BVLC); the "
                   "Purdue CUDA assignment's network",
        ),
    )
}


# What every command runs without --model: the Spring 2018 course model, the one the README's
# first command runs.
DEFAULT_MODEL = "ece408"


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


RANDOM_SEED = 2012  # AlexNet's year: the default ImageNet weights are N(0, 2/fan_in) from it
# He scaling keeps activations at the input's scale through the ReLU layers; with inputs of
# pixel scale (+-128) the logits would be ~130 apart and the softmax one-hot. The classifier's
# weights are scaled down so logits spread over a few units, as a trained network's do, and
# the probabilities (and near-ties between classes) mean something.
CLASSIFIER_SCALE = 1 / 32


@lru_cache(maxsize=2)
def random_weights(name: str, seed: int = RANDOM_SEED) -> "Weights":
    """Deterministic He-scaled random weights for a model without shipped ones: every weight
    N(0, 2 / fan_in) (the last layer's times CLASSIFIER_SCALE), every bias N(0, 0.05^2). The same
    seed gives the same arrays everywhere (NumPy's PCG64 stream is fixed), so records made with
    them can be compared across runs."""
    spec = get_model(name)
    rng = np.random.default_rng(seed)
    last = [layer.name for layer in spec.layers if isinstance(layer, Dense)][-1]
    arrays = {}
    for key, shape in spec.parameter_shapes().items():
        if key.endswith(".bias"):
            arrays[key] = (0.05 * rng.standard_normal(shape, dtype=np.float32))
        else:
            fan_in = int(np.prod(shape[1:]))
            scale = np.sqrt(2.0 / fan_in) * (CLASSIFIER_SCALE if key == f"{last}.weight" else 1)
            arrays[key] = rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)
    meta = {"format": WEIGHTS_FORMAT, "model": name, "layers": spec.describe(),
            "source": f"random: He-scaled normal weights, seed {seed}, classifier x{CLASSIFIER_SCALE}"}
    return Weights(spec=spec, arrays=arrays, meta=meta)


def _not_an_npz(path: Path) -> str:
    """What the file is, in words, when it is not a .npz archive ("" when it is one)."""
    try:
        with open(path, "rb") as f:
            head = f.read(512)
    except OSError as exc:
        return f"unreadable ({exc.strerror})"
    if head.startswith(b"PK\x03\x04") or head.startswith(b"PK\x05\x06"):
        return ""
    if head.startswith(b"\x93NUMPY"):
        try:
            array = np.load(path, mmap_mode="r", allow_pickle=False)
            return f"a single NumPy array ({array.dtype}, shape {array.shape})"
        except ValueError:
            return "a pickled NumPy file"
    if not head:
        return "empty"
    if head.startswith(b"\x80"):
        return "a Python pickle"
    try:
        head.decode("utf-8")
        return "a text file"
    except UnicodeDecodeError:
        return "neither a .npz archive nor a NumPy array"


def load_weights(name: str, path: Path | None = None) -> Weights:
    """A model's weights: the shipped file (or `path`), validated; for models that ship none
    (alexnet) without `path`, the deterministic random weights."""
    spec = get_model(name)
    if path is None and spec.task == IMAGENET:
        return random_weights(name)
    if path is not None and not Path(path).exists():
        hint = (" (`convlab import-weights` writes one from the published weights)"
                if spec.task == IMAGENET else "")
        raise DataError(f"{path}: no such file{hint}")
    path = Path(path) if path is not None else weights_path(name)
    if not path.exists():
        hint = ("import them with `convlab import-weights`" if spec.task == IMAGENET
                else "train it with `convlab train`")
        raise DataError(f"{path}: no weights file for model '{name}' ({hint})")
    maker = "`convlab import-weights`" if spec.task == IMAGENET else "`convlab train`"
    expected_words = f"expected a .npz of model '{name}' written by {maker}"
    found = _not_an_npz(path)
    if found:
        raise DataError(f"{path}: not a weights file: it is {found}; {expected_words}")
    try:
        with np.load(path, allow_pickle=False) as npz:
            contents = {key: npz[key] for key in npz.files}
    except Exception as exc:  # zipfile, zlib and NumPy format errors all mean a corrupt file
        raise DataError(f"{path}: corrupt .npz archive ({type(exc).__name__}: {exc}); "
                        f"{expected_words}") from None
    try:
        meta = json.loads(str(contents.pop("meta")))
    except (KeyError, ValueError):
        raise DataError(f"{path}: weights file has no readable metadata") from None
    if not isinstance(meta, dict) or meta.get("format") != WEIGHTS_FORMAT or meta.get("model") != name:
        got = meta if not isinstance(meta, dict) else f"format {meta.get('format')} model {meta.get('model')!r}"
        raise DataError(f"{path}: metadata says {got}, expected format {WEIGHTS_FORMAT} model {name!r}")
    expected = dict(spec.parameter_shapes())
    if spec.task == FASHION_MNIST:
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
