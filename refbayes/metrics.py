"""Predictive metrics shared by the experiments: NLL, accuracy, Brier score, ECE / MCE, the
reliability curve, predictive entropy, AUROC (misclassification and out-of-distribution
detection), and the Gaussian and Monte Carlo mixture NLL of regression predictives.

Conventions: every metric is a MEAN over the M test points (never a sum); NLL and entropy in
nats. Classification metrics take the predictive class probabilities ``probs`` (M, C) (rows
summing to 1, e.g. an average of softmax outputs over posterior samples) and integer labels y (M,)
in {0, ..., C - 1}.

ECE and MCE are the top-label calibration errors with ``n_bins`` equal-width bins on [0, 1]
(torchmetrics' ``calibration_error(task="multiclass", norm="l1" / "max")``, the form Bergamin
et al. 2023 report, times 100 there): confidence c_i = max_k p_ik, bin b holds
c_i in [b / n_bins, (b + 1) / n_bins) (c_i = 1 in the last bin);
``ECE = sum_b (|B_b| / M) |acc(B_b) - conf(B_b)|``, MCE = max over non-empty bins of
``|acc(B_b) - conf(B_b)|``. ``reliability_curve`` returns the per-bin counts, conf(B_b) and acc(B_b)
of that same binning.

Brier score: (1 / M) sum_i sum_k (p_ik - 1[y_i = k])^2 (the multi-class form, in [0, 2]).

Predictive entropy: H_i = -sum_k p_ik log p_ik, with 0 log 0 = 0 (in [0, log C]).

AUROC of scores s (M,) for binary labels l (M,) (positives l_i = 1 should score higher): the
probability that a random positive outscores a random negative, ties counting 1/2,
AUROC = (1 / (n_pos n_neg)) sum_{i: l_i = 1} sum_{j: l_j = 0} (1[s_i > s_j] + 1[s_i = s_j] / 2)
(the Mann-Whitney U over n_pos n_neg; scikit-learn's ``roc_auc_score``), computed from average
ranks r_i of s: AUROC = (sum_{i: l_i = 1} r_i - n_pos (n_pos + 1) / 2) / (n_pos n_neg).
Misclassification AUROC (Hendrycks & Gimpel 2017, arXiv:1610.02136, with entropy as the score):
AUROC of the confidence -H_i for correct predictions (argmax_k p_ik = y_i, label 1) against wrong
ones (label 0). OOD AUROC: AUROC of H_i for out-of-distribution rows (label 1) against
in-distribution rows (label 0). Both are 0.5 for an uninformative score and 1 for a perfect one.

Backends: every function accepts NumPy or CuPy arrays (all of one backend per call: a mix raises
the ValueError of ``refbayes.backend.xp_of``), and CuPy arrays are copied to the host once, at
the public edge, with ``refbayes.backend.to_numpy`` (one explicit device-to-host copy per array
argument, no implicit synchronisation); the metric is then computed with NumPy and SciPy, so a
device input gives the NumPy result bit for bit. Scalar metrics return Python floats, and the
array-returning ``predictive_entropy`` and ``reliability_curve`` return NumPy arrays for either
backend. Why the host and not ``xp``: these are reporting functions whose result is a Python
float (or a small per-bin table) for a JSON/CSV row, so they must synchronise with the device
anyway; their inputs are small, (M, C) predictive probabilities or (M,) / (S, M) predictions, so
the copy is cheap next to the model evaluations that produced them; and the rank and special
functions they need (``scipy.stats.rankdata``, ``scipy.special.entr`` / ``logsumexp``) have no
CuPy path here, so an ``xp`` version would copy anyway, or reimplement them for no speed.
"""
from __future__ import annotations

import numpy as np
from scipy.special import entr, logsumexp
from scipy.stats import rankdata

from refbayes.backend import is_cupy_array, to_numpy, xp_of

