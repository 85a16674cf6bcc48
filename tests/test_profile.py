"""`convlab profile` without a GPU: recorded activity data through aggregation, naming,
categories, the threshold marking, percentages, records, markdown and rendering; the tracer's
record handling with a stand-in for cupti; dependency messages; the CLI's one-line errors."""

import enum
import io
import json
import re
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from rich.console import Console

from convlab.cli import main
from convlab.errors import ConvlabError, DataError
from convlab.gpu import nvtx
from convlab.profile import tables as profile_report, trace as profile
from convlab.profile.trace import (Activity, BatchProfile, Overhead, Profile, Row, StepInfo, Trace,
                                   Window)

# Real symbols: the first is cuDNN's as the course's nvprof reports showed it; the others were
# produced by g++ for the same shapes of template PyTorch and CUTLASS launch.
CUDNN_SGEMM = ("_Z23implicit_convolve_sgemmIffLi1024ELi5ELi5ELi3ELi3ELi3ELi1ELb1ELb0ELb1EEviiiPKT_"
               "iPT0_S4_18kernel_conv_paramsyiffiS4_S4_ii")
TORCH_POOL = "_ZN2at6native21max_pool_forward_nchwIfEEviPKT_"
TORCH_TANH = "_ZN2at6native29vectorized_elementwise_kernelILi4EZNS0_16tanh_kernel_cudaEvEUlfE_EEviT0_"
CUTLASS = "_ZN7cutlass7Kernel2I42cutlass_80_simt_sgemm_128x64_8x5_nn_align1EEvNT_6ParamsE"
# An unmangled library kernel as long as cuDNN's on Hopper: longer than an 80-column table.
XMMA = ("sm90_xmma_fprop_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_"
        "warpgroupsize1x1x1_g1_execute_segment_k_off_kernel__5x_cudnn")

OURS = frozenset({"conv_forward", "pool_forward", "dense_forward", "unroll"})
STEPS = {
    "conv1": StepInfo("conv", "register-tiled conv1"),
    "tanh1+pool1": StepInfo("pool", "max-pool tanh1+pool1"),
    "conv2": StepInfo("conv", "register-tiled conv2"),
    "fc1+tanh1": StepInfo("fc", "dense fc1+tanh1"),
    "prob": StepInfo("softmax", "softmax prob"),
}
SCOPES = {1: "input copy", 2: "conv1", 3: "tanh1+pool1", 4: "conv2", 5: "fc1+tanh1", 6: "prob",
          7: "output copy"}


class Recorder:
    """Builds a trace the way the tracer fills one: API calls with correlation ids, the GPU
    work they launched, the external correlation of each call made inside a step's scope."""

    def __init__(self):
        self.trace = Trace(scopes=dict(SCOPES))
        self.corr = 0

    def api(self, name, start, ns, kind="runtime", scope=None):
        """An API call under CUPTI's name for it, as the tracer stores it."""
        self.corr += 1
        self.trace.activities.append(Activity(kind, profile.api_name(name, kind == "runtime"),
                                              start, start + ns, self.corr))
        if scope is not None:
            self.trace.external[self.corr] = scope
        return self.corr

    def launch(self, symbol, start, ns, scope, api="cuLaunchKernel", gpu_start=None):
        corr = self.api(api, start, 3_000, "driver", scope)
        begin = gpu_start if gpu_start is not None else start + 5_000
        self.trace.activities.append(Activity("kernel", symbol, begin, begin + ns, corr))

    def copy(self, direction, start, ns, nbytes, scope):
        corr = self.api("cudaMemcpy_v3020", start, ns + 8_000, "runtime", scope)
        self.trace.activities.append(
            Activity("memcpy", direction, start + 4_000, start + 4_000 + ns, corr, nbytes))

    def window(self, phase, start, end):
        self.trace.windows.append(Window(phase, start, end))


