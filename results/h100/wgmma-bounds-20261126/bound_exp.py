"""Session 20: what the persistent schedule's copies cost. Times one tiling with extra
defines (SKIP_A: A's bulk copies stop after the first STAGES K-tiles, SKIP_B: B's gather
does; SKIP_EPILOGUE: the stores are never run): results are wrong by design, the time is the point. CUDA events, median of 200.
Usage: PYTHONPATH=gpu-out/exp python gpu-out/bound_exp.py"""
import json
import numpy as np
import cupy
from convlab.kernels import get_variant
from convlab.oracle.verify import random_problem
from convlab.shapes import parse_layer


def T(bm, bn, stages, schedule, gather="tap", bk=64):
    return dict(bm=bm, bn=bn, bk=bk, warps_m=bm // 16, warps_n=1, stages=stages, split_k=1,
                gather=gather, schedule=schedule)


CASES = [
    ("vgg16", "wgmma-fp16", "16,128,112,112,128,3,1,1", None, False, T(128, 256, 4, "persistent")),
    ("conv3f16", "wgmma-fp16", "128,256,13,13,384,3,1,1", "relu", True, T(128, 256, 3, "persistent")),
    ("conv3f16s4", "wgmma-fp16", "128,256,13,13,384,3,1,1", "relu", True, T(128, 256, 4, "persistent")),
    ("conv2f32", "wgmma-3xtf32", "128,96,27,27,256,5,1,2,2", "relu", True,
     T(128, 128, 3, "persistent", gather="table", bk=32)),
    ("conv4f16", "wgmma-fp16", "128,384,13,13,384,3,1,1,2", "relu", True, T(64, 192, 3, "persistent")),
    ("resnet16", "wgmma-fp16", "64,64,56,56,64,3,1,1", None, False, T(64, 256, 4, "persistent")),
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


for name, kernel, layer, epilogue, bias, config in CASES:
    shape = parse_layer(layer, bias=bias)
    x, w, b = random_problem(shape, np.random.default_rng(0))
    row = []
    for extra in ({}, {"SKIP_A": 1}, {"SKIP_B": 1}, {"SKIP_A": 1, "SKIP_B": 1},
                  {"SKIP_EPILOGUE": 1}, {"SKIP_A": 1, "SKIP_B": 1, "SKIP_EPILOGUE": 1}):
        v = get_variant(kernel).configured(config)
        if v.precision == "fp16":  # as compare's layer rows: fp16 output
            v = v.writing(np.dtype(np.float16))
        plain = v.defines
        v.defines = lambda s, e=None, plain=plain, extra=extra: {**plain(s, e), **extra}
        op = v.prepare(shape, w, epilogue, b if shape.bias else None)
        xs = op.stage(cupy.asarray(x))
        y = cupy.empty(op.output_shape, dtype=op.output_dtype)
        row.append(time_op(op, xs, y))
    print(f"BOUND {name:10} all {row[0]:.4f}  noA {row[1]:.4f} ({row[0]/row[1]:.2f}x)  "
          f"noB {row[2]:.4f} ({row[0]/row[2]:.2f}x)  neither {row[3]:.4f} ({row[0]/row[3]:.2f}x)  "
          f"noStore {row[4]:.4f} ({row[0]/row[4]:.2f}x)  nothing {row[5]:.4f} ({row[0]/row[5]:.2f}x)",
          flush=True)
