"""Public layer suites: the distinct convolution layers of well-known networks, at the batch
sizes they are deployed at, so that `convlab compare --suite` and `convlab tune --suite`
measure the kernels on layers nobody chose for them.

A layer is its shape at batch 1, the epilogue its network fuses after it (ReLU where an
activation follows; batch norm folded into the weights leaves a bias) and the batches it runs
at. Layers a network repeats with the same shape and epilogue appear once. Layer names follow
the networks' usual (torchvision) module names.

- resnet50: ResNet-50 v1.5 at 224x224 (stride 2 on the bottleneck's 3x3), batches 1, 32, 128,
  256. The last 1x1 of each bottleneck and the shortcut projections feed a residual add, so
  they have no ReLU.
- vgg16: VGG-16 at 224x224, every 3x3 with its ReLU.
- mobilenetv2: MobileNet-v2 at 224x224, width 1.0: its pointwise (1x1) and depthwise (3x3,
  one group a channel) layers. Their activation is ReLU6, which no fused epilogue here (nor
  cuDNN's) computes: the layers run with their bias alone.
- unet: a UNet encoder at 256x256 (two padded 3x3 convolutions a level, 64 to 1024 channels).
- inceptionv3: Inception-v3's 5x5 (Mixed_5b), 1x7 and 7x1 (Mixed_6b-e, Mixed_7a) layers at
  35x35 and 17x17.
- alexnet: convlab's AlexNet (Caffe's bvlc_alexnet: groups of two on conv2, conv4, conv5).
- all: every suite above.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConvlabError
from ..kernels import RELU, get_variant
from ..models import get_model
from ..shapes import ConvShape

BATCHES = (1, 128)
RESNET_BATCHES = (1, 32, 128, 256)


@dataclass(frozen=True)
class SuiteLayer:
    network: str
    name: str
    shape: ConvShape  # at batch 1
    epilogue: str | None
    batches: tuple[int, ...]

    @property
    def label(self) -> str:
        """'resnet50 layer3.0.conv2': unique within a suite."""
        return f"{self.network} {self.name}"

    def at(self, batch: int) -> ConvShape:
        return self.shape.with_batch(batch)


def _conv(c, h, m, k, stride=1, pad=0, groups=1, kw=None, pad_w=None) -> ConvShape:
    return ConvShape(1, c, h, h, m, k, stride, pad, groups, True, kw, pad_w)


def _resnet50() -> list[tuple[str, ConvShape, str | None]]:
    layers = [("conv1", _conv(3, 224, 64, 7, 2, 3), RELU)]
    size, inplanes = 56, 64
    for stage, (planes, stride) in enumerate(((64, 1), (128, 2), (256, 2), (512, 2)), 1):
        out = size // stride
        layers += [
            (f"layer{stage}.0.conv1", _conv(inplanes, size, planes, 1), RELU),
            (f"layer{stage}.0.conv2", _conv(planes, size, planes, 3, stride, 1), RELU),
            (f"layer{stage}.0.conv3", _conv(planes, out, 4 * planes, 1), None),
            (f"layer{stage}.0.downsample", _conv(inplanes, size, 4 * planes, 1, stride), None),
            (f"layer{stage}.1.conv1", _conv(4 * planes, out, planes, 1), RELU),
            (f"layer{stage}.1.conv2", _conv(planes, out, planes, 3, 1, 1), RELU),
        ]
        size, inplanes = out, 4 * planes
    return layers


def _vgg16() -> list[tuple[str, ConvShape, str | None]]:
    plan = [(3, 64, 224), (64, 64, 224), (64, 128, 112), (128, 128, 112), (128, 256, 56),
            (256, 256, 56), (256, 256, 56), (256, 512, 28), (512, 512, 28), (512, 512, 28),
            (512, 512, 14), (512, 512, 14), (512, 512, 14)]
    return [(f"features.{index}", _conv(c, h, m, 3, 1, 1), RELU)
            for index, (c, m, h) in zip((0, 2, 5, 7, 10, 12, 14, 17, 19, 21, 24, 26, 28), plan)]


def _mobilenetv2() -> list[tuple[str, ConvShape, str | None]]:
    layers = []
    channels, size, block = 32, 112, 1
    for expand, out, repeats, stride in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2),
                                         (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                                         (6, 320, 1, 1)):
        for i in range(repeats):
            step = stride if i == 0 else 1
            hidden = channels * expand
            name = f"features.{block}.conv"
            if expand != 1:
                layers.append((f"{name}.0", _conv(channels, size, hidden, 1), None))
            layers.append((f"{name}.{1 if expand != 1 else 0}",
                           _conv(hidden, size, hidden, 3, step, 1, hidden), None))
            size //= step
            layers.append((f"{name}.{2 if expand != 1 else 1}",
                           _conv(hidden, size, out, 1), None))
            channels, block = out, block + 1
    layers.append(("features.18", _conv(320, 7, 1280, 1), None))
    return layers


def _unet() -> list[tuple[str, ConvShape, str | None]]:
    layers = []
    size, channels = 256, 3
    for level, width in enumerate((64, 128, 256, 512, 1024)):
        name = "inc" if level == 0 else f"down{level}"
        layers.append((f"{name}.conv1", _conv(channels, size, width, 3, 1, 1), RELU))
        layers.append((f"{name}.conv2", _conv(width, size, width, 3, 1, 1), RELU))
        size, channels = size // 2, width
    return layers


def _inceptionv3() -> list[tuple[str, ConvShape, str | None]]:
    layers = [("Mixed_5b.branch5x5_2", _conv(48, 35, 64, 5, 1, 2), RELU)]
    for block, c7 in (("Mixed_6b", 128), ("Mixed_6c", 160)):
        layers += [
            (f"{block}.branch7x7_2", _conv(c7, 17, c7, 1, 1, 0, 1, 7, 3), RELU),
            (f"{block}.branch7x7_3", _conv(c7, 17, 192, 7, 1, 3, 1, 1, 0), RELU),
            (f"{block}.branch7x7dbl_2", _conv(c7, 17, c7, 7, 1, 3, 1, 1, 0), RELU),
            (f"{block}.branch7x7dbl_5", _conv(c7, 17, 192, 1, 1, 0, 1, 7, 3), RELU),
        ]
    layers += [
        ("Mixed_6e.branch7x7_2", _conv(192, 17, 192, 1, 1, 0, 1, 7, 3), RELU),
        ("Mixed_6e.branch7x7_3", _conv(192, 17, 192, 7, 1, 3, 1, 1, 0), RELU),
    ]
    return layers


def _alexnet() -> list[tuple[str, ConvShape, str | None]]:
    return [(name, shape, RELU) for name, shape in get_model("alexnet").conv_shapes(1).items()]


NETWORKS = {
    "resnet50": (_resnet50, RESNET_BATCHES),
    "vgg16": (_vgg16, BATCHES),
    "mobilenetv2": (_mobilenetv2, BATCHES),
    "unet": (_unet, BATCHES),
    "inceptionv3": (_inceptionv3, BATCHES),
    "alexnet": (_alexnet, BATCHES),
}
ALL = "all"
NAMES = (*NETWORKS, ALL)


def _distinct(network: str, layers, batches) -> list[SuiteLayer]:
    """The network's layers, a shape and epilogue it repeats kept once (the first name)."""
    seen = set()
    out = []
    for name, shape, epilogue in layers:
        if (shape, epilogue) not in seen:
            seen.add((shape, epilogue))
            out.append(SuiteLayer(network, name, shape, epilogue, batches))
    return out


