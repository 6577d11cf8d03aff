"""Bayes-by-Backprop (Blundell et al. 2015, arXiv:1505.05424): mean-field Gaussian VI with the
reparameterization trick, softplus standard deviations, the closed-form KL to a Gaussian prior,
and Adam on (mu, rho).

Implements (bbb.1)-(bbb.10) of derivations/bbb.md, with Adam (adam.1)-(adam.4) of the same note.
Symbols: q(theta) = N(mu, diag(sigma^2)); mu (D,) the mean; rho (D,) the unconstrained scale,
sigma = softplus(rho) = log(1 + exp(rho)) (D,); lam the prior precision (scalar or (D,)), prior
N(0, diag(1 / lam)); eps (D, S) standard-normal draws, one column per Monte Carlo sample
theta_s = mu + sigma * eps_s; a minibatch B of M rows out of N.

Objective (summed-loss convention, minimized)::

    F(mu, rho) = (N / (M S)) sum_s sum_{i in B} l_i(theta_s) + kl_weight * KL(q || p)   (bbb.3)

N / M scales the minibatch sum to the training set, 1 / S averages the S draws, kl_weight
multiplies the closed-form KL (1 is the ELBO; Blundell's minibatch weights pi_i correspond to
kl_weight = pi_i N / M, see the conventions table). No tempering (tau = 1), no data
augmentation; note that rho here is the softplus parameter, NOT the data-augmentation factor of
derivations/notation.md, which BBB does not use.

Gradients: the data term by the reparameterization trick from one summed backprop pass per draw
(``model.grad``, no per-example gradients), the KL term in closed form. Adam runs on the
concatenation [mu; rho] (2D,) with ONE AdamState, so both halves share alpha, beta1, beta2,
eps_adam and the bias-correction step count.

Examples
--------
One Bayes-by-Backprop step on 20 synthetic logistic-regression points; the caller draws the
minibatch and the standard-normal eps (a step draws nothing):

>>> import numpy as np
>>> from refbayes.datasets import make_logistic_regression
>>> from refbayes.methods import bbb
>>> from refbayes.models import LogisticRegression
>>> data = make_logistic_regression(20, 3, 0)     # N = 20 rows, 3 features, seed 0
>>> model = LogisticRegression(3)                 # D = 4 with the intercept
>>> state = bbb.init(np.zeros(model.D), sigma0=0.3)
>>> cfg = bbb.BBBConfig(N=20, lam=1.0, alpha=0.1)
>>> rng = np.random.default_rng(0)
>>> idx = rng.choice(20, size=8, replace=False)   # minibatch, M = 8
>>> eps = rng.standard_normal((model.D, 2))       # S = 2 draws
>>> batch = bbb.Batch(data.X[idx], data.y[idx].astype(float))
>>> state, info = bbb.step(state, batch, eps, cfg, model)
>>> state.mu.shape, state.rho.shape, info.delta.shape     # Adam runs on [mu; rho] (2 D,)
((4,), (4,), (8,))
"""
from __future__ import annotations

import math
import numbers
from typing import Any, NamedTuple

import numpy as np

from refbayes._checks import (
    check_array,
    check_at_construction,
    check_float,
    check_in_range,
    check_same_dtype,
)
from refbayes.backend import xp_of
from refbayes.methods._estimates import (
    Batch,
    check_batch,
    check_draws,
    check_model,
    check_N,
    check_t,
)
from refbayes.methods.adam import (
    AdamState,
    _adam,
    adam_init,
    check_adam_hyper,
    check_adam_state,
    check_lam,
)

__all__ = [
    "BBBConfig",
    "BBBInfo",
    "BBBState",
    "Batch",
    "dense_covariance",
    "init",
    "inv_softplus",
    "kl_divergence",
    "kl_gradients",
    "log_softplus",
    "prec_diag",
    "sample",
    "softplus",
    "step",
]

Array = Any


