"""A run's layers are decided once (net.plan): who runs each conv and FC layer, with which
epilogue, from one support check per layer; `run`, the network, compare and the sanitizer
consume that decision instead of asking again."""

from collections import Counter

import pytest

from convlab.bench import compare, lab
from convlab.errors import ConvlabError, UnsupportedLayers
from convlab.gpu import timer
from convlab.kernels import RELU, Support, get_variant
from convlab.kernels.cpu import Cpu
from convlab.models import get_model, load_weights
from convlab.net.network import Network
from convlab.net.plan import REFUSALS_SHOWN, plan_network

POLICY = timer.TimingPolicy(warmup=1, min_runs=2, max_runs=3, budget_s=0.1)


class OneChannelOnly(Cpu):
    """The cpu variant, refusing every layer with more than one input channel."""

    name = "one-channel"

    def supports(self, shape):
        return Support(True) if shape.C == 1 else Support(False, "only one input channel")


class NoRelu(Cpu):
    name = "no-relu"
    epilogues = ()


@pytest.fixture
def counted(monkeypatch):
    """Cpu.supports, counting its calls per layer shape."""
    calls = Counter()
    original = Cpu.supports

    def supports(self, shape):
        calls[shape] += 1
        return original(self, shape)

    monkeypatch.setattr(Cpu, "supports", supports)
    return calls


def test_every_layer_is_decided_with_its_runner_and_epilogue():
    spec = get_model("alexnet")
    plan = plan_network(spec, Cpu(), 2)
    assert list(plan.convs) == ["conv1", "conv2", "conv3", "conv4", "conv5"]
    assert all(d.variant is plan.variant and d.epilogue == RELU and d.absorbed == 1
               for d in plan.convs.values())
    assert plan.convs["conv3"].shape == spec.conv_shapes(2)["conv3"]
    assert plan.fallback is None and not plan.refused and not plan.dense
    plain = plan_network(spec, NoRelu(), 2)
    assert {(d.epilogue, d.absorbed) for d in plain.convs.values()} == {(None, 0)}


def test_a_refused_layer_is_named_or_goes_to_the_fallback():
    spec = get_model("ece408")
    refused = plan_network(spec, OneChannelOnly(), 10)
    assert [d.name for d in refused.refused] == ["conv2"]
    with pytest.raises(ConvlabError, match=r"kernel 'one-channel' does not support conv2 "
                                           r"\(.*\): only one input channel"):
        refused.check()
    fallback = Cpu()
    covered = plan_network(spec, OneChannelOnly(), 10, fallback).check()
    assert covered.fallback is fallback and covered.fallback_layers == ["conv2"]
    assert covered.convs["conv2"].variant is fallback
    assert not covered.convs["conv2"].support  # the asked variant's verdict stays on record
    # a fallback no layer needs is not part of the plan
    assert plan_network(spec, Cpu(), 10, OneChannelOnly()).fallback is None


def test_a_refusal_names_the_variant_of_its_class_that_would_run_the_refused_layers():
    """wgmma-split-bf16 refuses ResNet-50's reductions under 1,024 terms (31 layers): the
    error names the first few in full and the rest by name, and carries the registered
    variant of the fp32 class nearest before it in the ladder that runs them all,
    wgmma-3xtf32. A CPU variant nothing registered stands in for carries none."""
    plan = plan_network(get_model("resnet50"), get_variant("wgmma-split-bf16"), 1)
    with pytest.raises(UnsupportedLayers) as caught:
        plan.check()
    assert caught.value.stand_in == "wgmma-3xtf32"
    message, rest = str(caught.value), plan.refused[REFUSALS_SHOWN:]
    assert message.count("the BF16 cross products need") == REFUSALS_SHOWN
    assert message.endswith(f"and {len(rest)} more: {', '.join(d.name for d in rest)}")
    with pytest.raises(UnsupportedLayers) as caught:
        plan_network(get_model("ece408"), OneChannelOnly(), 10).check()
    assert caught.value.stand_in is None


def test_the_network_builds_what_the_plan_decided():
    weights = load_weights("ece408")
    plan = plan_network(weights.spec, OneChannelOnly(), 10, Cpu())
    network = Network(weights, plan)
    assert [s.kernel_label.split()[0] for s in network.conv_steps] == ["one-channel", "cpu"]
    assert network.fallback_layers == ["conv2"]
    with pytest.raises(ConvlabError, match="does not support conv2"):
        Network(weights, plan_network(weights.spec, OneChannelOnly(), 10))


def test_a_run_checks_each_layers_support_once(counted):
    """`convlab run`'s path: plan_run decides the layers, execute_run builds and times the
    network from that decision without asking the variant again."""
    plan = lab.plan_run("ece408", kernel="cpu", batches="10", repeat=2)
    [result] = lab.execute_run(plan)
    assert result.passed
    shapes = get_model("ece408").conv_shapes(10).values()
    assert counted == Counter(shapes)


def test_a_model_compare_checks_each_layers_support_once(counted):
    spec = get_model("ece408")
    shapes = spec.conv_shapes(10)
    rows = compare.variant_rows(Cpu(), 10, spec, POLICY, shapes)
    assert [(r.layer, r.status) for r in rows] == [("conv1", "PASS"), ("conv2", "PASS")]
    assert counted == Counter(shapes.values())


def test_pytorch_without_pytorch_or_on_the_cpu_is_refused_in_one_line(monkeypatch):
    """`run --pytorch` once ran on and never said PyTorch was missing (or that a CPU run
    times no PyTorch)."""
    import importlib.util

    from convlab.net import torch_forward

    found = importlib.util.find_spec
    monkeypatch.setattr(torch_forward.importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else found(name, *a))
    with pytest.raises(ConvlabError, match=r'PyTorch is not installed: pip install -e "\.\[train\]"'):
        lab.plan_run("ece408", kernel="cpu", batches="10", pytorch=True)
    monkeypatch.setattr(torch_forward.importlib.util, "find_spec", lambda name, *a: object())
    with pytest.raises(ConvlabError, match="this run is on the CPU: kernel 'cpu' runs on the CPU"):
        lab.plan_run("ece408", kernel="cpu", batches="10", pytorch=True)


def test_a_run_keeps_the_fallback_it_was_given_for_every_batch():
    """A batch whose layers all run on the variant names no fallback in its own plan; the run
    keeps the one asked for, which a kernel file's child gets for every batch (it once got
    the smallest batch's: none)."""
    plan = lab.plan_run("ece408", kernel="cpu", batches="10,100", fallback="naive")
    assert plan.fallback is not None and plan.fallback.name == "naive"
    assert [network.fallback for network in plan.networks] == [None, None]
