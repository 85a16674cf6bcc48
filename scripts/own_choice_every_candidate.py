"""The wgmma variants' own choice made over every candidate (kernels.wgmma's `_offered`, as
now) against the choice the fitted correction once made over the analytic model's first
MAX_CONFIGS alone (`first_sixteen`): every public-suite cell where the two differ, both timed
on one problem (CUDA events around queued launches, timer.time_device, shipped and cached
tunings ignored), both verified against float64 on a sampled image. One JSON line a cell:
`old` the first-sixteen choice, `new` today's.
The record: results/h200/own-choice-20261129/.

Usage: python scripts/own_choice_every_candidate.py OUT.jsonl VARIANT[,VARIANT...]"""

import json
import os
import sys
import time

os.environ.setdefault("CONVLAB_IGNORE_TUNINGS", "1")

from convlab.bench import guard, lab  # noqa: E402
from convlab.gpu import timer  # noqa: E402
from convlab.kernels import wgmma as W  # noqa: E402
from convlab.kernels.igemm import cost, learned, wgmma as IW  # noqa: E402
from sweep_tilings import compile_tilings, suite_cells, time_tiling  # noqa: E402

POLICY = timer.TimingPolicy(warmup=2, min_runs=5, max_runs=200, target_rse=0.01, budget_s=0.25)


def first_sixteen(k, maths):
    """The correction's order over the analytic model's diverse first MAX_CONFIGS (four of
    them halo tilings where the layer has them), blocks alone: the choice before 2026-11-29."""
    ranked = tuple(t for t in cost.ranked(k, maths, IW.FAMILY)
                   if t.cluster == 1 and t.schedule != "pingpong")
    return sorted(W._spread(ranked, 0),
                  key=lambda t: learned.score(k, t, maths, cost.estimate(k, t, maths, IW.FAMILY)))


def main():
    draw = guard.draw_images
    guard.draw_images = lambda batch, rng, count=1: draw(batch, rng, count)
    guard.ROW_BUDGET = 2_000_000
    out, names = sys.argv[1], sys.argv[2].split(",")
    tasks = []
    for name in names:
        for variant, layer, batch, shape in suite_cells(name):
            k = variant.kernel_shape(shape)
            old, new = first_sixteen(k, variant.maths)[0], variant.configs(shape, layer.epilogue)[0]
            if old != new:
                tasks.append((variant, layer, batch, shape, old, new))
    print(f"{len(tasks)} cells differ", flush=True)
    start = time.time()
    compile_tilings([(variant, t, shape, layer.epilogue)
                     for variant, layer, _, shape, old, new in tasks for t in (old, new)], 15)
    print(f"compiled in {time.time() - start:.0f} s", flush=True)
    with open(out, "w") as journal:
        for variant, layer, batch, shape, old, new in tasks:
            problem = lab.LayerProblem.draw(shape, True, seed=1)
            record = {"variant": variant.name, "layer": layer.label, "batch": batch,
                      "shape": shape.describe()}
            for key, t in (("old", old), ("new", new)):
                result = time_tiling(variant, t, shape, layer.epilogue, problem, POLICY)
                if "error" not in result:
                    result = {"ms": result["median_ms"], "rse": result["rse"],
                              "passed": result["passed"]}
                record[key] = {"tiling": t.brief(), "config": t.as_dict(), **result}
            journal.write(json.dumps(record) + "\n")
            journal.flush()
            o, n = record["old"].get("ms", 0), record["new"].get("ms", 0)
            ok = record["old"].get("passed") and record["new"].get("passed")
            print(f"{variant.name:11s} {layer.label:30s} b{batch:<3d} old {o:.4f} new {n:.4f} "
                  f"x{(o / n if n else 0):.2f} {'' if ok else 'CHECK'}", flush=True)


if __name__ == "__main__":
    main()
