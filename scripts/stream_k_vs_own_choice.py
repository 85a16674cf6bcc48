"""The wgmma kernel's stream-K schedule (igemm.wgmma.StreamK: the tiles' K-tiles cut into one
equal run a block) against the own choice, on the public suites' cells where the own choice's
units of work leave slots idle in their last wave (`idle_share` above IDLE), and a few where
they do not: that choice and up to PER_CELL stream-K tilings (`stream_k_tilings`), each timed
on one problem (CUDA events around queued launches, timer.time_device, shipped and cached
tunings ignored) and verified against float64 on a sampled image. One JSON line a cell, with
each tiling's time, the analytic model's estimate and the own choice's idle share.

Usage: python scripts/stream_k_vs_own_choice.py OUT.jsonl VARIANT[,VARIANT...] [CONTROLS]"""

import json
import os
import sys
import time

os.environ.setdefault("CONVLAB_IGNORE_TUNINGS", "1")

from convlab.bench import guard, lab  # noqa: E402
from convlab.gpu import timer  # noqa: E402
from convlab.kernels.igemm import cost, tiling, wgmma as IW  # noqa: E402
from sweep_tilings import compile_tilings, suite_cells, time_tiling  # noqa: E402

POLICY = timer.TimingPolicy(warmup=2, min_runs=5, max_runs=200, target_rse=0.01, budget_s=0.25)
PER_CELL = 3
IDLE = 0.1


def idle_share(k, t, maths) -> float:
    """The share of the GPU's slots idle through `t`'s launch, its units in whole waves: 1 -
    units / (waves x slots), a unit a tile's K-split (a halo tile, a pingpong 64-row tile)."""
    slots = cost.SMS * IW.blocks_per_sm(t, maths, k)
    units = tiling.output_tiles(k, t) * t.split_k
    return 1 - units / (-(-units // slots) * slots)


def stream_k_tilings(k, maths, own):
    """The stream-K tilings to time on a layer: the own choice's block tile and gather (the
    copy engine's where it gathered by tap) at its stages or the most there are, 128x128 by
    the copy engine at the most stages, and the analytic model's first."""
    ranked = [t for t in cost.ranked(k, maths, IW.FAMILY) if t.schedule == "stream-k"]
    found = []
    for bm, bn, gathers in ((own.bm * (2 if own.schedule == "pingpong" else 1), own.bn,
                             (own.gather, "tma")), (128, 128, ("tma",))):
        same = [t for t in ranked if t.bm == bm and t.bn == bn and t.gather in gathers]
        same.sort(key=lambda t: (t.gather != own.gather, t.stages != own.stages, -t.stages))
        found += same[:1]
    found += ranked[:1]
    return list(dict.fromkeys(found))[:PER_CELL]


def cells(names, controls):
    """(variant, layer, batch, shape, own, tilings) for every cell whose own choice idles more
    than IDLE of the slots and has stream-K tilings, then `controls` others a variant."""
    tasks = []
    for name in names:
        rest = []
        for variant, layer, batch, shape in suite_cells(name):
            k = variant.kernel_shape(shape)
            own = variant.config_for(shape, layer.epilogue)
            streams = stream_k_tilings(k, variant.maths, own)
            if not streams:
                continue
            task = (variant, layer, batch, shape, own, [own, *streams])
            if idle_share(k, own, variant.maths) > IDLE:
                tasks.append(task)
            else:
                rest.append(task)
        tasks += rest[::max(1, len(rest) // controls)][:controls] if controls else []
    return tasks


def main():
    draw = guard.draw_images
    guard.draw_images = lambda batch, rng, count=1: draw(batch, rng, count)
    guard.ROW_BUDGET = 2_000_000
    out, names = sys.argv[1], sys.argv[2].split(",")
    controls = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    tasks = cells(names, controls)
    print(f"{len(tasks)} cells, {sum(len(t[5]) for t in tasks)} tilings", flush=True)
    if os.environ.get("STREAM_K_DRY_RUN"):
        return
    start = time.time()
    compile_tilings([(variant, t, shape, layer.epilogue)
                     for variant, layer, _, shape, _, chosen in tasks for t in chosen], 15)
    print(f"compiled in {time.time() - start:.0f} s", flush=True)
    with open(out, "w") as journal:
        for variant, layer, batch, shape, own, chosen in tasks:
            k = variant.kernel_shape(shape)
            problem = lab.LayerProblem.draw(shape, True, seed=1)
            record = {"variant": variant.name, "layer": layer.label, "batch": batch,
                      "shape": shape.describe(), "own": own.brief(),
                      "own_idle": idle_share(k, own, variant.maths), "tilings": []}
            for t in chosen:
                result = time_tiling(variant, t, shape, layer.epilogue, problem, POLICY)
                record["tilings"].append({
                    "tiling": t.brief(), "config": t.as_dict(),
                    "estimate_us": cost.estimate(k, t, variant.maths, IW.FAMILY), **result})
            journal.write(json.dumps(record) + "\n")
            journal.flush()
            times = {r["tiling"]: r.get("median_ms") for r in record["tilings"]}
            ok = all(r.get("passed") for r in record["tilings"])
            sk = {b: m for b, m in times.items() if b.endswith(" sk") and m}
            best = min(sk, key=sk.get) if sk else None
            own_ms = times.get(own.brief())
            line = (f"{variant.name:11s} {layer.label:28s} b{batch:<3d} idle "
                    f"{record['own_idle']:.2f} own {own_ms or 0:.4f} [{own.brief()}]")
            if best:
                line += f" sk {sk[best]:.4f} [{best}] x{(own_ms or 0) / sk[best]:.3f}"
            print(line + ("" if ok else " CHECK"), flush=True)


if __name__ == "__main__":
    main()
