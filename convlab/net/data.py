"""The Fashion-MNIST test set shipped with convlab, its IDX reader, and input preparation."""

from __future__ import annotations

import gzip
import struct
import zlib
from functools import lru_cache
from importlib import resources
from pathlib import Path

import numpy as np

from ..errors import DataError
from ..ops.ingest import InputTransform, normalize

IMAGES_FILE = "t10k-images-idx3-ubyte.gz"
LABELS_FILE = "t10k-labels-idx1-ubyte.gz"
TEST_SET_SIZE = 10_000
CLASS_NAMES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)

# IDX type codes (third magic byte) and the big-endian NumPy type each one stores.
_IDX_TYPES = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def _read_bytes(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror})") from None
    if raw[:2] != b"\x1f\x8b":
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"{path}: corrupt or truncated gzip stream ({exc})") from None


def read_idx(path: str | Path) -> np.ndarray:
    """Read an IDX file (optionally gzip-compressed), checking its magic number and sizes."""
    path = Path(path)
    raw = _read_bytes(path)
    if len(raw) < 4:
        raise DataError(f"{path}: too short to be an IDX file ({len(raw)} bytes)")
    zero0, zero1, type_code, ndim = raw[0], raw[1], raw[2], raw[3]
    if zero0 != 0 or zero1 != 0 or type_code not in _IDX_TYPES or ndim == 0:
        raise DataError(
            f"{path}: not an IDX file (magic number 0x{raw[:4].hex()}; expected 0x0000 followed "
            f"by a type code and a dimension count)"
        )
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path}: truncated header ({len(raw)} bytes, {ndim} dimensions need {header})")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    dtype = _IDX_TYPES[type_code]
    expected = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    found = len(raw) - header
    if found < expected:
        raise DataError(
            f"{path}: truncated: dimensions {'x'.join(map(str, dims))} need {expected} bytes of data, "
            f"found {found}"
        )
    if found > expected:
        raise DataError(
            f"{path}: {found - expected} unexpected bytes after the data of a "
            f"{'x'.join(map(str, dims))} array"
        )
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims).astype(dtype.newbyteorder("="))


def read_image_label_pair(images_path: Path, labels_path: Path) -> tuple[np.ndarray, np.ndarray]:
    images = read_idx(images_path)
    labels = read_idx(labels_path)
    if images.ndim != 3 or images.dtype != np.uint8:
        raise DataError(f"{images_path}: expected a 3-D array of bytes, got {images.ndim}-D {images.dtype}")
    if labels.ndim != 1 or labels.dtype != np.uint8:
        raise DataError(f"{labels_path}: expected a 1-D array of bytes, got {labels.ndim}-D {labels.dtype}")
    if len(images) != len(labels):
        raise DataError(f"{images_path} holds {len(images)} images but {labels_path} {len(labels)} labels")
    if labels.size and labels.max() > 9:
        raise DataError(f"{labels_path}: label {int(labels.max())} is outside 0..9")
    return images, labels


def _packaged(name: str) -> Path:
    return Path(str(resources.files("convlab") / "assets" / "fashion-mnist" / name))


@lru_cache(maxsize=1)
def _test_set() -> tuple[np.ndarray, np.ndarray]:
    images, labels = read_image_label_pair(_packaged(IMAGES_FILE), _packaged(LABELS_FILE))
    if images.shape != (TEST_SET_SIZE, 28, 28):
        raise DataError(f"the packaged test set has shape {images.shape}, expected (10000, 28, 28)")
    images.setflags(write=False)
    labels.setflags(write=False)
    return images, labels


def load_test_set(n: int = TEST_SET_SIZE) -> tuple[np.ndarray, np.ndarray]:
    """The first n test images (uint8, n x 28 x 28) and their labels."""
    if not 1 <= n <= TEST_SET_SIZE:
        raise DataError(f"the test set has {TEST_SET_SIZE} images; asked for {n}")
    images, labels = _test_set()
    return images[:n], labels[:n]


def fashion_transform(size: int):
    """How a Fashion-MNIST model's input is made from the 28x28 bytes: scaled to [0, 1] and,
    for larger inputs, upsampled bilinearly (ops.ingest does the same on the device)."""
    return InputTransform((28, 28, 1), size, (0,), (0.0,), (255.0,))


def prepare_input(images: np.ndarray, size: int) -> np.ndarray:
    """uint8 images (N, 28, 28) -> float32 network input (N, 1, size, size) in [0, 1].

    Computed in float64 in one fixed order of operations (ops.ingest.normalize), so the result is
    the same on every machine, in training and inference, and on the device from the bytes.
    """
    return normalize(images, fashion_transform(size))
