"""`convlab run --images T`: a model fed a stream of 8-bit images in batches, each batch's copy
overlapping the pass before it (net.stream), checked and timed per batch size; optionally the
same stream in PyTorch (net.torch_stream). The record is saved as results/<gpu>/stream-....json
and .md."""

from __future__ import annotations

import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import ConvlabError, DataError
from ..gpu import gpu_available, hardware, timer, unavailable_reason
from ..models import FASHION_MNIST, ModelSpec, get_model, load_weights
from ..net import data, torch_forward, torch_stream
from ..net.imagenet import imagenet_transform, load_bytes
from ..net.network import Network
from ..net.stream import UPLOADS, ImagePool, StreamedPipeline
from ..ops.ingest import normalize
from . import results as results_io
from .lab import _variant_for, check_batch, default_kernel, network_plan

RANDOM_SEED = 24  # the seeded generator of alexnet's 8-bit images
FOLDER_HINT = "--image-dir takes a folder of image files only"
# Six CUDA events and a row of the timeline per batch: a stream of more batches is refused.
MAX_STREAM_BATCHES = 100_000
VENDOR_WORDS = {"nvidia", "geforce", "tesla", "quadro"}


def workers_default() -> int:
    return max(1, min(16, os.cpu_count() or 1))


def gpu_folder(name: str) -> str:
    """A short folder name for a GPU: 'NVIDIA H100 80GB HBM3' -> 'h100'."""
    words = [w for w in re.split(r"[\s_]+", name.lower()) if w and w not in VENDOR_WORDS]
    for k, w in enumerate(words):
        if any(ch.isdigit() for ch in w):
            stem = "-".join(words[max(0, k - 1):k + 1] if k and not any(
                ch.isdigit() for ch in words[k - 1]) else [w])
            return re.sub(r"[^a-z0-9-]", "", stem.split("-sxm")[0].split("-pcie")[0]) or "gpu"
    return re.sub(r"[^a-z0-9-]", "", "-".join(words)) or "gpu"


def check_stream(images: int, batch: int) -> None:
    if images < batch:
        raise ConvlabError(f"--images {images} is smaller than --batch {batch}: a stream needs "
                           "at least one full batch")
    if images % batch:
        below, above = images // batch * batch, -(-images // batch) * batch
        raise ConvlabError(f"--images {images} is not a whole number of batches of {batch} "
                           f"(use {below} or {above})")
    if images // batch > MAX_STREAM_BATCHES:
        raise ConvlabError(f"--images {images} at --batch {batch} is {images // batch:,} batches; "
                           f"a stream times at most {MAX_STREAM_BATCHES:,} (a larger --batch, or "
                           "fewer images)")


def random_pool(transform, count: int, workers: int) -> ImagePool:
    """`count` 8-bit images from a seeded generator: image i is the same whatever the count,
    batch size or thread count (its own seed), generated on worker threads."""
    images = np.empty((count, *transform.image_shape), dtype=np.uint8)

    def make(i: int) -> None:
        images[i] = np.random.default_rng([RANDOM_SEED, i]).integers(
            0, 256, transform.image_shape, dtype=np.uint8)

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(make, range(count)))
    return ImagePool(images, None, f"{count} seeded random 8-bit images (seed {RANDOM_SEED})")


def directory_pool(folder: Path, size: int, workers: int) -> ImagePool:
    """Every image file in `folder` (sorted by name), decoded, resized and cropped to 8-bit RGB
    by Pillow on worker threads before the stream starts; a file that is not a readable image
    ends the run with one line naming it."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(f"{folder}: not a directory")
    try:
        files = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    except OSError as exc:
        raise DataError(f"{folder}: cannot list the folder ({exc.strerror or exc})") from None
    if not files:
        raise DataError(f"{folder}: no image files in it")
    with ThreadPoolExecutor(workers) as pool:
        decoded = list(pool.map(lambda p: load_bytes(p, size, FOLDER_HINT), files))
    return ImagePool(np.stack(decoded), None, f"{len(files)} images from {folder}")


@dataclass
class StreamRecord:
    """One `run --images` invocation: a row per batch size."""

    model: str
    kernel: str
    precision: str
    images: int
    upload: str
    source: str
    workers: int
    rows: list[dict] = field(default_factory=list)
    torch_rows: list[dict] = field(default_factory=list)
    torch_note: str = ""
    device: dict | None = None
    timestamp: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    command: str = ""

    @property
    def passed(self) -> bool:
        """The 8-bit path gave the float32 path's predictions, and an fp32 kernel the float64
        reference's (as `run` requires of it)."""
        return all(r["float32_differ"] == 0 and (self.precision != "fp32"
                                                 or r.get("reference_differ", 0) == 0)
                   for r in self.rows)

    def as_dict(self) -> dict:
        return {"kind": "stream", **asdict(self)}

    @classmethod
    def from_dict(cls, d: dict) -> "StreamRecord":
        return cls(**{f.name: d[f.name] for f in fields(cls)})

    def name(self) -> str:
        stamp = self.timestamp[:19].replace(":", "").replace("-", "")
        return f"stream-{self.model}-{self.kernel}-{self.upload}-{stamp}"


