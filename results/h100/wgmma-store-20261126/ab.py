"""Session 19: time the same tilings under two source trees (PYTHONPATH picks which).
Usage: python gpu-out/ab.py TAG [case ...]"""
import sys

from convlab.bench import tune
from convlab.gpu.measure import TimingPolicy
from convlab.kernels import get_variant
from convlab.kernels.igemm.tiling import Tiling
from convlab.shapes import parse_layer


def T(bm, bn, stages, schedule, rows=0, gather="tap", bk=64):
    return dict(bm=bm, bn=bn, bk=bk, warps_m=bm // 16, warps_n=1, stages=stages, split_k=1,
                gather=gather, schedule=schedule, **({"rows": rows} if rows else {}))


CASES = {
    "resnet16": ("wgmma-fp16", "64,64,56,56,64,3,1,1", None, False,
                 [T(64, 120, 4, "halo", 2), T(64, 120, 9, "halo", 2), T(64, 176, 4, "halo", 3),
                  T(64, 256, 4, "persistent")]),
    "vgg16": ("wgmma-fp16", "16,128,112,112,128,3,1,1", None, False,
              [T(128, 256, 4, "persistent"), T(128, 232, 4, "halo", 2),
               T(128, 256, 3, "persistent")]),
    "conv2f32": ("wgmma-3xtf32", "128,96,27,27,256,5,1,2,2", "relu", True,
                 [T(128, 128, 3, "persistent", gather="table", bk=32),
                  T(128, 96, 4, "persistent", gather="table", bk=32)]),
    "conv4f16": ("wgmma-fp16", "128,384,13,13,384,3,1,1,2", "relu", True,
                 [T(64, 192, 3, "persistent")]),
    "1x1f16": ("wgmma-fp16", "64,256,56,56,64,1", None, False, [T(64, 256, 4, "persistent")]),
    "conv3f32": ("wgmma", "128,256,13,13,384,3,1,1", "relu", True,
                 [T(128, 256, 3, "persistent", bk=32)]),
    "1x1f32": ("wgmma", "64,256,56,56,64,1", None, False, [T(128, 256, 3, "persistent", bk=32)]),
    "conv1f32": ("wgmma-3xtf32", "128,3,227,227,96,11,4", "relu", True,
                 [T(128, 128, 3, "persistent", gather="table", bk=32)]),
    "resnet32": ("wgmma", "64,64,56,56,64,3,1,1", None, False,
                 [T(64, 176, 4, "halo", 3, bk=32)]),
}

tag, names = sys.argv[1], sys.argv[2:] or list(CASES)
import convlab  # noqa: E402
print(f"AB {tag} runs {convlab.__file__}", flush=True)
for name in names:
    kernel, layer, epilogue, bias, configs = CASES[name]
    variant = get_variant(kernel)
    shape = parse_layer(layer, bias=bias)
    tilings = [Tiling.from_dict(c) for c in configs]
    variant.configs = lambda s, e=None, t=tilings: t
    result = tune.tune(shape, variant, epilogue, TimingPolicy(budget_s=0.25), jobs=8)
    for c in result.candidates:
        ms = f"{c.median_ms:.4f}" if c.median_ms else "-"
        print(f"AB {tag:4} {name:9} {Tiling.from_dict(c.config).brief():34} {ms:>8} "
              f"{'PASS' if c.passed else 'FAIL ' + str(getattr(c, 'reason', ''))[:80]}", flush=True)
