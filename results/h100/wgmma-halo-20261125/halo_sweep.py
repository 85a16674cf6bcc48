"""Time every halo tiling of a layer (and the persistent/grid best few) with run_layer:
median ms, verified. Usage: halo_sweep.py VARIANT LAYER_CSV [max_halo] [epilogue]"""
import sys, time
from convlab.bench import lab
from convlab.gpu import measure
from convlab.kernels import VARIANTS
from convlab.kernels.igemm import wgmma
from convlab.shapes import ConvShape
name, spec = sys.argv[1], sys.argv[2]
limit = int(sys.argv[3]) if len(sys.argv) > 3 else 40
epi = sys.argv[4] if len(sys.argv) > 4 else None
B, C, H, W, M, K, S, P, *rest = map(int, spec.split(","))
G = rest[0] if rest else 1
shape = ConvShape(B, C, H, W, M, K, stride=S, pad=P, groups=G, bias=epi is not None)
v = VARIANTS[name]
k = v.kernel_shape(shape)
ranked = v.ranked(shape)
halo = [t for t in ranked if t.schedule == "halo"][:limit]
others = [t for t in ranked if t.schedule == "persistent"][:3] + [t for t in ranked if t.schedule == "grid"][:2]
policy = measure.TimingPolicy(budget_s=0.15)
rows = []
for t in others + halo:
    t0 = time.time()
    try:
        r = lab.run_layer(shape, v.configured(t), policy, epilogue=epi)
        ms, ok = r.timing.median_ms, r.check.passed
    except Exception as e:  # report and go on
        ms, ok = float("nan"), f"ERR {type(e).__name__}: {str(e)[:120]}"
    rows.append((ms, t.brief(), ok, wgmma.blocks_per_sm(t, v.maths, k), v.tiling_estimate(shape, t)))
    print(f"{ms:8.4f} ms  {t.brief():36s} ok={ok} bps={rows[-1][3]} est={rows[-1][4]:.1f}us ({time.time()-t0:.1f}s)", flush=True)
print("--- best", name, shape.brief())
for r in sorted(rows, key=lambda r: (r[0] != r[0], r[0]))[:8]:
    print(f"{r[0]:8.4f} ms  {r[1]:36s} ok={r[2]}")
