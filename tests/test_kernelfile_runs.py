"""`convlab run --kernel-file` and `convlab compare --kernel-file` without a GPU: the isolated
path end to end with a kernel file that computes on the CPU (a Variant subclassing the cpu
variant), and what the parent makes of a fault, a hang, a compile error or a file that changed,
with stub jobs standing in for the GPU ones; `--verify` reaching the check; `run --sanitize`."""

import json
import re
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from convlab import gpu
from convlab.bench import compare, filejobs, guard, lab, records
from convlab.cli import main
from convlab.errors import ConvlabError
from convlab.gpu import hardware, peaks, timer
from convlab.gpu.cubin import code_sections
from convlab.gpu.jit import compile_cubin
from convlab.kernels import VARIANTS
from convlab.kernels.igemm.wgmma import MAINLOOP_STEP
from convlab.models import DEFAULT_MODEL, get_model
from convlab.net.plan import plan_network
from convlab.shapes import ConvShape
from convlab.userkernel import sanitize as sanitize_mod
from convlab.userkernel.check import check_file
from convlab.userkernel.kernelfile import load_kernel_file
from convlab.userkernel.scaffold import scaffold

pytestmark = pytest.mark.usefixtures("private_cache")

POLICY = timer.TimingPolicy(warmup=1, min_runs=3, max_runs=5, budget_s=0.1)

CPU_KERNEL = textwrap.dedent('''\
    """The cpu variant as a kernel file: one that runs without a GPU."""
    from convlab.kernels.cpu import Cpu


    class MyCpu(Cpu):
        name = "mycpu"
        summary = "NumPy, from a kernel file"
    ''')

STUBS = textwrap.dedent('''\
    import time

    from convlab.bench.compare import Row
    from convlab.errors import KernelCompileError
    from convlab.gpu.isolate import gpu_wait
    from convlab.shapes import ConvShape
    from convlab.userkernel.kernelfile import load_kernel_file

    COMPILE_LOG = ('/tmp/tmpq1w2/5b0c7e1d9a.cubin.cu(12): error: identifier "acc2" is '
                   'undefined')


    def faults(**args):
        raise RuntimeError("cudaErrorIllegalAddress: an illegal memory access was encountered")


    def hangs(**args):
        with gpu_wait():
            time.sleep(60)


    def does_not_compile(**args):
        raise KernelCompileError("mine", COMPILE_LOG, ("-lineinfo",))


    def other_file(**args):
        return {"sha256": "0" * 64, "rows": [], "run": {}}


    def compile_error_rows(kernel_file, batch, shapes, **args):
        reason = "kernel 'mine' failed to compile\\n" + COMPILE_LOG
        rows = [Row(variant="mine", precision="fp32", batch=batch, layer=name, label=name,
                    shape=ConvShape(**shape), status="FAIL", reason=reason)
                for name, shape in shapes.items()]
        return {"sha256": load_kernel_file(kernel_file).sha256,
                "rows": [row.as_dict() for row in rows]}
    ''')


@pytest.fixture
def cpu_kernel(tmp_path):
    path = tmp_path / "mycpu.py"
    path.write_text(CPU_KERNEL)
    return path


@pytest.fixture
def mine_cu(tmp_path):
    return scaffold("mine", "naive", tmp_path).files[0]


@pytest.fixture
def stubs(tmp_path, monkeypatch):
    (tmp_path / "stub_jobs.py").write_text(STUBS)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path) + ":" + ":".join(sys.path))
    return "stub_jobs"


@pytest.fixture
def as_if_gpu(monkeypatch):
    """The parent's GPU check passes (the jobs it starts are stubs that need none)."""
    monkeypatch.setattr(gpu, "_probe", lambda: (object(), ""))


def invoke(*args):
    result = CliRunner().invoke(main, [str(a) for a in args], terminal_width=200,
                                env={"COLUMNS": "200"})
    assert "Traceback" not in result.output, result.output
    return result


# --- run --kernel-file ------------------------------------------------------------------------

def test_run_kernel_file_prints_what_a_built_in_run_prints(cpu_kernel):
    mine = invoke("run", "--kernel-file", cpu_kernel, "--model", "ece408", "--batch", "10")
    builtin = invoke("run", "--kernel", "cpu", "--model", "ece408", "--batch", "10")
    assert mine.exit_code == 0 and builtin.exit_code == 0, mine.output
    lines = mine.output.splitlines()
    assert lines[0] == f"Running {cpu_kernel} at batch 10 in a child process..."
    assert [line.startswith("Op Time: ") for line in lines[1:3]] == [True, True]
    correctness = [line for line in builtin.output.splitlines() if line.startswith("Correctness: ")]
    assert lines[3] == correctness[0]
    assert "kernel 'mycpu'" in mine.output and "PASS" in mine.output
    assert "ran in a child process" in mine.output


