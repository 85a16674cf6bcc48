"""Comparison records on disk: JSON with a schema version, a markdown table beside it, and the
diff of a new record against a baseline."""

from __future__ import annotations

import json
import math
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .. import __version__
from ..errors import DataError
from ..gpu import peaks
from .compare import Comparison, Row, class_summaries, finish

SCHEMA_VERSION = 1


PACKAGE = Path(__file__).resolve().parents[1]


def _git(args: list[str], where: Path) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=where,
                              timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None


def git_commit(package: Path = PACKAGE) -> str | None:
    """HEAD's short hash where `package` is in a git checkout, "-dirty" after it where the
    package's tracked files differ from HEAD: a record then names code that no commit holds
    (a copy of a working tree carries its HEAD, not its changes)."""
    head = _git(["rev-parse", "--short", "HEAD"], package)
    if head is None or head.returncode != 0 or not head.stdout.strip():
        return None
    changed = _git(["diff", "--quiet", "HEAD", "--", "."], package)
    dirty = changed is not None and changed.returncode == 1
    return head.stdout.strip() + ("-dirty" if dirty else "")


def to_record(comparison: Comparison, command: str = "") -> dict:
    return {
        "schema_version": SCHEMA_VERSION,
        "convlab_version": __version__,
        "git_commit": git_commit(),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": command,
        "model": comparison.model,
        "batches": comparison.batches,
        "kernels": comparison.kernels,
        "kernel_files": comparison.kernel_files,
        "device": comparison.device,
        "ceilings": comparison.ceilings,
        "policy": comparison.policy,
        "rows": [row.as_dict() for row in comparison.rows],
        **({"other_gpus": comparison.other_gpus} if comparison.other_gpus else {}),
        **({"interrupted": comparison.interrupted} if comparison.interrupted else {}),
        **({"suite": comparison.suite, "classes": comparison.classes,
            "summary": [c.as_dict() for c in class_summaries(comparison)]}
           if comparison.suite else {}),
    }


def from_record(record: dict) -> Comparison:
    """The comparison a record holds, its floors and speedups derived again by today's rules:
    a record from before a rule changed (cuDNN of the same class as the basis, the arithmetic a
    variant issues as its floor) renders what its legend says."""
    comparison = Comparison(record.get("model"), record["batches"], record["kernels"],
                            [Row.from_dict(r) for r in record["rows"]], record.get("ceilings"),
                            record.get("device"), record.get("policy"),
                            record.get("kernel_files", []),
                            other_gpus=record.get("other_gpus", {}),
                            interrupted=record.get("interrupted", ""),
                            suite=record.get("suite"), classes=record.get("classes", []))
    ceilings = peaks.Ceilings(**comparison.ceilings) if comparison.ceilings else None
    finish(comparison.rows, ceilings)
    return comparison


