"""Exact Gaussian VI for Bayesian logistic (and linear) regression: the ground truth of SLANG.

Implements (exact_vi.1)-(exact_vi.10), (exact_vi.12), (exact_vi.13) of derivations/exact_vi.md.
Symbols: X (N, D) design (intercept column already appended by the caller), y (N,) labels in
{0, 1} (or real targets for ``likelihood="gaussian"``), lam (D,) per-coordinate prior precision
(prior N(0, diag(lam)^{-1})), mu (D,) mean, Sigma (D, D) covariance, var (D,) mean-field variances,
a_i = x_i^T theta ~ N(m_i, v_i) with m_i = x_i^T mu (N,), v_i = x_i^T Sigma x_i (N,),
E0, E1, E2 (N,) = E_q[log p(y_i | a_i)] and its first two a-derivatives under q.
Scaling: full batch, likelihood SUMMED over all N examples, no minibatch (M = N), no Monte Carlo
(S does not enter: expectations are Gauss-Hermite quadratures), no tempering (tau = 1).
The Gauss-Hermite rule is verified to 1e-12 absolute for 0 <= v <= V_EXACT = 400 and to 1e-11 up
to V_MAX = 1600 (the integrands grow like sqrt(v) and the sum's rounding with them),
``|m| <= M_MAX``; inputs outside that range raise ValueError.

The problem (X, y, lam, likelihood, noise_precision), checked by every function that takes it
(ValueError otherwise, naming the argument): X a finite float (N, D) array; lam a finite float
(D,) array > 0; y a finite float (N,) array, labels in {0, 1} for likelihood="logistic"; X, y and
lam of one dtype and one backend (NumPy or CuPy); likelihood one of LIKELIHOODS; noise_precision
None for "logistic" and a real number in (0, inf) for "gaussian".

Examples
--------
The exact full-covariance and mean-field Gaussian VI optima of Bayesian logistic regression on 20
synthetic points (deterministic: quadrature, no draws); the full Gaussian's ELBO is the larger:

>>> import numpy as np
>>> from refbayes.datasets import make_logistic_regression
>>> from refbayes.methods import exact_vi
>>> data = make_logistic_regression(20, 3, 0)     # N = 20 rows, 3 features, seed 0
>>> X1 = np.hstack([data.X, np.ones((20, 1))])    # the caller appends the intercept column
>>> y, lam = data.y.astype(float), np.ones(4)
>>> full, mf = exact_vi.fit_full(X1, y, lam), exact_vi.fit_meanfield(X1, y, lam)
>>> full.Sigma.shape, mf.var.shape, bool(full.elbo >= mf.elbo)
((4, 4), (4,), True)
"""
from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import numpy as np
from scipy.special import roots_hermite

from refbayes._checks import (
    check_array,
    check_binary,
    check_float,
    check_in_range,
    check_int,
    check_invertible_positive,
    check_positive,
    check_same_dtype,
    check_spd,
)
from refbayes.backend import cho_solve, cholesky, solve_triangular, xp_of
from refbayes.linalg import gaussian

__all__ = [
    "LIKELIHOODS",
    "M_MAX",
    "V_EXACT",
    "V_MAX",
    "ConvergenceError",
    "FullVIResult",
    "MeanFieldVIResult",
    "elbo",
    "elbo_grad",
    "elbo_grad_meanfield",
    "elbo_meanfield",
    "fit_full",
    "fit_meanfield",
    "gaussian_expectations",
    "gh_nodes",
    "grad_norm",
    "grad_norm_meanfield",
    "logistic_expectations",
    "logistic_predictive_nll",
]

Array = Any

# Verified range of the quadrature (tests/methods/test_exact_vi.py::test_gh_matches_quad).
V_MAX = 1600.0
V_EXACT = 400.0      # up to here 1e-12 absolute; (V_EXACT, V_MAX]: 1e-11 (rounding of larger integrands)
M_MAX = 500.0
LIKELIHOODS = ("logistic", "gaussian")
_N_MIN = 64          # nodes of the smallest rung; each rung is verified for v <= n / 32
_LOG_2PI = math.log(2 * math.pi)


class ConvergenceError(RuntimeError):
    """The solver hit max_iter (or its line search failed) before the gradient norm reached tol."""


class FullVIResult(NamedTuple):
    """The full-Gaussian VI optimum found by ``fit_full``.

    Each field is documented by its trailing comment.
    """
    mu: Array          # mean mu, (D,), (exact_vi.6)
    Sigma: Array       # covariance Sigma, (D, D), the inverse of the precision of (exact_vi.5)
    elbo: float        # ELBO (exact_vi.1) at (mu, Sigma)
    grad_norm: float   # gradient norm (exact_vi.4) at (mu, Sigma)
    n_iter: int        # number of accepted iterations


class MeanFieldVIResult(NamedTuple):
    """The mean-field VI optimum found by ``fit_meanfield``.

    Each field is documented by its trailing comment.
    """
    mu: Array          # mean mu, (D,), (exact_vi.6) with the mean-field variances
    var: Array         # variances var, (D,), the inverse of (exact_vi.8)
    elbo: float        # ELBO (exact_vi.1) with Sigma = diag(var)
    grad_norm: float   # gradient norm (exact_vi.9) at (mu, var)
    n_iter: int        # number of accepted iterations


