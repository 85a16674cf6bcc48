"""Import published weights into convlab's layout: AlexNet's bvlc_alexnet.npy, and PyTorch
state dicts (torchvision's resnet50 and vgg16 checkpoints, or any with their keys).

A state dict needs no conversion: the models name their layers as torchvision does and store
OIHW convs, (out, in) FCs and batch norm's four vectors as PyTorch does; it is checked key by
key (every parameter present with its shape, nothing else but batch norm's
num_batches_tracked) and stored as float32.

The file the TensorFlow AlexNet ports use came out of the "caffe-tensorflow" conversion of
Caffe's bvlc_alexnet: a NumPy .npy holding one pickled dict, `{layer: [weights, biases]}` for
conv1..conv5 and fc6..fc8. It stores everything channel-last:

- conv weights HWIO (height, width, in, out); the grouped layers (conv2, conv4, conv5) hold the
  input depth of one group, and output channel m reads the input channels of group m // (M/G),
  which is convlab's grouping too, so a transpose to OIHW is the whole conversion;
- FC weights (in, out); fc6's rows follow a channel-last flatten of the 6x6x256 pool5 output
  (row = (h*6 + w)*256 + c), while convlab flattens channel-first (column = (c*6 + h)*6 + w),
  so fc6's columns are reordered as well as transposed.

Loading a pickle runs code the file chooses, so only import a file from a source you trust.
The .npy header is read first: a file that does not declare an object array never reaches the
unpickler.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from ..errors import ConvlabError, DataError
from ..models import (IMAGENET, MODELS, WEIGHTS_FORMAT, Conv, Dense, Flatten, ModelSpec, Weights,
                      get_model, save_weights)
from .state_dict import read_state_dict

MODEL = "alexnet"
CONVERSION = ("conv weights HWIO -> OIHW (transpose 3,2,0,1); FC weights (in, out) -> (out, in); "
              "fc6 columns reordered from the channel-last (HWC) flatten of pool5 to the "
              "channel-first (CHW) one; float32")


def published_shapes(spec: ModelSpec) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    """(weights shape, biases shape) of every layer as the published file stores it."""
    shapes = {}
    for layer in spec.layers:
        if isinstance(layer, Conv):
            shapes[layer.name] = ((layer.kernel, layer.kernel, layer.in_channels // layer.groups,
                                   layer.out_channels), (layer.out_channels,))
        elif isinstance(layer, Dense):
            shapes[layer.name] = ((layer.in_features, layer.out_features), (layer.out_features,))
    return shapes


def _flattened_maps(spec: ModelSpec) -> dict[str, tuple[int, int, int]]:
    """For each Dense layer right after a Flatten: the (C, H, W) activation it flattens."""
    maps = {}
    steps = spec.trace(1)
    for (layer, before, _), (following, _, _) in zip(steps, steps[1:]):
        if isinstance(layer, Flatten) and isinstance(following, Dense) and len(before) == 4:
            maps[following.name] = tuple(before[1:])
    return maps


def _npy_header(path: Path):
    """(shape, fortran_order, dtype) from the .npy header, without reading the data."""
    try:
        with open(path, "rb") as f:
            try:
                version = np.lib.format.read_magic(f)
            except ValueError:
                f.seek(0)
                what = ("a zip archive such as a .npz" if f.read(4) == b"PK\x03\x04"
                        else "not a NumPy .npy file")
                raise DataError(f"{path}: {what} (no .npy header); expected the published "
                                "bvlc_alexnet.npy") from None
            try:
                if version == (1, 0):
                    return np.lib.format.read_array_header_1_0(f)
                if version == (2, 0):
                    return np.lib.format.read_array_header_2_0(f)
            except Exception as exc:  # NumPy parses the header with tokenize and ast: any error
                detail = " ".join(str(exc).split())
                raise DataError(f"{path}: corrupt .npy header ({type(exc).__name__}: {detail})"
                                ) from None
            raise DataError(f"{path}: .npy format version {version[0]}.{version[1]} is not one "
                            "the published weights use (1.0 or 2.0)")
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a directory, not a .npy file") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror or exc})") from None


def read_published(path: Path) -> dict:
    """The pickled `{layer: [weights, biases]}` dict of a bvlc_alexnet.npy, unchecked.

    Unpickling runs code from the file: call this only on a file you trust."""
    shape, _, dtype = _npy_header(path)
    if dtype != np.dtype(object):
        raise DataError(f"{path}: a plain {dtype} array of shape {shape}, not the pickled "
                        "{layer: [weights, biases]} dict of bvlc_alexnet.npy")
    if shape != ():
        raise DataError(f"{path}: an object array of shape {shape}, not the single pickled "
                        "dict of bvlc_alexnet.npy")
    try:
        contents = np.load(path, encoding="latin1", allow_pickle=True)
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except Exception as exc:  # a broken pickle can raise nearly anything while it is unpickled
        detail = " ".join(str(exc).split())
        raise DataError(f"{path}: the .npy header declares a pickle but the data is not a "
                        f"readable one ({type(exc).__name__}: {detail})") from None
    return contents.item()


def _checked_array(path: Path, layer: str, part: str, value, expected: tuple[int, ...]) -> np.ndarray:
    what = f"{path}: layer '{layer}' {part}"
    if not isinstance(value, np.ndarray):
        raise DataError(f"{what} are a {type(value).__name__}, expected a NumPy array of shape "
                        f"{expected}")
    if value.shape != expected:
        raise DataError(f"{what} have shape {value.shape}, expected {expected}")
    if not np.issubdtype(value.dtype, np.floating):
        raise DataError(f"{what} are {value.dtype}, expected floating point")
    bad = value.size - int(np.count_nonzero(np.isfinite(value)))
    if bad:
        raise DataError(f"{what} hold {bad} non-finite values (NaN or inf)")
    return value


def validate(path: Path, published, spec: ModelSpec) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Every layer present, no other keys, each [weights, biases] finite and of the published
    shape; returns them by layer."""
    if not isinstance(published, dict):
        raise DataError(f"{path}: the pickle holds a {type(published).__name__}, expected the "
                        "dict {layer: [weights, biases]} of bvlc_alexnet.npy")
    expected = published_shapes(spec)
    missing = [name for name in expected if name not in published]
    if missing:
        raise DataError(f"{path}: missing layer{'s' if len(missing) > 1 else ''} "
                        f"{', '.join(repr(name) for name in missing)}")
    extra = [repr(key) for key in published if key not in expected]
    if extra:
        raise DataError(f"{path}: unexpected key{'s' if len(extra) > 1 else ''} "
                        f"{', '.join(extra)} (bvlc_alexnet has layers {', '.join(expected)})")
    checked = {}
    for name, (weight_shape, bias_shape) in expected.items():
        value = published[name]
        if not isinstance(value, (list, tuple)) or len(value) != 2:
            got = (f"a {type(value).__name__} of {len(value)}" if isinstance(value, (list, tuple))
                   else f"a {type(value).__name__}")
            raise DataError(f"{path}: layer '{name}' is {got}, expected [weights, biases]")
        checked[name] = (_checked_array(path, name, "weights", value[0], weight_shape),
                         _checked_array(path, name, "biases", value[1], bias_shape))
    return checked


