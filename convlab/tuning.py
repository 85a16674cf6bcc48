"""The tuned-configuration cache: what `convlab tune` stores and what tunable variants read.

A low module on purpose: variants read it when they choose a tiling (kernels/base.Variant.
config_for), and the tuner (convlab/bench/tune.py), which runs the lab, writes it; neither the
variants nor this module import the tuner.

Entries are keyed by the GPU (name and compute capability), the variant, a hash of the
variant's source (its CUDA C and the Python module that launches it: an edited kernel is tuned
afresh), the layer shape (batch included) and the epilogue. `lookup` needs no GPU work, is
memoised on the cache file's modification time and never raises: a missing, unreadable or
corrupt cache is no entry (and the next store rewrites a corrupt file whole). The cache is one
JSON file under CONVLAB_CACHE_DIR (default ~/.cache/convlab); a store is a read-modify-write
under an exclusive lock on a side file, written to a temporary file and moved into place with
os.replace, so concurrent tuners lose no entry and a reader never sees half a file.

Beside it, read-only, the tunings shipped with convlab (SHIPPED, the same format and keys):
the tuner's results on the GPUs the README's figures come from, so that a fresh install on
such a GPU runs the tilings those figures were measured with. The user's own cache wins. A
kernel edit changes its source hash and its shipped entries stop matching (a CPU test says
so): re-tune, or re-key with scripts/rekey_tune_cache.py where the edit leaves the tilings'
meaning alone.

Every tiling a layer runs has an origin (`Choice`): the variant's own choice (its cost
model), a shipped tuning, the user's cache (`convlab tune`), or autotuned (an entry autotune
wrote, in this process or before). With CONVLAB_IGNORE_TUNINGS set (`--ignore-tunings`)
shipped and cached entries are not read, so the variants' own choice can be measured alone;
what autotune finds in this process still counts. Autotune itself (convlab/bench/autotune.py)
is attached from outside, as the tuner is: `set_autotuner` installs it and `first_use`, which
the lab calls before it prepares a layer, runs it for a layer without an entry.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import os
import secrets
from functools import lru_cache
from pathlib import Path

from .gpu import cache_dir, gpu_available
from .shapes import ConvShape

CACHE_FILE = "tune-cache.json"
CACHE_FORMAT = 1
SHIPPED = Path(__file__).parent / "assets" / "tunings.json"
IGNORE_ENV = "CONVLAB_IGNORE_TUNINGS"
AUTOTUNE_ENV = "CONVLAB_AUTOTUNE"
# An entry's "by": the tuner's sweep, or autotune on first use.
BY_TUNE, BY_AUTOTUNE = "tune", "autotune"


class Choice:
    """Where a layer's tiling came from, as run and compare rows say it."""

    OWN = "own"  # the variant's own choice: its cost model, no tuning entry
    SHIPPED = "shipped"  # convlab/assets/tunings.json
    CACHED = "cached"  # the user's cache, written by `convlab tune`
    AUTOTUNED = "autotuned"  # written by autotune on first use
    ALL = (OWN, SHIPPED, CACHED, AUTOTUNED)


def ignoring() -> bool:
    """Whether shipped and cached tunings are ignored (CONVLAB_IGNORE_TUNINGS set, not 0)."""
    return os.environ.get(IGNORE_ENV, "").strip().lower() not in ("", "0", "false", "no")


# --- the layer ------------------------------------------------------------------------------

def layer_text(shape: ConvShape) -> str:
    """The layer in --layer syntax (the long form, with the dilation where a filter is not
    square and undilated), plus ',bias' when it has one."""
    s = shape
    if s.is_square:
        text = f"{s.B},{s.C},{s.H},{s.W},{s.M},{s.K},{s.stride},{s.pad},{s.groups}"
    else:
        text = (f"{s.B},{s.C},{s.H},{s.W},{s.M},{s.kernel_text()},{s.stride},"
                f"{s.pad_h}x{s.pad_w},{s.groups},{s.dilation}")
    return text + (",bias" if s.bias else "")


# --- the cache ------------------------------------------------------------------------------

def cache_path() -> Path:
    return cache_dir() / CACHE_FILE


