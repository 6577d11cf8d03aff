"""Predictive metrics shared by the experiments: NLL, accuracy, Brier score, ECE / MCE, and the
Gaussian and Monte Carlo mixture NLL of regression predictives.

Conventions: every metric is a MEAN over the M test points (never a sum); NLL in nats.
Classification metrics take the predictive class probabilities ``probs`` (M, C) (rows summing
to 1, e.g. an average of softmax outputs over posterior samples) and integer labels y (M,) in
{0, ..., C - 1}.

ECE and MCE are the top-label calibration errors with ``n_bins`` equal-width bins on [0, 1]
(torchmetrics' ``calibration_error(task="multiclass", norm="l1" / "max")``, the form Bergamin
et al. 2023 report, times 100 there): confidence c_i = max_k p_ik, bin b holds
c_i in [b / n_bins, (b + 1) / n_bins) (c_i = 1 in the last bin);
ECE = sum_b (|B_b| / M) |acc(B_b) - conf(B_b)|, MCE = max over non-empty bins of
|acc(B_b) - conf(B_b)|.

Brier score: (1 / M) sum_i sum_k (p_ik - 1[y_i = k])^2 (the multi-class form, in [0, 2]).
"""
from __future__ import annotations

import numpy as np
from scipy.special import logsumexp

__all__ = ["accuracy", "brier", "calibration_errors", "ece", "gaussian_nll", "mce",
           "mixture_gaussian_nll", "nll", "rmse"]

_TINY = np.finfo(np.float64).tiny


def _check_probs(probs, y):
    probs = np.asarray(probs, dtype=np.float64)
    y = np.asarray(y)
    if probs.ndim != 2 or probs.shape[0] < 1 or probs.shape[1] < 2:
        raise ValueError(f"probs: expected shape (M, C) with M >= 1 and C >= 2, got {probs.shape}")
    if not np.all(np.isfinite(probs)) or np.any(probs < 0) or \
            not np.allclose(probs.sum(axis=1), 1.0, rtol=0, atol=1e-6):
        raise ValueError("probs: expected finite rows of probabilities >= 0 summing to 1")
    if y.shape != (probs.shape[0],):
        raise ValueError(f"y: expected shape ({probs.shape[0]},), got {y.shape}")
    if not np.issubdtype(y.dtype, np.integer) or np.any(y < 0) or np.any(y >= probs.shape[1]):
        raise ValueError(f"y: expected integer labels in {{0, ..., {probs.shape[1] - 1}}}")
    return probs, y


def nll(probs, y) -> float:
    """Mean negative log predictive probability of the true label, -(1/M) sum_i log p_{i, y_i}.

    A probability of exactly 0 is clipped to the smallest normal float (a finite, huge loss).
    """
    probs, y = _check_probs(probs, y)
    p = probs[np.arange(y.shape[0]), y]
    return float(-np.mean(np.log(np.maximum(p, _TINY))))


def accuracy(probs, y) -> float:
    """Fraction of points whose most probable class (first one on ties) is the label."""
    probs, y = _check_probs(probs, y)
    return float(np.mean(np.argmax(probs, axis=1) == y))


def brier(probs, y) -> float:
    """Multi-class Brier score (1/M) sum_i sum_k (p_ik - 1[y_i = k])^2."""
    probs, y = _check_probs(probs, y)
    onehot = np.zeros_like(probs)
    onehot[np.arange(y.shape[0]), y] = 1.0
    return float(np.mean(np.sum((probs - onehot) ** 2, axis=1)))


def calibration_errors(probs, y, n_bins: int = 10) -> tuple:
    """(ECE, MCE): the top-label expected and maximum calibration errors (see the module)."""
    probs, y = _check_probs(probs, y)
    if not isinstance(n_bins, (int, np.integer)) or isinstance(n_bins, bool) or n_bins < 1:
        raise ValueError(f"n_bins: expected an integer >= 1, got {n_bins!r}")
    conf = probs.max(axis=1)
    correct = (np.argmax(probs, axis=1) == y).astype(np.float64)
    b = np.minimum((conf * n_bins).astype(int), n_bins - 1)
    count = np.bincount(b, minlength=n_bins)
    gaps = np.zeros(n_bins)
    full = count > 0
    gaps[full] = np.abs(np.bincount(b, correct, n_bins)[full] - np.bincount(b, conf, n_bins)[full]) \
        / count[full]
    return float(np.sum(count / y.shape[0] * gaps)), float(gaps[full].max())


def ece(probs, y, n_bins: int = 10) -> float:
    """Top-label expected calibration error with ``n_bins`` equal-width bins."""
    return calibration_errors(probs, y, n_bins)[0]


def mce(probs, y, n_bins: int = 10) -> float:
    """Top-label maximum calibration error with ``n_bins`` equal-width bins."""
    return calibration_errors(probs, y, n_bins)[1]


def _check_reg(y, *arrays):
    y = np.asarray(y, dtype=np.float64)
    if y.ndim != 1 or y.shape[0] < 1:
        raise ValueError(f"y: expected shape (M,) with M >= 1, got {y.shape}")
    return y


def gaussian_nll(mean, var, y) -> float:
    """Mean of -log N(y_i | mean_i, var_i), var_i > 0."""
    y = _check_reg(y)
    mean, var = np.asarray(mean, dtype=np.float64), np.asarray(var, dtype=np.float64)
    if mean.shape != y.shape or var.shape != y.shape:
        raise ValueError(f"mean, var: expected shape {y.shape}, got {mean.shape} and {var.shape}")
    if not np.all(var > 0):
        raise ValueError("var: expected entries > 0")
    return float(np.mean(0.5 * np.log(2 * np.pi * var) + 0.5 * (y - mean) ** 2 / var))


def mixture_gaussian_nll(F, noise_var: float, y) -> float:
    """Mean of -log (1/S) sum_s N(y_i | F[s, i], noise_var): the Monte Carlo predictive of S
    posterior samples' outputs F (S, M) under Gaussian noise of variance noise_var > 0."""
    y = _check_reg(y)
    F = np.asarray(F, dtype=np.float64)
    if F.ndim != 2 or F.shape[1] != y.shape[0] or F.shape[0] < 1:
        raise ValueError(f"F: expected shape (S, {y.shape[0]}) with S >= 1, got {F.shape}")
    if not noise_var > 0:
        raise ValueError(f"noise_var: expected a number > 0, got {noise_var!r}")
    logp = -0.5 * np.log(2 * np.pi * noise_var) - 0.5 * (y[None] - F) ** 2 / noise_var
    return float(-np.mean(logsumexp(logp, axis=0) - np.log(F.shape[0])))


def rmse(mean, y) -> float:
    """Root mean squared error sqrt((1/M) sum_i (y_i - mean_i)^2)."""
    y = _check_reg(y)
    mean = np.asarray(mean, dtype=np.float64)
    if mean.shape != y.shape:
        raise ValueError(f"mean: expected shape {y.shape}, got {mean.shape}")
    return float(np.sqrt(np.mean((y - mean) ** 2)))
