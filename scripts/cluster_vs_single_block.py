"""Two-block clusters (Tiling.cluster 2: one copy of B for two blocks on neighbouring m-tiles,
or of A for two on neighbouring pixel tiles, Tiling.shares) against the same tilings a block
alone, in tf32 and fp16: the first COUNT unsplit block tiles of the cost model's ranking that
the copy engine gathers for (one per block tile), each alone and in both clusters where the
layer has them, the own choice and the reference rows beside them (cuDNN's two layouts, and
cuBLAS's GEMM where it runs the layer). Each timed on one problem (timer.time_device, shipped
and cached tunings ignored) and verified against float64 on a sampled image; one JSON line a
layer and maths. Without CELLs: large layers where cuDNN led and a few ResNet-50 ones, with
ReLU (the record results/h200/wgmma-clusters-20261129/); CELLs name suite layers at a batch
(NETWORK:LAYER@BATCH, each with its suite's epilogue).

Usage: python scripts/cluster_vs_single_block.py OUT.jsonl [COUNT [CELL...]]  (COUNT 6)"""

import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

os.environ.setdefault("CONVLAB_IGNORE_TUNINGS", "1")

from convlab.bench import guard, lab  # noqa: E402
from convlab.bench.tune import failure_reason  # noqa: E402
from convlab.gpu import timer  # noqa: E402
from convlab.gpu.jit import cubin_file  # noqa: E402
from convlab.kernels import RELU, get_variant  # noqa: E402
from convlab.kernels.igemm.cost import diverse  # noqa: E402
from convlab.shapes import ConvShape  # noqa: E402
from small_layers_tilings_against_cudnn import REFERENCES, layers  # noqa: E402
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
VARIANTS = {"fp16": "wgmma-fp16", "tf32": "wgmma"}
POLICY = timer.TimingPolicy(warmup=2, min_runs=5, max_runs=200, target_rse=0.01, budget_s=0.3)


def timed(variant, t, shape, epilogue, problem) -> dict:
    """sweep_tilings.time_tiling's figures, in this record's keys: ms, rse, passed (or error)."""
    result = time_tiling(variant, t, shape, epilogue, problem, POLICY)
    if "error" in result:
        return result
    return {"ms": result["median_ms"], "rse": result["rse"], "passed": result["passed"]}


def families(variant, shape, count):
    """The first `count` unsplit copy-engine block tiles of the ranking a block alone (one per
    block tile), each followed by its clusters that the layer has."""
    ranked = variant.ranked(shape)
    alone = [t for t in ranked if t.cluster == 1 and t.schedule == "persistent"
             and t.gather == "tma" and t.split_k == 1]
    return [[t] + [c for c in ranked if c.cluster > 1 and c.alone == t]
            for t in diverse(tuple(alone), count, per_block_tile=1)]


def references(shape, epilogue, maths, problem) -> dict:
    found = {}
    for name in REFERENCES[maths]:
        if not get_variant(name).supports(shape):
            continue
        try:
            found[name] = lab.run_layer(shape, name, POLICY, epilogue,
                                        problem=problem).timing.median_ms
        except Exception as exc:  # noqa: BLE001
            found[name] = failure_reason(exc)
    return found


def main():
    draw = guard.draw_images
    guard.draw_images = lambda batch, rng, count=1: draw(batch, rng, count)
    guard.ROW_BUDGET = 2_000_000
    out, count = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 6
    cells = (layers(sys.argv[3:]) if len(sys.argv) > 3 else
             [(label, shape, RELU) for label, shape in LAYERS.items()])
    with open(out, "w") as journal:
        for label, shape, epilogue in cells:
            problem = lab.LayerProblem.draw(shape, True, seed=1)
            for maths, name in VARIANTS.items():
                start = time.time()
                variant = lab.layer_variant(get_variant(name))
                own = variant.config_for(shape, epilogue)
                todo = list(dict.fromkeys(
                    [own] + [t for family in families(variant, shape, count) for t in family]))

                def build(t):
                    v = variant.configured(t)
                    try:
                        cubin_file(v.name, v.source, v.compile_options(shape, epilogue), v.arch)
                    except Exception:  # noqa: BLE001 - its timing reports it
                        pass

                with ThreadPoolExecutor(max_workers=os.cpu_count()) as pool:
                    list(pool.map(build, todo))
                rows = [{"tiling": t.brief(), "config": t.as_dict(), "own": t == own,
                         "cluster": t.cluster, "shares": t.shares,
                         **timed(variant, t, shape, epilogue, problem)} for t in todo]
                reference = references(shape, epilogue, maths, problem)
                record = {"layer": label, "shape": shape.describe(), "maths": maths,
                          "epilogue": epilogue, "rows": rows, "cudnn": reference,
                          "seconds": time.time() - start}
                journal.write(json.dumps(record) + "\n")
                journal.flush()

                def best(cluster, shares="b"):
                    return min((r["ms"] for r in rows if r.get("passed") and r["cluster"] ==
                                cluster and r["shares"] == shares), default=0)
                ownms = next((r.get("ms", 0) for r in rows if r["own"]), 0)
                ref = min((v for v in reference.values() if isinstance(v, float)), default=0)
                fails = [r["tiling"] for r in rows if not r.get("passed")]
                print(f"{label:30s} {maths} own {ownms * 1e3:6.1f} c1 {best(1) * 1e3:6.1f} "
                      f"c2a {best(2, 'a') * 1e3:6.1f} c2 {best(2) * 1e3:6.1f} reference "
                      f"{ref * 1e3:6.1f} us  fails {fails}  {record['seconds']:.0f}s", flush=True)


if __name__ == "__main__":
    main()