class BBBConfig(NamedTuple):
    """Bayes-by-Backprop hyperparameters; the Adam defaults are Kingma and Ba's.

    The SLANG UCI baseline used alpha = 0.01, beta2 = 0.99 (derivations/bbb.md, conventions).

    Each field is documented by its trailing comment.  ``step`` checks a cfg against the state
    and raises ValueError unless: N is an integer >= 1; lam is a finite real > 0 or a finite
    float (D,) array > 0 in the state's dtype; alpha and eps_adam are finite reals > 0; beta1
    and beta2 are in [0, 1); and kl_weight is a finite real >= 0.

    Construction (``BBBConfig(...)``, and unpickling) checks these rules too, except lam's
    length and dtype, known only with the state; ``_replace`` and ``_make`` do not, so the
    functions check every cfg again.
    """
    N: int                   # training-set size >= 1, minibatch sums scaled by N / M (bbb.3)
    lam: Any                 # prior precision, scalar or (D,), > 0 (bbb.7)
    alpha: float = 1e-3      # Adam step size > 0 (adam.4), (bbb.10)
    beta1: float = 0.9       # Adam first-moment decay in [0, 1) (adam.1)
    beta2: float = 0.999     # Adam second-moment decay in [0, 1) (adam.2)
    eps_adam: float = 1e-8   # Adam constant > 0 added to sqrt(v_hat) (adam.4)
    kl_weight: float = 1.0   # multiplies KL(q || p) in (bbb.3), >= 0


class BBBState(NamedTuple):
    """Bayes-by-Backprop state after t steps.

    Each field is documented by its trailing comment.  Every function that takes a state checks
    it and raises ValueError unless: mu is a finite float (float64 or float32) (D,) array; rho is
    a finite (D,) array of mu's dtype; t is an integer >= 0; and adam is an AdamState whose m, v
    are finite (2D,) arrays of mu's dtype with v >= 0 and whose t is an integer >= 0 (checked,
    though not read).
    """
    mu: Array         # mu_t, (D,), (bbb.10)
    rho: Array        # rho_t, (D,), sigma_t = softplus(rho_t), (bbb.1), (bbb.10)
    adam: AdamState   # moments of [mu; rho], (2D,) each, (adam.1), (adam.2); adam.t is not read
    t: int            # steps taken; drives the bias correction (adam.3)


class BBBInfo(NamedTuple):
    """The named intermediates of one Bayes-by-Backprop step, by equation.

    Each field is documented by its trailing comment (the equation tag last).
    """
    sigma: Array       # standard deviation softplus(rho_t), (D,)  (bbb.1)
    theta: Array       # theta_s = mu + sigma * eps_s, (D, S)  (bbb.2)
    g: Array           # g_s = sum_{i in B} grad l_i(theta_s), (S, D)  (bbb.4)
    g_hat: Array       # (N / (M S)) sum_s g_s: data gradient in mu, (D,)  (bbb.5)
    g_rho: Array       # (N / (M S)) sum_s g_s * eps_s * sigmoid(rho): data gradient in rho, (D,)  (bbb.6)
    kl: Array          # KL(q || p), 0-d  (bbb.7)
    grad_mu: Array     # dF/dmu = g_hat + kl_weight * lam * mu, (D,)  (bbb.8), (bbb.9)
    grad_rho: Array    # dF/drho = g_rho + kl_weight * dKL/drho, (D,)  (bbb.8), (bbb.9)
    loss_hat: Array    # (N / (M S)) sum_s sum_{i in B} l_i(theta_s), 0-d  (bbb.3)
    elbo: Array        # -(loss_hat + kl_weight * kl), the ELBO estimate, 0-d  (bbb.3)
    delta: Array       # Adam step on [mu; rho], (2D,)  (adam.4), (bbb.10)
    mu: Array          # mean mu_{t+1}, (D,)  (bbb.10)
    rho: Array         # scale parameter rho_{t+1}, (D,)  (bbb.10)


# ----------------------------------------------------------------------------- softplus

def softplus(rho):
    """Compute sigma = softplus(rho) = log(1 + exp(rho)) = logaddexp(0, rho).

    No overflow for large rho (it is rho + a rounding-level term), and log1p(exp(rho)) accuracy
    for very negative rho, where it underflows to 0 only when exp(rho) does (rho < -745 in
    float64).  No validation.  (bbb.1)

    Parameters
    ----------
    rho : array
        Unconstrained scale, any shape.

    Returns
    -------
    array
        The standard deviation sigma, shaped like rho.
    """
    return xp_of(rho).logaddexp(0.0, rho)  # (bbb.1)