def _pool(spec: ModelSpec, transform, count: int, workers: int) -> ImagePool:
    """The images to stream: the Fashion-MNIST test set, or `count` seeded random images."""
    if spec.task == FASHION_MNIST:
        u8, labels = data.load_test_set()
        return ImagePool(u8, labels, f"the {len(u8):,} Fashion-MNIST test images")
    return random_pool(transform, count, workers)


def transform_for(spec: ModelSpec):
    if spec.task == FASHION_MNIST:
        return data.fashion_transform(spec.input_size)
    return imagenet_transform(spec.input_size, spec.preprocessing)


STREAM_ONLY = ("--image-dir", "--upload", "--plot", "--workers")


def check_options(images: int | None, stream_only: dict[str, bool],
                  run_only: dict[str, bool]) -> None:
    """`run`'s options against --images: which belong to a stream and which to a timed run."""
    if images is None:
        given = [name for name, on in stream_only.items() if on]
        if given:
            raise ConvlabError(f"{', '.join(given)} go{'es' if len(given) == 1 else ''} with "
                               "--images (a streamed run)")
        return
    given = [name for name, on in run_only.items() if on]
    if given:
        raise ConvlabError(f"--images streams the dataset and times whole batches: leave out "
                           f"{', '.join(given)}")


def stream(model: str, kernel: str | None, batches: list[int], images: int,
           upload: str = "uint8", directory: Path | None = None, pytorch: bool = False,
           workers: int | None = None, weights_path: Path | None = None,
           on_event: Callable[[str, object], None] | None = None) -> StreamRecord:
    """Stream `images` images through `model` at each batch size; see the module docstring."""
    emit = on_event or (lambda name, payload=None: None)
    spec = get_model(model)
    if upload not in UPLOADS:
        raise ConvlabError(f"--upload {upload}: one of {', '.join(UPLOADS)}")
    if pytorch and upload != "uint8":
        raise ConvlabError("--pytorch streams 8-bit images, as a PyTorch user would: leave out "
                           f"--upload {upload} (or --pytorch)")
    if pytorch:
        torch_forward.check_installed()
    for batch in batches:
        check_batch(batch, spec)
        check_stream(images, batch)
    if directory is not None and spec.task == FASHION_MNIST:
        raise ConvlabError(f"--image-dir reads photos for alexnet; '{model}' streams the "
                           "Fashion-MNIST test set")
    workers = workers or workers_default()
    transform = transform_for(spec)
    emit("loading-data")
    # Files are decoded (and bad ones named) before anything needs the GPU.
    pool = directory_pool(directory, spec.input_size, workers) if directory is not None else None
    if not gpu_available():
        raise ConvlabError(f"--images streams batches through a GPU: no usable GPU "
                           f"({unavailable_reason()})")
    if kernel is None:
        kernel, _ = default_kernel(spec)
    variant = _variant_for(kernel)
    if not variant.on_gpu:
        raise ConvlabError(f"--images streams batches through the GPU; '{variant.name}' runs on "
                           "the CPU")
    networks = [network_plan(spec, variant, batch) for batch in batches]
    if pool is None:
        # two batches of distinct random images: each batch differs from the one before it
        pool = _pool(spec, transform, min(images, 2 * max(batches)), workers)
    emit("loaded-data", pool)
    weights = load_weights(model, weights_path)
    record = StreamRecord(model, variant.name, variant.precision, images, upload,
                          pool.description, workers)
    for plan in networks:
        batch = plan.batch
        network = Network(weights, plan)
        pipe = StreamedPipeline(network, transform, pool, upload, workers)
        try:
            predictions, times = pipe.run(images)
            row = times.as_dict()
            row.update(_checks(network, pipe, pool, weights, predictions, transform))
        finally:
            pipe.close()
        record.rows.append(row)
        emit("row", row)
        if pytorch:
            reason = torch_stream.unavailable_reason()
            if reason:
                record.torch_note = reason
            else:
                emit("pytorch", batch)
                record.torch_rows.append(torch_stream.stream(
                    weights, transform, pool, batch, images, variant.precision,
                    predictions[:batch], workers, timer.TimingPolicy()))
    record.device = hardware.device_info()
    return record


