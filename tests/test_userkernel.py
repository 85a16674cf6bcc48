"""Kernel files on the CPU: the header format and its errors, loading .cu and .py files,
`convlab new` scaffolds, `convlab check` (NVRTC, no GPU), the isolation protocol and the
compute-sanitizer output parser."""

import json
import signal
import sys
import textwrap
import time
from dataclasses import replace

import pytest
from click.testing import CliRunner

from convlab.errors import ConvlabError
from convlab.gpu import isolate
from convlab.gpu.cubin import code_sections
from convlab.gpu.isolate import run_isolated
from convlab.gpu.jit import compile_cubin
from convlab.kernels import VARIANTS
from convlab.kernels.igemm.wgmma import MAINLOOP_STEP
from convlab.kernels.tiled import pick_tile
from convlab.kernels.wgmma import KERNELS, Wgmma
from convlab.models import get_model
from convlab.shapes import ConvShape
from convlab.userkernel import expressions
from convlab.userkernel.check import check_file, locate_messages
from convlab.userkernel.kernelfile import KernelFileError, load_kernel_file, split_top_level
from convlab.userkernel.sanitize import WHERE_TO_GET, parse_output, sanitizer_command
from convlab.userkernel.scaffold import scaffold

PLAIN = ConvShape(100, 12, 21, 21, 24, 7)
GENERAL = ConvShape(4, 6, 17, 15, 8, 3, stride=2, pad=1, groups=2, bias=True)

MINIMAL = textwrap.dedent("""\
    // mine: one thread per output, as in the course
    // convlab: block = 256
    // convlab: grid = ceil(B*M*Ho*Wo / 256)
    extern "C" __global__ void conv_forward(const float* x, const float* k, const float* bias,
                                            float* y, int B, int C, int H, int W, int M, int K)
    {
        const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
        if (i < (long long)B * M) y[i] = x[i] * k[0] + bias[0] + C + H + W + K;
    }
    """)


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


# --- expressions -------------------------------------------------------------------------------

