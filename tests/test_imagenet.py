"""ImageNet input and output: class names, image preprocessing, top-5, `convlab classify`."""

import json
import sys

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image
from rich.console import Console

from convlab.bench import lab
from convlab.cli import main
from convlab.errors import ConvlabError, DataError
from convlab.models import get_model, random_weights, save_weights
from convlab.net import imagenet
from convlab.oracle import reference

SPEC = get_model("alexnet")
B_MEAN, G_MEAN, R_MEAN = 104.00698793, 116.66876762, 122.67891434


def write_png(path, pixels: np.ndarray):
    Image.fromarray(np.asarray(pixels, dtype=np.uint8), "RGB").save(path)
    return path


def solid(width, height, rgb) -> np.ndarray:
    return np.broadcast_to(np.array(rgb, np.uint8), (height, width, 3))


# --- class names ------------------------------------------------------------------------------

def test_thousand_classes_in_ilsvrc_order():
    classes = imagenet.classes()
    assert len(classes) == 1000
    wnids = [c.wnid for c in classes]
    assert len(set(wnids)) == 1000 and wnids == sorted(wnids)
    assert all(c.wnid.startswith("n") and len(c.wnid) == 9 for c in classes)
    assert [c.index for c in classes] == list(range(1000))
    known = {0: "tench, Tinca tinca", 1: "goldfish, Carassius auratus", 281: "tabby, tabby cat",
             285: "Egyptian cat", 340: "zebra",
             999: "toilet tissue, toilet paper, bathroom tissue"}
    for index, name in known.items():
        assert classes[index].name == name


# --- preprocessing ----------------------------------------------------------------------------

def test_pure_red_image_becomes_bgr_minus_the_mean(tmp_path):
    x = imagenet.load_image(write_png(tmp_path / "red.png", solid(300, 260, (255, 0, 0))))
    assert x.shape == (3, 227, 227) and x.dtype == np.float32 and x.flags.c_contiguous
    np.testing.assert_allclose(x[0], 0 - B_MEAN, atol=1e-4)  # blue first
    np.testing.assert_allclose(x[1], 0 - G_MEAN, atol=1e-4)
    np.testing.assert_allclose(x[2], 255 - R_MEAN, atol=1e-4)  # red last


def test_mean_subtraction_per_channel(tmp_path):
    x = imagenet.load_image(write_png(tmp_path / "grey.png", solid(256, 256, (10, 200, 90))))
    np.testing.assert_allclose(x.reshape(3, -1).mean(axis=1),
                               [90 - B_MEAN, 200 - G_MEAN, 10 - R_MEAN], atol=1e-4)


def test_crop_is_centred(tmp_path, rng):
    """A 256x256 image needs no resize: the crop is rows and columns 14..240."""
    pixels = rng.integers(0, 256, size=(256, 256, 3), dtype=np.uint8)
    x = imagenet.load_image(write_png(tmp_path / "noise.png", pixels))
    expected = pixels[14:241, 14:241, ::-1].astype(np.float32) - imagenet.MEAN_BGR
    np.testing.assert_array_equal(x, expected.transpose(2, 0, 1))


