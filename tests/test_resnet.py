"""ResNet-50 and VGG-16 on any machine: their layers and parameters as torchvision has them,
batch norm drawn so activations stay in range and folded so the network computes what the
unfolded float64 forward does, residual blocks through the network's stack of kept activations,
and PyTorch state dicts imported without PyTorch, bad ones refused in one line."""

import copy
import io
import re
import struct
import zipfile

import numpy as np
import pytest
from click.testing import CliRunner

from convlab import models
from convlab.bench import lab
from convlab.cli import main
from convlab.errors import DataError
from convlab.kernels.base import StagedBuffer, Staging
from convlab.models import (IMAGENET, AddKept, BatchNorm, Conv, Dense, GlobalAvgPool, Keep,
                            MaxPool, ModelSpec, ReLU, Softmax, Swap, get_model, random_weights)
from convlab.net import importer, network, state_dict
from convlab.net.network import (ARENA_ALIGNMENT, Network, arena_offsets, half_next,
                                  shortcut_as_half)
from convlab.oracle import reference
from convlab.shapes import channels_last, dense_in

# torchvision's counts: resnet50 25,557,032 parameters (+ 53,120 batch-norm running means and
# as many variances, which the state dict holds too); vgg16 138,357,544.
PARAMETERS = {"resnet50": 25_557_032 + 2 * 26_560, "vgg16": 138_357_544}


@pytest.mark.parametrize("name", ["resnet50", "vgg16"])
def test_models_have_torchvisions_parameters_and_output(name):
    spec = get_model(name)
    shapes = spec.parameter_shapes()
    assert sum(int(np.prod(s)) for s in shapes.values()) == PARAMETERS[name]
    assert spec.trace(3)[-1][2] == (3, 1000)
    assert len(spec.conv_layers) == {"resnet50": 53, "vgg16": 13}[name]


def test_resnet50_keys_and_shapes_follow_torchvision():
    shapes = get_model("resnet50").parameter_shapes()
    assert shapes["conv1.weight"] == (64, 3, 7, 7)
    assert shapes["layer1.0.downsample.0.weight"] == (256, 64, 1, 1)
    assert shapes["layer2.0.conv2.weight"] == (128, 128, 3, 3)
    assert shapes["layer4.2.bn3.running_var"] == (2048,)
    assert shapes["fc.weight"] == (1000, 2048)
    convs = get_model("resnet50").conv_shapes(1)
    # v1.5: the stride sits on the 3x3 conv; the shortcut's 1x1 has it too
    assert convs["layer2.0.conv2"].stride == 2 and convs["layer2.0.conv1"].stride == 1
    assert convs["layer2.0.downsample.0"].stride == 2
    assert convs["layer4.2.conv3"].H == 7
    assert all(s.bias for s in convs.values())  # batch norm folded in: a bias each


def tiny_resnet() -> ModelSpec:
    """ResNet's pieces at a size a test runs in a moment: a stem with a padded pool, one block
    with a projection shortcut and one with an identity, the global pool and a classifier."""
    layers = (*models._conv_bn("conv1", "bn1", 3, 8, 3, 2), ReLU(), MaxPool(3, 2, pad=1),
              *models._bottleneck("layer1.0", 8, 4, 2), *models._bottleneck("layer1.1", 16, 4, 1),
              GlobalAvgPool(), Dense("fc", 16, 10), Softmax())
    return ModelSpec(name="tiny-resnet", input_size=20, layers=layers, origin="a test's",
                     input_channels=3, task=IMAGENET)


@pytest.fixture
def tiny(monkeypatch):
    spec = tiny_resnet()
    monkeypatch.setitem(models.MODELS, spec.name, spec)
    random_weights.cache_clear()
    yield random_weights(spec.name)
    random_weights.cache_clear()


def test_blocks_are_kept_swapped_and_added_in_the_trace(tiny):
    kinds = [type(layer) for layer in tiny.spec.layers]
    assert kinds.count(Keep) == 2 and kinds.count(Swap) == 1 and kinds.count(AddKept) == 2
    trace = tiny.spec.trace(2)
    swap = next(i for i, (layer, _, _) in enumerate(trace) if isinstance(layer, Swap))
    # the shortcut's output is kept; the body starts again from the block's input
    assert trace[swap][1] == (2, 16, 3, 3) and trace[swap][2] == (2, 8, 5, 5)


def test_batch_norm_statistics_normalise_the_activations(tiny):
    """Drawn from the moments of the layer's input on images like the lab's, each batch norm
    leaves its output near zero mean and the scale of its gamma."""
    x = lab.load_input(tiny.spec, 4).astype(np.float64)

    def apply(layer, a):
        out = reference.apply_layer(layer, a, tiny.arrays)
        if isinstance(layer, BatchNorm):
            gamma = tiny.arrays[f"{layer.name}.weight"].astype(np.float64)
            spread = out.std(axis=(0, 2, 3)) / gamma
            assert 0.5 < np.median(spread) < 2, layer.name
            assert np.abs(out.mean(axis=(0, 2, 3))).max() < 1.5, layer.name
        return out

    a = models.run_layers(tiny.spec.layers, x, apply)
    logits_spread = np.log(a).std(axis=1)
    assert (logits_spread > 0.5).all()  # not all classes tied


def test_folded_network_computes_the_unfolded_forward(tiny):
    """The cpu variant's network runs the folded weights; the float64 reference runs batch norm
    as written: they agree to float32's rounding, so the folding is right."""
    folded = tiny.folded
    assert not any(isinstance(layer, BatchNorm) for layer in folded.spec.layers)
    assert not any(key.startswith("bn1.") for key in folded.arrays)
    assert folded is tiny.folded  # folded once
    x = lab.load_input(tiny.spec, 3)
    net = Network(tiny, lab.network_plan(tiny.spec, "cpu", 3))
    net.input[...] = x
    got = np.array(net.forward())
    want = reference.forward(tiny, x, dtype=np.float64)
    assert np.abs(got - want).max() < 1e-5
    assert (got.argmax(axis=1) == want.argmax(axis=1)).all()
    # and a fold that forgets the running mean is caught
    broken = dict(folded.arrays)
    broken["conv1.bias"] = broken["conv1.bias"] + 0.5
    wrong = reference.forward(models.Weights(folded.spec, broken), x, dtype=np.float64)
    assert np.abs(wrong - want).max() > 1e-3


