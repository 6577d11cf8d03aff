"""SWA, SWAG-Diagonal and SWAG (Maddox, Garipov, Izmailov, Vetrov and Wilson 2019, "A Simple
Baseline for Bayesian Uncertainty in Deep Learning", NeurIPS, arXiv:1902.02476), with the SGD
that produces their iterates.

Implements (swag.1)-(swag.7) and (swag.9)-(swag.12) of derivations/swag.md.
Symbols: theta_i (D,) the i-th collected SGD iterate, i = 1..n; theta_bar (D,) the running mean
(theta_SWA = theta_bar after the last collection); theta2_bar (D,) the running mean of
theta_i^2; D_hat the deviation matrix, column j the deviation theta_i - theta_bar_i of one of
the last K' = min(n, K) snapshots, theta_bar_i the running mean AFTER adding theta_i (the
official code's convention); K the buffer size (the official ``max_num_models``); z1 (D, S) and
z2 (K', S) standard-normal draws from the caller; scale the official ``scale``: the covariance
multiplier, 1/2 in the paper's SWAG.

Storage: D_hat is kept as a (K, D) ring buffer of rows (one contiguous row per snapshot, as the
official ``cov_mat_sqrt``); row (n - 1) mod K holds the newest deviation. ``deviations`` returns
the paper's (D, K') matrix with its columns oldest first, the official row order.

The Gaussian (swag.6)::

    q = N(theta_bar, scale * (Sigma_diag + D_hat D_hat^T / (K' - 1))),
    Sigma_diag = diag(max(theta2_bar - theta_bar^2, var_clamp)),

sampled as theta_bar + sqrt(scale) (Sigma_diag^{1/2} z1 + D_hat z2 / sqrt(K' - 1)) (swag.7);
SWAG-Diagonal drops the low-rank term (z2 = None). The official code divides by
max_num_models - 1 even while n < K; refbayes by the number of stored columns minus one (see the
conventions table of the note).

SGD (swag.10)-(swag.11) runs on the SUMMED objective sum_i l_i + (lam / 2) ``|theta|^2`` with the
minibatch sum scaled by N / M and heavy-ball momentum, which is torch.optim.SGD(lr, momentum,
weight_decay) on the MEAN loss with lr = N alpha and weight_decay = lam / N, iterate for
iterate. No batch normalisation exists in refbayes' models, so the official ``bn_update`` after
each sample has no counterpart.

Examples
--------
SWAG on 20 synthetic logistic-regression points: momentum-SGD steps, a snapshot collected after
each, then draws from the SWAG Gaussian. ``sgd_step`` keeps the drivers' step signature
``step(state, batch, noise, cfg, model)`` (``refbayes.methods._protocol``), so SGD, which draws
nothing, takes ``noise=None`` in the third place; the caller draws the minibatches and the
sampler's z1, z2:

>>> import numpy as np
>>> from refbayes.datasets import make_logistic_regression
>>> from refbayes.methods import swag
>>> from refbayes.models import LogisticRegression
>>> data = make_logistic_regression(20, 3, 0)     # N = 20 rows, 3 features, seed 0
>>> model = LogisticRegression(3)                 # D = 4 with the intercept
>>> sgd_cfg, cfg = swag.SGDConfig(N=20, lam=1.0, alpha=0.005), swag.SWAGConfig(K=3)
>>> sgd, moments = swag.sgd_init(np.zeros(model.D)), swag.init(np.zeros(model.D), cfg)
>>> rng = np.random.default_rng(0)
>>> for _ in range(5):
...     idx = rng.choice(20, size=8, replace=False)   # minibatch, M = 8
...     batch = swag.Batch(data.X[idx], data.y[idx].astype(float))
...     sgd, _ = swag.sgd_step(sgd, batch, None, sgd_cfg, model)   # noise: None
...     moments, _ = swag.collect(moments, sgd.theta, cfg)
>>> int(moments.n), swag.rank(moments)
(5, 3)
>>> z1 = rng.standard_normal((model.D, 10))       # S = 10 draws
>>> z2 = rng.standard_normal((swag.rank(moments), 10))
>>> swag.sample(moments, z1, z2, cfg).shape
(4, 10)
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import numba
import numpy as np

from refbayes._checks import (
    check_at_construction,
    check_array,
    check_float,
    check_in_range,
    check_int,
    check_positive,
    check_same_dtype,
)
from refbayes.backend import cholesky, solve_triangular, xp_of
from refbayes.methods._estimates import (
    Batch,
    check_batch,
    check_model,
    check_N,
    check_t,
)
from refbayes.methods.adam import check_lam

__all__ = [
    "Batch",
    "SGDConfig",
    "SGDInfo",
    "SGDState",
    "SWAGConfig",
    "SWAGInfo",
    "SWAGState",
    "collect",
    "dense_covariance",
    "deviations",
    "diag_variance",
    "init",
    "log_density",
    "rank",
    "sample",
    "sgd_init",
    "sgd_step",
    "sgd_update",
    "swa_learning_rate",
]

Array = Any


# ----------------------------------------------------------------------------- SGD


class SGDConfig(NamedTuple):
    """SGD with momentum on the summed MAP objective, the SWA / SWAG base optimizer.

    torch.optim.SGD(lr, momentum, weight_decay) on the mean loss is alpha = lr / N,
    lam = N weight_decay (derivations/swag.md, conventions).

    Each field is documented by its trailing comment. ``sgd_update`` and ``sgd_step`` check a
    cfg and raise ValueError unless: N is an integer >= 1; lam is a finite real >= 0 or a
    finite float (D,) array >= 0 in the state's dtype; alpha is a finite real > 0; and momentum
    is in [0, 1).

    Construction (``SGDConfig(...)``, and unpickling) checks these rules too, except lam's
    length and dtype, known only with the state; ``_replace`` and ``_make`` do not, so the
    functions check every cfg again.
    """
    N: int                 # training-set size >= 1, scales minibatch sums by N / M (swag.10)
    lam: Any = 0.0         # prior precision >= 0, scalar or (D,): weight decay times N (swag.10)
    alpha: float = 1e-3    # step size > 0 on the summed objective: torch lr / N (swag.11)
    momentum: float = 0.9  # heavy-ball momentum mu in [0, 1) (swag.11)


class SGDState(NamedTuple):
    """SGD state after t steps.

    Each field is documented by its trailing comment. Every function that takes a state checks
    it and raises ValueError unless: theta is a finite float (float64 or float32) (D,) array; v
    is a finite (D,) array of theta's dtype; and t is an integer >= 0.
    """
    theta: Array  # theta_t, (D,), (swag.11)
    v: Array      # momentum buffer v_t, (D,); torch's buffer times N (swag.11)
    t: int        # steps taken, an integer >= 0


class SGDInfo(NamedTuple):
    """The named intermediates of one SGD step, by equation.

    Each field is documented by its trailing comment (the equation tag last).
    """
    g: Array      # objective gradient (N / M) sum_{i in B} grad l_i(theta_t) + lam theta_t, (D,)  (swag.10)
    v: Array      # v_{t+1} = momentum v_t + g, (D,)  (swag.11)
    theta: Array  # theta_{t+1} = theta_t - alpha v_{t+1}, (D,)  (swag.11)


def _check_sgd_state(state) -> int:
    if not isinstance(state, SGDState):
        raise ValueError(f"state: expected an SGDState, got {type(state).__name__}")
    check_array(state.theta, "state.theta", ndim=1)
    check_float(state.theta, "state.theta")
    D = state.theta.shape[0]
    check_array(state.v, "state.v", shape=(D,))
    check_same_dtype({"state.theta": state.theta, "state.v": state.v})
    check_t(state.t)
    return D


def _check_sgd_config(cfg, D=None, dtype=None):
    if not isinstance(cfg, SGDConfig):
        raise ValueError(f"cfg: expected an SGDConfig, got {type(cfg).__name__}")
    N = check_N(cfg.N)
    lam = check_lam(cfg.lam, D, dtype, strict=False, name="cfg.lam")
    alpha = float(check_positive(cfg.alpha, "cfg.alpha"))
    momentum = check_in_range(cfg.momentum, "cfg.momentum", 0.0, 1.0, high_open=True)
    return N, lam, alpha, momentum


check_at_construction(SGDConfig, _check_sgd_config)  # D, dtype unknown: lam's length and dtype later


def sgd_init(theta) -> SGDState:
    """Create the initial SGDState at theta with a zero momentum buffer and t = 0.

    A zero buffer makes the first step v_1 = g, torch's first-step rule.

    Parameters
    ----------
    theta : array of shape (D,)
        Initial parameters.

    Returns
    -------
    SGDState
        The state (theta, 0, 0).

    Raises
    ------
    ValueError
        If theta is not a finite float 1-d array.
    """
    check_array(theta, "theta", ndim=1)
    check_float(theta, "theta")
    return SGDState(theta, xp_of(theta).zeros_like(theta), 0)


def sgd_update(state: SGDState, g, cfg: SGDConfig) -> tuple[SGDState, SGDInfo]:
    """Take one momentum-SGD step with a given objective gradient g.

    v_{t+1} = momentum v_t + g, theta_{t+1} = theta_t - alpha v_{t+1}.  (swag.11)
    ``sgd_step`` forms g from a minibatch; this entry takes any g (a test feeds the gradient
    of a quadratic plus Gaussian noise to check the stationary covariance).

    Parameters
    ----------
    state : SGDState
        Current state.
    g : array of shape (D,)
        Gradient of the objective at state.theta, in theta's dtype.
    cfg : SGDConfig
        Step size and momentum (N and lam are checked but not used here).

    Returns
    -------
    state : SGDState
        The state after the step, t + 1.
    info : SGDInfo
        The step's intermediates, by equation.

    Raises
    ------
    ValueError
        If state or cfg is invalid (see SGDState, SGDConfig), g is not a finite (D,) array of
        the state's dtype, or the arrays mix NumPy and CuPy.
    """
    D = _check_sgd_state(state)
    _, _, alpha, momentum = _check_sgd_config(cfg, D, state.theta.dtype)
    check_array(g, "g", shape=(D,))
    check_same_dtype({"state.theta": state.theta, "g": g})
    xp_of(state.theta, g)
    return _sgd(state, g, alpha, momentum)


def _sgd(state, g, alpha, momentum):
    v = momentum * state.v + g                      # (swag.11)
    theta = state.theta - alpha * v                 # (swag.11)
    return SGDState(theta, v, state.t + 1), SGDInfo(g, v, theta)


def sgd_step(state: SGDState, batch, noise, cfg: SGDConfig, model) -> tuple[SGDState, SGDInfo]:
    """Take one momentum-SGD step on the minibatch MAP objective.

    g = (N / M) sum_{i in B} grad l_i(theta_t) + lam theta_t (swag.10), then (swag.11).  The
    gradient is ``model.grad`` (one summed backprop pass).

    Parameters
    ----------
    state : SGDState
        Current state.
    batch : Batch
        The minibatch rows Batch(X_B (M, n_in), y_B (M,)), 1 <= M <= N.
    noise : None
        Always None, passed in the third place: ``sgd_step(state, batch, None, cfg, model)``.
        SGD draws nothing, but every method's step has the one signature
        ``step(state, batch, noise, cfg, model)`` (``refbayes.methods._protocol``), which
        ``driver.run``, the tracer and the record ``records.RECORDS["sgd"]`` call alike; a
        default cannot be given, since cfg and model follow it.
    cfg : SGDConfig
        The problem and step hyperparameters.
    model : FlatModel or CNN
        A refbayes.models model with D parameters.

    Returns
    -------
    state : SGDState
        The state after the step, t + 1.
    info : SGDInfo
        The step's intermediates, by equation.

    Raises
    ------
    ValueError
        If state or cfg is invalid (see SGDState, SGDConfig), noise is not None, model is not a
        FlatModel with D parameters, batch does not fit it (see Batch), or the arrays mix NumPy
        and CuPy.
    """
    D = _check_sgd_state(state)
    N, lam, alpha, momentum = _check_sgd_config(cfg, D, state.theta.dtype)
    if noise is not None:
        raise ValueError(f"noise: SGD draws nothing, expected None, got {type(noise).__name__}")
    check_model(model, D, cnn=True)
    X, y, M = check_batch(batch, model, N, state.theta.dtype)
    xp_of(state.theta, X, y)
    theta = state.theta
    g = (N / M) * model.grad(theta, X, y) + lam * theta      # (swag.10)
    return _sgd(state, g, alpha, momentum)


def swa_learning_rate(epoch: int, *, alpha_init: float, alpha_swa: float, swa_start: float) -> float:
    """The official SWA / SWAG step-size schedule at a 0-based epoch.

    With r = epoch / swa_start: alpha_init for r <= 0.5, then linear down to alpha_swa at
    r = 0.9, then alpha_swa.  (swag.12)  The official SGD baseline is the same schedule with
    swa_start = the number of epochs and alpha_swa = 0.01 alpha_init.

    Parameters
    ----------
    epoch : int
        Epoch index, >= 0 (the official loop's ``epoch``, from 0).
    alpha_init : float
        Initial step size > 0.
    alpha_swa : float
        Constant SWA step size > 0.
    swa_start : float
        Epoch count after which snapshots are collected, > 0.

    Returns
    -------
    float
        The step size of that epoch.

    Raises
    ------
    ValueError
        If epoch is not an integer >= 0 or alpha_init, alpha_swa, swa_start are not finite
        numbers > 0.
    """
    epoch = check_int(epoch, "epoch", low=0)
    alpha_init = float(check_positive(alpha_init, "alpha_init"))
    alpha_swa = float(check_positive(alpha_swa, "alpha_swa"))
    swa_start = float(check_positive(swa_start, "swa_start"))
    r = epoch / swa_start
    ratio = alpha_swa / alpha_init
    if r <= 0.5:
        factor = 1.0
    elif r <= 0.9:
        factor = 1.0 - (1.0 - ratio) * (r - 0.5) / 0.4
    else:
        factor = ratio
    return alpha_init * factor                                          # (swag.12)


# ----------------------------------------------------------------------------- SWAG moments


class SWAGConfig(NamedTuple):
    """SWAG hyperparameters; the defaults are the official code's and the paper's.

    Each field is documented by its trailing comment. The functions that take a cfg check it
    and raise ValueError unless: K is an integer >= 1; scale is a finite real > 0; and
    var_clamp is a finite real >= 0.

    Construction (``SWAGConfig(...)``, and unpickling) checks these rules too; ``_replace`` and
    ``_make`` do not, so the functions check every cfg again.
    """
    K: int = 20               # deviation buffer size K >= 1, official max_num_models (20) (swag.3)
    scale: float = 0.5        # covariance multiplier > 0: 1/2 SWAG (paper), 1 SWAG-Diagonal (swag.6)
    var_clamp: float = 1e-30  # floor >= 0 of theta2_bar - theta_bar^2, official var_clamp (1e-30) (swag.4)


class SWAGState(NamedTuple):
    """SWAG moments after n collected snapshots.

    Each field is documented by its trailing comment. Every function that takes a state checks
    it and raises ValueError unless: theta_bar is a finite float (float64 or float32) (D,)
    array; theta2_bar a finite (D,) array; D_hat a (K, D) array with K >= 1 (K = cfg.K where a
    cfg is given, except in ``diag_variance``), finite except in ``collect`` and ``sample``,
    which check only its shape and dtype; all three of one dtype and backend; and n an integer
    >= 0.
    """
    theta_bar: Array   # running mean of the snapshots, theta_SWA, (D,), (swag.1)
    theta2_bar: Array  # running mean of theta_i^2, (D,), (swag.2)
    D_hat: Array       # (K, D) ring of deviations; row (n - 1) mod K newest; rows >= n zero (swag.3)
    n: int             # snapshots collected, an integer >= 0


class SWAGInfo(NamedTuple):
    """The named intermediates of one collection, by equation.

    Each field is documented by its trailing comment (the equation tag last).
    """
    theta_bar: Array   # theta_bar_n, (D,), (swag.1)
    theta2_bar: Array  # running second moment, (D,), (swag.2)
    dev: Array         # deviation theta_n - theta_bar_n stored in the buffer, (D,), (swag.3)


def _check_config(cfg) -> tuple[int, float, float]:
    if not isinstance(cfg, SWAGConfig):
        raise ValueError(f"cfg: expected a SWAGConfig, got {type(cfg).__name__}")
    K = check_int(cfg.K, "cfg.K", low=1)
    scale = float(check_positive(cfg.scale, "cfg.scale"))
    var_clamp = float(check_positive(cfg.var_clamp, "cfg.var_clamp", strict=False))
    return K, scale, var_clamp


check_at_construction(SWAGConfig, _check_config)


def _check_state(state, K=None, *, buffer_finite: bool = True) -> int:
    # buffer_finite=False checks D_hat's shape and dtype only: reading all K D entries would
    # cost more than the collect itself (the consumers of D_hat check their results instead)
    if not isinstance(state, SWAGState):
        raise ValueError(f"state: expected a SWAGState, got {type(state).__name__}")
    check_array(state.theta_bar, "state.theta_bar", ndim=1)
    check_float(state.theta_bar, "state.theta_bar")
    D = state.theta_bar.shape[0]
    check_array(state.theta2_bar, "state.theta2_bar", shape=(D,))
    check_array(state.D_hat, "state.D_hat", ndim=2, finite=buffer_finite)
    if state.D_hat.shape[1] != D or state.D_hat.shape[0] < 1:
        raise ValueError(f"state.D_hat: expected shape (K, {D}) with K >= 1, got "
                         f"{state.D_hat.shape}")
    if K is not None and state.D_hat.shape[0] != K:
        raise ValueError(f"state.D_hat: expected {K} rows (cfg.K), got {state.D_hat.shape[0]}")
    check_same_dtype({"state.theta_bar": state.theta_bar, "state.theta2_bar": state.theta2_bar,
                      "state.D_hat": state.D_hat})
    check_int(state.n, "state.n", low=0)
    xp_of(state.theta_bar, state.theta2_bar, state.D_hat)
    return D


def init(theta, cfg: SWAGConfig) -> SWAGState:
    """Create an empty SWAGState (n = 0) for parameters shaped like theta.

    Parameters
    ----------
    theta : array of shape (D,)
        Any parameter vector of the model (only its shape, dtype and backend are used).
    cfg : SWAGConfig
        The buffer size K.

    Returns
    -------
    SWAGState
        Zero moments, a zero (K, D) buffer and n = 0.

    Raises
    ------
    ValueError
        If theta is not a finite float 1-d array or cfg is invalid (see SWAGConfig).
    """
    check_array(theta, "theta", ndim=1)
    check_float(theta, "theta")
    K, _, _ = _check_config(cfg)
    xp = xp_of(theta)
    z = xp.zeros_like(theta)
    return SWAGState(z, z.copy(), xp.zeros((K, theta.shape[0]), dtype=theta.dtype), 0)


def collect(state: SWAGState, theta, cfg: SWAGConfig, *,
            inplace: bool = False) -> tuple[SWAGState, SWAGInfo]:
    """Add one snapshot theta_n to the SWAG moments (the official ``collect_model``, to an ulp).

    theta_bar_n = theta_bar (n - 1)/n + theta_n / n (swag.1), the same for the squares (swag.2),
    and the deviation theta_n - theta_bar_n into the ring buffer, overwriting the oldest row
    once n > K (swag.3).

    Parameters
    ----------
    state : SWAGState
        The moments of the first n - 1 snapshots.
    theta : array of shape (D,)
        The snapshot, in the state's dtype and backend.
    cfg : SWAGConfig
        The buffer size K (must match the state's buffer).
    inplace : bool, default False
        Write the deviation into state.D_hat itself instead of a copy: O(D) memory traffic
        instead of O(K D), for large D; the old state then shares (and sees) the new row.

    Returns
    -------
    state : SWAGState
        The moments of n snapshots.
    info : SWAGInfo
        The updated moments and the stored deviation (with inplace=False a view of its row of
        the new buffer, with inplace=True a copy).

    Raises
    ------
    ValueError
        If state or cfg is invalid (see SWAGState, SWAGConfig), or theta is not a finite (D,)
        array of the state's dtype.
    """
    K, _, _ = _check_config(cfg)
    D = _check_state(state, K, buffer_finite=False)
    check_array(theta, "theta", shape=(D,))
    check_same_dtype({"state.theta_bar": state.theta_bar, "theta": theta})
    xp = xp_of(state.theta_bar, theta)
    n = state.n + 1
    # in-place forms of the same operations, in the same order: no D-sized temporaries beyond
    # theta / n and theta^2 / n
    theta_bar = state.theta_bar * ((n - 1) / n)
    theta_bar += theta / n                                                # (swag.1)
    sq = theta * theta
    sq /= n
    theta2_bar = state.theta2_bar * ((n - 1) / n)
    theta2_bar += sq                                                      # (swag.2)
    D_hat = state.D_hat if inplace else state.D_hat.copy()
    row = D_hat[(n - 1) % K]
    xp.subtract(theta, theta_bar, out=row)                                # (swag.3)
    # inplace: the row is overwritten K collections later, so the Info gets its own copy
    dev = row.copy() if inplace else row
    return SWAGState(theta_bar, theta2_bar, D_hat, n), SWAGInfo(theta_bar, theta2_bar, dev)


def rank(state: SWAGState) -> int:
    """The number K' = min(n, K) of stored deviation columns.

    Parameters
    ----------
    state : SWAGState
        The moments.

    Returns
    -------
    int
        The count min(state.n, K).

    Raises
    ------
    ValueError
        If state is invalid (see SWAGState).
    """
    _check_state(state)
    return min(state.n, state.D_hat.shape[0])


def _order(state) -> list:
    # ring rows of the K' stored deviations, oldest first (the official row order)
    K = state.D_hat.shape[0]
    Kp = min(state.n, K)
    return [(state.n - Kp + j) % K for j in range(Kp)]


def deviations(state: SWAGState):
    """The paper's deviation matrix D_hat (D, K'), columns oldest first.

    Parameters
    ----------
    state : SWAGState
        The moments.

    Returns
    -------
    array of shape (D, K')
        Column j is the deviation of snapshot n - K' + 1 + j (swag.3).

    Raises
    ------
    ValueError
        If state is invalid (see SWAGState).
    """
    _check_state(state)
    return state.D_hat[_order(state)].T


def diag_variance(state: SWAGState, cfg: SWAGConfig):
    """The diagonal of Sigma_diag: max(theta2_bar - theta_bar^2, var_clamp).

    (swag.4)

    Parameters
    ----------
    state : SWAGState
        The moments, n >= 1.
    cfg : SWAGConfig
        The variance floor var_clamp.

    Returns
    -------
    array of shape (D,)
        The clamped variances.

    Raises
    ------
    ValueError
        If state or cfg is invalid (see SWAGState, SWAGConfig) or no snapshot was collected.
    """
    _, _, var_clamp = _check_config(cfg)
    _check_state(state)
    _need(state, 1)
    return _var(state, var_clamp)


def _var(state, var_clamp):
    xp = xp_of(state.theta_bar)
    return xp.maximum(state.theta2_bar - state.theta_bar * state.theta_bar, var_clamp)  # (swag.4)


def _need(state, n_min: int):
    if state.n < n_min:
        raise ValueError(f"state.n: expected at least {n_min} collected snapshot"
                         f"{'s' if n_min > 1 else ''}, got {state.n}")


def _low_rank(state, use_low_rank: bool):
    """(Kp, order) of the low-rank term, or (0, None) without it."""
    if not use_low_rank:
        return 0, None
    Kp = min(state.n, state.D_hat.shape[0])
    if Kp < 2:  # (swag.5) divides by K' - 1
        raise ValueError(f"state.n, cfg.K: the low-rank term needs K' = min(n, K) >= 2 stored "
                         f"deviations, got n = {state.n}, K = {state.D_hat.shape[0]} (use "
                         "SWAG-Diagonal, or collect more snapshots / a larger K)")
    return Kp, _order(state)


def _check_z(z, name, rows, S, dtype, finite=True) -> int:
    check_array(z, name, ndim=2, finite=finite)
    if z.shape[0] != rows or z.shape[1] < 1 or (S is not None and z.shape[1] != S):
        want = f"({rows}, {'S >= 1' if S is None else S})"
        raise ValueError(f"{name}: expected shape {want}, got {tuple(z.shape)}")
    if z.dtype != dtype:
        raise ValueError(f"{name}: expected dtype {dtype} (the state's), got {z.dtype}")
    return z.shape[1]


# Bytes of one row panel of ``sample`` on NumPy: its rows of D_hat^T (K), z1, the product and
# the draws (S each) then stay in a core's L2 cache between the product and the elementwise
# pass. Machine-specific: measured on the 2-core AMD EPYC dev VM (1 MiB L2 per core, one BLAS
# thread) at D = 1e6, K = 20, S = 30, where panels of 256 / 512 / 1024 / 2048 / 4096 / 8192
# rows (~0.2-7 MiB) were timed; see derivations/swag_experiments.md, "sample".
SAMPLE_PANEL_BYTES = 1 << 20


@numba.njit(cache=True)
def _draw_panel(z1, prod, theta_bar, theta2_bar, root_scale, var_clamp, out):
    """out = root_scale sqrt(max(theta2_bar - theta_bar^2, var_clamp)) z1 + prod + theta_bar,
    row by row, each entry the same IEEE operations in the same order as the whole-array NumPy
    form of (swag.7) (no contraction into FMAs: numba's default), so bit for bit equal to it.
    prod is the panel's D_hat z2 term, or a (0, S) array for SWAG-Diagonal. Returns the number
    of non-finite draws."""
    rows, S = out.shape
    low_rank = prod.shape[0] > 0
    bad = 0
    for i in range(rows):
        tb = theta_bar[i]
        v = theta2_bar[i] - tb * tb
        if v < var_clamp:  # np.maximum: a NaN stays NaN
            v = var_clamp
        c = root_scale * np.sqrt(v)                                             # (swag.4)
        if low_rank:
            for j in range(S):
                x = c * z1[i, j]
                x = x + prod[i, j]
                x = x + tb                                                      # (swag.7)
                out[i, j] = x
                bad += x - x != 0  # inf - inf and NaN - NaN are NaN
        else:
            for j in range(S):
                x = c * z1[i, j]
                x = x + tb                                                      # (swag.7)
                out[i, j] = x
                bad += x - x != 0
    return bad


def _sample_panels(state, z1, w, scale, var_clamp):
    """(swag.7) on NumPy over row panels: per panel the (rows, K) x (K, S) product D_hat^T w
    into a cached buffer, then one fused elementwise pass (``_draw_panel``). A row split of the
    product leaves each entry's K-sum, and so its rounding, as in the unblocked product.
    Returns (draws, all finite)."""
    D, S = z1.shape
    dtype = state.theta_bar.dtype
    K = 0 if w is None else w.shape[0]
    rows = max(64, SAMPLE_PANEL_BYTES // (dtype.itemsize * (K + 3 * S)))
    out = np.empty((D, S), dtype=dtype)
    prod = np.empty((min(rows, D) if K else 0, S), dtype=dtype)
    # scalars in the state's dtype, as NumPy casts Python floats against float32 arrays
    root_scale, clamp = dtype.type(math.sqrt(scale)), dtype.type(var_clamp)
    D_hat_T = state.D_hat.T
    bad = 0
    for start in range(0, D, rows):
        stop = min(start + rows, D)
        p = prod[:stop - start] if K else prod
        if K:
            np.matmul(D_hat_T[start:stop], w, out=p)                            # (swag.7)
        bad += _draw_panel(z1[start:stop], p, state.theta_bar[start:stop],
                           state.theta2_bar[start:stop], root_scale, clamp, out[start:stop])
    return out, bad == 0


def sample(state: SWAGState, z1, z2, cfg: SWAGConfig):
    """Draw theta = theta_bar + sqrt(scale) (Sigma_diag^{1/2} z1 + D_hat z2 / sqrt(K' - 1)).

    (swag.7)  With z2 = None, SWAG-Diagonal: theta_bar + sqrt(scale) Sigma_diag^{1/2} z1.
    ``scale`` = 0 is not allowed (use theta_bar, which is SWA). On NumPy the draws are formed
    over row panels of ``SAMPLE_PANEL_BYTES`` (the D_hat z2 product and the elementwise work
    of each panel in cache), bit for bit equal to the whole-array form CuPy runs.

    Parameters
    ----------
    state : SWAGState
        The moments: n >= 1, and n >= 2 when z2 is given.
    z1 : array of shape (D, S)
        Standard-normal draws for the diagonal part, one column per sample.
    z2 : array of shape (K', S) or None
        Standard-normal draws for the low-rank part, row j for the j-th oldest stored
        deviation (K' = ``rank(state)``); None for SWAG-Diagonal.
    cfg : SWAGConfig
        The scale and var_clamp.

    Returns
    -------
    array of shape (D, S)
        The draws.

    Raises
    ------
    ValueError
        If state or cfg is invalid (see SWAGState, SWAGConfig), too few snapshots were collected,
        or z1, z2 are not finite arrays of the shapes above in the state's dtype and backend.
    """
    K, scale, var_clamp = _check_config(cfg)
    D = _check_state(state, K, buffer_finite=False)
    _need(state, 1)
    S = _check_z(z1, "z1", D, None, state.theta_bar.dtype, finite=False)
    Kp, order = _low_rank(state, z2 is not None)
    if z2 is not None:
        _check_z(z2, "z2", Kp, S, state.theta_bar.dtype)
    xp = xp_of(state.theta_bar, z1, *(() if z2 is None else (z2,)))
    w = None
    if z2 is not None:
        # D_hat z2 from the ring rows in place: D_hat^T is (D, K); the z2 row of ring row r
        # goes to r, the rows not yet filled get zero weight
        w = xp.zeros((K, S), dtype=z2.dtype)
        # the low-rank divisor K' - 1 of (swag.5), the columns actually stored  (swag.7)
        w[xp.asarray(order)] = z2 * math.sqrt(scale / (Kp - 1))
    if xp is np:
        out, finite = _sample_panels(state, z1, w, scale, var_clamp)
    else:
        # CuPy: whole arrays (a panel loop would only add kernel launches); the scalars go on
        # the small factors; one (D, S) output, updated in place
        out = (math.sqrt(scale) * xp.sqrt(_var(state, var_clamp)))[:, None] * z1   # (swag.7)
        if w is not None:
            out += state.D_hat.T @ w                                                # (swag.7)
        out += state.theta_bar[:, None]                                             # (swag.7)
        finite = bool(xp.all(xp.isfinite(out)))
    if not finite:
        # the large inputs (D_hat, z1) are checked through the result; name the culprit
        check_array(z1, "z1")
        check_array(state.D_hat, "state.D_hat")
        raise ValueError("state: the draws overflowed (non-finite theta); expected moments "
                         "whose variances fit the dtype")
    return out


def dense_covariance(state: SWAGState, cfg: SWAGConfig, *, low_rank: bool = True):
    """Form scale (Sigma_diag + D_hat D_hat^T / (K' - 1)) densely, for tests.

    (swag.6)

    Parameters
    ----------
    state : SWAGState
        The moments: n >= 1, and n >= 2 with the low-rank term.
    cfg : SWAGConfig
        The scale and var_clamp.
    low_rank : bool, default True
        Include the low-rank term (SWAG); False gives SWAG-Diagonal's scale Sigma_diag.

    Returns
    -------
    array of shape (D, D)
        The covariance.

    Raises
    ------
    ValueError
        If state or cfg is invalid (see SWAGState, SWAGConfig) or too few snapshots were collected.
    """
    K, scale, var_clamp = _check_config(cfg)
    _check_state(state, K)
    _need(state, 1)
    Kp, _ = _low_rank(state, low_rank)
    xp = xp_of(state.theta_bar)
    Sigma = xp.diag(_var(state, var_clamp))
    if Kp:
        Dh = deviations(state)
        Sigma = Sigma + Dh @ Dh.T / (Kp - 1)                                    # (swag.5)
    return scale * Sigma                                                         # (swag.6)


def log_density(state: SWAGState, theta, cfg: SWAGConfig, *, low_rank: bool = True):
    """Evaluate log q(theta) of the SWAG Gaussian by Woodbury and the determinant lemma.

    With Sigma = scale (Lambda + V V^T), Lambda = Sigma_diag, V = D_hat / sqrt(K' - 1) and
    C = I + V^T Lambda^{-1} V (K' x K', Cholesky R): log det Sigma = D log scale +
    sum log Lambda + log det C, and
    ``r^T Sigma^{-1} r = (r^T Lambda^{-1} r - |R^{-1} V^T Lambda^{-1} r|^2) / scale``.  (swag.9)
    O(D K'^2) time, O(D K') memory.  (linalg.lowrank has the same identities for U U^T + diag(d)
    but requires rank <= D; here K' may exceed a small model's D.)

    Parameters
    ----------
    state : SWAGState
        The moments: n >= 1, and n >= 2 with the low-rank term.
    theta : array of shape (D,) or (D, S)
        Points, one per column.
    cfg : SWAGConfig
        The scale and var_clamp (the variance floor must make Lambda > 0: var_clamp > 0).
    low_rank : bool, default True
        The SWAG Gaussian (True) or SWAG-Diagonal's (False).

    Returns
    -------
    float or array of shape (S,)
        The log density at each point (a float for a 1-d theta).

    Raises
    ------
    ValueError
        If state or cfg is invalid (see SWAGState, SWAGConfig), cfg.var_clamp is 0, too few
        snapshots were collected, or theta is not a finite (D,) or (D, S) array of the state's
        dtype and backend.
    """
    K, scale, var_clamp = _check_config(cfg)
    D = _check_state(state, K)
    _need(state, 1)
    if var_clamp == 0:
        raise ValueError("cfg.var_clamp: expected > 0 for a density (Sigma_diag must be "
                         "positive definite), got 0")
    check_array(theta, "theta")
    if theta.ndim not in (1, 2) or theta.shape[0] != D:
        raise ValueError(f"theta: expected shape ({D},) or ({D}, S), got {theta.shape}")
    check_same_dtype({"state.theta_bar": state.theta_bar, "theta": theta})
    xp = xp_of(state.theta_bar, theta)
    Kp, _ = _low_rank(state, low_rank)
    r = (theta if theta.ndim == 2 else theta[:, None]) - state.theta_bar[:, None]
    lam = _var(state, var_clamp)
    Lr = r / lam[:, None]
    quad = xp.sum(r * Lr, axis=0)
    logdet = D * math.log(scale) + xp.sum(xp.log(lam))
    if Kp:
        V = deviations(state) / math.sqrt(Kp - 1)
        C = xp.eye(Kp, dtype=V.dtype) + V.T @ (V / lam[:, None])
        R = cholesky(C, check=False)  # I + a Gram matrix: positive definite by construction
        u = solve_triangular(R, V.T @ Lr, lower=True)
        quad = quad - xp.sum(u * u, axis=0)
        logdet = logdet + 2 * xp.sum(xp.log(xp.diag(R)))
    out = -0.5 * (D * math.log(2 * math.pi) + logdet + quad / scale)          # (swag.9)
    return float(out[0]) if theta.ndim == 1 else out

