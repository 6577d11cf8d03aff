"""refbayes.models.conv: forward against scipy.signal.correlate and plain loops, gradients and
per-example gradients against autograd and a plain-loop network, theta layout, bad input.

Equations: derivations/conv.md. Oracles: tests/reference/conv_loops.py.
"""
import numpy as np
import pytest
import scipy.signal
from hypothesis import given
from hypothesis import strategies as st

from refbayes.backend import to_numpy
from refbayes.models import MLP
from refbayes.models import _conv_layers as cl
from refbayes.models.conv import (CNN, Activation, AvgPool2d, Conv2d, Dense, Flatten, MaxPool2d,
                                  lenet5, tiny_cnn)
from tests.reference import conv_loops as ref
from tests.tolerances import EXACT_F32, EXACT_F64, assert_close


def _mixed(likelihood="gaussian", n_out=2):
    """Strides, paddings, rectangular kernels, overlapping pools, no-bias conv, every activation."""
    return CNN((2, 7, 8), [
        Conv2d(2, 3, (3, 2), stride=(2, 1), padding=(1, 2)), Activation("tanh"),
        AvgPool2d(2, stride=1),
        Conv2d(3, 2, 2, stride=(1, 2), bias=False), Activation("sigmoid"),
        MaxPool2d((2, 2), stride=(1, 2)), Flatten(),
        Dense(2 * 1 * 2, 4), Activation("relu"), Dense(4, n_out)], likelihood)


MODELS = {
    "tiny-categorical": tiny_cnn(),
    "tiny-bernoulli": tiny_cnn("bernoulli", n_out=1),
    "mixed-gaussian": _mixed("gaussian", 2),
    "mixed-categorical": _mixed("categorical", 3),
    "conv-after-conv-padded": CNN((1, 5, 5), [
        Conv2d(1, 2, 3, padding=1), Activation("relu"), Conv2d(2, 2, 3, stride=2, padding=1),
        MaxPool2d(2, stride=1), Flatten(), Dense(8, 3)], "categorical"),
}


def _batch(model, M=4, seed=0, dtype=np.float64, rows=False):
    rng = np.random.default_rng(seed)
    theta = model.init_theta(rng, scheme="pytorch").astype(dtype)
    X = rng.normal(size=(M,) + model.input_shape).astype(dtype)
    if rows:
        X = X.reshape(M, -1)
    K, lik = model.n_out, model.likelihood.name
    if lik == "gaussian":
        y = rng.normal(size=(M, K)).astype(dtype)
    else:
        y = rng.integers(0, 2 if lik == "bernoulli" else K, size=M)
    return theta, X, y


# ---------------------------------------------------------------------------- forward

@st.composite
def conv_cases(draw):
    c_in, c_out = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    ph, pw = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    H = draw(st.integers(max(1, kh - 2 * ph), 9))
    W = draw(st.integers(max(1, kw - 2 * pw), 9))
    bias = draw(st.booleans())
    return (c_in, H, W), Conv2d(c_in, c_out, (kh, kw), (sh, sw), (ph, pw), bias), draw(st.integers(0, 2**32 - 1))


@given(conv_cases())
def test_conv_forward_matches_scipy_correlate(case):
    # checks (conv.1), (conv.4), (conv.5): cross-correlation of the zero-padded input, strided
    shape, conv, seed = case
    model = CNN(shape, [conv, Flatten()], "gaussian")
    rng = np.random.default_rng(seed)
    theta = rng.normal(size=model.D)
    X = rng.normal(size=(2,) + shape)
    Wc, b = model.unflatten(theta)[0]
    (ph, pw), (sh, sw) = conv.padding, conv.stride
    want = []
    for x in X:
        xpad = np.pad(x, ((0, 0), (ph, ph), (pw, pw)))
        out = np.stack([sum(scipy.signal.correlate(xpad[c], Wc[o, c], mode="valid")
                            for c in range(conv.c_in))[::sh, ::sw] + (b[o] if conv.bias else 0.0)
                        for o in range(conv.c_out)])
        want.append(out.reshape(-1))  # (C_out, H_o, W_o) row-major: Flatten's order (conv.15)
    assert model.shapes[1] == out.shape  # (conv.1) against scipy's own output size
    assert_close(model.forward(theta, X), np.stack(want), EXACT_F64, "conv vs scipy.signal.correlate")


