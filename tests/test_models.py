import json
import zipfile

import numpy as np
import pytest

from convlab.errors import ConvlabError, DataError
from convlab.models import (ACCURACY_BATCHES, FASHION_MNIST, MODELS, get_model, load_weights,
                            random_weights, save_weights, weights_path)
from convlab.net import data
from convlab.oracle import reference
from convlab.shapes import ConvShape

SHIPPED = [name for name, spec in MODELS.items() if spec.task == FASHION_MNIST]


def test_model_specs_match_the_course():
    high = get_model("ece408-high")
    assert high.conv_shapes(10000) == {"conv": ConvShape(10000, 1, 28, 28, 50, 5)}
    assert high.parameter_shapes()["fc1.weight"] == (500, 7200)
    spring = get_model("ece408")
    assert spring.conv_shapes(7) == {"conv1": ConvShape(7, 1, 48, 48, 12, 7),
                                     "conv2": ConvShape(7, 12, 21, 21, 24, 7)}
    assert spring.parameter_shapes()["fc1.weight"] == (160, 5400)


def test_alexnet_spec_matches_bvlc_alexnet():
    spec = get_model("alexnet")
    shapes = spec.conv_shapes(128)
    assert shapes["conv1"] == ConvShape(128, 3, 227, 227, 96, 11, stride=4, bias=True)
    assert shapes["conv2"] == ConvShape(128, 96, 27, 27, 256, 5, pad=2, groups=2, bias=True)
    assert shapes["conv3"] == ConvShape(128, 256, 13, 13, 384, 3, pad=1, bias=True)
    assert shapes["conv4"] == ConvShape(128, 384, 13, 13, 384, 3, pad=1, groups=2, bias=True)
    assert shapes["conv5"] == ConvShape(128, 384, 13, 13, 256, 3, pad=1, groups=2, bias=True)
    assert [s.output_shape[2] for s in shapes.values()] == [55, 27, 13, 13, 13]
    params = spec.parameter_shapes()
    assert params["conv2.weight"] == (256, 48, 5, 5) and params["fc6.weight"] == (4096, 9216)
    assert params["fc8.bias"] == (1000,)
    assert spec.trace(2)[-1][2] == (2, 1000)
    pool5 = [out for layer, _, out in spec.trace(2) if layer.describe().startswith("max-pool")]
    assert pool5 == [(2, 96, 27, 27), (2, 256, 13, 13), (2, 256, 6, 6)]


def test_unknown_model_lists_valid_names():
    with pytest.raises(ConvlabError, match="ece408-high, ece408-low, ece408, alexnet"):
        get_model("vgg")


def test_alexnet_random_weights_are_deterministic_and_he_scaled():
    w = load_weights("alexnet")
    assert w.meta["source"].startswith("random")
    for key, shape in w.spec.parameter_shapes().items():
        assert w.arrays[key].shape == shape and w.arrays[key].dtype == np.float32
    again = random_weights.__wrapped__("alexnet")  # a fresh generation, not the cached one
    np.testing.assert_array_equal(again.arrays["conv3.weight"], w.arrays["conv3.weight"])
    assert abs(w.arrays["fc6.weight"].std() - np.sqrt(2 / 9216)) < 0.01 * np.sqrt(2 / 9216)
    other = random_weights.__wrapped__("alexnet", seed=1)
    assert not np.array_equal(other.arrays["conv1.weight"], w.arrays["conv1.weight"])


def test_alexnet_weights_file_missing_says_how_to_import(tmp_path):
    with pytest.raises(DataError, match="convlab import-weights"):
        load_weights("alexnet", tmp_path / "nope.npz")


@pytest.mark.parametrize("name", SHIPPED)
def test_weights_load_with_metadata(name):
    weights = load_weights(name)
    for key, shape in weights.spec.parameter_shapes().items():
        assert weights.arrays[key].shape == shape and weights.arrays[key].dtype == np.float32
    assert set(weights.expected_accuracy) == set(ACCURACY_BATCHES)
    assert weights.meta["recipe"]["seed"] == 408
    assert weights.meta["layers"] == weights.spec.describe()


