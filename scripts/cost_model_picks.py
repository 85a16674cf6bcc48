"""Does a change to the tiling cost model pick faster tilings? Two steps:

  picks OUT.json          (CPU) the cost model's first choice for every tiled variant on every
                          model layer (AlexNet at batch 128 with bias + ReLU, its FC layers as
                          the channels-last variants run them, the ECE408 convs at batch 10,000,
                          the ResNet 64->64 3x3 layer at batch 64): what an untuned run gets.
  time OLD.json NEW.json OUT.json
                          (GPU) for every layer where the two pick files differ, compile both
                          picks on worker processes, then verify and time each (lab.run_layer:
                          fresh random inputs, poisoned outputs, CUDA events); prints new/old.

Run `picks` before and after the change (git stash), then `time` on a GPU.
"""

import json
import sys
import time

from convlab import tuning
from convlab.bench import lab
from convlab.bench.tune import default_jobs, prebuild
from convlab.gpu import timer
from convlab.kernels import RELU, VARIANTS
from convlab.models import get_model
from convlab.shapes import ConvShape

POLICY = timer.TimingPolicy(warmup=3, min_runs=10, max_runs=40, budget_s=0.3)


def layers():
    """name -> (shape, epilogue, dense): dense layers only for variants that run them."""
    found = {f"alexnet.{n}": (s, RELU, False)
             for n, s in get_model("alexnet").conv_shapes(128).items()}
    for name in ("ece408", "ece408-high", "ece408-low"):
        found.update({f"{name}.{n}": (s, None, False)
                      for n, s in get_model(name).conv_shapes(10000).items()})
    found["resnet"] = (ConvShape(64, 64, 56, 56, 64, 3, pad=1), None, False)
    for name, c, m, epilogue in (("fc6", 9216, 4096, RELU), ("fc7", 4096, 4096, RELU),
                                 ("fc8", 4096, 1000, None)):
        found[f"alexnet.{name}"] = (ConvShape(128, c, 1, 1, m, 1), epilogue, True)
    return found


def picks(out):
    chosen = {}
    for vname, variant in VARIANTS.items():
        if not hasattr(variant, "kernel_shape"):
            continue
        for lname, (shape, epilogue, dense) in layers().items():
            if dense and not variant.runs_dense:
                continue
            if variant.supports(shape):
                t = variant.default_config(shape, epilogue)
                chosen[f"{vname} {lname}"] = t.as_dict()
    with open(out, "w") as f:
        json.dump(chosen, f, indent=1)
    print(f"{len(chosen)} picks -> {out}")


def timed(vname, config, shape, epilogue):
    try:
        layer = lab.run_layer(shape, VARIANTS[vname].configured(config), POLICY, epilogue,
                              seed=0)
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"
    if not layer.check.passed:
        return None, layer.check.reason
    return layer.timing.median_ms, ""


def compare(old_path, new_path, out):
    old, new = (json.load(open(p)) for p in (old_path, new_path))
    known = layers()
    rows = []
    changed = [k for k in new if k in old and old[k] != new[k]]
    start = time.perf_counter()
    for key in changed:
        vname, lname = key.split(" ")
        shape, epilogue, _ = known[lname]
        prebuild(VARIANTS[vname], [old[key], new[key]], shape, epilogue, default_jobs())
    print(f"compiled {2 * len(changed)} picks in {time.perf_counter() - start:.0f} s")
    for key in changed:
        vname, lname = key.split(" ")
        shape, epilogue, _ = known[lname]
        old_ms, old_err = timed(vname, old[key], shape, epilogue)
        new_ms, new_err = timed(vname, new[key], shape, epilogue)
        rows.append({"variant": vname, "layer": lname, "old": old[key], "new": new[key],
                     "old_ms": old_ms, "new_ms": new_ms, "old_error": old_err,
                     "new_error": new_err})
        ratio = f"{new_ms / old_ms:5.2f}" if old_ms and new_ms else "  -  "
        print(f"{vname:22s} {lname:18s} old {old_ms or float('nan'):8.3f} "
              f"new {new_ms or float('nan'):8.3f} new/old {ratio} {old_err}{new_err}",
              flush=True)
    with open(out, "w") as f:
        json.dump({"device": tuning.device_key(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    command, *args = sys.argv[1:] or ["help"]
    if command == "picks" and len(args) == 1:
        picks(*args)
    elif command == "time" and len(args) == 3:
        compare(*args)
    else:
        sys.exit(__doc__)
