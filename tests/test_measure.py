import json
import math

import pytest

from convlab.gpu import peaks, roofline, timer
from convlab.kernels import TANH_POOL
from convlab.shapes import ConvShape


def test_median_rse_of_constant_samples_is_zero():
    assert timer.median_rse([2.0] * 10) == 0.0


def test_median_rse_shrinks_with_more_samples():
    """1/sqrt(n): 100x the samples, a tenth of the standard error. Deterministic samples (evenly
    spaced quantiles of one normal distribution): random draws made this a coin toss for small n
    (the MAD of 10 draws varies by 2x from seed to seed)."""
    from statistics import NormalDist

    def samples(n):
        return [NormalDist(1.0, 0.05).inv_cdf((i + 0.5) / n) for i in range(n)]

    few, many = timer.median_rse(samples(10)), timer.median_rse(samples(1000))
    assert many == pytest.approx(few / 10, rel=0.15)


def test_median_rse_ignores_one_outlier():
    base = [1.0, 1.01, 0.99, 1.0, 1.02, 0.98, 1.0, 1.01, 0.99, 1.0]
    assert timer.median_rse(base + [50.0]) < 0.01


def test_median_rse_needs_two_samples():
    assert timer.median_rse([1.0]) == math.inf


def test_stop_rule():
    quiet = [1.0, 1.001] * 5
    assert timer.stop_reason(quiet[:9], 0.0) is None  # fewer than min_runs
    assert timer.stop_reason(quiet, 0.0) == "converged"
    noisy = [1.0, 2.0, 0.5, 3.0, 1.5, 0.7, 2.5, 1.1, 0.9, 2.2]
    assert timer.stop_reason(noisy, 0.1) is None
    assert timer.stop_reason(noisy, 5.0) == "budget"
    assert timer.stop_reason(noisy * 200, 0.1, max_runs=2000) in ("max-runs", "converged")
    assert timer.stop_reason(noisy, 0.1, max_runs=10) == "max-runs"


def test_timing_statistics():
    t = timer.Timing([1.0, 2.0, 3.0, 4.0, 100.0])
    assert t.median_ms == 3.0 and t.min_ms == 1.0 and t.n == 5
    assert t.spread_pct == pytest.approx((4.0 - 2.0) / 3.0 * 100)
    again = timer.Timing.from_dict(t.as_dict())
    assert again.samples_ms == t.samples_ms and again.stop == t.stop


def test_host_timing_follows_the_policy():
    calls = []
    timing = timer.time_host(lambda: calls.append(1), timer.TimingPolicy(min_runs=4, max_runs=4))
    assert timing.n == 4 and timing.clock == "host" and len(calls) == 5  # one warm-up
    assert timing.method == "host" and timing.as_dict()["method"] == "host"


def test_traffic_and_rates():
    shape = ConvShape(10000, 1, 28, 28, 50, 5)
    assert shape.flops == 2 * 10000 * 50 * 24 * 24 * 25
    assert roofline.traffic_bytes(shape) == 4 * (10000 * 784 + 1250 + 10000 * 50 * 576)
    pooled = roofline.traffic_bytes(shape, TANH_POOL)
    assert pooled == 4 * (10000 * 784 + 1250 + 10000 * 50 * 144)
    assert roofline.gflops(shape, 1.0) == pytest.approx(shape.flops / 1e-3 / 1e9)
    assert roofline.gbps(shape, 2.0, TANH_POOL) == pytest.approx(pooled / 2e-3 / 1e9)


def test_floor_picks_the_binding_ceiling():
    c = peaks.Ceilings("test", copy_gbps=3000.0, fp32_gflops=50000.0, tf32_gflops=300000.0)
    high = ConvShape(10000, 1, 28, 28, 50, 5)  # writes 1.15 GB: memory-bound
    ms, bound = c.floor_ms(high)
    assert bound == "memory" and ms == pytest.approx(high.min_bytes / 3000e9 * 1e3)
    conv2 = ConvShape(10000, 12, 21, 21, 24, 7)  # 63.5 GFLOP: FMA-bound in fp32
    ms, bound = c.floor_ms(conv2)
    assert bound == "compute" and ms == pytest.approx(conv2.flops / 50000e9 * 1e3)
    ms_tf32, bound_tf32 = c.floor_ms(conv2, "tf32")
    assert bound_tf32 == "compute" and ms_tf32 == pytest.approx(conv2.flops / 300000e9 * 1e3)