def test_output_size_floors_a_stride_remainder():
    # checks (conv.1): floor((H + 2p - k) / s) + 1, a remainder row dropped as in torch
    model = CNN((1, 7, 6), [Conv2d(1, 1, 2, stride=2), Flatten()], "gaussian")
    assert model.shapes[1] == (1, 3, 3)
    assert cl.out_size(7, 2, 2, 0) == 3 and cl.out_size(7, 3, 2, 1) == 4 and cl.out_size(3, 3, 1, 0) == 1


@st.composite
def pool_cases(draw):
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    C, H, W = draw(st.integers(1, 2)), draw(st.integers(kh, 7)), draw(st.integers(kw, 7))
    ties = draw(st.booleans())
    return (C, H, W), (kh, kw), (sh, sw), ties, draw(st.integers(0, 2**32 - 1))


def _pool_input(shape, ties, rng, M=2):
    # ties: a few integer levels, so windows hold repeated maxima
    if ties:
        return rng.integers(0, 3, size=(M,) + shape).astype(np.float64)
    return rng.normal(size=(M,) + shape)


@given(pool_cases())
def test_pools_match_loops(case):
    # checks (conv.11), (conv.13): window max (first index on ties) and window mean, no padding
    shape, kernel, stride, ties, seed = case
    rng = np.random.default_rng(seed)
    X = _pool_input(shape, ties, rng)
    for layer, loop in ((MaxPool2d(kernel, stride), ref.max_pool_loop),
                        (AvgPool2d(kernel, stride), ref.avg_pool_loop)):
        model = CNN(shape, [layer, Flatten()], "gaussian")
        want = np.stack([np.asarray(loop(x, kernel, stride)).reshape(-1) for x in X])
        assert_close(model.forward(np.zeros(0), X), want, EXACT_F64, type(layer).__name__)


@given(pool_cases())
def test_pool_backward_matches_loop_routing(case):
    # checks (conv.9), (conv.12), (conv.14): the fold of routed (max, first index on ties) or
    # spread (mean) errors, overlapping windows included
    shape, kernel, stride, ties, seed = case
    rng = np.random.default_rng(seed)
    X = _pool_input(shape, ties, rng)
    onehot, y = cl.max_pool(np, X, kernel, stride)
    dy = rng.normal(size=y.shape)
    got = cl.max_pool_backward(np, onehot, dy, X.shape, kernel, stride)
    want = np.stack([ref.max_pool_routing_loop(X[i], dy[i], kernel, stride) for i in range(len(X))])
    assert_close(got, want, EXACT_F64, "max-pool routing")
    got = cl.avg_pool_backward(np, dy, X.shape, kernel, stride)
    n = kernel[0] * kernel[1]
    want = np.zeros(X.shape)
    for i, c, r, s in np.ndindex(*dy.shape):
        r0, s0 = stride[0] * r, stride[1] * s
        want[i, c, r0:r0 + kernel[0], s0:s0 + kernel[1]] += dy[i, c, r, s] / n
    assert_close(got, want, EXACT_F64, "avg-pool spread")


def test_max_pool_tie_goes_to_first_index():
    # checks (conv.11), (conv.12): a window of equal values routes to its top-left entry
    X = np.ones((1, 1, 2, 2))
    onehot, y = cl.max_pool(np, X, (2, 2), (2, 2))
    dx = cl.max_pool_backward(np, onehot, np.full((1, 1, 1, 1), 5.0), X.shape, (2, 2), (2, 2))
    assert y[0, 0, 0, 0] == 1.0
    np.testing.assert_array_equal(dx[0, 0], [[5.0, 0.0], [0.0, 0.0]])


@pytest.mark.parametrize("name", list(MODELS))
def test_forward_matches_loop_network_and_rows_equal_images(name):
    # checks (conv.2), (conv.3), (conv.15): theta walked in the documented order, flatten order
    model = MODELS[name]
    theta, X, _ = _batch(model)
    spec = ref.LoopSpec(model)
    want = np.stack([np.asarray(ref.naive_output(spec, theta, x)) for x in X])
    assert_close(model.forward(theta, X), want, EXACT_F64, "forward vs loops")
    np.testing.assert_array_equal(model.forward(theta, X.reshape(len(X), -1)), model.forward(theta, X))


# ---------------------------------------------------------------------------- gradients

