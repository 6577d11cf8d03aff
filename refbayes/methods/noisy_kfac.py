"""Noisy K-FAC (Zhang, Sun, Duvenaud and Grosse 2018, "Noisy Natural Gradient as Variational
Inference", arXiv:1712.02390, Algorithm 2) and K-FAC (Martens and Grosse 2015) as its
noise-free case.

Implements (noisy_kfac.2)-(noisy_kfac.12) and (noisy_kfac.20) of derivations/noisy_kfac.md.
Symbols: mu (D,) the mean; m (D,) the momentum buffer; per layer l, with a~ the layer input with
a 1 appended (bias) and s its pre-activation, A_l (n_in + 1, n_in + 1) and S_l (n_out, n_out) the
running Kronecker factors, A_ref, S_ref the factors as of the last refresh (every T_inv steps);
eta the prior VARIANCE, lambda = kl_weight, gamma_in = lambda / (N eta) the intrinsic damping,
gamma = gamma_in + gamma_ex the damping of the mean's preconditioner, gamma_s the sampler's
(gamma_in, gd-zhang's, or gamma, torchsso's: cfg.sampler_damping), delta the decoupled weight
decay (cfg.weight_decay, torchsso's; gd-zhang's code has none); eps (D, S) the caller's
standard-normal draws in the flat layout (eps = None: K-FAC, the gradient at mu).

Scaling: V = (1/(M S)) sum_s sum_{i in B} grad l_i(w_s) + gamma_in mean_s w_s is per-example
(noisy_kfac.8): M and S enter as means, N only through gamma_in and the covariance
(lambda / N) (...)^{-1} (noisy_kfac.6). The factor statistics are per-example means
(noisy_kfac.3), taken at the step's draws (the official code takes them at a fresh draw after
the step: derivations/noisy_kfac.md, C1).

One step (t -> t + 1)::

    w_s  = mu + Sigma^{1/2} eps_s from A_ref, S_ref, damped by gamma_s     (noisy_kfac.6)-(noisy_kfac.7)
    V    = mean gradient at the draws + gamma_in w                         (noisy_kfac.8)
    P_l  = damped K-FAC solve of V_l with A_ref, S_ref and gamma           (noisy_kfac.9)
    P    <- nu P, nu = min(1, sqrt(kl_clip / (alpha^2 <V, P>))) if kl_clip   (noisy_kfac.10)
    m    <- momentum m + P + delta mu;  mu <- mu - alpha m                 (noisy_kfac.11)
    every T_stats steps: A, S <- (1 - beta) (A, S) + beta (A_hat, S_hat)   (noisy_kfac.3)-(noisy_kfac.4)
    every T_inv steps:   A_ref, S_ref <- A, S, and their operators inv      (noisy_kfac.12)

That is cfg.refresh_order = "after" (gd-zhang's order). With "before" (torchsso's), the
statistics at the step's draws are accumulated, and a refresh due at this step made, BEFORE the
solve: P is the solve with factors that hold this step's statistics (the draws still use the
last refresh). With cfg.momentum_type = "raw" (torchsso's option; dl-with-bayes' K-FAC config
sets it) the heavy ball runs on V before the solve, in place of (noisy_kfac.10)-(noisy_kfac.11)::

    m    <- momentum m + V;  P = (damped K-FAC solve of m) + delta mu;  mu <- mu - alpha P (noisy_kfac.20)

The sampler and the solve use the operators of A_ref, S_ref (Cholesky factors of the damped
factors, or eigenbases), computed once per refresh and kept in ``state.inv``: a step between
refreshes costs triangular solves or matrix products only (the sampler's operators only when
the step draws: K-FAC's factors need only be definite at its own damping gamma). ``state.inv`` is a cache: it records the tuples
A_ref, S_ref (by identity) and the damping it was computed for, and any step, ``sample`` or
``dense_covariance`` that finds it missing or made for other factors or another damping
recomputes it, so a state built by hand (``inv=None``) or changed with ``_replace`` is always
used correctly. (The state's arrays must not be modified in place; nothing here does.)

Examples
--------
One Noisy K-FAC step on a small MLP and 20 synthetic regression points; the caller draws the
minibatch and the standard-normal eps (a step draws nothing):

>>> import numpy as np
>>> from refbayes.datasets import make_linear_regression
>>> from refbayes.methods import noisy_kfac
>>> from refbayes.models import MLP
>>> data = make_linear_regression(20, 2, 0, 4.0)  # N = 20 rows, 2 features, seed 0, tau = 4
>>> model = MLP([2, 4, 1], "tanh", "gaussian", noise_precision=4.0)   # D = 17
>>> rng = np.random.default_rng(0)
>>> state = noisy_kfac.init(0.5 * rng.standard_normal(model.D), model)
>>> cfg = noisy_kfac.NoisyKFACConfig(N=20, alpha=0.01)
>>> idx = rng.choice(20, size=8, replace=False)   # minibatch, M = 8
>>> eps = rng.standard_normal((model.D, 1))       # one draw of the weights
>>> batch = noisy_kfac.Batch(data.X[idx], data.y[idx])
>>> state, info = noisy_kfac.step(state, batch, eps, cfg, model)
>>> state.mu.shape, [A.shape for A in info.A_hat], [S.shape for S in info.S_hat]
((17,), [(3, 3), (5, 5)], [(4, 4), (1, 1)])
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
from scipy.linalg import blas

from refbayes._checks import (
    check_array,
    check_at_construction,
    check_float,
    check_in_range,
    check_int,
    check_positive,
    renamed_keyword,
)
from refbayes.backend import solve_triangular, xp_of
from refbayes.linalg import kron
from refbayes.methods._estimates import (
    Batch,
    check_batch,
    check_draw_precisions,
    check_model,
    check_N,
    check_t,
    from_kfac,
    kfac_blocks,
    to_kfac,
)

__all__ = ["CURVATURES", "DAMPINGS", "MOMENTUM_TYPES", "Batch", "ExactInverse",
           "FactoredInverse", "NoisyKFACConfig", "NoisyKFACInfo", "NoisyKFACInverses",
           "NoisyKFACState", "REFRESH_ORDERS", "SAMPLER_DAMPINGS", "dense_covariance",
           "gamma_in", "init", "layer_slices", "refresh", "sample", "step"]

Array = Any
CURVATURES = ("ggn", "ef", "mc")
DAMPINGS = ("factored", "exact")
SAMPLER_DAMPINGS = ("intrinsic", "full")
REFRESH_ORDERS = ("after", "before")
MOMENTUM_TYPES = ("preconditioned", "raw")


class NoisyKFACConfig(NamedTuple):
    """Noisy K-FAC hyperparameters.

    Each field is documented by its trailing comment. The functions that take a cfg check it
    and raise ValueError unless: N, T_stats and T_inv are integers >= 1; eta, kl_weight and
    alpha are finite reals > 0; beta is in (0, 1]; momentum is in [0, 1); gamma_ex is a finite
    real >= 0; damping is in DAMPINGS; curvature is in CURVATURES; kl_clip is None or a
    finite real > 0; weight_decay is a finite real >= 0; sampler_damping is in
    SAMPLER_DAMPINGS; refresh_order is in REFRESH_ORDERS; and momentum_type is in
    MOMENTUM_TYPES, "raw" only without KL clipping (kl_clip None).

    Construction (``NoisyKFACConfig(...)``, and unpickling) checks these rules too; ``_replace``
    and ``_make`` do not, so the functions check every cfg again.
    """
    N: int                     # training-set size >= 1 (noisy_kfac.2)
    eta: float = 1.0           # prior VARIANCE > 0, p(w) = N(0, eta I), the paper's and the official eta (noisy_kfac.1)
    kl_weight: float = 1.0     # KL weight lambda > 0 (noisy_kfac.1)
    alpha: float = 1e-3        # step size alpha > 0 (noisy_kfac.11)
    beta: float = 1e-2         # weight of the new statistics, in (0, 1]; official 1 - cov_ema_decay (noisy_kfac.4)
    momentum: float = 0.9      # momentum, in [0, 1) (noisy_kfac.11)
    gamma_ex: float = 0.0      # extrinsic damping >= 0 of the mean's preconditioner (noisy_kfac.9)
    T_stats: int = 1           # factor statistics every T_stats >= 1 steps (noisy_kfac.4)
    T_inv: int = 1             # refresh of the solve's and sampler's factors every T_inv >= 1 steps (noisy_kfac.6), (noisy_kfac.9)
    damping: str = "factored"  # "factored" (K-FAC's, official) | "exact" A kron S + gamma I (noisy_kfac.5)
    curvature: str = "ggn"     # output factor from the "ggn" | "ef" | "mc" (the caller's sampled labels) (noisy_kfac.3)
    kl_clip: Any = None        # KL clipping bound kappa > 0 (official kl_clip), or None for none (noisy_kfac.10)
    weight_decay: float = 0.0  # decoupled decay delta >= 0 of the mean, added after the solve: P + delta mu enters the momentum ("raw": the step only) (torchsso's weight_decay; none in gd-zhang's code) (noisy_kfac.11), (noisy_kfac.20)
    sampler_damping: str = "intrinsic"  # the sampler's damping gamma_s: "intrinsic" gamma_in (gd-zhang's) | "full" gamma (torchsso's) (noisy_kfac.6)
    refresh_order: str = "after"  # a refresh due at step t: "after" the mean step (gd-zhang's) | "before" the solve, with step t's statistics (torchsso's) (noisy_kfac.12)
    momentum_type: str = "preconditioned"  # the heavy ball on P (gd-zhang's; torchsso's default) | "raw": on V, then one solve (torchsso's option) (noisy_kfac.11), (noisy_kfac.20)


class NoisyKFACState(NamedTuple):
    """Noisy K-FAC state after t steps.

    Each field is documented by its trailing comment. Every function that takes a state (with
    its model) checks it and raises ValueError unless: mu is a finite float (float64 or
    float32) (D,) array; model is a FlatModel or CNN with D parameters; m is a finite (D,)
    array (its dtype is not checked); t is an integer >= 0; inv is None or a NoisyKFACInverses (its
    contents are not checked); and A, S, A_ref, S_ref are tuples of one finite square factor
    per layer, (n_in + 1, n_in + 1) or (n_out, n_out) as ``layer_slices(model)`` gives, in mu's
    dtype.
    """
    mu: Array       # mean, (D,), (noisy_kfac.11)
    m: Array        # momentum buffer, (D,), (noisy_kfac.11)
    A: tuple        # running A_l, (n_in + 1, n_in + 1) each (noisy_kfac.4)
    S: tuple        # running S_l, (n_out, n_out) each (noisy_kfac.4)
    A_ref: tuple    # A_l as of the last refresh (noisy_kfac.6)
    S_ref: tuple    # S_l as of the last refresh (noisy_kfac.6)
    t: int          # steps taken, an integer >= 0
    inv: Any = None  # operators of A_ref, S_ref, or None (noisy_kfac.12)
    #                  a cache, recomputed where missing or stale (see the module docstring)


class FactoredInverse(NamedTuple):
    """One layer's operators under factored damping, from A_ref, S_ref.

    With pi = ``kron.factored_damping_pi(A_ref, S_ref)``, d = sqrt(gamma_s), r = sqrt(gamma),
    and lower Cholesky factors: the sampler is Z = L_A_in^{-T} E L_S_in^{-1} (noisy_kfac.6),
    the solve L_A^{-T} L_A^{-1} V L_S^{-T} L_S^{-1} (noisy_kfac.9), both by triangular solves
    (``kron.sample_chol``, ``kron.solve_chol``).  (noisy_kfac.12)

    Each field is documented by its trailing comment.
    """
    L_A: Array     # chol(A_ref + pi sqrt(gamma) I) (noisy_kfac.9), (noisy_kfac.12)
    #                the solve's; (n_in + 1, n_in + 1) with a bias
    L_S: Array     # chol(S_ref + sqrt(gamma) / pi I) (noisy_kfac.9), (noisy_kfac.12)
    L_A_in: Any    # chol(A_ref + pi sqrt(gamma_s) I) or None (noisy_kfac.6), (noisy_kfac.12)
    #                the sampler's (L_A itself when gamma_s = gamma); None when no draw needed it (K-FAC)
    L_S_in: Any    # chol(S_ref + sqrt(gamma_s) / pi I) or None (noisy_kfac.6), (noisy_kfac.12)
    A_inv: Any = None  # (A_ref + pi sqrt(gamma) I)^{-1} or None (noisy_kfac.12)
    #                    = L_A^{-T} L_A^{-1}, formed when the refresh is used more than once
    #                    (T_inv > 1): the solve is then A_inv V S_inv, two products instead of
    #                    four triangular solves; None for T_inv = 1
    S_inv: Any = None  # (S_ref + sqrt(gamma) / pi I)^{-1} or None (noisy_kfac.12)
    R_A_in: Any = None  # L_A_in^{-1} (lower) or None (noisy_kfac.12): formed with A_inv, S_inv
    #                     when the sampler is needed (T_inv > 1, NumPy), so that the draw is two
    #                     triangular products (BLAS trmm, half a GEMM each) instead of two solves
    R_S_in: Any = None  # L_S_in^{-1} (lower) or None (noisy_kfac.12)


class ExactInverse(NamedTuple):
    """One layer's operators under exact damping, from A_ref, S_ref.

    With A_ref = Q_A diag(lam_A) Q_A^T, S_ref = Q_S diag(lam_S) Q_S^T and Lam = lam_A lam_S^T,
    the solve is Q_A ((Q_A^T V Q_S) * inv) Q_S^T (noisy_kfac.9) and the sampler
    Z = Q_A ((Q_A^T E Q_S) * root) Q_S^T (noisy_kfac.6).  (noisy_kfac.12)

    Each field is documented by its trailing comment.
    """
    Q_A: Array     # eigenvectors of A_ref (noisy_kfac.12)
    Q_S: Array     # eigenvectors of S_ref (noisy_kfac.12)
    inv: Array     # (Lam + gamma)^{-1}, (n_in + 1, n_out) (noisy_kfac.12)
    root: Any      # (Lam + gamma_s)^{-1/2}, (n_in + 1, n_out), or None when no draw needed it (noisy_kfac.12)


class NoisyKFACInverses(NamedTuple):
    """The operators of every layer, with what they were computed from.

    (noisy_kfac.12)

    Each field is documented by its trailing comment.
    """
    A_ref: tuple   # the A_ref tuple they were computed from (compared by identity)
    S_ref: tuple   # the S_ref tuple they were computed from (compared by identity)
    key: tuple     # (damping, gamma_s, gamma) they were computed for
    layers: tuple  # one FactoredInverse or ExactInverse per layer


class NoisyKFACInfo(NamedTuple):
    """The named intermediates of one Noisy K-FAC step, by equation.

    Each field is documented by its trailing comment (the equation tag last).
    """
    w: Array       # draws, (D, S); the mean as one column for K-FAC (noisy_kfac.7)
    V: Array       # gradient at the draws + gamma_in w, (D,) (noisy_kfac.8)
    P: Array       # preconditioned gradient + delta mu, (D,); "raw": of the new buffer m, the step's direction (noisy_kfac.9), (noisy_kfac.20)
    m: Array       # new momentum buffer, (D,); "raw": of V (noisy_kfac.11), (noisy_kfac.20)
    mu: Array      # new mean, (D,) (noisy_kfac.11)
    A_hat: Any     # minibatch input statistics, or None (noisy_kfac.3)
    S_hat: Any     # minibatch output statistics, or None (noisy_kfac.3)
    nu: float      # KL-clipping factor applied to P, 1 without clipping (noisy_kfac.10)


def layer_slices(model) -> list:
    """(start, stop, n_in~, n_out) of each layer's [W_l; b_l^T] block in the flat theta.

    For a CNN, (start, stop, n_a, n_b) of each parameter layer's K-FAC matrix W~ (conv.24): a
    dense layer's slice is W~ row-major, a conv layer's holds W~ = [Wm^T; b^T] permuted, and the
    methods gather and scatter it through the block map (``_estimates.kfac_blocks``, (conv.33)).

    Parameters
    ----------
    model : FlatModel or CNN
        The network.

    Returns
    -------
    list of tuple
        One (start, stop, n_in + bias, n_out) per layer, in layer order.

    Raises
    ------
    ValueError
        If model is not a FlatModel or a CNN.
    """
    check_model(model, cnn=True)
    return [(b.start, b.stop, b.n_a, b.n_b) for b in kfac_blocks(model)]


def gamma_in(cfg: NoisyKFACConfig) -> float:
    """The intrinsic damping lambda / (N eta).

    (noisy_kfac.2)

    Parameters
    ----------
    cfg : NoisyKFACConfig
        The hyperparameters.

    Returns
    -------
    float
        The value kl_weight / (N eta).

    Raises
    ------
    ValueError
        If cfg is invalid (see NoisyKFACConfig).
    """
    return _check_config(cfg)["gamma_in"]


def _check_config(cfg) -> dict:
    if not isinstance(cfg, NoisyKFACConfig):
        raise ValueError(f"cfg: expected a NoisyKFACConfig, got {type(cfg).__name__}")
    N = check_N(cfg.N)
    eta = float(check_positive(cfg.eta, "cfg.eta"))
    lam = float(check_positive(cfg.kl_weight, "cfg.kl_weight"))
    alpha = float(check_positive(cfg.alpha, "cfg.alpha"))
    beta = check_in_range(cfg.beta, "cfg.beta", 0.0, 1.0, low_open=True)
    momentum = check_in_range(cfg.momentum, "cfg.momentum", 0.0, 1.0, high_open=True)
    gamma_ex = check_in_range(cfg.gamma_ex, "cfg.gamma_ex", 0.0, math.inf, high_open=True)
    T_stats = check_int(cfg.T_stats, "cfg.T_stats", low=1)
    T_inv = check_int(cfg.T_inv, "cfg.T_inv", low=1)
    if cfg.damping not in DAMPINGS:
        raise ValueError(f"cfg.damping: expected one of {DAMPINGS}, got {cfg.damping!r}")
    if cfg.curvature not in CURVATURES:
        raise ValueError(f"cfg.curvature: expected one of {CURVATURES}, got {cfg.curvature!r}")
    kl_clip = None if cfg.kl_clip is None else check_in_range(
        cfg.kl_clip, "cfg.kl_clip", 0.0, math.inf, low_open=True, high_open=True)
    delta = check_in_range(cfg.weight_decay, "cfg.weight_decay", 0.0, math.inf, high_open=True)
    if cfg.refresh_order not in REFRESH_ORDERS:
        raise ValueError(f"cfg.refresh_order: expected one of {REFRESH_ORDERS}, got "
                         f"{cfg.refresh_order!r}")
    if cfg.sampler_damping not in SAMPLER_DAMPINGS:
        raise ValueError(f"cfg.sampler_damping: expected one of {SAMPLER_DAMPINGS}, got "
                         f"{cfg.sampler_damping!r}")
    if cfg.momentum_type not in MOMENTUM_TYPES:
        raise ValueError(f"cfg.momentum_type: expected one of {MOMENTUM_TYPES}, got "
                         f"{cfg.momentum_type!r}")
    if cfg.momentum_type == "raw" and kl_clip is not None:
        raise ValueError(f"cfg.kl_clip: expected None with momentum_type 'raw' (KL clipping "
                         f"(noisy_kfac.10) scales the solve of one gradient), got {kl_clip}")
    g_in = lam / (N * eta)                                                   # (noisy_kfac.2)
    gamma = g_in + gamma_ex                                                  # (noisy_kfac.9)
    return {"kl_clip": kl_clip, "N": N, "lam": lam, "alpha": alpha, "beta": beta,
            "momentum": momentum, "gamma_in": g_in, "gamma": gamma, "delta": float(delta),
            "gamma_s": g_in if cfg.sampler_damping == "intrinsic" else gamma,  # (noisy_kfac.6)
            "T_stats": T_stats, "T_inv": T_inv}


check_at_construction(NoisyKFACConfig, _check_config)


def init(mu, model) -> NoisyKFACState:
    """Create the initial state at mu: zero momentum, every factor the identity, t = 0.

    Identity factors are the official start (the covariance variables start at I).

    Parameters
    ----------
    mu : array of shape (D,)
        Initial mean.
    model : FlatModel or CNN
        The network with D parameters.

    Returns
    -------
    NoisyKFACState
        The state.

    Raises
    ------
    ValueError
        If mu is not a finite float (D,) array or model is not a FlatModel or CNN with D parameters.
    """
    check_array(mu, "mu", ndim=1)
    check_float(mu, "mu")
    check_model(model, mu.shape[0], cnn=True)
    xp = xp_of(mu)
    A = tuple(xp.eye(n_in, dtype=mu.dtype) for _, _, n_in, _ in layer_slices(model))
    S = tuple(xp.eye(n_out, dtype=mu.dtype) for _, _, _, n_out in layer_slices(model))
    return NoisyKFACState(mu, xp.zeros_like(mu), A, S, A, S, 0)


def _check_state(state, model) -> list:
    if not isinstance(state, NoisyKFACState):
        raise ValueError(f"state: expected a NoisyKFACState, got {type(state).__name__}")
    check_array(state.mu, "state.mu", ndim=1)
    check_float(state.mu, "state.mu")
    D = state.mu.shape[0]
    check_model(model, D, cnn=True)
    check_array(state.m, "state.m", shape=(D,))
    check_t(state.t)
    if state.inv is not None and not isinstance(state.inv, NoisyKFACInverses):
        raise ValueError(f"state.inv: expected a NoisyKFACInverses or None, got "
                         f"{type(state.inv).__name__}")
    # the block map: slices, and conv layers' permutations (conv.24), (conv.33)
    blocks = kfac_blocks(model)
    checked = set()
    for name in ("A", "S", "A_ref", "S_ref"):
        factors = getattr(state, name)
        if not isinstance(factors, tuple) or len(factors) != len(blocks):
            raise ValueError(f"state.{name}: expected a tuple of {len(blocks)} factors, got "
                             f"{type(factors).__name__}")
        for l, (F, blk) in enumerate(zip(factors, blocks)):
            n = blk.n_a if name.startswith("A") else blk.n_b
            # after a refresh A_ref, S_ref are the arrays A, S: scan each array once
            check_array(F, f"state.{name}[{l}]", shape=(n, n), finite=id(F) not in checked)
            checked.add(id(F))
            if F.dtype != state.mu.dtype:
                raise ValueError(f"state.{name}[{l}]: expected dtype {state.mu.dtype}, got "
                                 f"{F.dtype}")
    return blocks


def _tri_inverse(L):
    """L^{-1} (lower) from the lower Cholesky factor L."""
    xp = xp_of(L)
    return solve_triangular(L, xp.eye(L.shape[0], dtype=L.dtype), lower=True,
                                          check_finite=False)


def _chol_inverse(L, L_inv=None):
    """(L L^T)^{-1} = L^{-T} L^{-1} from the lower Cholesky factor L (or its inverse L_inv)."""
    R = (_tri_inverse(L) if L_inv is None else L_inv).T  # L^{-T}
    return R @ R.T


def _layer_inverse(A, Sf, damping, g_s, gamma, sampler, explicit):
    """One layer's operators of (A_ref, S_ref) = (A, Sf): the solve's (damped by gamma), and the
    sampler's (by g_s = gamma_s) when ``sampler`` (K-FAC never draws, and its factors need only
    be definite at gamma); under factored damping the solve's inverses formed when
    ``explicit``.  (noisy_kfac.12)"""
    xp = xp_of(A, Sf)
    if damping == "exact":
        if not sampler:
            Q_A, Q_S, Lam_g = kron.damped_eigh(A, Sf, gamma)                   # (noisy_kfac.5)
            return ExactInverse(Q_A, Q_S, 1.0 / Lam_g, None)                    # (noisy_kfac.12)
        Q_A, Q_S, Lam_in = kron.damped_eigh(A, Sf, g_s)                        # (noisy_kfac.5)
        return ExactInverse(Q_A, Q_S, 1.0 / (Lam_in + (gamma - g_s)),           # (noisy_kfac.12)
                            1.0 / xp.sqrt(Lam_in))                              # (noisy_kfac.12)
    L_A, L_S = kron.factored_chol(A, Sf, gamma)                                 # (noisy_kfac.9)
    R_A = R_S = R_A_in = R_S_in = None
    if explicit:
        R_A, R_S = _tri_inverse(L_A), _tri_inverse(L_S)
    inverses = (_chol_inverse(L_A, R_A), _chol_inverse(L_S, R_S)) if explicit else (None, None)
    if not sampler:
        L_A_in = L_S_in = None
    elif gamma == g_s:  # gamma_ex = 0 or "full": the sampler's damped factors are the solve's
        L_A_in, L_S_in, R_A_in, R_S_in = L_A, L_S, R_A, R_S
    else:
        L_A_in, L_S_in = kron.factored_chol(A, Sf, g_s)                         # (noisy_kfac.5)
        if explicit:
            R_A_in, R_S_in = _tri_inverse(L_A_in), _tri_inverse(L_S_in)
    if xp is not np:  # the trmm sampler is NumPy's (scipy.linalg.blas)
        R_A_in = R_S_in = None
    return FactoredInverse(L_A, L_S, L_A_in, L_S_in, *inverses,                 # (noisy_kfac.12)
                           R_A_in=R_A_in, R_S_in=R_S_in)


def _has_sampler(inv) -> bool:
    return all((op.L_A_in if isinstance(op, FactoredInverse) else op.root) is not None
               for op in inv.layers)


def _inverses(state, c, damping, sampler) -> NoisyKFACInverses:
    """state.inv when it was computed from state.A_ref, state.S_ref for this damping (with
    the sampler's operators when ``sampler``), else the operators computed now."""
    key = (damping, c["gamma_s"], c["gamma"])
    inv = state.inv
    if (inv is not None and inv.A_ref is state.A_ref and inv.S_ref is state.S_ref
            and inv.key == key and (not sampler or _has_sampler(inv))):
        return inv
    # explicit inverses pay off when the refresh serves several solves (T_inv > 1): forming
    # them costs about two products, and each solve with them saves about one
    explicit = c["T_inv"] > 1
    layers = []
    for l, (A, Sf) in enumerate(zip(state.A_ref, state.S_ref)):
        try:
            layers.append(_layer_inverse(A, Sf, damping, c["gamma_s"], c["gamma"], sampler,
                                         explicit))
        except ValueError as err:
            raise ValueError(f"state.A_ref[{l}], state.S_ref[{l}] ({damping} damping, sampler's "
                             f"gamma_s = {c['gamma_s']:.3g}, gamma = {c['gamma']:.3g}): "
                             f"{err}") from err
    return NoisyKFACInverses(state.A_ref, state.S_ref, key, tuple(layers))


def refresh(state: NoisyKFACState, cfg: NoisyKFACConfig, model,
            sampler: bool = True) -> NoisyKFACState:
    """Return the state with ``inv`` the operators of its A_ref, S_ref for cfg's damping.

    ``step`` keeps ``inv`` up to date itself (and ``sample`` recomputes a missing one): call
    this after building or changing a state by hand, so that the next step does not pay for
    the decompositions (a cycle of T_inv steps then holds exactly one).  (noisy_kfac.12)

    Parameters
    ----------
    state : NoisyKFACState
        The state.
    cfg : NoisyKFACConfig
        The hyperparameters (damping, gamma_in, gamma_ex, sampler_damping).
    model : FlatModel or CNN
        The network.
    sampler : bool, default True
        Also the sampler's operators (Noisy K-FAC); False for K-FAC's solve alone.

    Returns
    -------
    NoisyKFACState
        The same state with ``inv`` set.

    Raises
    ------
    ValueError
        If state, cfg or model is invalid (see NoisyKFACState, NoisyKFACConfig), or a damped factor
        is not positive definite.
    """
    c = _check_config(cfg)
    _check_state(state, model)
    if not isinstance(sampler, bool):
        raise ValueError(f"sampler: expected True or False, got {sampler!r}")
    return state._replace(inv=_inverses(state, c, cfg.damping, sampler))


def _apply_sampler(op, E):
    """Sigma_l^{1/2} E / sqrt(lambda / N) for E (n_in + 1, n_out, S).  (noisy_kfac.6)"""
    if isinstance(op, FactoredInverse):
        if op.R_A_in is not None:
            return _sample_trmm(op.R_A_in, op.R_S_in, E)                      # (noisy_kfac.6)
        return kron.sample_chol(op.L_A_in, op.L_S_in, E)                     # (noisy_kfac.6)
    R = (op.Q_A.T @ E.transpose(2, 0, 1) @ op.Q_S) * op.root                  # (S, n_in, n_out)
    return (op.Q_A @ R @ op.Q_S.T).transpose(1, 2, 0)                         # (noisy_kfac.6)


def _sample_trmm(R_A, R_S, E):
    """L_A^{-T} E L_S^{-1} for E (n_in, n_out, S) from R_A = L_A^{-1}, R_S = L_S^{-1} (lower),
    by two BLAS triangular products.  (noisy_kfac.6)"""
    n_in, n_out, S = E.shape
    trmm = _trmm_of(E.dtype)
    # L_A^{-T} E for the S draws at once: E as (n_in, n_out S)
    Y = trmm(1.0, R_A, E.reshape(n_in, n_out * S), side=0, lower=1, trans_a=1)
    # (Y_s L_S^{-1})^T = L_S^{-T} Y_s^T, the S draws side by side: (n_out, n_in S)
    Yt = Y.reshape(n_in, n_out, S).transpose(1, 0, 2).reshape(n_out, n_in * S)
    Z = trmm(1.0, R_S, Yt, side=0, lower=1, trans_a=1)
    return Z.reshape(n_out, n_in, S).transpose(1, 0, 2)                       # (noisy_kfac.6)


def _trmm_of(dtype):
    return blas.dtrmm if dtype == np.float64 else blas.strmm


def _apply_solve(op, V):
    """The damped K-FAC solve of one layer's block V (n_in + 1, n_out).  (noisy_kfac.9)"""
    if isinstance(op, FactoredInverse):
        if op.A_inv is not None:
            return op.A_inv @ V @ op.S_inv                                    # (noisy_kfac.9)
        return kron.solve_chol(op.L_A, op.L_S, V)                             # (noisy_kfac.9)
    return op.Q_A @ ((op.Q_A.T @ V @ op.Q_S) * op.inv) @ op.Q_S.T             # (noisy_kfac.9)


def _sample_columns(state, eps, blocks, c, inv):
    """The draws w (D, S): per layer (noisy_kfac.6)-(noisy_kfac.7)."""
    xp = xp_of(state.mu, eps)
    S = eps.shape[1]
    scale = math.sqrt(c["lam"] / c["N"])
    out = []
    for blk, op in zip(blocks, inv.layers):
        # eps and the draw in theta's layout, the layer's operators in W~'s (conv.24), (conv.33)
        Z = _apply_sampler(op, to_kfac(eps, blk).reshape(blk.n_a, blk.n_b, S))  # (noisy_kfac.6)
        Z = from_kfac(Z.reshape(blk.stop - blk.start, S), blk)                 # (conv.33)
        out.append(state.mu[blk.start:blk.stop, None] + scale * Z)           # (noisy_kfac.7)
    return xp.concatenate(out, axis=0)


def sample(state: NoisyKFACState, eps, cfg: NoisyKFACConfig, model):
    """Draw w = mu + Sigma^{1/2} eps from the layerwise matrix-variate normal.

    Sigma_l = (lambda / N) (A + pi sqrt(gamma_s) I)^{-1} kron (S + sqrt(gamma_s) / pi I)^{-1}
    ("factored") or (lambda / N) (A kron S + gamma_s I)^{-1} ("exact"), from A_ref, S_ref, with
    gamma_s = gamma_in (sampler_damping "intrinsic") or gamma (``"full"``).
    (noisy_kfac.6)-(noisy_kfac.7)

    Parameters
    ----------
    state : NoisyKFACState
        The state.
    eps : array of shape (D, S)
        Standard-normal draws, the flat layout (each layer's block row-major (n_in + 1, n_out)).
    cfg : NoisyKFACConfig
        The hyperparameters.
    model : FlatModel or CNN
        The network.

    Returns
    -------
    array of shape (D, S)
        The draws.

    Raises
    ------
    ValueError
        If state, cfg or model is invalid (see NoisyKFACState, NoisyKFACConfig), or eps is not a
        finite (D, S >= 1) array of the state's dtype.
    """
    c = _check_config(cfg)
    blocks = _check_state(state, model)
    _check_eps(eps, state)
    return _sample_columns(state, eps, blocks, c, _inverses(state, c, cfg.damping, True))


def _check_eps(eps, state):
    D = state.mu.shape[0]
    check_array(eps, "eps", ndim=2)
    if eps.shape[0] != D or eps.shape[1] < 1:
        raise ValueError(f"eps: expected shape ({D}, S >= 1), got {tuple(eps.shape)}")
    if eps.dtype != state.mu.dtype:
        raise ValueError(f"eps: expected dtype {state.mu.dtype} (the state's), got {eps.dtype}")


def dense_covariance(state: NoisyKFACState, cfg: NoisyKFACConfig, model):
    """Form the block-diagonal covariance of the layerwise matrix-variate normal, for tests.

    (noisy_kfac.6)

    Parameters
    ----------
    state : NoisyKFACState
        The state.
    cfg : NoisyKFACConfig
        The hyperparameters.
    model : FlatModel or CNN
        The network.

    Returns
    -------
    array of shape (D, D)
        The covariance.

    Raises
    ------
    ValueError
        If state, cfg or model is invalid (see NoisyKFACState, NoisyKFACConfig).
    """
    c = _check_config(cfg)
    blocks = _check_state(state, model)
    xp = xp_of(state.mu)
    # the sampling map's columns (identity draws) are a square root of the block-diagonal
    # covariance; its outer product is Sigma
    centred = state._replace(mu=xp.zeros_like(state.mu))
    W = _sample_columns(centred, xp.eye(state.mu.shape[0], dtype=state.mu.dtype), blocks, c,
                        _inverses(state, c, cfg.damping, True))
    return W @ W.T                                                            # (noisy_kfac.6)


def _ema(F, H, beta):
    """(1 - beta) F + beta H into one new array.  (noisy_kfac.4)"""
    out = (1 - beta) * F
    out += beta * H                                                           # (noisy_kfac.4)
    return out


def _precondition(V, blocks, inv):
    """P = the damped K-FAC solve of each layer's block of V.  (noisy_kfac.9)"""
    xp = xp_of(V)
    # each block gathered into W~ order and scattered back (conv.24), (conv.33)
    return xp.concatenate([from_kfac(_apply_solve(op, to_kfac(V, b).reshape(b.n_a, b.n_b))
                                     .reshape(-1), b)                          # (noisy_kfac.9)
                           for b, op in zip(blocks, inv.layers)])


def step(state: NoisyKFACState, batch, eps, cfg: NoisyKFACConfig, model,
         y_tilde=None, noise_precisions=None, *,
         tau=None) -> tuple[NoisyKFACState, NoisyKFACInfo]:
    """Take one Noisy K-FAC step (K-FAC with eps = None).

    (noisy_kfac.3)-(noisy_kfac.12), (noisy_kfac.20); see the module docstring for the order.

    Parameters
    ----------
    state : NoisyKFACState
        Current state.
    batch : Batch
        The minibatch rows Batch(X_B (M, n_in), y_B (M,)), 1 <= M <= N.
    eps : array of shape (D, S) or None
        Standard-normal draws; None evaluates everything at mu (K-FAC).
    cfg : NoisyKFACConfig
        The hyperparameters.
    model : FlatModel or CNN
        The network with D parameters.
    y_tilde : array of shape (S, M) or (S, M, n_out), optional
        Labels sampled from the model's predictive at each draw (S = 1 for K-FAC), required
        for curvature "mc" and refused otherwise.
    noise_precisions : array of shape (S,), optional
        Per-draw noise precisions tau_s (a learned noise, refbayes.methods.noise_gamma): draw s's
        likelihood is N(y | f(x; w_s), 1 / tau_s), so its gradient is tau_s times the model's,
        its "ef"/"mc" output statistics tau_s^2 times and its "ggn" ones tau_s times
        (noise_gamma.2); the model must be Gaussian with noise_precision 1. For "mc", y_tilde[s]
        must be drawn with precision tau_s. None: the model's own likelihood for every draw.
    tau : array of shape (S,), optional
        The former name of ``noise_precisions`` (DeprecationWarning; removed in the next
        release).

    Returns
    -------
    state : NoisyKFACState
        The state after the step, t + 1.
    info : NoisyKFACInfo
        The step's intermediates, by equation.

    Raises
    ------
    ValueError
        If state, cfg or model is invalid (see NoisyKFACState, NoisyKFACConfig), batch does not fit
        model (see Batch), eps is invalid (as for ``sample``), or y_tilde is missing for curvature
        "mc" (or given for another curvature, or of the wrong shape); if noise_precisions is
        given but not a finite (S,) array > 0 of the state's dtype, or the model's likelihood is
        not Gaussian with noise_precision 1; if both noise_precisions and tau are given.
    """
    c = _check_config(cfg)
    blocks = _check_state(state, model)
    X, y, M = check_batch(batch, model, c["N"], state.mu.dtype)
    xp = xp_of(state.mu, X, y, y_tilde, eps)
    if eps is not None:
        _check_eps(eps, state)
    inv = _inverses(state, c, cfg.damping, eps is not None)                   # (noisy_kfac.12)
    W = state.mu[:, None] if eps is None else \
        _sample_columns(state, eps, blocks, c, inv)                           # (noisy_kfac.7)
    S = W.shape[1]
    if cfg.curvature == "mc":
        if y_tilde is not None:
            check_array(y_tilde, "y_tilde", ndim=(2, 3))
        if y_tilde is None or y_tilde.shape[:2] != (S, M):
            raise ValueError(f"y_tilde: expected sampled labels of shape ({S}, {M}, ...) for "
                             "curvature 'mc', got "
                             f"{None if y_tilde is None else tuple(y_tilde.shape)}")
    elif y_tilde is not None:
        raise ValueError(f"y_tilde: only curvature 'mc' uses sampled labels, got curvature "
                         f"{cfg.curvature!r}")
    tau = renamed_keyword(noise_precisions, tau, "noise_precisions", "tau", "noisy_kfac.step")
    if tau is not None:
        xp_of(state.mu, tau)
        check_draw_precisions(tau, S, model, state.mu.dtype)
    t = state.t + 1
    # one batched pass at the S draws: the gradients, and the statistics when they are due
    # ("mc": the "ef" factors at the sampled labels)
    curv = None if t % c["T_stats"] else ("ef" if cfg.curvature == "mc" else cfg.curvature)
    G, factors = model.kfac_moments(W.T, X, y, curv,
                                    y_tilde if cfg.curvature == "mc" and curv else None,
                                    tau)  # per-draw precisions, (noise_gamma.2)
    V = G.sum(axis=0) / (M * S) + c["gamma_in"] * W.mean(axis=1)              # (noisy_kfac.8)
    A, Sf, A_hat, S_hat = state.A, state.S, None, None
    if factors is not None:
        A_hat = tuple(A_l for A_l, _ in factors)                              # (noisy_kfac.3)
        S_hat = tuple(B_l / M for _, B_l in factors)                          # (noisy_kfac.3)
        b = c["beta"]
        A = tuple(_ema(F, H, b) for F, H in zip(A, A_hat))                    # (noisy_kfac.4)
        Sf = tuple(_ema(F, H, b) for F, H in zip(Sf, S_hat))                  # (noisy_kfac.4)
    due = t % c["T_inv"] == 0
    if due and cfg.refresh_order == "before":  # torchsso: the solve sees step t's statistics
        ref = NoisyKFACState(state.mu, state.m, A, Sf, A, Sf, t)
        inv = _inverses(ref, c, cfg.damping, eps is not None)                 # (noisy_kfac.12)
    nu = 1.0
    if cfg.momentum_type == "raw":  # torchsso's 'raw': the heavy ball on V, one solve of it
        m = c["momentum"] * state.m + V                                       # (noisy_kfac.20)
        P = _precondition(m, blocks, inv)                                     # (noisy_kfac.20)
        if c["delta"]:  # torchsso's weight_decay: after the solve, as in (noisy_kfac.11)
            P = P + c["delta"] * state.mu                                     # (noisy_kfac.20)
        mu = state.mu - c["alpha"] * P                                        # (noisy_kfac.20)
    else:
        P = _precondition(V, blocks, inv)                                     # (noisy_kfac.9)
        if c["kl_clip"] is not None:
            vPv = float(xp.sum(V * P))  # V^T F~^{-1} V >= 0: the damped K-FAC solve is SPD
            if vPv > 0:
                nu = min(1.0, math.sqrt(c["kl_clip"] / (c["alpha"] ** 2 * vPv)))  # (noisy_kfac.10)
            P = nu * P                                                        # (noisy_kfac.10)
        if c["delta"]:  # torchsso's weight_decay: added after the solve, before the momentum
            P = P + c["delta"] * state.mu                                     # (noisy_kfac.11)
        m = c["momentum"] * state.m + P                                       # (noisy_kfac.11)
        mu = state.mu - c["alpha"] * m                                        # (noisy_kfac.11)
    new = NoisyKFACState(mu, m, A, Sf, state.A_ref, state.S_ref, t, inv)
    if due:  # the refresh, with its operators (kept if A, S did not change, or made above)
        new = new._replace(A_ref=A, S_ref=Sf)
        new = new._replace(inv=_inverses(new, c, cfg.damping, eps is not None))  # (noisy_kfac.12)
    return new, NoisyKFACInfo(W, V, P, m, mu, A_hat, S_hat, nu)
