"""Session 18: a wider tiling sweep than `convlab tune`'s 16 (the cost model's ranking, diverse
picks of 32 non-halo and 8 halo tilings, plus the tuned one), on the layers wgmma-fp16 loses by
1-2% (AlexNet conv3, the ResNet 3x3). The best verified is stored in the tune cache as tune does.
Usage: python wide_tune.py VARIANT conv3|resnet"""
import sys

from convlab import tuning
from convlab.bench import tune
from convlab.gpu.measure import TimingPolicy
from convlab.kernels import get_variant
from convlab.kernels.igemm.cost import diverse
from convlab.models import MODELS
from convlab.shapes import ConvShape

name, layer = sys.argv[1], sys.argv[2]
variant = get_variant(name)
if layer == "conv3":
    shape, epilogue = MODELS["alexnet"].conv_shapes(128)["conv3"], "relu"
else:
    shape, epilogue = ConvShape(64, 64, 56, 56, 64, 3, pad=1), None
ranked = variant.ranked(shape)
current = variant.config_for(shape, epilogue)
picked = ([current] + diverse(tuple(t for t in ranked if t.schedule != "halo"), 32)
          + diverse(tuple(t for t in ranked if t.schedule == "halo"), 8))
configs = list(dict.fromkeys(picked))
print(f"{name} {layer}: {len(configs)} tilings of {len(ranked)}; tuned now: {current.brief()}")
variant.configs = lambda s, e=None: configs
result = tune.tune(shape, variant, epilogue, TimingPolicy(budget_s=0.1), jobs=14)
timed = sorted((c for c in result.candidates if c.passed), key=lambda c: c.median_ms)
for c in timed[:6]:
    print(f"  {c.median_ms:.4f} ms  {tune.config_text(c.config)}")
print(f"  the tuned one before: {next((c.median_ms for c in result.candidates if c.config == current.as_dict()), None)}")
print("stored" if result.cache_path else f"not stored: {result.interrupted or result.cache_error}")
