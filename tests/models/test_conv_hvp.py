"""refbayes.models.conv: the closed-form Hessian-vector product (the R-operator's backward pass
through conv, pooling, flatten, dense layers and activations) and grad_hvp.

Equations: derivations/conv.md (conv.34)-(conv.36), on top of the R-forward pass (conv.20)-(conv.21)
and the seed (peg.23). Oracles: autograd's reverse-over-reverse product of the same vectorized
loss (``CNN._hvp_autograd``), the dense autograd ``hessian`` times v, and, for the small nets,
the Hessian of the plain-loop network of tests/reference/conv_loops.py (entry-by-entry conv and
pooling, independent of unfold and fold). float64 at EXACT_F64, float32 at EXACT_F32, the xp
backend (CuPy where present, the stand-in under REFBAYES_CUPY_STANDIN=1) against NumPy.
"""
import functools

import autograd
import numpy as np
import pytest

from refbayes.backend import to_numpy
from refbayes.models.conv import (CNN, Activation, AvgPool2d, Conv2d, Dense, Flatten, MaxPool2d,
                                  tiny_cnn)
from tests.reference import conv_loops as ref
from tests.reference.per_example import naive_nll
from tests.tolerances import EXACT_F32, EXACT_F64, assert_close

ACTS = ("relu", "tanh", "sigmoid")


def _two_conv(act, likelihood="categorical", n_out=3):
    """Two convs (strided and padded; a (2, 1) kernel, no bias), an overlapping average pool, an
    overlapping max pool, a hidden dense layer: every act'' and V term of (conv.34)-(conv.36)."""
    return CNN((2, 7, 6), [
        Conv2d(2, 3, 3, stride=2, padding=1), Activation(act),
        AvgPool2d(2, stride=1),
        Conv2d(3, 2, (2, 1), padding=(0, 1), bias=False), Activation(act),
        MaxPool2d(2, stride=1), Flatten(), Dense(6, 4), Activation(act), Dense(4, n_out)],
        likelihood)


def _maxpool_net(likelihood="categorical", n_out=3):
    """Stride-2 padded conv, relu, a non-overlapping 2x2 max pool, a second conv, a strided
    overlapping 3x3 max pool (windows that share their winner)."""
    return CNN((1, 9, 9), [
        Conv2d(1, 3, 3, padding=1), Activation("relu"), MaxPool2d(2),
        Conv2d(3, 2, 2), Activation("tanh"), MaxPool2d(2, stride=1),
        Flatten(), Dense(8, n_out)], likelihood)


def _leading_parameterless(act):
    """A pool and an activation before the first parameter: R{x} = 0 there (no act'' term)."""
    return CNN((1, 6, 6), [AvgPool2d(2), Activation(act), Conv2d(1, 2, 2), Activation(act),
                           MaxPool2d(2), Flatten(), Dense(2, 3)])


MODELS = {
    "tiny-categorical": tiny_cnn(),
    "tiny-gaussian": tiny_cnn("gaussian", n_out=2, noise_precision=2.5),
    "tiny-bernoulli": tiny_cnn("bernoulli", n_out=1),
    "maxpool-categorical": _maxpool_net(),
    "maxpool-gaussian": _maxpool_net("gaussian", 2),
    **{f"twoconv-{a}-categorical": _two_conv(a) for a in ACTS},
    **{f"twoconv-{a}-gaussian": _two_conv(a, "gaussian", 2) for a in ACTS},
    **{f"leading-{a}": _leading_parameterless(a) for a in ACTS},
}
# the independent plain-loop oracle on a subset (autograd through the loops is slow)
LOOP_MODELS = ["tiny-categorical", "tiny-gaussian", "maxpool-categorical",
               "twoconv-tanh-categorical", "twoconv-sigmoid-gaussian", "leading-tanh"]


