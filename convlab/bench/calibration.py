"""How well the tiling cost model (kernels/igemm/cost.py, over each family's schedules) agrees
with what `convlab tune` measured: per sweep record, the share of candidate pairs it orders as
the GPU did, and how much slower than the measured best is the candidate it ranks first. The
model's constants are calibrated against the committed records with this, and a test keeps
them honest."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path

from ..kernels import VARIANTS
from ..kernels.igemm.tiling import Tiling
from ..shapes import ConvShape

# Pairs whose measured times differ by less than this are timing noise, not an order.
TIE = 0.03


@dataclass(frozen=True)
class Agreement:
    record: str  # the sweep file's name
    variant: str
    shape: ConvShape
    pairs: int  # candidate pairs measured apart by more than TIE
    agreeing: int  # of those, the pairs the model orders the same way
    first_ratio: float  # measured time of the model's favourite among the tried / the best

    @property
    def concordance(self) -> float:
        return self.agreeing / self.pairs if self.pairs else 1.0


def sweep_agreement(path: Path) -> Agreement | None:
    """The model against one `convlab tune --json` record, or None for a record of a variant
    without a tiling model (or one with fewer than two verified candidates)."""
    record = json.loads(Path(path).read_text())
    variant = VARIANTS.get(record.get("variant", ""))
    if variant is None or not hasattr(variant, "tiling_estimate"):
        return None
    shape = ConvShape(**record["shape"])
    measured = [(Tiling.of(c["config"]), c["timing"]["median_ms"])
                for c in record["candidates"] if c["status"] == "PASS" and c.get("timing")]
    if len(measured) < 2:
        return None
    modelled = [variant.tiling_estimate(shape, t) for t, _ in measured]
    pairs = agreeing = 0
    for (mi, (_, ti)), (mj, (_, tj)) in itertools.combinations(zip(modelled, measured), 2):
        if abs(ti - tj) < TIE * min(ti, tj):
            continue
        pairs += 1
        agreeing += (mi < mj) == (ti < tj)
    favourite = min(range(len(measured)), key=modelled.__getitem__)
    best = min(ms for _, ms in measured)
    return Agreement(Path(path).name, variant.name, shape, pairs, agreeing,
                     measured[favourite][1] / best)


def agreements(paths) -> list[Agreement]:
    found = (sweep_agreement(p) for p in paths)
    return [a for a in found if a is not None]


def summary(found: list[Agreement]) -> dict:
    """Mean concordance, the geometric mean and worst first-pick ratio over the sweeps."""
    ratios = [a.first_ratio for a in found]
    return {"sweeps": len(found),
            "concordance": sum(a.concordance for a in found) / len(found),
            "first_ratio_geomean": math.exp(sum(map(math.log, ratios)) / len(ratios)),
            "first_ratio_worst": max(ratios)}


def pick_agreement(path: Path, shapes: dict[str, ConvShape]) -> tuple[int, int]:
    """(pairs measured apart by more than TIE, pairs the model orders as measured) in a record
    of scripts/cost_model_picks.py: two tilings per (variant, layer), both timed; `shapes`
    maps its layer names to shapes."""
    rows = json.loads(Path(path).read_text())["rows"]
    pairs = agreeing = 0
    for row in rows:
        a, b = row["old_ms"], row["new_ms"]
        if not a or not b or abs(a - b) < TIE * min(a, b):
            continue
        variant = VARIANTS[row["variant"]]
        ma, mb = (variant.tiling_estimate(shapes[row["layer"]], Tiling.of(row[k]))
                  for k in ("old", "new"))
        pairs += 1
        agreeing += (ma < mb) == (a < b)
    return pairs, agreeing
