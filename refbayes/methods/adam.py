"""Adam (Kingma and Ba 2015): a pure optimizer update, and the MAP / Adam training step.

Implements (adam.1)-(adam.6) of derivations/bbb.md (section "Adam").
Symbols: g (D,) the gradient handed to the optimizer; m, v (D,) the first and second moment
estimates; t the number of updates already taken (the update being computed is number t + 1);
alpha the step size, beta1, beta2 the moment decays, eps_adam the constant added to sqrt(v_hat).

``adam_update`` is optax-style: it returns the step to ADD, delta = -alpha m_hat /
(sqrt(v_hat) + eps_adam), and the new moments; it knows nothing about models or scaling. The
same update drives Bayes-by-Backprop (on [mu; rho]) and MC dropout (on theta).

``step`` is the MAP baseline the benchmarks compare VOGN against: one Adam update of theta on ::

    F(theta) = (N / M) sum_{i in B} l_i(theta) + (1/2) sum_j lam_j theta_j^2,

the summed-loss convention: the minibatch sum over the M rows of B is scaled by N / M (no Monte
Carlo, S = 1 trivially; no tempering, tau = 1; no data augmentation, rho = 1), and the prior
precision lam (a scalar or (D,); lam = 0 is plain Adam on the loss) enters unscaled.

Examples
--------
One Adam step of the MAP baseline on 20 synthetic logistic-regression points (the caller draws
the minibatch), and the bare Adam update it is built on:

>>> import numpy as np
>>> from refbayes.datasets import make_logistic_regression
>>> from refbayes.methods import adam
>>> from refbayes.models import LogisticRegression
>>> data = make_logistic_regression(20, 3, 0)     # N = 20 rows, 3 features, seed 0
>>> model = LogisticRegression(3)                 # D = 4 with the intercept
>>> state = adam.init(np.zeros(model.D))
>>> idx = np.random.default_rng(0).choice(20, size=8, replace=False)   # minibatch, M = 8
>>> batch = adam.Batch(data.X[idx], data.y[idx].astype(float))
>>> state, info = adam.step(state, batch, adam.AdamConfig(alpha=0.1), model, 20, 1.0)  # N, lam
>>> state.theta.shape, info.g.shape
((4,), (4,))
>>> delta, moments = adam.adam_update(np.ones(3), adam.adam_init(3), adam.AdamConfig(alpha=0.1))
>>> np.round(delta, 6).tolist()                    # the first step is -alpha sign(grad)
[-0.1, -0.1, -0.1]
"""
from __future__ import annotations

import math
import numbers
from typing import Any, NamedTuple

import numpy as np

from refbayes._checks import (
    check_at_construction,
    check_array,
    check_finite,
    check_float,
    check_in_range,
    check_int,
    check_positive,
    value_checks,
)
from refbayes.backend import xp_of
from refbayes.methods._estimates import (
    Batch,
    check_batch,
    check_model,
    check_N,
    check_t,
)

__all__ = [
    "AdamConfig",
    "AdamState",
    "Batch",
    "MAPConfig",
    "MAPInfo",
    "MAPState",
    "adam_init",
    "adam_update",
    "init",
    "step",
]

Array = Any


class AdamConfig(NamedTuple):
    """Adam hyperparameters; defaults are Kingma and Ba's (and optax's / PyTorch's).

    Each field is documented by its trailing comment. The functions that take a cfg check it
    and raise ValueError unless: alpha and eps_adam are finite reals > 0, and beta1 and beta2
    are in [0, 1).

    Construction (``AdamConfig(...)``, and unpickling) checks these rules too; ``_replace`` and
    ``_make`` do not, so the functions check every cfg again.
    """
    alpha: float = 1e-3      # step size alpha > 0 (adam.4)
    beta1: float = 0.9       # first-moment decay, in [0, 1) (adam.1)
    beta2: float = 0.999     # second-moment decay, in [0, 1) (adam.2)
    eps_adam: float = 1e-8   # constant > 0, added to sqrt(v_hat), outside the root (adam.4)


