"""Standardization against an exact per-column oracle; validation and random splits."""
import statistics

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from refbayes.datasets import (fit_standardizer, random_split, standardize, validation_split)
from tests.tolerances import EXACT_F64, exact, assert_close


def _oracle_moments(column):
    """Mean and population std by exact rational arithmetic (statistics); constant -> (value, 1)."""
    values = [float(v) for v in column]
    if len(set(values)) == 1:
        return values[0], 1.0
    return statistics.fmean(values), statistics.pstdev(values)


def _oracle_standardize(X, y, X_test, y_test):
    cols = [_oracle_moments(X[:, j]) for j in range(X.shape[1])]
    ym, ys = _oracle_moments(y)
    tx = lambda A: np.array([[(A[i, j] - cols[j][0]) / cols[j][1] for j in range(A.shape[1])]
                             for i in range(A.shape[0])]).reshape(A.shape)
    return tx(X), (y - ym) / ys, tx(X_test), (y_test - ym) / ys


@st.composite
def regression_split(draw, scales=(1e-3, 1.0, 7.5, 1e3), offsets=(0.0, 0.998, 288.0, -1e3)):
    n, n_test, p = draw(st.integers(2, 12)), draw(st.integers(1, 5)), draw(st.integers(1, 4))
    # Integer levels times a per-column scale, offset by at most 1e3 scales: |mean| / std stays
    # below ~1e3 (the bounded conditioning EXACT_F64 assumes), so the exact oracle and the
    # float64 computation agree to ~1e-13 relative.
    levels = lambda rows: np.array(draw(st.lists(st.integers(-50, 50), min_size=rows * p,
                                                 max_size=rows * p)), float).reshape(rows, p)
    scale = np.array(draw(st.lists(st.sampled_from(scales), min_size=p, max_size=p)))
    offset = draw(st.sampled_from(offsets))
    X, X_test = (levels(n) + offset) * scale, (levels(n_test) + offset) * scale
    if draw(st.booleans()):
        X[:, 0] = offset + 0.1  # a constant training column, as naval's
    y = np.array(draw(st.lists(st.integers(-20, 20), min_size=n, max_size=n)), float) * 0.3
    y_test = np.array(draw(st.lists(st.integers(-20, 20), min_size=n_test, max_size=n_test)), float)
    return X, y, X_test, y_test


@given(regression_split())
def test_standardize_matches_oracle(data):
    # checks (data.3)
    scaled, stats = standardize(*data)
    want = _oracle_standardize(*data)
    # Train and test are compared together so that the reference scale is the training one
    # (O(1) after standardization), not that of a possibly near-zero test value.
    assert_close(np.vstack([scaled.X_train, scaled.X_test]), np.vstack([want[0], want[2]]),
                 EXACT_F64, "X")
    assert_close(np.concatenate([scaled.y_train, scaled.y_test]), np.concatenate([want[1], want[3]]),
                 EXACT_F64, "y")
    # Train and test together, so the reference's scale is that of y_train (and y_mean).
    assert_close(stats.inverse_y(np.concatenate([scaled.y_train, scaled.y_test])),
                 np.concatenate([data[1], data[3]]), EXACT_F64, "inverse_y round trip")


# Offsets small against the spread: the float32 contract holds for well-conditioned columns
# (|mean| / std = O(1)); a large offset would measure the rounding of the inputs, not the code.
@given(regression_split(scales=(1.0, 7.5), offsets=(0.0, 0.998)))
def test_standardize_float32(data):
    data32 = [a.astype(np.float32) for a in data]
    scaled64, _ = standardize(*(a.astype(np.float64) for a in data32))
    scaled32, stats32 = standardize(*data32)
    assert all(a.dtype == np.float32 for a in scaled32) and stats32.x_mean.dtype == np.float32
    assert_close(np.vstack([scaled32.X_train, scaled32.X_test]),
                 np.vstack([scaled64.X_train, scaled64.X_test]), exact(np.float32), "float32 X")
    assert_close(np.concatenate([scaled32.y_train, scaled32.y_test]),
                 np.concatenate([scaled64.y_train, scaled64.y_test]), exact(np.float32), "float32 y")


def test_constant_columns_and_constant_target_are_exactly_zero():
    # checks (data.3)
    X = np.array([[0.998, 1.0], [0.998, 2.0], [0.998, 4.0]])
    y = np.full(3, 2.5)
    stats = fit_standardizer(X, y)
    assert stats.x_std[0] == 1.0 and stats.y_std == 1.0
    np.testing.assert_array_equal(stats.transform_X(X)[:, 0], 0.0)
    np.testing.assert_array_equal(stats.transform_y(y), 0.0)
    np.testing.assert_array_equal(stats.transform_X(np.array([[1.998, 1.0]]))[:, 0], [1.0])


def test_inverse_scale():
    stats = fit_standardizer(np.array([[1.0], [2.0]]), np.array([0.0, 4.0]))
    assert stats.y_std == 2.0 and stats.y_mean == 2.0
    np.testing.assert_array_equal(stats.inverse_scale(np.array([0.5, 1.0])), [1.0, 2.0])
    np.testing.assert_array_equal(stats.inverse_y(np.array([-1.0, 0.5])), [0.0, 3.0])


