"""Synthetic regression and classification problems with known weights (no files needed).

Both generators draw, from ``numpy.random.default_rng(seed)`` and in this order:
X with i.i.d. N(0, 1) entries (n, p), then the true weights w ~ N(0, I / prior_precision) (p,),
then the noise (n,). They are deterministic given ``seed``; arrays are drawn in float64 and then
cast, so a float32 result is the float64 one rounded. They return NumPy arrays; move them to a
GPU explicitly with ``cupy.asarray``.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy.special import expit

from refbayes._checks import check_in_range, check_int
from refbayes.datasets._containers import float_dtype

__all__ = ["Synthetic", "make_linear_regression", "make_logistic_regression"]


class Synthetic(NamedTuple):
    X: np.ndarray  # (n, p) standard-normal design
    y: np.ndarray  # (n,) targets (regression) or labels in {0, 1} (classification)
    w: np.ndarray  # (p,) the true weights the data were generated from


def _check_common(n, p, seed, prior_precision, dtype):
    n = check_int(n, "n", low=1)
    p = check_int(p, "p", low=1)
    seed = check_int(seed, "seed", low=0)
    prior_precision = check_in_range(prior_precision, "prior_precision", 0.0, float("inf"),
                                     low_open=True, high_open=True)
    return n, p, seed, prior_precision, float_dtype(dtype)


def _design_and_weights(rng, n, p, prior_precision):
    X = rng.standard_normal((n, p))
    w = rng.standard_normal(p) / np.sqrt(prior_precision)
    return X, w


def make_linear_regression(n, p, seed, noise_precision, *, prior_precision=1.0,
                           dtype=np.float64) -> Synthetic:
    """y = X w + e, e ~ N(0, I / noise_precision), w ~ N(0, I / prior_precision), X_ij ~ N(0, 1).

    The exact posterior of w is Gaussian with precision prior_precision I + noise_precision X^T X,
    which the methods' posterior-recovery tests use as ground truth.
    """
    n, p, seed, prior_precision, dt = _check_common(n, p, seed, prior_precision, dtype)
    noise_precision = check_in_range(noise_precision, "noise_precision", 0.0, float("inf"),
                                     low_open=True, high_open=True)
    rng = np.random.default_rng(seed)
    X, w = _design_and_weights(rng, n, p, prior_precision)
    y = X @ w + rng.standard_normal(n) / np.sqrt(noise_precision)
    return Synthetic(X.astype(dt), y.astype(dt), w.astype(dt))


def make_logistic_regression(n, p, seed, *, prior_precision=1.0, dtype=np.float64) -> Synthetic:
    """y_i = 1[u_i < sigmoid(x_i^T w)], u_i ~ U(0, 1): y_i ~ Bernoulli(sigmoid(x_i^T w)).

    w ~ N(0, I / prior_precision), X_ij ~ N(0, 1); labels are 0.0 / 1.0. No intercept column
    (models append one themselves, as the design guide says).
    """
    n, p, seed, prior_precision, dt = _check_common(n, p, seed, prior_precision, dtype)
    rng = np.random.default_rng(seed)
    X, w = _design_and_weights(rng, n, p, prior_precision)
    u = rng.random(n)
    # expit is the overflow-free logistic sigmoid.
    y = (u < expit(X @ w)).astype(np.float64)
    return Synthetic(X.astype(dt), y.astype(dt), w.astype(dt))