# ----------------------------------------------------------------------------- quadrature

def gh_nodes(v_max: float) -> int:
    """Return the node count of the Gauss-Hermite rung used for variance v_max.

    The smallest n = 64 * 2^k with v_max <= n / 32.  (exact_vi.13)

    Parameters
    ----------
    v_max : float
        The variance, 0 <= v_max <= V_MAX.

    Returns
    -------
    int
        The number of nodes n.

    Raises
    ------
    ValueError
        If v_max is not a real number in [0, V_MAX].
    """
    v_max = check_in_range(v_max, "v_max", 0.0, V_MAX)
    n = _N_MIN
    while n / 32 < v_max:
        n *= 2
    return n


# The rungs n = 64 * 2^k up to the one that covers V_MAX, and the variance each covers (n / 32)
_RUNGS = tuple(_N_MIN * 2 ** k for k in range(int(math.ceil(math.log2(32 * V_MAX / _N_MIN))) + 1))
_RUNG_COVERS = tuple(n / 32 for n in _RUNGS)


def _gh_rungs(v):
    """gh_nodes(v_i) for every entry of the host array v at once (int64): the first rung whose
    n / 32 is >= v_i, by exact comparisons (searchsorted).  (exact_vi.13)  An entry outside
    [0, V_MAX] (or NaN) raises gh_nodes' ValueError."""
    v = np.asarray(v, dtype=np.float64)
    if v.size and not (float(v.min()) >= 0.0 and float(v.max()) <= V_MAX):
        bad = v[~((v >= 0.0) & (v <= V_MAX))][0]
        gh_nodes(float(bad))  # raises, naming v_max and the range
    k = np.searchsorted(np.asarray(_RUNG_COVERS), v, side="left")
    return np.asarray(_RUNGS, dtype=np.int64)[k]


@functools.cache
def _gh_rule(n: int):
    """Physicists' Gauss-Hermite nodes t_k and weights w_k / sqrt(pi) (they sum to 1), on the host."""
    t, w = roots_hermite(n)
    return t, w / math.sqrt(math.pi)


def _gh_expect(xp, m, v, fn):
    """E f(a_i) = sum_k w_k f(m_i + sqrt(2 v_i) t_k) (exact_vi.12), each datum with the rung of
    its own v_i (exact_vi.13), so one large v_i does not cost every datum thousands of nodes.
    ``fn(a, rows)`` returns f at the (n_rows, n) points a for the data ``rows``."""
    host_rungs = _gh_rungs(v.get() if hasattr(v, "get") else v)  # (exact_vi.13)
    rungs = xp.asarray(host_rungs)
    out = None
    for n in np.unique(host_rungs).tolist():
        rows = xp.nonzero(rungs == n)[0]
        t, w = _gh_rule(n)
        t, w = xp.asarray(t, dtype=m.dtype), xp.asarray(w, dtype=m.dtype)
        a = m[rows, None] + xp.sqrt(2 * v[rows])[:, None] * t[None, :]        # (exact_vi.12)
        vals = [f @ w for f in fn(a, rows)]                                   # (exact_vi.12)
        if out is None:
            out = [xp.empty(m.shape, dtype=m.dtype) for _ in vals]
        for o, val in zip(out, vals):
            o[rows] = val
    return out if out is not None else [xp.empty(0, dtype=m.dtype)] * 3


def _check_moments(m, v):
    """m, v (N,) float, same dtype, inside the verified quadrature range."""
    xp = xp_of(m, v)
    check_float(check_array(m, "m", ndim=1), "m")
    check_float(check_array(v, "v", shape=(m.shape[0],)), "v")
    check_same_dtype({"m": m, "v": v})
    if not m.size:
        return
    # one read-back for both ranges (a synchronisation on CuPy); the details only on failure
    if bool((xp.max(xp.abs(m)) <= M_MAX) & (xp.min(v) >= 0) & (xp.max(v) <= V_MAX)):
        return
    if float(xp.max(xp.abs(m))) > M_MAX:
        raise ValueError(f"m: expected |m| <= {M_MAX} (verified Gauss-Hermite range), "
                         f"got max |m| = {float(xp.max(xp.abs(m))):.4g}")
    if not (float(xp.min(v)) >= 0 and float(xp.max(v)) <= V_MAX):
        raise ValueError(f"v: expected 0 <= v <= {V_MAX} (verified Gauss-Hermite range), "
                         f"got [{float(xp.min(v)):.4g}, {float(xp.max(v)):.4g}]")


def _in_range(xp, m, v) -> bool:
    return bool(xp.all(xp.abs(m) <= M_MAX)) and bool(xp.all(v <= V_MAX)) and bool(xp.all(v >= 0))


def _logistic_expect(xp, m, v, y):
    """(E0, E1, E2) of the Bernoulli-logit likelihood, no checks (exact_vi.2), (exact_vi.12)."""
    def integrands(a, rows):
        s = (2 * y[rows] - 1)[:, None]
        return (-xp.logaddexp(0, -s * a),                                 # log sigma(s a), overflow-free
                xp.exp(-xp.logaddexp(0, -a)),                             # sigma(a)
                xp.exp(-xp.logaddexp(0, a) - xp.logaddexp(0, -a)))        # sigma(a) sigma(-a)
    E_logsig, E_sig, E_sigprime = _gh_expect(xp, m, v, integrands)
    # d/da log sigma(s a) = y - sigma(a); d^2/da^2 = -sigma(a) sigma(-a), for s = 2 y - 1.
    return E_logsig, y - E_sig, -E_sigprime                                  # (exact_vi.2)