def test_expressions_are_exact_and_safe():
    env = {"Ho": 24, "Wo": 24, "TILE": 16, "B": 10000, "M": 50}
    assert expressions.evaluate("ceil(Ho / TILE) * ceil(Wo / TILE)", env) == 4
    assert expressions.evaluate_int("ceil(B*M*Ho*Wo / 256)", env, "grid") == -(-10000 * 50 * 576 // 256)
    assert expressions.evaluate("max(1, min(Ho, 3)) + Ho % 5 - -2 ** 3", env) == 3 + 4 + 8
    assert expressions.evaluate("Ho >= 24 and not TILE < 8", env) == 1
    for bad in ("__import__('os')", "Ho.real", "[1, 2]", "lambda: 1", "'text'", "open(1)"):
        with pytest.raises(expressions.ExpressionError):
            expressions.evaluate(bad, env)
    with pytest.raises(expressions.ExpressionError, match="not a whole number"):
        expressions.evaluate_int("Ho / 5", env, "grid")
    with pytest.raises(expressions.ExpressionError, match="unknown name 'Hout'"):
        expressions.evaluate("Hout", env)
    with pytest.raises(expressions.ExpressionError, match="division by zero"):
        expressions.evaluate("Ho // (TILE - 16)", env)


def test_split_top_level_keeps_parentheses():
    assert split_top_level("x, ceil(a, b), y,") == ["x", "ceil(a, b)", "y"]


# --- .cu kernel files --------------------------------------------------------------------------

def test_minimal_header_matches_parameters_by_name(tmp_path):
    kernel = load_kernel_file(write(tmp_path, "mine.cu", MINIMAL))
    v = kernel.variant
    assert v.name == "mine" and v.precision == "fp32" and v.general == frozenset()
    assert v.summary == "mine: one thread per output, as in the course"
    assert [a.array or a.text for a in v.arguments] == ["x", "w", "bias", "y", "B", "C", "H", "W", "M", "K"]
    launch = v.launch(PLAIN)
    assert launch.grid == (-(-PLAIN.B * PLAIN.M * PLAIN.Ho * PLAIN.Wo // 256),)
    assert launch.block == (256,) and launch.shared == 0
    assert v.supports(PLAIN) and not v.supports(GENERAL)
    assert "-lineinfo" in v.compile_options(PLAIN)
    record = kernel.record()
    assert record["sha256"] == kernel.sha256 and record["files"][0]["text"] == MINIMAL
    assert len(kernel.sha256) == 64


def test_hash_follows_the_content(tmp_path):
    a = load_kernel_file(write(tmp_path, "a.cu", MINIMAL)).sha256
    b = load_kernel_file(write(tmp_path, "b.cu", MINIMAL.replace("* k[0]", "* k[1]"))).sha256
    assert a != b and a == load_kernel_file(tmp_path / "a.cu").sha256


def test_full_header(tmp_path):
    text = MINIMAL.replace("// convlab: block = 256", textwrap.dedent("""\
        // Convlab: Block: 128
        // convlab: defines = TILE = 16, HALF = TILE / 2, RELU = relu
        // convlab: shared = 4 * TILE * TILE
        // convlab: precision = TF32
        // convlab: features = all
        // convlab: epilogues = relu
        // convlab: requires = K <= 7
        // convlab: requires = Cg * K * K <= 4096""").rstrip("\n"))
    text = text.replace("ceil(B*M*Ho*Wo / 256)", "ceil(B*M*Ho*Wo / 128), 1, 1")
    v = load_kernel_file(write(tmp_path, "full.cu", text)).variant
    assert v.precision == "tf32" and v.general == frozenset({"stride", "pad", "groups", "bias"})
    assert v.epilogues == ("relu",)
    assert v.defines(GENERAL, "relu") == {"TILE": 16, "HALF": 8, "RELU": 1}
    assert v.launch(GENERAL).shared == 1024 and len(v.launch(GENERAL).grid) == 3
    assert v.supports(GENERAL)
    refused = v.supports(ConvShape(1, 1, 20, 20, 1, 9))
    assert not refused and "requires K <= 7 (full.cu:" in refused.reason


@pytest.mark.parametrize("change,message", [
    (("// convlab: block = 256", "// convlab: blok = 256"), "full.cu:2: unknown header key 'blok' (did you mean 'block'?)"),
    (("// convlab: block = 256", "// convlab: block 256"), "full.cu:2: a convlab header line reads"),
    (("// convlab: block = 256", "// convlab: block = 256\n// convlab: block = 128"), "full.cu:3: 'block' is given twice"),
    (("ceil(B*M*Ho*Wo / 256)", "ceil(B*M*Hout*Wo / 256)"), "full.cu:3: grid: unknown name 'Hout' (did you mean 'Ho'?)"),
    (("ceil(B*M*Ho*Wo / 256)", "ceil(B*M*Ho*Wo / 256"), "full.cu:3: grid: 'ceil(B*M*Ho*Wo / 256' is not an expression"),
    (("// convlab: block = 256", "// convlab: block = 256\n// convlab: precision = fp64"), "full.cu:3: precision 'fp64'"),
    (("// convlab: block = 256", "// convlab: block = 256\n// convlab: args = x, k, bias, y"), "full.cu:3: conv_forward takes 10 parameters"),
    (("// convlab: block = 256", "// convlab: block = 256\n// convlab: args = x, k, bias, B, y, C, H, W, M, K"), "parameter 'y' is a pointer"),
    (("// convlab: block = 256", "// convlab: block = 256\n// convlab: kernel = conv"), "full.cu:3: no __global__ function named 'conv'"),
    (("int K)", "int K, int tiles)"), "cannot tell what to pass for parameter 'tiles'"),
    (("// convlab: block = 256\n", ""), "full.cu: the header states no block"),
])
def test_header_errors_name_file_and_line(tmp_path, change, message):
    path = write(tmp_path, "full.cu", MINIMAL.replace(*change))
    with pytest.raises(KernelFileError) as info:
        load_kernel_file(path)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_evaluation_errors_and_limits(tmp_path):
    v = load_kernel_file(write(tmp_path, "m.cu", MINIMAL.replace("ceil(B*M*Ho*Wo / 256)", "B*M*Ho*Wo / 256"))).variant
    with pytest.raises(KernelFileError, match=r"m.cu:3: grid: the grid is .* not a whole number"):
        v.supports(ConvShape(1, 1, 5, 5, 1, 3))
    big = load_kernel_file(write(tmp_path, "b.cu", MINIMAL.replace("// convlab: block = 256", "// convlab: block = 2048"))).variant
    assert "2048 threads exceeds 1024" in big.supports(PLAIN).reason
    grid = load_kernel_file(write(tmp_path, "g.cu", MINIMAL.replace("ceil(B*M*Ho*Wo / 256)", "1, B*M"))).variant
    assert "grid dimension y" in grid.supports(ConvShape(1000, 1, 5, 5, 100, 3)).reason


def test_file_errors(tmp_path):
    with pytest.raises(KernelFileError, match="no such file"):
        load_kernel_file(tmp_path / "none.cu")
    with pytest.raises(KernelFileError, match="a .cu file"):
        load_kernel_file(write(tmp_path, "k.txt", MINIMAL))
    with pytest.raises(KernelFileError, match="like a built-in variant"):
        load_kernel_file(write(tmp_path, "naive.cu", MINIMAL))


# --- .py kernel files --------------------------------------------------------------------------

def test_python_kernel_file(tmp_path):
    path = write(tmp_path, "py_kernel.py", textwrap.dedent("""\
        from convlab.kernels.naive import Naive

        class Mine(Naive):
            name = "py-kernel"
        """))
    kernel = load_kernel_file(path)
    assert kernel.kind == "py" and kernel.variant.name == "py-kernel"
    assert "-lineinfo" in kernel.variant.compile_options(PLAIN)
    display, offset = kernel.source_location()
    assert display.startswith("<source of")  # the source string is not in the file


def test_python_kernel_file_errors(tmp_path):
    broken = write(tmp_path, "broken.py", "x = 1\ny = undefined_name\n")
    with pytest.raises(KernelFileError, match=r"broken.py:2: NameError"):
        load_kernel_file(broken)
    none = write(tmp_path, "none.py", "x = 1\n")
    with pytest.raises(KernelFileError, match="exactly one Variant subclass"):
        load_kernel_file(none)


def test_inline_source_maps_to_its_lines(tmp_path):
    path = write(tmp_path, "inline.py", textwrap.dedent('''\
        from convlab.kernels.naive import Naive

        SOURCE = r"""
        extern "C" __global__ void conv_forward(float* y) { y[0] = 1; }
        """


        class Inline(Naive):
            name = "inline"
            source = SOURCE
        '''))
    kernel = load_kernel_file(path)
    display, offset = kernel.source_location()
    assert display == str(path) and 2 + offset == 4  # source line 2 is file line 4


# --- convlab new --------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("origin", [v.name for v in VARIANTS.values() if v.source])
def test_scaffold_from_every_rung_loads_and_compiles(tmp_path, origin):
    made = scaffold("mine", origin, tmp_path)
    assert made.files[0].name == "mine.cu"
    assert made.next_commands[0] == f"convlab check {made.files[0]}"
    kernel = load_kernel_file(made.files[0])
    built_in = VARIANTS[origin]
    assert kernel.variant.name == "mine" and kernel.variant.precision == built_in.precision
    assert f"// convlab: summary = mine, started from {origin}" in made.files[0].read_text()
    if isinstance(built_in, Wgmma):  # the family's mainloop step; the rest is included
        assert MAINLOOP_STEP in made.files[0].read_text()
    else:
        assert built_in.source in made.files[0].read_text()  # the rung's source, opening comment included
    shapes = {n: s for n, s in get_model("ece408").conv_shapes(100).items() if built_in.supports(s)}
    # a rung for 3x3 layers takes the first; one for depthwise layers the second; one for
    # reductions of 1,024 terms or more (wgmma-split-bf16) the third
    fallbacks = [ConvShape(4, 16, 12, 12, 16, 3, pad=1),
                 ConvShape(4, 16, 12, 12, 16, 3, pad=1, groups=16),
                 ConvShape(4, 128, 12, 12, 16, 3, pad=1)]
    shapes = shapes or {"layer": next((s for s in fallbacks if built_in.supports(s)), fallbacks[0])}
    assert all(built_in.supports(s) for s in shapes.values())
    report = check_file(made.files[0], shapes)
    assert report.ok, report.messages
    assert all(layer.kernels for layer in report.layers)
    # a newcomer's first `convlab check` shows no warnings (the table gather's unused p and q
    # did, on layers without padding)
    assert not [m for m in report.messages if "warning" in m], report.messages


@pytest.mark.parametrize("origin", ["naive", "tiled"])
def test_header_scaffolds_launch_like_the_rung(tmp_path, origin):
    made = scaffold("mine", origin, tmp_path)
    assert len(made.files) == 1
    v = load_kernel_file(made.files[0]).variant
    built_in = VARIANTS[origin]
    for shape in (PLAIN, GENERAL, ConvShape(2, 3, 227, 227, 96, 11, stride=4)):
        assert v.supports(shape), v.supports(shape).reason
        defines = v.defines(shape, "relu")
        expected = built_in.defines(shape, "relu")
        if origin == "tiled":  # the scaffold fixes a 16x16 tile
            expected["TILE"] = 16
            assert v.launch(shape).grid == (shape.B, shape.M, -(-shape.Ho // 16) * -(-shape.Wo // 16))
            assert pick_tile(shape)  # the built-in runs these shapes too
        assert defines == expected


def test_python_scaffold_reads_its_cu(tmp_path):
    made = scaffold("mine", "register-tiled", tmp_path)
    assert [p.name for p in made.files] == ["mine.cu", "mine.py"]
    kernel = load_kernel_file(made.files[0])
    assert kernel.kind == "cu" and set(kernel.files) == {str(p) for p in made.files}
    assert kernel.source_location() == (str(made.files[0]), 0)
    threads, shared = kernel.variant.launch_resources(PLAIN)
    assert threads == 128 and shared > 0


def test_scaffold_refuses_to_overwrite_and_bad_names(tmp_path):
    scaffold("mine", None, tmp_path)
    with pytest.raises(ConvlabError, match="already exists"):
        scaffold("mine", "tiled", tmp_path)
    with pytest.raises(ConvlabError, match="built-in variant"):
        scaffold("naive", None, tmp_path)
    with pytest.raises(ConvlabError, match="not a usable kernel name"):
        scaffold("my kernel", None, tmp_path)
    with pytest.raises(ConvlabError, match="no CUDA source"):
        scaffold("other", "cpu", tmp_path)


def test_launch_header_takes_no_other_keys(tmp_path):
    made = scaffold("mine", "register-tiled", tmp_path)
    text = made.files[0].read_text().replace("// convlab: launch = mine.py",
                                             "// convlab: launch = mine.py\n// convlab: block = 64")
    made.files[0].write_text(text)
    with pytest.raises(KernelFileError, match="'block' has no effect here"):
        load_kernel_file(made.files[0])


# --- convlab check ------------------------------------------------------------------------------

def test_check_reports_user_lines_for_errors_and_warnings(tmp_path):
    made = scaffold("mine", "naive", tmp_path)
    lines = made.files[0].read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if "float acc = 0.0f;" in line)
    lines[at] += " int unused_variable = 1;"
    lines[at + 1] = lines[at + 1] + " undefined_thing;"
    made.files[0].write_text("\n".join(lines) + "\n")
    report = check_file(made.files[0], {"layer": PLAIN})
    assert not report.ok
    text = "\n".join(report.messages)
    assert f"{made.files[0]}:{at + 2}: error" in text and "undefined_thing" in text
    assert f"{made.files[0]}:{at + 1}: warning" in text and "unused_variable" in text


def test_check_resources_and_occupancy(tmp_path):
    naive = check_file(scaffold("n", "naive", tmp_path).files[0], {"layer": PLAIN})
    kernel = naive.layers[0].kernels[0]
    assert kernel.resources.registers <= 64 and kernel.resources.spill_stores == 0
    assert kernel.occupancy.threads_per_block == 256 and kernel.occupancy.percent > 50
    tiled = check_file(scaffold("t", "tiled", tmp_path).files[0], {"layer": PLAIN})
    expected = 4 * (((16 - 1) + PLAIN.K) ** 2 + PLAIN.K * PLAIN.K)
    assert tiled.layers[0].kernels[0].resources.static_shared == expected
    reg = check_file(scaffold("r", "register-tiled", tmp_path).files[0], {"layer": PLAIN})
    kernel = reg.layers[0].kernels[0]
    assert kernel.resources.registers > 96 and kernel.occupancy.dynamic_shared > 0
    assert "registers" in kernel.occupancy.limited_by


def test_check_skips_layers_the_file_refuses(tmp_path):
    report = check_file(write(tmp_path, "mine.cu", MINIMAL), {"plain": PLAIN, "general": GENERAL})
    assert report.ok and report.layers[0].compiled and not report.layers[1].support
    assert "implements no" in report.layers[1].support.reason


def test_locate_messages():
    log = 'mine.cu(12): error: oops\n/abs/mine.cu(3): warning #177-D: x\nother.cu(4): error'
    out = locate_messages(log, "mine.cu", "k/mine.py", 10)
    assert out.splitlines() == ["k/mine.py:22: error: oops", "k/mine.py:13: warning #177-D: x",
                                "other.cu(4): error"]


# --- CLI: new and check ----------------------------------------------------------------------

def test_cli_new_and_check(tmp_path, monkeypatch):
    from convlab.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")
    runner = CliRunner()
    made = runner.invoke(main, ["new", "mine", "--from", "register-tiled"])
    assert made.exit_code == 0, made.output
    assert "convlab check mine.cu" in made.output and "mine.py" in made.output
    assert "convlab compare --kernel-file mine.cu --kernels tiled,cudnn" in made.output
    again = runner.invoke(main, ["new", "mine"])
    assert again.exit_code == 1 and "already exists" in again.output and "Traceback" not in again.output
    checked = runner.invoke(main, ["check", "mine.cu", "--layer", "100,12,21,21,24,7"],
                            terminal_width=200)
    assert checked.exit_code == 0, checked.output
    assert "regs" in checked.output and "limited by" in checked.output
    assert "registers" in checked.output  # what limits register-tiled's occupancy
    as_json = runner.invoke(main, ["check", "mine.cu", "--json"])
    record = json.loads(as_json.output)
    assert record["ok"] and record["kernel_file"]["sha256"] and record["layers"]
    narrow = runner.invoke(main, ["check", "mine.cu", "--model", "alexnet"], env={"COLUMNS": "80"})
    assert narrow.exit_code == 0, narrow.output
    assert max(len(line) for line in narrow.output.splitlines()) <= 80
    for word in ("conv5", "conv_forward", "regs", "smem", "spills", "occupancy", "limited by",
                 "registers"):
        assert word in narrow.output
    wide = runner.invoke(main, ["check", "mine.cu", "--wide"], env={"COLUMNS": "80"})
    assert "static + dynamic shared memory" in wide.output and "12x21x21->24x15x15 7x7" in wide.output
    (tmp_path / "bad.cu").write_text(MINIMAL.replace("block = 256", "blok = 256"))
    bad = runner.invoke(main, ["check", "bad.cu"])
    assert bad.exit_code == 1 and "bad.cu:2: unknown header key" in bad.output


# --- isolation ------------------------------------------------------------------------------------

JOBS = textwrap.dedent("""\
    import os, time
    from convlab.gpu.isolate import gpu_wait

    def add(a, b):
        print("output of the job")
        return {"sum": a + b}

    def fails():
        raise RuntimeError("cudaErrorIllegalAddress: an illegal memory access was encountered")

    def refuses():
        from convlab.errors import KernelCompileError
        raise KernelCompileError("mine", "kern.cu(3): error: oops")

    def hangs():
        with gpu_wait():
            time.sleep(30)

    def dies():
        os._exit(3)

    def computes(seconds):
        time.sleep(seconds)
        return "done"
    """)


@pytest.fixture
def jobs(tmp_path, monkeypatch):
    write(tmp_path, "isolation_jobs.py", JOBS)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path) + ":" + ":".join(sys.path))
    return "isolation_jobs"


def test_isolated_result_crosses_back(jobs):
    record = run_isolated(f"{jobs}:add", {"a": 1, "b": 2}, timeout_s=2)
    assert record["status"] == "ok" and record["result"] == {"sum": 3}
    assert "output of the job" in record["stdout"]


def test_isolated_error_carries_the_message(jobs):
    record = run_isolated(f"{jobs}:fails", timeout_s=2)
    assert record["status"] == "error" and record["result"] is None
    assert record["reason"] == ("RuntimeError: cudaErrorIllegalAddress: an illegal memory access "
                                "was encountered")


def test_isolated_error_says_whether_the_user_can_act_on_it(jobs):
    crashed = run_isolated(f"{jobs}:fails", timeout_s=2)
    assert crashed["user_error"] is False
    refused = run_isolated(f"{jobs}:refuses", timeout_s=2)
    assert refused["status"] == "error" and refused["user_error"] is True
    assert refused["reason"] == "KernelCompileError: kernel 'mine' failed to compile (NVRTC options: )"
    assert refused["message"].splitlines()[1] == "kern.cu(3): error: oops"


def test_isolated_hang_is_killed_after_the_timeout(jobs):
    record = run_isolated(f"{jobs}:hangs", timeout_s=1, limit_s=20)
    assert record["status"] == "hang" and "within 1 s" in record["reason"]
    assert record["wall_s"] < 10


def test_isolated_timeout_counts_only_device_waits(jobs):
    slow = run_isolated(f"{jobs}:computes", {"seconds": 1.5}, timeout_s=0.5, limit_s=20)
    assert slow["status"] == "ok" and slow["result"] == "done"
    capped = run_isolated(f"{jobs}:computes", {"seconds": 10}, timeout_s=0.5, limit_s=1)
    assert capped["status"] == "timeout"


def test_isolated_crash_is_reported(jobs):
    record = run_isolated(f"{jobs}:dies", timeout_s=2)
    assert record["status"] == "crash" and "exit status 3" in record["reason"]


def test_an_interrupted_wait_kills_the_child(jobs, monkeypatch):
    """The child runs in a session of its own, out of reach of the terminal's Ctrl-C: the
    parent must end it when it is interrupted, not leave it running on the GPU."""
    children = []
    popen = isolate.subprocess.Popen

    def recorded(*args, **kwargs):
        children.append(popen(*args, **kwargs))
        return children[-1]

    def interrupted(proc, *args):
        time.sleep(0.5)
        raise KeyboardInterrupt

    monkeypatch.setattr(isolate.subprocess, "Popen", recorded)
    monkeypatch.setattr(isolate, "_watch", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_isolated(f"{jobs}:computes", {"seconds": 60}, timeout_s=2, limit_s=120)
    assert len(children) == 1 and children[0].poll() == -signal.SIGKILL


def test_isolated_bad_function_path(jobs):
    record = run_isolated("no_such_module_anywhere:f", timeout_s=2)
    assert record["status"] == "error" and "ModuleNotFoundError" in record["reason"]


# --- compute-sanitizer output -----------------------------------------------------------------

MEMCHECK = """\
========= COMPUTE-SANITIZER
========= Invalid __global__ read of size 4 bytes
=========     at conv_forward+0x2d0 in /tmp/tmpab12/kern.cu:52
=========     by thread (63,0,0) in block (5,0,0)
=========     Address 0x7f3c0e000a00 is out of bounds
=========     and is 513 bytes after the nearest allocation at 0x7f3c0e000000 of size 2048 bytes
=========     Saved host backtrace up to driver entry point at kernel launch time
=========         Host Frame: [0x2dfbef] in libcuda.so.1
=========
========= Invalid __global__ read of size 4 bytes
=========     at 0x2d0 in /tmp/tmpab12/kern.cu:53:conv_forward
=========     by thread (64,0,0) in block (5,0,0)
=========     Address 0x7f3c0e000a04 is out of bounds
=========
========= Program hit cudaErrorLaunchFailure (error 719) due to "unspecified launch failure" on CUDA API call to cuStreamSynchronize.
=========     Saved host backtrace up to driver entry point at error
=========
========= ERROR SUMMARY: 3 errors
"""

RACECHECK = """\
========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at conv_forward+0x1a0 in mine.cu:30
=========     and Read access at conv_forward+0x220 in mine.cu:35 [8 hazards]
=========
========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
"""


def test_parse_memcheck_output_maps_lines_to_the_users_file():
    errors, summary = parse_output(MEMCHECK, "k/mine.cu", 0)
    assert summary == "ERROR SUMMARY: 3 errors" and len(errors) == 3
    first = errors[0]
    assert first.what == "Invalid __global__ read of size 4 bytes"
    assert str(first.locations[0]) == "conv_forward at k/mine.cu:52"
    assert "by thread (63,0,0) in block (5,0,0)" in first.details
    assert "Address 0x7f3c0e000a00 is out of bounds" in first.details
    assert not any("Host Frame" in d for d in first.details)
    assert str(errors[1].locations[0]) == "conv_forward at k/mine.cu:53"
    assert errors[2].what.startswith("Program hit cudaErrorLaunchFailure")


def test_parse_racecheck_output():
    errors, summary = parse_output(RACECHECK, "mine.py", 10)
    assert summary.startswith("RACECHECK SUMMARY") and len(errors) == 1
    assert errors[0].what == "Race reported between Write access"
    assert [str(loc) for loc in errors[0].locations] == ["conv_forward at mine.py:40",
                                                         "conv_forward at mine.py:45"]


def test_clean_output_has_no_errors():
    errors, summary = parse_output("========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n")
    assert errors == [] and summary == "ERROR SUMMARY: 0 errors"


def test_sanitizer_command(monkeypatch):
    command = sanitizer_command("racecheck", "/opt/cs")
    assert command[:3] == ["/opt/cs", "--tool", "racecheck"] and "--error-exitcode" in command
    with pytest.raises(ConvlabError, match="unknown sanitizer tool"):
        sanitizer_command("nocheck", "/opt/cs")
    monkeypatch.setattr("convlab.userkernel.sanitize.find_compute_sanitizer", lambda: None)
    with pytest.raises(ConvlabError) as info:
        sanitizer_command("memcheck")
    assert str(info.value) == WHERE_TO_GET and "\n" not in WHERE_TO_GET


def test_all_features_leaves_rectangular_and_dilated_filters_out(tmp_path):
    """A kernel file written for KxK filters says "features = all"; it must not be handed an
    Inception 1x7 layer it would index with K alone. Those it names explicitly."""
    from convlab.shapes import ConvShape

    inception = ConvShape(2, 8, 9, 9, 8, 1, Kw=7, pad_w=3)
    text = MINIMAL.replace("// convlab: block = 256", "// convlab: block = 256\n"
                           "// convlab: features = all")
    v = load_kernel_file(write(tmp_path, "all.cu", text)).variant
    assert not v.supports(inception) and "rectangular" in v.supports(inception).reason
    named = text.replace("features = all", "features = pad, rectangular, dilation")
    w = load_kernel_file(write(tmp_path, "named.cu", named)).variant
    assert w.supports(inception)


# --- a kernel file that writes only the mainloop (the wgmma family's pieces) ------------------

WGMMA_LAYER = ConvShape(4, 64, 12, 12, 64, 3, pad=1)


def test_a_wgmma_scaffold_holds_only_its_mainloop_step(tmp_path):
    made = scaffold("mine", "wgmma-fp16", tmp_path)
    text = made.files[0].read_text()
    assert "#include <convlab/wgmma>" in text and MAINLOOP_STEP in text
    assert len(text.splitlines()) < 80  # the family's 2,000 lines stay in the library
    source = load_kernel_file(made.files[0]).variant.source
    assert KERNELS in source and MAINLOOP_STEP in source


@pytest.mark.slow
@pytest.mark.parametrize("origin", ["wgmma-fp16", "wgmma-split-bf16"])
def test_an_unchanged_wgmma_scaffold_builds_the_rungs_machine_code(tmp_path, origin):
    """The include and the library's own step compile to the rung's code, byte for byte, on
    every schedule the rung offers the layer (grid, persistent, halo)."""
    built_in = VARIANTS[origin]
    mine = load_kernel_file(scaffold("mine", origin, tmp_path).files[0]).variant
    shape = WGMMA_LAYER if origin == "wgmma-fp16" else replace(WGMMA_LAYER, C=128)
    schedules = {}
    for config in built_in.configs(shape, "relu"):
        schedules.setdefault(config.schedule, config)
    assert {"grid", "persistent"} <= set(schedules)
    for config in schedules.values():
        ours, theirs = (v.configured(config) for v in (mine, built_in))
        options = tuple(o for o in ours.compile_options(shape, "relu") if o != "-lineinfo")
        assert options == tuple(theirs.compile_options(shape, "relu"))
        assert code_sections(compile_cubin("mine", ours.source, options, built_in.arch)) == \
            code_sections(compile_cubin(origin, theirs.source, options, built_in.arch)), config


def test_check_names_the_lines_of_a_wgmma_scaffolds_own_step(tmp_path):
    made = scaffold("mine", "wgmma-fp16", tmp_path)
    lines = made.files[0].read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if "wgmma_commit();" in line)
    lines[at] += " undefined_thing;"
    made.files[0].write_text("\n".join(lines) + "\n")
    report = check_file(made.files[0], {"layer": WGMMA_LAYER})
    assert not report.ok
    text = "\n".join(report.messages)
    assert f"{made.files[0]}:{at + 1}: error" in text and "undefined_thing" in text


def test_an_unknown_library_header_is_refused_at_its_line(tmp_path):
    made = scaffold("mine", "wgmma-fp16", tmp_path)
    text = made.files[0].read_text()
    line = text[:text.index("#include <convlab/wgmma>")].count("\n") + 1
    made.files[0].write_text(text.replace("<convlab/wgmma>", "<convlab/wmma>"))
    with pytest.raises(KernelFileError, match=rf"mine.cu:{line}: no library header "
                                              r"<convlab/wmma>; there is <convlab/wgmma>"):
        load_kernel_file(made.files[0])