class MAPConfig(NamedTuple):
    """The MAP / Adam training problem for drivers (refbayes.methods.driver).

    ``step(state, batch, cfg.adam, model, cfg.N, cfg.lam)`` is its step.

    Each field is documented by its trailing comment. ``check_map_config`` (the driver's check)
    raises ValueError unless: N is an integer >= 1; lam is a finite real >= 0 or a finite float
    (D,) array >= 0 in the state's dtype; and adam is an AdamConfig in its ranges.

    Construction (``MAPConfig(...)``, and unpickling) checks these rules too, except lam's
    length and dtype, known only with the state; ``_replace`` and ``_make`` do not, so the
    functions check every cfg again.
    """
    N: int                                # training-set size >= 1, scales minibatch sums by N / M (adam.5)
    lam: Any = 0.0                        # prior precision, scalar or (D,), >= 0 (adam.5)
    adam: AdamConfig = AdamConfig()       # the optimizer's hyperparameters (adam.1)-(adam.4)


class AdamState(NamedTuple):
    """Adam moments after t updates.

    Each field is documented by its trailing comment. ``update`` checks a state and raises
    ValueError unless: m is a finite float (float64 or float32) (D,) array; v is a finite (D,)
    array of m's dtype with v >= 0; and t is an integer >= 0.
    """
    m: Array  # m_t, first-moment estimate, (D,), (adam.1)
    v: Array  # v_t, second-moment estimate, (D,), >= 0, (adam.2)
    t: int    # updates taken, an integer >= 0


class MAPState(NamedTuple):
    """MAP / Adam training state after t steps.

    Each field is documented by its trailing comment. ``step`` checks a state and raises
    ValueError unless: theta is a finite float (float64 or float32) (D,) array; t is an integer
    >= 0; and adam is a valid AdamState (see AdamState) of theta's shape and dtype.
    """
    theta: Array      # theta_t, (D,), (adam.6)
    adam: AdamState   # Adam moments of theta, (D,) each; adam.t is not read: t drives (adam.3)
    t: int            # steps taken; drives the bias correction (adam.3)


class MAPInfo(NamedTuple):
    """The named intermediates of one MAP / Adam step, by equation.

    Each field is documented by its trailing comment (the equation tag last).
    """
    g_data: Array  # data gradient (N / M) sum_{i in B} grad l_i(theta_t), (D,)  (adam.5)
    g: Array       # objective gradient g_data + lam * theta_t, (D,)  (adam.5)
    delta: Array   # Adam step -alpha m_hat / (sqrt(v_hat) + eps_adam), (D,)  (adam.4)
    theta: Array   # theta_{t+1} = theta_t + delta, (D,)  (adam.6)


# ----------------------------------------------------------------------------- checks

def check_adam_config(cfg) -> tuple[float, float, float, float]:
    """(alpha, beta1, beta2, eps_adam) as floats, each in its range."""
    if not isinstance(cfg, AdamConfig):
        raise ValueError(f"cfg: expected an AdamConfig, got {type(cfg).__name__}")
    return check_adam_hyper(cfg.alpha, cfg.beta1, cfg.beta2, cfg.eps_adam)


def check_adam_hyper(alpha, beta1, beta2, eps_adam,
                     prefix: str = "cfg.") -> tuple[float, float, float, float]:
    """The Adam ranges shared by every Adam-driven method: alpha > 0 finite, beta1, beta2 in
    [0, 1), eps_adam > 0 finite (eps_adam = 0 makes the first step 0 / 0 where g = 0); NaN and
    inf rejected. Errors name ``prefix`` + the field (cfg.alpha, ...)."""
    alpha = check_in_range(alpha, f"{prefix}alpha", 0.0, math.inf, low_open=True, high_open=True)
    beta1 = check_in_range(beta1, f"{prefix}beta1", 0.0, 1.0, high_open=True)
    beta2 = check_in_range(beta2, f"{prefix}beta2", 0.0, 1.0, high_open=True)
    eps_adam = check_in_range(eps_adam, f"{prefix}eps_adam", 0.0, math.inf, low_open=True,
                              high_open=True)
    return alpha, beta1, beta2, eps_adam