def test_every_step_of_a_block_is_checked_against_float64(tiny):
    net = Network(tiny, lab.network_plan(tiny.spec, "cpu", 2))
    net.input[...] = lab.load_input(tiny.spec, 2)
    labels = [s.label for s in net.steps]
    assert len(labels) == len(set(labels))
    adds = [s for s in net.steps if s.adds_kept]
    assert [s.label for s in adds] == ["layer1.0.add3+relu", "layer1.1.add3+relu"]
    assert [s.stack for s in net.steps if s.stack] == [("keep",), ("swap",), ("keep",)]
    checks = lab._check_layer_steps(net)
    assert set(checks) == {s.label for s in net.steps if not s.is_conv}
    assert all(check.passed for check in checks.values()), checks
    # the add's check sees its shortcut: a step that added nothing would fail it
    net.forward(until=adds[0])
    adds[0].kept = adds[0].op.kept = None
    net.forward(until=adds[0])
    ran = {}

    def drop_the_shortcut(step, when):
        if step is not adds[0]:
            return
        if when == "begin":  # the add writes over its input: its operands are taken first
            ran["operands"] = lab._layer_step_operands(step, net)
            ran["input"] = step.input.copy()
        else:
            step.output[...] = np.maximum(ran["input"], 0)
            ran["check"] = lab._verify_layer_step(step, net, ran["operands"])

    net.forward(on_step=drop_the_shortcut)
    assert not ran["check"].passed


def _largest_live_set(sizes, lives) -> int:
    return max(sum(n for n, (first, last) in zip(sizes, lives) if first <= j <= last)
               for j in range(max(last for _, last in lives) + 1))


def test_buffers_are_shared_once_nothing_reads_them(tiny):
    """Steps' outputs share one arena, a step's bytes reused once nothing reads them: the
    pass holds about the largest live set, not every activation, and no step writes over an
    output a later step still reads."""
    for name in ("resnet50", "vgg16"):
        w = random_weights(name)
        net = Network(w, lab.network_plan(w.spec, "cpu", 1))
        last = net._last_reads()
        sizes = [s.output.nbytes for s in net.steps]
        live = _largest_live_set(sizes, [(j, last[j]) for j in range(len(sizes))])
        arena = net.steps[0].output.base
        assert all(s.output.base is arena for s in net.steps), name
        assert arena.nbytes <= 1.05 * live and arena.nbytes < sum(sizes) / 2, name
    net = Network(tiny, lab.network_plan(tiny.spec, "cpu", 2))
    last = net._last_reads()
    for j, step in enumerate(net.steps):  # nobody's buffer is written while it is still read
        for k in range(j + 1, min(last[j], len(net.steps) - 1) + 1):
            # but by its last reader, where that writes element by element over its input
            in_place = k == last[j] and net.steps[k].elementwise
            assert in_place or not np.shares_memory(net.steps[k].output, step.output), \
                (step.label, k)


def test_a_network_holds_its_filters_once_where_they_outweigh_its_activations(tiny,
                                                                           monkeypatch):
    """ResNet-50's 25.6 million filter weights outweigh two of its largest activations (0.8
    million elements an image) up to batch 15, VGG-16's 138 million (3.2 million) up to 21;
    where they do, every step its conv variant runs (its convs, and FCs it runs as 1x1 convs)
    asks it for the form that holds them once (Variant.holding_filters_once), elsewhere none
    does, and a run whose steps hold them once says so."""
    assert network.filters_outweigh_activations(models.get_model("resnet50"), 15)
    assert not network.filters_outweigh_activations(models.get_model("resnet50"), 16)
    assert network.filters_outweigh_activations(models.get_model("vgg16"), 21)
    assert not network.filters_outweigh_activations(models.get_model("vgg16"), 22)
    from convlab.gpu import timer

    asked = []
    cpu = type(lab.network_plan(tiny.spec, "cpu", 2).variant)

    def holding_once(self):
        asked.append(self)
        held = copy.copy(self)
        held.filters_once = True
        return held

    monkeypatch.setattr(cpu, "holding_filters_once", holding_once)
    policy = timer.TimingPolicy(warmup=1, min_runs=2, max_runs=3)
    for outweigh in (True, False):
        asked.clear()
        monkeypatch.setattr(network, "filters_outweigh_activations", lambda spec, b: outweigh)
        net = Network(tiny, lab.network_plan(tiny.spec, "cpu", 2))
        gemms = [s for s in net.steps if isinstance(s, network.ConvStep)]
        assert gemms and len(asked) == (len(gemms) if outweigh else 0)
        result = lab.run(lab.network_plan(tiny.spec, "cpu", 2), weights=tiny, policy=policy)
        assert any("filters held once" in note for note in result.notes) == outweigh


def test_a_residual_add_writes_over_the_conv_output_only_it_reads():
    """ResNet-50's float32 plan: each add (with its ReLU) writes its sum over the block's last
    conv output, which nothing reads after it, so an add holds two activations of its block
    (the conv's output and the shortcut), not three. At layer1.0's add those are the largest:
    the arena is 2.25 of them (three before), the rest the block's 1x1 and 3x3 outputs."""
    w = random_weights("resnet50")
    net = Network(w, lab.network_plan(w.spec, "cpu", 1))
    adds = [j for j, s in enumerate(net.steps) if s.adds_kept]
    assert len(adds) == 16
    for j in adds:
        conv = net.steps[j - 1]
        assert conv.label.endswith("conv3") and net.steps[j].elementwise
        assert np.shares_memory(net.steps[j].output, conv.output), conv.label
    largest = max(s.output.nbytes for s in net.steps)
    assert net.steps[0].output.base.nbytes <= 2.25 * largest
    x = lab.load_input(w.spec, 1)
    want = reference.forward(w.folded, x, dtype=np.float64)
    np.testing.assert_allclose(net.forward(x), want, rtol=1e-3, atol=1e-5)


def test_the_arena_places_no_two_live_buffers_on_the_same_bytes():
    """arena_offsets where handing whole buffers from step to step wastes memory: there, the
    last step's 1000 bytes fit in none of the freed 400-byte buffers and the pass held 1500.
    Every placement is aligned and overlaps no buffer alive with it, and the arena is the
    largest live set (the last step's 1000 beside the 100 it reads), aligned."""
    sizes = [400, 100, 400, 100, 400, 100, 1000]
    lives = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6), (6, 6)]
    offsets, total = arena_offsets(sizes, lives)
    for a in range(len(sizes)):
        assert offsets[a] % ARENA_ALIGNMENT == 0
        for b in range(a):
            alive_together = lives[a][0] <= lives[b][1] and lives[b][0] <= lives[a][1]
            apart = (offsets[a] + sizes[a] <= offsets[b] or offsets[b] + sizes[b] <= offsets[a])
            assert apart or not alive_together, (a, b)
    assert total == 2 * ARENA_ALIGNMENT + 100
    assert arena_offsets([], []) == ([], 1)