def _batch(model, M=3, seed=0, dtype=np.float64, rows=False):
    rng = np.random.default_rng(seed)
    theta = model.init_theta(rng, scheme="pytorch")
    X = rng.normal(size=(M,) + model.input_shape)
    if rows:
        X = X.reshape(M, -1)
    K, lik = model.n_out, model.likelihood.name
    if lik == "gaussian":
        y = rng.normal(size=(M, K))
    else:
        y = rng.integers(0, 2 if lik == "bernoulli" else K, size=M)
    v = rng.normal(size=model.D)
    cast = (lambda a: a.astype(dtype))
    return cast(theta), cast(X), (cast(y) if lik == "gaussian" else y), cast(v)


@functools.cache
def _loop_hessian(name):
    """The Hessian of sum_i l_i of the plain-loop network (autograd), float64 batch seed 2."""
    model = MODELS[name]
    spec = ref.LoopSpec(model)
    theta, X, y, _ = _batch(model, seed=2)

    def total(t):
        return sum(naive_nll(spec, ref.naive_output(spec, t, x), yi) for x, yi in zip(X, y))
    return autograd.hessian(total)(theta)


@pytest.mark.parametrize("rows", [False, True])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_hvp_equals_autograd_and_dense_hessian_times_v(name, rows):
    # checks (conv.34), (conv.35), (conv.36): R{delta} through conv, dense, every activation
    # (act'' terms), max pool (winners fixed), average pool, flatten; the R-blocks per layer
    model = MODELS[name]
    theta, X, y, v = _batch(model, seed=1, rows=rows)
    Hv = model.hvp(theta, v, X, y)
    assert Hv.shape == (model.D,) and Hv.dtype == np.float64
    assert_close(Hv, model._hvp_autograd(theta, v, X, y), EXACT_F64, f"{name} hvp vs autograd")
    assert_close(Hv, model.hessian(theta, X, y) @ v, EXACT_F64, f"{name} hvp vs hessian @ v")


@pytest.mark.parametrize("name", LOOP_MODELS)
def test_hvp_equals_the_loop_networks_hessian_times_v(name):
    # checks (conv.34), (conv.35), (conv.36) against the entry-by-entry loop network's Hessian
    model = MODELS[name]
    theta, X, y, v = _batch(model, seed=2)
    assert_close(model.hvp(theta, v, X, y), _loop_hessian(name) @ v, EXACT_F64, f"{name} loop")


@pytest.mark.parametrize("name", sorted(MODELS))
def test_grad_hvp_is_grad_and_hvp_bit_for_bit(name):
    # checks (conv.36): the R pass beside the gradient's; g is grad's own blocks
    model = MODELS[name]
    theta, X, y, v = _batch(model, seed=3)
    g, Hv = model.grad_hvp(theta, v, X, y)
    assert np.array_equal(g, model.grad(theta, X, y))
    assert np.array_equal(Hv, model.hvp(theta, v, X, y))


