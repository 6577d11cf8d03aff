"""Protocol helpers: training-set standardization, Gal's validation split, seeded random splits."""
from __future__ import annotations

import math
from fractions import Fraction
from typing import NamedTuple

import numpy as np

from refbayes._checks import check_array, check_in_range, check_int, check_same_dtype
from refbayes.backend import xp_of
from refbayes.datasets._containers import TrainTest

__all__ = ["Standardizer", "fit_standardizer", "standardize", "TrainValidation",
           "validation_split", "random_split"]


def _check_xy(X, y, xname: str, yname: str):
    check_array(X, xname, ndim=2)
    check_array(y, yname, shape=(X.shape[0],))
    if X.dtype.kind != "f" or y.dtype.kind != "f":
        raise ValueError(f"{xname}, {yname}: expected floating arrays, got {X.dtype} and {y.dtype}")
    check_same_dtype({xname: X, yname: y})


class Standardizer(NamedTuple):
    """Training-set statistics; ``x' = (x - x_mean) / x_std``, ``y' = (y - y_mean) / y_std``."""
    x_mean: object  # (p,) column means of X_train; for a constant column, its value
    x_std: object   # (p,) population std (ddof=0) of X_train; 1 for a constant column
    y_mean: object  # () mean of y_train
    y_std: object   # () population std of y_train; 1 if y_train is constant

    def transform_X(self, X):
        """(X - x_mean) / x_std, for train, validation or test features alike."""
        xp_of(X, self.x_mean)
        check_array(X, "X", shape=(None, self.x_mean.shape[0]))
        check_same_dtype({"X": X, "x_mean": self.x_mean})
        return (X - self.x_mean) / self.x_std

    def transform_y(self, y):
        """(y - y_mean) / y_std."""
        xp_of(y, self.y_mean)
        check_array(y, "y", ndim=1)
        check_same_dtype({"y": y, "y_mean": self.y_mean})
        return (y - self.y_mean) / self.y_std

    def inverse_y(self, y_scaled):
        """y_scaled * y_std + y_mean: predictive means back in the original target units."""
        xp_of(y_scaled, self.y_mean)
        check_array(y_scaled, "y_scaled", ndim=(0, 1, 2))
        return y_scaled * self.y_std + self.y_mean

    def inverse_scale(self, s):
        """s * y_std: predictive standard deviations back in target units (variances need y_std**2)."""
        xp_of(s, self.y_std)
        check_array(s, "s", ndim=(0, 1, 2))
        return s * self.y_std


def _guarded_moments(A, xp):
    """Column means and population stds; a constant column gets (its value, 1).

    NOTE: Gal's code guards with ``std == 0``. That misses constant columns whose float mean is
    not exactly the repeated value: on naval column 11 (every entry 0.998) np.std returns
    2.4e-13, so his standardized column is a constant 1.0 instead of 0. Testing max == min is
    exact, and a constant column then maps to exactly 0.
    """
    mean, std = A.mean(axis=0), A.std(axis=0)
    constant = A.max(axis=0) == A.min(axis=0)
    mean = xp.where(constant, A[0], mean)
    std = xp.where(constant, xp.ones_like(std), std)  # (data.3)
    return mean, std


def fit_standardizer(X_train, y_train) -> Standardizer:
    """Column means and population stds of X_train and of y_train (training data only)."""
    xp = xp_of(X_train, y_train)
    _check_xy(X_train, y_train, "X_train", "y_train")
    if X_train.shape[0] < 1:
        raise ValueError(f"X_train: expected at least 1 row, got shape {tuple(X_train.shape)}")
    x_mean, x_std = _guarded_moments(X_train, xp)
    y_mean, y_std = _guarded_moments(y_train[:, None], xp)
    return Standardizer(x_mean, x_std, y_mean[0], y_std[0])


def standardize(X_train, y_train, X_test, y_test):
    """((X - x_mean) / x_std, (y - y_mean) / y_std) for train and test, with TRAIN statistics.

    Returns ``(TrainTest of the scaled arrays, Standardizer)``; map predictions back with
    ``stats.inverse_y`` / ``stats.inverse_scale`` to score them against the raw y_test, as Gal's
    protocol reports RMSE and log-likelihood in the original units.
    """
    xp_of(X_train, y_train, X_test, y_test)
    _check_xy(X_train, y_train, "X_train", "y_train")
    _check_xy(X_test, y_test, "X_test", "y_test")
    if X_test.shape[1] != X_train.shape[1]:
        raise ValueError(f"X_test: expected {X_train.shape[1]} columns like X_train, "
                         f"got shape {tuple(X_test.shape)}")
    check_same_dtype({"X_train": X_train, "X_test": X_test})
    stats = fit_standardizer(X_train, y_train)
    scaled = TrainTest(stats.transform_X(X_train), stats.transform_y(y_train),
                       stats.transform_X(X_test), stats.transform_y(y_test))
    return scaled, stats


class TrainValidation(NamedTuple):
    X_train: object  # (n_fit, p) first part of the training split
    y_train: object  # (n_fit,)
    X_val: object    # (n - n_fit, p) last part of the training split
    y_val: object    # (n - n_fit,)


def validation_split(X_train, y_train, frac=0.2) -> TrainValidation:
    """Gal's hold-out: the LAST ``n - int((1 - frac) * n)`` training rows become validation.

    No shuffling and no test data involved; with frac = 0.2 this is his ``int(0.8 * n)`` cut.
    """
    xp_of(X_train, y_train)
    check_array(X_train, "X_train", ndim=2)
    check_array(y_train, "y_train", shape=(X_train.shape[0],))
    frac = check_in_range(frac, "frac", 0.0, 1.0, low_open=True, high_open=True)
    n = X_train.shape[0]
    n_fit = int((1.0 - frac) * n)  # (data.2)
    if n_fit < 1 or n_fit >= n:
        raise ValueError(f"frac: expected both parts non-empty for n = {n} rows, got frac={frac} "
                         f"({n_fit} fit rows, {n - n_fit} validation rows)")
    return TrainValidation(X_train[:n_fit], y_train[:n_fit], X_train[n_fit:], y_train[n_fit:])


def random_split(n, rng, test_fraction=0.5):
    """(train_idx, test_idx) = (perm[:n_train], perm[n_train:]), perm = rng.permutation(n).

    n_test = ceil(test_fraction * n) computed exactly (on the binary value of test_fraction), so
    n = 683 with 0.5 gives 341 train / 342 test, as in the Vadam breast-cancer presplit. This is
    the per-seed 50/50 split of the SLANG logistic-regression protocol; the caller owns ``rng``.
    """
    n = check_int(n, "n", low=2)
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng: expected a numpy.random.Generator, got {type(rng).__name__}")
    test_fraction = check_in_range(test_fraction, "test_fraction", 0.0, 1.0,
                                   low_open=True, high_open=True)
    n_test = math.ceil(Fraction(test_fraction) * n)
    if n_test >= n:
        raise ValueError(f"test_fraction: expected a value leaving at least one training row "
                         f"for n = {n}, got {test_fraction}")
    perm = rng.permutation(n)
    return perm[: n - n_test], perm[n - n_test:]  # (data.1)