def atomic_write(path: Path, text: str) -> None:
    """Write via a temporary file in the same folder and rename: readers see all or nothing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.chmod(tmp, 0o644)  # mkstemp's 0600 would make shared result files unreadable to others
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def record_path(path: Path) -> Path:
    """The JSON file of a record: `path`, or for the markdown twin a record is saved with (the
    README links those) the .json beside it."""
    path = Path(path)
    if path.suffix != ".md" or not path.exists():
        return path
    twin = path.with_suffix(".json")
    if not twin.is_file():
        raise DataError(f"{path}: the markdown of a record; convlab reads the record's JSON, "
                        f"{twin.name}, which is not beside it")
    return twin


def read_json(path: Path):
    """A record file's JSON (a markdown twin's JSON); DataError (missing, unreadable, not JSON)
    names the file."""
    path = record_path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: not a readable convlab record ({exc})") from None


def load_kind(path: Path, kind: str, schema_version: int, parse) -> dict:
    """A saved record of `kind` ("run", "profile"), checked: of that kind and schema version,
    and `parse(record)` reads it back; else one DataError naming the file and what is wrong."""
    record = read_json(path)
    if not isinstance(record, dict) or record.get("kind") != kind:
        raise DataError(f"{path}: not a convlab {kind} record (kind is not '{kind}')")
    if record.get("schema_version") != schema_version:
        raise DataError(f"{path}: {kind} record schema version {record.get('schema_version')}; "
                        f"this convlab reads version {schema_version}")
    try:
        parse(record)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise DataError(f"{path}: malformed {kind} record ({type(exc).__name__}: {exc})") from None
    return record


def load_record(path: Path) -> dict:
    record = read_json(path)
    if not isinstance(record, dict) or "schema_version" not in record:
        raise DataError(f"{path}: not a convlab compare record (no schema_version)")
    if record["schema_version"] != SCHEMA_VERSION:
        raise DataError(f"{path}: record schema version {record['schema_version']}; this convlab "
                        f"reads version {SCHEMA_VERSION}")
    try:
        from_record(record)
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(f"{path}: malformed record ({type(exc).__name__}: {exc})") from None
    return record


def record_kind(path: Path) -> str:
    """"profile", "stream" or "run" for a `convlab profile`, `run --images` or `run --save`
    record, else "compare" (checked when it is loaded)."""
    try:
        record = json.loads(record_path(path).read_text())
    except (OSError, ValueError, DataError):
        return "compare"  # load_record gives the clear error
    return record.get("kind", "compare") if isinstance(record, dict) else "compare"


def record_name(record: dict) -> str:
    subject = record["model"]
    if record.get("suite"):
        subject = f"suite-{record['suite']}-{'-'.join(record.get('classes') or ['all'])}"
    elif subject is None:
        shape = record["rows"][0]["shape"] if record["rows"] else {}
        subject = "layer-" + "x".join(str(shape.get(k, "")) for k in ("B", "C", "H", "W", "M", "K"))
        subject += "".join(f"-{k[0]}{shape[k]}" for k, plain in (("stride", 1), ("pad", 0),
                                                                 ("groups", 1))
                           if shape.get(k, plain) != plain)
    stamp = record["timestamp"][:19].replace(":", "").replace("-", "")
    return f"compare-{subject}-{stamp}"


def save(record: dict, folder: Path, markdown: str, name: str | None = None) -> tuple[Path, Path]:
    """The JSON record and its markdown beside it, each written atomically; `name` (default:
    a compare record's name) without the suffix."""
    stem = name or record_name(record)
    base = Path(folder) / stem
    count = 1
    # Suffixes appended, not swapped: with_suffix would cut a name with a dot in it (a kernel
    # file "my.v2") at the dot, so every "-2", "-3" named the one file already there.
    def paths(base: Path) -> tuple[Path, Path]:
        return base.with_name(base.name + ".json"), base.with_name(base.name + ".md")

    while any(p.exists() for p in paths(base)):
        count += 1  # two records of the same second keep both
        base = Path(folder) / f"{stem}-{count}"
    json_path, md_path = paths(base)
    atomic_write(json_path, json.dumps(record, indent=1) + "\n")
    try:
        atomic_write(md_path, markdown)
    except BaseException:
        json_path.unlink()  # the pair or nothing
        raise
    return json_path, md_path


@dataclass
class Delta:
    key: tuple
    label: str
    old_ms: float | None
    new_ms: float | None
    ratio: float | None  # new / old: above 1 is slower
    noise: float | None
    verdict: str  # "faster", "slower", "same", "new", "missing", "not comparable"


def row_noise(row: Row) -> float:
    return row.timing.rse if row.timing is not None else math.inf


def diff(new: Comparison, old: Comparison, floor: float = 0.02, sigmas: float = 3.0) -> list[Delta]:
    """Each row's time against the same row of a baseline. A change counts only beyond
    `sigmas` combined standard errors of the two medians, and never below `floor` (2%). A
    baseline row is "missing" only where this run asked for its variant and batch: a run of
    a few variants at one batch is checked against those rows of a full record. Rows timed
    by different methods (timer.TIMING_METHODS) are "not comparable"."""
    old_rows = {r.key: r for r in old.rows}
    deltas = []
    for row in new.rows:
        base = old_rows.pop(row.key, None)
        if base is None:
            deltas.append(Delta(row.key, row.label, None, row.median_ms, None, None, "new"))
            continue
        # A time with the host's dispatch in it (the single-launch method) is no baseline for
        # one without.
        if not (row.valid and base.valid) or row.timing.method != base.timing.method:
            deltas.append(Delta(row.key, row.label, base.median_ms, row.median_ms, None, None,
                                "not comparable"))
            continue
        ratio = row.median_ms / base.median_ms
        noise = max(floor, sigmas * math.hypot(row_noise(row), row_noise(base)))
        verdict = "slower" if ratio > 1 + noise else "faster" if ratio < 1 - noise else "same"
        deltas.append(Delta(row.key, row.label, base.median_ms, row.median_ms, ratio, noise, verdict))
    for key, base in old_rows.items():
        if base.variant in new.kernels and base.batch in new.batches:
            deltas.append(Delta(key, base.label, base.median_ms, None, None, None, "missing"))
    return deltas
