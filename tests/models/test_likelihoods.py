"""Likelihood formulas, their f-derivatives and Hessian factors, against scipy and autograd (hypothesis)."""
import autograd
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from refbayes.models import Bernoulli, Categorical, Gaussian, make_likelihood
from tests.reference import per_example as ref
from tests.tolerances import EXACT_F64, assert_close, exact


@st.composite
def problems(draw):
    """(likelihood, f (M, K), y) with moderate outputs |f| <= 8 (the oracle's exp stays far from overflow)."""
    name = draw(st.sampled_from(["gaussian", "bernoulli", "categorical"]))
    M = draw(st.integers(1, 5))
    K = 1 if name == "bernoulli" else draw(st.integers(1 if name == "gaussian" else 2, 4))
    f = draw(arrays(np.float64, (M, K), elements=st.floats(-8, 8)))
    if name == "gaussian":
        tau = draw(st.floats(0.1, 10.0))
        y = draw(arrays(np.float64, (M,) if K == 1 else (M, K), elements=st.floats(-5, 5)))
        return Gaussian(tau), f, y
    y = draw(arrays(np.int64, (M,), elements=st.integers(0, 1 if name == "bernoulli" else K - 1)))
    return make_likelihood(name), f, y


def _spec(lik, K):
    return ref.Spec((1, K), "relu", lik.name, getattr(lik, "noise_precision", 1.0), True)


def _rows(lik, y, M, K):
    return y.reshape(M, K) if lik.name == "gaussian" else y


@given(problems())
def test_losses_match_scipy(problem):
    lik, f, y = problem
    assert_close(lik.losses(f, y), ref.losses_scipy(_spec(lik, f.shape[1]), f, y), EXACT_F64, "losses")


@given(problems())
def test_grad_and_hess_match_autograd(problem):
    lik, f, y = problem
    M, K = f.shape
    spec, Y = _spec(lik, K), _rows(lik, y, M, K)
    g = autograd.grad(lambda fi, yi: ref.naive_nll(spec, fi, yi))
    h = autograd.hessian(lambda fi, yi: ref.naive_nll(spec, fi, yi))
    assert_close(lik.grad_f(f, y), np.stack([g(f[i], Y[i]) for i in range(M)]), EXACT_F64, "dl/df")
    assert_close(lik.hess_f(f, y), np.stack([h(f[i], Y[i]) for i in range(M)]), EXACT_F64, "d2l/df2")


@given(problems())
def test_hess_factor_squares_to_hessian(problem):
    lik, f, y = problem
    C = lik.hess_factor(f, y)
    assert C.shape[:2] == f.shape
    assert_close(np.einsum("mkr,mlr->mkl", C, C), lik.hess_f(f, y), EXACT_F64, "C C^T = H")


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("lik", [Gaussian(2.0), Bernoulli(), Categorical()], ids=lambda l: l.name)
def test_float32_keeps_dtype(lik, dtype):
    rng = np.random.default_rng(0)
    K = 1 if lik.name == "bernoulli" else 3
    f = rng.standard_normal((5, K))
    y = rng.standard_normal((5, K)) if lik.name == "gaussian" else rng.integers(0, max(K, 2), 5)
    for method in ("losses", "grad_f", "hess_f", "hess_factor"):
        got = getattr(lik, method)(f.astype(dtype), y)
        assert got.dtype == dtype, method
        assert_close(got, getattr(lik, method)(f, y), exact(dtype), method)


def test_stable_at_extreme_logits():
    """softplus / logsumexp forms: no overflow (RuntimeWarning is an error here) and the exact limits."""
    f = np.array([[800.0], [-800.0]])
    assert_close(Bernoulli().losses(f, np.array([0, 1])), np.array([800.0, 800.0]), EXACT_F64, "bernoulli")
    assert_close(Bernoulli().losses(f, np.array([1, 0])), np.array([0.0, 0.0]), EXACT_F64, "bernoulli")
    F = np.array([[900.0, 0.0, -900.0]])
    assert_close(Categorical().losses(F, np.array([2])), np.array([1800.0]), EXACT_F64, "categorical")
    assert_close(Categorical().grad_f(F, np.array([0])), np.zeros((1, 3)), EXACT_F64, "categorical")


def test_gaussian_constant():
    """tau = 2 pi makes the constant vanish: l = pi (y - f)^2."""
    lik = Gaussian(2 * np.pi)
    assert_close(lik.losses(np.array([[1.0]]), np.array([3.0])), np.array([4 * np.pi]), EXACT_F64, "gaussian")


