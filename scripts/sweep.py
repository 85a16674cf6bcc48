"""Sweep register-tiled / fused tilings on the ECE408 layers at batch 10000 (GPU only).

Every configuration is verified (last timed output against float64) before its time counts.
Usage: python scripts/sweep.py [--out FILE.json]
"""

import argparse
import itertools
import json

from convlab.bench import lab
from convlab.gpu import timer
from convlab.kernels import TANH_POOL
from convlab.kernels.fused import Fused
from convlab.kernels.register_tiled import RegisterTiled
from convlab.shapes import ConvShape

LAYERS = {
    "ece408-high conv": ConvShape(10000, 1, 28, 28, 50, 5),
    "ece408 conv1": ConvShape(10000, 1, 48, 48, 12, 7),
    "ece408 conv2": ConvShape(10000, 12, 21, 21, 24, 7),
}
# Rows per thread, channels per thread and register caps (min blocks per SM; 0 = none) to try.
CANDIDATES = {
    "ece408-high conv": ((2, 3, 4, 6, 8), (10, 25), (0, 2, 3, 4)),
    "ece408 conv1": ((2, 3, 4, 6, 8), (6, 12), (0, 2, 3, 4)),
    "ece408 conv2": ((3, 4, 5, 7), (12, 24), (0, 2, 3)),
}


def configs(name, even_rows):
    ths, mts, caps = CANDIDATES[name]
    for th, mt, minb in itertools.product(ths, mts, caps):
        if even_rows and th % 2:
            continue
        yield th, mt, minb


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    parser.add_argument("--variants", default="register-tiled,fused")
    args = parser.parse_args()
    wanted = args.variants.split(",")
    policy = timer.TimingPolicy(warmup=2, min_runs=5, max_runs=20, budget_s=0.3)
    results = []
    for (name, shape), (cls, epilogue) in itertools.product(
            LAYERS.items(), ((RegisterTiled, None), (Fused, TANH_POOL))):
        if (epilogue and shape.C > 1) or cls.name not in wanted:
            continue
        rows = []
        for th, mt, minb in configs(name, epilogue is not None):
            variant = cls(th=th, mt=mt, min_blocks=minb)
            try:
                r = lab.run_layer(shape, variant, policy, epilogue)
            except Exception as exc:  # noqa: BLE001 - a config that fails to build is reported
                print(f"{name} {cls.name} th={th} mt={mt} minb={minb}: {type(exc).__name__}: {exc}")
                continue
            rows.append({"layer": name, "variant": cls.name, "th": th, "mt": mt, "minb": minb,
                         "ms": r.timing.median_ms, "ok": r.check.passed})
        rows.sort(key=lambda r: (not r["ok"], r["ms"]))
        print(f"\n{name} / {cls.name}: {len(rows)} configs; convlab uses th,mt,minb="
              f"{cls().config_for(shape, epilogue).brief()}")
        for r in rows[:6]:
            print(f"  th={r['th']} mt={r['mt']:>2} minb={r['minb']}  {r['ms']:.4f} ms  "
                  f"{'PASS' if r['ok'] else 'FAIL'}")
        results += rows
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
