"""What the old timing method added: each (variant, layer) timed twice in one process, once as
an event, one launch, an event on an idle GPU (SINGLE, the method before issue 16) and once
queued (QUEUED: back-to-back launches behind a spin kernel, the host's dispatch outside).

    python3 scripts/dispatch_study.py [--out study.json]

Prints a table (single ms, queued ms, what single added in microseconds and as a share) and
writes the numbers as JSON. Both timings are lab.run_layer's: verified, inputs rotated.
"""

from __future__ import annotations

import argparse
import json

from convlab.bench import lab
from convlab.gpu import hardware, timer
from convlab.kernels import RELU, get_variant
from convlab.models import get_model
from convlab.shapes import ConvShape

ALEXNET = get_model("alexnet").conv_shapes(128)
JOBS = [
    ("cudnn", ALEXNET["conv3"], RELU), ("cudnn-nhwc-fp16", ALEXNET["conv3"], RELU),
    ("pipelined-fp16", ALEXNET["conv3"], RELU), ("pipelined-3xtf32", ALEXNET["conv2"], RELU),
    ("cudnn-nhwc-tf32", ConvShape(64, 64, 56, 56, 64, 3, pad=1), None),
    ("pipelined", ConvShape(64, 64, 56, 56, 64, 3, pad=1), None),
    ("cudnn", get_model("ece408").conv_shapes(100)["conv1"], None),
    ("tiled", get_model("ece408").conv_shapes(100)["conv1"], None),
    ("fused", get_model("ece408-high").conv_shapes(10000)["conv"], None),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the numbers here as JSON")
    args = parser.parse_args()
    rows = []
    print(f"{'variant':18} {'layer':34} {'single ms':>10} {'queued ms':>10} {'added us':>9} {'share':>6}")
    for name, shape, epilogue in JOBS:
        variant = get_variant(name)
        if not variant.supports(shape):
            print(f"{name:18} {shape.brief():34} skipped: {variant.supports(shape).reason}")
            continue
        times = {}
        for method in (timer.SINGLE, timer.QUEUED):
            layer = lab.run_layer(shape, variant, timer.TimingPolicy(method=method, budget_s=1),
                                  epilogue)
            times[method] = (layer.timing.median_ms, layer.check.passed, layer.timing.launches)
        single, queued = times[timer.SINGLE][0], times[timer.QUEUED][0]
        ok = all(t[1] for t in times.values())
        rows.append({"variant": name, "shape": shape.as_dict(), "epilogue": epilogue,
                     "single_ms": single, "queued_ms": queued, "passed": ok,
                     "queued_launches": times[timer.QUEUED][2]})
        print(f"{name:18} {shape.brief():34} {single:10.4f} {queued:10.4f} "
              f"{(single - queued) * 1e3:9.1f} {100 * (single - queued) / single:5.0f}%"
              + ("" if ok else "  FAIL"))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": hardware.device_info(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
