"""ImageNet input and output for the ImageNet models: the 1000 class names, image preprocessing
as each model's weights expect it (Caffe's for alexnet, torchvision's for resnet50 and vgg16),
and the top-5 classes of a forward pass.

Preprocessing: RGB image, short side resized to 256 (bilinear), centre crop to the model's
input size, then for alexnet (bvlc_alexnet was trained on Caffe's pipeline) channels reordered
to BGR and the ILSVRC-2012 mean pixel subtracted, in the 0-255 scale; for resnet50 and vgg16
(torchvision's) RGB scaled to [0, 1] and normalised by torchvision's mean and std. A .npy of
shape (N, 3, size, size) float32 is taken as input already preprocessed that way.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

import numpy as np
from rich.console import RenderableType

from ..errors import ConvlabError, DataError
from ..models import CAFFE, TORCHVISION, ModelSpec
from ..ops.ingest import InputTransform, normalize
from ..tables import Col, fitted_table

CLASSES = 1000
RESIZE_SHORT_SIDE = 256
# Caffe's ilsvrc_2012_mean.npy averaged over its pixels, per channel in B, G, R order.
MEAN_BGR = np.array([104.00698793, 116.66876762, 122.67891434], dtype=np.float32)
TORCHVISION_MEAN = (0.485, 0.456, 0.406)  # RGB, of pixels scaled to [0, 1]
TORCHVISION_STD = (0.229, 0.224, 0.225)
TOP = 5
PILLOW_HINT = 'reading images needs Pillow: pip install -e ".[image]"'


@dataclass(frozen=True)
class ImageNetClass:
    index: int
    wnid: str  # WordNet synset id, e.g. n01440764
    name: str  # its lemmas, e.g. "tench, Tinca tinca"


@lru_cache(maxsize=1)
def classes() -> tuple[ImageNetClass, ...]:
    """The ILSVRC-2012 classes in the index order of the bvlc_alexnet fc8 output."""
    text = (resources.files("convlab") / "assets" / "imagenet" / "synset_words.txt").read_text(
        encoding="ascii")
    lines = text.splitlines()
    if len(lines) != CLASSES:
        raise DataError(f"synset_words.txt lists {len(lines)} classes, expected {CLASSES}: "
                        "the package is damaged; reinstall convlab")
    return tuple(ImageNetClass(i, *line.split(" ", 1)) for i, line in enumerate(lines))


def _pillow():
    try:
        from PIL import Image, ImageOps
    except ImportError:
        raise ConvlabError(PILLOW_HINT) from None
    return Image, ImageOps


def imagenet_transform(size: int = 227, preprocessing: str = CAFFE):
    """How a model's input is made from RGB bytes (rows, columns, 3), as its weights expect it
    (ops.ingest does the same on the device): Caffe's (alexnet) reorders the channels to BGR and
    subtracts the mean pixel; torchvision's (resnet50, vgg16) keeps RGB and maps each byte p to
    (p / 255 - mean) / std."""
    if preprocessing == TORCHVISION:
        return InputTransform((size, size, 3), size, (0, 1, 2),
                              tuple(255.0 * m for m in TORCHVISION_MEAN),
                              tuple(255.0 * s for s in TORCHVISION_STD))
    return InputTransform((size, size, 3), size, (2, 1, 0),
                          tuple(float(m) for m in MEAN_BGR), (1.0, 1.0, 1.0))


def crop_bytes(image, size: int = 227) -> np.ndarray:
    """A Pillow image -> uint8 RGB (size, size, 3): short side to 256 (bilinear), centre crop."""
    Image, ImageOps = _pillow()
    image = ImageOps.exif_transpose(image).convert("RGB")
    width, height = image.size
    scale = RESIZE_SHORT_SIDE / min(width, height)
    resized = (round(width * scale), round(height * scale))
    image = image.resize(resized, Image.BILINEAR)
    left = (resized[0] - size) // 2
    top = (resized[1] - size) // 2
    return np.asarray(image.crop((left, top, left + size, top + size)), dtype=np.uint8)


def preprocess(image, size: int = 227, preprocessing: str = CAFFE) -> np.ndarray:
    """A Pillow image -> float32 (3, size, size): short side to 256 (bilinear), centre crop,
    then imagenet_transform's channels and scale."""
    return normalize(crop_bytes(image, size)[None], imagenet_transform(size, preprocessing))[0]


def load_image(path: Path, size: int = 227, preprocessing: str = CAFFE) -> np.ndarray:
    return normalize(load_bytes(path, size)[None], imagenet_transform(size, preprocessing))[0]


