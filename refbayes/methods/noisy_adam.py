"""Noisy Adam: Adam with adaptive weight noise as mean-field Gaussian VI (Zhang, Sun, Duvenaud and
Grosse 2018, "Noisy Natural Gradient as Variational Inference", arXiv:1712.02390, Algorithm 1).

Implements (noisy_adam.3)-(noisy_adam.11) of derivations/noisy_adam.md.
Symbols: mu (D,) mean; f (D,) running average of squared gradients (per-example scale, the
diagonal Fisher estimate); m (D,) momentum; eta the prior VARIANCE as in the paper,
p(w) = N(0, diag(eta)), given in code as ``prior_precision`` = 1 / eta, a scalar or (D,); kl_weight
the paper's lambda, the weight of the KL term; gamma_in = kl_weight / (N eta) the intrinsic damping,
gamma_ex the extrinsic damping, gamma = gamma_in + gamma_ex; alpha, beta1, beta2 as in Adam.

Scaling: the models' losses are SUMMED; Algorithm 1's "grad_w log p(y | x, w)" is the minibatch
MEAN log-likelihood gradient, here in loss form g_hat = (1 / S) sum_s (1 / M) sum_i grad l_i(w_s)
(noisy_adam.4). N enters through gamma_in and the variance (kl_weight / N) / (f + gamma_in)
(noisy_adam.3); M through the minibatch means; S (columns of eps) through the Monte Carlo means
(the paper uses S = 1). kl_weight is the paper's KL weighting (tempering of the prior side:
kl_weight < 1 is the likelihood raised to the power 1 / kl_weight, up to the step size); no data
augmentation (rho = 1).

Sign: Algorithm 1 ascends the log-likelihood, mu <- mu + alpha m_hat with
v = grad log p - gamma_in w; refbayes descends the loss, v = g_hat + gamma_in w,
mu <- mu - alpha m_hat: the same iterates.
The prior term is evaluated at the DRAWS w_s (Algorithm 1), not at mu (as Vadam does).

Examples
--------
One Noisy Adam step on 20 synthetic logistic-regression points; the caller draws the minibatch
and the standard-normal eps (a step draws nothing):

>>> import numpy as np
>>> from refbayes.datasets import make_logistic_regression
>>> from refbayes.methods import noisy_adam
>>> from refbayes.models import LogisticRegression
>>> data = make_logistic_regression(20, 3, 0)     # N = 20 rows, 3 features, seed 0
>>> model = LogisticRegression(3)                 # D = 4 with the intercept
>>> state = noisy_adam.init(np.zeros(model.D))
>>> cfg = noisy_adam.NoisyAdamConfig(N=20, prior_precision=1.0, alpha=0.1)
>>> rng = np.random.default_rng(0)
>>> idx = rng.choice(20, size=8, replace=False)   # minibatch, M = 8
>>> eps = rng.standard_normal((model.D, 1))       # S = 1 draw, as in the paper
>>> batch = noisy_adam.Batch(data.X[idx], data.y[idx].astype(float))
>>> state, info = noisy_adam.step(state, batch, eps, cfg, model)
>>> state.mu.shape, info.w.shape, noisy_adam.prec_diag(state, cfg).shape
((4,), (4, 1), (4,))
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

from refbayes._checks import (
    check_at_construction,
    check_array,
    check_float,
    check_in_range,
    check_positive,
    check_same_dtype,
    rename_at_construction,
    renamed_keyword,
)
from refbayes.backend import xp_of
from refbayes.methods._estimates import (
    Batch,
    check_batch,
    check_draw_precisions,
    check_draws,
    check_model,
    check_N,
    check_t,
    nonneg_start,
)
from refbayes.methods.vadam import (
    SQUARES,
    check_decay,
    check_precision,
    check_squares,
    grad_moments,
)

__all__ = [
    "SQUARES",
    "Batch",
    "NoisyAdamConfig",
    "NoisyAdamInfo",
    "NoisyAdamState",
    "init",
    "prec_diag",
    "sample",
    "step",
]

Array = Any


class NoisyAdamConfig(NamedTuple):
    """Noisy Adam hyperparameters.

    Algorithm 1 prints no values; the defaults are Adam's (alpha 1e-3, beta1 0.9, beta2 0.999)
    with the plain ELBO (kl_weight 1) and no extrinsic damping.

    Each field is documented by its trailing comment. The functions that take a cfg check it
    against the state and raise ValueError unless: N is an integer >= 1; prior_precision is a
    finite real > 0 or a finite float (D,) array > 0 in the state's dtype; alpha and kl_weight
    are finite reals > 0; beta1 and beta2 are in [0, 1); gamma_ex is a finite real >= 0; and
    squares is in SQUARES.

    ``prior_precision`` was called ``eta`` before; ``eta=`` and ``cfg.eta`` still work, with a
    DeprecationWarning, for one release (it was a precision while the paper's and
    ``NoisyKFACConfig.eta`` are the prior variance).

    Construction (``NoisyAdamConfig(...)``, and unpickling) checks these rules too, except the
    precision's length and dtype, known only with the state; ``_replace`` and ``_make`` do not,
    so the functions check every cfg again.
    """
    N: int                       # training-set size >= 1: gamma_in = kl_weight / (N eta) (noisy_adam.2)
    prior_precision: Any         # 1 / eta > 0 (eta: the paper's prior variance), float or (D,) (noisy_adam.2)
    alpha: float = 1e-3          # step size alpha > 0 (noisy_adam.10)
    beta1: float = 0.9           # momentum decay, in [0, 1) (noisy_adam.6)
    beta2: float = 0.999         # decay of f, in [0, 1) (noisy_adam.7)
    kl_weight: float = 1.0       # lambda, KL weight > 0 (noisy_adam.1)-(noisy_adam.3)
    gamma_ex: float = 0.0        # extrinsic damping >= 0, in the mean update only (noisy_adam.9)
    squares: str = "minibatch"   # "minibatch" (Algorithm 1) | "per_example" (noisy_adam.7)


class NoisyAdamState(NamedTuple):
    """Noisy Adam state after t steps.

    Each field is documented by its trailing comment. Every function that takes a state checks
    it and raises ValueError unless: mu is a finite float (float64 or float32) (D,) array; m
    and f are finite (D,) arrays of mu's dtype; every f >= 0; and t is an integer >= 0.
    """
    mu: Array  # mu_k, (D,), (noisy_adam.10)
    m: Array   # m_k, momentum average of v, (D,), (noisy_adam.6)
    f: Array   # f_k >= 0, average of squared gradients (per-example scale), (D,), (noisy_adam.7)
    t: int     # steps taken; the step being taken is Algorithm 1's k = t + 1 (noisy_adam.8)


class NoisyAdamInfo(NamedTuple):
    """The named intermediates of one Noisy Adam step, by equation.

    Each field is documented by its trailing comment (the equation tag last).
    """
    gamma_in: Any    # kl_weight / (N eta) = kl_weight prior_precision / N, float or (D,)  (noisy_adam.2)
    sigma: Array     # std sqrt(kl_weight / N) / sqrt(f_k + gamma_in), from the old f, (D,)  (noisy_adam.3)
    w: Array         # w_s = mu + sigma eps_s, (D, S)  (noisy_adam.3), Algorithm 1 "w ~ N(...)"
    g: Array         # minibatch-mean loss gradient at each draw, (S, D)  (noisy_adam.4)
    g_hat: Array     # mean over draws of g, (D,)  (noisy_adam.4)
    h_hat: Array     # squared-gradient estimate, (D,)  (noisy_adam.5)
    v: Array         # g_hat + gamma_in mean_s(w_s), (D,)  (noisy_adam.5), Algorithm 1 "v <- ..."
    m: Array         # momentum m_{k}, (D,)  (noisy_adam.6)
    f: Array         # squared-gradient average f_{k}, (D,)  (noisy_adam.7)
    m_tilde: Array   # m / (1 - beta1^k), (D,)  (noisy_adam.8)
    m_hat: Array     # m_tilde / (f + gamma), (D,)  (noisy_adam.9)
    mu: Array        # mu - alpha m_hat, (D,)  (noisy_adam.10)


def _check_cfg(cfg, D=None, dtype=None):
    if not isinstance(cfg, NoisyAdamConfig):
        raise ValueError(f"cfg: expected a NoisyAdamConfig, got {type(cfg).__name__}")
    N = check_N(cfg.N)
    # every float finite (check_in_range rejects NaN, and inf at an open bound)
    prec = check_precision(cfg.prior_precision, "cfg.prior_precision", D, dtype)
    check_in_range(cfg.alpha, "cfg.alpha", 0.0, math.inf, low_open=True, high_open=True)
    check_decay(cfg.beta1, "cfg.beta1")
    check_decay(cfg.beta2, "cfg.beta2")
    kl = check_in_range(cfg.kl_weight, "cfg.kl_weight", 0.0, math.inf, low_open=True,
                        high_open=True)
    check_in_range(cfg.gamma_ex, "cfg.gamma_ex", 0.0, math.inf, high_open=True)
    check_squares(cfg.squares)
    return N, prec, kl


check_at_construction(NoisyAdamConfig, _check_cfg)  # D, dtype unknown: the length, dtype later
rename_at_construction(NoisyAdamConfig, "eta", "prior_precision",
                       "eta was a prior precision here, while the paper's eta and "
                       "NoisyKFACConfig.eta are the prior variance.")


def _check_state(state):
    if not isinstance(state, NoisyAdamState):
        raise ValueError(f"state: expected a NoisyAdamState, got {type(state).__name__}")
    check_array(state.mu, "state.mu", ndim=1)
    check_float(state.mu, "state.mu")
    D = state.mu.shape[0]
    check_array(state.m, "state.m", shape=(D,))
    check_array(state.f, "state.f", shape=(D,))
    check_same_dtype({"state.mu": state.mu, "state.m": state.m, "state.f": state.f})
    check_positive(state.f, "state.f", strict=False)
    check_t(state.t)
    return D


def _sigma(xp, f, gamma_in, kl, N):
    """sqrt(kl_weight / N) / sqrt(f + gamma_in): the std of q.  (noisy_adam.3)"""
    return math.sqrt(kl / N) / xp.sqrt(f + gamma_in)  # (noisy_adam.3)


def init(mu, f0=None) -> NoisyAdamState:
    """Create the initial NoisyAdamState at mean mu, with m = 0, f = f0 and t = 0.

    With f0 = 0 (the default, as Adam's second moment) the first draws have variance
    (kl_weight / N) / gamma_in = eta = 1 / prior_precision, the prior's variance.

    Parameters
    ----------
    mu : array of shape (D,)
        Initial mean.
    f0 : float or array of shape (D,), optional
        Initial squared-gradient average, >= 0 (an array in mu's dtype); None gives zeros.

    Returns
    -------
    NoisyAdamState
        The state (mu, zeros, f, 0).

    Raises
    ------
    ValueError
        If mu is not a finite float 1-d array, or f0 is not None, a finite real >= 0, or a
        finite (D,) array >= 0 of mu's dtype.
    """
    check_array(mu, "mu", ndim=1)
    check_float(mu, "mu")
    f = nonneg_start(f0, "f0", mu)
    return NoisyAdamState(mu, xp_of(mu).zeros_like(mu), f, 0)


def prec_diag(state: NoisyAdamState, cfg: NoisyAdamConfig):
    """Compute the precision of q, (N / kl_weight) (f + gamma_in).

    (noisy_adam.11)

    Parameters
    ----------
    state : NoisyAdamState
        The state.
    cfg : NoisyAdamConfig
        Hyperparameters (N, prior_precision and kl_weight are used).

    Returns
    -------
    array of shape (D,)
        The precision diagonal.

    Raises
    ------
    ValueError
        If state or cfg is invalid (see NoisyAdamState, NoisyAdamConfig).
    """
    D = _check_state(state)
    N, prec, kl = _check_cfg(cfg, D, state.mu.dtype)
    return (N / kl) * (state.f + kl * prec / N)  # (noisy_adam.11)


def sample(state: NoisyAdamState, eps, cfg: NoisyAdamConfig):
    """Draw w = mu + eps sqrt(kl_weight / N) / sqrt(f + gamma_in) from q.

    (noisy_adam.3)

    Parameters
    ----------
    state : NoisyAdamState
        The state.
    eps : array of shape (D, S)
        Standard-normal draws from the caller, one column per sample.
    cfg : NoisyAdamConfig
        Hyperparameters (N, prior_precision and kl_weight are used).

    Returns
    -------
    array of shape (D, S)
        The draws w.

    Raises
    ------
    ValueError
        If state or cfg is invalid (see NoisyAdamState, NoisyAdamConfig), eps is not a finite (D, S
        >= 1) array of the state's dtype, or the arrays mix NumPy and CuPy.
    """
    D = _check_state(state)
    N, prec, kl = _check_cfg(cfg, D, state.mu.dtype)
    check_draws(eps, D, state.mu.dtype)
    xp = xp_of(state.mu, eps)
    sigma = _sigma(xp, state.f, kl * prec / N, kl, N)  # (noisy_adam.3)
    return state.mu[:, None] + sigma[:, None] * eps  # (noisy_adam.3)


def step(state: NoisyAdamState, batch, eps, cfg: NoisyAdamConfig,
         model, noise_precisions=None, *, tau=None) -> tuple[NoisyAdamState, NoisyAdamInfo]:
    """Take one Noisy Adam step, Algorithm 1's loop body.

    (noisy_adam.2)-(noisy_adam.10).  Deterministic given its inputs.

    Parameters
    ----------
    state : NoisyAdamState
        Current state.
    batch : Batch
        The minibatch rows Batch(X_B (M, n_in), y_B (M,)), 1 <= M <= N.
    eps : array of shape (D, S)
        Standard-normal draws, one column per MC sample (the paper uses S = 1).
    cfg : NoisyAdamConfig
        Hyperparameters.
    model : FlatModel or CNN
        A refbayes.models model with D parameters.
    noise_precisions : array of shape (S,), optional
        Per-draw noise precisions tau_s (a learned noise, refbayes.methods.noise_gamma): draw s's
        likelihood is N(y | f(x; w_s), 1 / tau_s), its gradients tau_s and its per-example
        squares tau_s^2 times the model's (noise_gamma.2), which must be Gaussian with
        noise_precision 1. None: the model's own likelihood for every draw.
    tau : array of shape (S,), optional
        The former name of ``noise_precisions`` (DeprecationWarning; removed in the next
        release).

    Returns
    -------
    state : NoisyAdamState
        The state after the step, t + 1.
    info : NoisyAdamInfo
        The step's intermediates, by equation.

    Raises
    ------
    ValueError
        If state or cfg is invalid (see NoisyAdamState, NoisyAdamConfig); if model is not a
        FlatModel with D parameters or batch does not fit it (see Batch); if eps is not a finite
        (D, S >= 1) array of the state's dtype; if noise_precisions is given but not a finite
        (S,) array > 0 of the state's dtype, or the model's likelihood is not Gaussian with
        noise_precision 1; if both noise_precisions and tau are given; or if the arrays mix
        NumPy and CuPy.
    """
    D = _check_state(state)
    xp = xp_of(state.mu, state.f)
    dtype = state.mu.dtype
    N, prec, kl = _check_cfg(cfg, D, dtype)
    check_model(model, D, cnn=True)
    X, y, _ = check_batch(batch, model, N, dtype)
    S = check_draws(eps, D, dtype)
    tau = renamed_keyword(noise_precisions, tau, "noise_precisions", "tau", "noisy_adam.step")
    if tau is not None:
        xp_of(state.mu, tau)
        check_draw_precisions(tau, S, model, dtype)
    mu, k = state.mu, state.t + 1
    beta1, beta2 = cfg.beta1, cfg.beta2
    gamma_in = kl * prec / N                                                    # (noisy_adam.2)
    gamma = gamma_in + cfg.gamma_ex                                             # (noisy_adam.2)
    sigma = _sigma(xp, state.f, gamma_in, kl, N)                                # (noisy_adam.3)
    w = mu[:, None] + sigma[:, None] * eps                                      # (noisy_adam.3)
    g, g_hat, h_hat = grad_moments(model, w, X, y, cfg.squares,
                                   tau)                            # (noisy_adam.4)-(noisy_adam.5)
    # NOTE: Algorithm 1 prints v <- grad log p(y|x,w) - gamma_in w (ascent); in loss form the
    # prior term is +gamma_in w, averaged over the S draws.
    v = g_hat + gamma_in * (w.sum(axis=1) / S)                                  # (noisy_adam.5)
    m = beta1 * state.m + (1 - beta1) * v                                       # (noisy_adam.6)
    f = beta2 * state.f + (1 - beta2) * h_hat                                   # (noisy_adam.7)
    m_tilde = m / (1 - beta1 ** k)                                              # (noisy_adam.8)
    m_hat = m_tilde / (f + gamma)                                               # (noisy_adam.9)
    mu_new = mu - cfg.alpha * m_hat                                             # (noisy_adam.10)
    info = NoisyAdamInfo(gamma_in, sigma, w, g, g_hat, h_hat, v, m, f, m_tilde, m_hat, mu_new)
    return NoisyAdamState(mu_new, m, f, k), info