def test_run_kernel_file_record_stores_the_files_hash_and_text(cpu_kernel):
    result = invoke("run", "--kernel-file", cpu_kernel, "--model", "ece408", "--batch", "10", "--json")
    assert result.exit_code == 0, result.output
    record = json.loads(result.output)
    assert record["passed"] and record["kernel"] == "mycpu"
    assert [layer["name"] for layer in record["layers"]] == ["conv1", "conv2"]
    stored = record["kernel_file"]
    assert stored["sha256"] == load_kernel_file(cpu_kernel).sha256
    assert stored["files"] == [{"path": str(cpu_kernel), "sha256": stored["files"][0]["sha256"],
                                "text": CPU_KERNEL}]


def test_run_result_crosses_a_process_whole(cpu_kernel):
    result = lab.run(lab.network_plan(get_model("ece408"), "cpu", 10), POLICY)
    again = records.RunResult.from_dict(json.loads(json.dumps(result.as_dict())))
    assert again.as_dict() == result.as_dict()


def test_each_batch_fails_alone_with_the_cuda_error(stubs, as_if_gpu, mine_cu, monkeypatch):
    monkeypatch.setattr(lab, "RUN_JOB", f"{stubs}:faults")
    result = invoke("run", "--kernel-file", mine_cu, "--batch", "10,20")
    assert result.exit_code == 1
    for batch in (10, 20):
        assert (f"FAIL batch {batch}: RuntimeError: cudaErrorIllegalAddress: an illegal memory "
                "access was encountered") in result.output
    records = json.loads(invoke("run", "--kernel-file", mine_cu, "--batch", "10,20", "--json").output)
    assert [(r["batch"], r["passed"], r["status"]) for r in records] == [(10, False, "error"),
                                                                         (20, False, "error")]
    assert records[0]["kernel_file"]["sha256"] == load_kernel_file(mine_cu).sha256


def test_a_hang_is_killed_after_the_timeout(stubs, as_if_gpu, mine_cu, monkeypatch):
    monkeypatch.setattr(lab, "RUN_JOB", f"{stubs}:hangs")
    result = invoke("run", "--kernel-file", mine_cu, "--batch", "10", "--timeout", "1")
    assert result.exit_code == 1
    assert "FAIL batch 10: hang: a device wait did not finish within 1 s" in result.output


def test_a_compile_error_is_an_error_at_the_users_line(stubs, as_if_gpu, mine_cu, monkeypatch):
    monkeypatch.setattr(lab, "RUN_JOB", f"{stubs}:does_not_compile")
    result = invoke("run", "--kernel-file", mine_cu, "--batch", "10")
    assert result.exit_code == 1 and "FAIL" not in result.output
    assert f'{mine_cu}:12: error: identifier "acc2" is undefined' in result.output


def test_compiler_messages_are_located_in_the_users_file(mine_cu, tmp_path):
    log = ("kernel 'mine' failed to compile (NVRTC options: -lineinfo)\n"
           "/tmp/tmp1/9f3e.cubin.cu(7): error: expected a \";\"\n"
           "/tmp/tmp2/kern.cu(8): warning #177-D: variable \"t\" was declared but never referenced\n"
           "default_program(9): error: identifier \"acc2\" is undefined\n"
           "/usr/include/cuda_fp16.hpp(10): note: declared here")
    assert load_kernel_file(mine_cu).locate(log).splitlines()[1:] == [
        f'{mine_cu}:7: error: expected a ";"',
        f'{mine_cu}:8: warning #177-D: variable "t" was declared but never referenced',
        f'{mine_cu}:9: error: identifier "acc2" is undefined',
        "/usr/include/cuda_fp16.hpp(10): note: declared here"]
    inline = tmp_path / "inline.py"
    inline.write_text(textwrap.dedent('''\
        from convlab.kernels.naive import Naive


        class Inline(Naive):
            name = "inline"
            source = """
        extern "C" __global__ void conv_forward() {}
        """
        '''))
    # the source's line 2 (after its leading newline) is line 7 of inline.py
    assert load_kernel_file(inline).locate("/t/x.cubin.cu(2): error") == f"{inline}:7: error"


