"""Session 21: the same tilings back to back with the clock sampled, under the tree PYTHONPATH
picks (HEAD's element stores or the 16-byte register store). Usage: python clocks_ab.py TAG"""
import sys

import cupy
import numpy as np

sys.path.insert(0, "gpu-out")
from clocks_exp import T, sampled  # noqa: E402

from convlab.kernels import get_variant  # noqa: E402
from convlab.oracle.verify import random_problem  # noqa: E402
from convlab.shapes import parse_layer  # noqa: E402

CASES = [("conv3 fp16", "128,256,13,13,384,3,1,1", "relu", True, T(128, 256, 3, "persistent")),
         ("VGG fp16", "16,128,112,112,128,3,1,1", None, False, T(128, 256, 4, "persistent")),
         ("conv4 fp16", "128,384,13,13,384,3,1,1,2", "relu", True, T(64, 192, 3, "persistent"))]
tag = sys.argv[1]
for name, layer, epilogue, bias, config in CASES:
    shape = parse_layer(layer, bias=bias)
    x, w, b = random_problem(shape, np.random.default_rng(0))
    v = get_variant("wgmma-fp16").configured(config).writing(np.dtype(np.float16))
    op = v.prepare(shape, w, epilogue, b if shape.bias else None)
    xs = op.stage(cupy.asarray(x))
    y = cupy.empty(op.output_shape, dtype=op.output_dtype)
    ms, clock, power, reasons = sampled(lambda: op(xs, y))
    print(f"CAB {tag:5} {name:11} {ms:8.4f} ms  SM {clock:5.0f} MHz  {power:4.0f} W  "
          f"cycles a launch {ms * clock * 1e3:9.0f}", flush=True)