def forward_pass(rec, t0, conv1_ns=40_000):
    """One pass of a two-conv network: input copy, 5 steps, output copy (times in ns)."""
    rec.copy("HtoD", t0, 20_000, 4 * 100 * 48 * 48, 1)
    rec.launch("conv_forward", t0 + 40_000, conv1_ns, 2)
    rec.launch("pool_forward", t0 + 100_000, 8_000, 3)
    rec.launch("conv_forward", t0 + 120_000, 60_000, 4)
    rec.launch(CUTLASS, t0 + 200_000, 15_000, 5)
    rec.launch("dense_forward", t0 + 220_000, 5_000, 5)
    rec.launch("softmax_forward", t0 + 230_000, 2_000, 6)
    rec.copy("DtoH", t0 + 240_000, 3_000, 400, 7)
    rec.api("cudaStreamSynchronize_v3020", t0 + 255_000, 30_000)


def recorded_trace():
    rec = Recorder()
    rec.api("cudaMalloc_v3020", 100, 1_000_000)  # before any window: ignored
    rec.window("warm-up", 1_000_000, 9_000_000)
    rec.api("cuModuleLoadData", 1_100_000, 2_000_000, "driver")
    rec.api("cudaMalloc_v3020", 3_200_000, 400_000)
    rec.api("cudaHostAlloc_v3020", 3_700_000, 900_000)
    rec.api("cuMemAlloc_v2", 4_700_000, 100_000, "driver")
    forward_pass(rec, 5_000_000, conv1_ns=90_000)
    for i in range(3):
        start = 10_000_000 + i * 1_000_000
        rec.window("steady", start, start + 400_000)
        forward_pass(rec, start + 10_000, conv1_ns=40_000 + 10_000 * i)
    # launched inside the last pass, run on the GPU after its window closed: still that pass's
    rec.launch("conv_forward", 12_300_000, 1_000, 2, gpu_start=12_500_000)
    rec.window("teardown", 20_000_000, 21_000_000)
    rec.api("cudaFreeHost_v3020", 20_100_000, 300_000)
    rec.api("cudaFree_v3020", 20_500_000, 50_000)
    rec.trace.activities.append(Activity("memset", "", 20_600_000, 20_601_000, 0, 64))
    return rec.trace


def phases():
    return profile.aggregate(recorded_trace(), STEPS, OURS)


def by_name(rows):
    return {r.name: r for r in rows}


def sample_profile(runs=None):
    runs = runs or [BatchProfile(100, phases(), Overhead(0.31, 0.27, 3))]
    return Profile("ece408", "register-tiled", 90.0, runs,
                   {"name": "Test GPU", "compute_capability": "9.0"},
                   {"cupti-python": "13.0.1", "CUDA driver": "13.0"}, "convlab profile --batch 100",
                   "2026-11-23T12:00:00+0000", "abc1234")


# --- aggregation ---------------------------------------------------------------------------------

def test_phases_and_windows():
    p = phases()
    assert list(p) == ["warm-up", "steady", "teardown"]
    assert p["steady"].window_ns == [400_000] * 3
    assert p["warm-up"].windows == 1 and p["teardown"].wall_ns == 1_000_000


def test_steady_gpu_rows_are_named_after_the_steps():
    rows = by_name(phases()["steady"].gpu)
    conv1 = rows["register-tiled conv1"]
    # three passes at 40, 50, 60 us, and the late-running launch of the last pass
    assert conv1.calls == 4 and conv1.total_ns == 151_000
    assert conv1.min_ns == 1_000 and conv1.max_ns == 60_000 and conv1.category == "conv"
    assert rows["register-tiled conv2"].calls == 3 and rows["register-tiled conv2"].total_ns == 180_000
    assert rows["max-pool tanh1+pool1"].category == "pool"
    # a step launching two functions names each; a library kernel keeps its own name + the step
    assert rows["dense fc1+tanh1 (dense_forward)"].category == "fc"
    assert rows["cutlass::Kernel2<cutlass_80_simt_sgemm_128x64_8x5_nn_align1> [fc1+tanh1]"].calls == 3
    assert rows["softmax_forward [prob]"].category == "other"
    htod, dtoh = rows["[CUDA memcpy HtoD]"], rows["[CUDA memcpy DtoH]"]
    assert (htod.calls, htod.bytes, htod.category) == (3, 3 * 4 * 100 * 48 * 48, "htod")
    assert (dtoh.calls, dtoh.bytes, dtoh.category) == (3, 1200, "dtoh")
    assert not any(r.name.startswith("_Z") for r in phases()["steady"].gpu)


def test_rows_are_sorted_by_time():
    for phase in phases().values():
        for rows in (phase.gpu, phase.api):
            totals = [r.total_ns for r in rows]
            assert totals == sorted(totals, reverse=True)


