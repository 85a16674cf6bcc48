"""Sweep the pipelined tilings on the AlexNet conv layers (batch 128) and the ResNet-style layer
(64->64 3x3 p1 56x56, batch 64), next to cuDNN fp32, TF32 and fp16 (GPU only).

For every layer and variant, each config of `configs()` is compiled, run with bias + ReLU on
one fixed random problem, verified against a float64 reference of three images (the first
two and the last; outputs poisoned after warm-up, so what is checked was written by a timed
run) and timed with CUDA events. fp16/bf16 inputs are staged once, outside the timings. The
kernels are compiled up front in worker processes, which fills CuPy's on-disk kernel cache;
the timing loop then only loads them. The best verified time per variant is printed next to
the cuDNN row of its precision class ("cuDNN": its time over ours; "a/b": configs that passed
of those run); every row goes to --out as JSON. All six layers take about 8 minutes on an
H100 with 16 CPUs; a device command is capped at 10, so run them in two or three parts.

Usage: python scripts/sweep_pipelined.py --out results/h100/sweep-pipelined.json
       [--layers conv3,resnet] [--variants pipelined,pipelined-fp16] [--max-configs 8]
       [--workers 12] [--seed 0]
"""

import argparse
import json
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from convlab.gpu import hardware, timer
from convlab.kernels import RELU, get_variant
from convlab.kernels.cudnn import Cudnn
from convlab.kernels.igemm import tiling
from convlab.models import get_model
from convlab.oracle.verify import compare, poison, random_problem, reference_output
from convlab.shapes import ConvShape

LAYERS = {**get_model("alexnet").conv_shapes(128),
          "resnet": ConvShape(64, 64, 56, 56, 64, 3, pad=1)}
VARIANTS = {v.name: v for v in (get_variant(n) for n in ("pipelined", "pipelined-3xtf32",
                                                         "pipelined-fp16", "pipelined-bf16"))}
CUDNN_CLASS = {"tf32": "cudnn-tf32", "fp32": "cudnn", "fp16": "cudnn-fp16", "bf16": "cudnn-fp16"}
POLICY = timer.TimingPolicy(warmup=3, min_runs=10, max_runs=40, budget_s=0.3)


def compile_job(job):
    """Worker: compile one (variant, config, layer) through CuPy, which caches the cubin."""
    name, config, shape_dict = job
    variant = VARIANTS[name].configured(config)
    variant.compile(ConvShape(**shape_dict), RELU)
    return name


def precompile(jobs, workers):
    if workers < 1 or not jobs:
        return
    start = time.perf_counter()
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        list(pool.map(compile_job, jobs, chunksize=1))
    print(f"compiled {len(jobs)} kernels in {time.perf_counter() - start:.0f} s "
          f"with {workers} workers", flush=True)


class Problem:
    """One layer's fixed inputs on the device and the float64 reference of three images."""

    def __init__(self, shape, seed):
        import cupy

        self.shape = shape
        self.x, self.w, self.b = random_problem(shape, np.random.default_rng(seed))
        self.xd = cupy.asarray(self.x)
        self.images = sorted({0, 1, shape.B - 1})
        self.ref = reference_output(self.x[self.images], self.w, shape.with_batch(len(self.images)),
                                    RELU, self.b)

    def measure(self, run, result, precision, buffer=None):
        """Time `run`, then check `result()` (the device output) on the reference images;
        `buffer`, the output array a kernel writes into, is poisoned after warm-up (cuDNN
        through PyTorch returns a fresh array each call)."""
        import cupy

        after = None if buffer is None else (lambda: poison(buffer))
        timing = timer.time_device(run, POLICY, after_warmup=after)
        got = cupy.asnumpy(result()[self.images]).astype(np.float32)
        return timing, compare(got, self.ref, precision)


def row(layer, variant, precision, config, timing=None, check=None, error=""):
    out = {"layer": layer, "variant": variant, "precision": precision,
           "config": config.as_dict() if config is not None else None,
           "error": error}
    if timing is not None:
        out.update(timing.as_dict())
    if check is not None:
        out.update(passed=check.passed, bound_ratio=check.bound_ratio,
                   max_rel_error=check.max_rel_error, reason=check.reason)
    return out


def time_pipelined(problem, layer, variant, config, staged):
    import cupy

    v = variant.configured(config)
    op = v.prepare(problem.shape, problem.w, RELU, problem.b)
    if variant.name not in staged:
        staged[variant.name] = op.stage(problem.xd)
    xs = staged[variant.name]
    y = cupy.empty(op.output_shape, dtype=cupy.float32)
    timing, check = problem.measure(lambda: op(xs, y), lambda: y, v.precision, y)
    return row(layer, variant.name, v.precision, config, timing, check)