def check_adam_state(state, D: int, dtype, name: str = "state") -> int:
    """An AdamState with (D,) moments of ``dtype``, v >= 0; returns its t."""
    if not isinstance(state, AdamState):
        raise ValueError(f"{name}: expected an AdamState, got {type(state).__name__}")
    check_array(state.m, f"{name}.m", shape=(D,))
    check_array(state.v, f"{name}.v", shape=(D,), finite=False)
    # v finite and >= 0 from two reductions (min, max: NaN propagates, inf shows in max) instead
    # of four scans (isfinite, isnan, min, max); where they fail, the usual checks give the error
    v_ok = not value_checks() or _finite_nonneg(state.v)
    if not v_ok:
        check_finite(state.v, f"{name}.v")
    for field in ("m", "v"):
        a = getattr(state, field)
        if a.dtype != dtype:
            raise ValueError(f"{name}.{field}: expected dtype {dtype}, got {a.dtype}")
    if not v_ok:
        check_positive(state.v, f"{name}.v", strict=False)  # a second moment
    return check_t(state.t)


def _finite_nonneg(a) -> bool:
    """Every entry of a finite and >= 0 (False for NaN); True for an empty or integer array."""
    if a.size == 0 or a.dtype.kind != "f":
        return a.size == 0
    return float(a.min()) >= 0.0 and float(a.max()) < math.inf


def check_lam(lam, D: int, dtype, *, strict: bool, name: str = "lam"):
    """The prior precision: a finite real scalar (returned as a Python float, so float32 stays
    float32) or a finite (D,) array of ``dtype``; > 0 everywhere when ``strict``, else >= 0.
    Errors name ``name``."""
    what = "> 0" if strict else ">= 0"
    if isinstance(lam, numbers.Real) and not isinstance(lam, bool):
        lam = float(lam)
        if not math.isfinite(lam) or (lam <= 0 if strict else lam < 0):
            raise ValueError(f"{name}: expected a finite prior precision {what}, got {lam}")
        return lam
    check_array(lam, name, shape=(D,))
    check_float(lam, name)
    if dtype is not None and lam.dtype != dtype:
        raise ValueError(f"{name}: expected dtype {dtype} (the state's), got {lam.dtype}")
    check_positive(lam, name, strict=strict)
    return lam


def check_map_config(cfg, D=None, dtype=None):
    """A MAPConfig for a state of D parameters of ``dtype``: cfg.N, cfg.lam (finite, >= 0) and
    cfg.adam (an AdamConfig in range), each error naming the field as the driver's caller wrote
    it (cfg.lam, cfg.adam.alpha, ...)."""
    if not isinstance(cfg, MAPConfig):
        raise ValueError(f"cfg: expected a MAPConfig, got {type(cfg).__name__}")
    check_int(cfg.N, "cfg.N", low=1)
    check_lam(cfg.lam, D, dtype, strict=False, name="cfg.lam")
    if not isinstance(cfg.adam, AdamConfig):
        raise ValueError(f"cfg.adam: expected an AdamConfig, got {type(cfg.adam).__name__}")
    check_adam_hyper(cfg.adam.alpha, cfg.adam.beta1, cfg.adam.beta2, cfg.adam.eps_adam,
                     prefix="cfg.adam.")
    return cfg


check_at_construction(AdamConfig, check_adam_config)
check_at_construction(MAPConfig, check_map_config)  # D, dtype unknown: lam's length and dtype later


# ----------------------------------------------------------------------------- the optimizer

