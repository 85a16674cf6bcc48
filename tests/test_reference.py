import numpy as np
import pytest

from convlab.oracle.reference import (conv2d, conv2d_float64, conv2d_with_magnitude, lrn, max_pool,
                                      relu, softmax)

U64 = 2.0 ** -53


def loop_nest(x, w, stride=1, pad=0, groups=1, bias=None):
    """The course's CPU convolution, literally: seven nested loops (plus groups and a bias)."""
    B, C, H, W = x.shape
    M, Cg, K, _ = w.shape
    Mg = M // groups
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    Ho = (H + 2 * pad - K) // stride + 1
    Wo = (W + 2 * pad - K) // stride + 1
    y = np.zeros((B, M, Ho, Wo))
    for b in range(B):
        for m in range(M):
            g = m // Mg
            for h in range(Ho):
                for v in range(Wo):
                    acc = 0.0 if bias is None else bias[m]
                    for c in range(Cg):
                        for p in range(K):
                            for q in range(K):
                                acc += xp[b, g * Cg + c, h * stride + p, v * stride + q] * w[m, c, p, q]
                    y[b, m, h, v] = acc
    return y


@pytest.mark.parametrize("B,C,H,W,M,K,stride,pad,groups,bias", [
    (1, 1, 8, 8, 2, 3, 1, 0, 1, False),
    (2, 3, 7, 9, 4, 3, 1, 0, 1, False),
    (3, 2, 10, 6, 5, 5, 1, 0, 1, True),
    (1, 4, 9, 9, 3, 7, 1, 0, 1, False),
    (2, 1, 6, 11, 1, 1, 1, 0, 1, False),
    (2, 2, 9, 8, 3, 3, 2, 1, 1, False),
    (2, 4, 11, 11, 6, 3, 2, 2, 2, True),
    (1, 8, 9, 7, 8, 3, 1, 1, 4, True),
    (1, 3, 23, 23, 4, 11, 4, 0, 1, True),
])
def test_conv_matches_loop_nest(rng, B, C, H, W, M, K, stride, pad, groups, bias):
    x = rng.standard_normal((B, C, H, W))
    w = rng.standard_normal((M, C // groups, K, K))
    b = rng.standard_normal(M) if bias else None
    expected = loop_nest(x, w, stride, pad, groups, b)
    np.testing.assert_allclose(conv2d_float64(x, w, stride, pad, groups, b), expected,
                               rtol=1e-12, atol=1e-12)
    got32 = conv2d(x.astype(np.float32), w.astype(np.float32), stride, pad, groups,
                   None if b is None else b.astype(np.float32))
    assert got32.dtype == np.float32
    np.testing.assert_allclose(got32, expected, rtol=1e-4, atol=1e-4)
    _, magnitude = conv2d_with_magnitude(x, w, stride, pad, groups, b)
    np.testing.assert_allclose(magnitude, loop_nest(np.abs(x), np.abs(w), stride, pad, groups,
                                                    None if b is None else np.abs(b)), rtol=1e-12)


def test_conv_is_cross_correlation_not_convolution():
    x = np.zeros((1, 1, 3, 3))
    x[0, 0, 0, 0] = 1.0
    w = np.arange(9.0).reshape(1, 1, 3, 3)
    # An unflipped kernel puts w[0,0] on x[0,0].
    assert conv2d_float64(x, w)[0, 0, 0, 0] == 0.0
    x[0, 0] = 0.0
    x[0, 0, 2, 2] = 1.0
    assert conv2d_float64(x, w)[0, 0, 0, 0] == 8.0


def test_conv_chunks_large_batches_consistently(rng, monkeypatch):
    """Chunking loses nothing: whole-batch and per-image results agree to float64 rounding. Not
    bit for bit: BLAS picks its blocking, and so its summation order, by matrix size and CPU, so
    the two may differ by a few float64 roundings of the terms (2 * n * 2^-53 * sum|x*w|)."""
    import convlab.oracle.reference as reference

    x = rng.standard_normal((40, 3, 12, 12)).astype(np.float32)
    w = rng.standard_normal((4, 3, 5, 5)).astype(np.float32)
    monkeypatch.setattr(reference, "_PATCH_BUDGET", 3 * 25 * 64 * 7)  # 7 images per chunk
    whole, magnitude = conv2d_with_magnitude(x, w)
    per_image = np.concatenate([conv2d_float64(x[i:i + 1], w) for i in range(40)])
    assert np.all(np.abs(whole - per_image) <= 2 * 75 * U64 * magnitude)


def test_max_pool_drops_incomplete_windows():
    x = np.arange(2 * 1 * 5 * 5, dtype=np.float32).reshape(2, 1, 5, 5)
    y = max_pool(x, 2)
    assert y.shape == (2, 1, 2, 2)
    assert y[0, 0, 0, 0] == 6 and y[0, 0, 1, 1] == 18


@pytest.mark.parametrize("size,stride,n", [(3, 2, 13), (3, 2, 55), (2, 2, 7), (3, 1, 6)])
def test_overlapping_max_pool_matches_loops(rng, size, stride, n):
    x = rng.standard_normal((2, 3, n, n + 1))
    y = max_pool(x, size, stride)
    Ho, Wo = (n - size) // stride + 1, (n + 1 - size) // stride + 1
    assert y.shape == (2, 3, Ho, Wo)
    for h in range(Ho):
        for v in range(Wo):
            window = x[:, :, h * stride:h * stride + size, v * stride:v * stride + size]
            np.testing.assert_array_equal(y[:, :, h, v], window.max(axis=(2, 3)))


def test_lrn_matches_caffes_definition(rng):
    x = rng.standard_normal((2, 7, 3, 4)) * 40
    size, alpha, beta, k = 5, 1e-4, 0.75, 1.0
    y = lrn(x, size, alpha, beta, k)
    for c in range(7):
        lo, hi = max(0, c - 2), min(7, c + 3)  # the window clipped at the first and last channel
        scale = k + alpha / size * np.sum(x[:, lo:hi] ** 2, axis=1)
        np.testing.assert_allclose(y[:, c], x[:, c] / scale ** beta, rtol=1e-13)


def test_relu():
    np.testing.assert_array_equal(relu(np.array([-1.0, 0.0, 2.5])), [0.0, 0.0, 2.5])


def test_softmax_rows_sum_to_one(rng):
    p = softmax(rng.standard_normal((4, 10)) * 30)
    np.testing.assert_allclose(p.sum(axis=1), 1.0)
    assert (p >= 0).all()
