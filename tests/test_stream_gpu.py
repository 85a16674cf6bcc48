"""GPU checks of the 8-bit ingest and the streamed run: the bytes, converted on the device, are
bit for bit what the first conv reads from the float32 path; a stream's predictions are the
float32 path's and (ECE408, fp32) the float64 reference's; the PyTorch stream runs.

Run on a GPU machine with `pytest -m gpu tests/test_stream_gpu.py`.
"""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from convlab.bench import streaming
from convlab.kernels import get_variant
from convlab.models import get_model, load_weights
from convlab.net import data
from convlab.net.network import Network
from convlab.net.plan import plan_network
from convlab.net.stream import StreamedPipeline, ingest_target
from convlab.ops.ingest import normalize

pytestmark = pytest.mark.gpu


def pipeline(model, kernel, batch, pool_images=None, upload="uint8"):
    spec = get_model(model)
    transform = streaming.transform_for(spec)
    if pool_images is None:
        pool = streaming._pool(spec, transform, 2 * batch, 2)
    else:
        pool = streaming.ImagePool(pool_images, None, "test")
    variant = get_variant(kernel)
    if not variant.supports(next(iter(spec.conv_shapes(batch).values()))):
        pytest.skip(f"{kernel} does not run here")
    network = Network(load_weights(model), plan_network(spec, variant, batch))
    return StreamedPipeline(network, transform, pool, upload, workers=2), pool, transform


@pytest.mark.smoke
@pytest.mark.parametrize("model, kernel, direct", [
    ("ece408", "tiled", True),  # float32 NCHW, 28x28 bytes upsampled to 48x48
    ("ece408-high", "fused", True),
    ("alexnet", "channels-last-fp16", True),  # NHWC fp16, 3 channels padded to 4
    ("alexnet", "channels-last-bf16", True),
    ("alexnet", "channels-last", True),  # NHWC float32
    ("alexnet", "pipelined-fp16", True),  # NCHW fp16
    ("alexnet", "implicit-gemm", True),
    ("alexnet", "cudnn-nhwc-fp16", False),  # PyTorch stages it: ingest writes float32 NCHW
])
def test_ingest_writes_what_the_first_conv_reads_from_the_float32_path(model, kernel, direct):
    import cupy

    batch = 8
    pipe, pool, transform = pipeline(model, kernel, batch)
    try:
        images = pool.images[:batch]
        got = pipe.device_input(images)
        assert (ingest_target(pipe.network) is not None) == direct
        x = normalize(images, transform)
        if not direct:  # the float32 input itself, which the conv stages as on the float32 path
            np.testing.assert_array_equal(cupy.asnumpy(got), x)
            return
        first = pipe.network.steps[0].op
        expected = first.stage(cupy.asarray(x))
        assert first.stage(got) is got
        assert got.dtype == expected.dtype and got.shape == expected.shape
        assert got.strides == expected.strides
        np.testing.assert_array_equal(cupy.asnumpy(got).view(np.uint8),
                                      cupy.asnumpy(expected).view(np.uint8))
    finally:
        pipe.close()


@pytest.mark.smoke
@pytest.mark.parametrize("batch", [2000, 3000])  # 3000: batches that wrap the test set's end
def test_ece408_stream_gives_the_reference_predictions(batch):
    images = 12000  # the test set, streamed 1.2 times
    pipe, pool, transform = pipeline("ece408", "tiled", batch)
    try:
        predictions, times = pipe.run(images)
    finally:
        pipe.close()
    reference = load_weights("ece408").reference_predictions
    np.testing.assert_array_equal(predictions, reference[np.arange(images) % 10000])
    assert len(times.batches) == images // batch
    assert [b.index for b in times.batches if b.fill_ms > 0] == [
        i for i in range(images // batch) if i * batch % 10000 + batch > 10000]
    assert times.copy_alone_ms > 0 and times.forward_alone_ms > 0
    assert times.ratio >= 0.95  # a batch cannot take less than its slower part
    for b in times.batches:  # a pass starts after its batch's copy ended
        assert b.forward[0] >= b.copy[1] - 1e-3 and b.back[0] >= b.forward[1] - 1e-3


@pytest.mark.parametrize("kernel", ["channels-last-fp16", "channels-last-3xtf32"])
def test_uint8_and_float32_uploads_predict_the_same(kernel):
    batch, images = 16, 64
    results = {}
    for upload in ("uint8", "float32"):
        pipe, pool, _ = pipeline("alexnet", kernel, batch, upload=upload)
        try:
            results[upload], _ = pipe.run(images)
        finally:
            pipe.close()
    np.testing.assert_array_equal(results["uint8"], results["float32"])


def test_streamed_run_records_and_saves(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main_cli(), ["run", "--model", "ece408-high", "--batch", "1000",
                                             "--images", "3000", "--kernel", "fused"])
    assert result.exit_code == 0, result.output
    saved = list((tmp_path / "results").glob("*/stream-ece408-high-fused-uint8-*.json"))
    assert len(saved) == 1 and saved[0].with_suffix(".md").exists()
    record = json.loads(saved[0].read_text())
    row = record["rows"][0]
    assert row["float32_differ"] == 0 and row["reference_differ"] == 0
    assert row["accuracy"] == pytest.approx(
        (load_weights("ece408-high").reference_predictions
         == data.load_test_set()[1])[np.arange(3000) % 10000].mean())


def test_image_folder_streams(tmp_path):
    pil = pytest.importorskip("PIL.Image")
    rng = np.random.default_rng(5)
    for i in range(3):
        pil.fromarray(rng.integers(0, 256, (300, 260, 3), dtype=np.uint8)).save(tmp_path / f"{i}.png")
    record = streaming.stream("alexnet", "channels-last-fp16", [2], 6, directory=tmp_path,
                              workers=2)
    assert record.source.startswith("3 images from")
    assert record.rows[0]["float32_differ"] == 0


def test_pytorch_stream_runs():
    pytest.importorskip("torch")
    from convlab.net import torch_stream

    if torch_stream.unavailable_reason():
        pytest.skip(torch_stream.unavailable_reason())
    record = streaming.stream("ece408", "tiled", [1000], 3000, pytorch=True, workers=2)
    row = record.torch_rows[0]
    assert "error" not in row, row
    assert row["differ"] <= row["allowed_differ"]
    assert row["images_per_s"] > 0 and len(row["timeline"]) == 3


def main_cli():
    from convlab.cli import main

    return main
