"""Session 21: the pingpong schedule against each layer's shipped tiling, in one tuner run per
layer and class (same GPU, same process). Usage: python gpu-out/pp.py [layer ...]"""
import sys

from convlab.bench import tune
from convlab.gpu.measure import TimingPolicy
from convlab.kernels import get_variant
from convlab.kernels.igemm.tiling import Tiling
from convlab.shapes import parse_layer

LAYERS = {
    "conv1": ("128,3,227,227,96,11,4", "relu", True),
    "conv2": ("128,96,27,27,256,5,1,2,2", "relu", True),
    "conv3": ("128,256,13,13,384,3,1,1", "relu", True),
    "conv4": ("128,384,13,13,384,3,1,1,2", "relu", True),
    "conv5": ("128,384,13,13,256,3,1,1,2", "relu", True),
    "resnet": ("64,64,56,56,64,3,1,1", None, False),
    "vgg": ("16,128,112,112,128,3,1,1", None, False),
}
KERNELS = ["wgmma-fp16", "wgmma", "wgmma-3xtf32"]
PER_LAYER = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 10
names = [a for a in sys.argv[1:] if not a.isdigit()] or list(LAYERS)

for kernel in KERNELS:
    for name in names:
        layer, epilogue, bias = LAYERS[name]
        variant = get_variant(kernel)
        shape = parse_layer(layer, bias=bias)
        shipped = variant.config_for(shape, epilogue)
        ranked = variant.ranked(shape)
        pingpong = [t for t in ranked if t.schedule == "pingpong"][:PER_LAYER]
        tilings = [shipped] + [t for t in pingpong if t != shipped]
        variant.configs = lambda s, e=None, t=tilings: t
        result = tune.tune(shape, variant, epilogue, TimingPolicy(budget_s=0.2), jobs=12)
        rows = []
        for c in result.candidates:
            t = Tiling.from_dict(c.config)
            rows.append((t, c.median_ms, c.passed, getattr(c, "reason", "")))
        base = next(ms for t, ms, ok, _ in rows if t == shipped)
        best = min((r for r in rows if r[0].schedule == "pingpong" and r[1] and r[2]),
                   key=lambda r: r[1], default=None)
        for t, ms, ok, why in rows:
            tag = "shipped" if t == shipped else ""
            print(f"PP {kernel:13} {name:7} {t.brief():36} {ms or 0:8.4f} "
                  f"{'PASS' if ok else 'FAIL ' + str(why)[:90]} {tag}", flush=True)
        if best and base:
            print(f"BEST {kernel:13} {name:7} shipped {shipped.brief():36} {base:.4f} | "
                  f"pingpong {best[0].brief():36} {best[1]:.4f} | {base / best[1]:.3f}x",
                  flush=True)
