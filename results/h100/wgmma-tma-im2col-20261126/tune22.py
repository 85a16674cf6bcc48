"""Session 22: the tuner on the layers the copy engine's gather ("tma") can run, each class's
shipped tiling (read from tunings.json by layer, whatever its source hash) among the candidates
with the tma twins of the cost model's persistent tilings; the best verified one is stored in
the tune cache as `convlab tune` stores it. Usage: python tune22.py VARIANT LAYER..."""
import json
import sys
from dataclasses import replace

from convlab import tuning
from convlab.bench import tune
from convlab.gpu.measure import TimingPolicy
from convlab.kernels import get_variant
from convlab.kernels.igemm.cost import diverse
from convlab.kernels.igemm.tiling import Tiling
from convlab.models import MODELS
from convlab.shapes import parse_layer

ALEX = MODELS["alexnet"].conv_shapes(128)
LAYERS = {"conv3": (ALEX["conv3"], "relu"), "conv4": (ALEX["conv4"], "relu"),
          "conv5": (ALEX["conv5"], "relu"),
          "resnet": (parse_layer("64,64,56,56,64,3,1,1"), None),
          "vgg": (parse_layer("16,128,112,112,128,3,1,1"), None),
          "1x1": (parse_layer("64,256,56,56,64,1"), None),
          "s2": (parse_layer("64,64,56,56,128,3,2,1"), None)}
shipped = json.loads(tuning.SHIPPED.read_text())["entries"].values()
name = sys.argv[1]
for layer in sys.argv[2:]:
    shape, epilogue = LAYERS[layer]
    variant = get_variant(name)
    before = next((Tiling.from_dict(e["config"]) for e in shipped
                   if e["variant"] == name and e["epilogue"] == epilogue
                   and tuning.layer_text(parse_layer(",".join(str(e["shape"][k]) for k in
                   ("B", "C", "H", "W", "M", "K", "stride", "pad", "groups")),
                   bias=e["shape"]["bias"])) == tuning.layer_text(shape)), None)
    ranked = variant.ranked(shape)
    tma = diverse(tuple(t for t in ranked if t.gather == "tma"), 6, per_block_tile=1)
    twins = []
    if before is not None and before.tap_order and before.schedule != "halo":
        twins.append(replace(before, schedule="persistent", gather="tma"))
    configs = list(dict.fromkeys(([before] if before else []) + twins + tma))
    variant.configs = lambda s, e=None, c=configs: c
    result = tune.tune(shape, variant, epilogue, TimingPolicy(budget_s=0.2), jobs=14)
    timed = sorted((c for c in result.candidates if c.passed), key=lambda c: c.median_ms)
    print(f"TUNE {name} {layer}: {len(configs)} tilings, shipped before "
          f"{before.brief() if before else None}", flush=True)
    for c in timed:
        mark = " <- shipped before" if before and Tiling.from_dict(c.config) == before else ""
        print(f"TUNE   {c.median_ms:.4f} ms  {Tiling.from_dict(c.config).brief()}{mark}", flush=True)
    for c in result.candidates:
        if not c.passed:
            print(f"TUNE   FAIL {Tiling.from_dict(c.config).brief()}: {c.reason[:200]}", flush=True)
    print("TUNE   stored" if result.cache_path else
          f"TUNE   not stored: {result.interrupted or result.cache_error}", flush=True)
