"""The wgmma kernel's pingpong schedule (igemm.wgmma.Pingpong: two MMA warpgroups on 64-row
tiles of their own, in turn) against the fitted correction's choice (the own choice before the
pingpong rule; `correction_choice`): on the public suites' cells with the most 64-row tiles (at
least two for every SM, where a block has tiles to alternate) and a few smaller ones, that
choice and up to PER_CELL pingpong tilings (pingpong_tilings),
each timed on one problem (CUDA events around queued launches, timer.time_device, shipped and
cached tunings ignored) and verified against float64 on a sampled image. One JSON line a cell,
with each tiling's time and the analytic model's estimate of it.

With CELLS "rule": every suite cell where the own choice is the pingpong twin, the twin
against the tiling the rule traded for it ("own" in the lines and records).

Usage: python scripts/pingpong_vs_own_choice.py OUT.jsonl VARIANT[,VARIANT...] [CELLS|rule]"""

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
PER_CELL = 4


def pingpong_tilings(k, maths, own):
    """The pingpong tilings to time on a layer: `own`'s N and gather at the two
    deepest stage counts that fit, 256 wide with the same gather, and the analytic model's
    first pingpong tiling."""
    ranked = [t for t in cost.ranked(k, maths, IW.FAMILY) if t.schedule == "pingpong"]
    found = []
    for bn in (own.bn, 256):
        same = sorted((t for t in ranked if t.bn == bn and t.gather == own.gather),
                      key=lambda t: -t.stages)
        found += same[:2 if bn == own.bn else 1]
    found += ranked[:1]
    return list(dict.fromkeys(found))[:PER_CELL]


def correction_choice(variant, shape, epilogue):
    """The fitted correction's first tiling: the own choice, or what the pingpong rule
    (igemm.wgmma.preferred_pingpong) traded for its twin."""
    return next(t for t in variant.configs(shape, epilogue) if t.schedule != "pingpong")


def cells(names, count):
    """(variant, layer, batch, shape, own, tilings) for `count` cells a variant: the large ones
    first (most 64-row tiles), then every fourth of the rest, up to a fifth of the count."""
    tasks = []
    for name in names:
        found = []
        for variant, layer, batch, shape in suite_cells(name):
            k = variant.kernel_shape(shape)
            own = correction_choice(variant, shape, layer.epilogue)
            pingpong = pingpong_tilings(k, variant.maths, own)
            if not pingpong:
                continue
            tiles = tiling.output_tiles(k, pingpong[0])
            found.append((tiles, variant, layer, batch, shape, own, pingpong))
        found.sort(key=lambda c: -c[0])
        large = [c for c in found if c[0] >= 2 * cost.SMS][:count - count // 5]
        rest = [c for c in found if c[0] < 2 * cost.SMS][::4][:count - len(large)]
        for _, variant, layer, batch, shape, own, pingpong in large + rest:
            tasks.append((variant, layer, batch, shape, own, [own, *pingpong]))
    return tasks


def rule_cells(names):
    """Every suite cell where the own choice is a pingpong twin (igemm.wgmma.preferred_pingpong):
    the tiling the rule traded for it, then the twin."""
    tasks = []
    for name in names:
        for variant, layer, batch, shape in suite_cells(name):
            own = variant.config_for(shape, layer.epilogue)
            if own.schedule != "pingpong":
                continue
            traded = correction_choice(variant, shape, layer.epilogue)
            # the one-wave rule's cells (igemm.wgmma.one_wave_pingpong) are another record's
            k = variant.kernel_shape(shape)
            if IW.preferred_pingpong(k, traded, variant.maths) == own:
                tasks.append((variant, layer, batch, shape, traded, [traded, own]))
    return tasks


def main():
    draw = guard.draw_images
    guard.draw_images = lambda batch, rng, count=1: draw(batch, rng, count)
    guard.ROW_BUDGET = 2_000_000
    out, names = sys.argv[1], sys.argv[2].split(",")
    which = sys.argv[3] if len(sys.argv) > 3 else "24"
    tasks = rule_cells(names) if which == "rule" else cells(names, int(which))
    print(f"{len(tasks)} cells, {sum(len(t[5]) for t in tasks)} tilings", flush=True)
    start = time.time()
    compile_tilings([(variant, t, shape, layer.epilogue)
                     for variant, layer, _, shape, _, chosen in tasks for t in chosen], 15)
    print(f"compiled in {time.time() - start:.0f} s", flush=True)
    with open(out, "w") as journal:
        for variant, layer, batch, shape, own, chosen in tasks:
            problem = lab.LayerProblem.draw(shape, True, seed=1)
            record = {"variant": variant.name, "layer": layer.label, "batch": batch,
                      "shape": shape.describe(), "own": own.brief(), "tilings": []}
            for t in chosen:
                result = time_tiling(variant, t, shape, layer.epilogue, problem, POLICY)
                k = variant.kernel_shape(shape)
                record["tilings"].append({
                    "tiling": t.brief(), "config": t.as_dict(),
                    "estimate_us": cost.estimate(k, t, variant.maths, IW.FAMILY), **result})
            journal.write(json.dumps(record) + "\n")
            journal.flush()
            times = {r["tiling"]: r.get("median_ms") for r in record["tilings"]}
            ok = all(r.get("passed") for r in record["tilings"])
            pp = {b: m for b, m in times.items() if b.endswith(" pp") and m}
            best = min(pp, key=pp.get) if pp else None
            own_ms = times.get(own.brief())
            line = (f"{variant.name:11s} {layer.label:28s} b{batch:<3d} own {own_ms or 0:.4f} "
                    f"[{own.brief()}]")
            if best:
                line += f" pp {pp[best]:.4f} [{best}] x{(own_ms or 0) / pp[best]:.3f}"
            print(line + ("" if ok else " CHECK"), flush=True)


if __name__ == "__main__":
    main()
