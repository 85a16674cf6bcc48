import gzip
import struct

import numpy as np
import pytest

from convlab.errors import DataError
from convlab.net import data


def write_idx(path, array, type_code=0x08, compress=True, extra=b"", cut=0):
    header = bytes([0, 0, type_code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    payload = header + array.astype(array.dtype.newbyteorder(">")).tobytes() + extra
    if cut:
        payload = payload[:-cut]
    path.write_bytes(gzip.compress(payload) if compress else payload)
    return path


def test_reads_plain_and_gzip_idx(tmp_path):
    a = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    np.testing.assert_array_equal(data.read_idx(write_idx(tmp_path / "a.gz", a)), a)
    np.testing.assert_array_equal(data.read_idx(write_idx(tmp_path / "a", a, compress=False)), a)
    b = np.array([1.5, -2.0], dtype=np.float32)
    np.testing.assert_array_equal(data.read_idx(write_idx(tmp_path / "b", b, type_code=0x0D)), b)


def test_bad_magic(tmp_path):
    path = tmp_path / "bad"
    path.write_bytes(b"\x12\x34\x08\x01" + b"\x00" * 8)
    with pytest.raises(DataError, match="not an IDX file"):
        data.read_idx(path)


def test_truncated_data(tmp_path):
    path = write_idx(tmp_path / "t.gz", np.zeros((3, 4, 4), dtype=np.uint8), cut=5)
    with pytest.raises(DataError, match="truncated: dimensions 3x4x4 need 48 bytes of data, found 43"):
        data.read_idx(path)


def test_truncated_header(tmp_path):
    path = tmp_path / "h"
    path.write_bytes(b"\x00\x00\x08\x03\x00\x00")
    with pytest.raises(DataError, match="truncated header"):
        data.read_idx(path)


def test_trailing_bytes(tmp_path):
    path = write_idx(tmp_path / "x.gz", np.zeros(4, dtype=np.uint8), extra=b"junk")
    with pytest.raises(DataError, match="4 unexpected bytes"):
        data.read_idx(path)


def test_truncated_gzip_stream(tmp_path):
    good = write_idx(tmp_path / "g.gz", np.arange(1000, dtype=np.uint8) % 7)
    raw = good.read_bytes()
    path = tmp_path / "cut.gz"
    path.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(DataError, match="corrupt or truncated gzip"):
        data.read_idx(path)


def test_missing_file(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        data.read_idx(tmp_path / "nope.gz")


def test_images_and_labels_must_agree(tmp_path):
    images = write_idx(tmp_path / "i.gz", np.zeros((3, 2, 2), dtype=np.uint8))
    labels = write_idx(tmp_path / "l.gz", np.zeros(4, dtype=np.uint8))
    with pytest.raises(DataError, match="3 images but"):
        data.read_image_label_pair(images, labels)


def test_packaged_test_set():
    images, labels = data.load_test_set()
    assert images.shape == (10000, 28, 28) and images.dtype == np.uint8
    assert labels.shape == (10000,) and set(np.unique(labels)) == set(range(10))
    assert (np.bincount(labels) == 1000).all()  # Fashion-MNIST's test set is balanced
    first, _ = data.load_test_set(10)
    np.testing.assert_array_equal(first, images[:10])


@pytest.mark.parametrize("n", [0, 10001])
def test_test_set_size_bounds(n):
    with pytest.raises(DataError):
        data.load_test_set(n)


def test_prepare_input_keeps_28x28_as_scaled_pixels():
    images, _ = data.load_test_set(5)
    x = data.prepare_input(images, 28)
    assert x.shape == (5, 1, 28, 28) and x.dtype == np.float32 and x.flags.c_contiguous
    np.testing.assert_array_equal(x[:, 0], images.astype(np.float32) / 255)


def test_upsampling_is_deterministic_and_bilinear():
    images, _ = data.load_test_set(3)
    x = data.prepare_input(images, 48)
    assert x.shape == (3, 1, 48, 48)
    np.testing.assert_array_equal(x, data.prepare_input(images, 48))
    assert 0.0 <= x.min() and x.max() <= 1.0
    flat = np.full((1, 28, 28), 200, dtype=np.uint8)
    np.testing.assert_allclose(data.prepare_input(flat, 48), 200 / 255, rtol=1e-6)
    # A horizontal ramp stays a ramp: every row of the upsampled image is non-decreasing.
    ramp = np.tile(np.arange(0, 252, 9, dtype=np.uint8), (28, 1))[None]
    up = data.prepare_input(ramp, 48)[0, 0]
    assert (np.diff(up, axis=1) >= -1e-7).all()