CLASSIFY_HINT = "give a JPEG or PNG, or a .npy of preprocessed input"


def load_bytes(path: Path, size: int = 227, hint: str = CLASSIFY_HINT) -> np.ndarray:
    """An image file decoded, resized and cropped to uint8 RGB (size, size, 3), or one clear
    DataError (`hint` says what the caller takes instead)."""
    Image, _ = _pillow()
    try:
        image = Image.open(path)
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a directory, not an image") from None
    except Image.UnidentifiedImageError:
        raise DataError(f"{path}: not an image Pillow can read ({hint})") from None
    except Image.DecompressionBombError as exc:
        raise DataError(f"{path}: {exc}") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror or exc})") from None
    with image:
        try:
            image.load()
            return crop_bytes(image, size)  # EXIF rotation and resizing read the data too
        except (OSError, SyntaxError, ValueError) as exc:  # Pillow's errors for corrupt data
            raise DataError(f"{path}: cannot decode the image ({exc})") from None


def load_array(path: Path, input_shape: tuple[int, int, int]) -> np.ndarray:
    """A .npy of already-preprocessed input, (N, *input_shape) float32, finite."""
    expected = f"float32 of shape (N, {', '.join(map(str, input_shape))})"
    try:
        x = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a directory, not a .npy file") from None
    except (OSError, ValueError, EOFError) as exc:
        raise DataError(f"{path}: not a readable numeric .npy array ({exc})") from None
    if not isinstance(x, np.ndarray):
        raise DataError(f"{path}: an .npz archive, expected a .npy array {expected}")
    if x.ndim != 4 or x.shape[1:] != input_shape or x.shape[0] < 1 or x.dtype != np.float32:
        raise DataError(f"{path}: preprocessed input must be {expected}, got {x.dtype} of "
                        f"shape {x.shape}")
    if not np.isfinite(x).all():
        raise DataError(f"{path}: preprocessed input holds non-finite values (NaN or inf)")
    return np.ascontiguousarray(x)


def load_inputs(paths: list[Path], spec: ModelSpec) -> tuple[np.ndarray, list[str]]:
    """Network input for every file (an image, or a .npy holding several) and a label for each
    row: the file name, with [i] for rows of a .npy."""
    batches, labels = [], []
    for path in map(Path, paths):
        if path.suffix.lower() == ".npy":
            x = load_array(path, spec.input_shape)
            labels += [f"{path}[{i}]" for i in range(len(x))]
        else:
            x = load_image(path, spec.input_size, spec.preprocessing)[None]
            labels.append(str(path))
        batches.append(x)
    return np.concatenate(batches), labels


@dataclass(frozen=True)
class Prediction:
    cls: ImageNetClass
    probability: float


@dataclass(frozen=True)
class Classified:
    input: str
    top: list[Prediction]

    def as_dict(self) -> dict:
        return {"input": self.input,
                "top": [{"rank": rank, "index": p.cls.index, "wnid": p.cls.wnid,
                         "name": p.cls.name, "probability": p.probability}
                        for rank, p in enumerate(self.top, 1)]}


def top_classes(probabilities: np.ndarray, k: int = TOP) -> list[list[Prediction]]:
    """The k most probable classes of each row, most probable first (ties: lower index first)."""
    names = classes()
    if probabilities.ndim != 2 or probabilities.shape[1] != len(names):
        raise ValueError(f"probabilities of shape {probabilities.shape}, expected (N, {len(names)})")
    order = np.argsort(-probabilities, axis=1, kind="stable")[:, :k]
    return [[Prediction(names[i], float(row[i])) for i in indices]
            for row, indices in zip(probabilities, order)]


def format_probability(p: float) -> str:
    """Four decimals, and small probabilities in scientific notation rather than as 0.0000."""
    if p == 0 or p >= 1e-3:
        return f"{p:.4f}"
    return f"{p:.1e}"


def predictions_table(item: Classified, width: int | None = None,
                      wide: bool = False) -> RenderableType:
    """One input's top classes; the class names wrap at spaces rather than being cut. No
    title: rich would wrap a long input path inside it, so the caller prints the path."""
    cols = [Col("#"), Col("probability"), Col("class", justify="left", wrap=True),
            Col("index", key=False), Col("WordNet id", justify="left", key=False)]
    rows = [[str(rank), format_probability(p.probability), p.cls.name, str(p.cls.index),
             p.cls.wnid]
            for rank, p in enumerate(item.top, 1)]
    return fitted_table(None, cols, rows, width, wide)
