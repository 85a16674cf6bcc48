"""`convlab profile` on a GPU: a known workload traces to exactly its records, with times that
agree with CUDA events; real profiles of ece408 name our kernels (and cuDNN's); --ncu finds the
launch. Needs cupti-python matching the driver (skipped with the install line otherwise)."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from convlab.bench import lab
from convlab.cli import main
from convlab.errors import ConvlabError
from convlab.kernels import get_variant
from convlab.models import get_model
from convlab.profile import trace as profile
from convlab.profile.trace import StepInfo

pytestmark = pytest.mark.gpu

PROBE_SOURCE = r"""
extern "C" __global__ void convlab_profile_probe(float* out, const float* seed, int iters)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = seed[i];
    for (int k = 0; k < iters; ++k) v = v * 0.9999f + 0.5f;  // a dependent chain: known work
    out[i] = v;
}
"""
PROBE_ITERS = 300_000  # about a millisecond per launch on an H100: overhead-sized errors show
LAUNCHES = 5
COPY_FLOATS = 1 << 20


@pytest.fixture(scope="module")
def cupti():
    cupy = profile.require_gpu()
    try:
        return profile.load_cupti(cupy), cupy
    except ConvlabError as exc:
        pytest.skip(str(exc))


def pinned(cupy, values):
    mem = cupy.cuda.alloc_pinned_memory(values.nbytes)
    host = np.frombuffer(mem, dtype=values.dtype, count=values.size)
    host[...] = values
    return host


def test_known_workload_has_exactly_those_records(cupti, rng):
    module, cupy = cupti
    kernel = cupy.RawKernel(PROBE_SOURCE, "convlab_profile_probe")
    seed = cupy.asarray(rng.standard_normal(64 * 256, dtype=np.float32))
    out = cupy.full(64 * 256, np.nan, dtype=cupy.float32)
    host = pinned(cupy, rng.standard_normal(COPY_FLOATS, dtype=np.float32))
    dev = cupy.full(COPY_FLOATS, np.nan, dtype=cupy.float32)
    kernel((64,), (256,), (out, seed, np.int32(PROBE_ITERS)))  # module load stays out of the trace
    cupy.cuda.Device().synchronize()

    marks = []
    tracer = profile.Tracer(module, cupy).start()
    try:
        with tracer.window("steady"):
            # A kernel ahead of the probes keeps the GPU busy while the host enqueues them: the
            # events then bracket GPU time only, not the host's (traced, slower) launch path,
            # which an idle GPU would wait out between a start event and its kernel.
            with tracer.annotate("lead"):
                kernel((64,), (256,), (out, seed, np.int32(PROBE_ITERS)))
            with tracer.annotate("probe"):
                for _ in range(LAUNCHES):
                    start, end = cupy.cuda.Event(), cupy.cuda.Event()
                    start.record()
                    kernel((64,), (256,), (out, seed, np.int32(PROBE_ITERS)))
                    end.record()
                    marks.append((start, end))
                start, end = cupy.cuda.Event(), cupy.cuda.Event()
                start.record()
                dev.set(host)
                end.record()
                copy_mark = (start, end)
    finally:
        trace = tracer.stop()
    assert np.array_equal(cupy.asnumpy(dev), host) and not cupy.isnan(out).any()

    every = sorted((a for a in trace.activities if a.kind == "kernel"), key=lambda a: a.start)
    assert [trace.label_of(a) for a in every] == ["lead"] + ["probe"] * LAUNCHES
    kernels = every[1:]
    copies = [a for a in trace.activities if a.kind == "memcpy"]
    assert [a.name for a in kernels] == ["convlab_profile_probe"] * LAUNCHES
    assert [(a.name, a.bytes) for a in copies] == [("HtoD", host.nbytes)]
    assert not [a for a in trace.activities if a.kind == "memset"]
    assert {trace.label_of(a) for a in copies} == {"probe"}

    # CUDA events bracket each launch, so they read at least the kernel's own time plus the
    # launch gaps between event and kernel; the profiler's overhead is a few microseconds.
    for a, (start, end) in zip(kernels + copies, marks + [copy_mark]):
        event_ms = cupy.cuda.get_elapsed_time(start, end)
        cupti_ms = a.duration / 1e6
        assert cupti_ms <= event_ms + 0.002, (cupti_ms, event_ms)
        assert event_ms - cupti_ms <= 0.05 * event_ms + 0.02, (cupti_ms, event_ms)

    phases = profile.aggregate(trace, {"probe": StepInfo("conv", "probe kernel"),
                                       "lead": StepInfo("other", "lead kernel")},
                               profile.kernel_functions([PROBE_SOURCE]))
    rows = {r.name: r for r in phases["steady"].gpu}
    assert set(rows) == {"probe kernel", "lead kernel", "[CUDA memcpy HtoD]"}
    assert rows["probe kernel"].calls == LAUNCHES and rows["probe kernel"].category == "conv"
    assert rows["[CUDA memcpy HtoD]"].calls == 1 and rows["[CUDA memcpy HtoD]"].bytes == host.nbytes
    for group in (phases["steady"].gpu, phases["steady"].api):
        assert sum(round(float(c[:-1]) * 100) for c in profile.percent_cells(group)) == 10_000
    api = {r.name for r in phases["steady"].api}
    assert "cuLaunchKernel" in api or "cudaLaunchKernel" in api


def profile_cli(*args):
    result = CliRunner().invoke(main, ["profile", *args], terminal_width=200)
    assert "Traceback" not in result.output, result.output
    assert result.exit_code == 0, result.output
    return result


def test_profile_names_our_kernels(cupti):
    result = profile_cli("--model", "ece408", "--batch", "10", "--kernel", "tiled")
    network = lab.build_network(get_model("ece408"), "tiled", 10)
    for step in network.steps:
        if step.is_conv:
            assert step.kernel_label in result.output
    assert "GPU activities" in result.output and "API calls" in result.output
    assert "[CUDA memcpy HtoD]" in result.output and "[CUDA memcpy DtoH]" in result.output
    assert "profiler overhead" in result.output and "_Z" not in result.output


def test_profile_record(cupti, tmp_path):
    result = profile_cli("--model", "ece408", "--batch", "10,100", "--kernel", "tiled",
                         "--passes", "4", "--json", "--save", str(tmp_path))
    record = json.loads(result.stdout)
    assert record["kind"] == "profile" and record["batches"] == [10, 100]
    assert record["versions"]["cupti-python"] and record["device"]["name"]
    for run in profile.Profile.from_dict(record).runs:
        assert run.passes == 4 and set(run.phases) == {"warm-up", "steady", "teardown"}
        steady = run.phases["steady"]
        for group in (steady.gpu, steady.api):
            assert sum(round(float(c[:-1]) * 100) for c in profile.percent_cells(group)) == 10_000
        cats = steady.category_ns()
        assert cats["conv"] > 0 and cats["htod"] > 0 and cats["dtoh"] > 0
        # buffers are allocated once, when the network is built: never in a forward pass
        assert cats["device_alloc"] == 0 and cats["pinned"] == 0
        assert 0.5 < run.overhead.ratio < 20
        rows = {r.name: r for r in steady.gpu}
        assert rows["[CUDA memcpy HtoD]"].bytes == 4 * run.batch * 48 * 48 * run.passes
    saved = sorted(tmp_path.glob("profile-ece408-tiled-b10_100-*.json"))
    assert len(saved) == 1 and profile.load_record(saved[0])["runs"] == record["runs"]


def test_profile_with_cudnn_names_cudnns_kernels(cupti):
    shape = next(iter(get_model("ece408").conv_shapes(10).values()))
    support = get_variant("cudnn").supports(shape)
    if not support:
        pytest.skip(support.reason)
    record = json.loads(profile_cli("--model", "ece408", "--batch", "10", "--kernel", "cudnn",
                                    "--passes", "3", "--json").stdout)
    steady = profile.Profile.from_dict(record).runs[0].phases["steady"]
    conv = [r for r in steady.gpu if r.category == "conv"]
    assert conv and all(not r.name.startswith("cudnn ") for r in conv)
    assert all(r.name.endswith("]") and "[conv" in r.name for r in conv)


def test_ncu_command_for_the_second_conv_layer(cupti):
    result = profile_cli("--ncu", "--model", "ece408", "--kernel", "tiled", "--batch", "10",
                         "--ncu-layer", "conv2")
    assert "ncu --kernel-name-base mangled --kernel-name 'regex:^conv_forward$' --launch-skip 1 " \
           "--launch-count 1" in result.output
    assert "convlab run --model ece408 --kernel tiled --batch 10" in result.output
