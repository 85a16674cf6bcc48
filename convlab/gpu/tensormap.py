"""Tensor maps for Hopper's copy engine (TMA): the 128-byte descriptor `cp.async.bulk.tensor`
reads, here in im2col mode over a channels-last input, so that one instruction brings a
convolution's B tile (BN output pixels x BK channels of one filter tap) into shared memory.

The CUDA driver encodes a map (cuTensorMapEncodeIm2col) on the host. CuPy does not wrap it;
NVIDIA's cuda-bindings does, but its driver module resolves every entry point on first use, and
where the driver is older than the bindings some of those lookups fail (cuGetProcAddress_v2:
CUDA_ERROR_INVALID_VALUE, driver 580 under cuda-bindings 13.3 on an H100, 2026-11-28), which
compute-sanitizer's memcheck reports as API errors in every run of a "tma" gather: so the one
call goes through ctypes. A launch passes the map by value, as a __grid_constant__ parameter (CuPy
copies the bytes a CPointer names), so it costs no device copy and a CUDA graph can hold it.
`Im2colMaps` keeps one encoded map per input address an op is launched on.

The map's geometry, as CUTLASS's sm90 implicit-GEMM convolutions set it: the box walks the
windows' top-left corners from (-pad_w, -pad_h) to (W + pad_w - d(Kw - 1) - 1, H + pad_h -
d(Kh - 1) - 1) in steps of the stride (the corners -pad and pad - d(K - 1) from the tensor's
edges, d the dilation), then the next image; a copy names the first window's corner and adds
the tap's offset (q, p), its column and row times the dilation, to every pixel it reads, with
zeros outside the tensor."""

import ctypes
from functools import lru_cache

import numpy as np

from ..errors import ConvlabError
from ..shapes import ConvShape

MAP_BYTES = 128
# CUtensorMapDataType, CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill
DATA_TYPES = {np.dtype(np.float16): 6, np.dtype(np.float32): 7, np.dtype(np.uint16): 9}
SWIZZLE_128B = 3
L2_PROMOTION_128B = 2
OOB_FILL_ZEROS = 0
# cuTensorMapEncodeIm2col's limits for a 4-D (NHWC) tensor: corners in [-128, 127], at most
# 8 between traversed pixels, 256 channels a pixel.
CORNER_LIMIT = 128
MAX_TRAVERSAL_STRIDE = 8
MAX_CHANNELS = 256
# Maps an op keeps (one per input address it was launched on) before it starts afresh.
MAX_MAPS = 64


def corners(shape: ConvShape) -> tuple[tuple[int, int], tuple[int, int]]:
    """The box's lower and upper corners, each (along W, along H)."""
    lower = (-shape.pad_w, -shape.pad_h)
    upper = (shape.pad_w - shape.dilation * (shape.Kw - 1),
             shape.pad_h - shape.dilation * (shape.Kh - 1))
    return lower, upper


def im2col_problem(shape: ConvShape, channels: int, element_bytes: int) -> str:
    """Why an im2col map cannot bring `channels` channels of one group of the (channel-padded)
    layer at a time, or "". A layer of one group may have fewer, or a last box past its
    channels: the copy engine fills the box's channels past the tensor's with zeros, as the
    filters are zero there, and reads only the pixels' own bytes."""
    if shape.Cg % channels and shape.groups > 1:
        return (f"gather 'tma' copies {channels} channels at a time: a group's {shape.Cg} "
                f"channels must be a multiple (a box past them would read the next group's)")
    if shape.C * element_bytes % 16:
        return (f"the copy engine steps from pixel to pixel in multiples of 16 bytes: "
                f"{shape.C} channels of {element_bytes} bytes are not")
    if channels > MAX_CHANNELS:
        return f"the copy engine's im2col mode reads at most {MAX_CHANNELS} channels a pixel"
    lower, upper = corners(shape)
    if not all(-CORNER_LIMIT <= c < CORNER_LIMIT for c in lower + upper):
        return (f"padding {shape.padding_text()} and a {shape.kernel_text()} filter (dilation "
                f"{shape.dilation}) put the im2col box's corners {lower}, {upper} outside the "
                f"copy engine's [-128, 127]")
    if shape.stride > MAX_TRAVERSAL_STRIDE:
        return f"the copy engine's im2col mode steps at most {MAX_TRAVERSAL_STRIDE} pixels"
    return ""


