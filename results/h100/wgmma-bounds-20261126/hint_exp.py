"""Session 20: the warp-specialised schedules' stores with and without an L2 evict-first hint
(STORE_HINT: the bulk stores' cache hint, st.global.cs in the register store). CUDA events,
median of 200, fp16 output for the fp16 class."""
import numpy as np
import cupy
from convlab.kernels import get_variant
from convlab.oracle.verify import random_problem
from convlab.shapes import parse_layer


def T(bm, bn, stages, schedule, gather="tap", bk=64, rows=0):
    d = dict(bm=bm, bn=bn, bk=bk, warps_m=bm // 16, warps_n=1, stages=stages, split_k=1,
             gather=gather, schedule=schedule)
    if rows:
        d["rows"] = rows
    return d


CASES = [
    ("vgg-s3", "wgmma-fp16", "16,128,112,112,128,3,1,1", None, False, T(128, 256, 3, "persistent")),
    ("vgg-s4", "wgmma-fp16", "16,128,112,112,128,3,1,1", None, False, T(128, 256, 4, "persistent")),
    ("conv3-s3", "wgmma-fp16", "128,256,13,13,384,3,1,1", "relu", True, T(128, 256, 3, "persistent")),
    ("resnet-h2", "wgmma-fp16", "64,64,56,56,64,3,1,1", None, False, T(64, 120, 4, "halo", rows=2)),
    ("conv4", "wgmma-fp16", "128,384,13,13,384,3,1,1,2", "relu", True, T(64, 192, 3, "persistent")),
    ("conv2f32", "wgmma-3xtf32", "128,96,27,27,256,5,1,2,2", "relu", True,
     T(128, 128, 3, "persistent", gather="table", bk=32)),
    ("resnet-tf32", "wgmma", "64,64,56,56,64,3,1,1", None, False, T(64, 176, 4, "halo", bk=32, rows=3)),
]


def time_op(op, xs, y, n=200):
    for _ in range(20):
        op(xs, y)
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(n):
        start.record()
        op(xs, y)
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop))
    return float(np.median(times))


for rep in range(2):
    for name, kernel, layer, epilogue, bias, config in CASES:
        shape = parse_layer(layer, bias=bias)
        x, w, b = random_problem(shape, np.random.default_rng(0))
        row = []
        for extra in ({}, {"STORE_HINT": 1}):
            v = get_variant(kernel).configured(config)
            if v.precision == "fp16":
                v = v.writing(np.dtype(np.float16))
            plain = v.defines
            v.defines = lambda s, e=None, plain=plain, extra=extra: {**plain(s, e), **extra}
            op = v.prepare(shape, w, epilogue, b if shape.bias else None)
            xs = op.stage(cupy.asarray(x))
            y = cupy.empty(op.output_shape, dtype=op.output_dtype)
            row.append(time_op(op, xs, y))
        print(f"HINT {name:12} plain {row[0]:.4f}  evict-first {row[1]:.4f} ({row[0]/row[1]:.3f}x)",
              flush=True)
