"""Session 21: the SM clock and power while each kernel runs back to back for a few seconds
(nvidia-smi sampled every 50 ms): our wgmma kernels on their shipped tilings, and cuDNN's two
layouts through convlab's own cudnn rows, on AlexNet's layers and the ResNet and VGG 3x3 layers,
and the wgmma ceiling kernel. Per run: ms a launch (CUDA events over the whole loop, host
dispatch not excluded: compare's timing is the one to quote), TFLOP/s, the median SM clock,
power and throttle reasons of the samples, and TFLOP/s over the instruction's peak at that
clock."""
import subprocess
import sys
import time
from collections import Counter

import cupy
import numpy as np
import torch

from convlab.gpu.measure import WGMMA_PEAK_MODES, WGMMA_PEAK_SOURCE
from convlab.gpu.jit import load_module
from convlab.kernels import get_variant
from convlab.oracle.verify import random_problem
from convlab.shapes import parse_layer

SMS = cupy.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
FLOP_PER_CLOCK = {"fp16": 4096, "tf32": 2048, "fp32": 2048 / 3}  # wgmma dense, per SM
SECONDS = 2.0


def sampled(fn, seconds, sync):
    query = "clocks.sm,power.draw,clocks_event_reasons.active"
    mon = subprocess.Popen(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits",
                            "-lms", "50"], stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)
    for _ in range(20):
        fn()
    sync()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    n, t0 = 0, time.time()
    start.record()
    while time.time() - t0 < seconds:
        for _ in range(50):
            fn()
        n += 50
        if n % 500 == 0:
            sync()
    end.record()
    end.synchronize()
    mon.terminate()
    rows = [r.split(",") for r in mon.communicate()[0].strip().splitlines()]
    rows = rows[len(rows) // 4: -2] or rows  # the steady part
    clock = float(np.median([float(r[0]) for r in rows]))
    power = float(np.median([float(r[1]) for r in rows]))
    reasons = Counter(r[2].strip() for r in rows).most_common(1)[0][0]
    return start.elapsed_time(end) / n, clock, power, reasons


def report(name, flop, cls, fn, sync=torch.cuda.synchronize):
    ms, clock, power, reasons = sampled(fn, SECONDS, sync)
    tflops = flop / ms / 1e9
    peak = SMS * FLOP_PER_CLOCK[cls] * clock * 1e6 / 1e12
    print(f"CLK {name:52} {ms:8.4f} ms {tflops:7.1f} TFLOP/s  SM {clock:6.0f} MHz  "
          f"{power:5.0f} W  reasons {reasons}  {tflops / peak:5.1%} of wgmma {cls} at that clock",
          flush=True)


def ceiling(precision):
    mode, k = WGMMA_PEAK_MODES[precision]
    kernel = load_module(f"ceiling:wgmma-{precision}", WGMMA_PEAK_SOURCE,
                         ("-std=c++17", f"-DMODE={mode}"), ("wgmma_peak",),
                         "sm_90a").module.get_function("wgmma_peak")
    blocks, iters = SMS * 3, 256
    out = cupy.empty(blocks * 128, dtype=cupy.float32)
    flop = blocks * iters * 4 * 2 * 64 * 256 * k
    report(f"wgmma ceiling {precision}", flop, precision,
           lambda: kernel((blocks,), (128,), (out, np.int32(iters))))


LAYERS = {"conv1": ("128,3,227,227,96,11,4", "relu", True),
          "conv2": ("128,96,27,27,256,5,1,2,2", "relu", True),
          "conv3": ("128,256,13,13,384,3,1,1", "relu", True),
          "conv4": ("128,384,13,13,384,3,1,1,2", "relu", True),
          "conv5": ("128,384,13,13,256,3,1,1,2", "relu", True),
          "resnet": ("64,64,56,56,64,3,1,1", None, False),
          "vgg": ("16,128,112,112,128,3,1,1", None, False)}
# ours, then cuDNN's two layouts through convlab's own cudnn rows (what compare times: the fused
# conv-bias-ReLU where it is faster, cuDNN's autotuner on)
ROWS = {"fp16": ("wgmma-fp16", "cudnn-nhwc-fp16", "cudnn-fp16"),
        "fp32": ("wgmma-3xtf32", "cudnn-nhwc", "cudnn"),
        "tf32": ("wgmma", "cudnn-nhwc-tf32", "cudnn-tf32")}
RUNS = [(layer, "fp16") for layer in LAYERS] + [(layer, "fp32") for layer in LAYERS] + [
    ("conv3", "tf32")]
RATE_CLASS = {"fp16": "fp16", "fp32": "fp32", "tf32": "tf32"}
if sys.argv[1:]:  # the classes named (call 13: fp16)
    RUNS = [(layer, cls) for layer, cls in RUNS if cls in sys.argv[1:]]

print(f"{torch.cuda.get_device_name()} {SMS} SMs", flush=True)
ceiling("fp16")
rng = np.random.default_rng(0)
for layer, cls in RUNS:
    spec, epilogue, bias = LAYERS[layer]
    shape = parse_layer(spec, bias=bias)
    flop = 2 * shape.B * shape.M * shape.Ho * shape.Wo * shape.Cg * shape.K * shape.K
    x, w, b = random_problem(shape, rng, signed=True)
    for name in ROWS[cls]:
        variant = get_variant(name)
        if name == "wgmma-fp16":
            variant = variant.writing(np.float16)
        op = variant.prepare(shape, w, epilogue, b)
        xs = op.stage(cupy.asarray(x))
        y = cupy.empty(op.output_shape, dtype=op.output_dtype)
        tag = (f" [{variant.config_for(shape, epilogue).brief()}]" if name.startswith("wgmma")
               else "")
        report(f"{layer} {cls} {name}{tag}", flop, RATE_CLASS[cls], lambda: op(xs, y))
ceiling("fp16")
