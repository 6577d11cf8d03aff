"""Vadam and Vprop: weight-perturbed Adam / RMSprop as mean-field Gaussian VI (Khan et al. 2018,
"Fast and Scalable Bayesian Deep Learning by Weight-Perturbation in Adam", arXiv:1806.04854,
Fig. 1).

Implements (vadam.3)-(vadam.11) of derivations/vadam.md.
Symbols (derivations/notation.md): mu (D,) mean; s (D,) the running average of squared gradients,
on the PER-EXAMPLE scale, so the precision is prec_diag = N s + lam (vadam.10); m (D,) the momentum
average; lam the prior precision, p(theta) = N(0, diag(lam)^{-1}), a scalar or (D,);
lam_tilde = lam / N; alpha the learning rate; beta1, beta2 (the paper's gamma_1, gamma_2) the decay
rates of m and s; t the number of steps already taken.

Scaling: the models' losses are SUMMED; Vadam works with the minibatch MEAN gradient
g_hat = (1 / S) sum_s (1 / M) sum_{i in B} grad l_i(theta_s) (vadam.4), i.e. the refbayes estimate
(N / M) sum_i grad l_i divided by N, and with the prior scaled to lam_tilde = lam / N (vadam.6),
(vadam.9). N enters only through lam_tilde and the precision N s + lam (vadam.3); M through the
minibatch means; S (columns of eps) through the Monte Carlo means of the gradient and of the
squares (vadam.5). No tempering (tau = 1), no data augmentation (rho = 1).

Squares (vadam.5): "minibatch" = (1 / S) sum_s g_hat_s^2, the square of each draw's minibatch-mean
gradient averaged over the draws (the paper's Vadam and the official code); "per_example" =
(1 / (S M)) sum_s sum_i g_{s,i}^2 (Khan et al.'s "Gauss-Newton" VOGN estimate). Only "per_example"
sums squared per-example gradients (model.sample_moments, no (M, D) rows); "minibatch" squares
the minibatch gradients.

Vprop (``vprop_config``) is Vadam with beta1 = 0 and no bias correction. With additionally
sqrt=False and squares="per_example", a Vadam step IS the 2018 VOGN step (vadam.11) under
beta_t = 1 - beta2, alpha_t = alpha; with sqrt=True (real Vadam / Vprop) no hyperparameter map
makes the two equal (derivations/vadam.md).

Examples
--------
One Vadam step on 20 synthetic logistic-regression points; the caller draws the minibatch and the
standard-normal eps (a step draws nothing):

>>> import numpy as np
>>> from refbayes.datasets import make_logistic_regression
>>> from refbayes.methods import vadam
>>> from refbayes.models import LogisticRegression
>>> data = make_logistic_regression(20, 3, 0)     # N = 20 rows, 3 features, seed 0
>>> model = LogisticRegression(3)                 # D = 4 with the intercept
>>> state = vadam.init(np.zeros(model.D))
>>> cfg = vadam.VadamConfig(N=20, lam=1.0, alpha=0.1)
>>> rng = np.random.default_rng(0)
>>> idx = rng.choice(20, size=8, replace=False)   # minibatch, M = 8
>>> eps = rng.standard_normal((model.D, 1))       # S = 1 draw
>>> batch = vadam.Batch(data.X[idx], data.y[idx].astype(float))
>>> state, info = vadam.step(state, batch, eps, cfg, model)
>>> state.mu.shape, info.theta.shape, vadam.prec_diag(state, cfg).shape
((4,), (4, 1), (4,))
"""
from __future__ import annotations

import math
import numbers
from typing import Any, NamedTuple

from refbayes._checks import (
    check_array,
    check_float,
    check_in_range,
    check_positive,
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
    nonneg_start,
)

__all__ = [
    "SQUARES",
    "Batch",
    "VadamConfig",
    "VadamInfo",
    "VadamState",
    "init",
    "prec_diag",
    "sample",
    "step",
    "vprop_config",
]

Array = Any

SQUARES = ("minibatch", "per_example")


class VadamConfig(NamedTuple):
    """Vadam hyperparameters; defaults are Adam's and the official PyTorch Vadam's.

    (lr 1e-3, betas (0.9, 0.999).)

    Each field is documented by its trailing comment. The functions that take a cfg check it
    against the state and raise ValueError unless: N is an integer >= 1; lam is a finite real >
    0 or a finite float (D,) array > 0 in the state's dtype; alpha is a finite real > 0; beta1
    and beta2 are in [0, 1); bias_correction and sqrt are bools; and squares is in SQUARES.
    """
    N: int                        # training-set size >= 1; lam_tilde = lam / N (vadam.6), (vadam.3)
    lam: Any                      # prior precision lambda > 0, float or (D,) (vadam.3), (vadam.6)
    alpha: float = 1e-3           # learning rate alpha > 0 (vadam.9)
    beta1: float = 0.9            # gamma_1, decay of m, in [0, 1) (vadam.6)
    beta2: float = 0.999          # gamma_2, decay of s, in [0, 1) (vadam.7)
    bias_correction: bool = True  # divide m, s by 1 - beta^(t+1) before use (vadam.8)
    squares: str = "minibatch"    # "minibatch" | "per_example": the estimate updating s (vadam.5)
    sqrt: bool = True             # sqrt(s_hat) + lam_tilde; False: s_hat + lam_tilde (vadam.9)