def convert(layers: dict[str, tuple[np.ndarray, np.ndarray]], spec: ModelSpec) -> dict[str, np.ndarray]:
    """Validated published layers -> convlab's arrays (OIHW convs, (out, in) FCs, channel-first
    flatten), float32 and C-contiguous."""
    flattened = _flattened_maps(spec)
    arrays = {}
    for layer in spec.layers:
        if not isinstance(layer, (Conv, Dense)):
            continue
        weights, biases = layers[layer.name]
        if isinstance(layer, Conv):
            ours = weights.transpose(3, 2, 0, 1)
        elif layer.name in flattened:
            C, H, W = flattened[layer.name]
            ours = weights.reshape(H, W, C, layer.out_features).transpose(3, 2, 0, 1).reshape(
                layer.out_features, layer.in_features)
        else:
            ours = weights.T
        arrays[f"{layer.name}.weight"] = np.ascontiguousarray(ours, dtype=np.float32)
        arrays[f"{layer.name}.bias"] = np.ascontiguousarray(biases, dtype=np.float32)
    return arrays


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


STATE_DICT_EXTRA = ".num_batches_tracked"  # batch norm's training counter: not a weight


def importable_models() -> list[str]:
    return [name for name, spec in MODELS.items() if spec.task == IMAGENET]


