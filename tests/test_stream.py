"""The streamed run's pieces that need no GPU: the host normalisation the ingest kernel must
match, the ingest kernel's compilation, the image pool, the stream arithmetic, the record's
tables and files, and every bad input of `run --images` ending in one line."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from click.testing import CliRunner

from convlab.bench import streaming
from convlab.errors import ConvlabError
from convlab.cli import main
from convlab.gpu.jit import build_options, compile_cubin
from convlab.net import data, imagenet
from convlab.net.stream import SLOTS, BatchTimes, ImagePool, PinnedBatches, StreamTimes
from convlab.ops import ingest
from convlab import stream_report


def test_alexnet_normalisation_is_the_float32_bgr_mean_subtraction():
    rng = np.random.default_rng(3)
    u = rng.integers(0, 256, (3, 227, 227, 3), dtype=np.uint8)
    x = ingest.normalize(u, imagenet.imagenet_transform())
    expected = (u.astype(np.float32)[..., ::-1] - imagenet.MEAN_BGR).transpose(0, 3, 1, 2)
    assert x.dtype == np.float32
    np.testing.assert_array_equal(x, expected)


def test_fashion_normalisation_upsamples_in_a_fixed_order():
    images, _ = data.load_test_set(50)
    x = ingest.normalize(images, data.fashion_transform(48))
    assert x.shape == (50, 1, 48, 48)
    # the two-tap rows-then-columns formula, written out independently
    lo, hi, wl, wh = ingest.bilinear_taps(48, 28)
    v = images.astype(np.float64) / 255.0
    expected = np.empty((50, 48, 48))
    for i in range(48):
        row = wl[i] * v[:, lo[i], :] + wh[i] * v[:, hi[i], :]
        for j in range(48):
            expected[:, i, j] = wl[j] * row[:, lo[j]] + wh[j] * row[:, hi[j]]
    np.testing.assert_array_equal(x[:, 0], expected.astype(np.float32))
    np.testing.assert_array_equal(ingest.normalize(images, data.fashion_transform(28))[:, 0],
                                  (images / 255.0).astype(np.float32))


def test_bilinear_taps_clamp_at_the_edges():
    lo, hi, wl, wh = ingest.bilinear_taps(48, 28)
    assert lo.min() == 0 and hi.max() == 27
    np.testing.assert_array_equal(wl + wh, 1.0)
    assert wh[-1] == 0.0 and lo[-1] == hi[-1] == 27


def test_source_channels_pad_each_group():
    transform = imagenet.imagenet_transform()
    src = ingest.source_channels(transform, ingest.Target(4, True, "fp16"), 1)
    assert src.tolist() == [0, 1, 2, -1]
    two = ingest.InputTransform((5, 5, 4), 5, (0, 1, 2, 3), (0,) * 4, (1,) * 4)
    assert ingest.source_channels(two, ingest.Target(8, True, "fp32"), 2).tolist() == [
        0, 1, -1, -1, 2, 3, -1, -1]


def test_target_reads_layout_and_type():
    nchw = np.empty((2, 4, 5, 5), np.float16)
    nhwc = np.empty((2, 5, 5, 4), np.uint16).transpose(0, 3, 1, 2)
    assert ingest.Target.of(nchw) == ingest.Target(4, False, "fp16")
    assert ingest.Target.of(nhwc) == ingest.Target(4, True, "bf16")
    assert ingest.Target.of(np.empty((2, 1, 5, 5), np.float32)) == ingest.Target(1, False, "fp32")


@pytest.mark.parametrize("transform, target", [
    (data.fashion_transform(48), ingest.Target(1, False, "fp32")),
    (data.fashion_transform(28), ingest.Target(1, False, "fp16")),
    (imagenet.imagenet_transform(), ingest.Target(4, True, "fp16")),
    (imagenet.imagenet_transform(), ingest.Target(4, True, "bf16")),
    (imagenet.imagenet_transform(), ingest.Target(3, False, "fp32")),
])
def test_ingest_kernel_compiles(transform, target):
    options = build_options(ingest.defines(transform, target))
    assert compile_cubin("ops.ingest", ingest.SOURCE, options)


@pytest.mark.parametrize("workers", [1, 3])
def test_pool_fill_wraps_around_the_images(workers):
    images = np.arange(5 * 2 * 2, dtype=np.uint8).reshape(5, 2, 2)
    pool = ImagePool(images, None, "test")
    out = np.empty((7, 2, 2), np.uint8)
    with ThreadPoolExecutor(workers) as threads:
        pool.fill(out, 3, images, threads, workers)
    np.testing.assert_array_equal(out, images[[3, 4, 0, 1, 2, 3, 4]])
    assert pool.indices(4, 3).tolist() == [4, 0, 1]


@pytest.mark.parametrize("size, gathered", [(6, []), (5, [2]), (3, [1, 4]), (2, [])])
def test_batches_are_read_from_the_pinned_dataset_unless_they_wrap(size, gathered):
    images = np.arange(size * 2, dtype=np.uint8).reshape(size, 2)
    buffers = [np.full((2, 2), 255, np.uint8) for _ in range(SLOTS)]
    with ThreadPoolExecutor(2) as threads:
        batches = PinnedBatches(ImagePool(images, None, "test"), images, buffers, np.asarray,
                                threads, 2)
        for i in range(5):
            batches.load(i, i % SLOTS)
            filled = batches.read[i % SLOTS] is buffers[i % SLOTS]
            assert filled == (i in gathered)
            np.testing.assert_array_equal(batches.read[i % SLOTS],
                                          images[(2 * i + np.arange(2)) % size])
            assert np.shares_memory(batches.read[i % SLOTS], images) != filled


def test_random_images_do_not_depend_on_thread_count():
    transform = imagenet.imagenet_transform()
    one = streaming.random_pool(transform, 3, 1).images
    many = streaming.random_pool(transform, 3, 4).images
    np.testing.assert_array_equal(one, many)
    assert one.dtype == np.uint8 and one.shape == (3, 227, 227, 3)
    assert not np.array_equal(one[0], one[1])


def test_stream_times_ratio_is_time_per_batch_over_the_slower_part():
    batches = [BatchTimes(i, i % 2, 0.1, (i, i + 1.0), (i + 1, i + 3.0), (i + 3, i + 3.1))
               for i in range(4)]
    times = StreamTimes(128, 512, "uint8", 10.0, 1.0, 2.0, 1000, batches)
    assert times.batch_ms == 2.5
    assert times.ratio == pytest.approx(1.25)
    assert times.images_per_s == pytest.approx(51200)
    row = times.as_dict()
    assert row["stream_forward_ms"] == 2.0 and row["stream_copy_ms"] == 1.0
    assert len(row["timeline"]) == 4 and row["timeline"][1]["copy"] == (1, 2.0)


@pytest.mark.parametrize("name, folder", [("NVIDIA H100 80GB HBM3", "h100"),
                                          ("NVIDIA H200", "h200"),
                                          ("NVIDIA GeForce RTX 4090", "rtx-4090"),
                                          ("NVIDIA A100-SXM4-80GB", "a100")])
def test_gpu_folder(name, folder):
    assert streaming.gpu_folder(name) == folder


def synthetic_record(batches=(128, 1024), count=12):
    record = streaming.StreamRecord("alexnet", "wgmma-fp16", "fp16", 12288, "uint8",
                                    "seeded", 16, device={"name": "NVIDIA H100 80GB HBM3"},
                                    command="convlab run --images 12288")
    for b in batches:
        timeline = [BatchTimes(i, i % 2, 0.5, (i * 2.0, i * 2.0 + 1), (i * 2.0 + 1, i * 2.0 + 3),
                               (i * 2.0 + 3, i * 2.0 + 3.01)) for i in range(count)]
        row = StreamTimes(b, 12288, "uint8", 2.0 * count + 1, 1.0, 2.0, b * 154587,
                          timeline).as_dict()
        row.update({"float32_differ": 0, "float32_max_prob_diff": 0.0})
        record.rows.append(row)
    return record


def test_stream_tables_fit_80_columns(capsys):
    from rich.console import Console

    out = Console(width=80, file=None, force_terminal=False)
    with out.capture() as cap:
        stream_report.render(out, synthetic_record(), wide=False)
    text = cap.get()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "images/s" in text and "per-batch profile" in text and "..." in text
    assert "the same predictions as the float32 path" in " ".join(text.split())


def test_stream_record_saves_json_and_markdown(tmp_path):
    record = synthetic_record()
    json_path, md_path = streaming.save(record, tmp_path / "h100",
                                        stream_report.markdown(record))
    assert json_path.name.startswith("stream-alexnet-wgmma-fp16-uint8-")
    import json

    saved = json.loads(json_path.read_text())
    assert [r["batch"] for r in saved["rows"]] == [128, 1024]
    assert {"batch", "images_per_s", "copy_ms", "forward_ms", "ratio"} <= set(saved["rows"][0])
    assert "| 1024 |" in md_path.read_text()
    assert sorted(p.name for p in (tmp_path / "h100").iterdir()) == sorted(
        [json_path.name, md_path.name])


def test_a_failed_check_fails_the_record():
    record = synthetic_record(batches=(128,))
    assert record.passed
    record.rows[0]["float32_differ"] = 1
    assert not record.passed


@pytest.mark.parametrize("args, message", [
    (["--batch", "128", "--images", "64"], "--images 64 is smaller than --batch 128"),
    (["--batch", "128", "--images", "1000"], "not a whole number of batches of 128 (use 896 or 1024)"),
    (["--batch", "128", "--upload", "uint8"], "--upload goes with --images"),
    (["--batch", "128", "--images", "256", "--cold"], "leave out --cold"),
])
def test_bad_stream_options_end_in_one_line(args, message, tmp_path):
    result = CliRunner().invoke(main, ["run", "--model", "alexnet", *args])
    assert result.exit_code != 0
    assert message in result.output
    assert "Traceback" not in result.output


def test_bad_image_folders_end_in_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "notes.txt").write_text("not an image")
    runner = CliRunner()
    for folder, message in ((empty, "no image files in it"), (junk, "notes.txt: not an image"),
                            (tmp_path / "missing", "not a directory")):
        result = runner.invoke(main, ["run", "--model", "alexnet", "--batch", "1", "--images",
                                      "2", "--image-dir", str(folder)])
        assert result.exit_code == 1, result.output
        assert message in result.output
        assert "Traceback" not in result.output
    assert not (tmp_path / "results").exists()


def test_streams_need_a_gpu(no_gpu, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["run", "--model", "ece408", "--batch", "1000",
                                       "--images", "2000"])
    assert result.exit_code == 1
    assert "no usable GPU" in result.output
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("args, message", [
    (["--batch", "1", "--images", "100001"], "is 100,001 batches; a stream times at most 100,000"),
    (["--batch", "128", "--images", "256", "--pytorch", "--upload", "float32"],
     "--pytorch streams 8-bit images"),
    (["--batch", "128", "--images", "256", "--verify", "sample"], "leave out --verify"),
])
def test_more_bad_stream_options_end_in_one_line(args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["run", "--model", "alexnet", *args])
    assert result.exit_code == 1, result.output
    assert message in result.output and "Traceback" not in result.output


def test_unwritable_outputs_are_refused_before_the_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    runner = CliRunner()
    for extra, message in ((["--save", "afile"], "'afile' is a file"),  # click's own check
                           (["--save", "afile/sub"], "afile/sub: cannot be a folder here"),
                           (["--plot", "afile/t.png"], "afile/t.png: cannot be a file here")):
        result = runner.invoke(main, ["run", "--model", "ece408", "--batch", "1000", "--images",
                                      "2000", *extra])
        assert result.exit_code in (1, 2), result.output
        assert message in result.output and "Traceback" not in result.output
        assert "no usable GPU" not in result.output  # refused before anything ran


def test_records_of_the_same_second_keep_both(tmp_path):
    from convlab.bench import results as results_io

    first = results_io.save({"a": 1}, tmp_path, "# one\n", "stream-x")
    second = results_io.save({"a": 2}, tmp_path, "# two\n", "stream-x")
    assert first[0].name == "stream-x.json" and second[0].name == "stream-x-2.json"
    assert second[1].read_text() == "# two\n" and first[1].read_text() == "# one\n"


def test_a_failed_markdown_write_leaves_no_json(tmp_path, monkeypatch):
    from convlab.bench import results as results_io

    real = results_io.atomic_write

    def failing(path, text):
        if path.suffix == ".md":
            raise OSError(28, "No space left on device")
        real(path, text)

    monkeypatch.setattr(results_io, "atomic_write", failing)
    with pytest.raises(Exception, match="No space left"):
        streaming.save(synthetic_record(), tmp_path, "# md\n")
    assert list(tmp_path.iterdir()) == []


def test_unreadable_folder_and_undecodable_image_end_in_one_line(tmp_path, monkeypatch):
    from pathlib import Path

    from convlab.errors import DataError

    pil = pytest.importorskip("PIL.Image")
    pil.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "a.png")

    def broken(image, size=227):
        raise OSError("corrupt EXIF")

    monkeypatch.setattr(imagenet, "crop_bytes", broken)
    with pytest.raises(DataError, match="a.png: cannot decode the image"):
        streaming.directory_pool(tmp_path, 227, 1)

    def refused(self):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "iterdir", refused)
    with pytest.raises(DataError, match="cannot list the folder"):
        streaming.directory_pool(tmp_path, 227, 1)


def test_writable_outputs_pass_the_check(tmp_path):
    (tmp_path / "old.png").write_bytes(b"x")
    (tmp_path / "results").mkdir()
    for path, what in ((tmp_path / "old.png", "file"), (tmp_path / "new" / "t.png", "file"),
                       (tmp_path / "results", "folder"), (tmp_path / "a" / "b", "folder")):
        streaming.check_writable(path, what)
    with pytest.raises(ConvlabError, match="is a file, not a folder"):
        streaming.check_writable(tmp_path / "old.png", "folder")


def test_results_show_renders_a_saved_stream_record(tmp_path):
    record = synthetic_record()
    json_path, _ = streaming.save(record, tmp_path, stream_report.markdown(record))
    import json

    as_saved = json.loads(json.dumps(record.as_dict()))  # tuples come back as lists
    assert streaming.load_record(json_path).as_dict() == as_saved
    shown = CliRunner().invoke(main, ["results", "show", str(json_path)])
    assert shown.exit_code == 0, shown.output
    assert "12,288 images streamed" in shown.output and "per-batch profile" in shown.output
    md = CliRunner().invoke(main, ["results", "show", "--markdown", str(json_path)])
    assert md.output.startswith("# convlab stream: alexnet")
    broken = tmp_path / "broken.json"
    broken.write_text('{"kind": "stream", "model": "alexnet"}')
    bad = CliRunner().invoke(main, ["results", "show", str(broken)])
    assert bad.exit_code == 1 and "not a readable stream record" in bad.output
    assert "Traceback" not in bad.output


class FakeCuda:
    """cupy.cuda as far as net.stream.drive uses it: events are stamped in record order."""

    def __init__(self):
        self.clock = 0

    def Event(self):
        cuda = self

        class Event:
            at = None

            def record(self, stream):
                cuda.clock += 1
                self.at = cuda.clock

            def synchronize(self):
                assert self.at is not None, "waited on an event never recorded"

        return Event()

    @staticmethod
    def get_elapsed_time(a, b):
        return float(b.at - a.at)


class FakeStream:
    def synchronize(self):
        pass

    def wait_event(self, event):
        assert event.at is not None


class CountingStages:
    """Work done at once where it is enqueued, so a prediction read too late is overwritten."""

    def __init__(self, batch):
        self.batch, self.log = batch, []
        self.dev = [None] * SLOTS
        self.host = [None] * SLOTS

    def load(self, i, slot):
        self.log.append(("load", i))
        self.loaded = i
        return 0.0

    def copy(self, slot):
        self.dev[slot] = self.loaded

    def compute(self, slot):
        self.log.append(("compute", self.dev[slot]))

    def back(self, slot):
        self.host[slot] = np.full(self.batch, self.dev[slot])

    def predictions(self, slot):
        return self.host[slot]


@pytest.mark.parametrize("count", [1, 2, 5])
def test_drive_returns_every_batch_in_order(monkeypatch, count):
    import sys
    import types

    from convlab.net.stream import Streams, drive

    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=FakeCuda()))
    stages = CountingStages(3)
    predictions, batches, wall = drive(stages, Streams(FakeStream(), FakeStream(), FakeStream()),
                                       count)
    np.testing.assert_array_equal(predictions, np.repeat(np.arange(count), 3))
    assert stages.log == [(what, i) for i in range(count) for what in ("load", "compute")]
    assert [b.slot for b in batches] == [i % SLOTS for i in range(count)]
    assert all(b.copy[0] < b.copy[1] <= b.forward[0] < b.forward[1] <= b.back[0] < b.back[1]
               for b in batches)
    assert wall >= 0
