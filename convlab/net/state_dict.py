"""Read a PyTorch state dict file (`torch.save(model.state_dict(), path)`, torchvision's
checkpoints) into NumPy arrays without PyTorch.

Since PyTorch 1.6 the file is a zip archive: `<name>/data.pkl` pickles the dict, each tensor as
a call of torch._utils._rebuild_tensor_v2 on a storage named by a persistent id
('storage', storage type, key, location, numel) whose bytes are `<name>/data/<key>`
(little-endian). The unpickler here resolves only those names, to NumPy, and refuses every
other global: a file that asks for anything else is refused before it can run code.
"""

from __future__ import annotations

import pickle
import zipfile
from collections import OrderedDict
from pathlib import Path

import numpy as np

from ..errors import DataError

STORAGE_DTYPES = {
    "FloatStorage": np.float32, "DoubleStorage": np.float64, "HalfStorage": np.float16,
    "LongStorage": np.int64, "IntStorage": np.int32, "ShortStorage": np.int16,
    "CharStorage": np.int8, "ByteStorage": np.uint8, "BoolStorage": np.bool_,
}
BFLOAT16 = "BFloat16Storage"  # no NumPy type: widened to float32 from its bits


def _rebuild_tensor(storage, offset, size, stride, *_):
    """The tensor's elements copied out of its storage, every one of them checked to lie inside
    it first (a file's sizes and strides are only numbers: as_strided would read anywhere)."""
    size, stride = tuple(int(n) for n in size), tuple(int(n) for n in stride)
    if (len(size) != len(stride) or offset < 0 or any(n < 0 for n in size)
            or any(s < 0 for s in stride)):
        raise pickle.UnpicklingError(f"a tensor of size {size}, stride {stride} at offset "
                                     f"{offset}")
    if 0 in size:
        return np.zeros(size, storage.dtype)
    end = offset + sum((n - 1) * s for n, s in zip(size, stride))
    if end >= len(storage):
        raise pickle.UnpicklingError(f"a tensor of size {size}, stride {stride} at offset "
                                     f"{offset} reaches past its storage of {len(storage)}")
    if not size:
        return np.array(storage[offset])
    itemsize = storage.dtype.itemsize
    return np.lib.stride_tricks.as_strided(storage[offset:], shape=size,
                                           strides=tuple(s * itemsize for s in stride)).copy()


def _rebuild_parameter(data, *_):
    return data


class _Unpickler(pickle.Unpickler):
    ALLOWED = {("collections", "OrderedDict"): OrderedDict,
               ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
               ("torch._utils", "_rebuild_parameter"): _rebuild_parameter}

    def __init__(self, file, archive: zipfile.ZipFile, prefix: str):
        super().__init__(file)
        self.archive, self.prefix = archive, prefix

    def find_class(self, module, name):
        if (module, name) in self.ALLOWED:
            return self.ALLOWED[(module, name)]
        if module == "torch" and (name in STORAGE_DTYPES or name == BFLOAT16):
            return name
        raise pickle.UnpicklingError(f"it asks for {module}.{name}, which a state dict of "
                                     "tensors does not need")

    def persistent_load(self, pid):
        kind, storage_type, key, _location, numel = pid
        if kind != "storage":
            raise pickle.UnpicklingError(f"unknown persistent id {kind!r}")
        raw = self.archive.read(f"{self.prefix}data/{key}")
        if storage_type == BFLOAT16:
            bits = np.frombuffer(raw, dtype="<u2", count=numel).astype(np.uint32) << 16
            return bits.view(np.float32)
        return np.frombuffer(raw, dtype=np.dtype(STORAGE_DTYPES[storage_type]).newbyteorder("<"),
                             count=numel)


def read_state_dict(path: Path) -> dict[str, np.ndarray]:
    """{key: array} from a PyTorch state dict file; one DataError naming the file and what is
    wrong with it otherwise."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such file")
    if not zipfile.is_zipfile(path):
        with open(path, "rb") as f:
            legacy = f.read(2) == b"\x80\x02"
        if legacy:  # PyTorch before 1.6 wrote a bare pickle stream (old torchvision files)
            raise DataError(f"{path}: a state dict in PyTorch's legacy format (before 1.6), which "
                            "convlab does not read; save it again with PyTorch 1.6 or later: "
                            "torch.save(torch.load(OLD), NEW)")
        raise DataError(f"{path}: not a PyTorch state dict (torch.save writes a zip archive; "
                        "this is not one, or it is cut short)")
    try:
        with zipfile.ZipFile(path) as archive:
            pickles = [n for n in archive.namelist() if n.endswith("/data.pkl")]
            if len(pickles) != 1:
                raise DataError(f"{path}: a zip archive without the data.pkl of a torch.save "
                                "file")
            prefix = pickles[0][:-len("data.pkl")]
            order = f"{prefix}byteorder"
            if order in archive.namelist() and archive.read(order).strip() != b"little":
                raise DataError(f"{path}: a big-endian state dict; save it again on a "
                                "little-endian machine")
            with archive.open(pickles[0]) as f:
                contents = _Unpickler(f, archive, prefix).load()
    except DataError:
        raise
    except (pickle.UnpicklingError, zipfile.BadZipFile, KeyError, EOFError, ValueError,
            TypeError, IndexError, OSError) as exc:
        raise DataError(f"{path}: not a readable PyTorch state dict ({type(exc).__name__}: "
                        f"{' '.join(str(exc).split())})") from None
    if isinstance(contents, dict) and isinstance(contents.get("state_dict"), dict):
        contents = contents["state_dict"]  # a training checkpoint that holds one
    if not isinstance(contents, dict) or not all(
            isinstance(v, np.ndarray) for v in contents.values()):
        raise DataError(f"{path}: holds a {type(contents).__name__}, not a state dict of "
                        "tensors")
    return dict(contents)