def log_softplus(rho):
    """Compute log sigma = log softplus(rho), finite for every finite rho.

    Finite even where sigma underflows.  For rho < -36: with u = exp(rho) < 2.4e-16,
    log softplus(rho) = rho + log(log1p(u) / u) = rho - u / 2 + O(u^2), which is rho to
    rounding (``|u / 2| < 1.2e-16`` < half an ulp of ``|rho| >= 36``), so log sigma = rho
    there, also where u underflows (rho < -745).  For rho >= -36, sigma = logaddexp(0, rho)
    >= 2.3e-16 is a normal number with relative accuracy, and its log is safe.  Two elementwise
    passes, no cancellation.  No validation.  (bbb.1)

    Parameters
    ----------
    rho : array
        Unconstrained scale, any shape.

    Returns
    -------
    array
        The log standard deviation log sigma, shaped like rho.
    """
    xp = xp_of(rho)
    return xp.where(rho < -36.0, rho, xp.log(xp.logaddexp(0.0, xp.maximum(rho, -36.0))))  # (bbb.1)


def _log_sigmoid(xp, rho):
    """log sigmoid(rho) = -softplus(-rho), finite for every finite rho."""
    return -xp.logaddexp(0.0, -rho)


def _sigmoid(xp, rho):
    """sigmoid(rho) = d softplus / d rho = (1 + tanh(rho / 2)) / 2, overflow-free."""
    return 0.5 * (xp.tanh(0.5 * rho) + 1.0)


def inv_softplus(sigma):
    """Invert softplus: rho = log(expm1(sigma)) = sigma + log(-expm1(-sigma)) for sigma > 0.

    The right-hand form has no overflow for large sigma and no cancellation for small sigma.

    Parameters
    ----------
    sigma : array of shape (D,)
        Standard deviations, > 0.

    Returns
    -------
    array of shape (D,)
        The unconstrained scale rho with softplus(rho) = sigma.

    Raises
    ------
    ValueError
        If sigma is not a finite real 1-d array with every entry > 0.
    """
    xp = xp_of(sigma)
    check_array(sigma, "sigma", ndim=1)
    if not bool(xp.all(sigma > 0)):
        raise ValueError("sigma: expected > 0 everywhere (a standard deviation)")
    return sigma + xp.log(-xp.expm1(-sigma))


# ----------------------------------------------------------------------------- KL to the prior

def _log_lam(xp, lam):
    return math.log(lam) if isinstance(lam, float) else xp.log(lam)


def _kl(xp, mu, sigma, log_sigma, lam):
    """KL(N(mu, diag(sigma^2)) || N(0, diag(1 / lam)))
    = (1/2) sum_j [lam_j (sigma_j^2 + mu_j^2) - 1 - log lam_j - 2 log sigma_j], from sigma and
    log sigma = log_softplus(rho) computed once by the caller.  (bbb.7)"""
    terms = lam * (sigma * sigma + mu * mu) - 1.0 - _log_lam(xp, lam) - 2.0 * log_sigma
    return 0.5 * xp.sum(terms)  # (bbb.7)


def _kl_grads(xp, mu, rho, sigma, log_sigma, s, lam):
    """(dKL/dmu, dKL/drho) = (lam mu, (lam sigma - 1 / sigma) sigmoid(rho)), with
    sigmoid(rho) / sigma = exp(log sigmoid(rho) - log softplus(rho)) so rho -> -inf gives the
    exact limit -1 instead of 0 * inf; sigma, log sigma and s = sigmoid(rho) from the caller.
    (bbb.8)"""
    sig_over_sigma = xp.exp(_log_sigmoid(xp, rho) - log_sigma)
    return lam * mu, lam * sigma * s - sig_over_sigma  # (bbb.8)