__all__ = ["accuracy", "auroc", "brier", "calibration_errors", "ece", "gaussian_nll", "mce",
           "misclassification_auroc", "mixture_gaussian_nll", "nll", "ood_auroc",
           "predictive_entropy", "reliability_curve", "rmse"]

_TINY = np.finfo(np.float64).tiny


def _host(*arrays):
    """``arrays`` with each CuPy array replaced by its NumPy copy (one explicit transfer each) and
    everything else unchanged, after ``xp_of`` has refused a mix of NumPy and CuPy arrays."""
    xp_of(*arrays)
    return tuple(to_numpy(a) if is_cupy_array(a) else a for a in arrays)


def _check_prob_rows(probs, name="probs"):
    """The probs-only half of ``_check_probs``: (M, C), M >= 1, C >= 2, rows of probabilities."""
    probs = np.asarray(probs, dtype=np.float64)
    if probs.ndim != 2 or probs.shape[0] < 1 or probs.shape[1] < 2:
        raise ValueError(f"{name}: expected shape (M, C) with M >= 1 and C >= 2, got {probs.shape}")
    if not np.all(np.isfinite(probs)) or np.any(probs < 0) or \
            not np.allclose(probs.sum(axis=1), 1.0, rtol=0, atol=1e-6):
        raise ValueError(f"{name}: expected finite rows of probabilities >= 0 summing to 1")
    return probs


def _check_probs(probs, y):
    probs = _check_prob_rows(probs)
    y = np.asarray(y)
    if y.shape != (probs.shape[0],):
        raise ValueError(f"y: expected shape ({probs.shape[0]},), got {y.shape}")
    if not np.issubdtype(y.dtype, np.integer) or np.any(y < 0) or np.any(y >= probs.shape[1]):
        raise ValueError(f"y: expected integer labels in {{0, ..., {probs.shape[1] - 1}}}")
    return probs, y


def nll(probs, y) -> float:
    """Mean negative log predictive probability of the true label, -(1/M) sum_i log p_{i, y_i}.

    A probability of exactly 0 is clipped to the smallest normal float (a finite, huge loss).
    """
    probs, y = _host(probs, y)
    probs, y = _check_probs(probs, y)
    p = probs[np.arange(y.shape[0]), y]
    return float(-np.mean(np.log(np.maximum(p, _TINY))))


def accuracy(probs, y) -> float:
    """Fraction of points whose most probable class (first one on ties) is the label."""
    probs, y = _host(probs, y)
    probs, y = _check_probs(probs, y)
    return float(np.mean(np.argmax(probs, axis=1) == y))


def brier(probs, y) -> float:
    """Multi-class Brier score (1/M) sum_i sum_k (p_ik - 1[y_i = k])^2."""
    probs, y = _host(probs, y)
    probs, y = _check_probs(probs, y)
    onehot = np.zeros_like(probs)
    onehot[np.arange(y.shape[0]), y] = 1.0
    return float(np.mean(np.sum((probs - onehot) ** 2, axis=1)))


def _top_label_bins(probs, y, n_bins):
    """Bin index b_i = min(floor(c_i n_bins), n_bins - 1) of each confidence c_i, with c_i and the
    correctness 1[argmax_k p_ik = y_i]: the one binning of ``calibration_errors`` and
    ``reliability_curve``."""
    probs, y = _check_probs(probs, y)
    if not isinstance(n_bins, (int, np.integer)) or isinstance(n_bins, bool) or n_bins < 1:
        raise ValueError(f"n_bins: expected an integer >= 1, got {n_bins!r}")
    conf = probs.max(axis=1)
    correct = (np.argmax(probs, axis=1) == y).astype(np.float64)
    b = np.minimum((conf * n_bins).astype(int), n_bins - 1)
    return b, conf, correct