def _gaussian_expect(xp, m, v, y, noise_precision):
    """(E0, E1, E2) of N(y | a, 1 / noise_precision) in closed form (exact_vi.10)."""
    r = y - m
    E0 = 0.5 * (math.log(noise_precision) - _LOG_2PI) - 0.5 * noise_precision * (r * r + v)  # (exact_vi.10)
    return E0, noise_precision * r, xp.full_like(m, -noise_precision)  # (exact_vi.10)


def logistic_expectations(m, v, y):
    """Compute the expected Bernoulli-logit log-likelihood and its a-derivatives under a ~ N(m, v).

    E_{a ~ N(m_i, v_i)} of log sigmoid(s_i a), of its a-derivative y_i - sigmoid(a) and of its
    second a-derivative -sigmoid(a) sigmoid(-a), s_i = 2 y_i - 1 (exact_vi.2), by Gauss-Hermite
    quadrature, each datum with the rung gh_nodes(v_i) of its own variance
    (exact_vi.12)-(exact_vi.13).  Accurate to 1e-12 absolute for 0 <= v <= V_EXACT (1e-11 up to
    V_MAX) and ``|m| <= M_MAX`` (verified against scipy.integrate.quad).

    Parameters
    ----------
    m : array of shape (N,)
        Means m_i of a_i.
    v : array of shape (N,)
        Variances v_i of a_i, same dtype as m.
    y : array of shape (N,)
        Labels in {0, 1}, in m's dtype.

    Returns
    -------
    E0 : array of shape (N,)
        E[log sigmoid(s_i a)].
    E1 : array of shape (N,)
        E[y_i - sigmoid(a)].
    E2 : array of shape (N,)
        E[-sigmoid(a) sigmoid(-a)].

    Raises
    ------
    ValueError
        If m is not a finite float 1-d array with ``|m| <= M_MAX``, v not a finite float (N,)
        array of m's dtype with 0 <= v <= V_MAX, y not a finite float (N,) array of m's dtype
        with labels in {0, 1}, or the arrays mix NumPy and CuPy.
    """
    xp = xp_of(m, v, y)
    _check_moments(m, v)
    _check_labels(xp, y, m.shape[0], m.dtype)
    return _logistic_expect(xp, m, v, y)


def gaussian_expectations(m, v, y, noise_precision):
    """Compute the expected Gaussian log-likelihood and its a-derivatives under a ~ N(m, v).

    E_{a ~ N(m_i, v_i)} of log N(y_i | a, 1/noise_precision) = (log(noise_precision / 2 pi)
    - noise_precision ((y_i - m_i)^2 + v_i)) / 2, and of its a-derivatives
    noise_precision (y_i - m_i) and -noise_precision, in closed form.  (exact_vi.10)

    Parameters
    ----------
    m : array of shape (N,)
        Means m_i of a_i.
    v : array of shape (N,)
        Variances v_i >= 0 of a_i, same dtype as m.
    y : array of shape (N,)
        Real targets, in m's dtype.
    noise_precision : float
        The likelihood's precision, > 0.

    Returns
    -------
    E0 : array of shape (N,)
        The expected log-likelihood.
    E1 : array of shape (N,)
        The expected first derivative noise_precision (y_i - m_i).
    E2 : array of shape (N,)
        The second derivative -noise_precision, for every i.

    Raises
    ------
    ValueError
        If m is not a finite float 1-d array, v not a finite float (N,) array >= 0, y not a
        finite float (N,) array, the dtypes differ, noise_precision is not a real number in
        (0, inf), or the arrays mix NumPy and CuPy.
    """
    xp = xp_of(m, v, y)
    check_float(check_array(m, "m", ndim=1), "m")
    check_float(check_array(v, "v", shape=(m.shape[0],)), "v")
    check_positive(v, "v", strict=False)
    check_float(check_array(y, "y", shape=(m.shape[0],)), "y")
    check_same_dtype({"m": m, "v": v, "y": y})
    noise_precision = _check_noise("gaussian", noise_precision)
    return _gaussian_expect(xp, m, v, y, noise_precision)