def state_dict_arrays(path: Path, contents: dict[str, np.ndarray],
                      spec: ModelSpec) -> dict[str, np.ndarray]:
    """The model's parameters from a state dict, float32: every key of the model present with
    its shape and finite, no other key; one DataError naming the key and the shape otherwise."""
    expected = spec.parameter_shapes()
    extra = [k for k in contents if k not in expected and not k.endswith(STATE_DICT_EXTRA)]
    missing = [k for k in expected if k not in contents]
    if missing and extra:
        raise DataError(f"{path}: not a {spec.name} state dict: {len(missing)} of its "
                        f"{len(expected)} keys missing (first '{missing[0]}', shape "
                        f"{expected[missing[0]]}) and {len(extra)} keys it does not have "
                        f"(first '{extra[0]}')")
    if missing:
        raise DataError(f"{path}: missing '{missing[0]}' (expected shape {expected[missing[0]]})"
                        + (f" and {len(missing) - 1} more keys" if len(missing) > 1 else ""))
    if extra:
        raise DataError(f"{path}: unexpected key '{extra[0]}' (shape {contents[extra[0]].shape})"
                        f" in a {spec.name} state dict"
                        + (f", and {len(extra) - 1} more" if len(extra) > 1 else ""))
    arrays = {}
    for key, shape in expected.items():
        value = contents[key]
        if value.shape != shape:
            raise DataError(f"{path}: '{key}' has shape {value.shape}, expected {shape}")
        if not np.issubdtype(value.dtype, np.floating):
            raise DataError(f"{path}: '{key}' is {value.dtype}, expected floating point")
        if not np.isfinite(value).all():
            raise DataError(f"{path}: '{key}' holds non-finite values (NaN or inf)")
        if key.endswith(".running_var") and (value < 0).any():
            raise DataError(f"{path}: '{key}' holds negative variances")
        arrays[key] = np.ascontiguousarray(value, dtype=np.float32)
    return arrays


def import_weights(source: Path, out: Path, model: str = MODEL) -> Weights:
    """Convert the published weights of `model` at `source` into convlab's .npz at `out`:
    alexnet from bvlc_alexnet.npy, the others from a PyTorch state dict.

    bvlc_alexnet.npy is a pickle, and unpickling it runs code from the file: import only a file
    you trust. Its .npy header is checked first, so a plain numeric array is refused unread. A
    state dict is read with an unpickler that builds tensors and nothing else."""
    source, out = Path(source), Path(out)
    spec = get_model(model)
    if spec.task != IMAGENET:
        raise ConvlabError(f"model '{model}' has trained weights shipped; import-weights takes "
                           f"an ImageNet model: {', '.join(importable_models())}")
    if model == MODEL:
        layers = validate(source, read_published(source), spec)
        arrays, conversion = convert(layers, spec), CONVERSION
    else:
        arrays = state_dict_arrays(source, read_state_dict(source), spec)
        conversion = "PyTorch state dict, keys as torchvision names them; float32"
    meta = {"layers": spec.describe(), "source": f"imported from {source.name}",
            "source_file": source.name, "source_sha256": sha256(source), "conversion": conversion}
    try:
        save_weights(out, spec, arrays, meta)
    except OSError as exc:
        raise DataError(f"{out}: cannot write ({exc.strerror or exc})") from None
    return Weights(spec=spec, arrays=arrays, meta={"format": WEIGHTS_FORMAT, "model": model, **meta})