def test_trained_accuracy_targets():
    acc = {name: load_weights(name).expected_accuracy[10000] for name in SHIPPED}
    assert acc["ece408-high"] >= 0.88
    assert acc["ece408"] >= 0.87
    assert acc["ece408-low"] < acc["ece408-high"] - 0.15


@pytest.mark.slow
@pytest.mark.parametrize("name", SHIPPED)
def test_cpu_reference_reproduces_stored_accuracy(name):
    """The float32 forward pass, run at each batch size, gives exactly the stored accuracies.

    Exact agreement is a consequence, not luck: no image's two largest float64 probabilities
    are closer than 1e-5 of the larger (checked here), while float32 arithmetic in any
    summation order (any BLAS, any CPU) moves them by well under that."""
    weights = load_weights(name)
    images, labels = data.load_test_set()
    x = data.prepare_input(images, weights.spec.input_size)
    probs = reference.forward(weights, x, dtype=np.float64)
    top2 = np.sort(probs, axis=1)[:, -2:]
    assert np.all(top2[:, 1] - top2[:, 0] > 1e-5 * top2[:, 1])
    for n in ACCURACY_BATCHES:
        predictions = reference.predict(weights, x[:n])
        np.testing.assert_array_equal(predictions, weights.reference_predictions[:n])
        assert float((predictions == labels[:n]).mean()) == weights.expected_accuracy[n]


def _copy_with(tmp_path, name, mutate):
    weights = load_weights(name)
    arrays = dict(weights.arrays)
    meta = {k: v for k, v in weights.meta.items() if k not in ("format", "model")}
    mutate(arrays, meta)
    path = tmp_path / f"{name}.npz"
    save_weights(path, weights.spec, arrays, meta)
    return path


def test_weights_with_wrong_shape_are_rejected(tmp_path):
    path = _copy_with(tmp_path, "ece408", lambda a, m: a.update({"fc2.bias": np.zeros(9, np.float32)}))
    with pytest.raises(DataError, match=r"'fc2.bias' has shape \(9,\), expected \(10,\)"):
        load_weights("ece408", path)


def test_weights_with_missing_array_are_rejected(tmp_path):
    path = _copy_with(tmp_path, "ece408", lambda a, m: a.pop("conv2.weight"))
    with pytest.raises(DataError, match="missing array 'conv2.weight'"):
        load_weights("ece408", path)


def test_weights_with_nan_are_rejected(tmp_path):
    def poison(arrays, meta):
        w = arrays["fc1.weight"].copy()
        w[0, 0] = np.nan
        arrays["fc1.weight"] = w
    with pytest.raises(DataError, match="non-finite"):
        load_weights("ece408", _copy_with(tmp_path, "ece408", poison))


def test_corrupt_weights_file(tmp_path):
    path = tmp_path / "ece408.npz"
    path.write_bytes(weights_path("ece408").read_bytes()[:5000])
    with pytest.raises(DataError, match="corrupt .npz archive"):
        load_weights("ece408", path)


def test_weights_for_another_model_are_rejected(tmp_path):
    path = tmp_path / "x.npz"
    path.write_bytes(weights_path("ece408-low").read_bytes())
    with pytest.raises(DataError, match="model 'ece408-low', expected format 1 model 'ece408-high'"):
        load_weights("ece408-high", path)


def test_weights_file_round_trips_metadata(tmp_path):
    path = _copy_with(tmp_path, "ece408-low", lambda a, m: m.update({"note": "x"}))
    with zipfile.ZipFile(path) as z:
        assert "meta.npy" in z.namelist()
    assert json.loads(json.dumps(load_weights("ece408-low", path).meta))["note"] == "x"