@pytest.mark.parametrize("name", ["resnet50", "vgg16"])
def test_the_big_networks_plan_with_unique_step_labels(name):
    w = random_weights(name)
    net = Network(w, lab.network_plan(w.spec, "cpu", 1))
    labels = [s.label for s in net.steps]
    assert len(labels) == len(set(labels)) and "#" not in "".join(labels)


class Half:
    layout = "nhwc"

    @staticmethod
    def input_dtype():
        return np.dtype(np.float16)


class Bf16:
    layout = "nhwc"

    @staticmethod
    def input_dtype():
        return np.dtype(np.uint16)


def test_16_bit_activations_pass_keep_but_not_a_swap_or_an_add():
    """An activation kept for a shortcut may be written 16-bit for the conv that reads it next
    (the add reads it as it is). What a Swap keeps goes to the add: whether that is 16-bit is
    not half_next's to say but shortcut_as_half's. The type is the next conv's: fp16, or bf16
    bits for a bf16 conv; a float32 reader gets float32."""
    from convlab.kernels import VARIANTS

    conv = Conv("c", 4, 4, 1)
    assert half_next((Keep(), conv), 0, "nhwc", lambda layer: Half) == np.float16
    assert half_next((Keep(), conv), 0, "nhwc", lambda layer: Bf16) == np.uint16
    assert half_next((Swap(), conv), 0, "nhwc", lambda layer: Half) is None
    assert half_next((AddKept(), ReLU(), conv), 0, "nhwc", lambda layer: Half) is None
    tf32 = VARIANTS["wgmma"]
    assert half_next((conv,), 0, "nhwc", lambda layer: tf32) is None


def test_a_layout_conversion_reads_bf16_bits_as_their_values():
    """A kept activation in the other layout is converted to float32 before an add (a fallback
    of that layout ran the conv that adds it): bf16 bits convert as the values they hold."""
    from convlab.kernels.igemm.packing import to_bf16_bits
    from convlab.net.network import convert
    from convlab.shapes import is_channels_last

    x = np.random.default_rng(1).standard_normal((2, 3, 4, 5)).astype(np.float32)
    bits = to_bf16_bits(x)
    exact = (bits.astype(np.uint32) << 16).view(np.float32)
    for layout in ("nchw", "nhwc"):
        got = convert(np, bits, layout)
        assert got.dtype == np.float32 and np.array_equal(got, exact)
        assert is_channels_last(got) == (layout == "nhwc")


def test_a_shortcut_conv_writes_16_bit_where_the_block_input_was_kept_so():
    """The conv whose output a Swap puts in the block input's place holds it as that input is
    held: fp16 or bf16 bits channels-last in a 16-bit network (half the bytes the add reads),
    float32 where the block input is float32 or the conv writes NCHW."""
    half, bf16 = np.dtype(np.float16), np.dtype(np.uint16)
    assert shortcut_as_half(("nhwc", half), "nhwc") == half
    assert shortcut_as_half(("nhwc", bf16), "nhwc") == bf16
    assert shortcut_as_half(("nhwc", np.dtype(np.float32)), "nhwc") is None
    assert shortcut_as_half(("nchw", half), "nhwc") is None
    assert shortcut_as_half(("nhwc", half), "nchw") is None
    assert shortcut_as_half(None, "nhwc") is None


# --- PyTorch state dicts, read without PyTorch ------------------------------------------------

def _pickled_state_dict(arrays: dict, extra_global: str | None = None,
                        sizes: dict | None = None) -> tuple[bytes, dict]:
    """data.pkl as torch.save writes it (protocol 2: an OrderedDict of _rebuild_tensor_v2 calls
    on persistent storages), and the storages' bytes by key, written opcode by opcode."""
    out = io.BytesIO()
    w = out.write

    def text(s: str):
        data = s.encode()
        w(b"X" + struct.pack("<I", len(data)) + data)

    def integer(n: int):
        w(b"J" + struct.pack("<i", n))

    def ints(values):
        w(b"(")
        for v in values:
            integer(v)
        w(b"t")

    w(b"\x80\x02")
    w(b"ccollections\nOrderedDict\nq\x00)R")
    w(b"(")
    storages = {}
    for i, (key, value) in enumerate(arrays.items()):
        key_id = str(i)
        storages[key_id] = np.ascontiguousarray(value, dtype="<f4").tobytes()
        text(key)
        w(b"ctorch._utils\n_rebuild_tensor_v2\n(")
        w(b"(")
        text("storage")
        w(b"ctorch\nFloatStorage\n")
        text(key_id)
        text("cpu")
        integer(value.size)
        w(b"tQ")
        integer(0)
        size = (sizes or {}).get(key, value.shape)
        ints(size)
        ints([int(np.prod(size[k + 1:])) for k in range(len(size))])
        w(b"\x89")
        w(b"ccollections\nOrderedDict\n)R")
        w(b"tR")
    w(b"u")
    if extra_global:
        module, name = extra_global.rsplit(".", 1)
        w(b"0c" + module.encode() + b"\n" + name.encode() + b"\n0")
    w(b".")
    return out.getvalue(), storages


def write_state_dict(path, arrays: dict, extra_global: str | None = None, sizes=None):
    pickled, storages = _pickled_state_dict(arrays, extra_global, sizes)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", pickled)
        z.writestr("archive/version", "3\n")
        for key, data in storages.items():
            z.writestr(f"archive/data/{key}", data)


def test_a_state_dict_is_read_as_torch_save_wrote_it(tmp_path, rng):
    arrays = {"a.weight": rng.standard_normal((3, 2, 1, 2)).astype(np.float32),
              "a.bias": rng.standard_normal(3).astype(np.float32)}
    write_state_dict(tmp_path / "s.pth", arrays)
    got = state_dict.read_state_dict(tmp_path / "s.pth")
    assert set(got) == set(arrays)
    for key in arrays:
        np.testing.assert_array_equal(got[key], arrays[key])


def test_a_state_dict_that_asks_for_other_code_is_refused(tmp_path, rng):
    write_state_dict(tmp_path / "s.pth", {"a": np.zeros(2, np.float32)}, "os.system")
    with pytest.raises(DataError, match="asks for os.system"):
        state_dict.read_state_dict(tmp_path / "s.pth")


def test_a_tensor_reaching_past_its_storage_is_refused_unread(tmp_path):
    """A file's sizes and strides are only numbers: as_strided read whatever memory lay past
    the storage (4 MiB of it for a 4-float storage sized 2^20; a segfault at 2^28)."""
    write_state_dict(tmp_path / "s.pth", {"a": np.zeros(4, np.float32)}, sizes={"a": (2 ** 20,)})
    with pytest.raises(DataError, match="reaches past its storage of 4"):
        state_dict.read_state_dict(tmp_path / "s.pth")


