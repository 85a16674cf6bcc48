"""Time many tilings of the tunable variants on many layers: the data the tiling model
(convlab/kernels/igemm/learned.py) is fitted on, by scripts/fit_tiling_model.py.

For every (layer, batch) cell of a suite (convlab/bench/suites.py), and, with --random N, N
more layers drawn at random (seeded) from the space such networks span, each variant's
candidates are compiled, verified and timed on one random problem: the first --configs of the
cost model's ranking, spread over block tiles (`diverse`), plus every tiling `configs()`
offers. Beside them, the cell's cuDNN rows of each class (both layouts, the faster of conv +
ReLU and the fused kernel), so the data also says where the layer stands against cuDNN.

One worker process per GPU takes every --gpus'th task; each task's record is a JSON line in
OUT/sweep-GPU.jsonl, written when the task is done. A worker that dies (a faulting tiling) is
started again after the task it was on, which is recorded as crashed. Verification checks
--verify-images whole images and a few channels of every image's edge rows; a candidate is
timed with timer.time_device alone (the compare and tune rows add the guard's defences).

Usage: python scripts/sweep_tilings.py OUT [--suite all] [--random 32] [--gpus 4]
       [--configs 16] [--variants wgmma,wgmma-fp16,...] [--cudnn] [--split-cells]
"""

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

VARIANTS = ("wgmma", "wgmma-fp16", "wgmma-3xtf32", "wgmma-split-bf16", "depthwise",
            "depthwise-fp16")
CUDNN = {"fp32": ("cudnn", "cudnn-nhwc"), "tf32": ("cudnn-tf32", "cudnn-nhwc-tf32"),
         "fp16": ("cudnn-fp16", "cudnn-nhwc-fp16")}


def random_layers(count: int, seed: int = 2026):
    """Layers of the kinds the suites hold, drawn at random: 1x1, 3x3 (stride 1 or 2), 5x5,
    7x7 stems, 1xk/kx1 and dilated 3x3, channels 16-2048, images 7-112, batches 1-256."""
    from convlab.kernels import RELU
    from convlab.shapes import ConvShape

    rng = random.Random(seed)
    layers = []
    while len(layers) < count:
        kind = rng.choice(["1x1", "1x1", "3x3", "3x3", "3x3s2", "5x5", "1xk", "dil", "1x1s2"])
        c = rng.choice([16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 512, 768, 1024,
                        2048])
        m = rng.choice([16, 32, 64, 96, 128, 192, 256, 384, 512, 1024, 2048])
        h = rng.choice([7, 8, 13, 14, 17, 28, 35, 56, 64, 112])
        b = rng.choice([1, 2, 8, 16, 32, 64, 128, 256])
        if b * c * h * h * 4 > 2 << 30 or b * m * h * h * 4 > 2 << 30:
            continue
        k, stride, pad, kw, pad_w, dil = 1, 1, 0, None, None, 1
        if kind == "3x3":
            k, pad = 3, 1
        elif kind == "3x3s2":
            k, stride, pad = 3, 2, 1
        elif kind == "5x5":
            k, pad = 5, 2
        elif kind == "1x1s2":
            stride = 2
        elif kind == "1xk":
            k, kw = rng.choice([(1, 7), (7, 1), (1, 3), (3, 1)])
            pad, pad_w = (k - 1) // 2, (kw - 1) // 2
        elif kind == "dil":
            k, dil = 3, rng.choice([2, 4])
            pad = dil
        if h * 2 + 2 * pad <= dil * (k - 1):
            continue
        shape = ConvShape(b, c, h, h, m, k, stride, pad, 1, True, kw, pad_w, dil)
        layers.append({"label": f"random{len(layers)}", "shape": shape.as_dict(),
                       "epilogue": rng.choice([RELU, None])})
    return layers


def splits_k(variant, shape) -> bool:
    """Whether any of the variant's candidates splits K on the layer: too few output tiles
    for the GPU."""
    ranked = getattr(variant, "ranked", None)
    return bool(ranked) and any(t.split_k > 1 for t in ranked(shape))


def tasks(suite: str, extra: int, variants, with_cudnn: bool, split_cells: bool = False):
    from convlab.bench import suites
    from convlab.kernels import get_variant
    from convlab.shapes import ConvShape

    layers = [{"label": f"{layer.label} b{batch}", "shape": layer.at(batch).as_dict(),
               "epilogue": layer.epilogue} for layer, batch in suites.cells(suite)]
    layers += random_layers(extra)
    out = []
    for layer in layers:
        shape = ConvShape(**layer["shape"])
        mine = []
        for name in variants:
            v = get_variant(name)
            if (v.supports(shape) and (shape.groups == 1) != name.startswith("depthwise")
                    and (not split_cells or splits_k(v, shape))):
                mine.append({**layer, "variant": name})
        if with_cudnn and (mine or not split_cells):
            mine.append({**layer, "variant": "cudnn"})
        out += mine
    # A sweep cut short by a time limit is then a fair sample of the whole.
    random.Random(1).shuffle(out)
    return out


