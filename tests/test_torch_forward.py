"""PyTorch's candidates for the whole network, without a GPU: which one is the baseline."""

import os

import numpy as np

from convlab.gpu.timer import TimingPolicy
from convlab.models import load_weights
from convlab.net import torch_forward
from convlab.net.torch_forward import TorchRow, allowed_differ, fastest


def test_the_fastest_candidate_with_its_predictions_intact_is_the_baseline():
    rows = [TorchRow("fp32", "nchw", "eager", 9.0, 0), TorchRow("fp32", "nhwc", "compile", 4.0, 0),
            TorchRow("fp32", "nhwc", "graph", 3.0, 2), TorchRow("fp32", "nchw", "compile",
                                                                 error="BackendCompilerFailed: x")]
    best = fastest(rows, 128)
    assert best.label == "fp32, channels-last, torch.compile" and best.ms == 4.0
    assert fastest([TorchRow("fp16", "nhwc", "graph", 3.0, 1)], 128).ms == 3.0
    assert fastest(rows[2:], 128) is None


def test_allowed_differ_is_none_in_fp32_and_scales_with_the_rounding_unit():
    assert allowed_differ("fp32", 10000) == 0
    assert allowed_differ("fp16", 10000) == 100 and allowed_differ("tf32", 128) == 1
    assert allowed_differ("bf16", 128) == 10 and allowed_differ("bf16", 8) == 1


def test_a_bf16_candidate_with_near_tie_flips_is_a_baseline():
    rows = [TorchRow("bf16", "nhwc", "compile", 5.3, 8), TorchRow("bf16", "nhwc", "eager", 8.8, 10),
            TorchRow("bf16", "nchw", "compile", 4.0, 90)]
    assert fastest(rows, 128).ms == 5.3


def test_rows_round_trip():
    row = TorchRow("tf32", "nhwc", "compile", 2.3, 0)
    assert TorchRow.from_dict(row.as_dict()) == row


def _isolated(monkeypatch, job: dict, budget_s: float = 12.0):
    """isolated_row with the child process replaced by `job`: what the parent sends and makes
    of the child's record."""
    sent = {}
    x = np.random.default_rng(0).random((3, 1, 48, 48), dtype=np.float32)

    def fake_run_isolated(function, args, timeout_s, limit_s):
        with np.load(args["npz_path"]) as npz:  # the problem is on disk while the child runs
            sent.update(function=function, args=args, timeout_s=timeout_s, limit_s=limit_s,
                        files=set(npz.files), input=npz[torch_forward.INPUT_KEY])
        return job

    monkeypatch.setattr(torch_forward, "run_isolated", fake_run_isolated)
    weights = load_weights("ece408")
    row = torch_forward.isolated_row(weights, x, "fp32", "nhwc", "max-autotune",
                                     np.array([1, 2, 3]), TimingPolicy(min_runs=7), budget_s)
    assert sent["function"] == "convlab.net.torch_forward:child_row"
    assert sent["timeout_s"] == sent["limit_s"] == budget_s
    np.testing.assert_array_equal(sent["input"], x)
    assert sent["files"] == set(weights.arrays) - {"reference_predictions"} | {"__input__"}
    assert sent["args"]["reference_top1"] == [1, 2, 3] and sent["args"]["policy"]["min_runs"] == 7
    assert not os.path.exists(sent["args"]["npz_path"])
    return row


def test_a_candidate_past_its_compile_budget_is_skipped_with_the_reason(monkeypatch):
    row = _isolated(monkeypatch, {"status": "timeout", "reason": "ran past 12 s"})
    assert row.ms is None and row.label == "fp32, channels-last, torch.compile max-autotune"
    assert row.error == ("skipped: not done within its budget of 12 s (compiling and timing it "
                         "in a child process)")
    assert fastest([row, TorchRow("fp32", "nhwc", "compile", 4.0, 0)], 3).mode == "compile"


def test_a_candidate_timed_in_its_child_comes_back_whole(monkeypatch):
    done = TorchRow("fp32", "nhwc", "max-autotune", 3.5, 0)
    assert _isolated(monkeypatch, {"status": "ok", "result": done.as_dict()}) == done
    failed = _isolated(monkeypatch, {"status": "crash", "reason": "killed by SIGSEGV"})
    assert failed.ms is None and failed.error == "crash in its child process: killed by SIGSEGV"


def test_the_stream_never_builds_a_candidate_timed_in_a_child_again():
    """The stream runs its fastest candidate in this process: max-autotune, timed in a child
    under its budget, would compile here again without one."""
    rows = [TorchRow("fp16", "nhwc", "max-autotune", 1.5, 0),
            TorchRow("fp16", "nhwc", "compile", 1.7, 0), TorchRow("fp16", "nchw", "eager", 4.0, 0)]
    assert fastest(rows, 128).mode == "max-autotune"
    assert torch_forward.fastest_here(rows, 128).mode == "compile"