def band_image(width, height, horizontal: bool) -> np.ndarray:
    """Black, with a white band 100 px wide across the middle of the long side."""
    pixels = np.zeros((height, width, 3), np.uint8)
    if horizontal:
        pixels[height // 2 - 50:height // 2 + 50] = 255
    else:
        pixels[:, width // 2 - 50:width // 2 + 50] = 255
    return pixels


@pytest.mark.parametrize("width, height", [(600, 300), (300, 600)])
def test_short_side_resized_to_256_then_centre_cropped(tmp_path, width, height):
    """Scaling the short side 300 -> 256 narrows the 100 px band to 85 px, centred in the crop."""
    landscape = width > height
    path = write_png(tmp_path / "band.png", band_image(width, height, horizontal=not landscape))
    x = imagenet.load_image(path)
    assert x.shape == (3, 227, 227)
    green = x[1] + G_MEAN
    profile = green.mean(axis=0) if landscape else green.mean(axis=1)  # across the long side
    white = np.flatnonzero(profile > 127.5)
    assert abs(len(white) - 100 * 256 / 300) <= 1.5
    assert abs((white[0] + white[-1]) / 2 - 113) <= 1


def test_small_image_is_scaled_up(tmp_path):
    x = imagenet.load_image(write_png(tmp_path / "tiny.png", solid(40, 30, (0, 255, 0))))
    assert x.shape == (3, 227, 227)
    np.testing.assert_allclose(x[1], 255 - G_MEAN, atol=1e-4)


def test_grey_and_alpha_images_become_rgb(tmp_path):
    Image.new("L", (260, 260), 77).save(tmp_path / "grey.png")
    Image.new("RGBA", (260, 260), (0, 0, 255, 128)).save(tmp_path / "alpha.png")
    grey = imagenet.load_image(tmp_path / "grey.png")
    np.testing.assert_allclose(grey + imagenet.MEAN_BGR[:, None, None], 77, atol=1e-4)
    alpha = imagenet.load_image(tmp_path / "alpha.png")
    np.testing.assert_allclose(alpha[0] + B_MEAN, 255, atol=1e-4)


def test_jpeg(tmp_path):
    Image.new("RGB", (320, 240), (200, 30, 60)).save(tmp_path / "photo.jpg", quality=95)
    x = imagenet.load_image(tmp_path / "photo.jpg")
    np.testing.assert_allclose(x.reshape(3, -1).mean(axis=1) + imagenet.MEAN_BGR,
                               [60, 30, 200], atol=3)  # JPEG's chroma rounding


# --- .npy input -------------------------------------------------------------------------------

def test_npy_input_is_taken_as_preprocessed(tmp_path, rng):
    batch = rng.standard_normal((2, 3, 227, 227), dtype=np.float32) * 50
    np.save(tmp_path / "batch.npy", batch)
    image = write_png(tmp_path / "red.png", solid(256, 256, (255, 0, 0)))
    x, labels = imagenet.load_inputs([tmp_path / "batch.npy", image], SPEC)
    assert x.shape == (3, 3, 227, 227) and x.dtype == np.float32
    np.testing.assert_array_equal(x[:2], batch)
    assert labels == [f"{tmp_path / 'batch.npy'}[0]", f"{tmp_path / 'batch.npy'}[1]", str(image)]


EXPECTED_INPUT = "must be float32 of shape (N, 3, 227, 227), got "


@pytest.mark.parametrize("array, message", [
    (np.zeros((2, 227, 227, 3), np.float32), EXPECTED_INPUT + "float32 of shape (2, 227, 227, 3)"),
    (np.zeros((3, 227, 227), np.float32), EXPECTED_INPUT + "float32 of shape (3, 227, 227)"),
    (np.zeros((1, 3, 227, 227), np.float64), EXPECTED_INPUT + "float64 of shape (1, 3, 227, 227)"),
    (np.zeros((0, 3, 227, 227), np.float32), EXPECTED_INPUT + "float32 of shape (0, 3, 227, 227)"),
    (np.full((1, 3, 227, 227), np.nan, np.float32), "holds non-finite values"),
])
def test_bad_npy_input_is_rejected(tmp_path, array, message):
    np.save(tmp_path / "bad.npy", array)
    with pytest.raises(DataError) as info:
        imagenet.load_array(tmp_path / "bad.npy", SPEC.input_shape)
    assert message in str(info.value)


def test_pickled_npy_input_is_not_unpickled(tmp_path):
    np.save(tmp_path / "obj.npy", np.array({"a": 1}, dtype=object), allow_pickle=True)
    with pytest.raises(DataError, match="not a readable numeric .npy array"):
        imagenet.load_array(tmp_path / "obj.npy", SPEC.input_shape)


def test_bad_image_files(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        imagenet.load_image(tmp_path / "missing.png")
    (tmp_path / "notes.png").write_text("not a picture")
    with pytest.raises(DataError, match="not an image Pillow can read"):
        imagenet.load_image(tmp_path / "notes.png")
    good = write_png(tmp_path / "good.png", solid(300, 300, (1, 2, 3)))
    (tmp_path / "cut.png").write_bytes(good.read_bytes()[:60])
    with pytest.raises(DataError, match="cannot decode the image"):
        imagenet.load_image(tmp_path / "cut.png")
    with pytest.raises(DataError, match="is a directory"):
        imagenet.load_image(tmp_path)


def test_without_pillow_images_fail_with_the_install_hint(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(ConvlabError, match=r'pip install -e "\.\[image\]"'):
        imagenet.load_image(tmp_path / "any.png")


# --- top-5 ------------------------------------------------------------------------------------

def test_top_classes_order_and_ties():
    p = np.full((2, 1000), 1e-4, np.float32)
    p[0, [340, 7, 999, 281, 285]] = [0.5, 0.2, 0.1, 0.05, 0.05]
    p[1, 0] = 0.9
    top = imagenet.top_classes(p)
    assert [q.cls.index for q in top[0]] == [340, 7, 999, 281, 285]
    assert top[0][0].cls.name == "zebra" and top[0][0].probability == pytest.approx(0.5)
    assert [q.cls.index for q in top[1]] == [0, 1, 2, 3, 4]  # ties: lower index first
    with pytest.raises(ValueError):
        imagenet.top_classes(np.zeros((2, 10)))


def test_table_shows_long_class_names_whole_at_80_columns():
    p = np.full((1, 1000), 1e-4)
    p[0, 412] = 0.6  # "ashcan, trash can, garbage can, wastebin, ash bin, ..." (98 characters)
    item = imagenet.Classified("an/image/path.jpg", imagenet.top_classes(p)[0])
    console = Console(width=80, record=True)
    console.print(imagenet.predictions_table(item, 80))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    words = " ".join(text.split())
    for word in imagenet.classes()[412].name.split():
        assert word in words
    assert "…" not in text and "0.6000" in text


def test_as_dict():
    p = np.zeros((1, 1000))
    p[0, 285] = 1.0
    entry = imagenet.Classified("cat.jpg", imagenet.top_classes(p)[0]).as_dict()
    assert entry["input"] == "cat.jpg"
    assert entry["top"][0] == {"rank": 1, "index": 285, "wnid": "n02124075",
                               "name": "Egyptian cat", "probability": 1.0}
    assert [t["rank"] for t in entry["top"]] == [1, 2, 3, 4, 5]


# --- the command ------------------------------------------------------------------------------

def row_probabilities(x: np.ndarray) -> np.ndarray:
    """A stand-in for the network: each row's own softmax of its first 1000 input values,
    computed in float64, so the expected classes follow from the input alone."""
    z = x.reshape(len(x), -1)[:, :1000].astype(np.float64) / 20
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture
def cpu_infer(monkeypatch, no_gpu):
    """lab.infer replaced by row_probabilities; records how it was called."""
    calls = []

    def infer(weights, kernel, x):
        calls.append((weights.spec.name, kernel, x.shape, x.dtype, weights.meta["source"]))
        return row_probabilities(x)

    monkeypatch.setattr(lab, "infer", infer, raising=False)
    return calls


def test_classify_json(tmp_path, rng, cpu_infer):
    batch = rng.standard_normal((2, 3, 227, 227), dtype=np.float32) * 50
    np.save(tmp_path / "batch.npy", batch)
    image = write_png(tmp_path / "red.png", solid(256, 300, (255, 0, 0)))
    result = CliRunner().invoke(main, ["classify", "--json", str(tmp_path / "batch.npy"),
                                       str(image)])
    assert result.exit_code == 0, result.output
    assert cpu_infer == [("alexnet", "cpu", (3, 3, 227, 227), np.float32,
                          random_weights("alexnet").meta["source"])]
    entries = json.loads(result.stdout)
    assert [e["input"] for e in entries] == [f"{tmp_path / 'batch.npy'}[0]",
                                             f"{tmp_path / 'batch.npy'}[1]", str(image)]
    expected = row_probabilities(batch)
    for entry, probs in zip(entries, expected):
        top = np.argsort(-probs, kind="stable")[:5]
        assert [t["index"] for t in entry["top"]] == list(top)
        assert [t["name"] for t in entry["top"]] == [imagenet.classes()[i].name for i in top]
        assert [t["probability"] for t in entry["top"]] == [float(probs[i]) for i in top]
    assert "random weights" in result.stderr and "--weights" in result.stderr
    assert "no usable GPU" in result.stderr


def test_classify_end_to_end_on_the_cpu(tmp_path, rng, no_gpu):
    """The real forward pass (lab.infer, --kernel cpu) against the float64 reference."""
    pixels = rng.integers(0, 256, size=(240, 320, 3), dtype=np.uint8)
    image = write_png(tmp_path / "noise.png", pixels)
    result = CliRunner().invoke(main, ["classify", "--kernel", "cpu", "--json", str(image)])
    assert result.exit_code == 0, result.output
    top = json.loads(result.stdout)[0]["top"]
    expected = reference.forward(random_weights("alexnet"), imagenet.load_image(image)[None],
                                 dtype=np.float64)[0]
    assert top[0]["index"] == int(expected.argmax())
    # float32 against float64 through eight layers: differences of order 1e-6 relative
    assert top[0]["probability"] == pytest.approx(expected.max(), rel=1e-3, abs=1e-6)
    assert sorted(t["probability"] for t in top)[::-1] == [t["probability"] for t in top]


def test_classify_table_with_weights_and_kernel(tmp_path, rng, cpu_infer, monkeypatch):
    weights_file = tmp_path / "alexnet.npz"
    monkeypatch.setattr(np, "savez_compressed", np.savez)  # compressing 233 MB takes 10 s
    save_weights(weights_file, SPEC, random_weights("alexnet").arrays, {"source": "test file"})
    np.save(tmp_path / "one.npy", rng.standard_normal((1, 3, 227, 227), dtype=np.float32))
    result = CliRunner().invoke(main, ["classify", "--kernel", "cpu", "--weights",
                                       str(weights_file), str(tmp_path / "one.npy")])
    assert result.exit_code == 0, result.output
    assert cpu_infer[0][1] == "cpu" and cpu_infer[0][4] == "test file"
    assert "random weights" not in result.output and "no usable GPU" not in result.output
    lines = result.stdout.splitlines()
    assert lines[0] == f"{tmp_path / 'one.npy'}[0]" and "probability" in result.stdout
    assert sum(1 for line in lines if line.strip("│ ").startswith(("1 ", "2 ", "3 ", "4 ", "5 "))) == 5



def test_classify_names_hidden_columns_and_has_the_wide_it_points_to(tmp_path, rng, cpu_infer):
    np.save(tmp_path / "one.npy", rng.standard_normal((1, 3, 227, 227), dtype=np.float32))
    args = ["classify", "--kernel", "cpu", str(tmp_path / "one.npy")]
    narrow = CliRunner().invoke(main, args, env={"COLUMNS": "40"})
    assert narrow.exit_code == 0, narrow.output
    text = " ".join(narrow.output.split())  # the note wraps wherever the column names end
    assert "hidden:" in text and "--wide shows" in text
    wide = CliRunner().invoke(main, args + ["--wide"], env={"COLUMNS": "40"})
    assert wide.exit_code == 0, wide.output
    assert "WordNet id" in wide.output and "hidden:" not in wide.output

def missing_file(folder):
    return folder / "missing.jpg"


def text_file(folder):
    (folder / "text.jpg").write_text("hello")
    return folder / "text.jpg"


def channel_last_npy(folder):
    np.save(folder / "hwc.npy", np.zeros((1, 227, 227, 3), np.float32))
    return folder / "hwc.npy"


@pytest.mark.parametrize("make, message", [
    (missing_file, "missing.jpg: no such file"),
    (text_file, "text.jpg: not an image Pillow can read"),
    (channel_last_npy, "preprocessed input must be float32 of shape (N, 3, 227, 227), got "
                       "float32 of shape (1, 227, 227, 3)"),
])
def test_classify_errors_are_one_line(tmp_path, cpu_infer, make, message):
    result = CliRunner().invoke(main, ["classify", "--json", str(make(tmp_path))])
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    assert result.stdout == "" and cpu_infer == []
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and message in lines[0]


def test_classify_without_pillow(tmp_path, cpu_infer, monkeypatch):
    monkeypatch.setitem(sys.modules, "PIL", None)
    result = CliRunner().invoke(main, ["classify", str(tmp_path / "photo.jpg")])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert 'pip install -e ".[image]"' in result.output


def test_classify_refuses_a_fashion_mnist_model(tmp_path, cpu_infer):
    np.save(tmp_path / "x.npy", np.ones((1, 1, 28, 28), np.float32))
    result = CliRunner().invoke(main, ["classify", "--model", "ece408-high", str(tmp_path / "x.npy")])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "classify takes --model alexnet" in result.output


def test_probability_format():
    assert imagenet.format_probability(0.61234) == "0.6123"
    assert imagenet.format_probability(0.001) == "0.0010"
    assert imagenet.format_probability(3.2e-7) == "3.2e-07"
    assert imagenet.format_probability(0.0) == "0.0000"


@pytest.mark.gpu
def test_classify_on_the_gpu_matches_the_reference(tmp_path, rng):
    """The default (GPU) kernel through the whole command, against the float64 reference."""
    paths = [write_png(tmp_path / f"noise{i}.png",
                       rng.integers(0, 256, size=(260 + 40 * i, 300, 3), dtype=np.uint8))
             for i in range(2)]
    result = CliRunner().invoke(main, ["classify", "--json", *map(str, paths)])
    assert result.exit_code == 0, result.output
    x = np.stack([imagenet.load_image(p) for p in paths])
    expected = reference.forward(random_weights("alexnet"), x, dtype=np.float64)
    for entry, probs in zip(json.loads(result.stdout), expected):
        assert entry["top"][0]["index"] == int(probs.argmax())
        assert entry["top"][0]["probability"] == pytest.approx(probs.max(), rel=1e-3, abs=1e-6)