def logistic_predictive_nll(m, v, y):
    """Compute the negative log predictive probability -log E_{a ~ N(m_i, v_i)}[sigmoid(s_i a)].

    s_i = 2 y_i - 1: the negative log predictive probability of label y_i under q, in nats
    (exact_vi.11).  Gauss-Hermite as (exact_vi.12)-(exact_vi.13): the expectation is accurate to
    1e-12 absolute in the same (m, v) range, so the NLL is accurate to 1e-12 / p relative to
    the predictive probability p (1e-12 nats where p is not tiny).

    Parameters
    ----------
    m : array of shape (N,)
        Means m_i of a_i.
    v : array of shape (N,)
        Variances v_i of a_i, same dtype as m.
    y : array of shape (N,)
        Labels in {0, 1}, in m's dtype.

    Returns
    -------
    array of shape (N,)
        The negative log predictive probability of each label.

    Raises
    ------
    ValueError
        If m, v or y is invalid, as for ``logistic_expectations``.
    """
    xp = xp_of(m, v, y)
    _check_moments(m, v)
    _check_labels(xp, y, m.shape[0], m.dtype)

    def integrand(a, rows):
        s = (2 * y[rows] - 1)[:, None]
        return (xp.exp(-xp.logaddexp(0, -s * a)),)  # sigmoid(s a) without 1 - sigmoid cancellation

    return -xp.log(_gh_expect(xp, m, v, integrand)[0])  # (exact_vi.11)


# ----------------------------------------------------------------------------- validation

def _check_labels(xp, y, N, dtype):
    check_float(check_array(y, "y", shape=(N,)), "y")
    if y.dtype != dtype:
        raise ValueError(f"y: expected dtype {dtype} (that of the other inputs), got {y.dtype}")
    check_binary(y, "y", "labels in {0, 1} for likelihood='logistic'")


def _check_noise(likelihood, noise_precision):
    if likelihood not in LIKELIHOODS:
        raise ValueError(f"likelihood: expected one of {LIKELIHOODS}, got {likelihood!r}")
    if likelihood == "logistic":
        if noise_precision is not None:
            raise ValueError("noise_precision: expected None for likelihood='logistic', "
                             f"got {noise_precision!r}")
        return None
    if noise_precision is None:
        raise ValueError("noise_precision: expected a number > 0 for likelihood='gaussian', got None")
    return check_in_range(noise_precision, "noise_precision", 0.0, math.inf, low_open=True,
                          high_open=True)


def _check_problem(X, y, lam, likelihood, noise_precision):
    """Validate (X, y, lam) and the likelihood; return (xp, noise_precision)."""
    xp = xp_of(X, y, lam)
    check_float(check_array(X, "X", ndim=2), "X")
    N, D = X.shape
    check_float(check_array(lam, "lam", shape=(D,)), "lam")
    check_positive(lam, "lam")
    noise_precision = _check_noise(likelihood, noise_precision)
    if likelihood == "logistic":
        _check_labels(xp, y, N, X.dtype)
    else:
        check_float(check_array(y, "y", shape=(N,)), "y")
    check_same_dtype({"X": X, "y": y, "lam": lam})
    return xp, noise_precision


def _check_dtype(a, name, dtype):
    if a.dtype != dtype:
        raise ValueError(f"{name}: expected dtype {dtype} (that of X), got {a.dtype}")


def _check_mu(mu, D, dtype):
    check_float(check_array(mu, "mu", shape=(D,)), "mu")
    _check_dtype(mu, "mu", dtype)


def _check_Sigma(Sigma, D, dtype):
    """Sigma (D, D) SPD in dtype; returns its lower Cholesky factor."""
    check_float(check_array(Sigma, "Sigma", shape=(D, D)), "Sigma")
    _check_dtype(Sigma, "Sigma", dtype)
    return check_spd(Sigma, "Sigma")


def _check_var(var, D, dtype):
    check_float(check_array(var, "var", shape=(D,)), "var")
    _check_dtype(var, "var", dtype)
    check_invertible_positive(var, "var")  # > 0 with 1 / var finite (the KL uses it)


# ----------------------------------------------------------------------------- ELBO and gradients

def _expect(xp, X, y, m, v, noise_precision):
    """(E0, E1, E2) for the problem's likelihood; logistic inputs must be in the verified range."""
    if noise_precision is not None:
        return _gaussian_expect(xp, m, v, y, noise_precision)
    _check_moments(m, v)
    return _logistic_expect(xp, m, v, y)


def _chol_inverse(xp, L):
    """(L L^T)^{-1} = L^{-T} L^{-1}, symmetric by construction."""
    Linv = solve_triangular(L, xp.eye(L.shape[0], dtype=L.dtype), lower=True)
    return Linv.T @ Linv


def _kl_prior(q, lam):
    """KL(q || N(0, diag(lam)^{-1})) by (gaussian.3) with a diagonal p (exact_vi.3)."""
    return float(gaussian.kl(q, gaussian.DiagPrec(q.mu * 0, lam)))  # (exact_vi.3)


def _full_terms(xp, X, y, lam, mu, Sigma, noise_precision):
    """(E0, E1, E2) at m = X mu, v_i = x_i^T Sigma x_i (exact_vi.1)."""
    m = X @ mu
    v = xp.sum((X @ Sigma) * X, axis=1)
    return _expect(xp, X, y, m, v, noise_precision)


def _full_elbo(xp, X, y, lam, mu, Sigma, noise_precision):
    E0, _, _ = _full_terms(xp, X, y, lam, mu, Sigma, noise_precision)
    return float(xp.sum(E0)) - _kl_prior(gaussian.DenseCov(mu, Sigma), lam)  # (exact_vi.1)


def _target_precision(xp, X, lam, E2):
    """T = diag(lam) - sum_i E2_i x_i x_i^T (exact_vi.5)."""
    return xp.diag(lam) - X.T @ (E2[:, None] * X)