def _checks(network, pipe, pool: ImagePool, weights, predictions: np.ndarray,
            transform) -> dict:
    """The stream's predictions against the float32 path on the same first batch of images
    (they must be equal), and for labelled data against the labels and the weights' float64
    reference predictions."""
    import cupy

    batch = network.batch
    first = pool.images[pool.indices(0, batch)]
    x = cupy.asarray(normalize(first, transform))
    probs32 = network.forward(x).astype(cupy.float32)
    top32 = cupy.asnumpy(probs32.argmax(axis=1))
    probs8 = cupy.asnumpy(network.forward(pipe.device_input(first)).astype(cupy.float32))
    checks = {"float32_differ": int((top32 != predictions[:batch]).sum()),
              "float32_max_prob_diff": float(np.abs(probs8 - cupy.asnumpy(probs32)).max())}
    if pool.labels is not None:
        index = pool.indices(0, len(predictions))
        checks["accuracy"] = float((predictions == pool.labels[index]).mean())
        reference = weights.reference_predictions
        if reference is not None and len(reference) == len(pool.images):
            checks["reference_differ"] = int((predictions != reference[index]).sum())
    return checks


def default_folder(device_name: str) -> Path:
    return Path("results") / gpu_folder(device_name)


def check_writable(path: Path, what: str) -> None:
    """Before a run: `path`, a "folder" to create or fill or a "file" to write, can be written,
    as far as the file system tells now; else one ConvlabError."""
    path = Path(path)
    if path.exists():
        if what == "folder" and not path.is_dir():
            raise ConvlabError(f"{path}: is a file, not a folder for the record")
        if what == "file" and path.is_dir():
            raise ConvlabError(f"{path}: is a folder; give a file name for the plot")
        target = path if what == "folder" else path.parent
    else:
        target = path.parent
        while not target.exists() and target != target.parent:
            target = target.parent
        if not target.is_dir():
            raise ConvlabError(f"{path}: cannot be a {what} here ({target} is a file)")
    if not os.access(target, os.W_OK | os.X_OK):
        raise ConvlabError(f"{path}: cannot write there ({target} is not writable)")


def check_outputs(save_dir: Path | None, plot_path: Path | None) -> None:
    """Before the run: where its record (default results/<gpu>/) and plot will go can be
    written, so a long run does not end in an error."""
    check_writable(save_dir if save_dir is not None else Path("results"), "folder")
    if plot_path is not None:
        check_writable(plot_path, "file")


def load_record(path: Path) -> StreamRecord:
    """A saved stream record, or one DataError naming the file."""
    try:
        return StreamRecord.from_dict(results_io.read_json(path))
    except (KeyError, TypeError, AttributeError) as exc:
        raise DataError(f"{path}: not a readable stream record (missing or malformed "
                        f"{exc})") from None


def save(record: StreamRecord, folder: Path | None, markdown: str) -> tuple[Path, Path]:
    """The record as JSON and markdown under `folder` (default results/<gpu>/): both, whole,
    or neither."""
    if folder is None:
        folder = default_folder((record.device or {}).get("name", "gpu"))
    try:
        return results_io.save(record.as_dict(), folder, markdown, record.name())
    except OSError as exc:
        raise ConvlabError(f"cannot save the record in {folder} "
                           f"({exc.strerror or exc})") from None