def _scales(xp, rho):
    """sigma = softplus(rho), log sigma and sigmoid(rho), each computed once.  (bbb.1)

    log sigma is ``log_softplus(rho)`` bit for bit without its second logaddexp: where
    rho >= -36 that takes log(logaddexp(0, max(rho, -36))) = log(sigma), the same operations on
    the same value; below -36 it is rho (the log of a placeholder 1 there keeps log(0) away)."""
    sigma = softplus(rho)                                                        # (bbb.1)
    low = rho < -36.0
    log_sigma = xp.where(low, rho, xp.log(xp.where(low, 1.0, sigma)))            # (bbb.1)
    return sigma, log_sigma, _sigmoid(xp, rho)


def _check_mu_rho(mu, rho, prefix=""):
    check_array(mu, f"{prefix}mu", ndim=1)
    check_float(mu, f"{prefix}mu")
    D = mu.shape[0]
    check_array(rho, f"{prefix}rho", shape=(D,))
    check_same_dtype({f"{prefix}mu": mu, f"{prefix}rho": rho})
    return D


def kl_divergence(mu, rho, lam):
    """Compute KL(q || p) for q = N(mu, diag(softplus(rho)^2)) and p = N(0, diag(1 / lam)).

    KL = (1/2) sum_j [lam_j (sigma_j^2 + mu_j^2) - 1 - log lam_j - 2 log sigma_j].  (bbb.7)

    Parameters
    ----------
    mu : array of shape (D,)
        Mean of q.
    rho : array of shape (D,)
        Unconstrained scale, sigma = softplus(rho), same dtype as mu.
    lam : float or array of shape (D,)
        Prior precision, > 0 (an array in mu's dtype).

    Returns
    -------
    array of shape ()
        The divergence KL(q || p), as a 0-d array.

    Raises
    ------
    ValueError
        If mu is not a finite float 1-d array, rho not a finite (D,) array of mu's dtype, lam
        not a finite real > 0 or a (D,) float array > 0 of mu's dtype, or the arrays mix NumPy
        and CuPy.
    """
    xp = xp_of(mu, rho)
    D = _check_mu_rho(mu, rho)
    lam = check_lam(lam, D, mu.dtype, strict=True)
    sigma, log_sigma, _ = _scales(xp, rho)
    return _kl(xp, mu, sigma, log_sigma, lam)


def kl_gradients(mu, rho, lam):
    """Compute the gradients of ``kl_divergence`` in mu and rho.

    dKL/dmu = lam mu and dKL/drho = (lam sigma - 1 / sigma) sigmoid(rho).  (bbb.8)

    Parameters
    ----------
    mu : array of shape (D,)
        Mean of q.
    rho : array of shape (D,)
        Unconstrained scale, sigma = softplus(rho), same dtype as mu.
    lam : float or array of shape (D,)
        Prior precision, > 0 (an array in mu's dtype).

    Returns
    -------
    dkl_dmu : array of shape (D,)
        The gradient in mu.
    dkl_drho : array of shape (D,)
        The gradient in rho.

    Raises
    ------
    ValueError
        If mu, rho or lam is invalid, as for ``kl_divergence``.
    """
    xp = xp_of(mu, rho)
    D = _check_mu_rho(mu, rho)
    lam = check_lam(lam, D, mu.dtype, strict=True)
    return _kl_grads(xp, mu, rho, *_scales(xp, rho), lam)


# ----------------------------------------------------------------------------- state