def adam_init(D_or_like, dtype=np.float64) -> AdamState:
    """Create zero Adam moments, with t = 0.

    ``adam_init(D)`` gives (D,) NumPy arrays of ``dtype``; ``adam_init(x)`` for an array x (D,)
    gives moments of x's shape, dtype and backend (``dtype`` is then ignored).

    Parameters
    ----------
    D_or_like : int or array of shape (D,)
        The dimension D >= 1, or a float array whose shape, dtype and backend to copy.
    dtype : numpy dtype, default numpy.float64
        Either float64 or float32; used only when D_or_like is an integer.

    Returns
    -------
    AdamState
        The state (zeros, zeros, 0).

    Raises
    ------
    ValueError
        If D_or_like is an integer < 1 (or dtype is not float64 / float32 with an integer),
        or is not a finite float 1-d array otherwise.
    """
    if isinstance(D_or_like, numbers.Integral) and not isinstance(D_or_like, bool):
        if D_or_like < 1:
            raise ValueError(f"D_or_like: expected D >= 1 or a (D,) array, got {D_or_like}")
        if np.dtype(dtype) not in (np.float32, np.float64):
            raise ValueError(f"dtype: expected float64 or float32, got {dtype}")
        z = np.zeros(int(D_or_like), dtype=dtype)
        return AdamState(z, z.copy(), 0)
    check_array(D_or_like, "D_or_like", ndim=1)
    check_float(D_or_like, "D_or_like")
    xp = xp_of(D_or_like)
    return AdamState(xp.zeros_like(D_or_like), xp.zeros_like(D_or_like), 0)


def adam_update(grad, state: AdamState, cfg: AdamConfig) -> tuple[Array, AdamState]:
    """Compute one Adam update for the gradient of the objective being MINIMIZED.

    m' = beta1 m + (1 - beta1) g  (adam.1);  v' = beta2 v + (1 - beta2) g^2  (adam.2);
    m_hat = m' / (1 - beta1^(t+1)), v_hat = v' / (1 - beta2^(t+1))  (adam.3), exact bias
    correction with t + 1 the 1-based count of this update;
    delta = -alpha m_hat / (sqrt(v_hat) + eps_adam)  (adam.4), to be ADDED to the parameters.

    Parameters
    ----------
    grad : array of shape (D,)
        Gradient g, in the moments' dtype.
    state : AdamState
        Current moments (m, v, t).
    cfg : AdamConfig
        Hyperparameters.

    Returns
    -------
    delta : array of shape (D,)
        The step to add to the parameters.
    state : AdamState
        The new moments (m', v', t + 1).

    Raises
    ------
    ValueError
        If state or cfg is invalid (see AdamState, AdamConfig); if grad is not a finite (D,) array
        of that dtype; or if the arrays mix NumPy and CuPy.
    """
    alpha, beta1, beta2, eps = check_adam_config(cfg)
    if not isinstance(state, AdamState):
        raise ValueError(f"state: expected an AdamState, got {type(state).__name__}")
    check_array(state.m, "state.m", ndim=1)
    check_float(state.m, "state.m")
    D = state.m.shape[0]
    t = check_adam_state(state, D, state.m.dtype)
    check_array(grad, "grad", shape=(D,))
    if grad.dtype != state.m.dtype:
        raise ValueError(f"grad: expected dtype {state.m.dtype} (the moments'), got {grad.dtype}")
    xp = xp_of(grad, state.m, state.v)
    return _adam(xp, grad, state, alpha, beta1, beta2, eps, t)


def _adam(xp, g, state, alpha, beta1, beta2, eps, t):
    """The unchecked update (adam.1)-(adam.4); shared with adam.step, bbb, ktied and mc_dropout.

    Equal bit for bit to the printed expressions
    ``m = beta1 m + (1 - beta1) g``, ``v = beta2 v + (1 - beta2) (g g)``,
    ``delta = -alpha (m / c1) / (sqrt(v / c2) + eps)``: each line's operations in the printed
    order (IEEE products commute exactly), written in place into four fresh arrays (tmp, m, v,
    delta) instead of eleven temporaries. The caller's g, state.m and state.v are only read: the
    arrays written are the step's own (the rule of vogn._update).
    """
    tmp = xp.multiply(1 - beta1, g)
    m = xp.multiply(beta1, state.m)
    m += tmp                                               # (adam.1)
    xp.multiply(g, g, out=tmp)
    tmp *= 1 - beta2
    v = xp.multiply(beta2, state.v)
    v += tmp                                               # (adam.2)
    delta = xp.divide(m, 1 - beta1 ** (t + 1))             # m_hat (adam.3)
    xp.divide(v, 1 - beta2 ** (t + 1), out=tmp)            # v_hat (adam.3)
    xp.sqrt(tmp, out=tmp)
    tmp += eps
    delta *= -alpha
    delta /= tmp                                           # (adam.4)
    return delta, AdamState(m, v, t + 1)