def vprop_config(N: int, lam, alpha: float = 1e-3, beta2: float = 0.999,
                 squares: str = "minibatch", sqrt: bool = True) -> VadamConfig:
    """Build the VadamConfig of Vprop: Vadam without momentum and without bias correction.

    Vprop (Khan et al. 2018; the official ``Vprop`` optimizer) updates
    mu <- mu - alpha (g_hat + lam_tilde mu) / (sqrt(s) + lam_tilde), with s the new average
    (s + lam_tilde in the denominator for sqrt=False): (vadam.6)-(vadam.9) with beta1 = 0 and
    bias_correction = False.  Nothing is validated here; ``step`` validates the config.

    Parameters
    ----------
    N : int
        Training-set size.
    lam : float or array of shape (D,)
        Prior precision.
    alpha : float, default 1e-3
        Learning rate.
    beta2 : float, default 0.999
        Decay of s.
    squares : {"minibatch", "per_example"}, default "minibatch"
        Which squared-gradient estimate updates s.
    sqrt : bool, default True
        Whether the denominator takes sqrt(s).

    Returns
    -------
    VadamConfig
        The config with beta1 = 0 and bias_correction = False.
    """
    return VadamConfig(N, lam, alpha=alpha, beta1=0.0, beta2=beta2, bias_correction=False,
                       squares=squares, sqrt=sqrt)


class VadamState(NamedTuple):
    """Vadam state after t steps.

    Each field is documented by its trailing comment. Every function that takes a state checks
    it and raises ValueError unless: mu is a finite float (float64 or float32) (D,) array; m
    and s are finite (D,) arrays of mu's dtype; every s >= 0; and t is an integer >= 0.
    """
    mu: Array  # mu_t, (D,), (vadam.9)
    m: Array   # m_t, momentum average of g_hat + lam_tilde mu, (D,), (vadam.6)
    s: Array   # s_t >= 0, average of squared gradients (per-example scale), (D,), (vadam.7)
    t: int     # steps taken; the step being taken uses the bias-correction power t + 1 (vadam.8)


class VadamInfo(NamedTuple):
    """The named intermediates of one Vadam step, by equation and line of Fig. 1.

    Each field is documented by its trailing comment (the equation tag last).
    """
    sigma: Array     # std 1 / sqrt(N s_t + lam), (D,)  (vadam.3), Fig. 1 line 2
    theta: Array     # theta_s = mu_t + sigma eps_s, (D, S)  (vadam.3)
    g: Array         # g_hat_s: minibatch-mean gradient at each draw, (S, D)  (vadam.4)
    g_hat: Array     # mean over draws of g, (D,)  (vadam.4), line 3
    h_hat: Array     # squared-gradient estimate, (D,)  (vadam.5)
    m: Array         # m_{t+1}, (D,)  (vadam.6), line 4
    s: Array         # s_{t+1}, (D,)  (vadam.7), line 5
    m_hat: Array     # bias-corrected m_{t+1} (= m without correction), (D,)  (vadam.8), line 6
    s_hat: Array     # bias-corrected s_{t+1} (= s without correction), (D,)  (vadam.8), line 6
    denom: Array     # sqrt(s_hat) + lam_tilde (or s_hat + lam_tilde), (D,)  (vadam.9)
    Delta_mu: Array  # m_hat / denom, (D,)  (vadam.9)
    mu: Array        # mu_{t+1} = mu_t - alpha Delta_mu, (D,)  (vadam.9), line 7


# ----------------------------------------------------------------------------- checks

def check_precision(lam, name: str, D: int, dtype):
    """A prior precision: a real scalar > 0, or a (D,) array of the state's dtype, > 0 everywhere.
    Returned as given (a Python float or the array)."""
    if isinstance(lam, numbers.Real) and not isinstance(lam, bool):
        if not math.isfinite(lam) or lam <= 0:
            raise ValueError(f"{name}: expected a finite prior precision > 0, got {lam}")
        return float(lam)
    check_array(lam, name, shape=(D,))
    check_float(lam, name)
    check_positive(lam, name)
    if lam.dtype != dtype:
        raise ValueError(f"{name}: expected dtype {dtype} (the state's), got {lam.dtype}")
    return lam


