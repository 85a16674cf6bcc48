"""CPU reference: every layer in NumPy, in float64 for verification and float32 as a baseline.

The float32 forward pass is also the `cpu` variant, the course's "CPU implementation" baseline.
Convolution is a cross-correlation (no kernel flip) over x[b][c][h][w] and k[m][c/G][p][q], as
in the course's loop nest; it is computed as patches x weights, a matrix product that NumPy
hands to BLAS. Alongside a float64 result the reference can return, in the same pass over the
patches, the magnitude sum |x*w| of each output's terms: the scale of the rounding error a
correct kernel may make there (verify.py turns it into a bound per element).
"""

from __future__ import annotations

import numpy as np

from ..models import (LRN, BatchNorm, Conv, Dense, Flatten, GlobalAvgPool, MaxPool, ReLU,
                      Softmax, Tanh, Weights, run_layers)

# Bound the patch matrix of one chunk (elements), so 10,000 images never need gigabytes at once.
_PATCH_BUDGET = 32 * 1024 * 1024


def pads(pad) -> tuple[int, int]:
    """(rows, columns) of padding from an int or a pair, as PyTorch's padding takes it."""
    return (pad, pad) if isinstance(pad, (int, np.integer)) else (int(pad[0]), int(pad[1]))


def windows(x: np.ndarray, kh: int, kw: int, stride: int = 1, pad=0,
            dilation: int = 1) -> np.ndarray:
    """Every output's input window, (B, C, Ho, Wo, Kh, Kw), a view of x zero-padded by `pad`
    (an int or (rows, columns)): the taps `dilation` pixels apart, the windows `stride`
    apart."""
    ph, pw = pads(pad)
    if ph or pw:
        x = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    span = (dilation * (kh - 1) + 1, dilation * (kw - 1) + 1)
    view = np.lib.stride_tricks.sliding_window_view(x, span, axis=(2, 3))
    return view[:, :, ::stride, ::stride, ::dilation, ::dilation]


def _conv(x, w, stride, pad, groups, bias, dtype, magnitude: bool, dilation: int = 1):
    x = np.asarray(x, dtype=dtype)
    w = np.asarray(w, dtype=dtype)
    B, C, H, W = x.shape
    M, Cg, Kh, Kw = w.shape
    if C != Cg * groups or M % groups:
        raise ValueError(f"input {x.shape}, weights {w.shape} and {groups} groups do not match")
    if bias is not None:
        bias = np.asarray(bias, dtype=dtype)
        if bias.shape != (M,):
            raise ValueError(f"bias of shape {bias.shape} for {M} output channels")
    ph, pw = pads(pad)
    Ho = (H + 2 * ph - dilation * (Kh - 1) - 1) // stride + 1
    Wo = (W + 2 * pw - dilation * (Kw - 1) - 1) // stride + 1
    Mg = M // groups
    y = np.empty((B, M, Ho, Wo), dtype=dtype)
    mag = np.empty((B, M, Ho, Wo), dtype=dtype) if magnitude else None
    chunk = max(1, _PATCH_BUDGET // max(1, Cg * Kh * Kw * Ho * Wo))
    for g in range(groups):
        wmat = w[g * Mg:(g + 1) * Mg].reshape(Mg, Cg * Kh * Kw)
        xg = x[:, g * Cg:(g + 1) * Cg]
        ms = slice(g * Mg, (g + 1) * Mg)
        for b0 in range(0, B, chunk):
            win = windows(xg[b0:b0 + chunk], Kh, Kw, stride, (ph, pw), dilation)
            n = win.shape[0]
            cols = np.ascontiguousarray(win.transpose(0, 2, 3, 1, 4, 5)).reshape(n * Ho * Wo, -1)
            out = cols @ wmat.T  # (n*Ho*Wo, Mg)
            if bias is not None:
                out += bias[ms]
            y[b0:b0 + n, ms] = out.reshape(n, Ho, Wo, Mg).transpose(0, 3, 1, 2)
            if magnitude:
                size = np.abs(cols) @ np.abs(wmat).T
                if bias is not None:
                    size += np.abs(bias[ms])
                mag[b0:b0 + n, ms] = size.reshape(n, Ho, Wo, Mg).transpose(0, 3, 1, 2)
    return y, mag


def conv2d(x: np.ndarray, w: np.ndarray, stride: int = 1, pad=0, groups: int = 1,
           bias: np.ndarray | None = None, dtype=np.float32, dilation: int = 1) -> np.ndarray:
    """y[b,m,h,v] = bias[m] + sum_{c,p,q} x[b, g*C/G + c, h*s+p*d-ph, v*s+q*d-pw] * w[m,c,p,q]
    with g = m // (M/G), (ph, pw) the padding (an int pads both alike) and d the dilation,
    computed in `dtype`."""
    return _conv(x, w, stride, pad, groups, bias, dtype, False, dilation)[0]


def conv2d_float64(x: np.ndarray, w: np.ndarray, stride: int = 1, pad=0, groups: int = 1,
                   bias: np.ndarray | None = None, dilation: int = 1) -> np.ndarray:
    """The verification reference: every product and sum in float64."""
    return conv2d(x, w, stride, pad, groups, bias, np.float64, dilation)


def conv2d_with_magnitude(x, w, stride: int = 1, pad=0, groups: int = 1, bias=None,
                          dilation: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """The float64 result and, per output, sum |x*w| over its terms (plus |bias|)."""
    return _conv(x, w, stride, pad, groups, bias, np.float64, True, dilation)


def conv_shape_args(shape) -> dict:
    """A ConvShape's stride, padding, groups and dilation as conv2d's keyword arguments."""
    return {"stride": shape.stride, "pad": (shape.pad_h, shape.pad_w), "groups": shape.groups,
            "dilation": shape.dilation}


def max_pool(x: np.ndarray, size: int, stride: int | None = None, pad: int = 0) -> np.ndarray:
    """size x size max-pool with the given stride (default: size), floor mode, `pad` rows and
    columns of -infinity around: trailing rows/columns that do not fill a window drop, as in
    Caffe, the course and PyTorch. Computed as the max of size*size strided slices (one per
    window offset): far faster in NumPy than a reduction over a window view."""
    stride = stride or size
    if pad:
        x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=-np.inf)
    Ho = (x.shape[2] - size) // stride + 1
    Wo = (x.shape[3] - size) // stride + 1
    out = None
    for p in range(size):
        for q in range(size):
            part = x[:, :, p:p + stride * (Ho - 1) + 1:stride, q:q + stride * (Wo - 1) + 1:stride]
            out = part.copy() if out is None else np.maximum(out, part, out=out)
    return out


def lrn(x: np.ndarray, size: int = 5, alpha: float = 1e-4, beta: float = 0.75,
        k: float = 1.0) -> np.ndarray:
    """Caffe's local response normalisation across channels:
    y = x / (k + alpha/size * sum of x^2 over the `size` channels centred on c)^beta,
    the window clipped at the first and last channel."""
    sq = np.square(x)
    before = (size - 1) // 2
    padded = np.pad(sq, ((0, 0), (before, size - 1 - before), (0, 0), (0, 0)))
    channels = x.shape[1]
    # The window's own `size` squares, added directly: a running sum differenced at two
    # channels would carry the rounding error of every channel before the window.
    window = sum(padded[:, i:i + channels] for i in range(size))
    return x / np.power(k + (alpha / size) * window, beta)


def batch_norm(x: np.ndarray, arrays: dict, name: str, eps: float) -> np.ndarray:
    """Inference batch norm of x (B, C, H, W) in x's dtype, with the layer's running
    statistics."""
    part = {k: np.asarray(arrays[f"{name}.{k}"], dtype=x.dtype).reshape(1, -1, 1, 1)
            for k in ("weight", "bias", "running_mean", "running_var")}
    return ((x - part["running_mean"]) / np.sqrt(part["running_var"] + x.dtype.type(eps))
            * part["weight"] + part["bias"])


def relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0)


def softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def apply_layer(layer, a: np.ndarray, arrays: dict, conv=None) -> np.ndarray:
    """One layer of the forward pass in a's dtype. `conv(layer, a, w, b)` computes conv layers
    (default: this module's conv2d in a's dtype)."""
    if isinstance(layer, Conv):
        w = arrays[f"{layer.name}.weight"]
        b = arrays.get(f"{layer.name}.bias") if layer.bias else None
        if conv is not None:
            return conv(layer, a, w, b)
        return conv2d(a, w, layer.stride, layer.pad, layer.groups, b, dtype=a.dtype)
    if isinstance(layer, Tanh):
        return np.tanh(a)
    if isinstance(layer, ReLU):
        return relu(a)
    if isinstance(layer, MaxPool):
        return max_pool(a, layer.size, layer.step, layer.pad)
    if isinstance(layer, BatchNorm):
        return batch_norm(a, arrays, layer.name, layer.eps)
    if isinstance(layer, GlobalAvgPool):
        return a.mean(axis=(2, 3))
    if isinstance(layer, LRN):
        return lrn(a, layer.size, layer.alpha, layer.beta, layer.k)
    if isinstance(layer, Flatten):
        return a.reshape(a.shape[0], -1)
    if isinstance(layer, Dense):
        w = np.asarray(arrays[f"{layer.name}.weight"], dtype=a.dtype)
        return a @ w.T + np.asarray(arrays[f"{layer.name}.bias"], dtype=a.dtype)
    if isinstance(layer, Softmax):
        return softmax(a)
    raise TypeError(f"no CPU definition for layer {layer!r}")


def forward(weights: Weights, x: np.ndarray, conv=None, dtype=np.float32) -> np.ndarray:
    """Class probabilities for network input x (N, C, S, S), every layer computed in `dtype`,
    batch norm as written (not folded).

    `conv(layer, x, w, b)` computes each conv layer; by default this module's conv2d does.
    Every other layer is the NumPy definition the GPU network's kernels are verified against.
    """
    return run_layers(weights.spec.layers, np.asarray(x, dtype=dtype),
                      lambda layer, a: apply_layer(layer, a, weights.arrays, conv))


def predict(weights: Weights, x: np.ndarray, chunk: int = 1000) -> np.ndarray:
    """Predicted classes for all of x, in chunks of images so memory stays bounded."""
    return np.concatenate([forward(weights, x[i:i + chunk]).argmax(axis=1)
                           for i in range(0, len(x), chunk)])