def test_a_file_changed_under_the_run_fails(stubs, as_if_gpu, mine_cu, monkeypatch):
    monkeypatch.setattr(lab, "RUN_JOB", f"{stubs}:other_file")
    result = invoke("run", "--kernel-file", mine_cu, "--batch", "10")
    assert result.exit_code == 1 and "changed while convlab ran it" in result.output


def test_what_needs_no_gpu_is_checked_before_a_child_starts(tmp_path, as_if_gpu):
    text = scaffold("small", "naive", tmp_path).files[0].read_text()
    path = tmp_path / "small.cu"
    path.write_text(text.replace("// convlab: precision", "// convlab: requires = K <= 5\n"
                                                          "// convlab: precision"))
    result = invoke("run", "--kernel-file", path, "--model", "ece408", "--batch", "10")
    assert result.exit_code == 1
    assert "kernel 'small' does not support conv1" in result.output and "requires K <= 5" in result.output


# --- --verify reaches the check --------------------------------------------------------------

@pytest.fixture
def verify_modes(monkeypatch):
    modes = []
    real = guard.verify_output

    def spy(layer, x, out, mode="sample", rng=None, sample=None):
        modes.append(mode)
        return real(layer, x, out, mode, rng, sample)

    monkeypatch.setattr(guard, "verify_output", spy)
    return modes


def test_verify_full_reaches_every_conv_check(verify_modes, cpu_kernel):
    plan = lab.network_plan(get_model("ece408"), "cpu", 10)
    assert lab.run(plan, POLICY, verify="full").passed
    assert lab.run_layer(ConvShape(3, 2, 9, 9, 4, 3), "cpu", POLICY, verify="full").check.passed
    assert filejobs.run_model(str(cpu_kernel), "ece408", 10, vars(POLICY), verify="full")["run"]["passed"]
    assert verify_modes == ["full"] * 5
    assert invoke("run", "--kernel", "cpu", "--model", "ece408", "--batch", "10", "--verify",
                  "full").exit_code == 0
    assert verify_modes[5:] == ["full", "full"]
    lab.run(lab.network_plan(get_model("ece408"), "cpu", 10), POLICY)
    assert verify_modes[7:] == ["sample", "sample"]


# --- compare --kernel-file ----------------------------------------------------------------------

def test_compare_rows_of_a_kernel_file_come_from_its_child(cpu_kernel):
    p = compare.plan("naive", "ece408", None, "10", kernel_files=[cpu_kernel])
    rows = compare.kernel_file_rows(p.kernel_files[0], 10, p.shapes_for(10), p, POLICY)
    assert [(r.variant, r.layer, r.status) for r in rows] == [("mycpu", "conv1", "PASS"),
                                                              ("mycpu", "conv2", "PASS")]
    assert all(r.accuracy == 1.0 and r.timing.n >= 3 for r in rows)
    p = compare.plan("naive", None, "10,3,12,12,8,3", "10", kernel_files=[cpu_kernel], verify="full")
    (row,) = compare.kernel_file_rows(p.kernel_files[0], 10, p.shapes_for(10), p, POLICY)
    assert row.status == "PASS" and row.layer == "layer" and row.shape == ConvShape(10, 3, 12, 12, 8, 3)


@pytest.mark.parametrize("job,expected", [
    ("faults", "RuntimeError: cudaErrorIllegalAddress: an illegal memory access was encountered"),
    ("hangs", "hang: a device wait did not finish within 1 s"),
    ("does_not_compile", ':12: error: identifier "acc2" is undefined'),
    ("compile_error_rows", ':12: error: identifier "acc2" is undefined'),
    ("other_file", "changed while convlab ran it"),
])
def test_compare_failures_of_a_kernel_file_are_fail_rows(stubs, mine_cu, monkeypatch, job, expected):
    monkeypatch.setattr(compare, "COMPARE_JOB", f"{stubs}:{job}")
    p = compare.plan("naive", "ece408", None, "10", kernel_files=[mine_cu], timeout_s=1)
    rows = compare.kernel_file_rows(p.kernel_files[0], 10, p.shapes_for(10), p, POLICY)
    assert [(r.variant, r.layer, r.status) for r in rows] == [("mine", "conv1", "FAIL"),
                                                              ("mine", "conv2", "FAIL")]
    for row in rows:
        assert expected in row.reason and row.timing is None
        if "error: identifier" in expected:
            assert f"{mine_cu}:12" in row.reason and "cubin.cu" not in row.reason