@lru_cache(maxsize=None)
def _device_name(device_id: int) -> str:
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(device_id)
    name = props["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    return f"{name} (CC {props['major']}.{props['minor']})"


def device_key() -> str | None:
    """The current GPU as the cache names it (name and compute capability); None without one."""
    if not gpu_available():
        return None
    import cupy

    return _device_name(cupy.cuda.Device().id)


@lru_cache(maxsize=256)
def _hash(source: str, module_files: tuple[str, ...]) -> str:
    digest = hashlib.sha256(source.encode())
    for module_file in module_files:
        with contextlib.suppress(OSError):
            digest.update(Path(module_file).read_bytes())
    return digest.hexdigest()[:16]


def _module_file(cls: type) -> str | None:
    try:
        return inspect.getsourcefile(cls)
    except TypeError:
        return None


def source_hash(variant) -> str:
    """Hash of the variant's CUDA source and of the modules whose code builds its launches: its
    class's, and that of the activations it reads where its family takes them as a part (the
    channels-last gather table and staging live apart from the class that uses them)."""
    parts = [type(variant)] + ([type(variant.activations)] if hasattr(variant, "activations")
                               else [])
    return _hash(variant.source or "", tuple(f for f in map(_module_file, parts) if f is not None))


def cache_key(device: str, variant_name: str, digest: str, shape: ConvShape,
              epilogue: str | None) -> str:
    return f"{device} | {variant_name} | {digest} | {layer_text(shape)} | {epilogue or 'none'}"


_memo: dict[Path, tuple[tuple[int, int, int], dict]] = {}


def _read_entries(path: Path) -> dict:
    """The cache's entries, {} for a missing, unreadable or corrupt file."""
    try:
        stat = path.stat()
    except OSError:
        return {}
    stamp = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
    memo = _memo.get(path)
    if memo is not None and memo[0] == stamp:
        return memo[1]
    try:
        data = json.loads(path.read_bytes())
        entries = data["entries"] if data.get("format") == CACHE_FORMAT else {}
        if not isinstance(entries, dict):
            entries = {}
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        entries = {}
    _memo[path] = (stamp, entries)
    return entries


# What autotune found in this process, by cache key: read before the files, and the one
# source of entries left while shipped and cached tunings are ignored.
_session: dict[str, dict] = {}


def find(variant, shape: ConvShape, epilogue: str | None = None) -> tuple[dict, str] | None:
    """The tuned configuration of `variant` for this layer on the current GPU and its origin
    (a Choice): what autotune found in this process, else the user's cache, else the shipped
    tunings (neither file while ignoring()); or None: no GPU, no entry, or an unreadable
    file. Never raises."""
    try:
        device = device_key()
        if device is None:
            return None
        key = cache_key(device, variant.name, source_hash(variant), shape, epilogue)
        if key in _session:
            return dict(_session[key]), Choice.AUTOTUNED
        if ignoring():
            return None
        for path, origin in ((cache_path(), Choice.CACHED), (SHIPPED, Choice.SHIPPED)):
            entry = _read_entries(path).get(key)
            config = entry.get("config") if isinstance(entry, dict) else None
            if isinstance(config, dict):
                if origin == Choice.CACHED and entry.get("by") == BY_AUTOTUNE:
                    origin = Choice.AUTOTUNED
                return dict(config), origin
        return None
    except Exception:  # a variant's default choice must not fail because of its cache
        return None


def lookup(variant, shape: ConvShape, epilogue: str | None = None) -> dict | None:
    """find's configuration alone."""
    found = find(variant, shape, epilogue)
    return None if found is None else found[0]


def remember(key: str, config: dict) -> None:
    """What autotune chose for a layer, for the rest of this process (see _session)."""
    _session[key] = dict(config)


# --- autotune on first use, attached from outside ---------------------------------------------

_autotuner = None


def set_autotuner(autotuner) -> None:
    """Install autotuner(variant, shape, epilogue), which tunes and remembers a layer's tiling
    (convlab.bench.autotune), or remove it with None."""
    global _autotuner
    _autotuner = autotuner


def autotuning() -> bool:
    return _autotuner is not None


def first_use(variant, shape: ConvShape, epilogue: str | None = None) -> None:
    """Before a layer is prepared: with an autotuner installed, a tunable variant whose tiling
    the constructor left open and that has no entry for this layer is autotuned now."""
    if _autotuner is None or getattr(variant, "config_type", None) is None:
        return
    if not variant.tunable_fields() or find(variant, shape, epilogue) is not None:
        return
    _autotuner(variant, shape, epilogue)


@contextlib.contextmanager
def _exclusive(path: Path):
    """Holds an exclusive lock on path's side file (POSIX; elsewhere os.replace alone keeps the
    file whole, and concurrent stores may drop one another's entry)."""
    with open(path.with_name(path.name + ".lock"), "a") as handle:
        try:
            import fcntl
        except ImportError:
            yield
            return
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def store(key: str, entry: dict, path: Path | None = None) -> Path:
    """Add or replace one entry; a corrupt cache file is replaced by one holding this entry."""
    path = path or cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(path):
        _memo.pop(path, None)
        entries = dict(_read_entries(path))
        entries[key] = entry
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            tmp.write_text(json.dumps({"format": CACHE_FORMAT, "entries": entries}, indent=1))
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    return path
