import numpy as np
import pytest

from convlab.reference import conv2d, conv2d_float64, max_pool, softmax


def loop_nest(x, w, stride=1, pad=0):
    """The course's CPU convolution, literally: seven nested loops."""
    B, C, H, W = x.shape
    M, _, K, _ = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    Ho = (H + 2 * pad - K) // stride + 1
    Wo = (W + 2 * pad - K) // stride + 1
    y = np.zeros((B, M, Ho, Wo))
    for b in range(B):
        for m in range(M):
            for h in range(Ho):
                for v in range(Wo):
                    acc = 0.0
                    for c in range(C):
                        for p in range(K):
                            for q in range(K):
                                acc += xp[b, c, h * stride + p, v * stride + q] * w[m, c, p, q]
                    y[b, m, h, v] = acc
    return y


@pytest.mark.parametrize("B,C,H,W,M,K,stride,pad", [
    (1, 1, 8, 8, 2, 3, 1, 0),
    (2, 3, 7, 9, 4, 3, 1, 0),
    (3, 2, 10, 6, 5, 5, 1, 0),
    (1, 4, 9, 9, 3, 7, 1, 0),
    (2, 1, 6, 11, 1, 1, 1, 0),
    (2, 2, 9, 8, 3, 3, 2, 1),
])
def test_conv_matches_loop_nest(rng, B, C, H, W, M, K, stride, pad):
    x = rng.standard_normal((B, C, H, W))
    w = rng.standard_normal((M, C, K, K))
    expected = loop_nest(x, w, stride, pad)
    np.testing.assert_allclose(conv2d_float64(x, w, stride, pad), expected, rtol=1e-12, atol=1e-12)
    got32 = conv2d(x.astype(np.float32), w.astype(np.float32), stride, pad)
    assert got32.dtype == np.float32
    np.testing.assert_allclose(got32, expected, rtol=1e-4, atol=1e-4)


def test_conv_is_cross_correlation_not_convolution():
    x = np.zeros((1, 1, 3, 3))
    x[0, 0, 0, 0] = 1.0
    w = np.arange(9.0).reshape(1, 1, 3, 3)
    # An unflipped kernel puts w[0,0] on x[0,0].
    assert conv2d_float64(x, w)[0, 0, 0, 0] == 0.0
    x[0, 0] = 0.0
    x[0, 0, 2, 2] = 1.0
    assert conv2d_float64(x, w)[0, 0, 0, 0] == 8.0


def test_conv_chunks_large_batches_consistently(rng):
    x = rng.standard_normal((40, 3, 12, 12)).astype(np.float32)
    w = rng.standard_normal((4, 3, 5, 5)).astype(np.float32)
    whole = conv2d_float64(x, w)
    per_image = np.concatenate([conv2d_float64(x[i:i + 1], w) for i in range(40)])
    np.testing.assert_array_equal(whole, per_image)


def test_max_pool_drops_incomplete_windows():
    x = np.arange(2 * 1 * 5 * 5, dtype=np.float32).reshape(2, 1, 5, 5)
    y = max_pool(x, 2)
    assert y.shape == (2, 1, 2, 2)
    assert y[0, 0, 0, 0] == 6 and y[0, 0, 1, 1] == 18


def test_softmax_rows_sum_to_one(rng):
    p = softmax(rng.standard_normal((4, 10)) * 30)
    np.testing.assert_allclose(p.sum(axis=1), 1.0)
    assert (p >= 0).all()