def calibration_errors(probs, y, n_bins: int = 10) -> tuple:
    """(ECE, MCE): the top-label expected and maximum calibration errors (see the module)."""
    probs, y = _host(probs, y)
    b, conf, correct = _top_label_bins(probs, y, n_bins)
    count = np.bincount(b, minlength=n_bins)
    gaps = np.zeros(n_bins)
    full = count > 0
    gaps[full] = np.abs(np.bincount(b, correct, n_bins)[full]
                        - np.bincount(b, conf, n_bins)[full]) / count[full]
    return float(np.sum(count / b.shape[0] * gaps)), float(gaps[full].max())


def reliability_curve(probs, y, n_bins: int = 15) -> dict:
    """Return the per-bin counts, mean confidences and accuracies of the top-label calibration.

    The bins are exactly those of ``calibration_errors``: equal-width bins on [0, 1], a confidence
    c_i = max_k p_ik goes in bin min(floor(c_i n_bins), n_bins - 1) (so c_i = 1 is in the last
    bin), and ``ECE = sum_b (count_b / M) |accuracy_b - confidence_b|`` over the non-empty bins.
    The default ``n_bins`` (15, the usual reliability-diagram resolution) differs from that of
    ``ece`` (10); pass the same value to both to compare them.

    Parameters
    ----------
    probs : array_like or cupy.ndarray, shape (M, C)
        Predictive class probabilities, rows summing to 1 (CuPy: copied to the host once).
    y : array_like or cupy.ndarray of int, shape (M,)
        Labels in {0, ..., C - 1}, on the backend of ``probs``.
    n_bins : int, default 15
        Number of equal-width bins, >= 1.

    Returns
    -------
    dict
        Of NumPy arrays, for NumPy and CuPy input alike. ``"count"``: int array (n_bins,), the
        number of points per bin (summing to M);
        ``"confidence"``: float array (n_bins,), the mean confidence per bin (NaN where empty);
        ``"accuracy"``: float array (n_bins,), the fraction of correct predictions (argmax,
        first class on ties) per bin (NaN where empty); ``"edges"``: float array (n_bins + 1,),
        ``numpy.linspace(0, 1, n_bins + 1)``, the nominal bin boundaries (for plotting; the
        assignment is the floor rule above).

    Raises
    ------
    ValueError
        If ``probs`` is not (M, C) rows of probabilities, ``y`` not (M,) integer labels in
        {0, ..., C - 1}, or ``n_bins`` not an integer >= 1, or the arrays mix NumPy and CuPy.
    """
    probs, y = _host(probs, y)
    b, conf, correct = _top_label_bins(probs, y, n_bins)
    count = np.bincount(b, minlength=n_bins)
    full = count > 0
    confidence = np.full(n_bins, np.nan)
    accuracy_ = np.full(n_bins, np.nan)
    confidence[full] = np.bincount(b, conf, n_bins)[full] / count[full]
    accuracy_[full] = np.bincount(b, correct, n_bins)[full] / count[full]
    return {"count": count, "confidence": confidence, "accuracy": accuracy_,
            "edges": np.linspace(0.0, 1.0, n_bins + 1)}


def ece(probs, y, n_bins: int = 10) -> float:
    """Top-label expected calibration error with ``n_bins`` equal-width bins."""
    return calibration_errors(probs, y, n_bins)[0]


def mce(probs, y, n_bins: int = 10) -> float:
    """Top-label maximum calibration error with ``n_bins`` equal-width bins."""
    return calibration_errors(probs, y, n_bins)[1]


def predictive_entropy(probs) -> np.ndarray:
    """Return the entropy of each row of predictive class probabilities, in nats.

    H_i = -sum_k p_ik log p_ik, with 0 log 0 = 0 exactly (``scipy.special.entr``, no clipping),
    so H_i is in [0, log C]: 0 for a one-hot row, log C for the uniform one.

    Parameters
    ----------
    probs : array_like or cupy.ndarray, shape (M, C)
        Predictive class probabilities, rows summing to 1 (CuPy: copied to the host once).

    Returns
    -------
    numpy.ndarray
        The entropies H (M,), float64: a NumPy array for CuPy input too.

    Raises
    ------
    ValueError
        If ``probs`` is not (M, C) with M >= 1, C >= 2, of finite entries >= 0 with rows
        summing to 1.
    """
    probs, = _host(probs)
    probs = _check_prob_rows(probs)
    return np.sum(entr(probs), axis=1)