@pytest.mark.parametrize("name", list(MODELS))
def test_grad_matches_autograd(name):
    # checks (conv.8), (conv.9), (conv.12), (conv.14), (conv.15): the summed backward pass
    model = MODELS[name]
    theta, X, y = _batch(model, M=5, seed=1)
    g = model.grad(theta, X, y)
    want = model.per_example_grads(theta, X, y, impl="autograd").sum(axis=0)
    assert g.shape == (model.D,) and g.dtype == np.float64
    assert_close(g, want, EXACT_F64, "grad vs autograd")


@pytest.mark.parametrize("rows", [False, True], ids=["NCHW", "rows"])
@pytest.mark.parametrize("name", list(MODELS))
def test_per_example_grads_match_loop_reference(name, rows):
    # checks (conv.6), (conv.7), (conv.9), (conv.12), (conv.14), (conv.15)
    model = MODELS[name]
    theta, X, y = _batch(model, M=3, seed=2, rows=rows)
    want = ref.per_example_grads_loop(ref.LoopSpec(model), theta, X, y)
    G = model.per_example_grads(theta, X, y)
    assert G.shape == (3, model.D) and G.dtype == np.float64
    assert_close(G, want, EXACT_F64, "per-example grads vs loop network")
    assert_close(model.per_example_grads(theta, X, y, impl="autograd"), want, EXACT_F64, "autograd impl")
    assert_close(G.sum(axis=0), model.grad(theta, X, y), EXACT_F64, "sum of rows vs grad")
    assert_close(model.per_example_losses(theta, X, y).sum(), model.loss(theta, X, y), EXACT_F64, "loss")


@pytest.mark.parametrize("name", list(MODELS))
def test_diag_ef_is_the_sum_of_squared_rows(name):
    # checks (conv.10): sum_i g_i^2 without the (M, D) rows, against the loop reference's rows
    model = MODELS[name]
    theta, X, y = _batch(model, M=4, seed=7)
    G = ref.per_example_grads_loop(ref.LoopSpec(model), theta, X, y)
    h = model.diag_ef(theta, X, y)
    assert h.shape == (model.D,) and h.dtype == np.float64
    assert_close(h, (G * G).sum(axis=0), EXACT_F64, "diag_ef vs squared loop rows")


@pytest.mark.parametrize("name", ["tiny-categorical", "mixed-gaussian"])
def test_float32_matches_float64(name):
    # checks (conv.6)-(conv.8) in float32: dtype kept, float64 oracle within EXACT_F32
    model = MODELS[name]
    theta, X, y = _batch(model, M=4, seed=3)
    t32, X32 = theta.astype(np.float32), X.astype(np.float32)
    y32 = y.astype(np.float32) if model.likelihood.name == "gaussian" else y
    G32 = model.per_example_grads(t32, X32, y32)
    assert G32.dtype == np.float32 and model.grad(t32, X32, y32).dtype == np.float32
    assert model.forward(t32, X32).dtype == np.float32
    assert_close(G32, model.per_example_grads(theta, X, y), EXACT_F32, "float32 G")
    h32 = model.diag_ef(t32, X32, y32)
    assert h32.dtype == np.float32
    assert_close(h32, model.diag_ef(theta, X, y), EXACT_F32, "float32 diag_ef")


def test_lenet5_per_example_grads_sum_to_grad():
    # checks (conv.6)-(conv.8) at LeNet-5's size (3x32x32, five parameter layers)
    model = lenet5()
    theta, X, y = _batch(model, M=3, seed=4)
    G = model.per_example_grads(theta, X, y)
    assert_close(G.sum(axis=0), model.grad(theta, X, y), EXACT_F64, "LeNet-5 sum of rows vs grad")
    assert_close(G[:1], model.per_example_grads(theta, X[:1], y[:1], impl="autograd"), EXACT_F64,
                 "LeNet-5 vs autograd")


# ---------------------------------------------------------------------------- layout

def test_conv_block_is_torch_weight_row_major_then_bias():
    # checks (conv.2): Wc[o, c, u, v] at ((o C_in + c) k_h + u) k_w + v, then the bias
    model = CNN((2, 5, 5), [Conv2d(2, 3, (2, 3)), Flatten()], "gaussian")
    theta = np.arange(model.D, dtype=np.float64)
    (Wc, b), = model.unflatten(theta)
    assert Wc.shape == (3, 2, 2, 3) and b.shape == (3,)
    for o, c, u, v in np.ndindex(*Wc.shape):
        assert Wc[o, c, u, v] == ((o * 2 + c) * 2 + u) * 3 + v
    np.testing.assert_array_equal(b, [36.0, 37.0, 38.0])
    np.testing.assert_array_equal(model.flatten(model.unflatten(theta)), theta)


