"""Session 23: the tuner on wgmma-3xtf32 with the grid schedule's partial sums spanning K-tiles:
each layer's shipped tiling (read from tunings.json by layer, whatever its source hash) and the
first COUNT of variant.configs; the best verified one is stored in the tune cache as `convlab
tune` stores it. Usage: python tune23.py VARIANT COUNT LAYER..."""
import json
import sys

from convlab import tuning
from convlab.bench import tune
from convlab.gpu.measure import TimingPolicy
from convlab.kernels import get_variant
from convlab.kernels.igemm.tiling import Tiling
from convlab.models import MODELS
from convlab.shapes import parse_layer

ALEX = MODELS["alexnet"].conv_shapes(128)
LAYERS = {**{n: (ALEX[n], "relu") for n in ("conv1", "conv2", "conv3", "conv4", "conv5")},
          "resnet": (parse_layer("64,64,56,56,64,3,1,1"), None)}
shipped = [e for e in json.loads(tuning.SHIPPED.read_text())["entries"].values()
           if "H100" in e["device"]]
name, count = sys.argv[1], int(sys.argv[2])
for layer in sys.argv[3:]:
    shape, epilogue = LAYERS[layer]
    variant = type(get_variant(name))()  # the registry's instance keeps no layer's candidates
    before = next((Tiling.from_dict(e["config"]) for e in shipped
                   if e["variant"] == name and e["epilogue"] == epilogue
                   and tuning.layer_text(parse_layer(",".join(str(e["shape"][k]) for k in
                   ("B", "C", "H", "W", "M", "K", "stride", "pad", "groups")),
                   bias=e["shape"]["bias"])) == tuning.layer_text(shape)), None)
    configs = list(dict.fromkeys(([before] if before else []) + variant.configs(shape, epilogue)[:count]))
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
