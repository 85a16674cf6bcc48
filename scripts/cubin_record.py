"""A pytest plugin for compare_cubins.py: records a SHA-256 of every cubin the tests compile
(`gpu.jit.compile_cubin`), under the test that compiled it and the variant's name, and of the
build of every shipped tuning, into the JSON file CUBIN_RECORD names. Options are left out of
the key: a refactor may rename or add -D switches without changing a byte of machine code.

Load it with `-p cubin_record` and this folder on PYTHONPATH."""

import hashlib
import json
import os
from collections import defaultdict
from unittest import mock

import pytest

from convlab.gpu import jit

_compile = jit.compile_cubin
_records: dict[str, list[str]] = defaultdict(list)
_test = ["(collection)"]


def _recording(variant, source, options, arch=jit.CHECK_ARCH):
    cubin = _compile(variant, source, options, arch)
    _records[f"{_test[0]} | {variant} | {arch}"].append(hashlib.sha256(cubin).hexdigest())
    return cubin


jit.compile_cubin = _recording


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    _test[0] = item.nodeid
    yield


def shipped_builds() -> dict[str, str]:
    """The cubin of each shipped tuning's build: its variant, layer, epilogue and tiling."""
    from convlab import tuning
    from convlab.kernels import VARIANTS, base
    from convlab.shapes import ConvShape

    hashes = {}
    with open(tuning.SHIPPED) as f:
        entries = json.load(f)["entries"]
    with mock.patch.object(base, "compute_capability", lambda: None):
        for entry in entries.values():
            variant = VARIANTS.get(entry["variant"])
            if variant is None:
                continue
            shape = ConvShape(**entry["shape"])
            built = variant.configured(variant.config_type(**entry["config"]))
            options = built.compile_options(shape, entry["epilogue"])
            cubin = _compile(built.name, built.source, options, built.arch or jit.CHECK_ARCH)
            key = (f"shipped | {entry['variant']} | {json.dumps(entry['shape'], sort_keys=True)}"
                   f" | {entry['epilogue']} | {json.dumps(entry['config'], sort_keys=True)}")
            hashes[key] = hashlib.sha256(cubin).hexdigest()
    return hashes


def pytest_sessionfinish(session):
    path = os.environ.get("CUBIN_RECORD")
    if not path:
        return
    record = {key: sorted(hashes) for key, hashes in _records.items()}
    if os.environ.get("CUBIN_RECORD_SHIPPED", "1") == "1":
        record.update({key: [digest] for key, digest in shipped_builds().items()})
    with open(path, "w") as f:
        json.dump(record, f, indent=0, sort_keys=True)