# ----------------------------------------------------------------------------- MAP / Adam

def init(theta) -> MAPState:
    """Create the initial MAPState at theta, with zero Adam moments and t = 0.

    Parameters
    ----------
    theta : array of shape (D,)
        Initial parameters.

    Returns
    -------
    MAPState
        The state (theta, adam_init(theta), 0).

    Raises
    ------
    ValueError
        If theta is not a finite float 1-d array.
    """
    check_array(theta, "theta", ndim=1)
    check_float(theta, "theta")
    return MAPState(theta, adam_init(theta), 0)


def check_theta_state(state, cls) -> int:
    """A (theta, adam, t) state of class ``cls`` (MAPState, mc_dropout's MCDropoutState): theta
    (D,) floating, Adam moments of theta's shape and dtype, t a step count; returns D."""
    if not isinstance(state, cls):
        raise ValueError(f"state: expected a {cls.__name__}, got {type(state).__name__}")
    check_array(state.theta, "state.theta", ndim=1)
    check_float(state.theta, "state.theta")
    D = state.theta.shape[0]
    check_t(state.t)
    check_adam_state(state.adam, D, state.theta.dtype, "state.adam")
    return D


def step(state: MAPState, batch, cfg: AdamConfig, model, N: int, lam) -> tuple[MAPState, MAPInfo]:
    """Take one Adam step on the MAP objective F(theta).

    F(theta) = (N / M) sum_{i in B} l_i(theta) + (1/2) sum_j lam_j theta_j^2.  The gradient is
    ``model.grad`` (a summed backprop pass, no per-example rows).  (adam.1)-(adam.6)

    Parameters
    ----------
    state : MAPState
        Current state.
    batch : Batch
        The minibatch rows Batch(X_B (M, n_in), y_B (M,)), 1 <= M <= N.
    cfg : AdamConfig
        Optimizer hyperparameters.
    model : FlatModel or CNN
        A refbayes.models model with D parameters.
    N : int
        Training-set size, >= 1; scales the minibatch sum by N / M.
    lam : float or array of shape (D,)
        Prior precision, >= 0.

    Returns
    -------
    state : MAPState
        The state after the step, t + 1.
    info : MAPInfo
        The step's intermediates, by equation.

    Raises
    ------
    ValueError
        If state or cfg is invalid (see MAPState, AdamConfig); if N is not an integer >= 1; if lam
        is not a finite real >= 0 or a (D,) float array >= 0 of theta's dtype; if model is not a
        FlatModel with D parameters or batch does not fit it (see Batch); or if the arrays mix
        NumPy and CuPy.
    """
    D = check_theta_state(state, MAPState)
    dtype = state.theta.dtype
    alpha, beta1, beta2, eps = check_adam_config(cfg)
    N = check_N(N)
    lam = check_lam(lam, D, dtype, strict=False)
    check_model(model, D, cnn=True)
    X, y, M = check_batch(batch, model, N, dtype)
    xp = xp_of(state.theta, X, y)
    theta = state.theta
    g_data = (N / M) * model.grad(theta, X, y)                                # (adam.5)
    g = g_data + lam * theta                                                  # (adam.5)
    delta, adam = _adam(xp, g, state.adam, alpha, beta1, beta2, eps, state.t)  # (adam.1)-(adam.4)
    theta_new = theta + delta                                                 # (adam.6)
    return MAPState(theta_new, adam, state.t + 1), MAPInfo(g_data, g, delta, theta_new)