def init(mu, sigma0=None, rho0=None) -> BBBState:
    """Create the initial BBBState at mean mu, with zero Adam moments on [mu; rho] and t = 0.

    The initial scale is given by exactly one of sigma0 or rho0.  The SLANG UCI baseline starts
    at mu = 0, rho0 = -1 (sigma0 = softplus(-1) = 0.3133).

    Parameters
    ----------
    mu : array of shape (D,)
        Initial mean.
    sigma0 : float or array of shape (D,), optional
        Initial standard deviation, > 0 (an array in mu's dtype).
    rho0 : float or array of shape (D,), optional
        Initial unconstrained scale (an array in mu's dtype).

    Returns
    -------
    BBBState
        The state (mu, rho, zero moments, 0).

    Raises
    ------
    ValueError
        If mu is not a finite float 1-d array; if both or neither of sigma0, rho0 is given;
        if the one given is not a finite real or a finite (D,) array of mu's dtype; or if
        sigma0 has an entry <= 0.
    """
    xp = xp_of(mu)
    check_array(mu, "mu", ndim=1)
    check_float(mu, "mu")
    D = mu.shape[0]
    if (sigma0 is None) == (rho0 is None):
        raise ValueError("sigma0, rho0: expected exactly one of them, got "
                         f"{'both' if sigma0 is not None else 'neither'}")
    name, value = ("sigma0", sigma0) if sigma0 is not None else ("rho0", rho0)
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise ValueError(f"{name}: expected a finite value, got {value}")
        value = xp.full(D, float(value), dtype=mu.dtype)
    check_array(value, name, shape=(D,))
    if value.dtype != mu.dtype:
        raise ValueError(f"{name}: expected dtype {mu.dtype} (mu's), got {value.dtype}")
    rho = inv_softplus(value) if name == "sigma0" else value
    return BBBState(mu, rho, adam_init(xp.concatenate([mu, rho])), 0)


def _check_state(state) -> int:
    if not isinstance(state, BBBState):
        raise ValueError(f"state: expected a BBBState, got {type(state).__name__}")
    D = _check_mu_rho(state.mu, state.rho, "state.")
    check_t(state.t)
    check_adam_state(state.adam, 2 * D, state.mu.dtype, "state.adam")
    return D


def _check_cfg(cfg, D=None, dtype=None):
    if not isinstance(cfg, BBBConfig):
        raise ValueError(f"cfg: expected a BBBConfig, got {type(cfg).__name__}")
    N = check_N(cfg.N)
    # every float finite (check_in_range rejects NaN, and inf at an open bound)
    lam = check_lam(cfg.lam, D, dtype, strict=True, name="cfg.lam")
    hyper = check_adam_hyper(cfg.alpha, cfg.beta1, cfg.beta2, cfg.eps_adam)
    kl_weight = check_in_range(cfg.kl_weight, "cfg.kl_weight", 0.0, math.inf, high_open=True)
    return N, lam, hyper, kl_weight


check_at_construction(BBBConfig, _check_cfg)  # D, dtype unknown: lam's length and dtype later


def _draws(mu, sigma, eps):
    """theta_s = mu + sigma * eps_s, (D, S).  (bbb.2)"""
    return mu[:, None] + sigma[:, None] * eps  # (bbb.2)


def sample(state: BBBState, eps):
    """Draw theta = mu + softplus(rho) * eps from q.

    (bbb.2)

    Parameters
    ----------
    state : BBBState
        The state.
    eps : array of shape (D, S)
        Standard-normal draws from the caller, one column per sample.

    Returns
    -------
    array of shape (D, S)
        The draws theta.

    Raises
    ------
    ValueError
        If state is invalid (see BBBState), eps is not a finite (D, S >= 1) array of the state's
        dtype, or the arrays mix NumPy and CuPy.
    """
    D = _check_state(state)
    xp_of(state.mu, eps)  # one backend
    check_draws(eps, D, state.mu.dtype)
    return _draws(state.mu, softplus(state.rho), eps)


def prec_diag(state: BBBState):
    """Compute the Gaussian's precision 1 / sigma^2 = exp(-2 log softplus(rho)).

    inf where 1 / sigma^2 overflows (rho < about -355 in float64).

    Parameters
    ----------
    state : BBBState
        The state.

    Returns
    -------
    array of shape (D,)
        The precision diagonal.

    Raises
    ------
    ValueError
        If state is invalid (see BBBState).
    """
    _check_state(state)
    with np.errstate(over="ignore"):
        return xp_of(state.rho).exp(-2.0 * log_softplus(state.rho))


def dense_covariance(state: BBBState):
    """Form the dense covariance diag(sigma^2), for tests.

    Parameters
    ----------
    state : BBBState
        The state.

    Returns
    -------
    array of shape (D, D)
        The covariance.

    Raises
    ------
    ValueError
        If state is invalid (see BBBState).
    """
    _check_state(state)
    sigma = softplus(state.rho)
    return xp_of(sigma).diag(sigma * sigma)


