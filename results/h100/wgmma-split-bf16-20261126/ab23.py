"""Session 23: 3xTF32 partial sums spanning PART_KTILES K-tiles, fixed per run (span 1 is the
kernel before this change), on the shipped H100 tilings of AlexNet's layers and the ResNet
layer, in compare's timing. Usage: python gpu-out/ab23.py SPANS (e.g. 1,rule,8)"""
import json
import sys
from concurrent.futures import ThreadPoolExecutor

from convlab import tuning
from convlab.bench import lab
from convlab.gpu.measure import TimingPolicy
from convlab.kernels import wgmma as W
from convlab.kernels.igemm import wgmma
from convlab.kernels.igemm.tiling import Tiling, k_tiles
from convlab.models import MODELS
from convlab.shapes import parse_layer

ALEX = MODELS["alexnet"].conv_shapes(128)
LAYERS = {**{n: (ALEX[n], "relu") for n in ("conv1", "conv2", "conv3", "conv4", "conv5")},
          "resnet": (parse_layer("64,64,56,56,64,3,1,1"), None)}
shipped = [e for e in json.loads(tuning.SHIPPED.read_text())["entries"].values()
           if e["variant"] == "wgmma-3xtf32" and "H100" in e["device"]]


def tiling_for(shape):
    for e in shipped:
        s = parse_layer(",".join(str(e["shape"][k]) for k in
                                 ("B", "C", "H", "W", "M", "K", "stride", "pad", "groups")),
                        bias=e["shape"]["bias"])
        if tuning.layer_text(s) == tuning.layer_text(shape):
            return Tiling.from_dict(e["config"])


def fixed(span):
    class Fixed(W.Wgmma3xTF32):
        def defines(self, shape, epilogue=None):
            d = super().defines(shape, epilogue)
            if span != "rule":
                d["PART_KTILES"] = int(span)
            return d
    return Fixed


runs = []
for name, (shape, epi) in LAYERS.items():
    t = tiling_for(shape)
    for span in sys.argv[1].split(","):
        runs.append((name, shape, epi, t, span, fixed(span)().configured(t)))
with ThreadPoolExecutor(12) as pool:
    list(pool.map(lambda r: r[5].compile(r[1], r[2]), runs))
for name, shape, epi, t, span, v in runs:
    k = v.kernel_shape(shape)
    p = v.defines(shape, epi)["PART_KTILES"]
    r = lab.run_layer(shape, v, TimingPolicy(budget_s=0.3), epilogue=epi)
    print(f"AB {name:7} {t.brief():34} span {span:>4} ({p} of {k_tiles(k, t)} K-tiles) "
          f"{r.timing.median_ms:.4f} ms  err/bound {r.check.bound_ratio:.3g} "
          f"{'PASS' if r.check.passed else 'FAIL'}", flush=True)