def test_hvp_is_linear_in_v_and_unit_vectors_give_hessian_columns():
    # checks (conv.34)-(conv.36): H e_j is column j of the dense Hessian, H (a u + b w) = a H u + b H w
    model = MODELS["twoconv-sigmoid-categorical"]
    theta, X, y, v = _batch(model, seed=4)
    H = model.hessian(theta, X, y)
    for j in (0, 5, model.D // 2, model.D - 1):
        e = np.zeros(model.D)
        e[j] = 1.0
        assert_close(model.hvp(theta, e, X, y), H[:, j], EXACT_F64, f"column {j}")
    w = np.random.default_rng(5).normal(size=model.D)
    assert_close(model.hvp(theta, 2.0 * v - 3.0 * w, X, y),
                 2.0 * model.hvp(theta, v, X, y) - 3.0 * model.hvp(theta, w, X, y),
                 EXACT_F64, "linearity")


@pytest.mark.parametrize("act", ["tanh", "sigmoid"])
def test_hvp_differs_from_ggn_vp_by_the_second_order_terms(act):
    # checks (conv.34), (conv.35): the V and act'' terms that ggn_vp drops are present: H v - GGN v
    # is the dense (H - GGN) v and not small
    model = MODELS[f"twoconv-{act}-gaussian"]
    theta, X, y, v = _batch(model, seed=6)
    Hv, Gv = model.hvp(theta, v, X, y), model.ggn_vp(theta, v, X, y)
    assert np.linalg.norm(Hv - Gv) > 1e-3 * np.linalg.norm(Hv)
    assert_close(Hv - Gv, (model.hessian(theta, X, y) - model.ggn(theta, X, y)) @ v, EXACT_F64,
                 "H v - GGN v")


@pytest.mark.parametrize("name", ["tiny-categorical", "maxpool-gaussian",
                                  "twoconv-tanh-categorical", "twoconv-sigmoid-gaussian"])
def test_float32_hvp_and_grad_hvp(name):
    # checks (conv.34)-(conv.36) in float32 against the float64 product, EXACT_F32
    model = MODELS[name]
    theta, X, y, v = _batch(model, seed=7)
    t32, X32, v32 = (a.astype(np.float32) for a in (theta, X, v))
    y32 = y.astype(np.float32) if model.likelihood.name == "gaussian" else y
    # the float64 oracle at the float32 inputs, so the comparison sees only the arithmetic
    t64, X64, v64 = (a.astype(np.float64) for a in (t32, X32, v32))
    y64 = y32.astype(np.float64) if model.likelihood.name == "gaussian" else y
    Hv = model.hvp(t32, v32, X32, y32)
    assert Hv.dtype == np.float32
    assert_close(Hv, model._hvp_autograd(t64, v64, X64, y64), EXACT_F32, f"{name} f32 hvp")
    g, Hv2 = model.grad_hvp(t32, v32, X32, y32)
    assert g.dtype == np.float32 and np.array_equal(Hv2, Hv)
    assert np.array_equal(g, model.grad(t32, X32, y32))


@pytest.mark.parametrize("name", ["tiny-categorical", "maxpool-gaussian",
                                  "twoconv-sigmoid-categorical", "leading-tanh"])
def test_hvp_and_grad_hvp_on_the_xp_backend(name, xp):
    # checks (conv.34)-(conv.36) on the xp backend (CuPy where present) against NumPy
    model = MODELS[name]
    theta, X, y, v = _batch(model, seed=8)
    a_theta, a_X, a_y, a_v = (xp.asarray(a) for a in (theta, X, y, v))
    Hv = model.hvp(a_theta, a_v, a_X, a_y)
    g, Hv2 = model.grad_hvp(a_theta, a_v, a_X, a_y)
    for got, what in ((Hv, "hvp"), (g, "grad_hvp g"), (Hv2, "grad_hvp Hv")):
        assert isinstance(got, xp.ndarray), what
        assert got.dtype == np.float64, what
    assert_close(to_numpy(Hv), model.hvp(theta, v, X, y), EXACT_F64, "hvp on xp")
    assert_close(to_numpy(Hv2), to_numpy(Hv), EXACT_F64, "grad_hvp Hv on xp")
    assert_close(to_numpy(g), model.grad(theta, X, y), EXACT_F64, "grad_hvp g on xp")
    if xp is not np:
        with pytest.raises(ValueError, match=r"^theta"):
            model._hvp_autograd(a_theta, a_v, a_X, a_y)


def test_hvp_inputs_are_checked():
    model = tiny_cnn()
    theta, X, y, v = _batch(model)
    for fn in (model.hvp, model.grad_hvp):
        with pytest.raises(ValueError, match=r"^v"):
            fn(theta, v[:-1], X, y)
        with pytest.raises(ValueError, match=r"^theta, v"):
            fn(theta, v.astype(np.float32), X, y)
        with pytest.raises(ValueError, match=r"^v"):
            fn(theta, np.full(model.D, np.nan), X, y)
        with pytest.raises(ValueError, match=r"^y"):
            fn(theta, v, X, None)
        with pytest.raises(ValueError, match=r"^X"):
            fn(theta, v, X[:, :, :5], y)
