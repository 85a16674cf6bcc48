"""The timer defences on the CPU: input rotation, the random sample with every image's first and
last rows, and cheating host variants run through lab.time_and_verify (the GPU cheats, with CUDA
kernels, are in test_userkernel_gpu.py)."""

import numpy as np
import pytest

from convlab.bench import guard, lab
from convlab.gpu import timer
from convlab.kernels.base import Op
from convlab.kernels.cpu import Cpu
from convlab.oracle.reference import conv2d
from convlab.oracle.verify import Check, random_problem, reference_output
from convlab.shapes import ConvShape

POLICY = timer.TimingPolicy(warmup=1, min_runs=4, max_runs=6, budget_s=0.2)


def test_rotation_contents_differ_even_for_one_image(rng):
    x = rng.random((1, 2, 5, 6), dtype=np.float32)
    rotation = guard.InputRotation(x, lambda a: a)
    contents = [b.copy() for b in rotation.buffers]
    rotation.refresh_next()
    contents.append(rotation.buffers[0])
    for i in range(len(contents)):
        for j in range(i):
            assert not np.array_equal(contents[i], contents[j])


def test_rotation_launches_in_turn_and_refreshes_in_place(rng):
    x = rng.random((4, 1, 3, 3), dtype=np.float32)
    rotation = guard.InputRotation(x, lambda a: a)
    seen = []
    for _ in range(4):
        rotation.launch(lambda xin, y: seen.append(id(xin)), None)
    assert seen[:3] == [id(b) for b in rotation.buffers] and seen[3] == seen[0]
    address = rotation.buffers[rotation.next].__array_interface__["data"][0]
    before = rotation.buffers[rotation.next].copy()
    rotation.refresh_next()
    after = rotation.buffers[rotation.next]
    assert after.__array_interface__["data"][0] == address and not np.array_equal(before, after)
    rotation.launch(lambda xin, y: None, None)
    assert rotation.last_input is after


def test_draw_images_is_random_per_call(rng):
    first, second = guard.draw_images(1000, rng), guard.draw_images(1000, rng)
    assert len(first) == 32 == len(set(first)) and first == sorted(first) and first != second
    assert guard.draw_images(10, rng) == list(range(10))


SHAPES = [ConvShape(3, 4, 11, 9, 6, 3), ConvShape(2, 4, 13, 12, 6, 5, stride=2, pad=2, groups=2, bias=True),
          ConvShape(2, 3, 12, 12, 4, 3, pad=1), ConvShape(2, 2, 7, 7, 3, 7)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.brief())
@pytest.mark.parametrize("epilogue", [None, "relu", "tanh-pool"])
def test_edge_row_reference_equals_the_full_reference(rng, shape, epilogue):
    if epilogue == "tanh-pool" and (shape.Ho < 2 or shape.bias):
        pytest.skip("tanh-pool needs a 2x2 output and takes no bias here")
    x, w, b = random_problem(shape, rng, signed=True)
    full = reference_output(x, w, shape, epilogue, b)
    layer = guard.Layer(shape, w, b, epilogue, "fp32")
    pairs = np.array([(bi, m) for bi in range(shape.B) for m in range(shape.M)])
    rows_out = full.values.shape[2]
    for out_row in (0, rows_out - 1):
        conv_row, count = guard._conv_rows(epilogue, out_row)
        ref = guard.edge_row_reference(layer, x, 0, conv_row, count, pairs)
        expected = full.values[pairs[:, 0], pairs[:, 1], out_row]
        magnitude = full.magnitude[pairs[:, 0], pairs[:, 1], out_row]
        # Same products, summed in another order: equal to float64 rounding of the magnitude.
        assert np.allclose(ref.values[:, 0], expected, rtol=0, atol=1e-12 * magnitude.max())
        assert np.allclose(ref.magnitude[:, 0], magnitude, rtol=1e-12)
        assert ref.length == full.length and ref.absolute == full.absolute


def layer_and_output(rng, shape):
    x, w, b = random_problem(shape, rng)
    out = conv2d(x, w, shape.stride, shape.pad, shape.groups, b)
    return guard.Layer(shape, w, b, None, "fp32"), x, out