def test_api_rows_and_categories():
    p = phases()
    warm = by_name(p["warm-up"].api)
    assert warm["cudaMalloc"].calls == 1 and warm["cudaMalloc"].total_ns == 400_000  # not the early one
    assert warm["cudaMalloc"].category == "device_alloc"
    assert warm["cudaHostAlloc"].category == "pinned" and warm["cuModuleLoadData"].category == "module"
    assert warm["cuMemAlloc_v2"].category == "device_alloc"
    steady = by_name(p["steady"].api)
    assert steady["cuLaunchKernel"].calls == 3 * 6 + 1 and steady["cuLaunchKernel"].category == "other_api"
    assert steady["cudaStreamSynchronize"].category == "sync"
    assert "cudaMalloc" not in steady and "cudaHostAlloc" not in steady
    teardown = p["teardown"]
    cats = teardown.category_ns()
    assert cats["pinned"] == 300_000 and cats["device_alloc"] == 50_000
    assert by_name(teardown.gpu)["[CUDA memset]"].bytes == 64


@pytest.mark.parametrize("name, category", [
    ("cudaMalloc", "device_alloc"), ("cudaMallocAsync", "device_alloc"), ("cudaFree", "device_alloc"),
    ("cuMemFree_v2", "device_alloc"), ("cudaMallocHost", "pinned"), ("cudaFreeHost", "pinned"),
    ("cudaHostAlloc", "pinned"), ("cuMemAllocHost_v2", "pinned"), ("cuMemFreeHost", "pinned"),
    ("cudaHostRegister", "pinned"), ("cudaDeviceSynchronize", "sync"), ("cuStreamSynchronize", "sync"),
    ("cudaEventSynchronize", "sync"), ("cuModuleLoadData", "module"), ("cuLibraryLoadData", "module"),
    ("cudaMemcpy", "other_api"), ("cudaLaunchKernel", "other_api"), ("cuLaunchKernel", "other_api"),
])
def test_api_category(name, category):
    assert profile.api_category(name) == category


def test_api_names_drop_cuptis_version_tags():
    assert profile.api_name("cudaLaunchKernel_v7000", runtime=True) == "cudaLaunchKernel"
    assert profile.api_name("cudaStreamGetCaptureInfo_v2_v11030", runtime=True) == \
        "cudaStreamGetCaptureInfo_v2"
    assert profile.api_name("cuMemAlloc_v2", runtime=False) == "cuMemAlloc_v2"


@pytest.mark.parametrize("symbol, short", [
    (CUDNN_SGEMM, "implicit_convolve_sgemm"),
    (TORCH_POOL, "at::native::max_pool_forward_nchw"),
    (TORCH_TANH, "at::native::vectorized_elementwise_kernel"),
    (CUTLASS, "cutlass::Kernel2<cutlass_80_simt_sgemm_128x64_8x5_nn_align1>"),
    (XMMA, XMMA),
    ("conv_forward", "conv_forward"),
])
def test_short_kernel_names(symbol, short):
    if symbol.startswith("_Z") and profile.demangle(symbol) == symbol:
        pytest.skip("no C++ demangler (libstdc++) on this machine")
    assert profile.short_kernel_name(symbol) == short


def test_kernel_names_for_cudnn_steps_and_collisions():
    names = profile.kernel_names(
        [(CUDNN_SGEMM, "conv1+tanh+pool"), (TORCH_TANH, "conv1+tanh+pool"),
         (TORCH_POOL, "conv1+tanh+pool"), ("conv_forward", "conv2"), ("top1", None),
         ("conv_forward", None)],
        {"conv1+tanh+pool": StepInfo("conv", "cudnn conv1+tanh+pool"),
         "conv2": StepInfo("conv", "tiled conv2")}, frozenset({"conv_forward", "top1"}))
    if profile.demangle(CUDNN_SGEMM) != CUDNN_SGEMM:
        assert names[(CUDNN_SGEMM, "conv1+tanh+pool")] == "implicit_convolve_sgemm [conv1+tanh+pool]"
    assert names[("conv_forward", "conv2")] == "tiled conv2"
    assert names[("top1", None)] == "top1" and names[("conv_forward", None)] == "conv_forward"
    pool_double = TORCH_POOL.replace("IfE", "IdE")  # the same template for double
    clash = profile.kernel_names([(TORCH_POOL, "s"), (pool_double, "s")], {}, frozenset())
    if profile.demangle(TORCH_POOL) != TORCH_POOL:
        assert sorted(clash.values()) == ["at::native::max_pool_forward_nchw [s]",
                                          "at::native::max_pool_forward_nchw [s] #2"]


