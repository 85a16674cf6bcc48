"""What a change to the own choice does on the public layer suites: the own choice of every
suite cell for the wgmma variants, written by one tree, then, on a GPU, every cell whose choice
differs between two such files with both tilings timed on one problem (CUDA events around
queued launches, timer.time_device, shipped and cached tunings ignored), in turns, and both
verified against float64 on a sampled image. A tiling's time is the least of its turns'
medians; one JSON line a cell, `before` and `after`, and a line a cell printed as it goes, then
the geometric mean of before over after per variant.

Usage: python scripts/time_choice_changes.py choices OUT.json [VARIANT,...]   (no GPU needed)
       python scripts/time_choice_changes.py time BEFORE.json AFTER.json OUT.jsonl [ROUNDS]"""

import json
import math
import os
import sys
from collections import defaultdict

os.environ.setdefault("CONVLAB_IGNORE_TUNINGS", "1")

from convlab.bench import lab, suites  # noqa: E402
from convlab.gpu import timer  # noqa: E402
from convlab.kernels import get_variant  # noqa: E402
from sweep_tilings import compile_tilings, suite_cells, time_tiling  # noqa: E402

VARIANTS = ("wgmma", "wgmma-fp16", "wgmma-bf16", "wgmma-3xtf32", "wgmma-split-bf16")
POLICY = timer.TimingPolicy(warmup=2, min_runs=5, max_runs=200, target_rse=0.01, budget_s=0.25)


def key(variant: str, label: str, batch: int) -> str:
    return f"{variant} | {label} | {batch}"


def choices(out: str, names: list[str]) -> None:
    found = {}
    for name in names:
        for variant, layer, batch, shape in suite_cells(name):
            found[key(name, layer.label, batch)] = variant.config_for(
                shape, layer.epilogue).as_dict()
    with open(out, "w") as f:
        json.dump(found, f, indent=1, sort_keys=True)
    print(f"{len(found)} cells")


def changed_cells(before: dict, after: dict):
    """(variant, layer, batch, shape, before tiling, after tiling) where the two differ."""
    layers = {layer.label: layer for layer in suites.get_suite("all")}
    for cell in sorted(after):
        if cell in before and before[cell] != after[cell]:
            name, label, batch = cell.split(" | ")
            layer = layers[label]
            variant = lab.layer_variant(get_variant(name))
            yield variant, layer, int(batch), layer.at(int(batch)), before[cell], after[cell]


def time_changes(before_file: str, after_file: str, out: str, rounds: int) -> None:
    with open(before_file) as f, open(after_file) as g:
        cells = list(changed_cells(json.load(f), json.load(g)))
    compile_tilings([(v, c, s, layer.epilogue) for v, layer, _, s, *pair in cells
                     for c in pair], os.cpu_count())
    ratios = defaultdict(list)
    with open(out, "w") as journal:
        for variant, layer, batch, shape, old, new in cells:
            problem = lab.LayerProblem.draw(shape, True, seed=1)
            turns = {"before": [], "after": []}
            for _ in range(rounds):
                for side, config in (("before", old), ("after", new)):
                    turns[side].append(time_tiling(variant, config, shape, layer.epilogue,
                                                   problem, POLICY))
            record = {"variant": variant.name, "layer": layer.label, "batch": batch,
                      "shape": shape.as_dict(), "epilogue": layer.epilogue,
                      "before": {"config": old, "turns": turns["before"]},
                      "after": {"config": new, "turns": turns["after"]}}
            journal.write(json.dumps(record) + "\n")
            journal.flush()
            failed = [t for side in turns.values() for t in side if not t.get("passed")]
            if failed:
                print(f"{variant.name:11} {layer.label:36} b{batch:<4} FAILED "
                      f"{failed[0].get('error') or 'its check'}", flush=True)
                continue
            best = {side: min(t["median_ms"] for t in turns[side]) for side in turns}
            ratio = best["before"] / best["after"]
            ratios[variant.name].append(ratio)
            print(f"{variant.name:11} {layer.label:36} b{batch:<4} before "
                  f"{best['before'] * 1e3:8.1f} us  after {best['after'] * 1e3:8.1f} us  "
                  f"x{ratio:.3f}", flush=True)
    for name, xs in ratios.items():
        geomean = math.exp(sum(map(math.log, xs)) / len(xs))
        print(f"{name}: {len(xs)} cells, before/after geomean {geomean:.3f}, "
              f"{min(xs):.3f}-{max(xs):.3f}, {sum(x < 0.97 for x in xs)} slower by over 3%")


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "choices":
        choices(sys.argv[2], sys.argv[3].split(",") if len(sys.argv) > 3 else list(VARIANTS))
    elif len(sys.argv) >= 5 and sys.argv[1] == "time":
        time_changes(sys.argv[2], sys.argv[3], sys.argv[4],
                     int(sys.argv[5]) if len(sys.argv) > 5 else 2)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
