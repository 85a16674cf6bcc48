"""Session 21: the fp16 register store (16-byte vectors) against HEAD's element stores: the same
tilings under two source trees (PYTHONPATH picks which), fp16 output as the tuner writes it.
Usage: python gpu-out/ab21.py TAG"""
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
    "conv3": ("128,256,13,13,384,3,1,1", "relu", True,
              [T(128, 256, 4, "grid"), T(128, 256, 3, "persistent"), T(128, 256, 4, "persistent")]),
    "vgg": ("16,128,112,112,128,3,1,1", None, False,
            [T(128, 256, 4, "persistent"), T(128, 256, 3, "persistent")]),
    "resnet": ("64,64,56,56,64,3,1,1", None, False,
               [T(64, 120, 4, "halo", 2), T(64, 192, 3, "persistent"), T(64, 256, 4, "persistent")]),
    "conv4": ("128,384,13,13,384,3,1,1,2", "relu", True,
              [T(64, 192, 3, "persistent"), T(128, 192, 3, "persistent")]),
    "conv5": ("128,384,13,13,256,3,1,1,2", "relu", True,
              [T(128, 192, 4, "grid"), T(128, 192, 3, "persistent"), T(128, 192, 4, "persistent")]),
    "1x1": ("64,256,56,56,64,1", None, False, [T(64, 256, 4, "persistent")]),
}

tag, names = sys.argv[1], sys.argv[2:] or list(CASES)
import convlab  # noqa: E402
print(f"AB {tag} runs {convlab.__file__}", flush=True)
for name in names:
    layer, epilogue, bias, configs = CASES[name]
    variant = get_variant("wgmma-fp16")
    shape = parse_layer(layer, bias=bias)
    tilings = [Tiling.from_dict(c) for c in configs]
    variant.configs = lambda s, e=None, t=tilings: t
    result = tune.tune(shape, variant, epilogue, TimingPolicy(budget_s=0.25), jobs=12)
    for c in result.candidates:
        ms = f"{c.median_ms:.4f}" if c.median_ms else "-"
        print(f"AB {tag:5} {name:7} {Tiling.from_dict(c.config).brief():36} {ms:>8} "
              f"{'PASS' if c.passed else 'FAIL ' + str(getattr(c, 'reason', ''))[:80]}", flush=True)
