"""Two-block clusters (Tiling.cluster 2: one B copy for two blocks on neighbouring m-tiles)
against the same tilings a block alone, on large layers where cuDNN led and a few ResNet-50
ones, in tf32 and fp16 with the network's ReLU: the first COUNT cluster tilings of the cost
model's ranking (one per block tile) and their twins, the own choice and the fastest of
cuDNN's two layouts beside them. Each timed on one problem (timer.time_device, shipped and
cached tunings ignored) and verified against float64 on a sampled image; one JSON line a
layer and maths. The record: results/h200/wgmma-clusters-20261129/.

Usage: python scripts/cluster_vs_single_block.py OUT.jsonl [COUNT]  (default 6)"""

import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

os.environ.setdefault("CONVLAB_IGNORE_TUNINGS", "1")

from convlab.bench import guard, lab  # noqa: E402
from convlab.bench.tune import failure_reason  # noqa: E402
from convlab.gpu import timer  # noqa: E402
from convlab.gpu.jit import cubin_file  # noqa: E402
from convlab.kernels import RELU, get_variant  # noqa: E402
from convlab.kernels.igemm.cost import diverse  # noqa: E402
from convlab.shapes import ConvShape  # noqa: E402
from sweep_tilings import time_tiling  # noqa: E402

LAYERS = {
    "unet down1.conv1 b128": ConvShape(128, 64, 128, 128, 128, 3, pad=1, bias=True),
    "unet down2.conv1 b128": ConvShape(128, 128, 64, 64, 256, 3, pad=1, bias=True),
    "unet down2.conv2 b128": ConvShape(128, 256, 64, 64, 256, 3, pad=1, bias=True),
    "unet down3.conv2 b128": ConvShape(128, 512, 32, 32, 512, 3, pad=1, bias=True),
    "vgg16 features.5 b128": ConvShape(128, 64, 112, 112, 128, 3, pad=1, bias=True),
    "vgg16 features.7 b128": ConvShape(128, 128, 112, 112, 128, 3, pad=1, bias=True),
    "resnet50 layer2 3x3 b128": ConvShape(128, 128, 28, 28, 128, 3, pad=1, bias=True),
    "resnet50 1x1 64->256 b128": ConvShape(128, 64, 56, 56, 256, 1, bias=True),
    "resnet50 layer3 3x3 b32": ConvShape(32, 256, 14, 14, 256, 3, pad=1, bias=True),
}
CUDNN = {"fp16": ("cudnn-fp16", "cudnn-nhwc-fp16"), "tf32": ("cudnn-tf32", "cudnn-nhwc-tf32")}
VARIANTS = {"fp16": "wgmma-fp16", "tf32": "wgmma"}
POLICY = timer.TimingPolicy(warmup=2, min_runs=5, max_runs=200, target_rse=0.01, budget_s=0.3)


def timed(variant, t, shape, epilogue, problem) -> dict:
    """sweep_tilings.time_tiling's figures, in this record's keys: ms, rse, passed (or error)."""
    result = time_tiling(variant, t, shape, epilogue, problem, POLICY)
    if "error" in result:
        return result
    return {"ms": result["median_ms"], "rse": result["rse"], "passed": result["passed"]}


def pairs(variant, shape, count):
    """The first `count` cluster tilings of the ranking (spread by block tile), each with its
    one-block twin."""
    c2 = [t for t in variant.ranked(shape) if t.cluster == 2]
    return [(replace(t, cluster=1), t) for t in diverse(tuple(c2), count, per_block_tile=1)]


def main():
    draw = guard.draw_images
    guard.draw_images = lambda batch, rng, count=1: draw(batch, rng, count)
    guard.ROW_BUDGET = 2_000_000
    out, count = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 6
    with open(out, "w") as journal:
        for label, shape in LAYERS.items():
            problem = lab.LayerProblem.draw(shape, True, seed=1)
            for maths, name in VARIANTS.items():
                start = time.time()
                variant = lab.layer_variant(get_variant(name))
                own = variant.config_for(shape, RELU)
                todo = [own] + [t for pair in pairs(variant, shape, count) for t in pair]
                todo = list(dict.fromkeys(todo))

                def build(t):
                    v = variant.configured(t)
                    try:
                        cubin_file(v.name, v.source, v.compile_options(shape, RELU), v.arch)
                    except Exception:  # noqa: BLE001 - its timing reports it
                        pass

                with ThreadPoolExecutor(max_workers=14) as pool:
                    list(pool.map(build, todo))
                rows = [{"tiling": t.brief(), "own": t == own, "cluster": t.cluster,
                         **timed(variant, t, shape, RELU, problem)} for t in todo]
                cudnn = {}
                for ref in CUDNN[maths]:
                    try:
                        r = lab.run_layer(shape, ref, POLICY, RELU, problem=problem)
                        cudnn[ref] = r.timing.median_ms
                    except Exception as exc:  # noqa: BLE001
                        cudnn[ref] = failure_reason(exc)
                record = {"layer": label, "shape": shape.describe(), "maths": maths,
                          "rows": rows, "cudnn": cudnn, "seconds": time.time() - start}
                journal.write(json.dumps(record) + "\n")
                journal.flush()
                best = lambda c: min((r["ms"] for r in rows  # noqa: E731
                                      if r.get("cluster") == c and r.get("passed")), default=0)
                ownms = next((r.get("ms", 0) for r in rows if r["own"]), 0)
                ref = min(v for v in cudnn.values() if isinstance(v, float))
                fails = [r["tiling"] for r in rows if not r.get("passed")]
                print(f"{label:28s} {maths} own {ownms:.4f} c1 {best(1):.4f} c2 {best(2):.4f} "
                      f"cudnn {ref:.4f}  fails {fails}  {record['seconds']:.0f}s", flush=True)


if __name__ == "__main__":
    main()
