import json

import pytest
from click.testing import CliRunner

from convlab import gpu
from convlab.cli import main
from convlab.kernels import VARIANTS


@pytest.fixture
def runner():
    return CliRunner()


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(gpu, "_probe", lambda: (None, "CuPy is not installed (test)"))


def invoke(runner, *args):
    result = runner.invoke(main, list(args))
    assert "Traceback" not in result.output
    return result


def test_list_shows_every_variant(runner):
    result = invoke(runner, "list")
    assert result.exit_code == 0
    for name in VARIANTS:
        assert name in result.output


def test_list_json(runner):
    rows = json.loads(invoke(runner, "list", "--json").output)
    assert [r["name"] for r in rows] == list(VARIANTS)
    assert {r["precision"] for r in rows} <= {"fp32", "tf32", "fp16"}


def test_show_raw_prints_source(runner):
    result = invoke(runner, "show", "tiled", "--raw")
    assert result.exit_code == 0
    assert result.output.startswith("// tiled: changes from naive")
    assert "__shared__ float xs[X_TILE][X_TILE];" in result.output


def test_show_highlighted(runner):
    result = invoke(runner, "show", "naive")
    assert result.exit_code == 0 and "conv_forward" in result.output


def test_show_variant_without_source(runner):
    result = invoke(runner, "show", "cpu")
    assert result.exit_code == 1 and "has no CUDA source" in result.output


def test_models_lists_expected_accuracy(runner):
    result = runner.invoke(main, ["models"], terminal_width=200)
    assert result.exit_code == 0
    for name in ("ece408-high", "ece408-low", "ece408"):
        assert name in result.output
    assert "0.8562" in result.output  # the course's reported figure beside ours


def test_run_cpu_prints_course_lines(runner):
    result = runner.invoke(main, ["run", "--kernel", "cpu", "--batch", "100", "--model", "ece408-low"],
                           terminal_width=200)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "Loading fashion-mnist data... done"
    assert lines[1] == "Loading model... done"
    assert lines[2].startswith("Op Time: ")
    assert lines[3] == "Correctness: 0.6300 Model: ece408-low"
    assert "PASS" in result.output
    assert "none (the cpu variant is NumPy)" in result.output


def test_run_json_record(runner):
    result = invoke(runner, "run", "--kernel", "cpu", "--batch", "10", "--model", "ece408", "--json")
    assert result.exit_code == 0
    record = json.loads(result.output)
    assert record["model"] == "ece408" and record["kernel"] == "cpu" and record["passed"]
    assert [layer["name"] for layer in record["layers"]] == ["conv1", "conv2"]
    assert record["layers"][1]["shape"] == {"B": 10, "C": 12, "H": 21, "W": 21, "M": 24, "K": 7,
                                            "stride": 1, "pad": 0}
    assert record["accuracy"] == record["expected_accuracy"]


def test_run_defaults_to_cpu_without_gpu(runner, no_gpu):
    result = runner.invoke(main, ["run", "--batch", "10"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "no usable GPU" in result.output and "running the cpu variant" in result.output
    assert "Correctness: " in result.output and "Model: ece408-high" in result.output


def test_unknown_kernel_lists_names(runner):
    result = invoke(runner, "run", "--kernel", "fastest")
    assert result.exit_code != 0
    assert "unknown kernel 'fastest'" in result.output and "register-tiled" in result.output


def test_unknown_model_lists_names(runner):
    result = invoke(runner, "run", "--kernel", "cpu", "--model", "lenet")
    assert result.exit_code == 1 and "ece408-high, ece408-low, ece408" in result.output


@pytest.mark.parametrize("batch", ["0", "10001", "-5"])
def test_batch_out_of_range(runner, batch):
    result = invoke(runner, "run", "--kernel", "cpu", "--batch", batch)
    assert result.exit_code == 1 and "between 1 and 10000" in result.output


def test_gpu_kernel_without_gpu_says_what_to_do(runner, no_gpu):
    result = invoke(runner, "run", "--kernel", "tiled", "--batch", "10")
    assert result.exit_code == 1
    assert "kernel 'tiled' needs a CUDA GPU" in result.output and "--kernel cpu" in result.output


def test_device_without_gpu(runner, no_gpu):
    result = invoke(runner, "device")
    assert result.exit_code == 0 and result.output.startswith("no GPU:")


def test_train_with_bad_data_dir_is_a_clear_error(runner, tmp_path):
    result = invoke(runner, "train", "--model", "ece408-low", "--data-dir", str(tmp_path),
                    "--output", str(tmp_path))
    assert result.exit_code == 1
    assert "no such file" in result.output or "needs PyTorch" in result.output


def test_train_unknown_model(runner, tmp_path):
    result = invoke(runner, "train", "--model", "vgg", "--output", str(tmp_path))
    assert result.exit_code == 1 and "unknown model 'vgg'" in result.output
