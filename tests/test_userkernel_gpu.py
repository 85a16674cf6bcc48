"""Kernel files on the GPU: scaffolds that pass, deliberately broken CUDA kernels and the
diagnosis each gets, isolation (fault, trap, hang), compute-sanitizer, the occupancy rule
against the driver's, and a test-only kernel for every way of cheating the timer.

Run on a GPU machine: pytest -m gpu tests/test_userkernel_gpu.py (compute-sanitizer tests skip
when the tool is missing: pip install nvidia-cuda-sanitizer-api-cu12)."""

import pytest

from convlab.bench import lab
from convlab.gpu import cubin, timer
from convlab.gpu.isolate import run_isolated
from convlab.gpu.jit import nvrtc_compile
from convlab.kernels import VARIANTS, kernel_variants
from convlab.kernels.base import Op
from convlab.kernels.igemm.tiling import k_tiles
from convlab.kernels.naive import Naive
from convlab.models import get_model
from convlab.shapes import ConvShape
from convlab.userkernel.kernelfile import load_kernel_file
from convlab.userkernel.sanitize import WHERE_TO_GET, find_compute_sanitizer, sanitize
from convlab.userkernel.scaffold import scaffold

pytestmark = pytest.mark.gpu

POLICY = timer.TimingPolicy(warmup=3, min_runs=5, max_runs=20, budget_s=0.3)
COURSE = ConvShape(100, 12, 21, 21, 24, 7)
GENERAL = ConvShape(3, 6, 17, 15, 8, 3, stride=2, pad=1, groups=2, bias=True)
SMALL = ConvShape(4, 3, 12, 11, 5, 3)


def kernel_file(tmp_path, origin="naive", replacements=(), name="mine"):
    """A scaffold from `origin` with its .cu edited; every edit must apply."""
    made = scaffold(name, origin, tmp_path)
    text = made.files[0].read_text()
    for old, new in replacements:
        assert old in text, f"the {origin} source no longer contains {old!r}"
        text = text.replace(old, new)
    made.files[0].write_text(text)
    return made.files[0]


def line_of(path, fragment):
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if fragment in line)


# --- scaffolds run like the rungs they came from -------------------------------------------------

@pytest.mark.parametrize("origin", ["naive", "tiled", "register-tiled"])
def test_scaffold_passes(tmp_path, origin):
    variant = load_kernel_file(kernel_file(tmp_path, origin)).variant
    result = lab.run_layer(COURSE, variant, POLICY)
    assert result.check.passed, result.check.reason
    assert result.timing.median_ms > 0


@pytest.mark.parametrize("origin", ["naive", "tiled"])
def test_header_scaffold_runs_general_layers_with_relu(tmp_path, origin):
    variant = load_kernel_file(kernel_file(tmp_path, origin)).variant
    result = lab.run_layer(GENERAL, variant, POLICY, epilogue="relu")
    assert result.check.passed, result.check.reason


WGMMA_LAYER = ConvShape(16, 64, 28, 28, 128, 3, pad=1, bias=True)


def test_a_wgmma_scaffold_runs_its_own_mainloop_step(tmp_path):
    """The kernel file holds only mainloop_step and includes the rest of the family: as
    scaffolded it passes on the tiling the rung picks; a step that drops the last k-step of
    every K-tile fails the check (the library's gathers and epilogue did not hide it)."""
    variant = load_kernel_file(kernel_file(tmp_path, "wgmma-fp16")).variant
    result = lab.run_layer(WGMMA_LAYER, variant, POLICY, epilogue="relu")
    assert result.check.passed, result.check.reason
    short = load_kernel_file(kernel_file(
        tmp_path, "wgmma-fp16", [("for (int s = 0; s < KSTEPS; ++s)",
                                  "for (int s = 0; s < KSTEPS - 1; ++s)")], "short")).variant
    assert not lab.run_layer(WGMMA_LAYER, short, POLICY, epilogue="relu").check.passed