def test_execute_runs_kernel_files_after_the_built_ins_and_records_them(cpu_kernel, as_if_gpu,
                                                                        monkeypatch):
    monkeypatch.setattr(peaks, "ceilings", lambda: peaks.Ceilings("test", 1000.0, 1e4, 4e4))
    monkeypatch.setattr(hardware, "device_info", lambda: {"name": "test"})
    p = compare.plan("cudnn", "ece408", None, "10", kernel_files=[cpu_kernel])
    steps = []
    result = compare.execute(p, POLICY, lambda what, done, total: steps.append((what, done, total)))
    assert result.kernels == ["cudnn", "cudnn-nhwc", "cudnn-tf32", "cudnn-nhwc-tf32", "mycpu"]
    assert result.kernel_files == [load_kernel_file(cpu_kernel).record()]
    assert steps[-1] == ("mycpu @ batch 10 (child process)", 5, 5)
    mine = [r for r in result.rows if r.variant == "mycpu"]
    assert [(r.layer, r.status) for r in mine] == [("conv1", "PASS"), ("conv2", "PASS")]
    assert all(r.floor_ms is not None for r in mine)


def test_plan_checks_kernel_files_before_anything_runs(tmp_path, cpu_kernel):
    other = tmp_path / "other"
    other.mkdir()
    (other / "mycpu.py").write_text(CPU_KERNEL)
    with pytest.raises(ConvlabError, match="both named 'mycpu': rename one"):
        compare.plan("naive", "ece408", None, "10", kernel_files=[cpu_kernel, other / "mycpu.py"])
    with pytest.raises(ConvlabError, match="given twice"):
        compare.plan("naive", "ece408", None, "10", kernel_files=[cpu_kernel, cpu_kernel])
    with pytest.raises(ConvlabError, match="no such file"):
        compare.plan("naive", "ece408", None, "10", kernel_files=[tmp_path / "nope.cu"])
    half = scaffold("half", "naive", tmp_path).files[0]
    half.write_text(half.read_text().replace("precision = fp32", "precision = fp16"))
    p = compare.plan("naive", "ece408", None, "10", kernel_files=[half])
    assert "cudnn-fp16" in p.kernels and "cudnn-bf16" not in p.kernels


# --- run --sanitize -----------------------------------------------------------------------------

def clean_report(tool):
    return sanitize_mod.SanitizeReport(tool, True, [], "ERROR SUMMARY: 0 errors", "ok", "")


def test_sanitize_model_checks_each_layer_with_its_epilogue(monkeypatch, as_if_gpu, tmp_path):
    calls = []

    def fake(shape, kernel_file=None, variant=None, tool="memcheck", epilogue=None, timeout_s=0):
        calls.append((shape, kernel_file, variant, tool, epilogue, timeout_s))
        return clean_report(tool)

    monkeypatch.setattr(sanitize_mod, "sanitize", fake)
    monkeypatch.setattr(sanitize_mod, "find_compute_sanitizer", lambda: "/opt/compute-sanitizer")
    layers = sanitize_mod.sanitize_model(plan_network(get_model("alexnet"), VARIANTS["naive"], 2),
                                         tool="initcheck", timeout_s=9)
    assert [layer.layer for layer in layers] == ["conv1", "conv2", "conv3", "conv4", "conv5"]
    assert all(layer.clean for layer in layers)
    assert {call[1:] for call in calls} == {(None, "naive", "initcheck", "relu", 9)}
    assert [call[0] for call in calls] == list(get_model("alexnet").conv_shapes(2).values())
    text = scaffold("small", "naive", tmp_path).files[0].read_text()
    path = tmp_path / "small.cu"
    path.write_text(text.replace("// convlab: precision", "// convlab: requires = K <= 5\n"
                                                          "// convlab: precision"))
    calls.clear()
    layers = sanitize_mod.sanitize_model(
        plan_network(get_model("ece408"), load_kernel_file(path).variant, 3), path)
    assert [(layer.layer, layer.report is None) for layer in layers] == [("conv1", True),
                                                                         ("conv2", True)]
    assert "requires K <= 5" in layers[0].lines()[0] and not calls