def _full_grad(xp, X, y, lam, mu, Sigma, Sigma_inv, noise_precision):
    _, E1, E2 = _full_terms(xp, X, y, lam, mu, Sigma, noise_precision)
    g_mu = X.T @ E1 - lam * mu                                                   # (exact_vi.3)
    g_Sigma = 0.5 * (Sigma_inv - _target_precision(xp, X, lam, E2))             # (exact_vi.4)
    return g_mu, g_Sigma


def elbo(X, y, lam, mu, Sigma, *, likelihood="logistic", noise_precision=None) -> float:
    """Compute the ELBO of a full Gaussian q = N(mu, Sigma).

    ELBO(mu, Sigma) = sum_i E_q[log p(y_i | a_i)] - KL(N(mu, Sigma) || N(0, diag(lam)^{-1}))
    with a_i ~ N(x_i^T mu, x_i^T Sigma x_i), summed over all N examples.  (exact_vi.1)

    Parameters
    ----------
    X : array of shape (N, D)
        Design, intercept column already appended by the caller.
    y : array of shape (N,)
        Labels in {0, 1} (logistic) or real targets (gaussian), in X's dtype.
    lam : array of shape (D,)
        Per-coordinate prior precision, > 0.
    mu : array of shape (D,)
        Mean of q, in X's dtype.
    Sigma : array of shape (D, D)
        Covariance of q, symmetric positive definite, in X's dtype.
    likelihood : {"logistic", "gaussian"}, default "logistic"
        Bernoulli-logit or Gaussian likelihood.
    noise_precision : float, optional
        The Gaussian likelihood's precision > 0; must be None for "logistic".

    Returns
    -------
    float
        The ELBO.

    Raises
    ------
    ValueError
        If the problem (X, y, lam, likelihood, noise_precision) is invalid (see
        refbayes.methods.exact_vi). Also if mu is not a finite float (D,) array or Sigma not a symmetric
        positive definite (D, D) array, in X's dtype; or (logistic) if some ``|m_i| > M_MAX`` or
        v_i > V_MAX.
    """
    xp, noise_precision = _check_problem(X, y, lam, likelihood, noise_precision)
    D = X.shape[1]
    _check_mu(mu, D, X.dtype)
    _check_Sigma(Sigma, D, X.dtype)
    return _full_elbo(xp, X, y, lam, mu, Sigma, noise_precision)


def elbo_grad(X, y, lam, mu, Sigma, *, likelihood="logistic", noise_precision=None):
    """Compute the ELBO gradients in mu and Sigma of a full Gaussian q.

    dELBO/dmu = sum_i E1_i x_i - lam * mu and
    dELBO/dSigma = (Sigma^{-1} - diag(lam) + sum_i E2_i x_i x_i^T) / 2, the symmetric matrix G
    with dELBO = <G, dSigma> for symmetric dSigma.  (exact_vi.3)-(exact_vi.4)

    Parameters
    ----------
    X : array of shape (N, D)
        Design, intercept column already appended by the caller.
    y : array of shape (N,)
        Labels in {0, 1} (logistic) or real targets (gaussian), in X's dtype.
    lam : array of shape (D,)
        Per-coordinate prior precision, > 0.
    mu : array of shape (D,)
        Mean of q, in X's dtype.
    Sigma : array of shape (D, D)
        Covariance of q, symmetric positive definite, in X's dtype.
    likelihood : {"logistic", "gaussian"}, default "logistic"
        Bernoulli-logit or Gaussian likelihood.
    noise_precision : float, optional
        The Gaussian likelihood's precision > 0; must be None for "logistic".

    Returns
    -------
    g_mu : array of shape (D,)
        The gradient in mu.
    g_Sigma : array of shape (D, D)
        The gradient in Sigma.

    Raises
    ------
    ValueError
        If any argument is invalid, as for ``elbo``.
    """
    xp, noise_precision = _check_problem(X, y, lam, likelihood, noise_precision)
    D = X.shape[1]
    _check_mu(mu, D, X.dtype)
    L_Sigma = _check_Sigma(Sigma, D, X.dtype)
    return _full_grad(xp, X, y, lam, mu, Sigma, _chol_inverse(xp, L_Sigma), noise_precision)


def grad_norm(g_mu, g_Sigma) -> float:
    """Compute the full-Gaussian solver's stopping quantity sqrt(||g_mu||^2 + ||g_Sigma||_F^2).

    (exact_vi.4)

    Parameters
    ----------
    g_mu : array of shape (D,)
        The gradient dELBO/dmu.
    g_Sigma : array of shape (D, D)
        The gradient dELBO/dSigma.

    Returns
    -------
    float
        The gradient norm.

    Raises
    ------
    ValueError
        If g_mu is not a finite real 1-d array, g_Sigma not a finite real (D, D) array, or the
        arrays mix NumPy and CuPy.
    """
    xp = xp_of(g_mu, g_Sigma)
    check_array(g_mu, "g_mu", ndim=1)
    check_array(g_Sigma, "g_Sigma", shape=(g_mu.shape[0], g_mu.shape[0]))
    return math.sqrt(float(xp.sum(g_mu * g_mu) + xp.sum(g_Sigma * g_Sigma)))


