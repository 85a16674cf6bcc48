"""The bvlc_alexnet.npy importer, on a generated file with the published structure.

The published file is checked against a channel-last forward pass written here from the
published layout alone (NHWC activations, HWIO filters used as stored, groups by splitting
channels, fc6 reading the channel-last flatten): if the conversion to convlab's layout is right,
convlab's channel-first reference gives the same class probabilities.
"""

import hashlib
import json

import numpy as np
import pytest
from click.testing import CliRunner

from convlab.cli import main
from convlab.errors import DataError
from convlab.models import get_model, load_weights
from convlab.net import importer
from convlab.oracle import reference

SPEC = get_model("alexnet")
PUBLISHED = {  # (weights, biases) as bvlc_alexnet.npy stores them
    "conv1": ((11, 11, 3, 96), (96,)),
    "conv2": ((5, 5, 48, 256), (256,)),
    "conv3": ((3, 3, 256, 384), (384,)),
    "conv4": ((3, 3, 192, 384), (384,)),
    "conv5": ((3, 3, 192, 256), (256,)),
    "fc6": ((9216, 4096), (4096,)),
    "fc7": ((4096, 4096), (4096,)),
    "fc8": ((4096, 1000), (1000,)),
}


# Inputs of pixel scale (|x| up to 60) keep LRN's divisor well above 1 in conv1 and conv2, so
# LRN is exercised; fc8 is scaled down so the logits spread over a few units and every class
# keeps a probability the comparison can check (He-scaled, they would spread over ~100).
INPUT_SCALE = 60.0
FC8_GAIN = 1 / 30


def published_dict(seed: int = 408) -> dict:
    """Random float32 arrays of the published shapes, He-scaled so activations neither vanish
    nor explode through eight layers."""
    rng = np.random.default_rng(seed)
    layers = {}
    for name, (weight_shape, bias_shape) in PUBLISHED.items():
        fan_in = int(np.prod(weight_shape[:-1]))
        gain = np.sqrt(2 / fan_in) * (FC8_GAIN if name == "fc8" else 1)
        w = rng.standard_normal(weight_shape, dtype=np.float32) * np.float32(gain)
        b = rng.standard_normal(bias_shape, dtype=np.float32) * np.float32(0.05)
        layers[name] = [w, b]
    return layers


def save_published(path, layers) -> None:
    """Pickled as the real file is: a dict handed to np.save, which stores it as a 0-d object
    array."""
    np.save(path, layers, allow_pickle=True)


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    layers = published_dict()
    path = tmp_path_factory.mktemp("published") / "bvlc_alexnet.npy"
    save_published(path, layers)
    return path, layers


