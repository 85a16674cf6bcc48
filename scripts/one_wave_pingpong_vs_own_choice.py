"""Layers whose tiles fit one wave of blocks: the own choice against pingpong tilings
(igemm.wgmma.Pingpong), each tiling timed on one problem (CUDA events around queued launches,
timer.time_device, shipped and cached tunings ignored) and verified against float64 on a
sampled image. One JSON line a cell.

CELLS "ranked" (how the rule was found): the fitted correction (igemm.learned), which ranks no
pingpong tiling in the own choice, also ranks every pingpong tiling that splits nothing and
whose tiles fit one block an SM; on every cell where that changes its first tiling, three are
timed: the own choice without the one-wave rule (`before`), the pingpong tiling the correction
then takes (`pingpong`), and that tiling's one-warpgroup persistent twin (`twin`: same N,
gather and split, at its most stages).

CELLS "rule" (how it was checked): every cell where the own choice is the one-wave rule's
pingpong tiling (igemm.wgmma.one_wave_pingpong), against the tiling the rule traded for it
(`before`).

The cells: every public suite cell meant for the variant, then RANDOM layers drawn as
scripts/sweep_tilings.py draws them (the suites' kinds at batches 1-256), seeded by SEED.

Usage: python scripts/one_wave_pingpong_vs_own_choice.py OUT.jsonl VARIANT[,VARIANT...]
       ranked|rule [RANDOM [SEED]]"""

import json
import os
import sys
import time

os.environ.setdefault("CONVLAB_IGNORE_TUNINGS", "1")

from convlab.bench import guard, lab  # noqa: E402
from convlab.gpu import timer  # noqa: E402
from convlab.kernels import get_variant  # noqa: E402
from convlab.kernels.igemm import cost, learned, tiling, wgmma as IW  # noqa: E402
from convlab.shapes import ConvShape  # noqa: E402
from sweep_tilings import compile_tilings, random_layers, suite_cells, time_tiling  # noqa: E402

POLICY = timer.TimingPolicy(warmup=2, min_runs=5, max_runs=200, target_rse=0.01, budget_s=0.25)


def one_wave(k, t, maths) -> bool:
    return (t.schedule == "pingpong" and t.split_k == 1 and maths in IW.PINGPONG_MATHS
            and tiling.output_tiles(k, t) <= cost.SMS)


def correction_first(k, maths):
    """The correction's first tiling with one-wave pingpong tilings let into its ranking."""
    candidates = [t for t in cost.ranked(k, maths, IW.FAMILY)
                  if t.schedule != "pingpong" or one_wave(k, t, maths)]
    return min(candidates, key=lambda t: learned.score(
        k, t, maths, cost.estimate(k, t, maths, IW.FAMILY)), default=None)


def one_warpgroup_twin(k, t, maths):
    twins = [p for p in cost.ranked(k, maths, IW.FAMILY)
             if p.schedule == "persistent" and p.warps_m == 4 and p.bm == t.bm
             and p.bn == t.bn and p.gather == t.gather and p.split_k == 1 and p.cluster == 1]
    return max(twins, key=lambda p: p.stages, default=None)


def without_one_wave_rule(variant, k, shape, epilogue):
    """(the own choice as it would be without the one-wave rule, whether the rule took it)"""
    offered = variant.configs(shape, epilogue)
    traded = next(t for t in offered if t.schedule != "pingpong")
    taken = offered[0].schedule == "pingpong" and (
        IW.one_wave_pingpong(k, traded, variant.maths) == offered[0])
    return (traded if taken else offered[0]), taken


def layers(names, extra, seed):
    drawn = []
    for layer in random_layers(extra, seed) if extra else []:
        shape = ConvShape(**layer["shape"])
        for name in names:
            variant = lab.layer_variant(get_variant(name))
            if variant.supports(shape) and shape.groups == 1:
                drawn.append((variant, layer["label"], shape.B, shape, layer["epilogue"]))
    return [(variant, layer.label, batch, shape, layer.epilogue)
            for name in names for variant, layer, batch, shape in suite_cells(name)] + drawn


def cells(names, mode, extra, seed):
    tasks = []
    for variant, label, batch, shape, epilogue in layers(names, extra, seed):
        if epilogue == "add-relu":
            continue
        k = variant.kernel_shape(shape)
        before, taken = without_one_wave_rule(variant, k, shape, epilogue)
        if mode == "rule":
            if taken:
                chosen = [("before", before), ("pingpong", variant.config_for(shape, epilogue))]
                tasks.append((variant, label, batch, shape, epilogue, chosen))
            continue
        pingpong = correction_first(k, variant.maths)
        if pingpong is None or pingpong.schedule != "pingpong" or pingpong == before:
            continue
        twin = one_warpgroup_twin(k, pingpong, variant.maths)
        chosen = [("before", before), ("pingpong", pingpong)] + ([("twin", twin)] if twin else [])
        tasks.append((variant, label, batch, shape, epilogue, chosen))
    return tasks


def main():
    draw = guard.draw_images
    guard.draw_images = lambda batch, rng, count=1: draw(batch, rng, count)
    guard.ROW_BUDGET = 2_000_000
    out, names, mode = sys.argv[1], sys.argv[2].split(","), sys.argv[3]
    extra = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    seed = int(sys.argv[5]) if len(sys.argv) > 5 else 2026
    tasks = cells(names, mode, extra, seed)
    print(f"{len(tasks)} cells, {sum(len(t[5]) for t in tasks)} tilings", flush=True)
    start = time.time()
    compile_tilings([(variant, t, shape, epilogue) for variant, _, _, shape, epilogue, chosen
                     in tasks for _, t in chosen], os.cpu_count())
    print(f"compiled in {time.time() - start:.0f} s", flush=True)
    with open(out, "w") as journal:
        for variant, label, batch, shape, epilogue, chosen in tasks:
            problem = lab.LayerProblem.draw(shape, True, seed=1)
            k = variant.kernel_shape(shape)
            record = {"variant": variant.name, "layer": label, "batch": batch,
                      "shape": shape.describe(), "shape_dict": shape.as_dict(),
                      "epilogue": epilogue, "tilings": {}}
            for role, t in chosen:
                record["tilings"][role] = {
                    "tiling": t.brief(), "config": t.as_dict(),
                    "output_tiles": tiling.output_tiles(k, t) * t.split_k,
                    "estimate_us": cost.estimate(k, t, variant.maths, IW.FAMILY),
                    **time_tiling(variant, t, shape, epilogue, problem, POLICY)}
            journal.write(json.dumps(record) + "\n")
            journal.flush()
            ms = {role: r.get("median_ms") for role, r in record["tilings"].items()}
            ok = all(r.get("passed") for r in record["tilings"].values())
            line = f"{variant.name:11s} {label:30s} b{batch:<3d}"
            for role, r in record["tilings"].items():
                line += f" {role} {ms[role] or 0:.4f} [{r['tiling']}]"
            if ms.get("before") and ms.get("pingpong"):
                line += f" x{ms['before'] / ms['pingpong']:.3f}"
            print(line + ("" if ok else " CHECK"), flush=True)


if __name__ == "__main__":
    main()