def _mf_terms(xp, X, y, lam, mu, var, noise_precision):
    m = X @ mu
    v = (X * X) @ var                                            # v_i = sum_j X_ij^2 var_j
    return _expect(xp, X, y, m, v, noise_precision)


def _mf_elbo(xp, X, y, lam, mu, var, noise_precision):
    E0, _, _ = _mf_terms(xp, X, y, lam, mu, var, noise_precision)
    return float(xp.sum(E0)) - _kl_prior(gaussian.DiagCov(mu, var), lam)  # (exact_vi.1)


def _mf_grad(xp, X, y, lam, mu, var, noise_precision):
    _, E1, E2 = _mf_terms(xp, X, y, lam, mu, var, noise_precision)
    g_mu = X.T @ E1 - lam * mu                                               # (exact_vi.3)
    g_var = 0.5 * (1 / var - (lam - (X * X).T @ E2))                         # (exact_vi.7)
    return g_mu, g_var


def elbo_meanfield(X, y, lam, mu, var, *, likelihood="logistic", noise_precision=None) -> float:
    """Compute the ELBO of a mean-field Gaussian q = N(mu, diag(var)).

    (exact_vi.1) with v_i = sum_j X_ij^2 var_j.

    Parameters
    ----------
    X : array of shape (N, D)
        Design, intercept column already appended by the caller.
    y : array of shape (N,)
        Labels in {0, 1} (logistic) or real targets (gaussian), in X's dtype.
    lam : array of shape (D,)
        Per-coordinate prior precision, > 0.
    mu : array of shape (D,)
        Mean of q, in X's dtype.
    var : array of shape (D,)
        Variances of q, > 0, in X's dtype.
    likelihood : {"logistic", "gaussian"}, default "logistic"
        Bernoulli-logit or Gaussian likelihood.
    noise_precision : float, optional
        The Gaussian likelihood's precision > 0; must be None for "logistic".

    Returns
    -------
    float
        The ELBO.

    Raises
    ------
    ValueError
        If the problem (X, y, lam, likelihood, noise_precision) is invalid (see
        refbayes.methods.exact_vi). Also if mu or var is not a finite float (D,) array in X's dtype, var
        has an entry <= 0, or (logistic) some ``|m_i| > M_MAX`` or v_i > V_MAX.
    """
    xp, noise_precision = _check_problem(X, y, lam, likelihood, noise_precision)
    _check_mu(mu, X.shape[1], X.dtype)
    _check_var(var, X.shape[1], X.dtype)
    return _mf_elbo(xp, X, y, lam, mu, var, noise_precision)


def elbo_grad_meanfield(X, y, lam, mu, var, *, likelihood="logistic", noise_precision=None):
    """Compute the ELBO gradients in mu and var of a mean-field Gaussian q.

    dELBO/dmu = sum_i E1_i x_i - lam * mu and dELBO/dvar = (1/var - lam + sum_i E2_i x_i^2) / 2.
    (exact_vi.3), (exact_vi.7)

    Parameters
    ----------
    X : array of shape (N, D)
        Design, intercept column already appended by the caller.
    y : array of shape (N,)
        Labels in {0, 1} (logistic) or real targets (gaussian), in X's dtype.
    lam : array of shape (D,)
        Per-coordinate prior precision, > 0.
    mu : array of shape (D,)
        Mean of q, in X's dtype.
    var : array of shape (D,)
        Variances of q, > 0, in X's dtype.
    likelihood : {"logistic", "gaussian"}, default "logistic"
        Bernoulli-logit or Gaussian likelihood.
    noise_precision : float, optional
        The Gaussian likelihood's precision > 0; must be None for "logistic".

    Returns
    -------
    g_mu : array of shape (D,)
        The gradient in mu.
    g_var : array of shape (D,)
        The gradient in var.

    Raises
    ------
    ValueError
        If any argument is invalid, as for ``elbo_meanfield``.
    """
    xp, noise_precision = _check_problem(X, y, lam, likelihood, noise_precision)
    _check_mu(mu, X.shape[1], X.dtype)
    _check_var(var, X.shape[1], X.dtype)
    return _mf_grad(xp, X, y, lam, mu, var, noise_precision)


def grad_norm_meanfield(g_mu, g_var) -> float:
    """Compute the mean-field stopping quantity sqrt(||g_mu||^2 + ||g_var||^2).

    (exact_vi.9)

    Parameters
    ----------
    g_mu : array of shape (D,)
        The gradient dELBO/dmu.
    g_var : array of shape (D,)
        The gradient dELBO/dvar.

    Returns
    -------
    float
        The gradient norm.

    Raises
    ------
    ValueError
        If g_mu is not a finite real 1-d array, g_var not a finite real (D,) array, or the
        arrays mix NumPy and CuPy.
    """
    xp = xp_of(g_mu, g_var)
    check_array(g_mu, "g_mu", ndim=1)
    check_array(g_var, "g_var", shape=(g_mu.shape[0],))
    return math.sqrt(float(xp.sum(g_mu * g_mu) + xp.sum(g_var * g_var)))


# ----------------------------------------------------------------------------- solvers

def _check_solver(tol, max_iter):
    tol = check_in_range(tol, "tol", 0.0, math.inf, low_open=True, high_open=True)
    return tol, check_int(max_iter, "max_iter", low=1)