def test_isolated_run_returns_the_record(tmp_path):
    path = kernel_file(tmp_path)
    record = run_isolated("convlab.bench.filejobs:time_layer",
                          {"shape": COURSE.as_dict(), "kernel_file": str(path),
                           "policy": {"min_runs": 5, "budget_s": 0.3}}, timeout_s=10)
    assert record["status"] == "ok", record["reason"]
    assert record["result"]["layer"]["check"]["passed"]
    assert record["result"]["kernel_file"]["sha256"] == load_kernel_file(path).sha256


# --- isolation: faults and hangs end the job, not convlab ------------------------------------------

def exercise(path, timeout_s=10.0):
    return run_isolated("convlab.userkernel.exercise:exercise",
                        {"shape": SMALL.as_dict(), "kernel_file": str(path)}, timeout_s=timeout_s)


def test_illegal_address_is_a_fail_with_the_cuda_error(tmp_path):
    import cupy

    path = kernel_file(tmp_path, replacements=[("    y[i] = acc;", "    y[i + (1LL << 40)] = acc;")])
    record = exercise(path)
    assert record["status"] == "error" and "cudaError" in record["reason"], record
    assert "illegal" in record["reason"].lower()
    assert int(cupy.arange(4).sum()) == 6  # this process's CUDA context is untouched


def test_trap_is_a_fail(tmp_path):
    path = kernel_file(tmp_path, replacements=[("    y[i] = acc;", "    if (i == 7) __trap();\n    y[i] = acc;")])
    record = exercise(path)
    assert record["status"] == "error" and "cudaError" in record["reason"], record


# A kernel that never returns. The loop must be one the compiler keeps: `volatile int spin = 1;
# while (spin) {}` is not (NVVM keeps a volatile local in a register, ptxas then drops the
# side-effect-free infinite loop, and the kernel finished in 2 s with correct outputs); a loop
# that reads the clock on every turn is kept (SASS: CS2R SR_CLOCKLO and a branch back).
SPIN = "    while (clock64() >= 0) {}  // 2^63 cycles: forever\n    y[i] = acc;"


def test_hang_is_killed_and_reported(tmp_path):
    path = kernel_file(tmp_path, replacements=[("    y[i] = acc;", SPIN)])
    record = exercise(path, timeout_s=3.0)
    assert record["status"] == "hang" and "within 3 s" in record["reason"], record
    assert record["wall_s"] < 120  # compilation, then 3 s of waiting


# --- compute-sanitizer -----------------------------------------------------------------------------

needs_sanitizer = pytest.mark.skipif(find_compute_sanitizer() is None, reason=WHERE_TO_GET)


@needs_sanitizer
def test_memcheck_names_the_users_line(tmp_path):
    bad = "    y[i] = acc + x[(long long)B * C * H * W + (i % 4)];"
    path = kernel_file(tmp_path, replacements=[("    y[i] = acc;", bad)])
    report = sanitize(SMALL, kernel_file=path)
    assert not report.clean and report.errors
    locations = [loc for e in report.errors for loc in e.locations if loc.file]
    assert locations and locations[0].file == str(path)
    assert locations[0].line == line_of(path, "x[(long long)B * C * H * W")
    assert "read" in report.errors[0].what.lower()


@needs_sanitizer
def test_memcheck_clean_kernel_file(tmp_path):
    report = sanitize(SMALL, kernel_file=kernel_file(tmp_path))
    assert report.clean, report.lines()


# Small layers for memcheck, the first one a variant supports is used; winograd needs a 3x3
# filter over at least 8 input channels per group, which the fourth offers; the depthwise
# variants take only the fifth (its 70 channels in two chunks of 18 lanes of 2, one partial),
# wgmma-split-bf16 only the last (1,153 terms; it runs 1,024 or more).
MEMCHECK_SHAPES = (SMALL, ConvShape(3, 1, 28, 28, 50, 5), ConvShape(2, 12, 21, 21, 24, 7),
                   ConvShape(2, 16, 10, 9, 8, 3, pad=1, groups=2, bias=True),
                   ConvShape(2, 70, 11, 9, 70, 3, stride=2, pad=1, groups=70, bias=True),
                   ConvShape(2, 128, 9, 11, 40, 3, pad=1, bias=True))


