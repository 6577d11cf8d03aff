"""Observation models p(y | f) on a network output f, as functions of f.

Implements (peg.17)-(peg.19) of derivations/per_example_gradients.md. For each example i with
output f_i (K,) and target y_i, the per-example loss is the full negative log-likelihood
``l_i = -log p(y_i | f_i)`` (constants included), and each likelihood gives

- ``losses(f, y)``      -> l (M,)               the per-example negative log-likelihoods,
- ``grad_f(f, y)``      -> r (M, K)             r_i = dl_i/df_i (the backprop seed),
- ``hess_f(f, y)``      -> H (M, K, K)          H_i = d^2 l_i / df_i^2 (the GGN's middle factor),
- ``hess_factor(f, y)`` -> C (M, K, R)          a square-root factor, H_i = C_i C_i^T,
- ``mean(f)``           -> the predictive mean (probabilities for classification).

Target conventions (validated by ``check_targets``):

- ``Gaussian``: real targets, shape (M,) when K == 1, or (M, K); cast to f's dtype.
- ``Bernoulli``: K == 1, labels in {0, 1}, shape (M,).
- ``Categorical``: K == C >= 2, labels in {0, ..., C-1}, shape (M,).

Labels may be integer or bool arrays, or float arrays holding exactly those integers (0.0, 1.0,
...); any other value is an error.

The methods taking (f, y) check them and raise ValueError unless f is a finite float (M, K)
array with this likelihood's number of columns K, y passes ``check_targets`` (the conventions
above), and the two do not mix NumPy and CuPy.

The instances hold hyperparameters only. Every method is backend-generic (NumPy or CuPy); the
private ``_losses(ns, f, y)`` also accepts ``autograd.numpy`` as ``ns`` for the autograd oracle.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from refbayes._checks import check_array, check_in_range, value_checks
from refbayes.backend import xp_of

__all__ = ["Gaussian", "Bernoulli", "Categorical", "make_likelihood", "LIKELIHOODS"]

LIKELIHOODS = ("gaussian", "bernoulli", "categorical")


def _sigmoid(ns, f):
    """sigma(f) = (1 + tanh(f / 2)) / 2: the tanh form never overflows, unlike 1 / (1 + exp(-f))."""
    return 0.5 * (ns.tanh(0.5 * f) + 1.0)


def _log_softmax(ns, f):
    """log softmax(f) = f - logsumexp(f), with the row max shifted out so exp cannot overflow."""
    shifted = f - ns.max(f, axis=-1, keepdims=True)
    return shifted - ns.log(ns.sum(ns.exp(shifted), axis=-1, keepdims=True))


def _check_outputs(f, name="f"):
    check_array(f, name, ndim=2)
    if f.dtype.kind != "f":
        raise ValueError(f"{name}: expected a floating array, got dtype {f.dtype}")
    return f


def _check_labels(y, M, n_classes, name="y"):
    """Labels of shape (M,) in {0, ..., n_classes - 1}: integer or bool dtype, or floats that are
    exactly those integers (datasets often store 0.0 / 1.0); returned unchanged. The value scans
    are skipped inside ``refbayes.unchecked()``, the shape check is not."""
    xp = xp_of(y)
    check_array(y, name, shape=(M,))
    if not value_checks():  # inside refbayes.unchecked(): a driver checked every label once
        return y
    if y.dtype.kind == "f" and not bool(xp.all(y == xp.floor(y))):
        raise ValueError(f"{name}: expected integer class labels in {{0, ..., {n_classes - 1}}}, "
                         "got non-integer values")
    if bool(xp.any(y < 0)) or bool(xp.any(y >= n_classes)):
        raise ValueError(f"{name}: expected labels in {{0, ..., {n_classes - 1}}}, "
                         f"got values in [{y.min()}, {y.max()}]")
    return y


class _Likelihood:
    """Shared public wrappers: validate (f, y), then call the unchecked private formula."""

    name: ClassVar[str]

    def losses(self, f, y):
        """Compute the per-example negative log-likelihoods l_i = -log p(y_i | f_i).

        The formula is this likelihood's (peg.17)-(peg.19); constants included.

        Parameters
        ----------
        f : array of shape (M, K)
            Network outputs (floating dtype).
        y : array of shape (M,) or (M, K)
            Targets: labels (M,) for bernoulli and categorical; reals (M,) (K == 1) or (M, K)
            for gaussian.

        Returns
        -------
        array of shape (M,)
            The losses l_i.

        Raises
        ------
        ValueError
            If f or y is invalid (see refbayes.models.likelihoods).
        """
        xp = xp_of(f, y)
        f, y = self._validated(f, y)
        return self._losses(xp, f, y)

    def grad_f(self, f, y):
        """Compute the output gradients r_i = dl_i / df_i (the backprop seed).

        The formula is this likelihood's (peg.17)-(peg.19).

        Parameters
        ----------
        f : array of shape (M, K)
            Network outputs (floating dtype).
        y : array of shape (M,) or (M, K)
            Targets: labels (M,) for bernoulli and categorical; reals (M,) (K == 1) or (M, K)
            for gaussian.

        Returns
        -------
        array of shape (M, K)
            The gradients r.

        Raises
        ------
        ValueError
            If f or y is invalid (see refbayes.models.likelihoods).
        """
        xp_of(f, y)  # refuses a NumPy / CuPy mix before any work
        f, y = self._validated(f, y)
        return self._grad_f(f, y)

    def hess_f(self, f, y):
        """Compute the output Hessians H_i = d^2 l_i / df_i df_i^T (the GGN's middle factor).

        The formula is this likelihood's (peg.17)-(peg.19).

        Parameters
        ----------
        f : array of shape (M, K)
            Network outputs (floating dtype).
        y : array of shape (M,) or (M, K)
            Targets: labels (M,) for bernoulli and categorical; reals (M,) (K == 1) or (M, K)
            for gaussian.

        Returns
        -------
        array of shape (M, K, K)
            The Hessians H.

        Raises
        ------
        ValueError
            If f or y is invalid (see refbayes.models.likelihoods).
        """
        xp_of(f, y)  # refuses a NumPy / CuPy mix before any work
        f, y = self._validated(f, y)
        return self._hess_f(f, y)

    def hess_factor(self, f, y):
        """Compute square-root factors C_i with C_i C_i^T = H_i.

        R = K for gaussian and categorical, R = 1 for bernoulli.  (peg.17)-(peg.19)

        Parameters
        ----------
        f : array of shape (M, K)
            Network outputs (floating dtype).
        y : array of shape (M,) or (M, K)
            Targets: labels (M,) for bernoulli and categorical; reals (M,) (K == 1) or (M, K)
            for gaussian.

        Returns
        -------
        array of shape (M, K, R)
            The factors C.

        Raises
        ------
        ValueError
            If f or y is invalid (see refbayes.models.likelihoods).
        """
        xp_of(f, y)  # refuses a NumPy / CuPy mix before any work
        f, y = self._validated(f, y)
        return self._hess_factor(f, y)

    def mean(self, f):
        """Compute the predictive mean E[y | f].

        Parameters
        ----------
        f : array of shape (M, K)
            Network outputs (floating dtype).

        Returns
        -------
        array of shape (M, K) or (M,)
            Gaussian: f (M, K); bernoulli: p(y = 1) (M,); categorical: probabilities (M, K).

        Raises
        ------
        ValueError
            If f is not a finite floating 2-d array with this likelihood's number of columns.
        """
        xp = xp_of(f)
        _check_outputs(f)
        self._check_width(f.shape[1])
        return self._mean(xp, f)

    def _validated(self, f, y):
        _check_outputs(f)
        self._check_width(f.shape[1])
        return f, self.check_targets(y, f.shape[0], f.shape[1], f.dtype)


@dataclass(frozen=True)
class Gaussian(_Likelihood):
    """Gaussian likelihood y_i ~ N(f_i, tau^{-1} I_K), tau = ``noise_precision``.

    l_i = tau/2 ||y_i - f_i||^2 + K/2 log(2 pi / tau);  r_i = tau (f_i - y_i);  H_i = tau I_K;
    C_i = sqrt(tau) I_K.  ``mean(f)`` is f (M, K).  (peg.17)

    Parameters
    ----------
    noise_precision : float, default 1.0
        Noise precision tau, 0 < tau < inf.

    Raises
    ------
    ValueError
        If noise_precision is not a real number in (0, inf).
    """
    noise_precision: float = 1.0
    name: ClassVar[str] = "gaussian"

    def __post_init__(self):
        # stored as a Python float: a NumPy float64 scalar would promote float32 arrays (NEP 50)
        object.__setattr__(self, "noise_precision", check_in_range(
            self.noise_precision, "noise_precision", 0.0, math.inf, low_open=True, high_open=True))

    def _check_width(self, K):
        if K < 1:
            raise ValueError(f"f: expected at least one output column for the gaussian likelihood, got {K}")

    def check_targets(self, y, M, K, dtype):
        """Validate gaussian targets: y (M,) when K == 1, or (M, K), finite reals.

        Parameters
        ----------
        y : array
            Targets to validate.
        M : int
            Number of examples (rows of f).
        K : int
            Number of outputs (columns of f).
        dtype : numpy dtype
            Dtype of f.

        Returns
        -------
        array of shape (M, K)
            The targets, reshaped to (M, K) and cast to ``dtype``.

        Raises
        ------
        ValueError
            If y is not a finite real 1-d or 2-d array, is 1-d while K != 1, or its shape is
            not (M,) or (M, K).
        """
        check_array(y, "y", ndim=(1, 2))
        if y.ndim == 1 and K != 1:
            raise ValueError(f"y: expected shape ({M}, {K}) for {K} gaussian outputs, got {tuple(y.shape)}")
        check_array(y, "y", shape=(M,) if y.ndim == 1 else (M, K))
        return y.reshape(M, K).astype(dtype, copy=False)

    def _losses(self, ns, f, y):
        K = f.shape[1]
        const = 0.5 * K * math.log(2.0 * math.pi / self.noise_precision)
        return 0.5 * self.noise_precision * ns.sum((y - f) ** 2, axis=1) + const  # (peg.17)

    def _grad_f(self, f, y):
        return self.noise_precision * (f - y)  # (peg.17)

    def _hess_f(self, f, y):
        xp = xp_of(f)
        M, K = f.shape
        eye = xp.eye(K, dtype=f.dtype) * self.noise_precision  # (peg.17)
        return xp.broadcast_to(eye, (M, K, K)).copy()

    def _hess_factor(self, f, y):
        xp = xp_of(f)
        M, K = f.shape
        eye = xp.eye(K, dtype=f.dtype) * math.sqrt(self.noise_precision)  # (peg.17)
        return xp.broadcast_to(eye, (M, K, K)).copy()

    def _mean(self, xp, f):
        return f


@dataclass(frozen=True)
class Bernoulli(_Likelihood):
    """Bernoulli likelihood: y_i in {0, 1}, p(y_i = 1 | f_i) = sigma(f_i) on one logit (K = 1).

    l_i = softplus(f_i) - y_i f_i;  r_i = sigma(f_i) - y_i;  H_i = sigma(f_i)(1 - sigma(f_i));
    C_i = sqrt(H_i).  ``mean(f)`` is p(y = 1) with shape (M,).  (peg.18)
    """
    name: ClassVar[str] = "bernoulli"

    def _check_width(self, K):
        if K != 1:
            raise ValueError(f"f: expected 1 output column (one logit) for the bernoulli likelihood, got {K}")

    def check_targets(self, y, M, K, dtype):
        """Validate labels (M,) in {0, 1} (integer, bool, or integer-valued float dtype).

        Parameters
        ----------
        y : array
            Targets to validate.
        M : int
            Number of examples (rows of f).
        K : int
            Number of outputs (columns of f).
        dtype : numpy dtype
            Dtype of f.

        Returns
        -------
        array of shape (M,)
            The labels, unchanged.

        Raises
        ------
        ValueError
            If y is not a finite real (M,) array, holds non-integer floats, or has labels
            outside {0, 1}.
        """
        return _check_labels(y, M, 2)

    def _losses(self, ns, f, y):
        # softplus(f) = log(1 + e^f) = logaddexp(0, f): finite for every finite f
        # y enters as a boolean mask so integer labels cannot promote float32 outputs to float64
        return ns.logaddexp(0.0, f[:, 0]) - f[:, 0] * (y == 1)  # (peg.18)

    def _grad_f(self, f, y):
        xp = xp_of(f)
        return _sigmoid(xp, f) - y[:, None].astype(f.dtype)  # (peg.18)

    def _hess_f(self, f, y):
        xp = xp_of(f)
        # sigma(f) sigma(-f) = exp(-softplus(f) - softplus(-f)): relative accuracy at any |f|,
        # where s (1 - s) cancels in 1 - s for large positive f (1e-3 relative error at f = 30)
        return xp.exp(-(xp.logaddexp(0.0, f) + xp.logaddexp(0.0, -f)))[:, :, None]  # (peg.18)

    def _hess_factor(self, f, y):
        return self._hess_f(f, y) ** 0.5  # (peg.18)

    def _mean(self, xp, f):
        return _sigmoid(xp, f[:, 0])


@dataclass(frozen=True)
class Categorical(_Likelihood):
    """Categorical likelihood: p(y_i = c | f_i) = softmax(f_i)_c on C >= 2 logits, y_i < C.

    l_i = logsumexp(f_i) - f_{i, y_i};  r_i = p_i - e_{y_i};  H_i = diag(p_i) - p_i p_i^T;
    C_i = diag(sqrt p_i) - p_i sqrt(p_i)^T (C x C), using sum_c p_ic = 1.
    ``mean(f)`` is the probability matrix p (M, C).  (peg.19)
    """
    name: ClassVar[str] = "categorical"

    def _check_width(self, K):
        if K < 2:
            raise ValueError(f"f: expected >= 2 output columns (logits) for the categorical likelihood, got {K}")

    def check_targets(self, y, M, K, dtype):
        """Validate labels (M,) in {0, ..., K-1} (integer, bool, or integer-valued float dtype).

        Parameters
        ----------
        y : array
            Targets to validate.
        M : int
            Number of examples (rows of f).
        K : int
            Number of outputs (columns of f).
        dtype : numpy dtype
            Dtype of f.

        Returns
        -------
        array of shape (M,)
            The labels, unchanged.

        Raises
        ------
        ValueError
            If y is not a finite real (M,) array, holds non-integer floats, or has labels
            outside {0, ..., K-1}.
        """
        return _check_labels(y, M, K)

    def _losses(self, ns, f, y):
        logp = _log_softmax(ns, f)
        M, K = f.shape
        # one-hot contraction instead of fancy indexing: valid for NumPy, CuPy and autograd alike
        onehot = (y[:, None] == ns.arange(K)[None, :])
        return -ns.sum(logp * onehot, axis=1)  # (peg.19)

    def _probs(self, f):
        xp = xp_of(f)
        return xp.exp(_log_softmax(xp, f))

    def _grad_f(self, f, y):
        xp = xp_of(f)
        K = f.shape[1]
        onehot = (y[:, None] == xp.arange(K)[None, :]).astype(f.dtype)
        return self._probs(f) - onehot  # (peg.19)

    def _hess_f(self, f, y):
        xp = xp_of(f)
        p = self._probs(f)
        K = f.shape[1]
        return p[:, :, None] * xp.eye(K, dtype=f.dtype) - p[:, :, None] * p[:, None, :]  # (peg.19)

    def _hess_factor(self, f, y):
        xp = xp_of(f)
        p = self._probs(f)
        sq = xp.sqrt(p)
        K = f.shape[1]
        return sq[:, :, None] * xp.eye(K, dtype=f.dtype) - p[:, :, None] * sq[:, None, :]  # (peg.19)

    def _mean(self, xp, f):
        return self._probs(f)


def make_likelihood(name: str, noise_precision: float = 1.0) -> _Likelihood:
    """Build the likelihood called ``name``.

    Parameters
    ----------
    name : {"gaussian", "bernoulli", "categorical"}
        One of LIKELIHOODS.
    noise_precision : float, default 1.0
        The gaussian's noise precision tau > 0, finite; the other likelihoods ignore it, but
        it must still be in range (a NaN never passes silently).

    Returns
    -------
    Gaussian, Bernoulli or Categorical
        The likelihood instance.

    Raises
    ------
    ValueError
        If name is not one of LIKELIHOODS, or noise_precision is not a finite number > 0.
    """
    check_in_range(noise_precision, "noise_precision", 0.0, math.inf, low_open=True,
                   high_open=True)
    if name == "gaussian":
        return Gaussian(noise_precision)
    if name == "bernoulli":
        return Bernoulli()
    if name == "categorical":
        return Categorical()
    raise ValueError(f"likelihood: expected one of {LIKELIHOODS}, got {name!r}")