def test_dense_only_cnn_is_the_mlp():
    # checks (conv.3), (conv.15): Dense blocks are the MLP's, Flatten is the row-major reshape
    cnn = CNN((1, 2, 3), [Flatten(), Dense(6, 4), Activation("tanh"), Dense(4, 3)], "categorical")
    mlp = MLP([6, 4, 3], "tanh", "categorical")
    assert cnn.D == mlp.D
    theta, X, y = _batch(cnn, M=4, seed=5)
    Xr = X.reshape(4, -1)
    assert_close(cnn.forward(theta, X), mlp.forward(theta, Xr), EXACT_F64, "f")
    assert_close(cnn.per_example_grads(theta, X, y), mlp.per_example_grads(theta, Xr, y), EXACT_F64, "G")


def test_named_models():
    m = tiny_cnn()
    assert m.D == 47 and m.shapes == ((1, 6, 6), (2, 4, 4), (2, 4, 4), (2, 2, 2), (8,), (3,))
    L = lenet5()
    assert L.D == 62006 and L.n_out == 10 and L.n_in == 3 * 32 * 32
    images = [s for s in L.shapes if len(s) == 3][1:]
    assert images == [(6, 28, 28)] * 2 + [(6, 14, 14)] + [(16, 10, 10)] * 2 + [(16, 5, 5)]
    assert lenet5(100, (1, 28, 28)).layers[7] == Dense(256, 120)


def test_init_theta_bounds_and_schemes():
    model = _mixed()
    theta = model.init_theta(np.random.default_rng(0))
    params = model.unflatten(theta)
    W, b = params[0]  # Conv2d(2, 3, (3, 2)): fan_in 12, fan_out 18
    assert np.all(np.abs(W) <= np.sqrt(6.0 / 30)) and np.all(b == 0)
    theta = model.init_theta(np.random.default_rng(0), np.float32, scheme="pytorch")
    W, b = model.unflatten(theta)[0]
    assert theta.dtype == np.float32 and np.all(np.abs(b) <= 1 / np.sqrt(12)) and np.any(b != 0)