@lru_cache(maxsize=1)
def _encoder():
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise ConvlabError(f"the CUDA driver (libcuda.so.1) could not be loaded: {exc}") from exc
    encode = driver.cuTensorMapEncodeIm2col
    u32, u64, i32 = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int
    encode.restype = ctypes.c_int
    encode.argtypes = [ctypes.c_void_p, i32, u32, ctypes.c_void_p, ctypes.POINTER(u64),
                       ctypes.POINTER(u64), ctypes.POINTER(i32), ctypes.POINTER(i32), u32, u32,
                       ctypes.POINTER(u32), i32, i32, i32, i32]
    return encode


def im2col_map(address: int, dtype, shape: ConvShape, channels: int, pixels: int) -> np.ndarray:
    """The encoded map (uint8[128]) of the NHWC input at `address` (dtype elements, `shape`'s
    B, H, W and C): boxes of `pixels` output pixels x `channels` channels, 128-byte swizzled."""
    dtype = np.dtype(dtype)
    e = dtype.itemsize
    dims = (ctypes.c_uint64 * 4)(shape.C, shape.W, shape.H, shape.B)
    strides = (ctypes.c_uint64 * 3)(shape.C * e, shape.W * shape.C * e,
                                    shape.H * shape.W * shape.C * e)
    lower, upper = corners(shape)
    lows = (ctypes.c_int * 2)(*lower)
    highs = (ctypes.c_int * 2)(*upper)
    steps = (ctypes.c_uint32 * 4)(1, shape.stride, shape.stride, 1)
    out = np.zeros(MAP_BYTES + 64, dtype=np.uint8)
    at = -out.ctypes.data % 64  # the driver writes to a 64-byte-aligned map
    result = _encoder()(out.ctypes.data + at, DATA_TYPES[dtype], 4, address, dims, strides,
                        lows, highs, channels, pixels, steps, 0, SWIZZLE_128B,
                        L2_PROMOTION_128B, OOB_FILL_ZEROS)
    if result != 0:
        raise ConvlabError(f"cuTensorMapEncodeIm2col failed (CUresult {result}) for {shape}, "
                           f"{channels} channels x {pixels} pixels of {dtype}")
    return out[at:at + MAP_BYTES].copy()


def address_problem(x) -> str:
    """Why the copy engine cannot read the array x, or "" (its pixel strides follow from the
    layer's shape: the launch checks that x is densely channels-last)."""
    if x.data.ptr % 16:
        return (f"the copy engine reads an input that starts on 16 bytes; this one starts "
                f"{x.data.ptr % 16} bytes past (pass a fresh array, or op.stage(x))")
    return ""


class Im2colMaps:
    """x -> the launch argument carrying x's im2col map, for one op's layer and tile: encoded
    the first time an address comes (a timing loop or a network's buffers reuse a few), then
    looked up."""

    def __init__(self, dtype, shape: ConvShape, channels: int, pixels: int):
        from cupy.cuda.function import CPointer

        self.pointer = CPointer
        self.args = (dtype, shape, channels, pixels)
        self.maps: dict[int, tuple] = {}

    def __call__(self, x):
        found = self.maps.get(x.data.ptr)
        if found is None:
            problem = address_problem(x)
            if problem:
                raise ConvlabError(problem)
            if len(self.maps) >= MAX_MAPS:
                self.maps.clear()
            encoded = im2col_map(x.data.ptr, *self.args)
            found = (encoded, self.pointer(encoded.ctypes.data))  # encoded keeps the bytes
            self.maps[x.data.ptr] = found
        return found[1]
