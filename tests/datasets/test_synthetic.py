"""Synthetic generators: the documented draw order, determinism, dtype, validation."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from refbayes.datasets import make_linear_regression, make_logistic_regression
from tests.tolerances import EXACT_F32, EXACT_F64, assert_close

sizes = st.tuples(st.integers(1, 30), st.integers(1, 6), st.integers(0, 2**32 - 1))


def _oracle_draws(seed, n, p, prior_precision):
    """The module docstring's recipe, replayed: X, then w, then the noise, from one generator."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, p))
    w = rng.standard_normal(p) / np.sqrt(prior_precision)
    return rng, X, w


@given(sizes, st.sampled_from([0.5, 1.0, 4.0]), st.sampled_from([0.25, 1.0, 100.0]))
def test_linear_regression_recipe(nps, noise_precision, prior_precision):
    n, p, seed = nps
    data = make_linear_regression(n, p, seed, noise_precision, prior_precision=prior_precision)
    rng, X, w = _oracle_draws(seed, n, p, prior_precision)
    e = rng.standard_normal(n) / np.sqrt(noise_precision)
    np.testing.assert_array_equal(data.X, X)
    np.testing.assert_array_equal(data.w, w)
    assert_close(data.y, np.array([sum(X[i, j] * w[j] for j in range(p)) for i in range(n)]) + e,
                 EXACT_F64, "y = X w + e")


@given(sizes, st.sampled_from([0.1, 1.0, 10.0]))
def test_logistic_regression_recipe(nps, prior_precision):
    n, p, seed = nps
    data = make_logistic_regression(n, p, seed, prior_precision=prior_precision)
    rng, X, w = _oracle_draws(seed, n, p, prior_precision)
    u = rng.random(n)
    prob = 1.0 / (1.0 + np.exp(-np.clip(X @ w, -700, 700)))
    np.testing.assert_array_equal(data.X, X)
    np.testing.assert_array_equal(data.w, w)
    np.testing.assert_array_equal(data.y, (u < prob).astype(float))


def test_deterministic_and_seed_dependent():
    a = make_logistic_regression(50, 3, seed=11)
    b = make_logistic_regression(50, 3, seed=11)
    c = make_logistic_regression(50, 3, seed=12)
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)
    assert not np.array_equal(a.X, c.X)
    assert set(np.unique(a.y).tolist()) <= {0.0, 1.0}


def test_float32_is_the_rounded_float64():
    for make, kw in ((make_linear_regression, {"noise_precision": 2.0}), (make_logistic_regression, {})):
        d64 = make(20, 4, 3, **kw)
        d32 = make(20, 4, 3, dtype=np.float32, **kw)
        for a, b in zip(d32, d64):
            assert a.dtype == np.float32
            assert_close(a, b, EXACT_F32, make.__name__)


@pytest.mark.parametrize("kwargs, match", [
    ({"n": 0}, r"n: expected an integer in \[1, inf\)"),
    ({"p": 2.0}, "p: expected an integer"),
    ({"seed": -1}, r"seed: expected an integer in \[0, inf\)"),
    ({"prior_precision": 0.0}, r"prior_precision: expected a value in \(0.0, inf\)"),
    ({"noise_precision": -1.0}, r"noise_precision: expected a value in \(0.0, inf\)"),
    ({"noise_precision": float("inf")},
     r"noise_precision: expected a finite real number in \(0.0, inf\), got inf"),
    ({"dtype": np.int32}, "dtype: expected float64 or float32, got int32"),
])
def test_bad_arguments(kwargs, match):
    args = {"n": 5, "p": 2, "seed": 0, "noise_precision": 1.0, **kwargs}
    with pytest.raises(ValueError, match=match):
        make_linear_regression(**args)
    if "noise_precision" not in kwargs:
        args.pop("noise_precision")
        with pytest.raises(ValueError, match=match):
            make_logistic_regression(**args)
