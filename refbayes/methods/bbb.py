"""Bayes-by-Backprop (Blundell et al. 2015, arXiv:1505.05424): mean-field Gaussian VI with the
reparameterization trick, softplus standard deviations, the closed-form KL to a Gaussian prior,
and Adam on (mu, rho).

Implements (bbb.1)-(bbb.10) of derivations/bbb.md, with Adam (adam.1)-(adam.4) of the same note.
Symbols: q(theta) = N(mu, diag(sigma^2)); mu (D,) the mean; rho (D,) the unconstrained scale,
sigma = softplus(rho) = log(1 + exp(rho)) (D,); lam the prior precision (scalar or (D,)), prior
N(0, diag(1 / lam)); eps (D, S) standard-normal draws, one column per Monte Carlo sample
theta_s = mu + sigma * eps_s; a minibatch B of M rows out of N.

Objective (summed-loss convention, minimized):

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
"""
from __future__ import annotations

import math
import numbers
from typing import Any, NamedTuple

import numpy as np

from refbayes._checks import check_array, check_float, check_in_range, check_same_dtype
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
    """Hyperparameters; the Adam defaults are Kingma and Ba's (the SLANG UCI baseline used
    alpha = 0.01, beta2 = 0.99: derivations/bbb.md, conventions)."""
    N: int                   # training-set size, minibatch sums scaled by N / M (bbb.3)
    lam: Any                 # prior precision, scalar or (D,), > 0 (bbb.7)
    alpha: float = 1e-3      # Adam step size (adam.4), (bbb.10)
    beta1: float = 0.9       # (adam.1)
    beta2: float = 0.999     # (adam.2)
    eps_adam: float = 1e-8   # (adam.4)
    kl_weight: float = 1.0   # multiplies KL(q || p) in (bbb.3), >= 0


class BBBState(NamedTuple):
    mu: Array         # mu_t, (D,), (bbb.10)
    rho: Array        # rho_t, (D,), sigma_t = softplus(rho_t), (bbb.1), (bbb.10)
    adam: AdamState   # moments of [mu; rho], (2D,) each, (adam.1)-(adam.2); adam.t is not read
    t: int            # steps taken; drives the bias correction (adam.3)


class BBBInfo(NamedTuple):
    sigma: Array       # softplus(rho_t), (D,)  (bbb.1)
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
    mu: Array          # mu_{t+1}, (D,)  (bbb.10)
    rho: Array         # rho_{t+1}, (D,)  (bbb.10)


# ----------------------------------------------------------------------------- softplus

def softplus(rho):
    """sigma = log(1 + exp(rho)) = logaddexp(0, rho): no overflow for large rho (it is rho + a
    rounding-level term), and log1p(exp(rho)) accuracy for very negative rho, where it
    underflows to 0 only when exp(rho) does (rho < -745 in float64).  (bbb.1)"""
    return xp_of(rho).logaddexp(0.0, rho)  # (bbb.1)


def log_softplus(rho):
    """log sigma = log softplus(rho), finite for every finite rho even where sigma underflows.

    For rho <= 0, with u = exp(rho) in (0, 1]: log softplus(rho) = rho + log(log1p(u) / u), and
    log1p(u) / u -> 1 as u -> 0 (taken as 1 where u underflows to 0), so log sigma = rho there,
    the exact limit. For rho > 0, sigma >= log 2 and the plain log is safe.  (bbb.1)
    """
    xp = xp_of(rho)
    neg = xp.minimum(rho, 0)
    u = xp.exp(neg)
    u_safe = xp.where(u > 0, u, 1)
    ratio = xp.where(u > 0, xp.log1p(u_safe) / u_safe, 1)
    pos = xp.log(xp.logaddexp(0.0, xp.maximum(rho, 0)))
    return xp.where(rho > 0, pos, neg + xp.log(ratio))  # (bbb.1)


def _log_sigmoid(xp, rho):
    """log sigmoid(rho) = -softplus(-rho), finite for every finite rho."""
    return -xp.logaddexp(0.0, -rho)