def test_sample_passes_a_correct_output(rng):
    layer, x, out = layer_and_output(rng, ConvShape(100, 2, 10, 10, 3, 3))
    assert guard.verify_output(layer, x, out, "sample", rng).passed


def test_sample_catches_a_kernel_that_computes_a_fixed_sample(rng):
    shape = ConvShape(100, 2, 10, 10, 3, 3)
    layer, x, out = layer_and_output(rng, shape)
    cheat = np.zeros_like(out)
    cheat[:32] = out[:32]  # the first 32 images, as a fixed sample would look at them...
    cheat[:, :, 0], cheat[:, :, -1] = out[:, :, 0], out[:, :, -1]  # ...and every edge row
    check = guard.verify_output(layer, x, cheat, "sample", rng)
    assert not check.passed and "y[" in check.reason and "Diagnosis:" in check.reason
    wrong_image = int(check.reason.split("y[")[1].split(",")[0])
    assert wrong_image >= 32  # named by its index in the batch, not in the sample


def test_every_images_edge_rows_are_checked(rng):
    shape = ConvShape(300, 1, 9, 9, 2, 3)
    layer, x, out = layer_and_output(rng, shape)
    images = guard.draw_images(shape.B, np.random.default_rng(7))
    victim = next(i for i in range(shape.B) if i not in images)
    broken = out.copy()
    broken[victim, :, -1, 3] += 1.0  # one wrong element in the last row of an unsampled image
    check = guard.verify_output(layer, x, broken, "sample", np.random.default_rng(7))
    assert not check.passed and f"y[{victim}," in check.reason


def test_edge_rows_take_the_layers_floor_not_their_own(rng):
    """Black borders (as on Fashion-MNIST) make the first and last rows' sum|x*w| tiny. A
    transform algorithm (cuDNN's FFT on ece408 conv1, seen on an H100) leaves a rounding-sized
    value where the reference is exactly 0; the floor for it is a share of the layer's mean,
    as on the whole images checked, not of the edge rows' own mean."""
    shape = ConvShape(300, 1, 12, 12, 2, 3)
    x, w, _ = random_problem(shape, rng)
    x[:, :, :3], x[:, :, -3:] = 0, 0  # black top and bottom: edge rows have sum|x*w| = 0
    layer = guard.Layer(shape, w, None, None, "fp32")
    out = conv2d(x, w).astype(np.float32)
    full = reference_output(x, w, shape, None)
    floor = full.bound("fp32").min()  # where sum|x*w| = 0: the floor alone
    images = guard.draw_images(shape.B, np.random.default_rng(3))
    victim = next(i for i in range(shape.B) if i not in images)
    spread = out.copy()
    spread[victim, 0, 0, 4] = 0.5 * floor
    assert guard.verify_output(layer, x, spread, "sample", np.random.default_rng(3)).passed
    assert guard.verify_output(layer, x, spread, "full").passed
    wrong = out.copy()
    wrong[victim, 0, 0, 4] = 3 * floor
    check = guard.verify_output(layer, x, wrong, "sample", np.random.default_rng(3))
    assert not check.passed and f"y[{victim},0,0,4]" in check.reason
    assert "within their bounds" not in check.reason  # the diagnosis sees the same bound


def test_full_verification_sees_every_element(rng):
    shape = ConvShape(70, 1, 9, 9, 2, 3)
    layer, x, out = layer_and_output(rng, shape)
    broken = out.copy()
    broken[69, 1, 3, 3] = -broken[69, 1, 3, 3] - 1.0  # a middle row: no sample need see it
    assert not guard.verify_output(layer, x, broken, "full").passed
    with pytest.raises(ValueError, match="verify mode"):
        guard.verify_output(layer, x, out, "most")


def test_relabel_and_merge():
    check = Check(False, 1.0, 3.0, "error at y[1,2,3,4] (first at y[0,0,0,0])", 0, 2, "rule")
    renamed = guard.relabel(check, lambda i: (i[0] + 10, *i[1:]))
    assert renamed.reason == "error at y[11,2,3,4] (first at y[10,0,0,0])"
    ok = Check(True, 0.5, 0.5, "", 0, 0, "rule")
    merged = guard.merge([ok, check])
    assert not merged.passed and merged.reason == check.reason and merged.bound_ratio == 3.0
    assert guard.merge([ok, ok]).passed


