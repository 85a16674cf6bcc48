"""`convlab run --kernel-file` and `convlab compare --kernel-file` on the GPU: a kernel file
passes and is recorded like a built-in, a fault or a hang fails only its own run (and the rest
of a compare goes on), a compile error names the user's line, `--sanitize` through `run`, and
`--verify full` for the built-ins. Run on a GPU machine: pytest -m gpu tests/test_kernelfile_runs_gpu.py
"""

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from convlab.bench import compare, lab
from convlab.cli import main
from convlab.gpu import timer
from convlab.shapes import ConvShape
from convlab.userkernel.kernelfile import load_kernel_file
from convlab.userkernel.sanitize import WHERE_TO_GET, find_compute_sanitizer
from convlab.userkernel.scaffold import scaffold

pytestmark = pytest.mark.gpu

POLICY = timer.TimingPolicy(warmup=2, min_runs=5, max_runs=20, budget_s=0.3)
STORE = "    y[i] = acc;"
FAULT = "    y[i + (1LL << 40)] = acc;"
SPIN = "    while (clock64() >= 0) {}  // 2^63 cycles: forever\n    y[i] = acc;"
DOC = Path(__file__).resolve().parent.parent / "docs" / "kernel-files.md"


def kernel_file(folder, name, replacement=None):
    path = scaffold(name, "naive", folder).files[0]
    if replacement is not None:
        text = path.read_text()
        assert STORE in text
        path.write_text(text.replace(STORE, replacement))
    return path


def invoke(*args):
    result = CliRunner().invoke(main, [str(a) for a in args], terminal_width=200,
                                env={"COLUMNS": "200"})
    assert "Traceback" not in result.output, result.output
    return result


def test_run_kernel_file_passes_and_records_the_file(tmp_path):
    path = kernel_file(tmp_path, "mine")
    result = invoke("run", "--kernel-file", path, "--model", "ece408", "--batch", "100", "--json")
    assert result.exit_code == 0, result.output
    record = json.loads(result.output)
    assert record["passed"] and record["kernel"] == "mine" and record["device"]
    assert all(layer["check"]["passed"] for layer in record["layers"])
    assert record["kernel_file"]["sha256"] == load_kernel_file(path).sha256
    assert record["kernel_file"]["files"][0]["text"] == path.read_text()
    table = invoke("run", "--kernel-file", path, "--model", "ece408", "--batch", "100")
    assert table.exit_code == 0 and table.output.count("Op Time: ") == 2, table.output


def test_run_kernel_file_fault_fails_each_batch_alone(tmp_path):
    path = kernel_file(tmp_path, "bad", FAULT)
    result = invoke("run", "--kernel-file", path, "--model", "ece408", "--batch", "10,20")
    assert result.exit_code == 1
    for batch in (10, 20):
        line = next(line for line in result.output.splitlines() if line.startswith(f"FAIL batch {batch}:"))
        assert "cudaErrorIllegalAddress" in line, result.output


def test_run_kernel_file_hang_is_killed(tmp_path):
    path = kernel_file(tmp_path, "spin", SPIN)
    result = invoke("run", "--kernel-file", path, "--model", "ece408", "--batch", "10",
                    "--timeout", "3")
    assert result.exit_code == 1
    assert "FAIL batch 10: hang: a device wait did not finish within 3 s" in result.output


def test_run_kernel_file_compile_error_names_the_users_line(tmp_path):
    path = kernel_file(tmp_path, "typo", "    y[i] = acc2;")
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "acc2" in text)
    result = invoke("run", "--kernel-file", path, "--model", "ece408", "--batch", "10")
    assert result.exit_code == 1 and "FAIL" not in result.output
    assert re.search(rf"{re.escape(str(path))}:{line}: error: identifier \"acc2\" is undefined",
                     result.output), result.output


def test_compare_goes_on_past_a_faulting_and_a_hanging_kernel_file(tmp_path):
    files = [kernel_file(tmp_path, "good"), kernel_file(tmp_path, "bad", FAULT),
             kernel_file(tmp_path, "spin", SPIN)]
    p = compare.plan("tiled", "ece408", None, "10", kernel_files=files, timeout_s=3)
    result = compare.execute(p, POLICY)
    rows = {(r.variant, r.layer): r for r in result.rows}
    for name in ("tiled", "cudnn", "good"):
        for layer in ("conv1", "conv2"):
            assert rows[(name, layer)].status == "PASS", (name, layer, rows[(name, layer)].reason)
    for layer in ("conv1", "conv2"):
        assert rows[("bad", layer)].status == "FAIL"
        assert "cudaErrorIllegalAddress" in rows[("bad", layer)].reason
        assert rows[("spin", layer)].status == "FAIL"
        assert rows[("spin", layer)].reason.startswith("hang: a device wait did not finish within 3 s")
    assert rows[("good", "conv1")].speedup_cudnn is not None
    assert [f["sha256"] for f in result.kernel_files] == [load_kernel_file(f).sha256 for f in files]


def test_compare_cli_with_a_kernel_file_and_verify_full(tmp_path):
    path = kernel_file(tmp_path, "mine")
    result = invoke("compare", "--kernel-file", path, "--kernels", "tiled,cudnn", "--model",
                    "ece408", "--batch", "100", "--verify", "full", "--budget", "0.3")
    assert result.exit_code == 0, result.output
    assert re.search(r"\bmine\b.*PASS", result.output), result.output


needs_sanitizer = pytest.mark.skipif(find_compute_sanitizer() is None, reason=WHERE_TO_GET)


@needs_sanitizer
def test_run_sanitize_names_the_users_line(tmp_path):
    bad = "    y[i] = acc + x[(long long)B * C * H * W + (i % 4)];"
    path = kernel_file(tmp_path, "oob", bad)
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "(i % 4)" in text)
    result = invoke("run", "--kernel-file", path, "--sanitize", "--model", "ece408", "--batch", "4")
    assert result.exit_code == 1 and f"{path}:{line}" in result.output, result.output
    clean = invoke("run", "--kernel-file", kernel_file(tmp_path, "fine"), "--sanitize", "--model",
                   "ece408", "--batch", "4")
    assert clean.exit_code == 0 and clean.output.count("no errors") == 2, clean.output


def test_verify_full_for_built_in_variants():
    assert lab.run_layer(ConvShape(100, 12, 21, 21, 24, 7), "tiled", POLICY,
                         verify="full").check.passed
    result = invoke("run", "--kernel", "tiled", "--model", "ece408", "--batch", "100", "--verify", "full")
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("name", ["mine.cu", "mine.py"])
def test_the_documented_kernel_files_pass(tmp_path, name):
    text = DOC.read_text()
    (tmp_path / "mine.cu").write_text(re.findall(r"```cuda\n(.*?)```", text, re.S)[0])
    (tmp_path / "mine.py").write_text(re.findall(r"```python\n(.*?)```", text, re.S)[0])
    result = invoke("run", "--kernel-file", tmp_path / name, "--model", "ece408", "--batch", "1000")
    assert result.exit_code == 0, result.output
    assert "Correctness: 0.8950 Model: ece408" in result.output
