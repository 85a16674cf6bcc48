"""3xTF32 experiments: K-tiles per partial sum (PART_KTILES) x B's big part truncated by wgmma
(TRUNCATED_BIG). Per combination: correctness on small shapes (grid, persistent, split-K),
the fp32 bound ratio on same-sign data at several reductions, and the tuned tilings' times on
the AlexNet layers and the ResNet layer."""
import json, sys, time
import numpy as np
import cupy
from convlab.bench import lab
from convlab.gpu import measure
from convlab.kernels import VARIANTS, RELU
from convlab.kernels.igemm import wgmma as W, tiling
from convlab.kernels.igemm.tiling import Tiling
from convlab.oracle.verify import compare, random_problem, reference_output, poison
from convlab.shapes import ConvShape

v = VARIANTS["wgmma-3xtf32"]
cache = json.load(open(sys.argv[1]))["entries"]
layers = []
for key, e in cache.items():
    if e["variant"] == "wgmma-3xtf32":
        layers.append((ConvShape(**e["shape"]), e["epilogue"], Tiling(**e["config"]), e["median_ms"]))
combos = [tuple(map(int, c.split(","))) for c in sys.argv[2].split(";")]

def run(vv, shape, x, w, b, epi):
    op = vv.prepare(shape, w, epi, b)
    y = cupy.empty(op.output_shape, dtype=op.output_dtype); poison(y)
    op(op.stage(cupy.asarray(x)), y)
    return cupy.asnumpy(op.output(y))

CHECK = [ConvShape(3, 48, 9, 11, 40, 5, pad=2, bias=True), ConvShape(2, 64, 13, 13, 96, 3, pad=1, groups=2),
         ConvShape(4, 3, 30, 30, 70, 7, stride=2, pad=3, bias=True), ConvShape(2, 512, 6, 6, 64, 3, pad=1)]
SAME = [ConvShape(2, 64, 6, 6, 64, 1), ConvShape(2, 32, 8, 8, 64, 3, pad=1), ConvShape(2, 48, 9, 9, 128, 5, pad=2),
        ConvShape(2, 512, 6, 6, 64, 3, pad=1)]
policy = measure.TimingPolicy(budget_s=0.3)
rows = []
for span, trunc in combos:
    W.PART_KTILES, W.TRUNCATED_BIG = span, trunc
    rng = np.random.default_rng(7)
    line = [f"span={span} trunc={trunc}"]
    bad = []
    for cs in CHECK:
        ranked = v.ranked(cs)
        picks = [t for t in ranked if t.schedule == "grid"][:1] + [t for t in ranked if t.schedule == "persistent"][:1] \
            + [t for t in ranked if t.split_k > 1][:1]
        for t in picks:
            epi = RELU if cs.bias else None
            x, w, b = random_problem(cs, rng, signed=True)
            r = compare(run(v.configured(t), cs, x, w, b, epi), reference_output(x, w, cs, epi, b), "fp32")
            if not r.passed: bad.append(f"{cs.brief()} {t.brief()}: {r.reason[:200]}")
    line.append(f"checks {'ok' if not bad else 'FAIL ' + ' | '.join(bad)}")
    ratios = []
    for cs in SAME:
        ranked = v.ranked(cs)
        for t in [t for t in ranked if t.schedule == "grid" and t.split_k == 1][:1] + [t for t in ranked if t.schedule == "persistent"][:1]:
            x = rng.random(cs.input_shape, dtype=np.float32)
            w = np.abs(rng.standard_normal(cs.weight_shape) / np.sqrt(cs.reduction)).astype(np.float32)
            r = compare(run(v.configured(t), cs, x, w, None, None), reference_output(x, w, cs, None), "fp32")
            ratios.append(f"n{cs.reduction}{'ws' if t.schedule == 'persistent' else 'g'}={r.bound_ratio:.3f}")
    line.append("same-sign " + " ".join(ratios))
    for shape, epi, t, old in layers:
        try:
            r = lab.run_layer(shape, v.configured(t), policy, epilogue=epi)
            line.append(f"{shape.brief()} {t.brief()} {r.timing.median_ms:.4f} (cache {old:.4f}) {'ok' if r.check.passed else 'FAIL'}")
        except Exception as exc:
            line.append(f"{shape.brief()} {t.brief()} ERROR {exc}")
    print("\n  ".join(line), flush=True)
