"""SLANG: stochastic, low-rank, approximate natural-gradient Gaussian VI (Mishkin et al. 2018).

Implements (slang.1)-(slang.8) of derivations/slang.md: Algorithm 1 of the paper, one tagged
statement per printed line, with the corrections recorded there as errata (lines 7, 8, 10, 11).

Symbols (derivations/notation.md): mu (D,) mean; the precision is P = U U^T + diag(d) with
U (D, L) and d (D,) > 0; lam (D,) prior precision; N training-set size; minibatch of M rows;
S Monte Carlo draws (columns of eps (D, S)); alpha_t, beta_t step sizes, delta = 1 - beta_t.

Scaling: the loss is SUMMED over the N examples. Per-example gradients g_{s,i} of the M rows at
the S draws enter the curvature as W = [sqrt(delta) U, sqrt(beta_t N / (M S)) G^T] (line 7) so
that W W^T = delta U U^T + beta_t EF with EF = (N / (M S)) sum_{s,i} g_{s,i} g_{s,i}^T, the
empirical Fisher of ngvi (ngvi.9); the gradient is (N / (M S)) sum_{s,i} g_{s,i} (line 11);
lam is unscaled, multiplied by beta_t in the d update (line 10). No tempering.

Randomness: ``step`` draws nothing. eps (D, S) feeds fast_sample (line 4); with
eig="randomized" the caller also passes Omega (L + M S, L + p), the test matrix of fast_eig.
With eig="exact" (the default) line 7 is an exact rank-L truncation, so a step is a
deterministic function of (state, batch, eps).

Examples
--------
One SLANG step (rank L = 2) on 20 synthetic logistic-regression points; the caller draws the
minibatch and the standard-normal eps (a step draws nothing):

>>> import numpy as np
>>> from refbayes.datasets import make_logistic_regression
>>> from refbayes.methods import slang
>>> from refbayes.models import LogisticRegression
>>> data = make_logistic_regression(20, 3, 0)     # N = 20 rows, 3 features, seed 0
>>> model = LogisticRegression(3)                 # D = 4 with the intercept
>>> state = slang.init(np.zeros(model.D), np.zeros((model.D, 2)), np.ones(model.D))  # mu, U, d
>>> cfg = slang.SLANGConfig(N=20, lam=np.ones(model.D), L=2)
>>> rng = np.random.default_rng(0)
>>> idx = rng.choice(20, size=8, replace=False)   # minibatch, M = 8
>>> eps = rng.standard_normal((model.D, 2))       # S = 2 draws
>>> batch = slang.Batch(data.X[idx], data.y[idx].astype(float))
>>> state, info = slang.step(state, batch, eps, cfg, model)
>>> state.U.shape, info.G.shape, slang.dense_covariance(state).shape   # G: (S, M, D)
((4, 2), (2, 8, 4), (4, 4))

``refbayes.methods.driver.run`` takes many such steps, drawing from a Generator it is given.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

from refbayes._checks import (
    check_array,
    check_at_construction,
    check_float,
    check_int,
    check_same_dtype,
)
from refbayes.backend import xp_of
from refbayes.linalg import lowrank
from refbayes.methods._estimates import (
    Batch,
    check_batch,
    check_eps,
    check_hyper,
    check_model,
    check_N,
    check_prior,
    check_t,
    momentum_direction,
    per_example_grads,
    step_sizes,
)

__all__ = [
    "EIG_METHODS",
    "FORWARDS",
    "SAMPLERS",
    "Batch",
    "SLANGConfig",
    "SLANGInfo",
    "SLANGState",
    "dense_covariance",
    "dense_precision",
    "init",
    "sample",
    "step",
]

Array = Any

EIG_METHODS = ("exact", "randomized")
SAMPLERS = ("symmetric", "alg3")
FORWARDS = ("draw", "mean+draw")  # line 6's gradients at theta_s, or at mu + theta_s (slang.9)


class SLANGConfig(NamedTuple):
    """SLANG hyperparameters; defaults are the SLANG paper's logistic-regression settings.

    Each field is documented by its trailing comment (symbol, range, equation tag).  ``step``
    checks a SLANGConfig against the state and raises ValueError unless: N is an integer >= 1;
    lam is a finite float (D,) array > 0 in the state's dtype; L is an integer in [1, D] equal
    to the state's rank (the columns of U); alpha and beta are finite reals in (0, 1]; decay is
    a finite real >= 0; momentum is in [0, 1); eig is in EIG_METHODS, sampler in SAMPLERS,
    forward in FORWARDS; and n_iter is an integer >= 0.

    Construction (``SLANGConfig(...)``, and unpickling) checks these rules too, except lam's
    length and dtype, L <= D and L = the state's rank, known only with the state; ``_replace``
    and ``_make`` do not, so the functions check every cfg again.
    """
    N: int                    # training-set size, >= 1 (slang.8), (slang.5)
    lam: Array                # prior precision (D,), > 0 (slang.4), (slang.5)
    L: int                    # rank of U, 1 <= L <= D (slang.2)
    alpha: float = 0.05       # mean step size alpha_0, in (0, 1] (slang.6)
    beta: float = 0.05        # precision step size beta_0, in (0, 1] (slang.2)-(slang.4)
    decay: float = 0.51       # alpha_t = alpha / (1 + (t + 1)^decay), t = state.t; beta_t alike; 0: constant (ngvi.12)
    #                           decay >= 0; t = state.t counts the steps already taken
    momentum: float = 0.0     # b in [0, 1) of (ngvi.13); 0 is Algorithm 1 as printed, the official code uses 0.9
    eig: str = "exact"        # fast_eig: "exact" (lowrank.9) or "randomized" (lowrank.10)
    n_iter: int = 2           # power iterations >= 0 of the randomized fast_eig
    sampler: str = "symmetric"  # fast_sample: "symmetric" (lowrank.8) or "alg3" (lowrank.12)
    forward: str = "draw"     # line 6 at theta_s ("draw") or at mu + theta_s ("mean+draw", slang.9)
    #                           mu + theta_s: where the official PyTorch code's network runs (it adds
    #                           each full draw to its parameters, which hold mu)


class SLANGState(NamedTuple):
    """SLANG state after t steps; the precision is U U^T + diag(d).

    Each field is documented by its trailing comment.  Every function that takes a state checks
    it and raises ValueError unless: mu is a finite float (float64 or float32) (D,) array; U, d
    and g_bar are finite arrays of shapes (D, L), (D,), (D,) in mu's dtype; every d > 0 with
    1 / d finite, and U U^T and the capacitance I + U^T diag(d)^{-1} U finite
    (lowrank.check_factor_values); and t is an integer >= 0.
    """
    mu: Array     # mu_t, (D,), (slang.6)
    U: Array      # U_t, (D, L), (slang.2)
    d: Array      # d_t, (D,), > 0, (slang.4)
    g_bar: Array  # momentum average of g_hat (likelihood gradient only), (D,), (ngvi.13)
    t: int        # steps taken, an integer >= 0


class SLANGInfo(NamedTuple):
    """The named intermediates of one SLANG step, by line of Algorithm 1.

    Each field is documented by its trailing comment (the algorithm line and equation tag).
    """
    alpha_t: float    # mean step size of this step (ngvi.12)
    beta_t: float     # precision step size of this step (ngvi.12); delta = 1 - beta_t is Algorithm 1 line 2
    theta: Array      # line 4: theta_s = fast_sample(mu, U, d, eps_s), (D, S)  (slang.7)
    G: Array          # line 6: per-example gradients g_{s,i}, (S, M, D)  (slang.8)
    W: Array          # line 7 input: [sqrt(delta) U, sqrt(beta_t N/(M S)) G^T], (D, L + M S)  (slang.2)
    U: Array          # lines 7, 9: U_{t+1} = fast_eig(W, L), (D, L)  (slang.2)
    Delta_d: Array    # line 8: diag(W W^T - U_{t+1} U_{t+1}^T), (D,)  (slang.3)
    d: Array          # line 10: d_{t+1} = delta d_t + Delta_d + beta_t lam, (D,)  (slang.4)
    g_tilde: Array    # line 11: (N/(M S)) sum g_{s,i} + lam * mu_t, (D,)  (slang.5)
    direction: Array  # g_bar bias-corrected + lam * mu_t (ngvi.13); = g_tilde when momentum = 0, (D,)
    Delta_mu: Array   # line 12: fast_inverse(direction, U_{t+1}, d_{t+1}), (D,)  (slang.6)
    mu: Array         # line 13: mu_{t+1} = mu_t - alpha_t Delta_mu, (D,)  (slang.6)


# ----------------------------------------------------------------------------- checks

def _check_state(state):
    if not isinstance(state, SLANGState):
        raise ValueError(f"state: expected a SLANGState, got {type(state).__name__}")
    check_array(state.mu, "state.mu", ndim=1)
    check_float(state.mu, "state.mu")
    D = state.mu.shape[0]
    check_array(state.U, "state.U", shape=(D, None))
    check_array(state.d, "state.d", shape=(D,))
    check_array(state.g_bar, "state.g_bar", shape=(D,))
    check_same_dtype({"state.mu": state.mu, "state.U": state.U, "state.d": state.d,
                      "state.g_bar": state.g_bar})
    # d > 0 with 1/d finite, U U^T and the capacitance finite: what lowrank needs (lowrank.2)
    lowrank.check_factor_values(state.U, state.d, ("state.U", "state.d"))
    check_t(state.t)
    return D, state.U.shape[1]


def _check_cfg(cfg, D=None, L_state=None, dtype=None):
    if not isinstance(cfg, SLANGConfig):
        raise ValueError(f"cfg: expected a SLANGConfig, got {type(cfg).__name__}")
    N = check_N(cfg.N)
    check_prior(cfg.lam, D, dtype)
    L = check_int(cfg.L, "L", low=1, high=D)
    if L_state is not None and L != L_state:
        raise ValueError(f"L: expected the state's rank {L_state} (U has {L_state} columns), "
                         f"got L = {L}")
    hyper = check_hyper(cfg.alpha, cfg.beta, cfg.decay, cfg.momentum)
    if cfg.eig not in EIG_METHODS:
        raise ValueError(f"eig: expected one of {EIG_METHODS}, got {cfg.eig!r}")
    if cfg.sampler not in SAMPLERS:
        raise ValueError(f"sampler: expected one of {SAMPLERS}, got {cfg.sampler!r}")
    if cfg.forward not in FORWARDS:
        raise ValueError(f"forward: expected one of {FORWARDS}, got {cfg.forward!r}")
    check_int(cfg.n_iter, "n_iter", low=0)
    return (N, L) + hyper


check_at_construction(SLANGConfig, _check_cfg)  # D, dtype unknown: L <= D and lam later


# ----------------------------------------------------------------------------- public API

def init(mu, U, d) -> SLANGState:
    """Create the initial SLANGState at (mu, U, d), with g_bar = 0 and t = 0.

    The paper starts at mu = 0, Sigma = I: U = 0 and d = 1 (``sample`` handles U = 0;
    ``sampler="alg3"`` does not, see lowrank.sample_alg3).

    Parameters
    ----------
    mu : array of shape (D,)
        Initial mean.
    U : array of shape (D, L)
        Initial low-rank precision factor, 1 <= L <= D, same dtype as mu.
    d : array of shape (D,)
        Initial diagonal precision part, > 0, same dtype as mu.

    Returns
    -------
    SLANGState
        The state (mu, U, d, zeros, 0).

    Raises
    ------
    ValueError
        If mu is not a finite float 1-d array, U not a finite (D, L) array with
        1 <= L <= D, d not a finite (D,) array > 0, the dtypes differ, or the arrays mix
        NumPy and CuPy.
    """
    xp = xp_of(mu, U, d)
    check_array(mu, "mu", ndim=1)
    check_float(mu, "mu")
    D = mu.shape[0]
    check_array(U, "U", shape=(D, None))
    check_int(U.shape[1], "L (columns of U)", low=1, high=D)
    check_array(d, "d", shape=(D,))
    check_same_dtype({"mu": mu, "U": U, "d": d})
    lowrank.check_factor_values(U, d)  # d > 0 with 1/d finite; U U^T, U^T d^{-1} U finite
    return SLANGState(mu, U, d, xp.zeros_like(mu), 0)


def sample(state: SLANGState, eps, sampler: str = "symmetric"):
    """Draw theta = mu + S eps with S S^T = (U U^T + diag d)^{-1} (fast_sample).

    (slang.7)

    Parameters
    ----------
    state : SLANGState
        Current state (mu, U, d, g_bar, t).
    eps : array of shape (D, S)
        Standard-normal draws from the caller, one column per sample (or (D,)).
    sampler : {"symmetric", "alg3"}, default "symmetric"
        ``lowrank.sample`` (lowrank.8) or ``lowrank.sample_alg3`` (lowrank.12).

    Returns
    -------
    array of shape (D, S)
        The draws theta, shaped like eps.

    Raises
    ------
    ValueError
        If state is invalid (see SLANGState), sampler is not one of SAMPLERS, eps is not a finite
        (D,) or (D, S) array of the state's dtype, or (sampler="alg3") U is not of full column
        rank.
    """
    _check_state(state)
    if sampler not in SAMPLERS:
        raise ValueError(f"sampler: expected one of {SAMPLERS}, got {sampler!r}")
    fn = lowrank.sample if sampler == "symmetric" else lowrank.sample_alg3
    return fn(state.mu, state.U, state.d, eps)  # (slang.7)


def step(state: SLANGState, batch, eps, cfg: SLANGConfig, model, *,
         Omega=None) -> tuple[SLANGState, SLANGInfo]:
    """Take one step of Algorithm 1 (lines 4-13), as derived in derivations/slang.md.

    (slang.2)-(slang.8), with the step sizes of (ngvi.12) and the momentum of (ngvi.13); with
    cfg.forward="mean+draw" the gradients of line 6 are taken at mu + theta_s (slang.9).

    Parameters
    ----------
    state : SLANGState
        Current state (mu, U, d, g_bar, t).
    batch : Batch
        The minibatch rows Batch(X_B (M, n_in), y_B (M,)), 1 <= M <= N.
    eps : array of shape (D, S)
        Standard-normal draws for line 4, one column per MC sample.
    cfg : SLANGConfig
        Hyperparameters.
    model : FlatModel or CNN
        A refbayes.models model with D parameters (an MLP, a linear model or a CNN).
    Omega : array of shape (L + M S, L + p), optional
        Test matrix of the randomized fast_eig; required with cfg.eig="randomized" and
        refused with cfg.eig="exact".

    Returns
    -------
    state : SLANGState
        The state after the step, t + 1.
    info : SLANGInfo
        The step's intermediates, by line.

    Raises
    ------
    ValueError
        If state or cfg is invalid (see SLANGState, SLANGConfig); if model is not a FlatModel or
        CNN with D parameters or batch does not fit it (see Batch); if eps is None or not a
        (D, S >= 1) array of the state's dtype; if Omega does not match cfg.eig or has the wrong shape; if the
        arrays mix NumPy and CuPy; or if the new d has an entry <= 0 (a randomized fast_eig that
        overshot diag(W W^T)).
    """
    D, L_state = _check_state(state)
    xp = xp_of(state.mu, state.U, state.d)
    dtype = state.mu.dtype
    N, L, alpha, beta, decay, b = _check_cfg(cfg, D, L_state, dtype)
    check_model(model, D, cnn=True)
    X, y, M = check_batch(batch, model, N, dtype)
    S = check_eps(eps, D, dtype, "ef")  # SLANG's curvature is the EF: it needs draws
    if cfg.eig == "exact" and Omega is not None:
        raise ValueError("Omega: only used by eig='randomized', got an array with eig='exact'")
    if cfg.eig == "randomized" and Omega is None:
        raise ValueError(f"Omega: eig='randomized' needs the caller's test matrix of shape "
                         f"(L + M S, L + p) = ({L + M * S}, >= {L}), got None")
    mu, U, d, lam = state.mu, state.U, state.d, cfg.lam
    alpha_t, beta_t = step_sizes(state.t, alpha, beta, decay)                 # (ngvi.12)
    delta = 1.0 - beta_t                                                      # line 2
    theta = sample(state, eps, cfg.sampler)                                   # line 4 (slang.7)
    # the official PyTorch network adds the whole draw to its parameters, which hold mu (slang.9)
    w = theta if cfg.forward == "draw" else theta + mu[:, None]               # (slang.9)
    G = per_example_grads(model, w, X, y)                                     # line 6 (slang.8)
    c = N / (M * S)
    # W is built as its transpose (L + M S, D): each block is then a contiguous row copy, and
    # W^T W in top_eig is a single BLAS product of C-ordered rows. G keeps its own array (not
    # per_example_grads(..., out=W_T[L:])): Info returns both the raw G and the scaled W, so two
    # (M S, D) arrays exist either way (derivations/slang_experiments.md, "Info.G and W^T").
    W_T = xp.empty((L + M * S, D), dtype=dtype)
    # NOTE: printed line 7 scales the columns by delta and beta; W W^T needs their roots (slang.2)
    xp.multiply(U.T, math.sqrt(delta), out=W_T[:L])                           # line 7 (slang.2)
    xp.multiply(G.reshape(S * M, D), math.sqrt(beta_t * c), out=W_T[L:])      # line 7 (slang.2)
    W = W_T.T
    U_new = lowrank.top_eig(W, L, method=cfg.eig, Omega=Omega, n_iter=cfg.n_iter)  # lines 7, 9
    # NOTE: printed line 8 omits N / (M S) on the gradient squares (slang.3)
    Delta_d = (xp.einsum("kd,kd->d", W_T, W_T)
               - xp.einsum("dl,dl->d", U_new, U_new))                         # line 8 (slang.3)
    # NOTE: printed line 10 adds lam, not beta_t lam (slang.4)
    d_new = delta * d + Delta_d + beta_t * lam                                # line 10 (slang.4)
    if not bool(xp.all(d_new > 0)):
        raise ValueError(f"step: d after step {state.t} has entries <= 0 (randomized fast_eig "
                         "overshot diag(W W^T)); use eig='exact' or more power iterations")
    # NOTE: printed line 11 omits N / M (and 1 / S) on sum_i g_i (slang.5)
    g_hat = c * G.sum(axis=(0, 1))                                            # (ngvi.8)
    g_tilde = g_hat + lam * mu                                                # line 11 (slang.5)
    g_bar, direction = momentum_direction(state.g_bar, g_hat, lam, mu, b, state.t)  # (ngvi.13)
    Delta_mu = lowrank.solve(U_new, d_new, direction)                         # line 12 (slang.6)
    mu_new = mu - alpha_t * Delta_mu                                          # line 13 (slang.6)
    info = SLANGInfo(alpha_t, beta_t, theta, G, W, U_new, Delta_d, d_new, g_tilde, direction,
                     Delta_mu, mu_new)
    return SLANGState(mu_new, U_new, d_new, g_bar, state.t + 1), info


def dense_precision(state: SLANGState):
    """Form the dense precision U U^T + diag(d), for tests and small D.

    (slang.1)

    Parameters
    ----------
    state : SLANGState
        Current state (mu, U, d, g_bar, t).

    Returns
    -------
    array of shape (D, D)
        The precision.

    Raises
    ------
    ValueError
        If state is invalid (see SLANGState).
    """
    _check_state(state)
    return lowrank.dense_precision(state.U, state.d)


def dense_covariance(state: SLANGState):
    """Form the dense covariance (U U^T + diag(d))^{-1} by Woodbury, for tests and small D.

    (slang.1)

    Parameters
    ----------
    state : SLANGState
        Current state (mu, U, d, g_bar, t).

    Returns
    -------
    array of shape (D, D)
        The covariance.

    Raises
    ------
    ValueError
        If state is invalid (see SLANGState).
    """
    _check_state(state)
    return lowrank.dense_covariance(state.U, state.d)