def test_stream_watch_findings():
    watch = guard.StreamWatch()
    watch.outstanding_ms = [0.004, 0.006, 0.005]
    assert watch.finding(1.0) is None
    watch.outstanding_ms = [0.9, 1.1, 1.0]
    assert "outside the timed stream" in watch.finding(0.01)
    assert watch.finding(10.0) is None  # 1 ms of jitter on a 10 ms op is not a finding


# --- cheating host variants through lab.time_and_verify ---------------------------------------

class FirstCallOnly(Cpu):
    name = "test-cpu-first-call-only"

    def prepare(self, shape, weights, epilogue=None, bias=None):
        real = super().prepare(shape, weights, epilogue, bias)
        calls = []

        def launch(x, y):
            if not calls:
                real(x, y)
            calls.append(1)

        return Op(launch, real.output_shape, epilogue=epilogue)


class NewPointerOnly(Cpu):
    name = "test-cpu-new-pointer-only"

    def prepare(self, shape, weights, epilogue=None, bias=None):
        real = super().prepare(shape, weights, epilogue, bias)
        seen = set()

        def launch(x, y):
            if x.__array_interface__["data"][0] not in seen:
                seen.add(x.__array_interface__["data"][0])
                real(x, y)

        return Op(launch, real.output_shape, epilogue=epilogue)


class CachedCopy(Cpu):
    name = "test-cpu-cached-copy"

    def prepare(self, shape, weights, epilogue=None, bias=None):
        real = super().prepare(shape, weights, epilogue, bias)
        cache = {}

        def launch(x, y):
            if "y" not in cache:
                real(x, y)
                cache["y"] = y.copy()
            y[...] = cache["y"]

        return Op(launch, real.output_shape, epilogue=epilogue)


class PerPointerCache(Cpu):
    name = "test-cpu-per-pointer-cache"

    def prepare(self, shape, weights, epilogue=None, bias=None):
        real = super().prepare(shape, weights, epilogue, bias)
        cache = {}

        def launch(x, y):
            key = x.__array_interface__["data"][0]
            if key not in cache:
                real(x, y)
                cache[key] = y.copy()
            y[...] = cache[key]

        return Op(launch, real.output_shape, epilogue=epilogue)


LAYER = ConvShape(40, 2, 10, 10, 3, 3)


def test_the_cpu_variant_still_passes():
    result = lab.run_layer(LAYER, Cpu(), POLICY)
    assert result.check.passed, result.check.reason
    assert result.timing.n >= POLICY.min_runs + 1  # the stop rule's runs, then the verified one


@pytest.mark.parametrize("cheat", [FirstCallOnly, NewPointerOnly, CachedCopy, PerPointerCache],
                         ids=lambda c: c.name)
def test_timer_cheats_fail(cheat):
    result = lab.run_layer(LAYER, cheat(), POLICY)
    assert not result.check.passed
    assert "Diagnosis:" in result.check.reason


def test_skipping_cheats_leave_poison():
    for cheat in (FirstCallOnly, NewPointerOnly):
        result = lab.run_layer(LAYER, cheat(), timer.TimingPolicy(warmup=3, min_runs=4, max_runs=4))
        assert "not written" in result.check.reason and "never written" in result.check.reason


def fake_device_clock(monkeypatch, synchronize_s):
    """A stand-in cupy whose Device().synchronize() takes the next of `synchronize_s` seconds
    on a fake clock (guard's time.perf_counter), so that what the watch measures does not
    depend on how busy this machine's CPU is. Returns the clock's advance(seconds)."""
    import sys
    import types

    now = [0.0]
    pending = list(synchronize_s)

    def advance(seconds):
        now[0] += seconds

    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(Device=lambda: types.SimpleNamespace(
        synchronize=lambda: advance(pending.pop(0)))))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(guard.time, "perf_counter", lambda: now[0])
    return advance


def test_stream_watch_does_not_count_the_isolation_message_time(monkeypatch):
    """In an isolated child gpu_wait() messages the parent around every device wait; that took
    ~25 us a message and made a correct variant (winograd, tuned in child processes) look as if
    it left work running past its stop event. Only the synchronize itself may count."""
    from convlab.gpu import isolate

    advance = fake_device_clock(monkeypatch, [0.0] * 5)
    monkeypatch.setattr(isolate, "_send", lambda message: advance(0.002))
    watch = guard.StreamWatch()
    for _ in range(5):
        watch.after_sample()
    assert watch.finding(0.1) is None, watch.outstanding_ms