@needs_sanitizer
@pytest.mark.parametrize("variant", kernel_variants(), ids=lambda v: v.name)
def test_memcheck_is_clean_on_every_shipped_variant(variant):
    shape = next((s for s in MEMCHECK_SHAPES if variant.supports(s)), None)
    assert shape is not None, f"{variant.name} supports none of MEMCHECK_SHAPES: add one it does"
    report = sanitize(shape, variant=variant.name)
    assert report.clean, report.lines()


@needs_sanitizer
@pytest.mark.parametrize("name", ["wgmma", "wgmma-3xtf32", "wgmma-split-bf16", "wgmma-fp16",
                                  "wgmma-bf16"])
def test_memcheck_is_clean_on_the_persistent_schedule(name):
    """More tiles than the grid has blocks (1,152; on the 1,153-term layer the BF16 cross
    products need, 432): each block's loaders run from one tile into the next while its MMA
    warpgroups store the last one."""
    shape = ConvShape(16, 32, 48, 48, 160, 3, pad=1, groups=2, bias=True)
    if name == "wgmma-split-bf16":
        shape = ConvShape(16, 128, 24, 24, 160, 3, pad=1, bias=True)
    variant = VARIANTS[name]
    config = next(t for t in variant.ranked(shape) if t.schedule == "persistent")
    report = sanitize(shape, variant=name, epilogue="relu", config=config.as_dict())
    assert report.clean, report.lines()


@needs_sanitizer
@pytest.mark.parametrize("name", ["wgmma", "wgmma-fp16", "wgmma-bf16"])
def test_memcheck_is_clean_on_the_tma_gather(name):
    """The copy engine's im2col boxes: windows over the image's edges and boxes past the last
    pixel (zero-filled), more tiles than blocks, one warpgroup of MMAs and two."""
    shape = ConvShape(16, 64, 28, 26, 72, 3, pad=1, bias=True)
    variant = VARIANTS[name]
    tma = [t for t in variant.ranked(shape) if t.gather == "tma"]
    for warps in (4, 8):
        config = next(t for t in tma if t.warps_m == warps)
        report = sanitize(shape, variant=name, epilogue="relu", config=config.as_dict())
        assert report.clean, f"{config.brief()}: {report.lines()}"


@needs_sanitizer
@pytest.mark.parametrize("name", ["wgmma", "wgmma-fp16", "wgmma-bf16"])
def test_memcheck_is_clean_on_the_halo_schedule(name):
    """Patches whose edges fall outside the image (zero-filled copies), a short last row
    block, filters resident and in a ring, more tiles than blocks."""
    shape = ConvShape(16, 64, 28, 26, 72, 3, pad=1, bias=True)
    variant = VARIANTS[name]
    k = variant.kernel_shape(shape)
    halo = [t for t in variant.ranked(shape) if t.schedule == "halo" and t.rows == 3]
    for config in (next(t for t in halo if t.stages == k_tiles(k, t)),
                   next(t for t in halo if t.stages < k_tiles(k, t))):
        report = sanitize(shape, variant=name, epilogue="relu", config=config.as_dict())
        assert report.clean, f"{config.brief()}: {report.lines()}"


# --- occupancy: convlab's rule against the driver's -------------------------------------------------