def test_a_legacy_state_dict_is_told_how_to_save_it_again(tmp_path):
    (tmp_path / "old.pth").write_bytes(b"\x80\x02\x8a\nl\xfc\x9cF\xf9 j\xa8P\x19.")
    with pytest.raises(DataError, match=r"legacy format .* torch.save\(torch.load\(OLD\), NEW\)"):
        state_dict.read_state_dict(tmp_path / "old.pth")


def resnet_state(tmp_path, change=None) -> "object":
    arrays = dict(random_weights("resnet50").arrays)
    arrays["bn1.num_batches_tracked"] = np.zeros((), np.float32)
    if change:
        change(arrays)
    path = tmp_path / "resnet50.pth"
    write_state_dict(path, arrays)
    return path


def test_import_weights_takes_a_resnet50_state_dict(tmp_path):
    source = resnet_state(tmp_path)
    result = CliRunner().invoke(main, ["import-weights", str(source), "--model", "resnet50",
                                       "--out", str(tmp_path / "r.npz")])
    assert result.exit_code == 0, result.output
    assert "resnet50" in result.output and "25,610,152 parameters" in result.output
    loaded = models.load_weights("resnet50", tmp_path / "r.npz")
    want = random_weights("resnet50").arrays
    assert set(loaded.arrays) == set(want)
    for key in want:
        np.testing.assert_array_equal(loaded.arrays[key], want[key])


@pytest.mark.parametrize("change,message", [
    (lambda a: a.pop("layer3.1.bn2.running_var"),
     "missing 'layer3.1.bn2.running_var' \\(expected shape \\(256,\\)\\)"),
    (lambda a: a.__setitem__("fc.weight", np.zeros((10, 2048), np.float32)),
     "'fc.weight' has shape \\(10, 2048\\), expected \\(1000, 2048\\)"),
    (lambda a: a.__setitem__("head.weight", np.zeros(3, np.float32)),
     "unexpected key 'head.weight'"),
    (lambda a: a["layer1.0.bn1.running_var"].__setitem__(0, -1.0),
     "'layer1.0.bn1.running_var' holds negative variances"),
    (lambda a: [a.__setitem__(k.replace("layer", "stage"), a.pop(k)) for k in list(a)
                if k.startswith("layer")],
     "not a resnet50 state dict: 260 of its 267 keys missing"),
])
def test_a_bad_state_dict_is_one_line_naming_the_key(tmp_path, change, message):
    source = resnet_state(tmp_path, change)
    result = CliRunner().invoke(main, ["import-weights", str(source), "--model", "resnet50",
                                       "--out", str(tmp_path / "r.npz")])
    assert result.exit_code != 0
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert re.search(message, result.output), result.output
    assert not (tmp_path / "r.npz").exists()


