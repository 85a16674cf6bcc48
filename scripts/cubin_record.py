"""A pytest plugin for compare_cubins.py: records a SHA-256 of every cubin NVRTC builds while the
tests run, and of the build of every shipped tuning (of their sections but the debug ones:
machine_code_digest), into the JSON file CUBIN_RECORD names (CUBIN_RECORD_SHIPPED=0 leaves the
shipped tunings out).

A test's cubins are keyed "test | program | arch": the test whose run (setup, fixtures and
teardown included) compiled it, the name NVRTC was given for the program (compile_cubin names
it after the variant, as `naive.cu`; a test calling nvrtc_compile names its own) and the target.
A compile that fails is recorded as "no cubin". Every compile goes through
`gpu.jit.nvrtc_compile` (compile_cubin calls it, cubin_file calls compile_cubin), so wrapping
that one function records each cubin once, whichever of them a test calls. A shipped
tuning's build is keyed by its variant, layer, epilogue and tiling. Options are left out of the
keys: a refactor may rename or add -D switches without changing a byte of machine code.

Load it with `-p cubin_record` and this folder on PYTHONPATH. pytest imports it before the
conftest files and the test modules, so their `from convlab.gpu.jit import nvrtc_compile`
binds the wrapper; a module imported earlier that bound the function to a name of its own has
that name rebound here. A reference taken before and held some other way (a default argument,
a functools.partial) would still reach NVRTC unrecorded."""

import hashlib
import json
import os
import sys
import types
from collections import defaultdict
from unittest import mock

import pytest

from convlab.gpu import jit
from convlab.gpu.cubin import sections

_nvrtc_compile = jit.nvrtc_compile
_records: dict[str, list[str]] = defaultdict(list)
_test = ["(collection)"]


NOBITS = 8  # an ELF section that occupies no bytes of the file (shared memory): only its size


def machine_code_digest(cubin: bytes) -> str:
    """A SHA-256 of the cubin's sections but the debug ones: the line table -lineinfo adds (the
    kernel-file checks compile with it) names the directory NVRTC ran in, which differs
    between the two trees, and follows the source's lines, comments included."""
    digest = hashlib.sha256()
    for section in sections(cubin):
        if "debug" in section.name:
            continue
        digest.update(f"{section.name} {section.type} {section.flags} {section.size}".encode())
        if section.type != NOBITS:
            digest.update(cubin[section.offset:section.offset + section.size])
    return digest.hexdigest()


def _recording(program, source, options, arch=jit.CHECK_ARCH):
    result = _nvrtc_compile(program, source, options, arch)
    digest = "no cubin" if result.cubin is None else machine_code_digest(result.cubin)
    _records[f"{_test[0]} | {program} | {arch}"].append(digest)
    return result


def _rebind_everywhere():
    """Every module's name for nvrtc_compile, jit's own included, now names _recording; this
    module's keeps the function itself, which _recording calls."""
    for module in list(sys.modules.values()):
        if isinstance(module, types.ModuleType) and module is not sys.modules[__name__]:
            namespace = vars(module)
            for name in [name for name, value in namespace.items() if value is _nvrtc_compile]:
                namespace[name] = _recording


_rebind_everywhere()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
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
    # These builds have keys of their own, not the last test's.
    with (mock.patch.object(base, "compute_capability", lambda: None),
          mock.patch.object(jit, "nvrtc_compile", _nvrtc_compile)):
        for entry in entries.values():
            variant = VARIANTS.get(entry["variant"])
            if variant is None:
                continue
            shape = ConvShape(**entry["shape"])
            built = variant.configured(variant.config_type(**entry["config"]))
            options = built.compile_options(shape, entry["epilogue"])
            cubin = jit.compile_cubin(built.name, built.source, options,
                                      built.arch or jit.CHECK_ARCH)
            key = (f"shipped | {entry['variant']} | {json.dumps(entry['shape'], sort_keys=True)}"
                   f" | {entry['epilogue']} | {json.dumps(entry['config'], sort_keys=True)}")
            hashes[key] = machine_code_digest(cubin)
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
