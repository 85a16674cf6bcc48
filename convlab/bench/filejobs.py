"""Jobs that run a kernel file in an isolated child process (convlab.gpu.isolate): each takes
and returns JSON-able values. `time_layer` is `lab.run_layer` for a kernel file, `run_model`
is `convlab run --kernel-file` (lab.run), `compare_rows` one kernel file's rows of `convlab
compare` (compare.variant_rows). Each returns the hash of the file it loaded, which the parent
compares with the file it recorded."""

from __future__ import annotations

import numpy as np

from ..gpu import timer
from ..gpu.isolate import gpu_wait
from ..models import get_model, load_weights
from ..net.plan import NetworkPlan
from ..oracle.verify import random_problem
from ..shapes import ConvShape
from ..userkernel.exercise import job_variant
from ..userkernel.kernelfile import load_kernel_file
from . import compare, lab


def time_layer(shape: dict, kernel_file: str | None = None, variant: str | None = None,
               policy: dict | None = None, epilogue: str | None = None,
               seed: int | None = None) -> dict:
    """lab.run_layer in the child: the LayerResult as a dict, with the kernel file's hash."""
    chosen, record = job_variant(kernel_file, variant)
    result = lab.run_layer(ConvShape(**shape), chosen, timer.TimingPolicy(**(policy or {})),
                           epilogue, seed)
    return {"layer": result.as_dict(), "kernel_file": record}


def run_model(kernel_file: str, model: str, batch: int, policy: dict | None = None,
              weights_path: str | None = None, fallback: str | None = None,
              compare_torch: bool = False, graph: bool = True, verify: str = "sample") -> dict:
    """lab.run with the kernel file: {"sha256", "run": the RunResult as a dict}."""
    loaded = load_kernel_file(kernel_file)
    plan = lab.network_plan(get_model(model), loaded.variant, batch, fallback)
    if loaded.variant.on_gpu:
        _launch_alone(plan)
    result = lab.run(plan, timer.TimingPolicy(**(policy or {})),
                     weights=load_weights(model, weights_path), compare_torch=compare_torch,
                     graph=graph, verify=verify)
    return {"sha256": loaded.sha256, "run": result.as_dict()}


def _launch_alone(plan: NetworkPlan) -> None:
    """One launch per conv layer of the model, each waited for alone, before the network runs.
    A kernel that faults or never returns does so here, in a device wait the parent times. In
    the network, kernels launched behind it for the first time (cuBLAS's, loaded lazily by CUDA)
    may wait for it inside the launch, where the parent sees no device wait and only the job's
    overall limit would end it. (compare's random trials and `exercise` launch alone too.)"""
    import cupy

    rng = np.random.default_rng()
    for decision in plan.convs.values():
        if decision.variant is not plan.variant:
            continue
        shape = decision.shape
        x, w, b = random_problem(shape, rng, signed=True)
        op = plan.variant.prepare(shape, w, decision.lone_epilogue, b)
        op.run_once(x, cupy)
        with gpu_wait():
            cupy.cuda.Device().synchronize()


def compare_rows(kernel_file: str, batch: int, shapes: dict[str, dict], model: str | None = None,
                 policy: dict | None = None, weights_path: str | None = None,
                 verify: str = "sample") -> dict:
    """The kernel file's rows of a compare at one batch size, as a built-in variant gets them:
    {"sha256", "rows": [Row as a dict]}."""
    loaded = load_kernel_file(kernel_file)
    weights = load_weights(model, weights_path) if weights_path is not None else None
    spec = None if model is None else get_model(model)
    rows = compare.variant_rows(loaded.variant, batch, spec, timer.TimingPolicy(**(policy or {})),
                                {name: ConvShape(**s) for name, s in shapes.items()}, weights, verify)
    return {"sha256": loaded.sha256, "rows": [row.as_dict() for row in rows]}