def test_a_truncated_state_dict_is_refused(tmp_path):
    source = resnet_state(tmp_path)
    data = source.read_bytes()
    source.write_bytes(data[:len(data) // 2])
    with pytest.raises(DataError, match="not a PyTorch state dict|not a readable"):
        importer.import_weights(source, tmp_path / "r.npz", "resnet50")


def test_a_state_dict_of_another_architecture_is_refused(tmp_path):
    vgg = dict(random_weights("vgg16").arrays)
    write_state_dict(tmp_path / "vgg.pth", {k: vgg[k] for k in list(vgg)[:6]})
    with pytest.raises(DataError, match="not a resnet50 state dict"):
        importer.import_weights(tmp_path / "vgg.pth", tmp_path / "r.npz", "resnet50")


def test_vgg16_runs_on_the_cpu_as_float64_does():
    w = random_weights("vgg16")
    x = lab.load_input(w.spec, 1)
    net = Network(w, lab.network_plan(w.spec, "cpu", 1))
    net.input[...] = x
    got = np.array(net.forward())
    assert np.abs(got - reference.forward(w, x, dtype=np.float64)).max() < 1e-5


def test_the_compile_budget_can_be_set_from_outside(monkeypatch):
    from convlab.errors import ConvlabError
    from convlab.net import torch_forward

    monkeypatch.delenv(torch_forward.BUDGET_ENV, raising=False)
    assert torch_forward.compile_budget_s() == torch_forward.COMPILE_BUDGET_S
    monkeypatch.setenv(torch_forward.BUDGET_ENV, "120")
    assert torch_forward.compile_budget_s() == 120
    for bad in ("0", "soon", "-5"):
        monkeypatch.setenv(torch_forward.BUDGET_ENV, bad)
        with pytest.raises(ConvlabError, match=torch_forward.BUDGET_ENV):
            torch_forward.compile_budget_s()


def test_a_state_dict_torch_wrote_is_read_alike(tmp_path):
    torch = pytest.importorskip("torch")
    arrays = {k: v for k, v in list(random_weights("resnet50").arrays.items())[:12]}
    state = {k: torch.from_numpy(v) for k, v in arrays.items()}
    state["bn1.num_batches_tracked"] = torch.tensor(7)
    state["half"] = torch.arange(6, dtype=torch.float16).reshape(2, 3).t()  # strided
    torch.save(state, tmp_path / "s.pth")
    got = state_dict.read_state_dict(tmp_path / "s.pth")
    for key, value in arrays.items():
        np.testing.assert_array_equal(got[key], value)
    assert int(got["bn1.num_batches_tracked"]) == 7
    np.testing.assert_array_equal(got["half"], np.arange(6, dtype=np.float16).reshape(2, 3).T)


def test_an_fp16_output_below_the_normal_range_is_allowed_its_rounding():
    """fp16 spaces its subnormals 2^-24 apart: a residual add whose sum is 1.49e-7 stores
    1.19e-7, which a bound relative to the value alone refused (ResNet-50's fp16 adds, on an
    H100, 2026-11-28). Twice the value still fails."""
    from convlab.oracle.verify import compare
    from convlab.ops import reference_add

    x = np.array([1.0e-7, 3.0e-5, 0.25], np.float32)
    kept = np.array([0.49e-7, 1.0e-6, 0.5], np.float32)
    ref = reference_add(x.astype(np.float64), kept.astype(np.float64))
    stored = (x + kept).astype(np.float16)
    assert compare(stored, ref, "fp32").passed
    assert not compare((2 * (x + kept)).astype(np.float16), ref, "fp32").passed


def test_resnet_and_vgg_images_are_preprocessed_as_torchvision_does():
    """classify and the stream fed ResNet-50 and VGG-16 Caffe's input (BGR, 0-255, the mean
    pixel off): torchvision's weights expect RGB in [0, 1], normalised by its mean and std."""
    from convlab.net import imagenet
    from convlab.ops.ingest import normalize

    assert get_model("resnet50").preprocessing == get_model("vgg16").preprocessing == "torchvision"
    assert get_model("alexnet").preprocessing == "caffe"
    pixels = np.array([[[255, 0, 128], [10, 200, 30]], [[0, 0, 0], [255, 255, 255]]], np.uint8)
    got = normalize(pixels[None], imagenet.imagenet_transform(2, "torchvision"))[0]
    mean = np.array(imagenet.TORCHVISION_MEAN).reshape(3, 1, 1)
    std = np.array(imagenet.TORCHVISION_STD).reshape(3, 1, 1)
    want = (pixels.transpose(2, 0, 1) / 255.0 - mean) / std
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_skip_rows_of_a_batch_norm_model_join_their_layers_relu_table():
    from convlab.bench.compare import _natural_epilogues
    from convlab.kernels import RELU

    natural = _natural_epilogues(get_model("resnet50"))
    assert natural["layer1.0.conv1"] == RELU and natural["conv1"] == RELU
    assert "layer1.0.conv3" not in natural  # an add comes before its ReLU


def test_a_run_record_says_what_memory_both_sides_held():
    """peak_bytes (ours) and each PyTorch candidate's, as an H100 run recorded them."""
    from pathlib import Path

    from convlab import report
    from convlab.bench import saved_runs

    path = (Path(__file__).parents[1] / "results" / "h100" / "resnet50-vgg16-20261128"
            / "run-resnet50-wgmma-fp16-b1-20261128T082043.json")
    (result,) = saved_runs.runs(saved_runs.load_record(path))
    assert result.peak_bytes == 132_281_344
    assert report.memory_line(result) == (
        f"{result.peak_bytes / 2 ** 20:,.0f} MiB held by our network (weights, input, "
        "buffers); PyTorch eager's peak 56 MiB")


def test_resnet50_reads_as_its_blocks():
    """`convlab models` printed ResNet-50's 195 layers one by one (over 30 lines at 80
    columns): a residual block is one item now, and a run of equal ones is counted."""
    words = get_model("resnet50").describe()
    assert words.count("residual block") == 8
    assert "5x residual block (conv 1024->256 1x1, batch-norm, ReLU" in words
    assert ("; shortcut conv 256->512 1x1 stride 2, batch-norm) + ReLU, 3x residual block"
            in words)
    assert len(words) < 1500


# --- a residual block's add and ReLU in the stores of its last conv ------------------------------

def _hopper(monkeypatch):
    from convlab.kernels import base

    monkeypatch.setattr(base, "compute_capability", lambda: None)  # judged on the shape alone


def test_a_blocks_last_conv_takes_its_add_and_relu_where_the_variant_has_them(monkeypatch):
    """wgmma in fp16, tf32 and bf16 fuses each block's add + ReLU into its last conv (the
    downsample conv adds nothing); the others, and compare (each conv timed against cuDNN's
    own), keep the add a step."""
    from convlab.kernels import ADD_RELU, RELU, VARIANTS
    from convlab.net.plan import plan_network

    _hopper(monkeypatch)
    spec = get_model("resnet50")
    for name in ("wgmma-fp16", "wgmma", "wgmma-bf16"):
        plan = plan_network(spec, VARIANTS[name], 2)
        fused = {n for n, d in plan.convs.items() if d.epilogue == ADD_RELU}
        assert fused == {f"layer{s}.{b}.conv3" for s, blocks in zip((1, 2, 3, 4), (3, 4, 6, 3))
                         for b in range(blocks)}
        d = plan.convs["layer1.0.conv3"]
        assert d.absorbed == 2 and d.lone_epilogue is None
        assert plan.convs["layer1.0.downsample.0"].epilogue is None
        assert plan.convs["layer1.0.conv1"].lone_epilogue == RELU
    # NCHW variants have no such epilogue; 3xTF32's stores go an element at a time, and the
    # grid schedule's staged store (channels-last) has no read-ahead: the add is cheaper apart;
    # compare times each conv against cuDNN's alone
    for name, fuse in (("register-tiled", True), ("wgmma-3xtf32", True),
                       ("wgmma-split-bf16", True), ("channels-last-fp16", True),
                       ("wgmma-fp16", False)):
        assert not any(d.epilogue == ADD_RELU for d in plan_network(
            spec, VARIANTS[name], 2, fuse_adds=fuse).convs.values()), name


def test_the_add_relu_epilogue_compiles_its_switches(monkeypatch):
    """The kept activation's type follows `adding`; the epilogue applies the ReLU after the add;
    a variant's copies (configured, writing) keep what they add."""
    from convlab.gpu.elements import FLOAT16
    from convlab.kernels import ADD_RELU, VARIANTS
    from convlab.shapes import ConvShape

    _hopper(monkeypatch)
    shape = ConvShape(2, 64, 14, 14, 256, 1, bias=True)
    v = VARIANTS["wgmma-fp16"].writing(FLOAT16).adding(FLOAT16)
    d = v.defines(shape, ADD_RELU)
    assert (d["ADD_KEPT"], d["KEPT_HALF"], d["RELU"], d["OUT_HALF"]) == (1, 1, 1, 1)
    assert v.configured(v.config_for(shape, ADD_RELU)).kept_dtype == FLOAT16
    assert VARIANTS["wgmma-fp16"].adding(FLOAT16).writing(FLOAT16).kept_dtype == FLOAT16
    plain = VARIANTS["wgmma"].defines(shape, None)
    assert (plain["ADD_KEPT"], plain["KEPT_HALF"], plain["RELU"]) == (0, 0, 0)
    assert not VARIANTS["pipelined"].supports_epilogue(shape, ADD_RELU)
    with pytest.raises(ValueError, match="add-relu epilogue adds"):
        VARIANTS["wgmma"].adding(np.float64)


def test_an_add_relu_op_refuses_to_launch_without_what_it_adds():
    from convlab.errors import ConvlabError
    from convlab.kernels import ADD_RELU, RELU, Op

    calls = []
    op = Op(lambda x, y, kept=None: calls.append(kept), (1, 1, 1, 1), epilogue=ADD_RELU)
    with pytest.raises(ConvlabError, match="set op.kept"):
        op(None, None)
    op.kept = "kept"
    op(None, None)
    Op(lambda x, y: calls.append("plain"), (1, 1, 1, 1), epilogue=RELU)(None, None)
    assert calls == ["kept", "plain"]


def test_a_residual_adds_conv_takes_no_tunings_and_ranks_with_its_kept_read(monkeypatch):
    """A block's last conv with the add in its stores does not take the plain conv's tuning
    (on an H200 the plain conv's best, 128x256, ran 1.23-1.34x slower fused than 128x128) and
    is not autotuned (a lone launch has no kept activation): its own choice ranks the tilings
    with the kept read, which favours a store whose kept loads fit the read-ahead ring."""
    from dataclasses import replace
    from unittest import mock

    from convlab import tuning
    from convlab.gpu.elements import FLOAT16
    from convlab.kernels import ADD_RELU, RELU, VARIANTS, base, takes_tunings
    from convlab.kernels.igemm import wgmma as model
    from convlab.kernels.igemm.tiling import Tiling
    from convlab.shapes import ConvShape

    assert not takes_tunings(ADD_RELU)
    assert all(takes_tunings(e) for e in (None, RELU, "tanh-pool"))
    expansion = ConvShape(128, 64, 56, 56, 256, 1, bias=True)
    with mock.patch.object(base, "compute_capability", lambda: None):
        variant = VARIANTS["wgmma-fp16"].writing(FLOAT16).adding(FLOAT16)
        plain = variant.configs(expansion)[0]
        tuned = dict(plain.as_dict(), stages=3)
        monkeypatch.setattr(tuning, "find", lambda v, s, e=None: (tuned, tuning.Choice.SHIPPED))
        assert variant.resolve(expansion, RELU) == (Tiling.of(tuned), tuning.Choice.SHIPPED)
        fused, choice = variant.resolve(expansion, ADD_RELU)
    assert choice == tuning.Choice.OWN and fused == variant.configs(expansion, ADD_RELU)[0]
    assert plain.bn == 256 and fused.bn <= 128
    assert model.kept_rounds(plain) == 2 and model.kept_rounds(fused) == 1
    assert model.kept_rounds(replace(fused, schedule="grid")) == 2
    with mock.patch.object(base, "compute_capability", lambda: None):
        # float32 output goes 16 bytes at a time too: ranked with its kept read (on an H200
        # tf32's 128x256 took 1.82x 128x128's time fused, 0.97x alone)
        floats = VARIANTS["wgmma"].configs(expansion, ADD_RELU)[0]
        assert VARIANTS["wgmma"].configs(expansion)[0].bn == 256 and floats.bn <= 128
        # 3xTF32 stores elements, whose kept read was not measured: ranked as plain
        elements = VARIANTS["wgmma-3xtf32"]
        assert elements.configs(expansion, ADD_RELU) == elements.configs(expansion)


def test_only_tf32_rounds_its_output_for_the_next_convs_wgmma(monkeypatch):
    """tf32's output is stored rounded to TF32 (OUT_TF32): the next tf32 wgmma would drop the
    low bits of a float32 operand, toward zero. 3xTF32 and the 16-bit maths keep float32."""
    from convlab.kernels import VARIANTS
    from convlab.shapes import ConvShape

    _hopper(monkeypatch)
    shape = ConvShape(2, 64, 14, 14, 256, 1, bias=True)
    assert VARIANTS["wgmma"].defines(shape, "relu")["OUT_TF32"] == 1
    for name in ("wgmma-3xtf32", "wgmma-split-bf16", "wgmma-fp16", "wgmma-bf16", "channels-last"):
        assert "OUT_TF32" not in VARIANTS[name].defines(shape, "relu"), name


def test_the_16_byte_store_takes_float32_adds_of_every_maths_but_3xtf32():
    """fp16 output needs fp16 maths and 8 channels on 16 bytes; float32 output 4, and any maths
    but 3xTF32's, whose two accumulator sets leave no registers for the kept read-ahead."""
    from convlab.kernels.igemm.wgmma import stores_vectors
    from convlab.shapes import ConvShape

    def shape(m, groups=1):
        return ConvShape(2, 8 * groups, 7, 7, m, 1, groups=groups)

    f16, f32 = np.float16, np.float32
    assert stores_vectors(shape(64), "fp16", f16) and not stores_vectors(shape(64), "tf32", f16)
    assert all(stores_vectors(shape(36), maths, f32) for maths in ("tf32", "fp16", "bf16"))
    assert not stores_vectors(shape(36), "fp16", f16)  # 36 fp16 channels: 72 bytes
    assert not stores_vectors(shape(64), "3xtf32", f32)
    assert not stores_vectors(shape(66), "tf32", f32)
    assert not stores_vectors(shape(24, groups=4), "tf32", f32)  # 6 channels a group
    assert stores_vectors(shape(32, groups=4), "tf32", f32)


def test_the_register_store_skips_its_16_byte_n_blocks_by_a_compile_time_count():
    """The element loop skips the n-blocks the 16-byte path stored by a constant beside the
    run-time alignment check: as one run-time count (`vector ? n : 0`) ptxas built fp16's plain
    128x256 conv 1.37x slower on an H200 (2026-11-28), with the same PTX but for one branch."""
    from convlab.kernels import VARIANTS

    source = VARIANTS["wgmma-fp16"].writing(np.float16).source
    assert "constexpr int vector_blocks = !VECTOR_STORE ? 0 : OUT_HALF ? NF - NF % 2 : NF;" in source
    # one store for both warp-specialised schedules (igemm.epilogue.store_registers_nhwc)
    assert source.count("if (vector && f < vector_blocks) continue;") == 2
    assert "const int vector_blocks" not in source


@pytest.mark.slow
def test_the_float32_add_relu_store_builds_its_16_byte_path_without_spills(monkeypatch):
    """The float32 add-relu store's 16-byte path (persistent's VECTOR_STORE) is what the
    kernel compiles for tf32 maths and for fp16 maths writing float32, at the widest tiling,
    with float32 and fp16 kept, and no register spills beside the accumulators; 3xTF32 keeps
    the element stores."""
    from convlab.gpu import jit
    from convlab.kernels import ADD_RELU, VARIANTS
    from convlab.kernels.igemm import wgmma
    from convlab.kernels.igemm.tiling import Tiling
    from convlab.shapes import ConvShape

    _hopper(monkeypatch)
    shape = ConvShape(4, 64, 14, 14, 256, 1, bias=True)
    probe = '\nstatic_assert(!(VECTOR_STORE && !OUT_HALF), "float32 16-byte store");\n'
    for name, kept, vector in (("wgmma", np.float32, True), ("wgmma-fp16", np.float16, True),
                               ("wgmma-3xtf32", np.float32, False)):
        v = VARIANTS[name].adding(kept)
        bn = 128 if name == "wgmma-3xtf32" else 256
        t = Tiling(128, bn, wgmma.k_elements(v.maths), 8, 1, 3, 1, "tap", schedule="persistent")
        options = v.configured(t).compile_options(shape, ADD_RELU)
        built = jit.nvrtc_compile("wgmma.cu", v.source, options + ("-Xptxas=-v",), "sm_90a")
        assert built.cubin is not None, built.log
        spills = [int(n) for n in re.findall(r"(\d+) bytes spill stores", built.log)]
        assert spills and not any(spills), built.log
        probed = jit.nvrtc_compile("wgmma.cu", v.source + probe, options, "sm_90a")
        assert ("float32 16-byte store" in probed.log) == vector, name


def _add_relu_layer(rng):
    from convlab.bench import guard
    from convlab.oracle.verify import random_problem
    from convlab.shapes import ConvShape

    shape = ConvShape(3, 8, 9, 7, 12, 3, pad=1, bias=True)
    x, w, b = random_problem(shape, rng, signed=True)
    kept = rng.standard_normal(shape.output_shape)
    return guard.Layer(shape, w, b, "add-relu", "fp32", kept), x


def test_an_add_relu_output_is_checked_with_what_it_added(rng):
    """The reference adds the kept activation before the ReLU (its magnitude joins the bound),
    on whole images and on the edge rows; an output that left the add out fails, and the
    diagnosis says so."""
    from convlab.bench import guard
    from convlab.oracle.verify import reference_output

    layer, x = _add_relu_layer(rng)
    ref = reference_output(x, layer.weights, layer.shape, "add-relu", layer.bias, layer.kept)
    conv = reference_output(x, layer.weights, layer.shape, None, layer.bias)
    assert np.array_equal(ref.values, np.maximum(conv.values + layer.kept, 0))
    assert np.array_equal(ref.magnitude, conv.magnitude + np.abs(layer.kept))
    good = ref.values.astype(np.float32)
    assert guard.verify_output(layer, x, good, "sample", rng).passed
    assert guard.check_edge_rows(layer, x, good, rng).passed
    without = np.maximum(conv.values, 0).astype(np.float32)
    check = guard.verify_output(layer, x, without, "full", rng)
    assert not check.passed and "without the kept activation" in check.reason
    with pytest.raises(ValueError, match="kept activation of shape"):
        reference_output(x, layer.weights, layer.shape, "add-relu", layer.bias)


def test_a_batch_too_large_for_the_gpu_is_one_line_with_the_memory(monkeypatch, tiny):
    """CuPy running out of device memory while a network is built is one line naming the run,
    the allocation that failed, what convlab held and what the GPU has; the host running out
    stays Python's own MemoryError."""
    import sys
    import types

    from convlab.errors import DeviceMemoryError

    class OutOfMemoryError(MemoryError):  # as CuPy's reads
        pass

    OutOfMemoryError.__module__ = "cupy.cuda.memory"
    gib = 2 ** 30
    pool = types.SimpleNamespace(total_bytes=lambda: 70 * gib)
    cupy = types.SimpleNamespace(
        cuda=types.SimpleNamespace(runtime=types.SimpleNamespace(
            memGetInfo=lambda: (gib // 2, 80 * gib))),
        get_default_memory_pool=lambda: pool)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    plan = lab.network_plan(tiny.spec, "cpu", 2)

    def out_of_memory(*args, **kwargs):
        raise OutOfMemoryError("Out of memory allocating 12,884,901,888 bytes (allocated so "
                               "far: 75,161,927,680 bytes).")

    monkeypatch.setattr(lab, "Network", out_of_memory)
    with pytest.raises(DeviceMemoryError) as info:
        lab.run(plan, weights=tiny)
    line = str(info.value)
    assert "\n" not in line and f"{tiny.spec.name} at batch 2 with 'cpu'" in line
    assert "allocating 12,884,901,888 bytes" in line and "convlab held 70.0 GiB" in line
    assert "80.0 GiB (0.5 GiB free now)" in line and "smaller --batch" in line

    def host_out_of_memory(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr(lab, "Network", host_out_of_memory)
    with pytest.raises(MemoryError) as info:
        lab.run(plan, weights=tiny)
    assert not isinstance(info.value, DeviceMemoryError)


def test_split_k_convs_share_the_largest_workspace(monkeypatch):
    """Ops reserving split-K space under one SplitKScratch get one workspace the size of the
    largest, not the sum; one reserved after the first launch that needs more gets a larger
    one while the first stays alive (a captured graph may still point at it)."""
    import sys
    import types

    from convlab.kernels.igemm.splitk import SplitKScratch, installed_scratch, shared_split_k

    fake = types.SimpleNamespace(float32=np.float32, int32=np.int32,
                                 empty=lambda n, dtype: np.empty(n, dtype),
                                 zeros=lambda n, dtype: np.zeros(n, dtype))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    scratch = SplitKScratch()
    assert installed_scratch() is None
    with shared_split_k(scratch):
        assert installed_scratch() is scratch
        for floats, tiles in ((4096, 8), (1024, 32), (2048, 4)):
            installed_scratch().reserve(floats, tiles)
    assert installed_scratch() is None
    ws, counters = scratch.arrays()
    assert (ws.size, counters.size) == (4096, 32) and not counters.any()
    assert scratch.arrays()[0] is ws
    scratch.reserve(8192, 4)
    bigger, _ = scratch.arrays()
    assert bigger.size == 8192 and scratch._retired == [(ws, counters)]


class _CopyStaging(Staging):
    """A staging in NumPy for the cpu variant: a float32 input copied into a channels-last
    buffer (what a channels-last kernel's staging writes), counted; what the network asked
    `buffer` about, kept."""

    def __init__(self):
        self.calls = 0
        self.asked = []

    def __call__(self, x, out):
        self.calls += 1
        if out is None:
            out = channels_last(np.empty(x.shape, np.float32))
        out[...] = x
        return out

    def buffer(self, dtype, shape, layout):
        self.asked.append((np.dtype(dtype), tuple(shape), layout))
        if np.dtype(dtype) == np.float32 and dense_in("nhwc", shape, layout):
            return None
        return StagedBuffer(tuple(shape), np.dtype(np.float32), "nhwc")


def _staging_split_k_cpu():
    """The cpu variant with every conv staging its input (_CopyStaging) and the 1x1 convs
    reserving split-K space, as a channels-last tensor-core variant would."""
    from convlab.kernels.cpu import Cpu
    from convlab.kernels.igemm.splitk import installed_scratch

    class StagingCpu(Cpu):
        def prepare(self, shape, weights, epilogue=None, bias=None):
            op = super().prepare(shape, weights, epilogue, bias)
            op.stage_input = _CopyStaging()
            if shape.K == 1 and installed_scratch() is not None:
                installed_scratch().reserve(shape.M * shape.Ho * shape.Wo, 4)
                op.shares_split_k = True
            return op

    return StagingCpu()


def test_staged_inputs_and_the_split_k_workspace_live_in_the_arena(tiny, monkeypatch):
    """A conv's converted input is a view of the network's arena alive for its step alone,
    the split-K workspace one alive from the first step that splits to the last; neither
    shares a byte with a buffer alive beside it, and the pass still computes the float64
    forward, through the staging (a network's staged inputs and workspace sat outside the
    arena: VGG-16's first conv's converted images and its FC layers' workspace put tf32's
    peak 51 MiB over PyTorch eager's at batch 64 on an H200, 2026-11-28)."""
    import sys
    import types

    fake = types.SimpleNamespace(float32=np.float32, int32=np.int32,
                                 empty=lambda n, dtype: np.empty(n, dtype),
                                 zeros=lambda n, dtype: np.zeros(n, dtype))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    net = Network(tiny, lab.network_plan(tiny.spec, _staging_split_k_cpu(), 2))
    arena = net.steps[0].output.base
    last, _ = net._reads()
    convs = [j for j, s in enumerate(net.steps) if s.is_conv]
    splitting = [j for j in convs if net.steps[j].op.shares_split_k]
    assert len(convs) == 8
    assert splitting == [j for j in convs if net.steps[j].shape.K == 1] and len(splitting) == 5
    # each conv's staging was asked about its input as it arrives: float32 NCHW of its shape
    for j in convs:
        s = net.steps[j].shape
        assert net.steps[j].op.stage_input.asked == [
            (np.dtype(np.float32), (s.B, s.C, s.H, s.W), "nchw")], net.steps[j].label
    ws = net.split_k.arrays()[0]
    assert ws.base is arena and ws.size == net.split_k.floats
    with pytest.raises(RuntimeError, match="placed in an arena"):
        net.split_k.reserve(1, 1)  # its bytes are other steps' outside the splitting ones

    def alive(j):
        return [s.output for k, s in enumerate(net.steps) if k <= j <= last[k]]

    for j in convs:
        staged = net.steps[j].op._staging
        assert staged.base is arena, net.steps[j].label
        assert not any(np.shares_memory(staged, out) for out in alive(j)), net.steps[j].label
    for j in range(splitting[0], splitting[-1] + 1):
        assert not any(np.shares_memory(ws, out) for out in alive(j)), net.steps[j].label
        if j in convs:
            assert not np.shares_memory(ws, net.steps[j].op._staging), net.steps[j].label
    x = lab.load_input(tiny.spec, 2)
    want = reference.forward(tiny.folded, x, dtype=np.float64)
    np.testing.assert_allclose(net.forward(x), want, rtol=1e-3, atol=1e-5)
    for j in convs:  # each wrote its arena buffer, not one of its own
        op = net.steps[j].op
        assert op.stage_input.calls == 1 and net.steps[j].staged is op._staging
        assert net.steps[j].staged.base is arena, net.steps[j].label


def test_a_run_records_the_tiling_of_the_variant_that_prepared_each_step(tiny, monkeypatch):
    """A step's op may come from the plan's variant made to write fp16 or to add an fp16 kept
    activation, which can choose another tiling (ResNet-50's fused expansions at batch 128:
    128x128, where the plan's variant, adding float32, chooses 128x64): the run records the
    tiling of the variant that prepared the step."""
    import types

    from convlab.gpu import timer
    from convlab.net import network as network_module

    prepare_step = network_module.Network._gemm_step

    class Prepared:
        def __init__(self, base):
            self.base = base

        def __getattr__(self, name):
            return getattr(self.base, name)

        def resolve(self, shape, epilogue=None):
            return types.SimpleNamespace(as_dict=lambda: {"prepared": shape.M}), "own"

    def gemm_step(self, *args, **kwargs):
        step, used = prepare_step(self, *args, **kwargs)
        step.variant = Prepared(step.variant)
        return step, used

    monkeypatch.setattr(network_module.Network, "_gemm_step", gemm_step)
    result = lab.run(lab.network_plan(tiny.spec, "cpu", 2), weights=tiny,
                     policy=timer.TimingPolicy(warmup=1, min_runs=2, max_runs=3))
    assert result.layers and all(layer.config == {"prepared": layer.shape.M}
                                 for layer in result.layers)


def test_a_run_names_its_top1_flips_with_their_float64_margins():
    """Each image whose top-1 is not float64's is recorded with its float64 top-2 margin, and
    the batch's count of images a flip could reach (margins below twice the largest
    probability error): what the README's near-tie reading needs, per record."""
    from convlab.report import flips_text

    ref = np.array([[0.50, 0.49, 0.01], [0.1, 0.2, 0.7], [0.30, 0.36, 0.34]])
    predictions = np.array([1, 2, 2])
    flips, near = lab.top1_flips(ref, predictions, max_error=0.015)
    assert [f["image"] for f in flips] == [0, 2]
    assert np.allclose([f["margin"] for f in flips], [0.01, 0.02])
    assert near == 2  # margins 0.01 and 0.02 are below 0.03; 0.5 is not
    assert lab.top1_flips(ref, ref.argmax(axis=1), 0.015)[0] == []

    class Result:
        batch, near_ties = 3, near
        top1_flips = flips

    assert flips_text(Result) == ("their float64 top-2 margins 0.01, 0.02; 2 of 3 images have "
                                  "margins below 2 x max |p - p64|")


def test_16_bit_outputs_of_their_own_maths_store_16_bytes_at_a_time():
    """The persistent register store's 16-byte path takes fp16 and bf16 outputs of fp16 and
    bf16 maths (a bf16 network's convs and adds), float32 of any maths but 3xTF32; a 16-bit
    output of tf32 maths, or channels off 16 bytes, stores elements."""
    from convlab.kernels.igemm.wgmma import stores_vectors
    from convlab.shapes import ConvShape

    shape, odd = ConvShape(2, 64, 14, 14, 256, 1), ConvShape(2, 64, 14, 14, 260, 1)
    half, bf16 = np.dtype(np.float16), np.dtype(np.uint16)
    assert stores_vectors(shape, "bf16", bf16) and stores_vectors(shape, "fp16", half)
    assert stores_vectors(shape, "bf16", np.float32) and stores_vectors(odd, "tf32", np.float32)
    assert not stores_vectors(shape, "tf32", bf16) and not stores_vectors(shape, "tf32", half)
    assert not stores_vectors(odd, "bf16", bf16) and not stores_vectors(shape, "3xtf32",
                                                                        np.float32)
