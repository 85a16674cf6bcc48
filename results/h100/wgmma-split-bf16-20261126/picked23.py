"""Session 23: on this GPU, does config_for pick each shipped wgmma tiling (this tree's source
hash), with no tune cache?"""
import json
from convlab import tuning
from convlab.gpu.measure import device_info
from convlab.kernels import get_variant
from convlab.kernels.igemm.tiling import Tiling
from convlab.shapes import ConvShape
name = device_info()["name"]
ok = bad = 0
for e in json.loads(tuning.SHIPPED.read_text())["entries"].values():
    if not e["variant"].startswith("wgmma") or name not in e["device"]:
        continue
    v = get_variant(e["variant"])
    shape = ConvShape(**e["shape"])
    got = v.config_for(shape, e["epilogue"])
    if got == Tiling.from_dict(e["config"]):
        ok += 1
    else:
        bad += 1
        print("NOT PICKED", e["variant"], shape.brief(), got.brief())
print(f"PICKED {ok} of {ok + bad} shipped wgmma tilings for {name}")