@pytest.mark.parametrize("name", ["naive", "tiled", "register-tiled", "implicit-gemm"])
def test_occupancy_matches_the_driver(name):
    import cupy

    variant = VARIANTS[name]
    kernel = variant.compile(COURSE).module.get_function("conv_forward")
    arch = f"sm_{cupy.cuda.Device().compute_capability}"
    if arch not in cubin.ARCH_LIMITS:
        pytest.skip(f"no limits known for {arch}")
    compiled = nvrtc_compile(f"{name}.cu", variant.source, variant.compile_options(COURSE), arch)
    found = cubin.kernel_resources(compiled.cubin)["conv_forward"]
    resources = cubin.KernelResources("conv_forward", kernel.num_regs, found.static_shared,
                                      kernel.local_size_bytes, found.barriers, found.max_threads)
    assert kernel.shared_size_bytes - found.static_shared in (0, 1024)
    for threads, dynamic in ((128, 0), (256, 0), (128, 40 * 1024)):
        if found.max_threads and threads > found.max_threads:
            continue
        kernel.max_dynamic_shared_size_bytes = dynamic
        expected = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(
            kernel.kernel.ptr, threads, dynamic)
        mine = cubin.occupancy(resources, threads, dynamic, cubin.ARCH_LIMITS[arch])
        assert mine.blocks_per_sm == expected, (threads, dynamic, mine)


# --- deliberately broken CUDA kernels and their diagnoses -----------------------------------------

NAIVE_TAP = "k[((m * Cg + c) * K + p) * K + q]"
BROKEN = {
    "flipped filter": ("naive", [(NAIVE_TAP, "k[((m * Cg + c) * K + (K - 1 - p)) * K + (K - 1 - q)]")],
                       "flipped"),
    "off-by-one row": ("naive", [("(b * C + c0 + c) * H + h0 + p)", "(b * C + c0 + c) * H + min(h0 + p + 1, H - 1))")],
                       "shifted by one row"),
    "skipped channel": ("naive", [("for (int c = 0; c < Cg; ++c)", "for (int c = 0; c < Cg - 1; ++c)")],
                        "input channel 11"),
    "permuted output channels": ("naive", [("    y[i] = acc;",
                                            "    y[((b * M + (M - 1 - m)) * Ho + h) * Wo + w] = acc;")],
                                 "reverse order"),
    "unwritten last column": ("naive", [("    y[i] = acc;", "    if (w != Wo - 1) y[i] = acc;")],
                              "the last 1 columns"),
    "tile halo not loaded": ("tiled", [("for (int i = ty; i < X_TILE; i += TILE)",
                                        "for (int i = ty; i < TILE; i += TILE)"),
                                       ("for (int j = tx; j < X_TILE; j += TILE)",
                                        "for (int j = tx; j < TILE; j += TILE)")],
                             "-row tile"),
}


@pytest.mark.parametrize("bug", list(BROKEN))
def test_broken_kernel_gets_its_diagnosis(tmp_path, bug):
    origin, edits, expected = BROKEN[bug]
    shape = ConvShape(40, 12, 44, 44, 6, 5) if origin == "tiled" else COURSE
    variant = load_kernel_file(kernel_file(tmp_path, origin, edits)).variant
    result = lab.run_layer(shape, variant, POLICY)
    assert not result.check.passed
    assert "Diagnosis:" in result.check.reason and expected in result.check.reason, result.check.reason


# --- cheating the timer: each must FAIL, with the reason ---------------------------------------

class Wrapped(Naive):
    """Naive's real op behind a launch function that decides when to do the work."""

    def prepare(self, shape, weights, epilogue=None, bias=None):
        real = super().prepare(shape, weights, epilogue, bias)
        return Op(self.wrap(real, real.output_shape), real.output_shape, real.compile_seconds,
                  epilogue)


class FirstCallOnly(Wrapped):
    name = "test-first-call-only"

    def wrap(self, real, output_shape):
        calls = []

        def launch(x, y):
            if not calls:
                real(x, y)
            calls.append(1)
        return launch