def _accept(new: float, old: float) -> bool:
    """Armijo-free ascent test with rounding slack: near the optimum ELBO changes fall below
    the roundoff of a sum of N terms, and a full step must still be taken there."""
    return new >= old - 1e-13 * max(1.0, abs(old))


def _first_rho(rho0: float, gnorm: float, prev: float) -> float:
    """The first trial step of an iteration: halved when the gradient norm grew, doubled back
    towards 1 while it shrinks. Near the optimum the undamped map can have an eigenvalue just
    below -1 (seen on 50/50 splits of australian): the ELBO no longer tells the steps apart and
    the gradient oscillates and grows; the damped map (1 - rho) I + rho J contracts again."""
    return min(1.0, 2 * rho0) if gnorm < prev else 0.5 * rho0


def _line_search(trial, value: float, rho: float, where: str):
    """trial(rho) -> (..., elbo) or None (not SPD / outside the quadrature range); rho halved from
    the given start until the ELBO does not decrease (``_accept``). ``where`` names the solver,
    iteration and gradient norm for the ConvergenceError."""
    while True:
        out = trial(rho)
        if out is not None and _accept(out[-1], value):
            return out
        rho *= 0.5
        if rho < 1e-12:
            raise ConvergenceError(f"{where}: line search failed")


def _full_state(xp, X, y, lam, mu, Sigma_inv, noise_precision):
    """(Sigma, elbo) at a precision; None when Sigma_inv is not SPD or the moments leave the range."""
    try:
        L_P = cholesky(Sigma_inv)
    except np.linalg.LinAlgError:
        return None
    Sigma = _chol_inverse(xp, L_P)
    m, v = X @ mu, xp.sum((X @ Sigma) * X, axis=1)
    if noise_precision is None and not _in_range(xp, m, v):
        return None
    return Sigma, _full_elbo(xp, X, y, lam, mu, Sigma, noise_precision)


def fit_full(X, y, lam, *, tol=1e-10, max_iter=500, likelihood="logistic",
             noise_precision=None) -> FullVIResult:
    """Maximize the ELBO (exact_vi.1) over a full Gaussian N(mu, Sigma).

    Damped natural-gradient / Newton fixed point Sigma_inv <- (1 - rho) Sigma_inv + rho T,
    mu <- mu + rho T^{-1} dELBO/dmu (exact_vi.5)-(exact_vi.6), rho halved from its first trial
    (_first_rho) until the ELBO does not decrease, stopped when grad_norm <= tol.  Starts at
    mu = 0, Sigma_inv = diag(lam) + X^T X / 4 (logistic; every v_i <= 4 there) or the exact
    posterior precision (gaussian).

    Parameters
    ----------
    X : array of shape (N, D)
        Design, intercept column already appended by the caller.
    y : array of shape (N,)
        Labels in {0, 1} (logistic) or real targets (gaussian), in X's dtype.
    lam : array of shape (D,)
        Per-coordinate prior precision, > 0.
    tol : float, default 1e-10
        Stopping tolerance on ``grad_norm``, > 0.
    max_iter : int, default 500
        Maximum number of iterations, >= 1.
    likelihood : {"logistic", "gaussian"}, default "logistic"
        Bernoulli-logit or Gaussian likelihood.
    noise_precision : float, optional
        The Gaussian likelihood's precision > 0; must be None for "logistic".

    Returns
    -------
    FullVIResult
        The optimum (mu, Sigma, elbo, grad_norm, n_iter).

    Raises
    ------
    ValueError
        If the problem (X, y, lam, likelihood, noise_precision) is invalid (see
        refbayes.methods.exact_vi). Also if tol is not a real number in (0, inf), max_iter is not an
        integer >= 1, or (logistic) the starting point leaves the verified quadrature range.
    ConvergenceError
        If max_iter iterations pass, or a line search fails, before grad_norm <= tol.
    """
    xp, noise_precision = _check_problem(X, y, lam, likelihood, noise_precision)
    tol, max_iter = _check_solver(tol, max_iter)
    curv0 = 0.25 if noise_precision is None else noise_precision
    mu = xp.zeros_like(lam)
    Sigma_inv = xp.diag(lam) + curv0 * (X.T @ X)
    state = _full_state(xp, X, y, lam, mu, Sigma_inv, noise_precision)
    if state is None:
        raise ValueError("X: the starting point has x_i^T Sigma x_i or |x_i^T mu| outside the verified "
                         f"quadrature range (v <= {V_MAX}, |m| <= {M_MAX})")
    Sigma, value = state
    rho0, prev = 1.0, math.inf
    for it in range(max_iter + 1):
        _, E1, E2 = _full_terms(xp, X, y, lam, mu, Sigma, noise_precision)
        g_mu = X.T @ E1 - lam * mu                                               # (exact_vi.3)
        T = _target_precision(xp, X, lam, E2)                                    # (exact_vi.5)
        # Sigma^{-1} is the iterate itself: re-inverting Sigma would add rounding of order
        # eps * cond(Sigma) * |Sigma^{-1}|, a floor of ~1e-6 on ill-conditioned posteriors
        g_Sigma = 0.5 * (Sigma_inv - T)                                          # (exact_vi.4)
        gnorm = grad_norm(g_mu, g_Sigma)
        if gnorm <= tol:
            return FullVIResult(mu, Sigma, value, gnorm, it)
        if it == max_iter:
            break
        step = cho_solve(cholesky(T), g_mu)                   # (exact_vi.6)
        rho0, prev = _first_rho(rho0, gnorm, prev), gnorm

        def trial(rho):
            P_new = (1 - rho) * Sigma_inv + rho * T                              # (exact_vi.5)
            mu_new = mu + rho * step                                             # (exact_vi.6)
            state = _full_state(xp, X, y, lam, mu_new, P_new, noise_precision)
            return None if state is None else (mu_new, P_new, *state)

        mu, Sigma_inv, Sigma, value = _line_search(
            trial, value, rho0, f"fit_full at iteration {it} (grad_norm {gnorm:.3e}, tol {tol:.1e})")
    raise ConvergenceError(f"fit_full: max_iter={max_iter} reached with grad_norm {gnorm:.3e} > "
                           f"tol {tol:.1e}")