def test_our_kernel_functions_come_from_the_sources():
    found = profile.kernel_functions([
        'extern "C" __global__ void conv_forward(const float* x)',
        'extern "C" __global__ void BOUNDS\nregister_conv(const float* x)',
        'extern "C" __global__ void __launch_bounds__(256)\nimplicit_gemm (int n)',
        '__global__ void not_extern_c(int n)'])
    assert found == {"conv_forward", "register_conv", "implicit_gemm"}
    assert "conv_forward" in profile.convlab_kernel_functions()


# --- marking and percentages ---------------------------------------------------------------

def table(*totals):
    return profile.sorted_rows(Row(f"k{i}", "other", 1, t, t, t) for i, t in enumerate(totals))


@pytest.mark.parametrize("totals, threshold, expected", [
    ((50, 30, 10, 10, 0), 90, [True, True, True, True, False]),  # the tie with the last is in
    ((50, 30, 10, 10, 0), 80, [True, True, False, False, False]),  # 80 reached exactly
    ((50, 30, 10, 10, 0), 81, [True, True, True, True, False]),
    ((50, 30, 10, 10, 0), 100, [True, True, True, True, False]),  # no time: never marked
    ((50, 30, 10, 10, 0), 50, [True, False, False, False, False]),
    ((50, 30, 10, 10, 0), 0.001, [True, False, False, False, False]),
    ((40, 30, 30), 50, [True, True, True]),
    ((25, 25, 25, 25), 50, [True, True, True, True]),
    ((7,), 100, [True]),
    ((0, 0), 90, [False, False]),
])
def test_threshold_marking(totals, threshold, expected):
    assert profile.marked(table(*totals), threshold) == expected


def test_threshold_100_marks_every_row_with_time():
    rows = table(*[3 * i + 1 for i in range(40)])  # no float sum of these reaches 100 exactly
    assert all(profile.marked(rows, 100))


@pytest.mark.parametrize("totals", [(1, 1, 1), (2, 1), (1, 1, 1, 1, 1, 1, 1), (999_999, 1),
                                    (123_456_789, 7, 13, 10_000_019)])
def test_percentages_add_up_to_100(totals):
    cells = profile.percent_cells(table(*totals))
    assert sum(round(float(c[:-1]) * 100) for c in cells) == 10_000
    exact = [100 * t / sum(totals) for t in sorted(totals, reverse=True)]
    assert all(abs(float(c[:-1]) - e) < 0.01 for c, e in zip(cells, exact))


def test_percentages_of_nothing():
    assert profile.percent_cells(table(0, 0)) == ["0.00%", "0.00%"]


def test_steady_percentages_add_up_to_100():
    for rows in (phases()["steady"].gpu, phases()["steady"].api):
        cells = profile.percent_cells(rows)
        assert sum(round(float(c[:-1]) * 100) for c in cells) == 10_000


@pytest.mark.parametrize("ns, text", [(0, "0ns"), (640, "640.00ns"), (29_888, "29.888us"),
                                      (1_234_567, "1.2346ms"), (999_999, "1.0000ms"),
                                      (12_345_678_900, "12.346s"), (999.996, "1.0000us")])
def test_nvprof_time_cells(ns, text):
    assert profile_report.fmt_time(ns) == text


# --- records ---------------------------------------------------------------------------------

def test_json_round_trip(tmp_path):
    record = sample_profile().as_dict()
    assert record["kind"] == "profile" and record["schema_version"] == profile.SCHEMA_VERSION
    again = Profile.from_dict(json.loads(json.dumps(record))).as_dict()
    assert again == record
    json_path, md_path = profile.save(record, tmp_path / "out", profile_report.markdown(record))
    assert json_path.name.startswith("profile-ece408-register-tiled-b100-")
    assert profile.load_record(json_path) == record
    assert md_path.read_text().startswith("# convlab profile: ece408, kernel register-tiled")
    assert not list((tmp_path / "out").glob(".*.tmp"))