@pytest.fixture(scope="module")
def imported(published, tmp_path_factory):
    """The published file converted once, through the command a user runs."""
    source, _ = published
    out = tmp_path_factory.mktemp("imported") / "alexnet.npz"
    result = CliRunner().invoke(main, ["import-weights", str(source), "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out, result.output


@pytest.fixture(scope="module")
def imported_weights(imported):
    return load_weights("alexnet", imported[0])


# --- an independent forward pass in the published, channel-last layout -----------------------

def conv_hwc(x, w, b, stride, pad, groups):
    """x (N, H, W, C), w (K, K, C/groups, M) as stored; one matrix product per filter tap."""
    if pad:
        x = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    K = w.shape[0]
    Ho = (x.shape[1] - K) // stride + 1
    Wo = (x.shape[2] - K) // stride + 1
    outputs = []
    for xg, wg in zip(np.split(x, groups, axis=3), np.split(w, groups, axis=3)):
        y = np.zeros((x.shape[0], Ho, Wo, wg.shape[3]))
        for p in range(K):
            for q in range(K):
                y += xg[:, p:p + stride * (Ho - 1) + 1:stride,
                        q:q + stride * (Wo - 1) + 1:stride, :] @ wg[p, q]
        outputs.append(y)
    return np.concatenate(outputs, axis=3) + b


def lrn_hwc(x, size=5, alpha=1e-4, beta=0.75, k=1.0):
    half = size // 2
    padded = np.pad(np.square(x), ((0, 0), (0, 0), (0, 0), (half, half)))
    window = sum(padded[..., i:i + x.shape[3]] for i in range(size))
    return x / (k + alpha / size * window) ** beta


def max_pool_hwc(x, size=3, stride=2):
    Ho = (x.shape[1] - size) // stride + 1
    Wo = (x.shape[2] - size) // stride + 1
    return np.max([x[:, p:p + stride * (Ho - 1) + 1:stride, q:q + stride * (Wo - 1) + 1:stride]
                   for p in range(size) for q in range(size)], axis=0)


def forward_hwc(layers, x_nhwc):
    """bvlc_alexnet in float64, channel-last throughout, weights used exactly as published."""
    p = {name: (np.float64(w), np.float64(b)) for name, (w, b) in layers.items()}
    relu = lambda a: np.maximum(a, 0)  # noqa: E731
    a = np.float64(x_nhwc)
    a = max_pool_hwc(lrn_hwc(relu(conv_hwc(a, *p["conv1"], stride=4, pad=0, groups=1))))
    a = max_pool_hwc(lrn_hwc(relu(conv_hwc(a, *p["conv2"], stride=1, pad=2, groups=2))))
    a = relu(conv_hwc(a, *p["conv3"], stride=1, pad=1, groups=1))
    a = relu(conv_hwc(a, *p["conv4"], stride=1, pad=1, groups=2))
    a = max_pool_hwc(relu(conv_hwc(a, *p["conv5"], stride=1, pad=1, groups=2)))
    a = a.reshape(a.shape[0], -1)  # channel-last flatten: (h, w, c)
    a = relu(a @ p["fc6"][0] + p["fc6"][1])
    a = relu(a @ p["fc7"][0] + p["fc7"][1])
    z = a @ p["fc8"][0] + p["fc8"][1]
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


# --- the conversion ---------------------------------------------------------------------------

def test_published_shapes_follow_the_model_spec():
    assert importer.published_shapes(SPEC) == PUBLISHED


def test_imported_file_gives_the_channel_last_networks_probabilities(published, imported_weights,
                                                                     rng):
    _, layers = published
    weights = imported_weights
    x_nhwc = rng.uniform(-INPUT_SCALE, INPUT_SCALE, size=(2, 227, 227, 3))
    expected = forward_hwc(layers, x_nhwc)
    got = reference.forward(weights, x_nhwc.transpose(0, 3, 1, 2), dtype=np.float64)
    # The comparison means something only if the classes are not decided by one huge logit.
    assert expected.max() < 0.99 and expected.min() > 1e-30
    # Both passes compute in float64 and differ only in summation order: relative errors of a
    # few u * (reduction length 9216) * (conditioning), far below 1e-9.
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=0)
    assert (got.argmax(axis=1) == expected.argmax(axis=1)).all()


def test_imported_arrays_are_transposes_of_the_published_ones(published, imported_weights):
    _, layers = published
    weights = imported_weights
    for name in ("conv1", "conv2", "conv3", "conv4", "conv5"):
        w, b = layers[name]
        ours = weights.arrays[f"{name}.weight"]
        assert ours.dtype == np.float32 and ours.flags.c_contiguous
        # filter m, input channel c, tap (p, q) is the published w[p, q, c, m]
        assert ours[5, 1, 2, 0] == w[2, 0, 1, 5]
        np.testing.assert_array_equal(ours, w.transpose(3, 2, 0, 1))
        np.testing.assert_array_equal(weights.arrays[f"{name}.bias"], b)
    np.testing.assert_array_equal(weights.arrays["fc7.weight"], layers["fc7"][0].T)
    np.testing.assert_array_equal(weights.arrays["fc8.weight"], layers["fc8"][0].T)
    # fc6: our column c*36 + h*6 + w is the published row (h*6 + w)*256 + c
    c, h, w = 200, 4, 1
    np.testing.assert_array_equal(weights.arrays["fc6.weight"][:, c * 36 + h * 6 + w],
                                  layers["fc6"][0][(h * 6 + w) * 256 + c])


def test_imported_metadata_names_the_source(published, imported, imported_weights):
    source, _ = published
    out, output = imported
    weights = imported_weights
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    assert weights.meta["source_file"] == "bvlc_alexnet.npy"
    assert weights.meta["source_sha256"] == digest
    assert "HWIO -> OIHW" in weights.meta["conversion"]
    assert weights.meta["format"] == 1 and weights.meta["model"] == "alexnet"
    assert f"wrote {out}" in output and digest in output
    assert "--weights" in output and "60,965,224 parameters" in output


def test_help_warns_that_a_pickle_runs_code():
    result = CliRunner().invoke(main, ["import-weights", "--help"], terminal_width=200)
    assert result.exit_code == 0
    assert "runs code" in result.output and "trust" in result.output
    assert "runs code" in importer.import_weights.__doc__


# --- bad files: one clear line each -----------------------------------------------------------

def import_fails(path, tmp_path) -> str:
    """Run the command on a bad file; return its one-line message."""
    out = tmp_path / "out.npz"
    result = CliRunner().invoke(main, ["import-weights", str(path), "--out", str(out)])
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert not out.exists()
    return result.output.strip()


def small_published(**changes) -> dict:
    """The published structure with tiny arrays: enough for errors found before the shapes."""
    layers = {name: [np.ones((1,), np.float32), np.ones((1,), np.float32)] for name in PUBLISHED}
    layers.update(changes)
    return layers


def test_missing_file(tmp_path):
    message = import_fails(tmp_path / "nowhere.npy", tmp_path)
    assert "nowhere.npy: no such file" in message


def test_unreadable_file(tmp_path):
    message = import_fails(tmp_path, tmp_path)
    assert "is a directory" in message


def test_not_an_npy_file(tmp_path):
    path = tmp_path / "weights.npy"
    path.write_bytes(b"\x80\x02}q\x00." + bytes(100))  # a bare pickle, no .npy header
    assert "not a NumPy .npy file" in import_fails(path, tmp_path)


def test_npz_is_not_the_published_file(tmp_path):
    path = tmp_path / "alexnet.npz"
    np.savez(path, a=np.ones(3))
    assert "a zip archive such as a .npz (no .npy header)" in import_fails(path, tmp_path)


def test_numeric_npy_is_refused_before_unpickling(tmp_path):
    path = tmp_path / "numbers.npy"
    np.save(path, np.ones((3, 4), np.float32))
    message = import_fails(path, tmp_path)
    assert "a plain float32 array of shape (3, 4)" in message
    assert "not the pickled" in message


def test_corrupt_npy_header(tmp_path):
    path = tmp_path / "header.npy"
    path.write_bytes(np.lib.format.magic(1, 0) + b"\x10\x00{'descr': nonsense}\n" + bytes(50))
    assert "corrupt .npy header" in import_fails(path, tmp_path)


def test_unsupported_npy_version(tmp_path):
    path = tmp_path / "v3.npy"
    path.write_bytes(np.lib.format.magic(3, 0) + bytes(50))
    assert ".npy format version 3.0" in import_fails(path, tmp_path)


def test_object_array_that_is_not_one_dict(tmp_path):
    path = tmp_path / "list.npy"
    np.save(path, np.array([{}, {}], dtype=object), allow_pickle=True)
    assert "an object array of shape (2,)" in import_fails(path, tmp_path)


def test_header_declaring_a_pickle_over_garbage(tmp_path):
    path = tmp_path / "garbage.npy"
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(
            f, {"descr": "|O", "fortran_order": False, "shape": ()})
        f.write(b"this is not a pickle")
    assert "not a readable one" in import_fails(path, tmp_path)


def test_pickle_that_is_not_a_dict(tmp_path):
    path = tmp_path / "list.npy"
    pickled = np.empty((), dtype=object)
    pickled[()] = [np.ones(3), np.ones(3)]
    np.save(path, pickled, allow_pickle=True)
    assert "the pickle holds a list, expected the dict" in import_fails(path, tmp_path)


def test_missing_layer_is_named(tmp_path):
    layers = small_published()
    del layers["conv3"]
    path = tmp_path / "no_conv3.npy"
    save_published(path, layers)
    message = import_fails(path, tmp_path)
    assert message.endswith("missing layer 'conv3'")


def test_unexpected_key_is_named(tmp_path):
    path = tmp_path / "extra.npy"
    save_published(path, small_published(fc9=[np.ones(1), np.ones(1)]))
    assert "unexpected key 'fc9'" in import_fails(path, tmp_path)


def test_layer_that_is_not_weights_and_biases(tmp_path):
    path = tmp_path / "dict_layer.npy"
    save_published(path, small_published(conv1={"weights": 1}))
    assert "layer 'conv1' is a dict, expected [weights, biases]" in import_fails(path, tmp_path)
    save_published(path, small_published(conv1=[np.ones(1)]))
    assert "layer 'conv1' is a list of 1, expected [weights, biases]" in import_fails(path, tmp_path)
    save_published(path, small_published(conv1=["w", "b"]))
    assert "layer 'conv1' weights are a str" in import_fails(path, tmp_path)


def test_wrong_shape_names_layer_got_and_expected(tmp_path):
    layers = small_published()
    path = tmp_path / "small.npy"
    save_published(path, layers)
    message = import_fails(path, tmp_path)
    assert "layer 'conv1' weights have shape (1,), expected (11, 11, 3, 96)" in message


def test_oihw_filters_are_a_wrong_shape(published):
    """A file already in convlab's layout is not the published one."""
    path, layers = published
    wrong = dict(layers, conv2=[layers["conv2"][0].transpose(3, 2, 0, 1), layers["conv2"][1]])
    with pytest.raises(DataError, match=r"layer 'conv2' weights have shape \(256, 48, 5, 5\), "
                                        r"expected \(5, 5, 48, 256\)"):
        importer.validate(path, wrong, SPEC)


def test_wrong_bias_shape(published):
    path, layers = published
    wrong = dict(layers, fc8=[layers["fc8"][0], np.ones(999, np.float32)])
    with pytest.raises(DataError, match=r"layer 'fc8' biases have shape \(999,\), expected \(1000,\)"):
        importer.validate(path, wrong, SPEC)


def test_non_finite_values(published):
    path, layers = published
    bias = layers["conv4"][1].copy()
    bias[[3, 7]] = [np.nan, np.inf]
    with pytest.raises(DataError, match="layer 'conv4' biases hold 2 non-finite values"):
        importer.validate(path, dict(layers, conv4=[layers["conv4"][0], bias]), SPEC)


def test_non_float_arrays(published):
    path, layers = published
    wrong = dict(layers, fc7=[layers["fc7"][0], np.ones(4096, dtype=np.int64)])
    with pytest.raises(DataError, match="layer 'fc7' biases are int64, expected floating point"):
        importer.validate(path, wrong, SPEC)


def test_non_finite_values_through_the_command(tmp_path, published):
    _, layers = published
    bias = layers["fc8"][1].copy()
    bias[0] = np.nan
    path = tmp_path / "nan.npy"
    save_published(path, dict(layers, fc8=[layers["fc8"][0], bias]))
    assert "layer 'fc8' biases hold 1 non-finite values" in import_fails(path, tmp_path)


def test_float64_file_is_converted_to_float32(published):
    path, layers = published
    as64 = {name: [w.astype(np.float64), b.astype(np.float64)] for name, (w, b) in layers.items()}
    arrays = importer.convert(importer.validate(path, as64, SPEC), SPEC)
    assert all(a.dtype == np.float32 and a.flags.c_contiguous for a in arrays.values())
    np.testing.assert_array_equal(arrays["conv1.weight"], layers["conv1"][0].transpose(3, 2, 0, 1))


def test_unwritable_output(published, tmp_path):
    source, _ = published
    result = CliRunner().invoke(main, ["import-weights", str(source), "--out",
                                       str(tmp_path / "no" / "such" / "dir.npz")])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "cannot write" in result.output and len(result.output.strip().splitlines()) == 1


def test_metadata_is_json(imported):
    with np.load(imported[0]) as npz:
        meta = json.loads(str(npz["meta"]))
    assert meta["conversion"] == importer.CONVERSION