def suite_cells(name: str):
    """(variant, layer, batch, shape) for every public suite cell meant for variant `name`
    that it supports, the variant as the lab runs a layer (lab.layer_variant)."""
    from convlab.bench import lab, suites
    from convlab.kernels import get_variant

    variant = lab.layer_variant(get_variant(name))
    for layer, batch in suites.cells("all"):
        shape = layer.at(batch)
        if suites.meant_for(name, shape) and variant.supports(shape):
            yield variant, layer, batch, shape


def candidate_configs(variant, shape, epilogue, count):
    from convlab.kernels.igemm.cost import diverse

    offered = [c.as_dict() for c in variant.configs(shape, epilogue)]
    ranked = getattr(variant, "ranked", None)
    wider = [t.as_dict() for t in diverse(ranked(shape), count)] if ranked else []
    return offered + [c for c in wider if c not in offered]


def compile_all(variant, shape, epilogue, configs):
    """Every config of one cell, a quarter of the CPUs compiling (one worker per GPU shares
    them)."""
    compile_tilings([(variant, c, shape, epilogue) for c in configs], os.cpu_count() // 4 or 1)


def compile_tilings(builds, workers: int) -> None:
    """NVRTC in `workers` threads for each (variant, config, shape, epilogue): the cubins land
    in the on-disk cache, so the timing that follows loads them; a build that fails is left
    for its timing to report."""
    from convlab.gpu.jit import cubin_file

    def build(job):
        variant, config, shape, epilogue = job
        v = variant.configured(config)
        try:
            if v.arch:
                cubin_file(v.name, v.source, v.compile_options(shape, epilogue), v.arch)
        except Exception:  # noqa: BLE001 - its timing reports the failure
            pass

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(build, builds))


def run_task(task, count, policy):
    """One task: every candidate timed on one problem (CUDA events around queued launches,
    timer.time_device), its output checked against float64 on a sampled image and the
    edge rows; or the cell's cuDNN rows through the lab."""
    from convlab.bench import lab
    from convlab.bench.tune import failure_reason
    from convlab.kernels import get_variant
    from convlab.shapes import ConvShape

    shape = ConvShape(**task["shape"])
    epilogue = task["epilogue"]
    record = {**task, "candidates": [], "cudnn": {}}
    problem = lab.LayerProblem.draw(shape, True, seed=1)
    if task["variant"] == "cudnn":
        for names in CUDNN.values():
            for name in names:
                try:
                    r = lab.run_layer(shape, name, policy, epilogue, problem=problem)
                    record["cudnn"][name] = {"median_ms": r.timing.median_ms,
                                             "passed": r.check.passed, "note": r.note}
                except Exception as exc:  # noqa: BLE001
                    record["cudnn"][name] = {"error": failure_reason(exc)}
        return record
    variant = lab.layer_variant(get_variant(task["variant"]))
    configs = candidate_configs(variant, shape, epilogue, count)
    record["own"] = variant.config_for(shape, epilogue).as_dict()
    record["offered"] = len(variant.configs(shape, epilogue))
    compile_all(variant, shape, epilogue, configs)
    for config in configs:
        record["candidates"].append({"config": config, **time_tiling(
            variant, config, shape, epilogue, problem, policy)})
    return record


def time_tiling(variant, config, shape, epilogue, problem, policy) -> dict:
    """One tiling of `variant` on `problem` (lab.LayerProblem), timed alone (CUDA events
    around queued launches, timer.time_device) into a NaN-filled output, then checked against
    float64 on the guard's sampled images: median_ms, min_ms, rse, passed and bound_ratio, or
    the error that stopped it (a tiling that fails is a data point)."""
    import cupy

    from convlab.bench import guard
    from convlab.bench.tune import failure_reason
    from convlab.gpu import timer

    layer = guard.Layer(shape, problem.weights, problem.bias, epilogue, variant.precision)
    try:
        op = variant.configured(config).prepare(shape, problem.weights, epilogue, problem.bias)
        x = op.stage(problem.x)
        y = cupy.full(op.output_shape, cupy.nan, dtype=op.output_dtype)
        timing = timer.time_device(lambda: op(x, y), policy)
        check = guard.verify_output(layer, problem.x, op.output(y))
        return {"median_ms": timing.median_ms, "min_ms": timing.min_ms, "rse": timing.rse,
                "passed": check.passed, "bound_ratio": check.bound_ratio}
    except Exception as exc:  # noqa: BLE001
        return {"error": failure_reason(exc)}