def get_suite(name: str) -> list[SuiteLayer]:
    """The suite's layers; ConvlabError naming the suites for an unknown name."""
    key = name.strip().lower()
    if key == ALL:
        return [layer for network in NETWORKS for layer in get_suite(network)]
    if key not in NETWORKS:
        raise ConvlabError(f"no layer suite '{name}'; suites: {', '.join(NAMES)}")
    build, batches = NETWORKS[key]
    return _distinct(key, build(), batches)


def cells(name: str, batches: list[int] | None = None) -> list[tuple[SuiteLayer, int]]:
    """(layer, batch) for every layer of the suite at each of its batches, or at `batches`
    where given."""
    return [(layer, batch) for layer in get_suite(name) for batch in (batches or layer.batches)]


# --- what a suite run compares -----------------------------------------------------------------

CLASSES = ("fp32", "tf32", "fp16", "bf16")
# Per precision class, the families a suite runs, fastest first: the first whose variants run
# on this GPU is taken (Hopper's wgmma, else channels-last), with the depthwise family for the
# depthwise layers. fp32 variants stand in for tf32 where no tf32 one exists (depthwise): an
# fp32 result meets the tf32 bound.
FAMILIES = {
    "fp32": ((("wgmma-3xtf32", "wgmma-split-bf16"), ("channels-last-3xtf32",)), ("depthwise",)),
    "tf32": ((("wgmma",), ("channels-last",)), ("depthwise",)),
    "fp16": ((("wgmma-fp16",), ("channels-last-fp16",)), ("depthwise-fp16",)),
    "bf16": ((("wgmma-bf16",), ("channels-last-bf16",)), ("depthwise-bf16",)),
}
# The precisions whose variants a class's cells may be run by (at least as accurate).
STANDS_IN = {"fp32": ("fp32",), "tf32": ("tf32", "fp32"), "fp16": ("fp16",), "bf16": ("bf16",)}


def parse_classes(spec: str | None) -> list[str]:
    """'fp16,tf32' -> those classes in CLASSES' order; None or 'all': every class."""
    if spec is None or spec.strip().lower() == "all":
        return list(CLASSES)
    names = [c.strip().lower() for c in spec.split(",") if c.strip()]
    unknown = [c for c in names if c not in CLASSES]
    if unknown or not names:
        raise ConvlabError(f"--classes takes precision classes from {', '.join(CLASSES)} (or "
                           f"all); got '{spec}'")
    return [c for c in CLASSES if c in names]


def suite_kernels(classes: list[str]) -> list[str]:
    """The variants a suite run times for these classes on this GPU."""
    names: list[str] = []
    for cls in classes:
        dense, depthwise = FAMILIES[cls]
        usable = next((family for family in dense
                       if not any(get_variant(n).gpu_problem() for n in family)), ())
        names += [n for n in (*usable, *depthwise) if n not in names]
    return names


def is_depthwise(shape: ConvShape) -> bool:
    return shape.groups > 1 and shape.groups == shape.C == shape.M


def meant_for(variant_name: str, shape: ConvShape) -> bool:
    """Whether a suite run times this variant on the layer: the depthwise family on depthwise
    layers, the others on the rest (they run depthwise layers too, far slower: the depthwise
    variants exist for them)."""
    return variant_name.startswith("depthwise") == is_depthwise(shape)