@pytest.mark.parametrize("delays,flagged", [([0.0] * 7 + [0.002] * 3, False), ([0.002] * 10, True)],
                         ids=["another-process-now-and-then", "every-run"])
def test_stream_watch_flags_persistent_not_sporadic_outstanding_work(monkeypatch, delays, flagged):
    """Another process sharing the GPU delays some synchronisations (the parallel GPU test run
    once failed implicit-gemm that way); work left outside the timed stream delays all. Timed
    on a fake clock: with real sleeps of no time, a CPU busy with other work (CI beside a
    second job on two cores, 2026-11-30) measured 0.134 ms in the lower quartile and flagged
    the sporadic case."""
    fake_device_clock(monkeypatch, delays)
    watch = guard.StreamWatch()
    for _ in delays:
        watch.after_sample()
    assert (watch.finding(0.5) is not None) == flagged


@pytest.mark.parametrize("batch", [1, 3])
def test_rotation_never_writes_the_callers_input(rng, batch):
    """Refreshing a rotation buffer once overwrote the caller's array itself (for one image, the
    first contents were x, not a copy): in a network that is its input buffer, and the end-to-end
    pass then classified other images."""
    x = rng.random((batch, 2, 5, 5), dtype=np.float32)
    original = x.copy()
    rotation = guard.InputRotation(x, lambda a: a)
    for _ in range(2 * guard.ROTATION):
        rotation.refresh_next()
        rotation.launch(lambda a, y: None, None)
    np.testing.assert_array_equal(x, original)


def test_run_once_stages_the_input_and_leaves_what_is_not_written_nan():
    def launch(x, y):
        y[0] = x[0, 0, 0, :2].sum()  # writes image 0 only

    op = Op(launch, (2, 1, 1, 1), stage_input=lambda x, out: x + 1)
    got = op.run_once(np.zeros((2, 1, 1, 2), dtype=np.float32), np)
    assert got[0, 0, 0, 0] == 2.0 and np.isnan(got[1]).all()



def test_variants_checked_on_one_problem_share_the_sample_and_its_references(rng, monkeypatch):
    """A Sample draws the same images for every variant of a problem and computes each float64
    reference once; an input that differs (a variant wrote into it) gets a fresh one, and a
    wrong output still fails against a kept reference."""
    shape = ConvShape(40, 3, 9, 9, 4, 3, pad=1, bias=True)
    x, w, b = random_problem(shape, rng)
    layer = guard.Layer(shape, w, b, "relu", "fp32")
    right = reference_output(x, w, shape, "relu", b).values.astype(np.float32)
    computed = []
    for name in ("reference_output", "edge_row_reference"):
        real = getattr(guard, name)

        def counting(*args, _real=real, _name=name, **kwargs):
            computed.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(guard, name, counting)
    sample = guard.Sample(seed=int(rng.integers(1 << 62)))
    assert sample.rng().integers(1 << 30) == sample.rng().integers(1 << 30)
    assert guard.verify_output(layer, x, right, sample=sample).passed
    first = len(computed)
    assert first == 3  # the sampled images, then the first and last rows
    assert guard.verify_output(layer, x, right, sample=sample).passed
    assert len(computed) == first
    images = guard.draw_images(shape.B, sample.rng())
    outside = next(i for i in range(shape.B) if i not in images)
    for image, caught in ((images[-1], True), (outside, False)):
        wrong = right.copy()
        wrong[image, 2, 4, 4] += 1.0  # inside an image's middle rows: only the images see it
        assert guard.verify_output(layer, x, wrong, sample=sample).passed is not caught
    wrong = right.copy()
    wrong[:, 1, 0, 3] += 1.0  # every image's first row
    assert not guard.verify_output(layer, x, wrong, sample=sample).passed
    written = x.copy()
    written[images[0], 0, 4, 4] += 0.5  # changed where the kept references read it
    computed.clear()
    guard.verify_output(layer, written, right, sample=sample)
    assert computed and computed[0] == "reference_output"