def worker(args):
    from convlab import tuning
    from convlab.bench import guard
    from convlab.gpu.timer import TimingPolicy

    draw = guard.draw_images
    guard.draw_images = lambda batch, rng, count=args.verify_images: draw(batch, rng, count)
    guard.ROW_BUDGET = 2_000_000
    os.environ.setdefault(tuning.IGNORE_ENV, "1")  # the own choice is the analytic model's
    policy = TimingPolicy(warmup=1, min_runs=3, max_runs=100, target_rse=0.02, budget_s=0.15)
    todo = json.loads(Path(args.tasks).read_text())
    journal = Path(args.journal)
    done = set()
    if journal.exists():
        for line in journal.read_text().splitlines():
            done.add(json.loads(line)["index"])
    with journal.open("a") as out:
        for index, task in todo:
            if index in done:
                continue
            out.write(json.dumps({"index": index, "begin": True}) + "\n")
            out.flush()
            start = time.time()
            record = run_task(task, args.configs, policy)
            record.update(index=index, seconds=time.time() - start)
            out.write(json.dumps(record) + "\n")
            out.flush()
            print(f"{index} {task['variant']} {task['label']}: {len(record['candidates'])} "
                  f"candidates, {record['seconds']:.1f} s", flush=True)


def supervise(args):
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    variants = args.variants.split(",")
    everything = list(enumerate(tasks(args.suite, args.random, variants, args.cudnn,
                                      args.split_cells)))
    print(f"{len(everything)} tasks on {args.gpus} GPUs", flush=True)
    procs = {}
    scratch = Path(tempfile.mkdtemp(prefix="sweep-tasks-"))

    def start(gpu):
        mine = [t for t in everything if t[0] % args.gpus == gpu]
        task_file = scratch / f"tasks-{gpu}.json"
        task_file.write_text(json.dumps(mine))
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu)}
        return subprocess.Popen([sys.executable, __file__, "--worker", "--tasks", str(task_file),
                                 "--journal", str(out / f"sweep-{gpu}.jsonl"),
                                 "--configs", str(args.configs),
                                 "--verify-images", str(args.verify_images)], env=env)

    # A time limit's SIGTERM ends the workers too, each journal whole up to its last task.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    held = args.hold_gpu0 is not None
    for gpu in range(1 if held else 0, args.gpus):
        procs[gpu] = start(gpu)
    try:
        watch(args, out, procs, start, held)
    finally:
        for proc in procs.values():
            proc.terminate()


def watch(args, out, procs, start, held):
    while procs or held:
        if held and Path(args.hold_gpu0).exists():
            held = False
            procs[0] = start(0)
        time.sleep(2)
        for gpu, proc in list(procs.items()):
            code = proc.poll()
            if code is None:
                continue
            journal = out / f"sweep-{gpu}.jsonl"
            lines = [json.loads(x) for x in journal.read_text().splitlines()] \
                if journal.exists() else []
            finished = {x["index"] for x in lines if not x.get("begin")}
            begun = [x["index"] for x in lines if x.get("begin") and x["index"] not in finished]
            if code == 0 or not begun:
                del procs[gpu]
                print(f"GPU {gpu}: done ({len(finished)} tasks)", flush=True)
                continue
            with journal.open("a") as f:
                f.write(json.dumps({"index": begun[-1], "crashed": code}) + "\n")
            print(f"GPU {gpu}: task {begun[-1]} crashed ({code}); restarting", flush=True)
            procs[gpu] = start(gpu)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?")
    parser.add_argument("--suite", default="all")
    parser.add_argument("--random", type=int, default=32)
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--configs", type=int, default=16)
    parser.add_argument("--verify-images", type=int, default=1)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--cudnn", action="store_true",
                        help="Also time each cell's cuDNN rows (both layouts, each class).")
    parser.add_argument("--split-cells", action="store_true",
                        help="Only the cells where a variant's candidates split K (too few "
                             "output tiles for the GPU).")
    parser.add_argument("--hold-gpu0", help="Start GPU 0's worker once this file exists.")
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--tasks")
    parser.add_argument("--journal")
    args = parser.parse_args()
    if args.worker:
        worker(args)
    else:
        supervise(args)


if __name__ == "__main__":
    main()