def test_load_record_refuses_other_files(tmp_path):
    compare_record = tmp_path / "compare.json"
    compare_record.write_text(json.dumps({"schema_version": 1, "rows": []}))
    with pytest.raises(DataError, match="not a convlab profile record"):
        profile.load_record(compare_record)
    newer = tmp_path / "newer.json"
    newer.write_text(json.dumps({**sample_profile().as_dict(), "schema_version": 99}))
    with pytest.raises(DataError, match="schema version 99"):
        profile.load_record(newer)
    broken = tmp_path / "broken.json"
    record = sample_profile().as_dict()
    del record["runs"][0]["phases"]["steady"]["gpu"][0]["calls"]
    broken.write_text(json.dumps(record))
    with pytest.raises(DataError, match="malformed profile record"):
        profile.load_record(broken)
    with pytest.raises(DataError, match="no such file"):
        profile.load_record(tmp_path / "missing.json")


def test_markdown_lists_every_row_and_marks_the_threshold():
    record = sample_profile().as_dict()
    md = profile_report.markdown(record)
    steady = phases()["steady"]
    for row in steady.gpu + steady.api:
        assert row.name.replace("|", "\\|") in md
    top = steady.gpu[0].name
    assert f"**`{top}`**" in md and "| \\*" in md
    assert "| Time(%) | Time | Calls | Avg | Min | Max | Name |" in md
    assert "profiler overhead: 0.310 ms per forward pass traced vs 0.270 ms untraced: x1.15" in md


def test_markdown_breakdown_with_several_batches():
    runs = [BatchProfile(b, phases(), Overhead(0.3, 0.25, 3)) for b in (10, 100)]
    md = profile_report.markdown(sample_profile(runs).as_dict())
    assert "## ms per forward pass, steady state" in md
    assert re.search(r"^\| 10 \| ", md, re.M) and re.search(r"^\| 100 \| ", md, re.M)


# --- rendering -----------------------------------------------------------------------------

def rendered(record, width, wide=False):
    console = Console(width=width, file=io.StringIO(), color_system=None, legacy_windows=False)
    profile_report.render(record, console, wide)
    return console.file.getvalue()


def squeezed(text):
    """The output without box drawing and spaces: a cell folded onto continuation lines reads
    whole again, since the other cells of those lines are empty."""
    return re.sub(r"[\s│┃┡┩━─┏┓┗┛┣┫╇╈┳┻┬┴┼└┘┌┐╍╌═╭╮╯╰|]", "", text)


def wide_trace_profile():
    p = phases()
    p["steady"].gpu.append(Row(f"{XMMA} [conv1]", "conv", 3, 9_000, 2_000, 4_000))
    p["steady"].gpu = profile.sorted_rows(p["steady"].gpu)
    runs = [BatchProfile(b, p, Overhead(0.3, 0.25, 3)) for b in (10, 100, 10000)]
    return sample_profile(runs)


@pytest.mark.parametrize("width", [80, 200])
def test_render_keeps_every_name_and_number_whole(width):
    record = wide_trace_profile().as_dict()
    text = rendered(record, width)
    assert max(len(line) for line in text.splitlines()) <= width
    whole = squeezed(text)
    steady = Profile.from_dict(record).runs[0].phases["steady"]
    for rows in (steady.gpu, steady.api):
        for cells in profile_report.activity_cells(rows, 90):
            for cell in cells[:4]:  # Time(%), Time, Calls, Avg: the key columns
                assert re.search(rf"(?<![\d.]){re.escape(str(cell).strip())}(?![\d.])", text), cell
            name = cells[6].plain
            if len(name) <= 30:
                assert name in text  # short names are never folded
            assert squeezed(name) in whole
    if width == 200:
        for row in steady.gpu + steady.api:
            assert row.name in text
        assert "Min" in text and "Max" in text


def test_render_marks_rows_and_notes_the_threshold():
    text = rendered(sample_profile().as_dict(), 120)
    top = phases()["steady"].gpu[0]
    line = next(line for line in text.splitlines() if top.name in line)
    assert "*" in line
    assert "* the rows that together make up 90% of the time" in text
    assert "3 forward passes" in text and "profiler overhead" in text


