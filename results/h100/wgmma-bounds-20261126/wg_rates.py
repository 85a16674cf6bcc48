"""Session 20: the wgmma ceiling kernel at 1-4 warpgroups per SM (blocks of 128 threads)."""
import numpy as np
import cupy
from convlab.gpu.measure import WGMMA_PEAK_SOURCE, WGMMA_PEAK_MODES, load_module, _time_once
from convlab.gpu import hardware
sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
iters = 4096
for precision, (mode, k) in WGMMA_PEAK_MODES.items():
    kernel = load_module(f"ceiling:wgmma-{precision}", WGMMA_PEAK_SOURCE, ("-std=c++17", f"-DMODE={mode}"),
                         ("wgmma_peak",), "sm_90a").module.get_function("wgmma_peak")
    for per_sm in (1, 2, 3, 4):
        blocks = sms * per_sm
        out = cupy.empty(blocks * 128, dtype=cupy.float32)
        ms = min(_time_once(lambda: kernel((blocks,), (128,), (out, np.int32(iters)))) for _ in range(3))
        print(f"WG {precision} {per_sm} per SM: {blocks * iters * 4 * (2 * 64 * 256 * k) / (ms * 1e-3) / 1e12:.0f} TFLOP/s", flush=True)