def test_a_half_precision_floor_counts_16_bit_bytes():
    """fp16 rows read and write 16-bit tensors: their memory floor (and GB/s) counted 4-byte
    elements, so the ResNet 3x3 layer's fp16 rows showed 74-76% of a "copy" floor twice the
    real one (2026-11-25)."""
    resnet = ConvShape(64, 64, 56, 56, 64, 3, pad=1)
    c = peaks.Ceilings("test", 3000.0, 50000.0, 300000.0, fp16_gflops=650000.0,
                       wgmma_tf32_gflops=600000.0, wgmma_fp16_gflops=980000.0)
    ms, bound = c.floor_ms(resnet, "fp16")
    assert bound == "memory" and ms == pytest.approx(resnet.min_bytes / 2 / 3000e9 * 1e3)
    assert c.floor_ms(resnet, "tf32")[0] == pytest.approx(2 * ms)
    assert roofline.traffic_bytes(resnet, None, 2) == resnet.min_bytes // 2
    assert roofline.gbps(resnet, 1.0, None, 2) == pytest.approx(roofline.gbps(resnet, 1.0) / 2)
    assert roofline.element_bytes("bf16") == 2 and roofline.element_bytes("3xtf32") == 4


def test_a_half_precision_layer_of_a_run_counts_16_bit_bytes():
    """`convlab run`'s per-layer GB/s counted 4-byte elements for fp16 and bf16 layers as
    compare's rows did before 2026-11-25 (left then, fixed on 2026-11-26); a record saved
    before the layer kept its element size reads as 4 bytes."""
    from convlab.bench.records import LayerResult
    from convlab.oracle.verify import Check

    resnet = ConvShape(64, 64, 56, 56, 64, 3, pad=1)
    layers = {b: LayerResult("conv", "conv", resnet, None, timer.Timing([0.05]),
                             Check(True, 1e-3, 0.01), 0.1, "v", "", b) for b in (4, 2)}
    assert layers[2].gbps == pytest.approx(layers[4].gbps / 2)
    saved = json.loads(json.dumps(layers[2].as_dict()))
    assert LayerResult.from_dict(saved) == layers[2]
    del saved["element_bytes"]
    assert LayerResult.from_dict(saved).gbps == pytest.approx(layers[4].gbps)


def test_half_precision_floor_uses_the_half_precision_rate():
    """fp16/bf16 rows were held to the TF32 rate, so cuDNN bf16 showed 404% of its "floor"."""
    conv3 = ConvShape(128, 256, 13, 13, 384, 3, pad=1, bias=True)
    measured = peaks.Ceilings("test", 3000.0, 50000.0, 300000.0, fp16_gflops=620000.0)
    for precision in ("fp16", "bf16"):
        ms, bound = measured.floor_ms(conv3, precision)
        assert bound == "compute" and ms == pytest.approx(conv3.flops / 620000e9 * 1e3)
    older = peaks.Ceilings("test", 3000.0, 50000.0, 300000.0)  # saved before fp16 was measured
    assert older.rate("fp16") == 600000.0 and older.rate("tf32") == 300000.0


def test_the_floor_uses_the_fastest_instruction_the_gpu_has():
    """On a Hopper GPU wgmma outruns mma.sync: the floor is the wgmma rate where it was
    measured, mma.sync's elsewhere, and a saved record without wgmma rates reads as before."""
    conv3 = ConvShape(128, 256, 13, 13, 384, 3, pad=1, bias=True)
    hopper = peaks.Ceilings("test", 3000.0, 50000.0, 320000.0, fp16_gflops=650000.0,
                            wgmma_tf32_gflops=490000.0, wgmma_fp16_gflops=980000.0)
    assert hopper.rate("tf32") == 490000.0 and hopper.rate("fp16") == hopper.rate("bf16") == 980000.0
    assert hopper.rate("fp32") == 50000.0
    ms, bound = hopper.floor_ms(conv3, "fp16")
    assert bound == "compute" and ms == pytest.approx(conv3.flops / 980000e9 * 1e3)
    saved = {k: v for k, v in hopper.as_dict().items() if not k.startswith("wgmma")}
    assert peaks.Ceilings(**saved).rate("fp16") == 650000.0


