"""The non-convolution ops on any machine: every kernel configuration their plans can choose
compiles with NVRTC for sm_90, the float64 references agree with reference.py and with literal
loops, each bound is the arithmetic its error analysis states, and the plans choose as designed."""

import math

import numpy as np
import pytest

from convlab.gpu import hardware
from convlab.gpu.jit import compile_cubin
from convlab.models import LRN, MODELS, AddKept, Dense, GlobalAvgPool, MaxPool, ReLU, Softmax, Tanh
from convlab.ops import activation, base, dense, dense_cublas, lrn, pool, residual, softmax
from convlab.oracle import lrn as lrn_oracle, reference
from convlab.oracle.verify import LAMBDA, TINY, compare
from convlab.shapes import LAYOUTS, NHWC

U = 2.0 ** -24
F16 = np.float16
BF16 = np.uint16  # bf16 bits (gpu.elements.BFLOAT16)
HALF_PAIRS = ((np.float32, F16), (F16, F16), (F16, np.float32))
BF16_PAIRS = ((np.float32, BF16), (BF16, BF16), (BF16, np.float32))
ACTS = (None, "relu", "tanh")
MODEL_BATCHES = {"ece408-high": (1, 100, 10000), "ece408": (1, 100, 10000),
                 "alexnet": (1, 2, 8, 128, 1024), "resnet50": (1, 128), "vgg16": (1, 64)}


# --- every kernel configuration compiles ------------------------------------------------------

def model_specs():
    """The kernels the network's layers get, through the same plan functions prepare uses."""
    for name, batches in MODEL_BATCHES.items():
        for batch in batches:
            trace = MODELS[name].trace(batch)
            for i, (layer, in_shape, _) in enumerate(trace):
                nxt = trace[i + 1][0] if i + 1 < len(trace) else None
                if isinstance(layer, MaxPool):
                    yield from (pool.max_pool_kernel(in_shape, layer.size, layer.step, a, lay,
                                                     pad=layer.pad)
                                for a in ACTS for lay in LAYOUTS)
                elif isinstance(layer, GlobalAvgPool):
                    yield from (pool.global_avg_pool_kernel(in_shape, lay) for lay in LAYOUTS)
                elif isinstance(layer, AddKept):
                    yield from (residual.add_kernel(in_shape, "relu", src, kept, dst)
                                for src, kept, dst in ((np.float32, F16, F16),
                                                       (np.float32, np.float32, np.float32)))
                elif isinstance(layer, LRN):
                    for lay in LAYOUTS:
                        yield lrn.lrn_kernel(in_shape, layer.size, layer.alpha, layer.beta,
                                             layer.k, layout=lay)
                        if isinstance(nxt, MaxPool):
                            yield lrn.lrn_max_pool_kernel(in_shape, layer.size, layer.alpha,
                                                          layer.beta, layer.k, nxt.size,
                                                          nxt.step, layout=lay)
                elif isinstance(layer, Dense):
                    act = {ReLU: "relu", Tanh: "tanh"}.get(type(nxt))
                    plan = dense.plan_dense(batch, layer.in_features, layer.out_features)
                    yield from dense.dense_kernels(batch, layer.in_features, layer.out_features,
                                                   act, plan)
                    yield dense_cublas.bias_activation_kernel(batch, layer.out_features, act)
                elif isinstance(layer, (ReLU, Tanh)):
                    yield activation.activation_kernel(in_shape, "relu" if isinstance(layer, ReLU)
                                                       else "tanh")
                elif isinstance(layer, Softmax):
                    yield softmax.softmax_kernel(*in_shape)


# Shapes that reach every compile-time branch: float4 and scalar paths, every tile, with and
# without split-K, every GEMV width, every activation.
DENSE_ODD = ((130, 37, 150), (70, 264, 68))  # K, N not multiples of 4; then both multiples


