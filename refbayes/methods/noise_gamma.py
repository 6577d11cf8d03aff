"""A learned Gaussian noise precision: Zhang et al.'s (2018) Gamma variational posterior q(tau).

Implements (noise_gamma.1)-(noise_gamma.8) of derivations/noise_gamma.md. The regression code of
Noisy K-FAC (pomonam/NoisyNaturalGradient, ``regression/model.py``,
``regression/controller/sample.py``) does not fix the noise precision tau of the Gaussian
likelihood N(y | f(x; w), 1 / tau): it gives it the prior Gamma(a0, b0) = Gamma(6, 6) and a
variational posterior q(tau) = Gamma(a, b) (shape a, rate b), and trains phi = (log a, log b)
with Adam beside the weights' natural-gradient step. Symbols: a, b the shape and rate of q; a0, b0
the prior's; phi = (log a, log b); r2 the mean squared training residual at the step's weight
draws; N the training rows.

Per step: draw tau_s ~ q (one per weight draw, by the driver), give the weight step per-draw
precisions (``noisy_adam.step`` / ``noisy_kfac.step`` argument ``tau``, (noise_gamma.2)), then
``step(state, r2, cfg)`` moves phi by one Adam update on ::

    J(phi) = (1/2) (r2 a / b - (digamma(a) - log b)) + kl_weight KL(q || p) / N,  (noise_gamma.4)

the expected negative log-likelihood per training row (without its constant) plus the row's
share of the KL, with r2 held fixed (the official code stops its gradient). The weights see tau
only through the draws (stop-gradient too), so no reparameterization gradient enters phi.

Every function is deterministic; the draws of tau come from the caller (``draw`` takes the
Generator).

Examples
--------
The Gamma posterior of the noise precision tau that Noisy K-FAC and Noisy Adam learn for
regression: the caller's Generator draws tau for the weight step, then one update of q at the
step's mean squared residual r2 (a number the weight step computes; 0.3 here):

>>> import numpy as np
>>> from refbayes.methods import noise_gamma
>>> state = noise_gamma.init()                    # q(tau) = Gamma(6, 6), mean 1
>>> taus = noise_gamma.draw(state, np.random.default_rng(0), 4)   # S = 4 draws
>>> cfg = noise_gamma.NoiseGammaConfig(N=20)
>>> state, info = noise_gamma.step(state, 0.3, cfg)
>>> taus.shape, round(float(info.r2), 3), state.phi.shape
((4,), 0.3, (2,))
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from scipy.special import digamma, gammaln, polygamma

from refbayes._checks import (
    check_at_construction,
    check_float,
    check_in_range,
    check_int,
    check_positive,
)
from refbayes.methods.adam import AdamConfig, AdamState, adam_update

__all__ = ["NoiseGammaConfig", "NoiseGammaInfo", "NoiseGammaState", "draw", "init", "kl_gamma",
           "mean", "objective", "objective_grad", "step"]


class NoiseGammaConfig(NamedTuple):
    """The learned noise precision's hyperparameters; defaults are the official code's.

    Each field is documented by its trailing comment. The functions that take a cfg check it
    and raise ValueError unless: N is an integer >= 1; a0, b0, kl_weight, lr and eps_tf are
    finite reals > 0; and beta1 and beta2 are in [0, 1).

    Construction (``NoiseGammaConfig(...)``, and unpickling) checks these rules too;
    ``_replace`` and ``_make`` do not, so the functions check every cfg again.
    """
    N: int                  # training rows N >= 1; the KL is shared over them (noise_gamma.4)
    a0: float = 6.0         # shape of the prior Gamma(a0, b0), > 0 (noise_gamma.1)
    b0: float = 6.0         # rate of the prior, > 0 (noise_gamma.1)
    kl_weight: float = 1.0  # weight of KL(q || p), > 0 (the official ``kl`` = 1) (noise_gamma.4)
    lr: float = 1e-3        # Adam step size on phi (the official ``learning_rate``) (noise_gamma.8)
    beta1: float = 0.9      # Adam first-moment decay, in [0, 1) (TensorFlow's default) (noise_gamma.8)
    beta2: float = 0.999    # Adam second-moment decay, in [0, 1) (TensorFlow's default) (noise_gamma.8)
    eps_tf: float = 1e-8    # TensorFlow's Adam epsilon, > 0 (noise_gamma.8)
    #                         added to sqrt(v) before the bias correction


class NoiseGammaState(NamedTuple):
    """The posterior q(tau) = Gamma(exp(phi[0]), exp(phi[1])) and its Adam moments.

    Each field is documented by its trailing comment. ``step`` checks a state and raises
    ValueError unless it is a NoiseGammaState whose phi is a finite float (float64 or float32)
    (2,) array; adam is not checked.
    """
    phi: np.ndarray   # (log a, log b), (2,), float64 from ``init`` (noise_gamma.1)
    adam: AdamState   # Adam's m, v (2,) and t, the updates taken (noise_gamma.8)


class NoiseGammaInfo(NamedTuple):
    """The named intermediates of one update, by equation.

    Each field is documented by its trailing comment (the equation tag last).
    """
    a: float           # shape before the update (noise_gamma.1)
    b: float           # rate before the update (noise_gamma.1)
    r2: float          # the mean squared residual the update used (noise_gamma.3)
    J: float           # objective at phi (noise_gamma.4)
    grad: np.ndarray   # dJ / dphi, (2,) (noise_gamma.6)
    phi: np.ndarray    # phi after the update, (2,) (noise_gamma.8)


def _check_cfg(cfg) -> None:
    if not isinstance(cfg, NoiseGammaConfig):
        raise ValueError(f"cfg: expected a NoiseGammaConfig, got {type(cfg).__name__}")
    check_int(cfg.N, "cfg.N", low=1)
    for name in ("a0", "b0", "kl_weight", "lr", "eps_tf"):
        check_positive(getattr(cfg, name), f"cfg.{name}")
    for name in ("beta1", "beta2"):
        check_in_range(getattr(cfg, name), f"cfg.{name}", 0.0, 1.0, high_open=True)


check_at_construction(NoiseGammaConfig, _check_cfg)


def _check_phi(phi) -> np.ndarray:
    phi = check_float(np.asarray(phi), "phi")
    if phi.shape != (2,) or not np.all(np.isfinite(phi)):
        raise ValueError(f"phi: expected a finite (2,) array (log a, log b), got {phi!r}")
    return phi


def _inputs(phi, r2, cfg) -> tuple[float, float, float]:
    """(a, b, r2) of checked (phi, r2, cfg)."""
    _check_cfg(cfg)
    a, b = np.exp(_check_phi(phi))
    return float(a), float(b), float(check_positive(r2, "r2", strict=False))


def init(a: float = 6.0, b: float = 6.0) -> NoiseGammaState:
    """Start q(tau) = Gamma(a, b) with zero Adam moments (officially a = b = 6, the prior).

    Parameters
    ----------
    a : float, default 6.0
        Shape, > 0.
    b : float, default 6.0
        Rate, > 0.

    Returns
    -------
    NoiseGammaState
        The state: phi = (log a, log b), Adam moments zero, t = 0.

    Raises
    ------
    ValueError
        If a or b is not a finite real > 0.
    """
    check_positive(a, "a")
    check_positive(b, "b")
    return NoiseGammaState(np.array([math.log(a), math.log(b)]),
                           AdamState(np.zeros(2), np.zeros(2), 0))


def mean(state: NoiseGammaState) -> float:
    """Return the posterior mean E_q[tau] = a / b.

    (noise_gamma.1)

    Parameters
    ----------
    state : NoiseGammaState
        The posterior.

    Returns
    -------
    float
        The posterior mean of the noise precision.
    """
    return float(np.exp(state.phi[0] - state.phi[1]))  # (noise_gamma.1)


def draw(state: NoiseGammaState, rng: np.random.Generator, S: int) -> np.ndarray:
    """Draw S noise precisions tau_s from q(tau).

    (noise_gamma.1) ``rng.gamma(a, 1 / b, size=S)``: NumPy's shape / scale form of Gamma(a, b).

    Parameters
    ----------
    state : NoiseGammaState
        The posterior q.
    rng : numpy.random.Generator
        The caller's generator, the only source of randomness.
    S : int
        Number of draws, >= 1.

    Returns
    -------
    array of shape (S,)
        The draws, float64.

    Raises
    ------
    ValueError
        If S is not an integer >= 1, rng is not a numpy Generator, or state.phi is not a finite
        (2,) array.
    """
    check_int(S, "S", low=1)
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng: expected a numpy.random.Generator, got {type(rng).__name__}")
    a, b = np.exp(_check_phi(state.phi))
    return rng.gamma(a, 1.0 / b, size=S)  # (noise_gamma.1)


def kl_gamma(a, b, a0, b0) -> float:
    """Return the KL divergence of Gamma(a, b) from Gamma(a0, b0), shapes and rates.

    KL(Gamma(a, b) || Gamma(a0, b0)), (noise_gamma.5).

    Parameters
    ----------
    a : float
        Shape of the first distribution, > 0.
    b : float
        Rate of the first distribution, > 0.
    a0 : float
        Shape of the second, > 0.
    b0 : float
        Rate of the second, > 0.

    Returns
    -------
    float
        The divergence, >= 0.
    """
    return float((a - a0) * digamma(a) - gammaln(a) + gammaln(a0)
                 + a0 * (math.log(b) - math.log(b0)) + a * (b0 - b) / b)  # (noise_gamma.5)


def objective(phi, r2: float, cfg: NoiseGammaConfig) -> float:
    """Return J(phi) of (noise_gamma.4) at the mean squared residual r2.

    Parameters
    ----------
    phi : array of shape (2,)
        (log a, log b).
    r2 : float
        Mean squared residual (noise_gamma.3), >= 0.
    cfg : NoiseGammaConfig
        N, the prior and the KL weight.

    Returns
    -------
    float
        The objective.

    Raises
    ------
    ValueError
        If cfg is invalid (see NoiseGammaConfig), phi is not a finite float (2,) array, or r2 is
        not a finite real >= 0.
    """
    a, b, r2 = _inputs(phi, r2, cfg)
    return float(0.5 * (r2 * a / b - (digamma(a) - math.log(b)))
                 + cfg.kl_weight * kl_gamma(a, b, cfg.a0, cfg.b0) / cfg.N)  # (noise_gamma.4)


def objective_grad(phi, r2: float, cfg: NoiseGammaConfig) -> np.ndarray:
    """Return dJ / dphi of (noise_gamma.6).

    Parameters
    ----------
    phi : array of shape (2,)
        (log a, log b).
    r2 : float
        Mean squared residual (noise_gamma.3), >= 0.
    cfg : NoiseGammaConfig
        N, the prior and the KL weight.

    Returns
    -------
    array of shape (2,)
        The gradient (dJ / dlog a, dJ / dlog b).

    Raises
    ------
    ValueError
        If cfg is invalid (see NoiseGammaConfig), phi is not a finite float (2,) array, or r2 is
        not a finite real >= 0.
    """
    a, b, r2 = _inputs(phi, r2, cfg)
    trigamma, c = float(polygamma(1, a)), cfg.kl_weight / cfg.N
    d_log_a = a * (0.5 * (r2 / b - trigamma)
                   + c * ((a - cfg.a0) * trigamma + cfg.b0 / b - 1.0))  # (noise_gamma.6)
    d_log_b = 0.5 * (1.0 - r2 * a / b) + c * (cfg.a0 - a * cfg.b0 / b)   # (noise_gamma.6)
    return np.array([d_log_a, d_log_b])


def step(state: NoiseGammaState, r2: float,
         cfg: NoiseGammaConfig) -> tuple[NoiseGammaState, NoiseGammaInfo]:
    """Take one Adam update of phi on J at the step's mean squared residual r2.

    (noise_gamma.4)-(noise_gamma.8). TensorFlow's Adam (the official optimizer) adds its epsilon
    to sqrt(v) before the bias correction: lr sqrt(1 - beta2^k) / (1 - beta1^k) m / (sqrt(v) +
    eps_tf), which is refbayes' (adam.4) with eps_adam = eps_tf / sqrt(1 - beta2^k), k the
    1-based update count.

    Parameters
    ----------
    state : NoiseGammaState
        Current q and Adam moments.
    r2 : float
        Mean squared residual at the weight step's draws (noise_gamma.3), >= 0.
    cfg : NoiseGammaConfig
        Hyperparameters.

    Returns
    -------
    state : NoiseGammaState
        The posterior after the update, t + 1.
    info : NoiseGammaInfo
        The update's intermediates, by equation.

    Raises
    ------
    ValueError
        If state or cfg is invalid (see NoiseGammaState, NoiseGammaConfig), or r2 is not a
        finite real >= 0.
    """
    if not isinstance(state, NoiseGammaState):
        raise ValueError(f"state: expected a NoiseGammaState, got {type(state).__name__}")
    a, b, r2 = _inputs(state.phi, r2, cfg)
    J = objective(state.phi, r2, cfg)                                          # (noise_gamma.4)
    grad = objective_grad(state.phi, r2, cfg)                                  # (noise_gamma.6)
    k = state.adam.t + 1
    adam_cfg = AdamConfig(cfg.lr, cfg.beta1, cfg.beta2,
                          cfg.eps_tf / math.sqrt(1.0 - cfg.beta2 ** k))        # (noise_gamma.8)
    delta, adam = adam_update(grad, state.adam, adam_cfg)                      # (noise_gamma.8)
    phi = state.phi + delta                                                    # (noise_gamma.8)
    return NoiseGammaState(phi, adam), NoiseGammaInfo(a, b, r2, J, grad, phi)