def test_the_wgmma_ceiling_kernel_builds_for_sm90a_only():
    from convlab.gpu.jit import compile_cubin, nvrtc_compile

    for mode, _ in peaks.WGMMA_PEAK_MODES.values():
        options = ("-std=c++17", f"-DMODE={mode}")
        assert compile_cubin("ceiling:wgmma", peaks.WGMMA_PEAK_SOURCE, options, "sm_90a")[:4] == b"\x7fELF"
    assert nvrtc_compile("w.cu", peaks.WGMMA_PEAK_SOURCE, options, "sm_90").cubin is None


def test_timing_records_its_method_and_old_records_read_as_single_launches():
    timing = timer.Timing([0.1, 0.2, 0.3], method=timer.QUEUED, launches=40, drained=1)
    d = timing.as_dict()
    assert (d["method"], d["launches"], d["drained"]) == ("queued", 40, 1)
    assert timer.Timing.from_dict(d) == timing
    old = {k: v for k, v in d.items() if k not in ("method", "launches", "drained")}
    assert timer.Timing.from_dict(old).method == timer.SINGLE
    assert timer.Timing.from_dict({**old, "clock": "host"}).method == "host"
    assert "40 back-to-back launches" in timing.describe()


def test_policy_refuses_an_unknown_method():
    with pytest.raises(ValueError, match="queued, single"):
        timer.TimingPolicy(method="graph")
    assert timer.TimingPolicy().method == timer.QUEUED


@pytest.mark.parametrize("capability,measured_again", [((9, 0), True), ((8, 0), False)])
def test_ceilings_saved_before_the_wgmma_rates_are_measured_again_on_hopper(
        monkeypatch, tmp_path, capability, measured_again):
    monkeypatch.setenv("CONVLAB_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(peaks, "device_info",
                        lambda: {"name": "GPU", "pci_bus_id": "0", "driver": "1"})
    monkeypatch.setattr(peaks, "compute_capability", lambda: capability)
    old = peaks.Ceilings("GPU", 3000.0, 50000.0, 320000.0, fp16_gflops=650000.0)
    (tmp_path / "ceilings-GPU-0-1.json").write_text(json.dumps(old.as_dict()))
    fresh = peaks.Ceilings("GPU", 3000.0, 50000.0, 320000.0, fp16_gflops=650000.0,
                           wgmma_tf32_gflops=490000.0, wgmma_fp16_gflops=930000.0)
    monkeypatch.setattr(peaks, "measure_ceilings", lambda: fresh)
    got = peaks.ceilings()
    assert got == (fresh if measured_again else old)
    saved = json.loads((tmp_path / "ceilings-GPU-0-1.json").read_text())
    assert saved["wgmma_fp16_gflops"] == (930000.0 if measured_again else None)


def test_a_strided_1x1_reads_a_quarter_of_its_input():
    """ResNet's shortcut projection reads every other row and column: the floor counted the
    whole input, and our rows showed 161% of it."""
    shortcut = ConvShape(128, 256, 56, 56, 512, 1, stride=2, bias=True)
    assert shortcut.min_bytes == 4 * (128 * 256 * 28 * 28 + 512 * 256 + 512 + 128 * 512 * 28 * 28)
    stem = ConvShape(2, 3, 227, 227, 96, 11, stride=4)  # AlexNet conv1: windows overlap
    assert stem.min_bytes == 4 * (2 * 3 * 227 * 227 + 96 * 3 * 121 + 2 * 96 * 55 * 55)
    padded = ConvShape(1, 1, 5, 5, 1, 3, stride=2, pad=1)  # rows -1..5: the image's 5
    assert padded.min_bytes == 4 * (25 + 9 + 9)


def test_a_fused_relu_writes_the_whole_output():
    """Only the 2x2 pool shrinks what a layer writes; the ReLU's floor counted a quarter."""
    shape = ConvShape(8, 64, 14, 14, 64, 3, pad=1, bias=True)
    assert roofline.traffic_bytes(shape, "relu") == roofline.traffic_bytes(shape)
    assert roofline.traffic_bytes(shape, "tanh-pool") < roofline.traffic_bytes(shape)
    # a residual add fused into the conv reads the kept activation too: an output's worth
    outputs = shape.B * shape.M * shape.Ho * shape.Wo
    assert roofline.traffic_bytes(shape, "add-relu", 2) == roofline.traffic_bytes(shape, None, 2) \
        + 2 * outputs
