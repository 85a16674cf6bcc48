import importlib.util
import os
import secrets
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from convlab import gpu
from convlab.gpu import gpu_available, unavailable_reason
from convlab.gpu.jit import compile_cubin


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    skip = pytest.mark.skip(reason=f"no usable GPU: {unavailable_reason()}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rng(request):
    """Fresh random inputs on every run; the seed is printed so a failure can be replayed."""
    seed = secrets.randbits(32)
    print(f"{request.node.nodeid}: numpy seed {seed}")
    return np.random.default_rng(seed)


@pytest.fixture
def no_gpu(monkeypatch):
    """A machine without CuPy, whatever this one has."""
    monkeypatch.setattr(gpu, "_probe", lambda: (None, "CuPy is not installed (test)"))


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    """Compiled kernels and tuned tilings in a folder of the test's own."""
    monkeypatch.setenv("CONVLAB_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def compile_all():
    """Compile (variant, shape, epilogue) jobs with NVRTC for each variant's target (sm_90
    unless it names one), side by side on the CPUs (NVRTC releases the GIL); their cubins."""
    def one(job):
        variant, shape, epilogue = job
        return compile_cubin(variant.name, variant.source, variant.compile_options(shape, epilogue),
                             variant.arch or "sm_90")

    def run(jobs):
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            return list(pool.map(one, jobs))

    return run


@pytest.fixture
def script():
    """A script of scripts/ by name, loaded as a module (they are not a package)."""
    def load(name):
        path = Path(__file__).parents[1] / "scripts" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load
