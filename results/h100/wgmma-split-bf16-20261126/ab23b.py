"""Session 23: wgmma-3xtf32 against wgmma-split-bf16 (the cross products in BF16) on the same
tilings: the 3xTF32 tilings the tuner stored in call 2 (CONVLAB_CACHE_DIR), compare's timing."""
from concurrent.futures import ThreadPoolExecutor

from convlab.bench import lab
from convlab.gpu.measure import TimingPolicy
from convlab.kernels import get_variant
from convlab.models import MODELS
from convlab.shapes import parse_layer

ALEX = MODELS["alexnet"].conv_shapes(128)
LAYERS = {**{n: (ALEX[n], "relu") for n in ("conv1", "conv2", "conv3", "conv4", "conv5")},
          "resnet": (parse_layer("64,64,56,56,64,3,1,1"), None)}
three, split = get_variant("wgmma-3xtf32"), get_variant("wgmma-split-bf16")
runs = []
for name, (shape, epi) in LAYERS.items():
    t = three.config_for(shape, epi)
    runs += [(name, shape, epi, t, v.configured(t)) for v in (three, split)]
with ThreadPoolExecutor(12) as pool:
    list(pool.map(lambda r: r[4].compile(r[1], r[2]), runs))
for name, shape, epi, t, v in runs:
    r = lab.run_layer(shape, v, TimingPolicy(budget_s=0.3), epilogue=epi)
    print(f"AB {name:7} {t.brief():34} {v.name:17} {r.timing.median_ms:.4f} ms  "
          f"err/bound {r.check.bound_ratio:.3g} {'PASS' if r.check.passed else 'FAIL'}", flush=True)
