"""Halo layout experiments: for each (swizzle, base offset, patch stages), check correctness on
a few shapes (float64 reference) and time the given tilings of a layer.
Usage: halo_exp.py VARIANT LAYER_CSV 'brief1;brief2' [epilogue]"""
import sys
import numpy as np
from convlab.bench import lab
from convlab.gpu import measure
from convlab.kernels import VARIANTS
from convlab.kernels.igemm import halo, wgmma
from convlab.oracle.verify import compare, random_problem, reference_output
from convlab.shapes import ConvShape
name, spec, briefs = sys.argv[1], sys.argv[2], sys.argv[3].split(";")
epi = sys.argv[4] if len(sys.argv) > 4 else None
B, C, H, W, M, K, S, P, *rest = map(int, spec.split(","))
shape = ConvShape(B, C, H, W, M, K, stride=S, pad=P, groups=rest[0] if rest else 1, bias=epi is not None)
v = VARIANTS[name]
CHECK = [ConvShape(3, 64, 9, 11, 40, 3, pad=1, bias=True), ConvShape(4, 64, 10, 7, 130, 5, pad=2, bias=True),
         ConvShape(2, 192, 6, 6, 64, 3, pad=1)]
policy = measure.TimingPolicy(budget_s=0.15)
for sw, bo, ps in [(0, 0, 2), (1, 0, 2), (1, 1, 2), (0, 0, 3), (1, 1, 3), (1, 0, 3)]:
    halo.SWIZZLE, halo.BASE_OFFSET, halo.PATCH_STAGES = sw, bo, ps
    wgmma.ranked.cache_clear()
    ok = []
    rng = np.random.default_rng(1)
    for cs in CHECK:
        t = next(t for t in v.ranked(cs) if t.schedule == "halo")
        x, w, b = random_problem(cs, rng)
        import cupy
        got = cupy.asnumpy(v.configured(t).prepare(cs, w, None, b).run_once(x, cupy))
        ok.append(compare(got, reference_output(x, w, cs, None, b), v.precision).passed)
    line = f"swizzle={sw} base_offset={bo} patch_stages={ps} correct={ok}"
    ranked = [t for t in v.ranked(shape) if t.schedule == "halo"]
    for brief in briefs:
        t = next((t for t in ranked if t.brief() == brief), None)
        if t is None:
            line += f" | {brief}: not valid"; continue
        r = lab.run_layer(shape, v.configured(t), policy, epilogue=epi)
        line += f" | {brief.split(' k1 ')[0]} {t.rows}r {r.timing.median_ms:.4f} {'ok' if r.check.passed else 'FAIL'}"
    print(line, flush=True)
