"""The models: layer specs, and the weights (trained and shipped for the course's models,
seeded random or imported for the ImageNet ones)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from importlib import resources
from pathlib import Path

import numpy as np

from .errors import ConvlabError, DataError
from .shapes import ConvShape

ACCURACY_BATCHES = (10, 100, 1000, 10000)
WEIGHTS_FORMAT = 1
BATCH_NORM_PARTS = ("weight", "bias", "running_mean", "running_var")


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
    """size x size windows every `stride` pixels (default: size, non-overlapping); floor mode;
    `pad` rows and columns of -infinity on every side (ResNet's stem pools 3x3/2 with pad 1)."""

    size: int = 2
    stride: int | None = None
    pad: int = 0

    @property
    def step(self) -> int:
        return self.stride or self.size

    def out_size(self, n: int) -> int:
        return (n + 2 * self.pad - self.size) // self.step + 1

    def describe(self) -> str:
        return f"max-pool {self.size}x{self.size}/{self.step}{f' pad {self.pad}' if self.pad else ''}"


@dataclass(frozen=True)
class BatchNorm:
    """Inference batch norm over channels: (x - running_mean) / sqrt(running_var + eps) * weight
    + bias, PyTorch's parameter names. Folded into the conv before it for the GPU network
    (ModelSpec.inference); the float64 reference applies it as written."""

    name: str
    channels: int
    eps: float = 1e-5

    def describe(self) -> str:
        return "batch-norm"


@dataclass(frozen=True)
class GlobalAvgPool:
    """The mean of every channel over its whole plane: (B, C, H, W) -> (B, C)."""

    def describe(self) -> str:
        return "global avg-pool"


# A residual block as a flat run of layers over one stack of kept activations: Keep pushes the
# activation (the block's input) and passes it on; Swap exchanges the activation with the kept
# one (a projection shortcut is computed first, then the body runs on the block's input);
# AddKept pops the kept one and adds it. Shortcut first, body last, so the body's last conv is
# the layer just before the add.
@dataclass(frozen=True)
class Keep:
    def describe(self) -> str:
        return "keep"


@dataclass(frozen=True)
class Swap:
    def describe(self) -> str:
        return "swap with kept"


@dataclass(frozen=True)
class AddKept:
    def describe(self) -> str:
        return "add kept"


def _described(layers) -> list[str]:
    """Each layer's words, a Keep ... AddKept span (and the ReLU after it) as one block."""
    items, i = [], 0
    while i < len(layers):
        if not isinstance(layers[i], Keep):
            items.append(layers[i].describe())
            i += 1
            continue
        depth, j = 0, i
        while True:
            depth += isinstance(layers[j], Keep) - isinstance(layers[j], AddKept)
            if depth == 0:
                break
            j += 1
        inner = layers[i + 1:j]
        swap = next((k for k, layer in enumerate(inner) if isinstance(layer, Swap)), None)
        body = inner if swap is None else inner[swap + 1:]
        text = "residual block (" + ", ".join(_described(body))
        if swap is not None:
            text += "; shortcut " + ", ".join(_described(inner[:swap]))
        text += ")"
        i = j + 1
        if i < len(layers) and isinstance(layers[i], (ReLU, Tanh)):
            text += f" + {layers[i].describe()}"
            i += 1
        items.append(text)
    return items


def run_layers(layers, a, apply):
    """a through the layers: the residual stack's Keep, Swap and AddKept done here, every other
    layer by apply(layer, a) (NumPy, float64 or float32, or another array library's)."""
    kept = []
    for layer in layers:
        if isinstance(layer, Keep):
            kept.append(a)
        elif isinstance(layer, Swap):
            a, kept[-1] = kept[-1], a
        elif isinstance(layer, AddKept):
            a = a + kept.pop()
        else:
            a = apply(layer, a)
    return a


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


Layer = (Conv | Tanh | ReLU | MaxPool | LRN | Flatten | Dense | Softmax | BatchNorm
         | GlobalAvgPool | Keep | Swap | AddKept)
STACK_LAYERS = (Keep, Swap, AddKept)

FASHION_MNIST = "fashion-mnist"
IMAGENET = "imagenet"
# How an ImageNet model's input is made from an image: Caffe's (BGR, the mean pixel subtracted,
# 0-255) or torchvision's (RGB scaled to [0, 1], then each channel's mean and std).
CAFFE = "caffe"
TORCHVISION = "torchvision"


@dataclass(frozen=True)
class ModelSpec:
    name: str
    input_size: int
    layers: tuple
    origin: str
    course_accuracy: float | None = None
    input_channels: int = 1
    task: str = FASHION_MNIST  # fashion-mnist: trained weights shipped; imagenet: see weights.py
    preprocessing: str = CAFFE  # an ImageNet model's: CAFFE or TORCHVISION

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
            elif isinstance(layer, BatchNorm):
                for part in BATCH_NORM_PARTS:
                    shapes[f"{layer.name}.{part}"] = (layer.channels,)
        return shapes

    def trace(self, batch: int) -> list[tuple[object, tuple[int, ...], tuple[int, ...]]]:
        """(layer, input shape, output shape) for every layer at this batch size (Swap's output
        is the kept activation's shape)."""
        steps = []
        shape: tuple[int, ...] = (batch, *self.input_shape)
        kept: list[tuple[int, ...]] = []
        for layer in self.layers:
            if isinstance(layer, Conv):
                out = layer.shape(batch, shape[2], shape[3]).output_shape
            elif isinstance(layer, MaxPool):
                out = (*shape[:2], layer.out_size(shape[2]), layer.out_size(shape[3]))
            elif isinstance(layer, Flatten):
                out = (batch, int(np.prod(shape[1:])))
            elif isinstance(layer, Dense):
                out = (batch, layer.out_features)
            elif isinstance(layer, GlobalAvgPool):
                out = shape[:2]
            elif isinstance(layer, Keep):
                kept.append(shape)
                out = shape
            elif isinstance(layer, Swap):
                out, kept[-1] = kept[-1], shape
            elif isinstance(layer, AddKept):
                other = kept.pop()
                if other != shape:
                    raise ValueError(f"model '{self.name}' adds a kept {other} to {shape}")
                out = shape
            else:
                out = shape
            steps.append((layer, shape, out))
            shape = out
        return steps

    def conv_shapes(self, batch: int) -> dict[str, ConvShape]:
        """The shape each conv layer sees for a batch as the network runs it (batch norm folded
        into the conv before it: a bias), following the activations through the net."""
        return {layer.name: layer.shape(batch, before[2], before[3])
                for layer, before, _ in self.inference().trace(batch) if isinstance(layer, Conv)}

    def inference(self) -> "ModelSpec":
        """The model as the GPU network runs it: every BatchNorm folded into the conv just
        before it, which gains a bias (fold_batch_norm folds the weights to match)."""
        if not any(isinstance(layer, BatchNorm) for layer in self.layers):
            return self
        layers = []
        for layer in self.layers:
            if isinstance(layer, BatchNorm):
                conv = layers[-1] if layers else None
                if not isinstance(conv, Conv) or conv.out_channels != layer.channels:
                    raise ValueError(f"model '{self.name}': batch norm {layer.name} does not "
                                     "follow a conv of its channels, and only such a one folds")
                layers[-1] = replace(conv, bias=True)
            else:
                layers.append(layer)
        return replace(self, layers=tuple(layers))

    def describe(self) -> str:
        """The layers in words, a residual block as one item (its body, and its shortcut where
        it has one) and a run of equal items as "Nx item"."""
        items = _described(self.layers)
        runs: list[list] = []
        for item in items:
            if runs and runs[-1][0] == item:
                runs[-1][1] += 1
            else:
                runs.append([item, 1])
        return ", ".join(item if n == 1 else f"{n}x {item}" for item, n in runs)


def _conv_bn(name: str, bn: str, in_channels: int, out_channels: int, kernel: int,
             stride: int = 1) -> tuple:
    return (Conv(name, in_channels, out_channels, kernel, stride, kernel // 2),
            BatchNorm(bn, out_channels))


def _bottleneck(prefix: str, in_channels: int, width: int, stride: int) -> tuple:
    """torchvision's Bottleneck (ResNet v1.5: the stride on the 3x3 conv), its parameters under
    torchvision's names; a projection shortcut (1x1 conv + batch norm) where the shape changes."""
    out_channels = 4 * width
    body = (*_conv_bn(f"{prefix}.conv1", f"{prefix}.bn1", in_channels, width, 1), ReLU(),
            *_conv_bn(f"{prefix}.conv2", f"{prefix}.bn2", width, width, 3, stride), ReLU(),
            *_conv_bn(f"{prefix}.conv3", f"{prefix}.bn3", width, out_channels, 1))
    if stride == 1 and in_channels == out_channels:
        return (Keep(), *body, AddKept(), ReLU())
    shortcut = _conv_bn(f"{prefix}.downsample.0", f"{prefix}.downsample.1", in_channels,
                        out_channels, 1, stride)
    return (Keep(), *shortcut, Swap(), *body, AddKept(), ReLU())


def resnet50_layers() -> tuple:
    layers = [*_conv_bn("conv1", "bn1", 3, 64, 7, 2), ReLU(), MaxPool(3, 2, pad=1)]
    channels = 64
    for stage, (width, blocks, stride) in enumerate(((64, 3, 1), (128, 4, 2), (256, 6, 2),
                                                     (512, 3, 2)), start=1):
        for block in range(blocks):
            layers += _bottleneck(f"layer{stage}.{block}", channels, width,
                                  stride if block == 0 else 1)
            channels = 4 * width
    return (*layers, GlobalAvgPool(), Dense("fc", 2048, 1000), Softmax())


def vgg16_layers() -> tuple:
    """torchvision's vgg16 (configuration D, no batch norm), its parameters under torchvision's
    names: `features.N` is the conv at index N of its `features` Sequential."""
    layers, index, channels = [], 0, 3
    for width, convs in ((64, 2), (128, 2), (256, 3), (512, 3), (512, 3)):
        for _ in range(convs):
            layers += [Conv(f"features.{index}", channels, width, 3, pad=1, bias=True), ReLU()]
            channels, index = width, index + 2
        layers.append(MaxPool(2))
        index += 1
    return (*layers, Flatten(), Dense("classifier.0", 25088, 4096), ReLU(),
            Dense("classifier.3", 4096, 4096), ReLU(), Dense("classifier.6", 4096, 1000),
            Softmax())


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
        ModelSpec(
            name="resnet50",
            input_size=224,
            input_channels=3,
            task=IMAGENET,
            layers=resnet50_layers(),
            preprocessing=TORCHVISION,
            origin="ResNet-50 (He et al. 2015) as torchvision builds it (v1.5: stride on the "
                   "3x3 conv), its parameter names; batch norm folded into the convs",
        ),
        ModelSpec(
            name="vgg16",
            input_size=224,
            input_channels=3,
            task=IMAGENET,
            layers=vgg16_layers(),
            preprocessing=TORCHVISION,
            origin="VGG-16 (Simonyan and Zisserman 2014, configuration D) as torchvision "
                   "builds it, its parameter names",
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

    @cached_property
    def folded(self) -> "Weights":
        """The weights of spec.inference(): each batch norm folded into the conv before it,
        w * gamma / sqrt(var + eps) and (b - mean) * gamma / sqrt(var + eps) + beta, computed in
        float64 and stored as float32 (the same object where there is no batch norm)."""
        inference = self.spec.inference()
        if inference is self.spec:
            return self
        arrays = {k: v for k, v in self.arrays.items()}
        for i, layer in enumerate(self.spec.layers):
            if not isinstance(layer, BatchNorm):
                continue
            conv = self.spec.layers[i - 1]
            parts = {part: self.arrays[f"{layer.name}.{part}"].astype(np.float64)
                     for part in BATCH_NORM_PARTS}
            scale = parts["weight"] / np.sqrt(parts["running_var"] + layer.eps)
            w = self.arrays[f"{conv.name}.weight"].astype(np.float64)
            b = (self.arrays[f"{conv.name}.bias"].astype(np.float64) if conv.bias
                 else np.zeros(conv.out_channels))
            arrays[f"{conv.name}.weight"] = (w * scale[:, None, None, None]).astype(np.float32)
            arrays[f"{conv.name}.bias"] = ((b - parts["running_mean"]) * scale
                                           + parts["bias"]).astype(np.float32)
            for part in BATCH_NORM_PARTS:
                del arrays[f"{layer.name}.{part}"]
        return Weights(inference, arrays, self.meta)


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
# pixel scale (+-128) the logits of a model without batch norm would be ~130 apart and the
# softmax one-hot. Its classifier's weights are scaled down so logits spread over a few units,
# as a trained network's do, and the probabilities (and near-ties between classes) mean
# something.
CLASSIFIER_SCALE = 1 / 32


# Batch norm's drawn parameters: weight (gamma) U(0.5, 1), bias (beta) N(0, 0.1^2), except
# the gamma of the batch norm just before a residual add, U(0.2, 0.4): each block then adds a
# little to its shortcut rather than doubling it, so over ResNet-50's 16 blocks the activations
# grow a few-fold, not 2^16-fold (fp16 overflows past 65504).
BLOCK_END_GAMMA = (0.2, 0.4)
# The logits' spread the classifier of a batch-norm model is scaled to (its activations are
# normalised, not at pixel scale), so the probabilities and near-ties mean something.
LOGIT_STD = 4.0


CALIBRATION_IMAGES = 2  # at full size: ResNet-50's statistics from 2 x 112 x 112 positions


def _conv_probe(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, layer: Conv) -> np.ndarray:
    """The conv layer on a few images in float32, for drawing statistics only (the oracle's
    conv2d is the one outputs are checked against)."""
    pad, k, s = layer.pad, layer.kernel, layer.stride
    x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    windows = np.lib.stride_tricks.sliding_window_view(x, (k, k), axis=(2, 3))[:, :, ::s, ::s]
    per_group, step = w.shape[1], w.shape[0] // layer.groups
    out = np.concatenate([
        np.einsum("bchwpq,mcpq->bmhw", windows[:, g * per_group:(g + 1) * per_group],
                  w[g * step:(g + 1) * step], optimize=True) for g in range(layer.groups)],
        axis=1)
    return out if b is None else out + b.reshape(1, -1, 1, 1)


def _draw_batch_norms(spec: ModelSpec, arrays: dict, rng, last: str) -> float:
    """Fill in every batch norm's parameters of `arrays` in layer order: its running mean and
    variance are the statistics of its input on CALIBRATION_IMAGES images of uniform pixels in
    [-128, 128) (the lab's input, other draws), jittered; weight (gamma) U(0.5, 1) or, just
    before a residual add, BLOCK_END_GAMMA; bias (beta) N(0, 0.1^2). Returns the scale that
    gives the classifier `last` logits of LOGIT_STD on those images."""
    a = rng.random((CALIBRATION_IMAGES, *spec.input_shape), dtype=np.float32) * 256 - 128
    block_ends = {layer.name for layer, nxt in zip(spec.layers, spec.layers[1:])
                  if isinstance(layer, BatchNorm) and isinstance(nxt, AddKept)}

    def apply(layer, a):
        if isinstance(layer, Conv):
            return _conv_probe(a, arrays[f"{layer.name}.weight"],
                               arrays.get(f"{layer.name}.bias"), layer)
        if isinstance(layer, BatchNorm):
            c = layer.channels
            low, high = BLOCK_END_GAMMA if layer.name in block_ends else (0.5, 1.0)
            mean, var = a.mean(axis=(0, 2, 3)), a.var(axis=(0, 2, 3))
            drawn = {"weight": rng.uniform(low, high, c), "bias": 0.1 * rng.standard_normal(c),
                     "running_mean": mean + 0.1 * np.sqrt(var) * rng.standard_normal(c),
                     "running_var": var * rng.uniform(0.8, 1.25, c)}
            for part, values in drawn.items():
                arrays[f"{layer.name}.{part}"] = values.astype(np.float32)
            gain = drawn["weight"] / np.sqrt(drawn["running_var"] + layer.eps)
            return ((a - drawn["running_mean"].reshape(1, -1, 1, 1)) * gain.reshape(1, -1, 1, 1)
                    + drawn["bias"].reshape(1, -1, 1, 1)).astype(np.float32)
        if isinstance(layer, ReLU):
            return np.maximum(a, 0)
        if isinstance(layer, MaxPool):
            p = layer.pad
            a = np.pad(a, ((0, 0), (0, 0), (p, p), (p, p)), constant_values=-np.inf)
            return np.lib.stride_tricks.sliding_window_view(
                a, (layer.size, layer.size), axis=(2, 3))[:, :, ::layer.step, ::layer.step].max(
                axis=(4, 5))
        if isinstance(layer, GlobalAvgPool):
            return a.mean(axis=(2, 3))
        if isinstance(layer, Flatten):
            return a.reshape(len(a), -1)
        if isinstance(layer, Dense):
            return a @ arrays[f"{layer.name}.weight"].T + arrays[f"{layer.name}.bias"]
        raise TypeError(f"no statistics drawn through layer {layer!r}")

    classifier = next(i for i, layer in enumerate(spec.layers)
                      if isinstance(layer, Dense) and layer.name == last)
    logits = run_layers(spec.layers[:classifier + 1], a, apply)
    return LOGIT_STD / float(logits.std(axis=1).mean())


@lru_cache(maxsize=4)
def random_weights(name: str, seed: int = RANDOM_SEED) -> "Weights":
    """Deterministic He-scaled random weights for a model without shipped ones: every weight
    N(0, 2 / fan_in), every bias N(0, 0.05^2). A batch norm's statistics are those of its
    input on a few images like the lab's (_draw_batch_norms), jittered, so it normalises as a
    trained one does. The classifier is
    scaled so logits spread over a few units: x CLASSIFIER_SCALE at pixel scale, to LOGIT_STD
    after batch norm. The same seed gives the same arrays everywhere (NumPy's PCG64 stream is
    fixed), so records made with them can be compared across runs."""
    spec = get_model(name)
    rng = np.random.default_rng(seed)
    arrays = {}
    norms = {layer.name for layer in spec.layers if isinstance(layer, BatchNorm)}
    for key, shape in spec.parameter_shapes().items():
        if key.rsplit(".", 1)[0] in norms:
            continue  # drawn below, from the moments of its input
        if key.endswith(".bias"):
            arrays[key] = (0.05 * rng.standard_normal(shape, dtype=np.float32))
        elif key.endswith(".weight"):
            fan_in = int(np.prod(shape[1:]))
            arrays[key] = rng.standard_normal(shape, dtype=np.float32) * np.float32(
                np.sqrt(2.0 / fan_in))
    last = [layer.name for layer in spec.layers if isinstance(layer, Dense)][-1]
    if any(isinstance(layer, BatchNorm) for layer in spec.layers):
        scale = _draw_batch_norms(spec, arrays, np.random.default_rng([seed, 1]), last)
        source = f"seed {seed}, batch norm statistics drawn from {CALIBRATION_IMAGES} images"
    else:
        scale, source = CLASSIFIER_SCALE, f"seed {seed}, classifier x{CLASSIFIER_SCALE}"
    arrays[f"{last}.weight"] *= np.float32(scale)
    meta = {"format": WEIGHTS_FORMAT, "model": name, "layers": spec.describe(),
            "source": f"random: He-scaled normal weights, {source}"}
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
