"""Session 22: the copy engine's im2col gather ("tma") against the loaders' cp.async one ("tap")
on the same persistent tilings, in the tuner's timing (compare's), each class's output dtype
as the tuner writes it. Usage: python gpu-out/ab22.py TAG [names]"""
import sys
from dataclasses import replace

from convlab.bench import tune
from convlab.gpu.measure import TimingPolicy
from convlab.kernels import get_variant
from convlab.kernels.igemm.tiling import Tiling
from convlab.shapes import parse_layer


def T(bm, bn, stages, bk=64):
    return Tiling(bm, bn, bk, bm // 16, 1, stages, 1, "tap", "persistent")


LAYERS = {  # layer, epilogue, bias, fp16 tilings, tf32 tilings
    "conv3": ("128,256,13,13,384,3,1,1", "relu", True,
              [T(128, 256, 4), T(128, 256, 3)], [T(128, 256, 3, 32), T(128, 128, 4, 32)]),
    "conv4": ("128,384,13,13,384,3,1,1,2", "relu", True,
              [T(64, 192, 3), T(128, 192, 4)], [T(128, 224, 4, 32), T(64, 192, 4, 32)]),
    "conv5": ("128,384,13,13,256,3,1,1,2", "relu", True,
              [T(128, 192, 4), T(128, 192, 3)], [T(128, 192, 4, 32)]),
    "resnet": ("64,64,56,56,64,3,1,1", None, False,
               [T(64, 192, 3), T(64, 256, 4), T(128, 256, 4)], [T(128, 256, 4, 32), T(64, 192, 4, 32)]),
    "vgg": ("16,128,112,112,128,3,1,1", None, False,
            [T(128, 256, 4), T(128, 256, 3)], [T(128, 256, 4, 32)]),
    "1x1": ("64,256,56,56,64,1", None, False, [T(64, 256, 4)], [T(128, 256, 3, 32)]),
    "s2": ("64,64,56,56,128,3,2,1", None, False, [T(128, 96, 4), T(128, 128, 4)], []),
}

tag, names = sys.argv[1], sys.argv[2:] or list(LAYERS)
for name in names:
    layer, epilogue, bias, fp16, tf32 = LAYERS[name]
    for vname, tilings in (("wgmma-fp16", fp16), ("wgmma", tf32)):
        if not tilings:
            continue
        variant = get_variant(vname)
        shape = parse_layer(layer, bias=bias)
        both = [u for t in tilings for u in (t, replace(t, gather="tma"))]
        variant.configs = lambda s, e=None, t=both: t
        result = tune.tune(shape, variant, epilogue, TimingPolicy(budget_s=0.25), jobs=12)
        for c in result.candidates:
            ms = f"{c.median_ms:.4f}" if c.median_ms else "-"
            print(f"AB {tag:4} {vname:10} {name:7} {Tiling.from_dict(c.config).brief():36} "
                  f"{ms:>8} {'PASS' if c.passed else 'FAIL ' + str(getattr(c, 'reason', ''))[:90]}",
                  flush=True)