def check_decay(beta, name: str) -> float:
    """An exponential-average decay rate in [0, 1)."""
    return check_in_range(beta, name, 0.0, 1.0, high_open=True)


def check_squares(squares) -> str:
    if squares not in SQUARES:
        raise ValueError(f"squares: expected one of {SQUARES}, got {squares!r}")
    return squares


def check_flag(flag, name: str) -> bool:
    if not isinstance(flag, bool):
        raise ValueError(f"{name}: expected True or False, got {flag!r}")
    return flag


def _check_cfg(cfg, D, dtype):
    if not isinstance(cfg, VadamConfig):
        raise ValueError(f"cfg: expected a VadamConfig, got {type(cfg).__name__}")
    N = check_N(cfg.N)
    lam = check_precision(cfg.lam, "cfg.lam", D, dtype)  # finite (NaN, inf rejected)
    check_in_range(cfg.alpha, "cfg.alpha", 0.0, math.inf, low_open=True, high_open=True)
    check_decay(cfg.beta1, "cfg.beta1")
    check_decay(cfg.beta2, "cfg.beta2")
    check_flag(cfg.bias_correction, "bias_correction")
    check_flag(cfg.sqrt, "sqrt")
    check_squares(cfg.squares)
    return N, lam


def _check_state(state):
    if not isinstance(state, VadamState):
        raise ValueError(f"state: expected a VadamState, got {type(state).__name__}")
    check_array(state.mu, "state.mu", ndim=1)
    check_float(state.mu, "state.mu")
    D = state.mu.shape[0]
    check_array(state.m, "state.m", shape=(D,))
    check_array(state.s, "state.s", shape=(D,))
    check_same_dtype({"state.mu": state.mu, "state.m": state.m, "state.s": state.s})
    check_positive(state.s, "state.s", strict=False)
    check_t(state.t)
    return D


# ----------------------------------------------------------------------------- estimates

def grad_moments(model, theta, X, y, squares: str, scale=None):
    """(g (S, D), g_hat (D,), h_hat (D,)) at the draws theta (D, S) on the minibatch (X, y):

    g[s] = (1 / M) sum_i grad l_i(theta_s) (vadam.4), g_hat = mean_s g[s], and
    h_hat = mean_s g[s]^2 for squares="minibatch", or (1 / (S M)) sum_s sum_i grad l_i(theta_s)^2
    for "per_example" (vadam.5). Shared with refbayes.methods.noisy_adam, whose per-draw noise
    precisions pass ``scale`` c (S,): draw s's loss is c_s sum_i l_i, so its gradients are
    multiplied by c_s and its per-example squares by c_s^2 (noise_gamma.2).
    """
    xp = xp_of(theta)
    S, M = theta.shape[1], X.shape[0]
    # one batched pass over the S draws; sums of squared per-example rows without forming them
    g_sum, sq_sum = model.sample_moments(xp.ascontiguousarray(theta.T), X, y,
                                         "ef" if squares == "per_example" else None)
    if scale is not None:
        g_sum = g_sum * scale[:, None]                          # (noise_gamma.2)
        if sq_sum is not None:
            sq_sum = sq_sum * (scale * scale)[:, None]          # (noise_gamma.2)
    g = g_sum / M                                               # (vadam.4)
    if squares == "per_example":
        h_hat = sq_sum.sum(axis=0) / (S * M)                    # (vadam.5)
    else:
        h_hat = (g * g).sum(axis=0) / S                         # (vadam.5)
    return g, g.sum(axis=0) / S, h_hat                          # (vadam.4)


# ----------------------------------------------------------------------------- public API

def init(mu, s0=None) -> VadamState:
    """Create the initial VadamState at mean mu, with m = 0, s = s0 and t = 0.

    The official code starts at s0 = (prec_init - lam) / N, so that the first draws have precision
    N s0 + lam = prec_init; its defaults (prec_init = lam = 1) give s0 = 0, the first draws from
    the prior. refbayes requires s0 >= 0 (sqrt(s) must exist), i.e. prec_init >= lam.

    Parameters
    ----------
    mu : array of shape (D,)
        Initial mean.
    s0 : float or array of shape (D,), optional
        Initial squared-gradient average, >= 0 (an array in mu's dtype); None gives zeros.

    Returns
    -------
    VadamState
        The state (mu, zeros, s, 0).

    Raises
    ------
    ValueError
        If mu is not a finite float 1-d array, or s0 is not None, a finite real >= 0, or a
        finite (D,) array >= 0 of mu's dtype.
    """
    check_array(mu, "mu", ndim=1)
    check_float(mu, "mu")
    s = nonneg_start(s0, "s0", mu)
    return VadamState(mu, xp_of(mu).zeros_like(mu), s, 0)