class NewPointerOnly(Wrapped):
    name = "test-new-pointer-only"

    def wrap(self, real, output_shape):
        seen = set()

        def launch(x, y):
            if x.data.ptr not in seen:
                seen.add(x.data.ptr)
                real(x, y)
        return launch


class CachedCopy(Wrapped):
    name = "test-cached-copy"

    def wrap(self, real, output_shape):
        import cupy

        cache = {}

        def launch(x, y):
            if x.data.ptr not in cache:
                real(x, y)
                cache[x.data.ptr] = y.copy()
            cupy.copyto(y, cache[x.data.ptr])
        return launch


class OtherStream(Wrapped):
    name = "test-other-stream"

    def wrap(self, real, output_shape):
        import cupy

        stream = cupy.cuda.Stream(non_blocking=True)

        def launch(x, y):
            with stream:
                real(x, y)
        return launch


FIXED_SAMPLE = "    if (b >= 32 && h != 0 && h != Ho - 1) { y[i] = 0.0f; return; }\n"
HALF_OPERANDS = [(NAIVE_TAP, "round11(k[((m * Cg + c) * K + p) * K + q])"),
                 ("extern \"C\" __global__", "// operands rounded to fp16's 11-bit significand\n"
                  "__device__ float round11(float v) { return __uint_as_float((__float_as_uint(v) "
                  "+ 0x1000u) & 0xFFFFE000u); }\nextern \"C\" __global__", )]


def test_built_in_variants_still_pass():
    for variant in (v for v in VARIANTS.values() if v.on_gpu and v.supports(COURSE)):
        result = lab.run_layer(COURSE, variant, POLICY)
        assert result.check.passed, (variant.name, result.check.reason)


def test_the_network_run_still_passes():
    result = lab.run(lab.network_plan(get_model("ece408"), "register-tiled", 100), POLICY)
    assert all(layer.check.passed for layer in result.layers), [l.check.reason for l in result.layers]


@pytest.mark.parametrize("cheat", [FirstCallOnly, NewPointerOnly, CachedCopy], ids=lambda c: c.name)
def test_cheats_that_skip_work_fail(cheat):
    result = lab.run_layer(COURSE, cheat(), POLICY)
    assert not result.check.passed, cheat.name
    assert "Diagnosis:" in result.check.reason


def test_skipping_cheat_leaves_poison():
    result = lab.run_layer(COURSE, FirstCallOnly(), POLICY)
    assert "never written" in result.check.reason


def test_other_stream_cheat_fails_on_the_timer():
    shape = ConvShape(1000, 12, 21, 21, 24, 7)  # about a millisecond of naive work
    result = lab.run_layer(shape, OtherStream(), POLICY)
    assert not result.check.passed and result.check.reason.startswith("timer:"), result.check.reason


def test_fixed_sample_cheat_fails(tmp_path):
    # Computes images 0-31 and every image's first and last rows; writes zeros elsewhere.
    path = kernel_file(tmp_path, replacements=[("    float acc = 0.0f;\n",
                                                FIXED_SAMPLE + "    float acc = 0.0f;\n")])
    result = lab.run_layer(COURSE, load_kernel_file(path).variant, POLICY)
    assert not result.check.passed and "exactly 0" in result.check.reason, result.check.reason


def test_half_precision_while_declaring_fp32_fails(tmp_path):
    shape = ConvShape(64, 4, 20, 20, 8, 5)  # C*K*K = 100 terms: the fp32 bound sees fp16 rounding
    path = kernel_file(tmp_path, replacements=HALF_OPERANDS)
    result = lab.run_layer(shape, load_kernel_file(path).variant, POLICY)
    assert not result.check.passed and "rounding-sized" in result.check.reason, result.check.reason
    declared = path.read_text().replace("// convlab: precision = fp32", "// convlab: precision = fp16")
    honest = tmp_path / "honest.cu"
    honest.write_text(declared)
    assert lab.run_layer(shape, load_kernel_file(honest).variant, POLICY).check.passed