def structural_specs():
    for mb in range(1, dense.GEMV_MAX_BATCH + 1):
        k = 37 if mb % 2 else 260
        yield from dense.dense_kernels(mb, k, 29, ACTS[mb % 3], dense.gemv_plan())
    for i, tile in enumerate(dense.TILES):
        for splits in (1, 3):
            for j, (m, k, n) in enumerate(DENSE_ODD):
                yield from dense.dense_kernels(m, k, n, ACTS[(i + j + splits) % 3],
                                               dense.gemm_plan(k, tile, splits))
    for a in ACTS:
        yield dense_cublas.bias_activation_kernel(3, 7, a)
        yield activation.activation_kernel((3, 5), a or "relu")
    for shape, size, stride in (((2, 3, 13, 11), 3, 2), ((1, 2, 8, 10), 4, 3),
                                ((1, 1, 5, 5), 5, 1)):
        yield from (pool.max_pool_kernel(shape, size, stride, a) for a in ACTS)
        yield from (pool.max_pool_kernel(shape, size, stride, a, pad=size // 2) for a in ACTS)
    for src, kept, dst in ((np.float32, np.float32, np.float32), (F16, F16, F16),
                           (np.float32, F16, np.float32), (F16, np.float32, F16)):
        yield residual.add_kernel((3, 5), ACTS[0], src, kept, dst)
        yield residual.add_kernel((3, 5), "relu", src, kept, dst)
        for lay in LAYOUTS:
            yield pool.global_avg_pool_kernel((2, 5, 3, 4), lay, src, dst)
    for shape, size, ps, pst in (((2, 7, 5, 6), 5, 3, 2), ((1, 3, 7, 345), 4, 3, 2),
                                 ((1, 4, 9, 9), 9, 3, 2), ((2, 200, 8, 8), 2, 2, 2),  # quads
                                 ((1, 2, 70, 70), 1, 5, 1), ((1, 11, 6, 6), 7, 6, 1),
                                 ((1, 3, 25, 25), 3, 20, 1)):  # a window past the NHWC tile
        for beta in (0.75, 1.5):  # the rsqrt path and the exp2f(log2f) path
            for lay in LAYOUTS:
                yield lrn.lrn_kernel(shape, size, 0.1, beta, 1.0, sms=1, layout=lay)
                yield lrn.lrn_max_pool_kernel(shape, size, 0.1, beta, 1.0, ps, pst, sms=1,
                                              layout=lay)
    yield softmax.softmax_kernel(3, 1)
    yield softmax.softmax_kernel(5, 2049)
    # 16-bit activations (for a conv of that class after the op): every element type in and
    # out, fp16 and bf16 bits.
    # Channels-last pools of 16 channels take 4 (float32 in) or 8 (16-bit in) a thread, their
    # stores 8, 16 or 32 bytes wide.
    for i, (src, dst) in enumerate(((np.float32, np.float32),) + HALF_PAIRS + BF16_PAIRS):
        for lay in LAYOUTS:
            yield pool.max_pool_kernel((2, 3, 13, 11), 3, 2, ACTS[i % 3], lay, src, dst)
        yield pool.max_pool_kernel((2, 16, 13, 11), 3, 2, ACTS[i % 3], NHWC, src, dst, pad=1)
        yield activation.activation_kernel((3, 5), "relu", src, dst)
    for src, kept, dst in ((BF16, BF16, BF16), (np.float32, BF16, np.float32)):
        yield residual.add_kernel((3, 5), "relu", src, kept, dst)
        for lay in LAYOUTS:
            yield pool.global_avg_pool_kernel((2, 5, 3, 4), lay, src, dst)
    yield lrn.lrn_max_pool_kernel((2, 8, 9, 9), 5, 0.1, 0.75, 1.0, 3, 1, sms=1, layout=NHWC,
                                  out_dtype=BF16)
    for shape, ps in (((2, 7, 5, 6), 3), ((1, 3, 25, 25), 20), ((2, 8, 9, 9), 3)):
        for lay in LAYOUTS:
            yield lrn.lrn_kernel(shape, 5, 0.1, 0.75, 1.0, sms=1, layout=lay, out_dtype=F16)
            yield lrn.lrn_max_pool_kernel(shape, 5, 0.1, 0.75, 1.0, ps, 1, sms=1, layout=lay,
                                          out_dtype=F16)


def unique_modules(specs):
    """One entry per (source, options): the functions one NVRTC compile must contain."""
    modules: dict = {}
    for s in specs:
        modules.setdefault((s.module, s.source, s.options), set()).add(s.function)
    return [(module, source, options, sorted(functions))
            for (module, source, options), functions in modules.items()]


ALL_SPECS = list(model_specs()) + list(structural_specs())
MODULES = unique_modules(ALL_SPECS)


@pytest.mark.slow
@pytest.mark.parametrize("module,source,options,functions", MODULES,
                         ids=[f"{m[0]}-{'+'.join(m[3])}-{i}" for i, m in enumerate(MODULES)])
def test_op_kernels_compile_for_sm90(module, source, options, functions):
    cubin = compile_cubin(module, source, options)
    assert cubin[:4] == b"\x7fELF"
    for function in functions:
        assert function.encode() in cubin, f"{function} missing from the compiled module"


def test_compiled_configurations_cover_every_choice():
    gemm = {(d["BM"], d["BN"], d["SPLITS"] > 1, d["VEC_K"], d["VEC_N"])
            for d in (dict(s.defines) for s in ALL_SPECS if s.function == "dense_gemm")}
    for tile in dense.TILES:
        for split in (False, True):
            for vec in (0, 1):
                assert (*tile, split, vec, vec) in gemm
    gemv = {(d["MB"], d["VEC_K"]) for d in (dict(s.defines) for s in ALL_SPECS
                                           if s.function == "dense_gemv")}
    assert {mb for mb, _ in gemv} == set(range(1, dense.GEMV_MAX_BATCH + 1))
    assert {vec for _, vec in gemv} == {0, 1}
    functions = {s.function for s in ALL_SPECS}
    assert functions == {"max_pool", "lrn", "lrn_max_pool", "dense_gemm", "dense_splitk_reduce",
                         "dense_gemv", "bias_activation", "softmax_rows", "activation",
                         "lrn_nhwc", "lrn_max_pool_nhwc", "global_avg_pool", "add_kept"}
    pads = {dict(s.defines)["PAD"] for s in ALL_SPECS if s.function == "max_pool"}
    assert {0, 1, 2} <= pads
    widths = {(d["VEC"], d["IN_HALF"], d["OUT_HALF"], d["BF16_BITS"])
              for d in (dict(s.defines) for s in ALL_SPECS if s.function == "max_pool")}
    assert {(4, 0, 0, 0), (4, 0, 1, 0), (8, 1, 1, 0), (8, 1, 0, 0), (4, 0, 1, 1), (8, 1, 1, 1),
            (8, 1, 0, 1), (1, 0, 0, 0), (1, 1, 1, 0)} <= widths
    kept = {(dict(s.defines)["IN_HALF"], dict(s.defines)["KEPT_HALF"], dict(s.defines)["OUT_HALF"])
            for s in ALL_SPECS if s.function == "add_kept"}
    assert {(0, 0, 0), (0, 1, 1), (1, 1, 1), (0, 1, 0), (1, 0, 1)} <= kept
    powers = {(s.function, dict(s.defines)["BETA_THREE_QUARTERS"]) for s in ALL_SPECS
              if s.function in ("lrn", "lrn_max_pool")}
    assert powers == {(f, b) for f in ("lrn", "lrn_max_pool") for b in (0, 1)}
    elements = {(s.function, dict(s.defines)["IN_HALF"], dict(s.defines)["OUT_HALF"])
                for s in ALL_SPECS if "OUT_HALF" in dict(s.defines)}
    for function in ("max_pool", "activation"):
        assert {(i, o) for f, i, o in elements if f == function} == {(0, 0), (0, 1), (1, 1),
                                                                     (1, 0)}
    for function in ("lrn", "lrn_max_pool", "lrn_nhwc", "lrn_max_pool_nhwc"):
        assert {(i, o) for f, i, o in elements if f == function} == {(0, 0), (0, 1)}
    bf16 = {s.function for s in ALL_SPECS if dict(s.defines).get("BF16_BITS")}
    assert bf16 == {"max_pool", "activation", "add_kept", "global_avg_pool", "lrn_max_pool_nhwc"}
    forms = {(next((f for f in ("QUADS", "TILED") if f in dict(s.defines)), "untiled"),
              dict(s.defines)["OUT_HALF"]) for s in ALL_SPECS if s.function == "lrn_max_pool_nhwc"}
    assert forms == {(f, o) for f in ("QUADS", "TILED", "untiled") for o in (0, 1)}
    lanes = {dict(s.defines)["QG"] for s in ALL_SPECS if "QUADS" in dict(s.defines)}
    assert {1, 2, 24, 32} <= lanes  # one lane (both ends), 24 (AlexNet's 96), a full warp
    acts = {(s.function, dict(s.defines).get("ACT")) for s in ALL_SPECS}
    for function in ("max_pool", "dense_gemm", "dense_gemv", "bias_activation"):
        assert {a for f, a in acts if f == function} == {0, 1, 2}


# --- references agree with reference.py and literal loops -------------------------------------

def pool_loop_nest(x, size, stride):
    B, C, H, W = x.shape
    ho, wo = (H - size) // stride + 1, (W - size) // stride + 1
    y = np.empty((B, C, ho, wo))
    for b in range(B):
        for c in range(C):
            for h in range(ho):
                for w in range(wo):
                    best = -math.inf
                    for p in range(size):
                        for q in range(size):
                            best = max(best, x[b, c, h * stride + p, w * stride + q])
                    y[b, c, h, w] = best
    return y


POOLS = [((2, 3, 13, 11), 3, 2), ((1, 2, 9, 7), 3, 1), ((2, 2, 8, 10), 4, 3), ((1, 1, 5, 5), 5, 1),
         ((1, 2, 7, 7), 2, 2), ((2, 4, 24, 24), 2, 2)]


@pytest.mark.parametrize("shape,size,stride", POOLS)
def test_max_pool_reference_matches_loop_nest(rng, shape, size, stride):
    x = (2 * rng.random(shape) - 1).astype(np.float32)
    expected = pool_loop_nest(x.astype(np.float64), size, stride)
    np.testing.assert_array_equal(pool.reference_max_pool(x, size, stride).values, expected)
    np.testing.assert_array_equal(pool.reference_max_pool(x, size, stride, "relu").values,
                                  np.maximum(expected, 0))
    np.testing.assert_allclose(pool.reference_max_pool(x, size, stride, "tanh").values,
                               np.tanh(expected), rtol=1e-15, atol=0)
    np.testing.assert_array_equal(pool.reference_max_pool(x, size, stride).values,
                                  reference.max_pool(x, size, stride))


def lrn_loops(x, size, alpha, beta, k):
    """Caffe's LRN, one channel at a time: y[c] = x[c] / (k + alpha/size * S[c])^beta with S[c]
    the sum of squares over channels c - (size-1)//2 ... clipped to the existing channels.
    Returns y and the denominator base d = k + alpha/size * S."""
    B, C, H, W = x.shape
    before = (size - 1) // 2
    y = np.empty(x.shape)
    d = np.empty(x.shape)
    for c in range(C):
        lo, hi = max(0, c - before), min(C, c - before + size)
        s = np.zeros((B, H, W))
        for j in range(lo, hi):
            s += x[:, j] ** 2
        d[:, c] = k + alpha / size * s
        y[:, c] = x[:, c] / d[:, c] ** beta
    return y, d


LRNS = [((2, 7, 5, 6), 5, 1e-4, 0.75, 1.0), ((1, 9, 4, 3), 3, 0.5, 0.75, 2.0),
        ((2, 3, 5, 5), 5, 1.0, 0.75, 1.0), ((1, 6, 3, 4), 4, 0.1, 1.5, 1.0),
        ((1, 5, 2, 3), 1, 0.3, 0.5, 1.5)]


@pytest.mark.parametrize("shape,size,alpha,beta,k", LRNS)
def test_lrn_reference_matches_channel_loop_and_reference_py(rng, shape, size, alpha, beta, k):
    x = (8 * rng.standard_normal(shape)).astype(np.float32)
    expected, _ = lrn_loops(x.astype(np.float64), size, alpha, beta, k)
    got = lrn_oracle.reference_lrn(x, size, alpha, beta, k).values
    np.testing.assert_allclose(got, expected, rtol=1e-13, atol=0)
    np.testing.assert_allclose(got, reference.lrn(x.astype(np.float64), size, alpha, beta, k),
                               rtol=1e-13, atol=0)


@pytest.mark.parametrize("shape,size,alpha,beta,k", LRNS)
def test_lrn_max_pool_reference_is_lrn_then_pool(rng, shape, size, alpha, beta, k):
    x = (8 * rng.standard_normal(shape)).astype(np.float32)
    ps, pst = (3, 2) if min(shape[2:]) >= 3 else (2, 1)
    expected = pool_loop_nest(lrn_loops(x.astype(np.float64), size, alpha, beta, k)[0], ps, pst)
    got = lrn_oracle.reference_lrn_max_pool(x, size, alpha, beta, k, ps, pst).values
    np.testing.assert_allclose(got, expected, rtol=1e-13, atol=0)


@pytest.mark.parametrize("act", ACTS)
def test_dense_reference_matches_network_definition(rng, act):
    x = (2 * rng.random((5, 37)) - 1).astype(np.float32)
    w = rng.standard_normal((11, 37)).astype(np.float32)
    b = rng.standard_normal(11).astype(np.float32)
    layer = Dense("fc", 37, 11)
    expected = reference.apply_layer(layer, x.astype(np.float64),
                                     {"fc.weight": w, "fc.bias": b})
    expected = {None: expected, "relu": reference.relu(expected), "tanh": np.tanh(expected)}[act]
    np.testing.assert_allclose(dense.reference_dense(x, w, b, act).values, expected,
                               rtol=1e-12, atol=1e-12)


def test_softmax_and_activation_references_match_reference_py(rng):
    z = (5 * rng.standard_normal((4, 13))).astype(np.float32)
    np.testing.assert_allclose(softmax.reference_softmax(z).values,
                               reference.softmax(z.astype(np.float64)), rtol=1e-14, atol=0)
    np.testing.assert_array_equal(activation.reference_activation(z, "relu").values,
                                  reference.relu(z.astype(np.float64)))
    np.testing.assert_array_equal(activation.reference_activation(z, "tanh").values,
                                  np.tanh(z.astype(np.float64)))


# --- each bound is what its comment says ------------------------------------------------------

def element_bound(ref):
    """The part of ref.bound("fp32") that the op's own error analysis sets, element by element:
    LAMBDA*sqrt(n)*u*magnitude + absolute + n*TINY (verify.py may add a layer-wide floor on top,
    which is its rule, not the op's)."""
    return LAMBDA * math.sqrt(ref.length) * U * ref.magnitude + ref.absolute + ref.length * TINY


def test_max_pool_and_activation_bounds_are_exact_except_tanhf(rng):
    x = rng.standard_normal((2, 3, 7, 7)).astype(np.float32)
    assert np.all(pool.reference_max_pool(x, 3, 2).bound("fp32") == TINY)
    assert np.all(pool.reference_max_pool(x, 3, 2, "relu").bound("fp32") == TINY)
    assert np.allclose(pool.reference_max_pool(x, 3, 2, "tanh").bound("fp32"),
                       4 * 2.0 ** -24 + TINY, rtol=1e-15)
    assert np.all(activation.reference_activation(x, "relu").bound("fp32") == TINY)
    assert np.allclose(activation.reference_activation(x, "tanh").bound("fp32"),
                       4 * 2.0 ** -24 + TINY, rtol=1e-15)


@pytest.mark.parametrize("shape,size,alpha,beta,k", LRNS)
def test_lrn_bound_follows_its_error_analysis(rng, shape, size, alpha, beta, k):
    x = (8 * rng.standard_normal(shape)).astype(np.float32)
    y, d = lrn_loops(x.astype(np.float64), size, alpha, beta, k)
    # beta*LAMBDA*sqrt(size)*u for the window sum, 2*beta*u for d's roundings, one rounding of
    # y, and the power: for beta = 0.75, 1.5*8 + 8 + 2 (two rsqrt within 4 ulps, two products);
    # otherwise beta*|ln d|*(2 + 2*2) (log2f within 2 ulps, -beta and the product rounded)
    # + 2*4 (exp2f within 4 ulps).
    power = 22 if beta == 0.75 else beta * np.abs(np.log(d)) * 6 + 8
    expected = U * np.abs(y) * (beta * LAMBDA * math.sqrt(size) + 2 * beta + power + 1) \
        + size * TINY
    ref = lrn_oracle.reference_lrn(x, size, alpha, beta, k)
    assert ref.length == size
    np.testing.assert_allclose(element_bound(ref), expected, rtol=1e-12, atol=0)
    ps, pst = (3, 2) if min(shape[2:]) >= 3 else (2, 1)
    pooled = lrn_oracle.reference_lrn_max_pool(x, size, alpha, beta, k, ps, pst)
    np.testing.assert_allclose(element_bound(pooled), pool_loop_nest(expected, ps, pst),
                               rtol=1e-12, atol=0)


@pytest.mark.parametrize("act", ACTS)
def test_dense_bound_is_the_conv_rule_over_in_plus_one_terms(rng, act):
    x = (2 * rng.random((3, 37)) - 1).astype(np.float32)
    w = rng.standard_normal((5, 37)).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    magnitude = np.array([[sum(abs(float(x[m, i]) * float(w[n, i])) for i in range(37))
                           + abs(float(b[n])) for n in range(5)] for m in range(3)])
    expected = LAMBDA * math.sqrt(38) * U * magnitude + 38 * TINY
    if act == "tanh":
        expected += 4 * 2.0 ** -24
    ref = dense.reference_dense(x, w, b, act)
    assert ref.length == 38
    np.testing.assert_allclose(element_bound(ref), expected, rtol=1e-12, atol=0)


def test_softmax_bound_follows_its_error_analysis(rng):
    z = (5 * rng.standard_normal((3, 17))).astype(np.float32).astype(np.float64)
    y = reference.softmax(z)
    expected = np.empty_like(z)
    for r in range(3):
        d = z[r] - z[r].max()
        e = np.exp(d)
        mean = sum(e[j] * abs(d[j]) for j in range(17)) / e.sum()
        for i in range(17):
            # LAMBDA*sqrt(n)*u for the sum, (|d_i| + mean|d| + 2*8 + 1)*u for the rest.
            expected[r, i] = U * y[r, i] * (LAMBDA * math.sqrt(17) + abs(d[i]) + mean + 17)
    ref = softmax.reference_softmax(z)
    assert ref.length == 17
    np.testing.assert_allclose(element_bound(ref), expected + 17 * TINY, rtol=1e-12, atol=0)


# --- the bounds admit float32 arithmetic in another order, and reject wrong results ----------

def lrn_float32(x, size, alpha, beta, k, drop_last=False):
    """LRN in float32 with a direct window sum (not the cumulative sums of reference.lrn, whose
    differences cancel); drop_last leaves out the window's last channel, a plausible bug."""
    before = (size - 1) // 2
    padded = np.pad(np.square(x), ((0, 0), (before, size - 1 - before), (0, 0), (0, 0)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, size, axis=1)
    s = windows[..., :-1].sum(axis=-1) if drop_last else windows.sum(axis=-1)
    d = np.float32(alpha / size) * s + np.float32(k)
    return x * np.power(d, np.float32(-beta))


def test_lrn_bound_admits_float32_and_catches_a_missing_channel(rng):
    x = (8 * rng.standard_normal((2, 16, 5, 5))).astype(np.float32)
    ref = lrn_oracle.reference_lrn(x, 5, 1e-4, 0.75, 1.0)
    assert compare(lrn_float32(x, 5, 1e-4, 0.75, 1.0), ref, "fp32").passed
    assert not compare(lrn_float32(x, 5, 1e-4, 0.75, 1.0, drop_last=True), ref, "fp32").passed


@pytest.mark.parametrize("spread", [1.0, 5.0, 20.0])
def test_softmax_bound_admits_float32(rng, spread):
    z = (spread * rng.standard_normal((8, 1000))).astype(np.float32)
    assert compare(reference.softmax(z), softmax.reference_softmax(z), "fp32").passed


def test_softmax_bound_catches_a_missing_term(rng):
    # Logits of spread 1: every term is about 1/1000 of its row's sum, far above the bound
    # (about 3e-5 relative); a missing term that small would not matter and is not flagged.
    z = rng.standard_normal((8, 1000)).astype(np.float32)
    e = np.exp(z.astype(np.float64) - z.max(axis=1, keepdims=True))
    short = e / (e.sum(axis=1, keepdims=True) - e[:, :1])
    assert not compare(short.astype(np.float32), softmax.reference_softmax(z), "fp32").passed


def test_dense_bound_admits_float32_and_catches_a_missing_term(rng):
    x = (2 * rng.random((9, 300)) - 1).astype(np.float32)
    w = (rng.standard_normal((40, 300)) / np.sqrt(300)).astype(np.float32)
    b = (0.1 * rng.standard_normal(40)).astype(np.float32)
    ref = dense.reference_dense(x, w, b, "relu")
    assert compare(np.maximum(x @ w.T + b, 0), ref, "fp32").passed
    assert not compare(np.maximum(x[:, 1:] @ w[:, 1:].T + b, 0), ref, "fp32").passed


# --- the plans choose as designed --------------------------------------------------------------

FC_LAYERS = [(layer.in_features, layer.out_features) for spec in MODELS.values()
             for layer in spec.layers if isinstance(layer, Dense)]


@pytest.mark.parametrize("inputs,outputs", sorted(set(FC_LAYERS)))
def test_dense_plan_is_gemv_up_to_batch_8(inputs, outputs):
    for batch in range(1, dense.GEMV_MAX_BATCH + 1):
        assert dense.plan_dense(batch, inputs, outputs).kind == "gemv"
    assert dense.plan_dense(dense.GEMV_MAX_BATCH + 1, inputs, outputs).kind == "gemm"


def test_dense_plan_splits_k_where_tiles_are_few():
    sms = hardware.H100.sms
    for inputs, outputs in ((9216, 4096), (4096, 4096), (4096, 1000)):
        plan = dense.plan_dense(128, inputs, outputs, sms)
        tiles = math.ceil(128 / plan.tile_m) * math.ceil(outputs / plan.tile_n)
        slots = sms * dense.resident_blocks(plan.threads)
        assert tiles < slots and plan.splits > 1, plan
        assert tiles * plan.splits <= slots  # one wave
    fc6_128 = dense.plan_dense(128, 9216, 4096, sms)
    assert (fc6_128.tile_m, fc6_128.tile_n, fc6_128.splits) == (128, 128, 8)
    # 256 tiles of 128 x 128 fill the 264 slots: no split.
    assert dense.plan_dense(1024, 9216, 4096, sms).splits == 1
    assert dense.plan_dense(10000, 7200, 500, sms).splits == 1
    # k too short to be worth splitting.
    assert dense.plan_dense(100, 160, 10, sms).splits == 1


@pytest.mark.parametrize("inputs", [1, 5, 8, 37, 255, 256, 1030, 4096, 9216])
@pytest.mark.parametrize("splits", [1, 2, 3, 8, 33, 64])
def test_split_k_ranges_partition_k(inputs, splits):
    plan = dense.gemm_plan(inputs, (128, 128), splits)
    assert plan.k_per_split % dense.BK == 0 and 1 <= plan.splits <= splits
    covered = []
    for z in range(plan.splits):
        lo, hi = z * plan.k_per_split, min(inputs, (z + 1) * plan.k_per_split)
        assert lo < hi  # no block gets an empty range
        covered += range(lo, hi)
    assert covered == list(range(inputs))


@pytest.mark.parametrize("tile", dense.TILES)
def test_gemm_tiles_divide_evenly_among_threads(tile):
    bm, bn = tile
    threads = dense.gemm_plan(64, tile).threads
    # Each thread loads whole float4s of both operand slices, and its two row (column) groups
    # of 4 sit half a tile apart.
    assert (bm * dense.BK // 4) % threads == 0 and (bn * dense.BK // 4) % threads == 0
    assert (bm // 2) % 4 == 0 and (bn // 2) % 4 == 0 and threads % 32 == 0
    assert dense.resident_blocks(threads) * threads * dense.MAX_REGISTERS <= dense.REGISTERS_PER_SM


@pytest.mark.parametrize("shape,ps,pst", [((128, 96, 55, 55), 3, 2), ((1, 256, 27, 27), 3, 2),
                                          ((1, 3, 7, 345), 3, 2), ((2, 2, 70, 70), 5, 1),
                                          ((1, 4, 40, 9), 2, 2), ((1, 4, 64, 64), 32, 32)])
@pytest.mark.parametrize("sms", [1, 132])
def test_lrn_max_pool_tiles_cover_every_output_once(shape, ps, pst, sms):
    s = lrn.lrn_max_pool_kernel(shape, 5, 1e-4, 0.75, 1.0, ps, pst, sms=sms)
    d = dict(s.defines)
    tiles_h = s.grid[0] // d["TILES_W"]
    assert s.grid[0] == tiles_h * d["TILES_W"]
    assert (tiles_h - 1) * d["TOH"] < d["HO"] <= tiles_h * d["TOH"]
    assert (d["TILES_W"] - 1) * d["TOW"] < d["WO"] <= d["TILES_W"] * d["TOW"]
    assert d["IH"] == (d["TOH"] - 1) * pst + ps and d["IW"] == (d["TOW"] - 1) * pst + ps
    assert d["NPIX"] == d["IH"] * d["IW"] <= lrn.MAX_TILE_PIXELS
    # Whole warps, at most MAX_THREADS; only a thread's last pixel can lie past the tile.
    block = s.block[0]
    assert block == d["BLOCK"] and block % 32 == 0 and block <= lrn.MAX_THREADS
    assert (d["PPT"] - 1) * block < d["NPIX"] <= d["PPT"] * block
    assert (d["OPT"] - 1) * block < d["TOH"] * d["TOW"] <= d["OPT"] * block
    # A tile row stored by column residue: PST classes of CW columns hold all IW columns.
    assert d["ROW"] == pst * d["CW"] and (d["CW"] - 1) * pst < d["IW"] <= d["CW"] * pst
    assert (s.grid[1] - 1) * d["CB"] < shape[1] <= s.grid[1] * d["CB"]  # no empty channel range
    assert s.grid[2] == shape[0]


def test_lrn_splits_channels_only_where_the_batch_leaves_sms_idle():
    # norm1+pool1 at batch 128: 4 tiles x 128 images = 512 blocks for 4 x 132 slots: no split
    # (a split would reload 4 halo channels per range for no more parallelism).
    norm1 = lrn.lrn_max_pool_kernel((128, 96, 55, 55), 5, 1e-4, 0.75, 1.0, 3, 2, sms=132)
    assert dict(norm1.defines)["CB"] == 96 and norm1.grid == (4, 1, 128)
    assert dict(lrn.lrn_max_pool_kernel((1024, 96, 55, 55), 5, 1e-4, 0.75, 1.0, 3, 2,
                                        sms=132).defines)["CB"] == 96
    small = dict(lrn.lrn_max_pool_kernel((1, 96, 55, 55), 5, 1e-4, 0.75, 1.0, 3, 2,
                                         sms=132).defines)
    assert small["CB"] == lrn.MIN_CHANNELS_PER_BLOCK
    # LRN alone: 1,513 blocks of 256 pixel columns fill 8 x 132 slots at batch 128 (no split);
    # norm2's 365 blocks do not, so its 256 channels are split.
    assert lrn.lrn_kernel((128, 96, 55, 55), 5, sms=132).grid == (1513, 1)
    norm2 = lrn.lrn_kernel((128, 256, 27, 27), 5, sms=132)
    assert norm2.grid[0] == 365 and 1 < norm2.grid[1] <= 8
    assert dict(lrn.lrn_kernel((1, 96, 55, 55), 5, sms=132).defines)["CB"] \
        == lrn.MIN_CHANNELS_PER_BLOCK


def test_lrn_max_pool_tiles_are_even():
    # AlexNet's 27 pooled rows in at most 8 per tile: 4 tiles of 7, not 8, 8, 8 and 3.
    d = dict(lrn.lrn_max_pool_kernel((128, 96, 55, 55), 5, 1e-4, 0.75, 1.0, 3, 2).defines)
    assert (d["TOH"], d["TOW"], d["IH"], d["IW"]) == (7, 27, 15, 55)


def test_lrn_takes_the_rsqrt_path_for_beta_three_quarters_only():
    assert dict(lrn.lrn_kernel((1, 8, 4, 4), 5, 1e-4, 0.75).defines)["BETA_THREE_QUARTERS"] == 1
    for beta in (0.5, 0.7500001, 1.5):
        assert dict(lrn.lrn_kernel((1, 8, 4, 4), 5, 1e-4, beta).defines)[
            "BETA_THREE_QUARTERS"] == 0


def test_names_and_bad_arguments():
    assert pool.max_pool_name(3, 2) == "max-pool 3x3/2"
    assert pool.max_pool_name(2, 2, "tanh") == "tanh + max-pool 2x2/2"
    assert dense.dense_name(9216, 4096, "relu") == "FC 9216->4096 + ReLU"
    assert dense.dense_name(4096, 1000, None) == "FC 4096->1000"
    with pytest.raises(ValueError, match="activation"):
        base.check_activation("gelu")
    with pytest.raises(ValueError, match="does not fit"):
        pool.max_pool_kernel((1, 1, 2, 2), 3, 1)
    with pytest.raises(ValueError, match="alpha"):
        lrn.lrn_kernel((1, 4, 5, 5), 5, -1.0, 0.75, 1.0)
    with pytest.raises(ValueError, match="normal float32"):
        lrn.lrn_kernel((1, 4, 5, 5), 5, 1e-4, 0.75, 1e-39)
    with pytest.raises(ValueError, match="at most 8"):
        dense.dense_kernels(9, 16, 16, None, dense.gemv_plan())
    with pytest.raises(ValueError, match="bias"):
        dense.check_dense_weights(np.zeros((4, 3)), np.zeros(3))
    with pytest.raises(ValueError, match="not float64"):
        pool.max_pool_kernel((1, 1, 4, 4), 2, 2, out_dtype=np.float64)
    with pytest.raises(ValueError, match="not int8"):
        activation.activation_kernel((4,), "relu", in_dtype=np.int8)


def test_dense_rejects_a_plan_made_for_other_inputs():
    with pytest.raises(ValueError, match="does not cover"):
        dense.dense_kernels(16, 100, 16, None, dense.gemm_plan(1000, (64, 64), 4))


# --- ResNet's layers: a padded max-pool, the global average pool, the residual add -----------

def test_padded_max_pool_reference_is_a_literal_loop(rng):
    x = rng.standard_normal((2, 3, 9, 8))
    size, stride, pad = 3, 2, 1
    got = pool.reference_max_pool(x, size, stride, "relu", pad).values
    ho, wo = (9 + 2 * pad - size) // stride + 1, (8 + 2 * pad - size) // stride + 1
    want = np.full((2, 3, ho, wo), -np.inf)
    for i in range(ho):
        for j in range(wo):
            for p in range(size):
                for q in range(size):
                    h, w = i * stride - pad + p, j * stride - pad + q
                    if 0 <= h < 9 and 0 <= w < 8:
                        want[:, :, i, j] = np.maximum(want[:, :, i, j], x[:, :, h, w])
    np.testing.assert_array_equal(got, np.maximum(want, 0))
    assert got.shape == (2, 3, pool.pooled_size(9, size, stride, pad),
                         pool.pooled_size(8, size, stride, pad))


@pytest.mark.parametrize("channels,layout,dtype,vec", [
    (64, NHWC, np.float16, 8), (64, NHWC, BF16, 8), (64, NHWC, np.float32, 4),
    (12, NHWC, np.float32, 4), (12, NHWC, np.float16, 1), (3, NHWC, np.float32, 1),
    (64, "nchw", np.float16, 1)])
def test_channels_last_pools_take_sixteen_bytes_of_channels_a_thread(channels, layout, dtype,
                                                                     vec):
    shape = (3, channels, 9, 7)
    assert pool.channels_per_thread(channels, layout, dtype) == vec
    kernel = pool.max_pool_kernel(shape, 3, 2, layout=layout, in_dtype=dtype, pad=1)
    assert dict(kernel.defines)["VEC"] == vec
    threads = 3 * channels * 5 * 4 // vec
    assert kernel.grid == (-(-threads // pool.BLOCK),)


def test_max_pool_refuses_padding_past_half_the_window():
    with pytest.raises(ValueError, match="padding"):
        pool.max_pool_kernel((1, 1, 8, 8), 3, 2, pad=2)


def test_global_avg_pool_and_add_references(rng):
    x = rng.standard_normal((2, 4, 3, 5))
    gap = pool.reference_global_avg_pool(x)
    np.testing.assert_allclose(gap.values, x.reshape(2, 4, -1).mean(axis=2))
    assert gap.length == 16
    kept = rng.standard_normal(x.shape)
    added = residual.reference_add(x, kept, "relu")
    np.testing.assert_array_equal(added.values, np.maximum(x + kept, 0))
    np.testing.assert_array_equal(added.magnitude, np.abs(x) + np.abs(kept))
    # a float32 add of the two is within the bound; an add that drops the shortcut is not
    x32, k32 = x.astype(np.float32), kept.astype(np.float32)
    assert compare(np.maximum(x32 + k32, 0), residual.reference_add(x32, k32, "relu"),
                   "fp32").passed
    assert not compare(np.maximum(x32, 0), residual.reference_add(x32, k32, "relu"),
                       "fp32").passed


# --- the element types between layers ----------------------------------------------------------

def test_element_defines_name_16_bit_operands_and_which_type_they_are():
    """IN_HALF / OUT_HALF say an operand is 16-bit, BF16_BITS that those are bf16 bits; one
    kernel's 16-bit operands are all of one type, and other types are refused."""
    from convlab.gpu.elements import BFLOAT16, FLOAT16, FLOAT32, element_defines

    assert element_defines() == {"IN_HALF": 0, "OUT_HALF": 0, "BF16_BITS": 0}
    assert element_defines(FLOAT16, FLOAT32) == {"IN_HALF": 1, "OUT_HALF": 0, "BF16_BITS": 0}
    assert element_defines(FLOAT32, BFLOAT16) == {"IN_HALF": 0, "OUT_HALF": 1, "BF16_BITS": 1}
    assert element_defines(FLOAT32, FLOAT32, BFLOAT16)["BF16_BITS"] == 1
    with pytest.raises(ValueError, match="all fp16 or all bf16"):
        element_defines(FLOAT16, BFLOAT16)
    with pytest.raises(ValueError, match="not float64"):
        element_defines(np.float64)


def test_bf16_bits_read_back_as_the_values_they_hold():
    """values() decodes bf16 bits exactly (the top half of a float32), leaves other types as
    they are, and a poisoned bf16 buffer reads NaN."""
    from convlab.gpu.elements import BFLOAT16, poison_value, values
    from convlab.kernels.igemm.packing import to_bf16_bits

    x = np.array([[1.0, -2.5, 2.0 ** -100], [65536.0, 1.0 + 2.0 ** -7, -0.0]], dtype=np.float32)
    bits = to_bf16_bits(x)
    assert np.array_equal(values(bits), x) and values(bits).dtype == np.float32
    assert np.array_equal(values(bits.T), x.T)  # any strides
    half = x.astype(np.float16)
    assert values(half) is half
    assert np.isnan(values(np.full(2, poison_value(BFLOAT16), np.uint16))).all()
    assert np.isnan(poison_value(np.float16))