# ---------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("make, match", [
    (lambda: Conv2d(1, 2, 2.5), "kernel"),
    (lambda: Conv2d(1, 2, 3, stride=0), "stride"),
    (lambda: Conv2d(1, 2, 3, padding=-1), "padding"),
    (lambda: Conv2d(0, 2, 3), "c_in"),
    (lambda: Conv2d(1, 2, (3, 3, 3)), "kernel"),
    (lambda: MaxPool2d(2, stride=1.5), "stride"),
    (lambda: AvgPool2d(0), "kernel"),
    (lambda: Dense(3, 0), "n_out"),
    (lambda: Activation("gelu"), "name"),
    # a spec that does not chain
    (lambda: CNN((2, 6, 6), [Conv2d(1, 2, 3), Flatten(), Dense(32, 3)]), r"layers\[0\].*channels"),
    (lambda: CNN((1, 6, 6), [Conv2d(1, 2, 3), Dense(32, 3)]), r"layers\[1\].*Flatten"),
    (lambda: CNN((1, 6, 6), [Flatten(), MaxPool2d(2), Dense(9, 3)]), r"layers\[1\]"),
    (lambda: CNN((1, 6, 6), [Flatten(), Dense(35, 3)]), r"layers\[1\]"),
    # kernel larger than the padded input: the output would be empty
    (lambda: CNN((1, 4, 4), [Conv2d(1, 2, 7, padding=1), Flatten(), Dense(2, 3)]), r"layers\[0\].*exceeds"),
    (lambda: CNN((1, 4, 4), [MaxPool2d(5), Flatten(), Dense(1, 3)]), r"layers\[0\].*exceeds"),
    (lambda: CNN((1, 6, 6), [Conv2d(1, 2, 3)]), "layers.*vector"),
    (lambda: CNN((1, 6, 6), [Flatten(), Dense(36, 1)], "categorical"), "layers.*K >= 2"),
    (lambda: CNN((1, 6), [Flatten()]), "input_shape"),
    (lambda: CNN((1, 6, 6), []), "layers"),
    (lambda: CNN((1, 6, 6), ["conv"]), r"layers\[0\]"),
    (lambda: CNN((1, 6, 6), [Flatten(), Dense(36, 2)], "poisson"), "likelihood"),
    (lambda: lenet5(1), "n_classes"),
    (lambda: lenet5(10, (3, 12, 12)), r"layers\[3\].*exceeds"),
])
def test_bad_spec_names_the_argument(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_bad_inputs_name_the_argument():
    model = tiny_cnn()
    theta, X, y = _batch(model, M=3)
    cases = [
        ((theta, X[0], y), "X"),                                    # wrong rank (one image)
        ((theta, X.transpose(0, 2, 3, 1), y), "X"),                 # NHWC: (3, 6, 6, 1)
        ((theta, np.concatenate([X, X], axis=1), y), "X"),          # channel mismatch
        ((theta, X.reshape(3, -1)[:, :35], y), "X"),                # rows of the wrong width
        ((theta, X[:0], y[:0]), "X"),                               # no example
        ((theta, np.where(np.arange(36).reshape(6, 6) == 7, np.nan, X), y), "X"),  # a NaN pixel
        ((theta, X.astype(np.float32), y), "theta, X"),             # mixed dtypes
        ((theta[:-1], X, y), "theta"),
        ((theta, X, y[:2]), "y"),
        ((theta, X, np.array([0, 1, 3])), "y"),
        ((theta, X, None), "y"),
    ]
    for args, name in cases:
        with pytest.raises(ValueError, match=f"^{name}"):
            model.per_example_grads(*args)
        with pytest.raises(ValueError, match=f"^{name}"):
            model.loss(*args)
    with pytest.raises(ValueError, match="^impl"):
        model.per_example_grads(theta, X, y, impl="numba")
    with pytest.raises(ValueError, match=r"^params\[1\]\[0\]"):
        model.flatten([model.unflatten(theta)[0], (np.zeros((3, 8)), np.zeros(3))])


def test_last_layer_splits_off_the_final_dense():
    """f(x) = head(phi(x)) with the head's parameters the last entries of theta (peg.15); its
    gradients are the last block of the CNN's."""
    # checks (peg.15)
    model = tiny_cnn()
    theta, X, y = _batch(model)
    head, phi = model.last_layer(theta, X)
    off = model.D - head.D
    assert head.sizes == (8, 3) and phi.shape == (X.shape[0], 8)
    assert_close(head.forward(theta[off:], phi), model.forward(theta, X), EXACT_F64, "f")
    assert_close(head.grad(theta[off:], phi, y), model.grad(theta, X, y)[off:], EXACT_F64, "g")


@pytest.mark.parametrize("name", ["tiny-categorical", "mixed-gaussian", "conv-after-conv-padded"])
def test_backend_results_stay_on_the_inputs_backend(name, xp):
    # checks (conv.5), (conv.6)-(conv.9), (conv.10) on the xp backend (CuPy where present) against NumPy
    model = MODELS[name]
    theta, X, y = _batch(model, M=3, seed=6)
    args = [xp.asarray(a) for a in (theta, X, y)]
    G, g, f = model.per_example_grads(*args), model.grad(*args), model.forward(*args[:2])
    assert all(isinstance(a, xp.ndarray) for a in (G, g, f))
    assert_close(to_numpy(G), model.per_example_grads(theta, X, y), EXACT_F64, "G on xp")
    assert_close(to_numpy(g), model.grad(theta, X, y), EXACT_F64, "grad on xp")
    assert_close(to_numpy(f), model.forward(theta, X), EXACT_F64, "f on xp")
    assert_close(to_numpy(model.diag_ef(*args)), model.diag_ef(theta, X, y), EXACT_F64, "diag_ef on xp")
    assert_close(to_numpy(model.loss(*args)), model.loss(theta, X, y), EXACT_F64, "loss on xp")


def test_parameter_free_spec_has_an_empty_theta():
    # checks (conv.3): D counts parameter layers only
    model = CNN((1, 4, 4), [MaxPool2d(2), Flatten()], "gaussian")
    theta = model.init_theta(np.random.default_rng(0))
    assert model.D == 0 and theta.shape == (0,) and model.unflatten(theta) == []