def _mf_state(xp, X, y, lam, mu, var, noise_precision):
    """ELBO at (mu, var); None when the moments leave the verified range."""
    m, v = X @ mu, (X * X) @ var
    if noise_precision is None and not _in_range(xp, m, v):
        return None
    return _mf_elbo(xp, X, y, lam, mu, var, noise_precision)


def fit_meanfield(X, y, lam, *, tol=1e-10, max_iter=500, likelihood="logistic",
                  noise_precision=None) -> MeanFieldVIResult:
    """Maximize the ELBO (exact_vi.1) over a mean-field Gaussian N(mu, diag(var)).

    Damped fixed point 1/var <- (1 - rho)/var + rho diag(T) (exact_vi.8),
    mu <- mu + rho T^{-1} dELBO/dmu (exact_vi.6) with the full T of (exact_vi.5) (the
    mu-Hessian does not factorize), rho chosen as in fit_full, stopped when
    grad_norm_meanfield <= tol (exact_vi.9).  Starts at mu = 0, 1/var = lam + diag(X^T X) / 4
    (logistic) or lam + noise_precision diag(X^T X) (gaussian).

    Parameters
    ----------
    X : array of shape (N, D)
        Design, intercept column already appended by the caller.
    y : array of shape (N,)
        Labels in {0, 1} (logistic) or real targets (gaussian), in X's dtype.
    lam : array of shape (D,)
        Per-coordinate prior precision, > 0.
    tol : float, default 1e-10
        Stopping tolerance on ``grad_norm_meanfield``, > 0.
    max_iter : int, default 500
        Maximum number of iterations, >= 1.
    likelihood : {"logistic", "gaussian"}, default "logistic"
        Bernoulli-logit or Gaussian likelihood.
    noise_precision : float, optional
        The Gaussian likelihood's precision > 0; must be None for "logistic".

    Returns
    -------
    MeanFieldVIResult
        The optimum (mu, var, elbo, grad_norm, n_iter).

    Raises
    ------
    ValueError
        If any argument is invalid, as for ``fit_full``.
    ConvergenceError
        If max_iter iterations pass, or a line search fails, before the gradient norm <= tol.
    """
    xp, noise_precision = _check_problem(X, y, lam, likelihood, noise_precision)
    tol, max_iter = _check_solver(tol, max_iter)
    curv0 = 0.25 if noise_precision is None else noise_precision
    mu = xp.zeros_like(lam)
    var = 1 / (lam + curv0 * xp.sum(X * X, axis=0))
    value = _mf_state(xp, X, y, lam, mu, var, noise_precision)
    if value is None:
        raise ValueError("X: the starting point has sum_j X_ij^2 var_j outside the verified "
                         f"quadrature range (v <= {V_MAX})")
    rho0, prev = 1.0, math.inf
    for it in range(max_iter + 1):
        g_mu, g_var = _mf_grad(xp, X, y, lam, mu, var, noise_precision)
        gnorm = grad_norm_meanfield(g_mu, g_var)
        if gnorm <= tol:
            return MeanFieldVIResult(mu, var, value, gnorm, it)
        if it == max_iter:
            break
        _, _, E2 = _mf_terms(xp, X, y, lam, mu, var, noise_precision)
        T = _target_precision(xp, X, lam, E2)                                    # (exact_vi.5)
        step = cho_solve(cholesky(T), g_mu)                   # (exact_vi.6)
        rho0, prev = _first_rho(rho0, gnorm, prev), gnorm

        def trial(rho):
            var_new = 1 / ((1 - rho) / var + rho * xp.diagonal(T))              # (exact_vi.8)
            mu_new = mu + rho * step                                             # (exact_vi.6)
            new = _mf_state(xp, X, y, lam, mu_new, var_new, noise_precision)
            return None if new is None else (mu_new, var_new, new)

        mu, var, value = _line_search(
            trial, value, rho0,
            f"fit_meanfield at iteration {it} (grad_norm {gnorm:.3e}, tol {tol:.1e})")
    raise ConvergenceError(f"fit_meanfield: max_iter={max_iter} reached with grad_norm {gnorm:.3e} > "
                           f"tol {tol:.1e}")