def _sigmoid(xp, rho):
    """sigmoid(rho) = d softplus / d rho = (1 + tanh(rho / 2)) / 2, overflow-free."""
    return 0.5 * (xp.tanh(0.5 * rho) + 1.0)


def inv_softplus(sigma):
    """rho = softplus^{-1}(sigma) = log(expm1(sigma)) = sigma + log(-expm1(-sigma)) for sigma > 0:
    no overflow for large sigma, no cancellation for small sigma."""
    xp = xp_of(sigma)
    check_array(sigma, "sigma", ndim=1)
    if not bool(xp.all(sigma > 0)):
        raise ValueError("sigma: expected > 0 everywhere (a standard deviation)")
    return sigma + xp.log(-xp.expm1(-sigma))


# ----------------------------------------------------------------------------- KL to the prior

def _log_lam(xp, lam):
    return math.log(lam) if isinstance(lam, float) else xp.log(lam)


def _kl(xp, mu, rho, lam):
    """KL(N(mu, diag(sigma^2)) || N(0, diag(1 / lam)))
    = (1/2) sum_j [lam_j (sigma_j^2 + mu_j^2) - 1 - log lam_j - 2 log sigma_j].  (bbb.7)"""
    sigma = softplus(rho)
    terms = lam * (sigma * sigma + mu * mu) - 1.0 - _log_lam(xp, lam) - 2.0 * log_softplus(rho)
    return 0.5 * xp.sum(terms)  # (bbb.7)


def _kl_grads(xp, mu, rho, lam):
    """(dKL/dmu, dKL/drho) = (lam mu, (lam sigma - 1 / sigma) sigmoid(rho)), with
    sigmoid(rho) / sigma = exp(log sigmoid(rho) - log softplus(rho)) so rho -> -inf gives the
    exact limit -1 instead of 0 * inf.  (bbb.8)"""
    sigma = softplus(rho)
    s = _sigmoid(xp, rho)
    sig_over_sigma = xp.exp(_log_sigmoid(xp, rho) - log_softplus(rho))
    return lam * mu, lam * sigma * s - sig_over_sigma  # (bbb.8)


def _check_mu_rho(mu, rho, prefix=""):
    check_array(mu, f"{prefix}mu", ndim=1)
    check_float(mu, f"{prefix}mu")
    D = mu.shape[0]
    check_array(rho, f"{prefix}rho", shape=(D,))
    check_same_dtype({f"{prefix}mu": mu, f"{prefix}rho": rho})
    return D


def kl_divergence(mu, rho, lam):
    """KL(q || p) (0-d) for q = N(mu, diag(softplus(rho)^2)), p = N(0, diag(1 / lam)).  (bbb.7)"""
    xp = xp_of(mu, rho)
    D = _check_mu_rho(mu, rho)
    lam = check_lam(lam, D, mu.dtype, strict=True)
    return _kl(xp, mu, rho, lam)


def kl_gradients(mu, rho, lam):
    """(dKL/dmu (D,), dKL/drho (D,)) of ``kl_divergence``.  (bbb.8)"""
    xp = xp_of(mu, rho)
    D = _check_mu_rho(mu, rho)
    lam = check_lam(lam, D, mu.dtype, strict=True)
    return _kl_grads(xp, mu, rho, lam)


# ----------------------------------------------------------------------------- state

def init(mu, sigma0=None, rho0=None) -> BBBState:
    """BBBState at mean mu (D,) and initial scale given by exactly one of sigma0 (> 0) or rho0,
    each a scalar or (D,); zero Adam moments on [mu; rho]. The SLANG UCI baseline starts at
    mu = 0, rho0 = -1 (sigma0 = softplus(-1) = 0.3133)."""
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


def _check_cfg(cfg, D, dtype):
    if not isinstance(cfg, BBBConfig):
        raise ValueError(f"cfg: expected a BBBConfig, got {type(cfg).__name__}")
    N = check_N(cfg.N)
    lam = check_lam(cfg.lam, D, dtype, strict=True)
    hyper = check_adam_hyper(cfg.alpha, cfg.beta1, cfg.beta2, cfg.eps_adam)
    kl_weight = check_in_range(cfg.kl_weight, "kl_weight", 0.0, math.inf, high_open=True)
    return N, lam, hyper, kl_weight