def test_run_sanitize_reports_and_fails_on_errors(monkeypatch, mine_cu):
    seen = []
    error = sanitize_mod.SanitizerError("Invalid __global__ read of size 4 bytes",
                                        [sanitize_mod.Location("conv_forward", str(mine_cu), 30)])

    def fake(plan, kernel_file=None, tool="memcheck", timeout_s=0):
        seen.append((plan.spec.name, plan.batch, plan.variant.name, kernel_file, tool,
                     timeout_s))
        batch = plan.batch
        report = sanitize_mod.SanitizeReport(tool, False, [error], "ERROR SUMMARY: 1 error", "ok", "")
        return [sanitize_mod.LayerReport("conv1", ConvShape(batch, 1, 28, 28, 50, 5), None, report)]

    monkeypatch.setattr(sanitize_mod, "sanitize_model", fake)
    result = invoke("run", "--kernel-file", mine_cu, "--sanitize")
    assert result.exit_code == 1
    assert seen == [(DEFAULT_MODEL, 16, "mine", mine_cu, "memcheck", sanitize_mod.SANITIZER_TIMEOUT_S)]
    assert f"conv_forward at {mine_cu}:30" in result.output and "ERROR SUMMARY: 1 error" in result.output
    invoke("run", "--kernel-file", mine_cu, "--sanitize", "racecheck", "--batch", "4,5",
           "--timeout", "7")
    assert seen[1:] == [(DEFAULT_MODEL, b, "mine", mine_cu, "racecheck", 7.0) for b in (4, 5)]
    record = json.loads(invoke("run", "--kernel", "naive", "--sanitize", "--json").output)
    assert record[0]["tool"] == "memcheck" and record[0]["layers"][0]["report"]["errors"]


def test_run_sanitize_without_the_tool_says_where_to_get_it(monkeypatch, mine_cu):
    monkeypatch.setattr(sanitize_mod, "find_compute_sanitizer", lambda: None)
    result = invoke("run", "--kernel-file", mine_cu, "--sanitize")
    assert result.exit_code == 1 and sanitize_mod.WHERE_TO_GET in result.output


# --- docs/kernel-files.md: its examples work and its commands exist -------------------------------

DOC = Path(__file__).resolve().parent.parent / "docs" / "kernel-files.md"


def doc_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), re.S)


def test_the_documented_kernel_files_compile_for_the_course_layers(tmp_path):
    cu, _header_keys, _step = doc_blocks("cuda")
    (py,) = doc_blocks("python")
    (tmp_path / "mine.cu").write_text(cu)
    (tmp_path / "mine.py").write_text(py)
    shapes = get_model("ece408").conv_shapes(100)
    for name in ("mine.cu", "mine.py"):
        report = check_file(tmp_path / name, shapes)
        assert report.ok and [layer.compiled for layer in report.layers] == [True, True], report.messages
        assert report.kernel.variant.name == "mine"
    refused = load_kernel_file(tmp_path / "mine.cu").variant.supports(
        get_model("alexnet").conv_shapes(1)["conv1"])
    assert not refused and "stride" in refused.reason


@pytest.mark.slow
def test_the_documented_mainloop_step_builds_wgmma_fp16s_code(tmp_path):
    """The guide's wgmma step (fp16's products alone) in a scaffold from wgmma-fp16: on the
    grid and persistent schedules it builds the rung's machine code, as the library's own step
    does."""
    *_, step = doc_blocks("cuda")
    made = scaffold("mine", "wgmma-fp16", tmp_path).files[0]
    text = made.read_text()
    assert step.startswith("#include <convlab/wgmma>\n") and MAINLOOP_STEP in text
    made.write_text(text[:text.index("#include <convlab/wgmma>")] + step)
    mine = load_kernel_file(made).variant
    built_in = VARIANTS["wgmma-fp16"]
    shape = ConvShape(4, 64, 12, 12, 64, 3, pad=1)
    schedules = {}
    for config in built_in.configs(shape, "relu"):
        schedules.setdefault(config.schedule, config)
    for schedule in ("grid", "persistent"):
        ours, theirs = (v.configured(schedules[schedule]) for v in (mine, built_in))
        options = tuple(theirs.compile_options(shape, "relu"))
        assert code_sections(compile_cubin("mine", ours.source, options, built_in.arch)) == \
            code_sections(compile_cubin("wgmma-fp16", theirs.source, options, built_in.arch))


def test_the_documented_commands_use_options_that_exist():
    commands = [line.split("#")[0].split() for block in doc_blocks("sh")
                for line in block.splitlines() if line.startswith("convlab ")]
    assert {argv[1] for argv in commands} == {"new", "check", "run", "compare"}
    for argv in commands:
        command = main.commands[argv[1]]
        known = {opt for p in command.params for opt in getattr(p, "opts", [])}
        assert {a for a in argv if a.startswith("--")} <= known, argv
