"""CPU reference: a float64 convolution for verification and a vectorised float32 forward pass.

The float32 forward pass is also the `cpu` variant, the course's "CPU implementation" baseline.
Convolution is a cross-correlation (no kernel flip) over x[b][c][h][w] and k[m][c][p][q], as in
the course's loop nest; it is computed as patches x weights, a matrix product that NumPy hands
to BLAS.
"""

from __future__ import annotations

import numpy as np

from .models import Conv, Dense, Flatten, MaxPool, Softmax, Tanh, Weights

# Bound the patch matrix of one chunk (elements), so 10,000 images never need gigabytes at once.
_PATCH_BUDGET = 32 * 1024 * 1024


def _patches(x: np.ndarray, k: int, stride: int, pad: int) -> np.ndarray:
    if pad:
        x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    windows = np.lib.stride_tricks.sliding_window_view(x, (k, k), axis=(2, 3))
    return windows[:, :, ::stride, ::stride]  # (B, C, Ho, Wo, K, K), a view


def conv2d(x: np.ndarray, w: np.ndarray, stride: int = 1, pad: int = 0,
           dtype=np.float32) -> np.ndarray:
    """y[b,m,h,v] = sum_{c,p,q} x[b,c,h*s+p-pad,v*s+q-pad] * w[m,c,p,q], computed in `dtype`."""
    x = np.asarray(x, dtype=dtype)
    w = np.asarray(w, dtype=dtype)
    B, C, H, W = x.shape
    M, Cw, K, K2 = w.shape
    if C != Cw or K != K2:
        raise ValueError(f"input {x.shape} and weights {w.shape} do not match")
    Ho = (H + 2 * pad - K) // stride + 1
    Wo = (W + 2 * pad - K) // stride + 1
    y = np.empty((B, M, Ho, Wo), dtype=dtype)
    wmat = w.reshape(M, C * K * K)
    chunk = max(1, _PATCH_BUDGET // max(1, C * K * K * Ho * Wo))
    for b0 in range(0, B, chunk):
        win = _patches(x[b0:b0 + chunk], K, stride, pad)
        n = win.shape[0]
        cols = np.ascontiguousarray(win.transpose(0, 2, 3, 1, 4, 5)).reshape(n * Ho * Wo, C * K * K)
        out = cols @ wmat.T  # (n*Ho*Wo, M)
        y[b0:b0 + n] = out.reshape(n, Ho, Wo, M).transpose(0, 3, 1, 2)
    return y


def conv2d_float64(x: np.ndarray, w: np.ndarray, stride: int = 1, pad: int = 0) -> np.ndarray:
    """The verification reference: every product and sum in float64."""
    return conv2d(x, w, stride, pad, dtype=np.float64)


def max_pool(x: np.ndarray, size: int) -> np.ndarray:
    """Non-overlapping size x size max-pool; trailing rows/columns that do not fill a window drop."""
    B, C, H, W = x.shape
    Hp, Wp = H // size, W // size
    x = x[:, :, :Hp * size, :Wp * size]
    return x.reshape(B, C, Hp, size, Wp, size).max(axis=(3, 5))


def softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def forward(weights: Weights, x: np.ndarray, conv=None) -> np.ndarray:
    """Class probabilities (float32) for network input x (N, 1, S, S).

    `conv(name, x, w)` computes each conv layer; by default the float32 reference does. Every
    other layer is the NumPy definition the GPU network mirrors with CuPy.
    """
    conv = conv or (lambda name, inp, w: conv2d(inp, w))
    arrays = weights.arrays
    a = np.asarray(x, dtype=np.float32)
    for layer in weights.spec.layers:
        if isinstance(layer, Conv):
            a = conv(layer.name, a, arrays[f"{layer.name}.weight"])
        elif isinstance(layer, Tanh):
            a = np.tanh(a)
        elif isinstance(layer, MaxPool):
            a = max_pool(a, layer.size)
        elif isinstance(layer, Flatten):
            a = a.reshape(a.shape[0], -1)
        elif isinstance(layer, Dense):
            a = a @ arrays[f"{layer.name}.weight"].T + arrays[f"{layer.name}.bias"]
        elif isinstance(layer, Softmax):
            a = softmax(a)
        else:
            raise TypeError(f"no CPU definition for layer {layer!r}")
    return a


def predict(weights: Weights, x: np.ndarray, chunk: int = 1000) -> np.ndarray:
    """Predicted classes for all of x, in chunks of images so memory stays bounded."""
    return np.concatenate([forward(weights, x[i:i + chunk]).argmax(axis=1)
                           for i in range(0, len(x), chunk)])