def prec_diag(state: VadamState, cfg: VadamConfig):
    """Compute the precision of q, N s + lam, with the RAW s (not s_hat).

    As Fig. 1 line 2 and the official ``get_weight_precs``.  (vadam.10)

    Parameters
    ----------
    state : VadamState
        The state.
    cfg : VadamConfig
        Hyperparameters (N and lam are used).

    Returns
    -------
    array of shape (D,)
        The precision diagonal N s + lam.

    Raises
    ------
    ValueError
        If state or cfg is invalid (see VadamState, VadamConfig).
    """
    D = _check_state(state)
    N, lam = _check_cfg(cfg, D, state.mu.dtype)
    return N * state.s + lam  # (vadam.10)


def sample(state: VadamState, eps, cfg: VadamConfig):
    """Draw theta = mu + eps / sqrt(N s + lam) from q.

    (vadam.3)

    Parameters
    ----------
    state : VadamState
        The state.
    eps : array of shape (D, S)
        Standard-normal draws from the caller, one column per sample.
    cfg : VadamConfig
        Hyperparameters (N and lam are used).

    Returns
    -------
    array of shape (D, S)
        The draws theta.

    Raises
    ------
    ValueError
        If state or cfg is invalid (see VadamState, VadamConfig), eps is not a finite (D, S >= 1)
        array of the state's dtype, or the arrays mix NumPy and CuPy.
    """
    D = _check_state(state)
    N, lam = _check_cfg(cfg, D, state.mu.dtype)
    check_draws(eps, D, state.mu.dtype)
    xp = xp_of(state.mu, eps)
    sigma = 1 / xp.sqrt(N * state.s + lam)  # (vadam.3)
    return state.mu[:, None] + sigma[:, None] * eps  # (vadam.3)


def step(state: VadamState, batch, eps, cfg: VadamConfig, model) -> tuple[VadamState, VadamInfo]:
    """Take one Vadam / Vprop step, Fig. 1 lines 2-7.

    (vadam.3)-(vadam.9).  Deterministic given its inputs.

    Parameters
    ----------
    state : VadamState
        Current state.
    batch : Batch
        The minibatch rows Batch(X_B (M, n_in), y_B (M,)), 1 <= M <= N.
    eps : array of shape (D, S)
        Standard-normal draws, one column per MC sample (the paper uses S = 1).
    cfg : VadamConfig
        Hyperparameters.
    model : FlatModel or CNN
        A refbayes.models model with D parameters.

    Returns
    -------
    state : VadamState
        The state after the step, t + 1.
    info : VadamInfo
        The step's intermediates, by equation.

    Raises
    ------
    ValueError
        If state or cfg is invalid (see VadamState, VadamConfig); if model is not a FlatModel with
        D parameters or batch does not fit it (see Batch); if eps is not a finite (D, S >= 1) array
        of the state's dtype; or if the arrays mix NumPy and CuPy.
    """
    D = _check_state(state)
    xp = xp_of(state.mu, state.s)
    dtype = state.mu.dtype
    N, lam = _check_cfg(cfg, D, dtype)
    check_model(model, D, cnn=True)
    X, y, _ = check_batch(batch, model, N, dtype)
    check_draws(eps, D, dtype)
    mu, k = state.mu, state.t + 1
    beta1, beta2 = cfg.beta1, cfg.beta2
    lam_tilde = lam / N                                                         # (vadam.6)
    sigma = 1 / xp.sqrt(N * state.s + lam)                                      # (vadam.3)
    theta = mu[:, None] + sigma[:, None] * eps                                  # (vadam.3)
    g, g_hat, h_hat = grad_moments(model, theta, X, y, cfg.squares)         # (vadam.4)-(vadam.5)
    m = beta1 * state.m + (1 - beta1) * (g_hat + lam_tilde * mu)                # (vadam.6)
    s = beta2 * state.s + (1 - beta2) * h_hat                                   # (vadam.7)
    m_hat = m / (1 - beta1 ** k) if cfg.bias_correction else m                  # (vadam.8)
    s_hat = s / (1 - beta2 ** k) if cfg.bias_correction else s                  # (vadam.8)
    denom = (xp.sqrt(s_hat) if cfg.sqrt else s_hat) + lam_tilde                 # (vadam.9)
    Delta_mu = m_hat / denom                                                    # (vadam.9)
    mu_new = mu - cfg.alpha * Delta_mu                                          # (vadam.9)
    info = VadamInfo(sigma, theta, g, g_hat, h_hat, m, s, m_hat, s_hat, denom, Delta_mu, mu_new)
    return VadamState(mu_new, m, s, k), info
