"""A timed `convlab run` on disk (`run --save DIR`): one JSON record holding every batch's run,
with a markdown twin, read back by `convlab results show`. The README's forward-pass figures
quote these records, so a record keeps what a reader needs to trust one: the command, the
device, the commit, every layer's check and each PyTorch candidate beside ours."""

from __future__ import annotations

import re
import time
from pathlib import Path

from .. import __version__
from ..errors import ConvlabError
from . import results as results_io
from .records import FailedRun, RunResult

KIND = "run"
SCHEMA_VERSION = 1


def images_per_s(result: RunResult) -> float | None:
    """Images a second through the device-resident forward pass."""
    if not result.forward_ms:
        return None
    return result.batch / (result.forward_ms / 1e3)


def _run_dict(result: RunResult | FailedRun) -> dict:
    d = result.as_dict()
    if isinstance(result, RunResult):
        d["images_per_s"] = images_per_s(result)
    return d


def to_record(results: list[RunResult | FailedRun], command: str = "") -> dict:
    return {"kind": KIND, "schema_version": SCHEMA_VERSION, "convlab_version": __version__,
            "git_commit": results_io.git_commit(),
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": command,
            "runs": [_run_dict(r) for r in results]}


def runs(record: dict) -> list[RunResult | FailedRun]:
    """The runs a record holds, as the lab returned them."""
    return [FailedRun.from_dict(d) if "status" in d else RunResult.from_dict(d)
            for d in record["runs"]]


def record_name(record: dict) -> str:
    first = record["runs"][0]
    batches = "-".join(str(d["batch"]) for d in record["runs"])
    stamp = record["timestamp"][:19].replace(":", "").replace("-", "")
    kernel = re.sub(r"[^\w.-]", "_", first["kernel"])  # a kernel file's name is the user's
    return f"run-{first['model']}-{kernel}-b{batches}-{stamp}"


def save(record: dict, folder: Path, markdown: str) -> tuple[Path, Path]:
    """The record and its markdown under `folder`: both, whole, or neither."""
    try:
        return results_io.save(record, folder, markdown, record_name(record))
    except OSError as exc:
        raise ConvlabError(f"cannot save the record in {folder} "
                           f"({exc.strerror or exc})") from None


def load_record(path: Path) -> dict:
    """A saved run record, checked to read back; one DataError naming the file otherwise."""
    return results_io.load_kind(path, KIND, SCHEMA_VERSION, _parse)


def _parse(record: dict) -> None:
    if not runs(record):
        raise ValueError("it holds no runs")
    record_name(record)