def time_cudnn(problem, layer, variant):
    import cupy

    op = variant.prepare(problem.shape, problem.w, RELU, problem.b)
    y = cupy.empty(op.output_shape, dtype=cupy.float32)
    timing, check = problem.measure(lambda: op(problem.xd, y), lambda: op.output(y),
                                    variant.precision, y)
    return row(layer, variant.name, variant.precision, None, timing, check)


def time_cudnn_fp16(problem, layer):
    """cuDNN on half tensors (NCHW, converted outside the timing), bias and ReLU in fp16."""
    import cupy
    import torch

    F = torch.nn.functional
    s = problem.shape
    torch.backends.cudnn.benchmark = True
    xh = torch.from_dlpack(problem.xd).half()
    wh = torch.from_dlpack(cupy.asarray(problem.w)).half()
    bh = torch.from_dlpack(cupy.asarray(problem.b)).half() if problem.b is not None else None
    out = {}

    def run():
        out["y"] = F.relu(F.conv2d(xh, wh, bh, stride=s.stride, padding=s.pad, groups=s.groups))

    def result():
        return cupy.from_dlpack(out["y"].float())

    timing, check = problem.measure(run, result, "fp16")
    return row(layer, "cudnn-fp16", "fp16", None, timing, check)


def tflops(shape, ms):
    return shape.flops / (ms * 1e-3) / 1e12


def print_layer(layer, shape, rows):
    print(f"\n{layer}: B{shape.B} {shape.brief()}, {shape.flops / 1e9:.1f} GFLOP")
    print(f"{'variant':<16} {'tiling':<27} {'ms':>6} {'TFLOPs':>6} {'cuDNN':>6} check")
    cudnn = {r["variant"]: r for r in rows if r["variant"].startswith("cudnn") and not r["error"]}
    for name in VARIANTS:
        mine = [r for r in rows if r["variant"] == name and not r["error"]]
        if not mine:
            continue
        ok = [r for r in mine if r["passed"]]
        best = min(ok or mine, key=lambda r: r["median_ms"])
        ref = cudnn.get(CUDNN_CLASS[best["precision"]])
        ratio = f"{ref['median_ms'] / best['median_ms']:.2f}x" if ref else "-"
        brief = tiling.Tiling.from_dict(best["config"]).brief()
        print(f"{name:<16} {brief:<27} {best['median_ms']:>6.3f} "
              f"{tflops(shape, best['median_ms']):>6.1f} {ratio:>6} "
              f"{'PASS' if best['passed'] else 'FAIL'} {len(ok)}/{len(mine)}")
    for name, r in cudnn.items():
        print(f"{name:<16} {'':<27} {r['median_ms']:>6.3f} {tflops(shape, r['median_ms']):>6.1f} "
              f"{'':>6} {'PASS' if r['passed'] else 'FAIL'}")
    for r in rows:
        if r["error"]:
            where = tiling.Tiling.from_dict(r["config"]).brief() if r["config"] else ""
            print(f"  error {r['variant']} {where}: {r['error']}"[:80])
    sys.stdout.flush()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file for every row")
    parser.add_argument("--layers", default=",".join(LAYERS))
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--max-configs", type=int, default=tiling.MAX_CONFIGS)
    parser.add_argument("--workers", type=int, default=min(12, os.cpu_count() or 1),
                        help="compile processes (0: compile in the timing loop)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    layers = {name: LAYERS[name] for name in args.layers.split(",")}
    variants = [VARIANTS[name] for name in args.variants.split(",")]

    plan = [(layer, v, cfg) for layer, shape in layers.items() for v in variants
            for cfg in v.configs(shape, RELU)[:args.max_configs]]
    precompile([(v.name, cfg, layers[layer].as_dict()) for layer, v, cfg in plan], args.workers)

    record = {"device": hardware.device_info(), "command": " ".join(sys.argv), "rows": []}
    try:
        for layer, shape in layers.items():
            problem = Problem(shape, args.seed)
            rows, staged = [], {}
            for _, variant, config in [p for p in plan if p[0] == layer]:
                try:
                    rows.append(time_pipelined(problem, layer, variant, config, staged))
                except Exception as exc:  # noqa: BLE001 - a config that fails is a result too
                    rows.append(row(layer, variant.name, variant.precision, config,
                                    error=f"{type(exc).__name__}: {exc}"))
                    if "CUDA" in type(exc).__name__:  # a fault poisons the context: stop
                        raise
            for variant in (Cudnn("fp32"), Cudnn("tf32")):
                rows.append(time_cudnn(problem, layer, variant))
            rows.append(time_cudnn_fp16(problem, layer))
            print_layer(layer, shape, rows)
            record["rows"] += rows
            del problem, staged
    finally:
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)
        print(f"\nwrote {len(record['rows'])} rows to {args.out}")


if __name__ == "__main__":
    main()