def _draws(mu, sigma, eps):
    """theta_s = mu + sigma * eps_s, (D, S).  (bbb.2)"""
    return mu[:, None] + sigma[:, None] * eps  # (bbb.2)


def sample(state: BBBState, eps):
    """theta = mu + softplus(rho) * eps (D, S) for eps (D, S).  (bbb.2)"""
    D = _check_state(state)
    xp_of(state.mu, eps)  # one backend
    check_draws(eps, D, state.mu.dtype)
    return _draws(state.mu, softplus(state.rho), eps)


def prec_diag(state: BBBState):
    """The Gaussian's precision diag(1 / sigma^2) (D,) = exp(-2 log softplus(rho)); inf where
    sigma^2 is below the smallest float (rho < about -355 in float64)."""
    _check_state(state)
    with np.errstate(over="ignore"):
        return xp_of(state.rho).exp(-2.0 * log_softplus(state.rho))


def dense_covariance(state: BBBState):
    """diag(sigma^2) (D, D), for tests."""
    _check_state(state)
    sigma = softplus(state.rho)
    return xp_of(sigma).diag(sigma * sigma)


# ----------------------------------------------------------------------------- the step

def step(state: BBBState, batch, eps, cfg: BBBConfig, model) -> tuple[BBBState, BBBInfo]:
    """One Bayes-by-Backprop step: (bbb.1)-(bbb.10), Adam (adam.1)-(adam.4) on [mu; rho].

    batch: Batch(X_B (M, n_in), y_B (M,)); eps: (D, S) standard-normal draws (one column per
    Monte Carlo sample, used for the gradient AND the ELBO estimate); model: a refbayes.models
    model whose theta has D entries. Deterministic given its inputs. Costs S summed backprop
    passes (``model.grad``) and S loss evaluations (for the ELBO estimate in the info).
    """
    D = _check_state(state)
    xp = xp_of(state.mu, state.rho, eps)
    dtype = state.mu.dtype
    N, lam, (alpha, beta1, beta2, eps_adam), kl_weight = _check_cfg(cfg, D, dtype)
    check_model(model, D)
    X, y, M = check_batch(batch, model, N, dtype)
    S = check_draws(eps, D, dtype)
    mu, rho = state.mu, state.rho
    c = N / (M * S)
    sigma = softplus(rho)                                                           # (bbb.1)
    theta = _draws(mu, sigma, eps)                                                  # (bbb.2)
    g = model.sample_moments(xp.ascontiguousarray(theta.T), X, y)[0]                # (bbb.4)
    g_hat = c * g.sum(axis=0)                                                       # (bbb.5)
    g_rho = c * (g * eps.T).sum(axis=0) * _sigmoid(xp, rho)                         # (bbb.6)
    kl = _kl(xp, mu, rho, lam)                                                      # (bbb.7)
    dkl_dmu, dkl_drho = _kl_grads(xp, mu, rho, lam)                                 # (bbb.8)
    grad_mu = g_hat + kl_weight * dkl_dmu                                           # (bbb.9)
    grad_rho = g_rho + kl_weight * dkl_drho                                         # (bbb.9)
    loss_hat = c * sum(model.loss(xp.ascontiguousarray(theta[:, s]), X, y)
                       for s in range(S))                                           # (bbb.3)
    elbo = -(loss_hat + kl_weight * kl)                                             # (bbb.3)
    delta, adam = _adam(xp, xp.concatenate([grad_mu, grad_rho]), state.adam,
                        alpha, beta1, beta2, eps_adam, state.t)                     # (adam.1)-(adam.4)
    mu_new = mu + delta[:D]                                                         # (bbb.10)
    rho_new = rho + delta[D:]                                                       # (bbb.10)
    info = BBBInfo(sigma, theta, g, g_hat, g_rho, kl, grad_mu, grad_rho, loss_hat, elbo, delta,
                   mu_new, rho_new)
    return BBBState(mu_new, rho_new, adam, state.t + 1), info