def test_render_batch_breakdown_fits_80_columns():
    text = rendered(wide_trace_profile().as_dict(), 80)
    assert "ms per forward pass, steady state" in text and "ms once per batch size" in text
    for batch in ("10", "100", "10000"):
        assert re.search(rf"^\s*{batch}\s+\d", text, re.M)
    steady = phases()["steady"]
    assert profile_report.fmt_ms(steady.wall_ns / 3) in text


def test_warm_up_tables_show_the_marked_rows():
    text = rendered(sample_profile().as_dict(), 200)
    assert "warm-up API calls" in text and "cuModuleLoadData" in text
    assert re.search(r"\d+ more rows? below that not shown", text)


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = profile_report.plot(wide_trace_profile().as_dict(), tmp_path / "sweep.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- ncu -------------------------------------------------------------------------------------

def test_ncu_skip_counts_launches_of_the_function_before_the_layer():
    rec = Recorder()
    rec.window("steady", 0, 10_000_000)
    forward_pass(rec, 1_000)
    targets = profile.ncu_targets(rec.trace, STEPS, OURS, "conv2", "ece408", "register-tiled", 100)
    assert len(targets) == 1
    t = targets[0]
    assert (t.step, t.name, t.symbol, t.skip, t.ours) == (
        "conv2", "register-tiled conv2", "conv_forward", 1, True)
    assert t.command == ("ncu --kernel-name-base mangled --kernel-name 'regex:^conv_forward$' "
                         "--launch-skip 1 --launch-count 1 --set full -o "
                         "convlab-ece408-register-tiled-b100-conv2 convlab run --model ece408 "
                         "--kernel register-tiled --batch 100")
    fused = profile.ncu_targets(rec.trace, STEPS, OURS, "pool1", "ece408", "register-tiled", 100)
    assert [(t.step, t.skip) for t in fused] == [("tanh1+pool1", 0)]
    fc = profile.ncu_targets(rec.trace, STEPS, OURS, "fc1", "ece408", "register-tiled", 100)
    assert [t.symbol for t in fc] == [CUTLASS, "dense_forward"]
    assert "regex:^_ZN7cutlass7Kernel2I42cutlass_80_simt_sgemm_128x64_8x5_nn_align1EEvNT_6ParamsE$" \
        in fc[0].command
    lines = profile_report.ncu_lines(fc)
    assert any("library kernel" in line for line in lines)


def test_ncu_unknown_layer_lists_the_steps():
    with pytest.raises(ConvlabError, match="no layer 'conv9'.*conv1, tanh1\\+pool1"):
        profile.match_step(list(STEPS), "conv9")


# --- the tracer's record handling, with a stand-in for cupti ------------------------------------

class Kind(enum.IntEnum):
    CONCURRENT_KERNEL = 10
    MEMCPY = 1
    MEMSET = 2
    RUNTIME = 3
    DRIVER = 4
    EXTERNAL_CORRELATION = 5


class CopyKind(enum.IntEnum):
    HTOD = 1
    DTOH = 2
    DTOD = 8
    HTOH = 9
    PTOP = 10
    ATOA = 5


class FakeCupti:
    ActivityKind = Kind
    ActivityMemcpyKind = CopyKind
    ExternalCorrelationKind = SimpleNamespace(CUSTOM0=3, CUSTOM1=4, CUSTOM2=5)
    CallbackDomain = SimpleNamespace(DRIVER_API=1, RUNTIME_API=2)
    ActivityFlag = SimpleNamespace(FLUSH_FORCED=1)
    cuptiError = RuntimeError

    def __init__(self):
        self.calls = []
        self.enabled = set()
        self.clock = 0

    def activity_register_callbacks(self, requested, completed):
        self.calls.append("register")
        self.completed = completed
        assert requested() == (profile.BUFFER_BYTES, 0)

    def activity_enable(self, kind):
        self.enabled.add(kind)

    def activity_disable(self, kind):
        self.enabled.discard(kind)

    def activity_flush_all(self, flag):
        self.calls.append(("flush", flag))

    def activity_push_external_correlation_id(self, kind, scope):
        self.calls.append(("push", kind, scope))

    def activity_pop_external_correlation_id(self, kind):
        self.calls.append(("pop", kind))

    def get_timestamp(self):
        self.clock += 1000
        return self.clock

    def get_callback_name(self, domain, cbid):
        names = {(2, 211): "cudaLaunchKernel_v7000", (1, 307): "cuLaunchKernel"}
        if (domain, cbid) not in names:
            raise RuntimeError("CUPTI_ERROR_INVALID_PARAMETER")
        return names[(domain, cbid)]


class FakeCupy:
    cuda = SimpleNamespace(Device=lambda: SimpleNamespace(synchronize=lambda: None))


@pytest.fixture
def tracer(monkeypatch):
    monkeypatch.setattr(profile.Tracer, "_registered", False)
    fake = FakeCupti()
    return profile.Tracer(fake, FakeCupy()).start(), fake


def test_tracer_copies_records_out_of_cuptis_buffer(tracer):
    t, fake = tracer
    assert fake.enabled == set(t.kinds) and fake.calls == ["register"]
    with t.window("steady"):
        with t.annotate("conv1"):
            pass
    record = SimpleNamespace
    fake.completed([
        record(kind=Kind.CONCURRENT_KERNEL, name="conv_forward", start=100, end=400, correlation_id=7),
        record(kind=Kind.MEMCPY, copy_kind=CopyKind.HTOD, bytes=4096, start=10, end=60, correlation_id=6),
        record(kind=Kind.MEMCPY, copy_kind=CopyKind.ATOA, bytes=16, start=10, end=20, correlation_id=9),
        record(kind=Kind.MEMSET, bytes=64, start=1, end=2, correlation_id=8),
        record(kind=Kind.RUNTIME, cbid=211, start=50, end=90, correlation_id=7),
        record(kind=Kind.DRIVER, cbid=307, start=5, end=9, correlation_id=6),
        record(kind=Kind.DRIVER, cbid=9999, start=5, end=9, correlation_id=5),
        record(kind=Kind.EXTERNAL_CORRELATION, external_kind=5, external_id=1, correlation_id=7),
        record(kind=Kind.EXTERNAL_CORRELATION, external_kind=3, external_id=42, correlation_id=6),
    ])
    trace = t.stop()
    assert ("flush", 1) in fake.calls and not fake.enabled
    assert ("push", 5, 1) in fake.calls and ("pop", 5) in fake.calls
    kinds = [(a.kind, a.name, a.duration, a.bytes) for a in trace.activities]
    assert kinds == [("kernel", "conv_forward", 300, 0), ("memcpy", "HtoD", 50, 4096),
                     ("memcpy", "ATOA", 10, 16), ("memset", "", 1, 64),
                     ("runtime", "cudaLaunchKernel", 40, 0), ("driver", "cuLaunchKernel", 4, 0),
                     ("driver", "driver call 9999", 4, 0)]
    assert trace.external == {7: 1}  # PyTorch's CUSTOM0 ids are not ours
    assert trace.scopes == {1: "conv1"} and trace.label_of(trace.activities[0]) == "conv1"
    assert [(w.phase, w.duration) for w in trace.windows] == [("steady", 1000)]


def test_tracer_pauses_for_the_untraced_passes(tracer):
    t, fake = tracer
    with t.paused():
        assert not fake.enabled
    assert fake.enabled == set(t.kinds)
    t.stop()


def test_callbacks_are_registered_once_per_process(tracer):
    t, fake = tracer
    t.stop()
    profile.Tracer(fake, FakeCupy()).start().stop()
    assert fake.calls.count("register") == 1


# --- nvtx -------------------------------------------------------------------------------------

def test_nvtx_is_a_no_op_without_the_package(monkeypatch):
    monkeypatch.setattr(nvtx, "_module", None)
    monkeypatch.setattr(nvtx, "_looked", True)
    assert not nvtx.available()
    with nvtx.annotate("conv1"):
        pass


def test_nvtx_ranges_with_the_package(monkeypatch):
    opened = []

    class Range:
        def __init__(self, message, domain):
            self.message, self.domain = message, domain

        def __enter__(self):
            opened.append((self.message, self.domain))

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(nvtx, "_module", SimpleNamespace(annotate=Range))
    monkeypatch.setattr(nvtx, "_looked", True)
    with nvtx.annotate("conv1"):
        pass
    assert nvtx.available() and opened == [("conv1", "convlab")]


# --- dependencies -------------------------------------------------------------------------------

def test_install_line_for_a_cuda_13_0_driver():
    message = profile.version_problem((13, 0), None, None)
    assert message.endswith('pip install "cupti-python==13.0.*" "nvidia-cuda-cupti==13.0.*"')
    assert "\n" not in message


@pytest.mark.parametrize("driver, cupti, library, wrong", [
    ((13, 0), "13.2.0", "13.0.85", "cupti-python 13.2.0"),
    ((13, 0), "12.8.0", None, "cupti-python 12.8.0"),
    ((13, 0), "13.0.1", "13.2.51", "nvidia-cuda-cupti 13.2.51"),
    ((12, 9), "13.0.1", None, "cupti-python 13.0.1"),
    ((12, 8), "12.8.0", "12.9.79", "nvidia-cuda-cupti-cu12 12.9.79"),
])
def test_mismatched_versions_say_what_to_install(driver, cupti, library, wrong):
    message = profile.version_problem(driver, cupti, library)
    assert message.startswith(f"{wrong} does not match the CUDA {driver[0]}.{driver[1]} driver")
    assert message.endswith(profile.install_command(driver)) and "\n" not in message


@pytest.mark.parametrize("driver, cupti, library", [
    ((13, 0), "13.0.1", "13.0.85"), ((13, 2), "13.0.1", "13.0.85"), ((12, 9), "12.8.0", "12.9.79"),
    ((12, 6), "12.6.0", None)])
def test_matching_versions(driver, cupti, library):
    assert profile.version_problem(driver, cupti, library) is None


def test_install_lines_for_other_drivers():
    assert profile.install_command((12, 9)) == \
        'pip install "cupti-python>=12.0,<12.10" "nvidia-cuda-cupti-cu12>=12.0,<12.10"'
    assert profile.install_command((13, 2)) == \
        'pip install "cupti-python>=13.0,<13.3" "nvidia-cuda-cupti>=13.0,<13.3"'
    assert "12.6 or newer; this one is 12.4" in profile.version_problem((12, 4), None, None)


# --- the CLI without a GPU -------------------------------------------------------------------

def profile_cli(*args):
    result = CliRunner().invoke(main, ["profile", *args])
    assert "Traceback" not in result.output
    return result


def test_without_a_gpu_one_line(no_gpu):
    result = profile_cli("--model", "ece408", "--batch", "10")
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert lines == ["Error: convlab profile traces GPU work and needs a CUDA GPU: CuPy is not "
                     "installed (test)"]


def test_ncu_without_a_gpu_one_line(no_gpu):
    result = profile_cli("--ncu", "--ncu-layer", "conv1", "--batch", "10")
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1
    assert "needs a CUDA GPU" in result.output


@pytest.mark.parametrize("args, message", [
    (("--kernel", "cpu"), "kernel 'cpu' runs on the CPU"),
    (("--ncu",), "--ncu needs --ncu-layer"),
    (("--ncu-layer", "conv1"), "--ncu-layer goes with --ncu"),
    (("--ncu", "--ncu-layer", "conv1", "--batch", "10,100"), "give one --batch size"),
    (("--batch", "0"), "batch must be between 1 and"),
    (("--model", "lenet"), "lenet"),
    (("--kernel", "nope"), "unknown kernel 'nope'"),
])
def test_bad_requests_end_in_one_line(no_gpu, args, message):
    result = profile_cli(*args)
    assert result.exit_code != 0 and message in result.output
    assert len(result.output.strip().splitlines()) == 1
    for option in re.findall(r"--[a-z-]+", result.output):
        assert option in ("--kernel", "--ncu", "--ncu-layer", "--batch", "--model")


def test_threshold_range_is_checked():
    for value in ("0", "101"):
        result = profile_cli("--threshold", value)
        assert result.exit_code == 1 and "Invalid value for '--threshold'" in result.output


def test_a_cupti_that_refuses_to_trace_says_so(monkeypatch):
    monkeypatch.setattr(profile.Tracer, "_registered", False)
    fake = FakeCupti()

    def refuse(kind):
        raise RuntimeError("CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED")

    fake.activity_enable = refuse
    with pytest.raises(ConvlabError, match="CUPTI cannot trace this process"):
        profile.Tracer(fake, FakeCupy()).start()
    assert profile.Tracer._current is None