def test_means():
    f = np.array([[0.0, np.log(3.0)]])
    assert_close(Categorical().mean(f), np.array([[0.25, 0.75]]), EXACT_F64, "softmax")
    assert_close(Bernoulli().mean(f[:, 1:]), np.array([0.75]), EXACT_F64, "sigmoid")
    assert_close(Gaussian().mean(f), f, EXACT_F64, "identity")


@pytest.mark.parametrize("call, match", [
    (lambda: Gaussian(0.0), "noise_precision"),
    (lambda: Gaussian(-1.0), "noise_precision"),
    (lambda: make_likelihood("poisson"), "likelihood"),
    (lambda: Bernoulli().losses(np.zeros((3, 2)), np.zeros(3, int)), "f: expected 1 output"),
    (lambda: Categorical().losses(np.zeros((3, 1)), np.zeros(3, int)), "f: expected >= 2"),
    (lambda: Categorical().losses(np.zeros((3, 2)), np.array([0, 2, 1])), "y: expected labels"),
    (lambda: Bernoulli().losses(np.zeros((3, 1)), np.array([0, -1, 1])), "y: expected labels"),
    (lambda: Bernoulli().losses(np.zeros((3, 1)), np.array([0.0, 0.5, 1.0])), "y: expected integer"),
    (lambda: Gaussian().losses(np.zeros((3, 2)), np.zeros(3)), r"y: expected shape \(3, 2\)"),
    (lambda: Gaussian().losses(np.zeros((3, 1)), np.zeros(4)), r"y: expected shape \(3\)"),
    (lambda: Gaussian().losses(np.zeros((3, 1)), np.array([0.0, np.nan, 1.0])), "y: expected finite"),
    (lambda: Gaussian().losses(np.array([[0.0], [np.inf], [1.0]]), np.zeros(3)), "f: expected finite"),
    (lambda: Gaussian().losses(np.zeros(3), np.zeros(3)), "f: expected 2 dimensions"),
    (lambda: Gaussian().mean(np.zeros((3, 2), dtype=int)), "f: expected a floating"),
], ids=lambda x: x if isinstance(x, str) else None)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("lik, K", [(Bernoulli(), 1), (Categorical(), 3)], ids=["bernoulli", "categorical"])
def test_integer_valued_float_labels_equal_int_labels(lik, K):
    rng = np.random.default_rng(1)
    f = rng.standard_normal((6, K))
    y = rng.integers(0, max(K, 2), 6)
    for method in ("losses", "grad_f", "hess_f", "hess_factor"):
        np.testing.assert_array_equal(getattr(lik, method)(f, y.astype(np.float64)), getattr(lik, method)(f, y))


def test_numpy_scalar_noise_precision_keeps_float32():
    """tau = 1 / np.var(y) is a NumPy float64 scalar; it must not promote float32 results (NEP 50)."""
    from refbayes.models import MLP
    tau = np.float64(2.0)
    lik = Gaussian(tau)
    assert type(lik.noise_precision) is float
    f = np.linspace(-1, 1, 6, dtype=np.float32).reshape(3, 2)
    y = np.zeros((3, 2), dtype=np.float32)
    for out in (lik.losses(f, y), lik.grad_f(f, y), lik.hess_f(f, y), lik.hess_factor(f, y)):
        assert out.dtype == np.float32
    model = MLP([2, 3, 1], activation="tanh", noise_precision=tau)
    theta = model.init_theta(np.random.default_rng(0), dtype=np.float32)
    X, y1 = f[:, :2].copy(), np.ones(3, dtype=np.float32)
    assert model.grad(theta, X, y1).dtype == np.float32
    assert model.per_example_grads(theta, X, y1, impl="vectorized").dtype == np.float32


def test_bernoulli_hessian_has_relative_accuracy_at_large_logits():
    """sigma(f)(1 - sigma(f)) = e^{-|f|} / (1 + e^{-|f|})^2 exactly; in float64 this form has
    relative error ~1e-16 at any |f|, so the likelihood Hessian must match it to EXACT_F64
    relative, entry by entry (1 - s would cancel for f > 0 and miss by 1e-3 at f = 30)."""
    f = np.array([[-600.0], [-30.0], [-8.0], [0.0], [8.0], [30.0], [600.0]])
    e = np.exp(-np.abs(f[:, 0]))
    want = e / (1.0 + e) ** 2
    got = Bernoulli().hess_f(f, np.zeros(7, dtype=int))[:, 0, 0]
    assert np.all(np.abs(got - want) <= EXACT_F64 * want)
