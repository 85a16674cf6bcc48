"""Fit the wgmma variants' tiling correction (convlab/kernels/igemm/learned.py) on the sweep
records of scripts/sweep_tilings.py, and say how well the choice generalises.

Each cell (a layer at a batch, one variant) contributes the tilings `configs()` offered it
(the analytic model's diverse list, what `convlab tune` tries), each with its measured median
time. Least squares (a little ridge) fits the features' weights to each cell's log times about
the cell's mean, weighted toward each cell's fastest candidates (fit's docstring); the choice
is then the offered tiling of lowest predicted time. Reported:
the share of cells whose choice is within 1.10x and 1.25x of the cell's fastest, and the
geometric mean of choice/fastest, for the choice each sweep ran with (the analytic model's
first in the first sweep, the fitted one's in the second), the fit on every cell, and the
fit with each network's cells (resnet50, vgg16, ..., random) left out of it
(the honest figure for a layer the fit never saw). Writes convlab/assets/tiling-model.json.

Usage: python scripts/fit_tiling_model.py [RECORDS_DIR[,RECORDS_DIR...] [MODEL_FILE]] (default,
or RECORDS_DIR "": SWEEPS under results/h100, and convlab/assets/tiling-model.json)
"""

import json
import math
import sys
from pathlib import Path

import numpy as np

from convlab.kernels import get_variant
from convlab.kernels.igemm import learned
from convlab.kernels.igemm.tiling import Tiling
from convlab.shapes import ConvShape

# The whole suite and random layers; then the cells whose candidates split K, after the
# persistent schedule learnt to (its split tilings beside the grid's).
SWEEPS = ("tiling-sweep-20261127", "tiling-sweep-splitk-20261127")
RIDGE = 1e-3
TAU = 0.3
ROOT = Path(__file__).resolve().parents[1]


def cells(directory: Path):
    """(group, variant, [(features, measured ms)], analytic first choice's ms) per cell."""
    out = []
    for path in sorted(directory.glob("sweep-*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if "candidates" not in record or not record["variant"].startswith("wgmma"):
                continue
            variant = get_variant(record["variant"])
            shape = ConvShape(**record["shape"])
            offered = record["candidates"][:record["offered"]]
            rows = []
            for entry in offered:
                if not entry.get("passed"):
                    continue
                t = Tiling.of(entry["config"])
                if t.schedule == "pingpong":  # no feature tells it apart: chosen by rule
                    continue
                estimate = variant.tiling_estimate(shape, t)
                rows.append((learned.features(variant.kernel_shape(shape), t, variant.maths,
                                              estimate), entry["median_ms"]))
            own = next((e for e in offered if e["config"] == record["own"] and e.get("passed")),
                       None)
            if len(rows) > 1 and own is not None:
                group = record["label"].split()[0]
                group = "random" if group.startswith("random") else group
                out.append((group, record["variant"], rows, own["median_ms"]))
    return out


def fit(training) -> np.ndarray:
    """Weighted least squares: a candidate's weight falls as exp(-(its log time over the
    cell's fastest) / TAU), so the fit spends itself on ordering the near-best, where the
    choice is made, not on how slow the slowest are."""
    xs, ys = [], []
    for _, _, rows, _ in training:
        x = np.array([f for f, _ in rows])
        y = np.log([ms for _, ms in rows])
        w = np.exp(-(y - y.min()) / TAU)
        xs.append((x - w @ x / w.sum()) * np.sqrt(w)[:, None])
        ys.append((y - w @ y / w.sum()) * np.sqrt(w))
    x, y = np.vstack(xs), np.concatenate(ys)
    return np.linalg.solve(x.T @ x + RIDGE * len(y) * np.eye(x.shape[1]), x.T @ y)


def choice_ratio(rows, weights) -> float:
    x = np.array([f for f, _ in rows])
    times = np.array([ms for _, ms in rows])
    return float(times[int(np.argmin(x @ weights))] / times.min())


def summary(ratios) -> str:
    ratios = np.asarray(ratios)
    return (f"within 1.10x {np.mean(ratios <= 1.10):.0%}, within 1.25x "
            f"{np.mean(ratios <= 1.25):.0%}, geomean {math.exp(np.mean(np.log(ratios))):.3f}x, "
            f"worst {ratios.max():.2f}x ({len(ratios)} cells)")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    directories = ([Path(d).resolve() for d in argv[0].split(",")] if argv and argv[0] else
                   [ROOT / "results" / "h100" / name for name in SWEEPS])
    out = Path(argv[1]) if len(argv) > 1 else learned.MODEL_FILE
    data = [cell for directory in directories for cell in cells(directory)]
    ran = [own / min(ms for _, ms in rows) for _, _, rows, own in data]
    weights = fit(data)
    fitted = [choice_ratio(rows, weights) for _, _, rows, _ in data]
    held_out = []
    for group in sorted({g for g, *_ in data}):
        w = fit([c for c in data if c[0] != group])
        held_out += [choice_ratio(rows, w) for g, _, rows, _ in data if g == group]
    report = {
        "choice the sweep ran": summary(ran),
        "fitted, every cell": summary(fitted),
        "fitted, each network left out": summary(held_out),
    }
    for line in report.items():
        print(": ".join(line))
    by_variant = {}
    for (_, name, rows, _), ratio in zip(data, fitted):
        by_variant.setdefault(name, []).append(ratio)
    for name, ratios in sorted(by_variant.items()):
        print(f"  {name}: {summary(ratios)}")
    model = {"features": list(learned.FEATURES),
             "weights": dict(zip(learned.FEATURES, map(float, weights))),
             "fitted_on": [str(d.relative_to(ROOT)) for d in directories], "cells": len(data),
             "ridge": RIDGE, "tau": TAU, "report": report}
    out.write_text(json.dumps(model, indent=1) + "\n")
    print(f"wrote {out}")
    return model, held_out


if __name__ == "__main__":
    main()
