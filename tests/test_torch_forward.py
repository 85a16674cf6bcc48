"""PyTorch's candidates for the whole network, without a GPU: which one is the baseline."""

from convlab.net.torch_forward import TorchRow, allowed_differ, fastest


def test_the_fastest_candidate_with_its_predictions_intact_is_the_baseline():
    rows = [TorchRow("fp32", "nchw", "eager", 9.0, 0), TorchRow("fp32", "nhwc", "compile", 4.0, 0),
            TorchRow("fp32", "nhwc", "graph", 3.0, 2), TorchRow("fp32", "nchw", "compile",
                                                                 error="BackendCompilerFailed: x")]
    best = fastest(rows, 128)
    assert best.label == "fp32, channels-last, torch.compile" and best.ms == 4.0
    assert fastest([TorchRow("fp16", "nhwc", "graph", 3.0, 1)], 128).ms == 3.0
    assert fastest(rows[2:], 128) is None


def test_allowed_differ_is_none_in_fp32_and_one_percent_below():
    assert allowed_differ("fp32", 10000) == 0
    assert allowed_differ("fp16", 10000) == 100 and allowed_differ("bf16", 8) == 1


def test_rows_round_trip():
    row = TorchRow("tf32", "nhwc", "compile", 2.3, 0)
    assert TorchRow.from_dict(row.as_dict()) == row