@pytest.mark.parametrize("args, match", [
    ((np.ones((3, 2)), np.ones(2), np.ones((1, 2)), np.ones(1)), r"y_train: expected shape \(3\)"),
    ((np.ones(3), np.ones(3), np.ones((1, 2)), np.ones(1)), "X_train: expected 2 dimensions"),
    ((np.ones((3, 2)), np.ones(3), np.ones((1, 3)), np.ones(1)), "X_test: expected 2 columns"),
    ((np.ones((3, 2)), np.ones(3), np.ones((1, 2)), np.ones(2)), r"y_test: expected shape \(1\)"),
    ((np.ones((3, 2), int), np.ones(3), np.ones((1, 2)), np.ones(1)), "expected floating arrays"),
    ((np.ones((3, 2)), np.ones(3, np.float32), np.ones((1, 2)), np.ones(1)), "expected one dtype"),
    ((np.ones((3, 2)), np.ones(3), np.ones((1, 2), np.float32), np.ones(1, np.float32)),
     "expected one dtype"),
    ((np.full((3, 2), np.nan), np.ones(3), np.ones((1, 2)), np.ones(1)), "X_train: expected finite"),
    ((np.ones((0, 2)), np.ones(0), np.ones((1, 2)), np.ones(1)), "X_train: expected at least 1 row"),
])
def test_standardize_bad_inputs(args, match):
    with pytest.raises(ValueError, match=match):
        standardize(*args)


def test_transform_bad_inputs():
    stats = fit_standardizer(np.ones((2, 3)), np.ones(2))
    with pytest.raises(ValueError, match=r"X: expected shape \(\*, 3\)"):
        stats.transform_X(np.ones((2, 2)))
    with pytest.raises(ValueError, match="expected one dtype"):
        stats.transform_X(np.ones((2, 3), np.float32))
    with pytest.raises(ValueError, match="y: expected 1 dimensions"):
        stats.transform_y(np.ones((2, 1)))


def test_validation_split_takes_the_last_fifth():
    # checks (data.2)
    X, y = np.arange(455.0 * 2).reshape(455, 2), np.arange(455.0)
    tv = validation_split(X, y)
    assert tv.X_train.shape == (364, 2) and tv.X_val.shape == (91, 2)  # int(0.8 * 455) = 364
    np.testing.assert_array_equal(tv.y_train, y[:364])
    np.testing.assert_array_equal(tv.y_val, y[364:])
    np.testing.assert_array_equal(np.vstack([tv.X_train, tv.X_val]), X)
    assert validation_split(X[:10], y[:10], frac=0.5).X_val.shape == (5, 2)


@pytest.mark.parametrize("n, frac, match", [(10, 0.0, r"frac: expected a value in \(0.0, 1.0\)"),
                                            (10, 1.0, r"frac: expected a value in \(0.0, 1.0\)"),
                                            (1, 0.2, "frac: expected both parts non-empty"),
                                            (5, 1e-20, "frac: expected both parts non-empty")])
def test_validation_split_bad(n, frac, match):
    with pytest.raises(ValueError, match=match):
        validation_split(np.ones((n, 2)), np.ones(n), frac=frac)


def test_validation_split_shape_mismatch():
    with pytest.raises(ValueError, match=r"y_train: expected shape \(4\)"):
        validation_split(np.ones((4, 2)), np.ones(3))


@pytest.mark.parametrize("n, frac, n_train, n_test", [(690, 0.5, 345, 345), (683, 0.5, 341, 342),
                                                      (10, 0.3, 7, 3), (10, 0.01, 9, 1)])
def test_random_split_sizes_and_contract(n, frac, n_train, n_test):
    # checks (data.1)
    train, test = random_split(n, np.random.default_rng(7), test_fraction=frac)
    assert train.size == n_train and test.size == n_test
    perm = np.random.default_rng(7).permutation(n)  # the documented construction
    np.testing.assert_array_equal(np.concatenate([train, test]), perm)
    again = random_split(n, np.random.default_rng(7), test_fraction=frac)
    np.testing.assert_array_equal(again[0], train)


def test_random_split_depends_on_the_generator():
    a, _ = random_split(100, np.random.default_rng(0))
    b, _ = random_split(100, np.random.default_rng(1))
    assert not np.array_equal(a, b)


@pytest.mark.parametrize("n, rng, frac, match", [
    (1, np.random.default_rng(0), 0.5, r"n: expected an integer in \[2, inf\)"),
    (10, np.random.RandomState(0), 0.5, "rng: expected a numpy.random.Generator, got RandomState"),
    (10, 0, 0.5, "rng: expected a numpy.random.Generator, got int"),
    (10, np.random.default_rng(0), 0.0, r"test_fraction: expected a value in \(0.0, 1.0\)"),
    (10, np.random.default_rng(0), 0.95, "test_fraction: expected a value leaving at least one"),
])
def test_random_split_bad(n, rng, frac, match):
    with pytest.raises(ValueError, match=match):
        random_split(n, rng, test_fraction=frac)