def auroc(scores, labels) -> float:
    """Return the area under the ROC curve of real scores for binary labels.

    The probability that a random positive (label 1) scores higher than a random negative
    (label 0), ties counting 1/2: the Mann-Whitney U over n_pos n_neg, the value of
    scikit-learn's ``roc_auc_score``. Computed in O(M log M) from the average ranks r_i of the
    scores: AUROC = (sum_{i: labels_i = 1} r_i - n_pos (n_pos + 1) / 2) / (n_pos n_neg).

    Parameters
    ----------
    scores : array_like, shape (M,)
        Finite real scores, higher meaning "more likely positive".
    labels : array_like of int or bool, shape (M,)
        Binary labels in {0, 1}, with at least one of each.

    Returns
    -------
    float
        The AUROC, in [0, 1].

    Raises
    ------
    ValueError
        If ``scores`` is not a 1-D array of finite real numbers, ``labels`` does not have its
        shape, is not integer or bool, has a value outside {0, 1}, or lacks a positive or a
        negative, or the two mix NumPy and CuPy.
    """
    scores, labels = _host(scores, labels)
    scores, labels = np.asarray(scores), np.asarray(labels)
    if scores.ndim != 1 or scores.dtype.kind not in "biuf":
        raise ValueError(f"scores: expected a 1-D array (M,) of real numbers, got shape "
                         f"{scores.shape} and dtype {scores.dtype}")
    if not np.all(np.isfinite(scores)):
        raise ValueError("scores: expected finite values, got NaN or infinity")
    if labels.shape != scores.shape:
        raise ValueError(f"labels: expected the shape of scores {scores.shape}, got {labels.shape}")
    if labels.dtype.kind not in "biu" or np.any((labels != 0) & (labels != 1)):
        raise ValueError(f"labels: expected integer or bool labels in {{0, 1}}, got dtype "
                         f"{labels.dtype} with values {np.unique(labels)[:5]}")
    pos = labels == 1
    n_pos = int(np.count_nonzero(pos))
    n_neg = labels.shape[0] - n_pos
    if n_pos == 0 or n_neg == 0:
        raise ValueError(f"labels: expected at least one positive (1) and one negative (0), got "
                         f"{n_pos} positives and {n_neg} negatives")
    ranks = rankdata(scores)  # average ranks 1..M, ties share their mean rank
    return float((np.sum(ranks[pos]) - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def misclassification_auroc(probs, y) -> float:
    """Return the AUROC of negative predictive entropy for telling correct predictions from wrong.

    The misclassification-detection AUROC of Hendrycks & Gimpel (2017) with the confidence
    score -H_i (``predictive_entropy``): ``auroc`` of -H with label 1 where the prediction
    argmax_k p_ik (the first class on ties, as in ``accuracy``) equals y_i and label 0 where it
    does not. 1 means every correct prediction has a lower entropy than every wrong one.

    Parameters
    ----------
    probs : array_like, shape (M, C)
        Predictive class probabilities, rows summing to 1.
    y : array_like of int, shape (M,)
        Labels in {0, ..., C - 1}.

    Returns
    -------
    float
        The AUROC, in [0, 1].

    Raises
    ------
    ValueError
        If ``probs`` is not (M, C) rows of probabilities, ``y`` not (M,) integer labels in
        {0, ..., C - 1}, or the predictions are all correct or all wrong (the AUROC is then
        undefined), or the arrays mix NumPy and CuPy.
    """
    probs, y = _host(probs, y)
    probs, y = _check_probs(probs, y)
    correct = np.argmax(probs, axis=1) == y
    n_correct = int(np.count_nonzero(correct))
    if n_correct == 0 or n_correct == y.shape[0]:
        raise ValueError(f"probs, y: the misclassification AUROC needs both correct and wrong "
                         f"predictions, got {n_correct} correct out of {y.shape[0]}")
    return auroc(-predictive_entropy(probs), correct)


def ood_auroc(probs_in, probs_out) -> float:
    """Return the AUROC of predictive entropy for telling OOD rows from in-distribution ones.

    ``auroc`` of H (``predictive_entropy``) over the rows of both arrays, with label 1 for the
    out-of-distribution rows ``probs_out`` and 0 for the in-distribution rows ``probs_in``.
    1 means every out-of-distribution row has a higher entropy than every in-distribution one.

    Parameters
    ----------
    probs_in : array_like, shape (M_in, C)
        Predictive class probabilities on in-distribution inputs, rows summing to 1.
    probs_out : array_like, shape (M_out, C)
        Predictive class probabilities on out-of-distribution inputs, rows summing to 1.

    Returns
    -------
    float
        The AUROC, in [0, 1].

    Raises
    ------
    ValueError
        If either array is not (M, C) with M >= 1, C >= 2, of rows of probabilities, or the two
        have different numbers of classes C, or the two mix NumPy and CuPy.
    """
    probs_in, probs_out = _host(probs_in, probs_out)
    probs_in = _check_prob_rows(probs_in, "probs_in")
    probs_out = _check_prob_rows(probs_out, "probs_out")
    if probs_out.shape[1] != probs_in.shape[1]:
        raise ValueError(f"probs_out: expected {probs_in.shape[1]} classes (columns) like "
                         f"probs_in, got {probs_out.shape[1]}")
    scores = np.concatenate([predictive_entropy(probs_in), predictive_entropy(probs_out)])
    labels = np.concatenate([np.zeros(probs_in.shape[0], dtype=np.int64),
                             np.ones(probs_out.shape[0], dtype=np.int64)])
    return auroc(scores, labels)


def _check_reg(y, *arrays):
    y = np.asarray(y, dtype=np.float64)
    if y.ndim != 1 or y.shape[0] < 1:
        raise ValueError(f"y: expected shape (M,) with M >= 1, got {y.shape}")
    return y


def gaussian_nll(mean, var, y) -> float:
    """Mean of -log N(y_i | mean_i, var_i), var_i > 0."""
    mean, var, y = _host(mean, var, y)
    y = _check_reg(y)
    mean, var = np.asarray(mean, dtype=np.float64), np.asarray(var, dtype=np.float64)
    if mean.shape != y.shape or var.shape != y.shape:
        raise ValueError(f"mean, var: expected shape {y.shape}, got {mean.shape} and {var.shape}")
    if not np.all(var > 0):
        raise ValueError("var: expected entries > 0")
    return float(np.mean(0.5 * np.log(2 * np.pi * var) + 0.5 * (y - mean) ** 2 / var))


def mixture_gaussian_nll(F, noise_var: float, y) -> float:
    """Mean of -log (1/S) sum_s N(y_i | F[s, i], noise_var): the Monte Carlo predictive of S
    posterior samples' outputs F (S, M) under Gaussian noise of variance noise_var > 0
    (a number, or a 0-d array on the backend of F and y)."""
    if isinstance(noise_var, np.ndarray) or is_cupy_array(noise_var):
        F, noise_var, y = _host(F, noise_var, y)
    else:  # a Python or NumPy scalar goes with either backend
        F, y = _host(F, y)
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
    mean, y = _host(mean, y)
    y = _check_reg(y)
    mean = np.asarray(mean, dtype=np.float64)
    if mean.shape != y.shape:
        raise ValueError(f"mean: expected shape {y.shape}, got {mean.shape}")
    return float(np.sqrt(np.mean((y - mean) ** 2)))
