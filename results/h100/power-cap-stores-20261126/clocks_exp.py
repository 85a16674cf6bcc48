"""Session 21: does what the copies cost show in the clock? Session 20's switches
(copy-cost-experiment.patch: SKIP_A stops A's bulk copies after the first STAGES K-tiles, SKIP_B
B's gather likewise, SKIP_EPILOGUE never runs the stores; outputs wrong by design), each tiling
run back to back for 2 s with nvidia-smi sampling the SM clock and power every 50 ms.
Usage: PYTHONPATH=gpu-out/exp python gpu-out/clocks_exp.py"""
import subprocess
import time
from collections import Counter

import cupy
import numpy as np

from convlab.kernels import get_variant
from convlab.oracle.verify import random_problem
from convlab.shapes import parse_layer


def T(bm, bn, stages, schedule, gather="tap", bk=64):
    return dict(bm=bm, bn=bn, bk=bk, warps_m=bm // 16, warps_n=1, stages=stages, split_k=1,
                gather=gather, schedule=schedule)


CASES = [
    ("conv3 fp16", "wgmma-fp16", "128,256,13,13,384,3,1,1", "relu", True,
     T(128, 256, 3, "persistent")),
    ("VGG fp16", "wgmma-fp16", "16,128,112,112,128,3,1,1", None, False,
     T(128, 256, 4, "persistent")),
    ("conv2 3xTF32", "wgmma-3xtf32", "128,96,27,27,256,5,1,2,2", "relu", True,
     T(128, 128, 3, "persistent", gather="table", bk=32)),
]
import sys  # noqa: E402
SWITCHES = [("all", {}), ("no A", {"SKIP_A": 1}), ("no B", {"SKIP_B": 1}),
            ("no A, B", {"SKIP_A": 1, "SKIP_B": 1}), ("no stores", {"SKIP_EPILOGUE": 1}),
            ("L2 stores", {"STORE_L2ONLY": 1})]
if sys.argv[1:] == ["stores"]:  # call 6: the stores kept, but to an L2-sized slice
    SWITCHES = [SWITCHES[0], SWITCHES[4], SWITCHES[5], SWITCHES[0]]
if sys.argv[1:] == ["vector"]:  # call 7: 16-byte stores, values not transposed
    SWITCHES = [SWITCHES[0], SWITCHES[4], ("16 B stores", {"STORE_VEC_EXP": 1}), SWITCHES[0]]
    CASES = CASES[:2]


def sampled(fn, seconds=2.0):
    query = "clocks.sm,power.draw,clocks_event_reasons.active"
    mon = subprocess.Popen(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits",
                            "-lms", "50"], stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)
    for _ in range(20):
        fn()
    cupy.cuda.runtime.deviceSynchronize()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    n, t0 = 0, time.time()
    start.record()
    while time.time() - t0 < seconds:
        for _ in range(50):
            fn()
        n += 50
        if n % 500 == 0:
            cupy.cuda.runtime.deviceSynchronize()
    end.record()
    end.synchronize()
    mon.terminate()
    rows = [r.split(",") for r in mon.communicate()[0].strip().splitlines()]
    rows = rows[len(rows) // 4: -2] or rows
    clock = float(np.median([float(r[0]) for r in rows]))
    power = float(np.median([float(r[1]) for r in rows]))
    reasons = Counter(r[2].strip() for r in rows).most_common(1)[0][0]
    return cupy.cuda.get_elapsed_time(start, end) / n, clock, power, reasons


def main():
  for name, kernel, layer, epilogue, bias, config in CASES:
    shape = parse_layer(layer, bias=bias)
    x, w, b = random_problem(shape, np.random.default_rng(0))
    first = None
    for label, extra in SWITCHES:
        v = get_variant(kernel).configured(config)
        if v.precision == "fp16":
            v = v.writing(np.dtype(np.float16))
        plain = v.defines
        v.defines = lambda s, e=None, plain=plain, extra=extra: {**plain(s, e), **extra}
        op = v.prepare(shape, w, epilogue, b if shape.bias else None)
        xs = op.stage(cupy.asarray(x))
        y = cupy.empty(op.output_shape, dtype=op.output_dtype)
        ms, clock, power, reasons = sampled(lambda: op(xs, y))
        first = first or (ms, clock)
        print(f"SKIP {name:13} {label:10} {ms:8.4f} ms ({first[0] / ms:4.2f}x)  SM {clock:5.0f} MHz "
              f"({clock / first[1]:4.2f}x)  {power:4.0f} W  reasons {reasons}  "
              f"cycles a launch {ms * clock * 1e3:9.0f} ({first[0] * first[1] / (ms * clock):4.2f}x)",
              flush=True)


if __name__ == "__main__":
    main()
