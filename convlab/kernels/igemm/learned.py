"""The wgmma variants' own choice: the analytic cost model's candidates (igemm.cost.ranked)
reordered by a correction fitted on measured sweeps, so that a layer nobody tuned gets a
tiling near the best of them (kernels.wgmma's `_offered` orders every candidate by it and
keeps a short, spread list for `convlab tune`).

The analytic model ranks by modelled time; on an H100 its first choice was within 1.10x of
the best of its own list on half of 266 (layer, batch, maths) cells of the public suites and
random layers (results/h100/tiling-sweep-20261127). Where it errs is systematic: it favours
the halo schedule on 1x1 layers (no halo to share), rates the copy engine's gather (tma) and
the persistent schedule too low for 16-bit and TF32 maths, and splits K more than the
small-batch layers gain by. The correction is linear in a few features of the tiling and the
layer (FEATURES) on top of the log of the modelled time, fitted by least squares to each
cell's log measured times about their mean (scripts/fit_tiling_model.py, from the sweep's
records); the coefficients live in convlab/assets/tiling-model.json, beside how the fit did
when each network's cells were left out of it.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path

from ...shapes import ConvShape
from .tiling import Tiling, k_tiles, output_tiles

MODEL_FILE = Path(__file__).resolve().parents[2] / "assets" / "tiling-model.json"
SMS = 132

FEATURES = ("log_estimate", "grid", "persistent_tap", "persistent_tma", "halo", "table",
            "log_split_k", "stages", "wide_m", "log_bn", "halo_1x1", "tma_fp16",
            "log_waves", "log_waves_grid", "under_one_wave", "split_small", "waves_deficit",
            "bn_under_one_wave")


def features(shape: ConvShape, t: Tiling, maths: str, estimate_us: float) -> list[float]:
    """The tiling's features on the layer, in FEATURES' order."""
    tiles = output_tiles(shape, t) * t.split_k
    waves = tiles / SMS
    grid = t.schedule == "grid"
    return [
        math.log(max(estimate_us, 1e-3)),
        float(grid),
        float(t.schedule == "persistent" and t.gather != "tma"),
        float(t.gather == "tma"),
        float(t.schedule == "halo"),
        float(t.gather == "table"),
        math.log2(t.split_k),
        float(t.stages),
        float(t.bm == 128),
        math.log2(t.bn),
        float(t.schedule == "halo" and shape.taps == 1),
        float(t.gather == "tma" and maths in ("fp16", "bf16")),
        math.log(waves),
        math.log(waves) if grid else 0.0,
        float(waves < 1),
        math.log2(t.split_k) * float(k_tiles(shape, t) < 16),
        max(0.0, -math.log(waves)),
        math.log2(t.bn) * float(waves < 1),
    ]


@lru_cache(maxsize=1)
def coefficients() -> dict[str, float] | None:
    """The fitted weights by feature name, or None where no model file is shipped (the
    analytic model's order then stands)."""
    try:
        data = json.loads(MODEL_FILE.read_text())
        weights = data["weights"]
        if set(weights) != set(FEATURES):
            return None
        return {name: float(weights[name]) for name in FEATURES}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def score(shape: ConvShape, t: Tiling, maths: str, estimate_us: float) -> float:
    """The predicted log time, up to a constant per layer (lower is faster)."""
    weights = coefficients()
    values = features(shape, t, maths, estimate_us)
    if weights is None:
        return values[0]
    return sum(weights[name] * value for name, value in zip(FEATURES, values))