# ----------------------------------------------------------------------------- the step

def step(state: BBBState, batch, eps, cfg: BBBConfig, model) -> tuple[BBBState, BBBInfo]:
    """Take one Bayes-by-Backprop step, Adam on [mu; rho].

    (bbb.1)-(bbb.10), Adam (adam.1)-(adam.4).  Deterministic given its inputs.  Costs one
    batched forward and backward pass over the S draws (``model.sample_losses_and_grads``),
    which gives the gradients and the losses of the ELBO estimate in the info.

    Parameters
    ----------
    state : BBBState
        Current state.
    batch : Batch
        The minibatch rows Batch(X_B (M, n_in), y_B (M,)), 1 <= M <= N.
    eps : array of shape (D, S)
        Standard-normal draws, one column per MC sample, used for the gradient AND the ELBO
        estimate.
    cfg : BBBConfig
        Hyperparameters.
    model : FlatModel or CNN
        A refbayes.models model with D parameters.

    Returns
    -------
    state : BBBState
        The state after the step, t + 1.
    info : BBBInfo
        The step's intermediates, by equation.

    Raises
    ------
    ValueError
        If state or cfg is invalid (see BBBState, BBBConfig), model is not a FlatModel with D
        parameters, batch does not fit it (see Batch), eps is not a finite (D, S >= 1) array of
        the state's dtype, or the arrays mix NumPy and CuPy.
    """
    D = _check_state(state)
    xp = xp_of(state.mu, state.rho, eps)
    dtype = state.mu.dtype
    N, lam, (alpha, beta1, beta2, eps_adam), kl_weight = _check_cfg(cfg, D, dtype)
    check_model(model, D, cnn=True)
    X, y, M = check_batch(batch, model, N, dtype)
    S = check_draws(eps, D, dtype)
    mu, rho = state.mu, state.rho
    c = N / (M * S)
    sigma, log_sigma, s = _scales(xp, rho)                                          # (bbb.1)
    theta = _draws(mu, sigma, eps)                                                  # (bbb.2)
    losses, g = model.sample_losses_and_grads(xp.ascontiguousarray(theta.T), X, y)  # (bbb.3), (bbb.4)
    g_hat = c * g.sum(axis=0)                                                       # (bbb.5)
    g_rho = c * (g * eps.T).sum(axis=0) * s                                         # (bbb.6)
    kl = _kl(xp, mu, sigma, log_sigma, lam)                                         # (bbb.7)
    dkl_dmu, dkl_drho = _kl_grads(xp, mu, rho, sigma, log_sigma, s, lam)            # (bbb.8)
    # [dF/dmu; dF/drho] written into one fresh (2D,) array, Adam's input without a
    # concatenation; info.grad_mu, info.grad_rho are its halves (the printed sums bit for bit)
    grad = xp.empty(2 * D, dtype=dtype)
    grad_mu, grad_rho = grad[:D], grad[D:]
    xp.multiply(kl_weight, dkl_dmu, out=grad_mu)
    grad_mu += g_hat                                                                # (bbb.9)
    xp.multiply(kl_weight, dkl_drho, out=grad_rho)
    grad_rho += g_rho                                                               # (bbb.9)
    loss_hat = c * losses.sum()                                                     # (bbb.3)
    elbo = -(loss_hat + kl_weight * kl)                                             # (bbb.3)
    delta, adam = _adam(xp, grad, state.adam, alpha, beta1, beta2, eps_adam,
                        state.t)                                                    # (adam.1)-(adam.4)
    mu_new = mu + delta[:D]                                                         # (bbb.10)
    rho_new = rho + delta[D:]                                                       # (bbb.10)
    info = BBBInfo(sigma, theta, g, g_hat, g_rho, kl, grad_mu, grad_rho, loss_hat, elbo, delta,
                   mu_new, rho_new)
    return BBBState(mu_new, rho_new, adam, state.t + 1), info
