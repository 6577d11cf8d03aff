"""Natural-gradient Gaussian VI: full-covariance and mean-field, with three curvatures.

Implements (ngvi.4)-(ngvi.16) of derivations/ngvi.md (Khan and Lin 2017; Khan et al. 2018;
the full-Gaussian and mean-field baselines of Mishkin et al. 2018, SLANG).

Symbols (derivations/notation.md): mu (D,) mean; Sigma_inv (D, D) precision of the full
Gaussian; prec_diag (D,) precision of the mean-field Gaussian; lam (D,) prior precision,
p(theta) = N(0, diag(lam)^{-1}); N training-set size; a minibatch of M rows; S Monte Carlo
draws theta_s (columns of eps (D, S)); alpha_t, beta_t step sizes of the mean and precision.

Scaling: the loss is SUMMED over the N examples; minibatch sums are multiplied by N / M and
Monte Carlo sums by 1 / S ((ngvi.8)-(ngvi.10)); lam enters unscaled, multiplied by beta_t in
the precision update (ngvi.4) and added as lam * mu to the gradient in the mean update (ngvi.5).
No tempering (tau = 1).

Curvature: "ef" the empirical Fisher sum_i g_i g_i^T (ngvi.9), "hess" the Hessian at each draw
(ngvi.10), "exact" E_q[Hessian] and E_q[gradient] by Gauss-Hermite quadrature over
a_i = x~_i^T theta (ngvi.11; linear models with one output; no draws, eps=None).

Sampling: full, theta_s = mu + Sigma_chol_inv^T eps_s with Sigma_chol_inv^T = L^{-T}, L L^T =
Sigma_inv (lower Cholesky of the precision) (ngvi.6); mean-field, theta_s = mu + eps_s /
sqrt(prec_diag) (ngvi.14).

Examples
--------
One full-covariance and one mean-field natural-gradient VI step on 20 synthetic
logistic-regression points; the caller draws the minibatch and the standard-normal eps:

>>> import numpy as np
>>> from refbayes.datasets import make_logistic_regression
>>> from refbayes.methods import ngvi
>>> from refbayes.models import LogisticRegression
>>> data = make_logistic_regression(20, 3, 0)     # N = 20 rows, 3 features, seed 0
>>> model = LogisticRegression(3)                 # D = 4 with the intercept
>>> cfg = ngvi.NGVIConfig(N=20, lam=np.ones(model.D))
>>> rng = np.random.default_rng(0)
>>> idx = rng.choice(20, size=8, replace=False)   # minibatch, M = 8
>>> eps = rng.standard_normal((model.D, 2))       # S = 2 draws
>>> batch = ngvi.Batch(data.X[idx], data.y[idx].astype(float))
>>> full, info = ngvi.step_full(ngvi.init_full(np.zeros(model.D), np.eye(model.D)), batch, eps,
...                             cfg, model)
>>> mf, _ = ngvi.step_meanfield(ngvi.init_meanfield(np.zeros(model.D), np.ones(model.D)), batch,
...                             eps, cfg, model)
>>> full.Sigma_inv.shape, mf.prec_diag.shape, info.G.shape   # G: (S, M, D)
((4, 4), (4,), (2, 8, 4))
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from refbayes._checks import (
    check_at_construction,
    check_array,
    check_float,
    check_invertible_positive,
    check_same_dtype,
    check_symmetric,
    value_checks,
)
from refbayes.backend import cho_solve, cholesky, solve_triangular, xp_of
from refbayes.methods._estimates import (
    CURVATURES,
    Batch,
    check_batch,
    check_curvature,
    check_eps,
    check_hessian_backend,
    check_hyper,
    check_model,
    check_N,
    check_prior,
    check_t,
    ef_diag_estimate,
    ef_estimate,
    exact_terms,
    glm_design,
    grad_estimate,
    hess_diag_estimate,
    hess_estimate,
    momentum_direction,
    per_example_grads,
    step_sizes,
)

__all__ = [
    "CURVATURES",
    "Batch",
    "FullInfo",
    "FullState",
    "MeanFieldInfo",
    "MeanFieldState",
    "NGVIConfig",
    "dense_covariance",
    "dense_covariance_meanfield",
    "init_full",
    "init_meanfield",
    "sample_full",
    "sample_meanfield",
    "step_full",
    "step_meanfield",
]

Array = Any
# what replaces curvature "hess" on CuPy for a model whose Hessian is autograd's (an MLP)
_HESS_ON_CUPY = 'cfg.curvature "ef" (or "exact" for linear and logistic regression)'


class NGVIConfig(NamedTuple):
    """Natural-gradient VI hyperparameters (defaults: the SLANG paper's logistic regression).

    Each field is documented by its trailing comment.  ``step_full`` and ``step_meanfield``
    check a cfg against the state and raise ValueError unless: N is an integer >= 1; lam is a
    finite float (D,) array > 0 in the state's dtype; alpha and beta are finite reals in (0, 1];
    decay is a finite real >= 0; momentum is in [0, 1); and curvature is one of CURVATURES
    ("ef", "hess", "exact").  "hess" on an MLP is autograd's Hessian, NumPy only: the steps
    refuse it with CuPy arrays (linear and logistic regression have it in closed form on both
    backends).

    Construction (``NGVIConfig(...)``, and unpickling) checks these rules too, except lam's
    length and dtype, known only with the state; ``_replace`` and ``_make`` do not, so the
    functions check every cfg again.
    """
    N: int                   # training-set size >= 1, scales minibatch sums by N / M (ngvi.8)
    lam: Array               # prior precision (D,), > 0 (ngvi.4), (ngvi.5)
    alpha: float = 0.05      # mean step size alpha_0, in (0, 1] (ngvi.5)
    beta: float = 0.05       # precision step size beta_0, in (0, 1] (ngvi.4)
    decay: float = 0.51      # alpha_t = alpha / (1 + (t + 1)^decay), t = state.t; beta_t alike; 0: constant (ngvi.12)
    #                          decay >= 0; t = state.t counts the steps already taken
    curvature: str = "ef"    # "ef" (ngvi.9), "hess" (ngvi.10) or "exact" (ngvi.11)
    momentum: float = 0.0    # b in [0, 1) of (ngvi.13); 0 turns momentum off


class FullState(NamedTuple):
    """Full-covariance Gaussian state after t steps.

    Each field is documented by its trailing comment.  Every function that takes a state checks
    it and raises ValueError unless: mu is a finite float (float64 or float32) (D,) array;
    Sigma_inv and g_bar are finite (D, D) and (D,) arrays of mu's dtype; Sigma_inv is symmetric
    and its Cholesky factorization succeeds (positive definite); and t is an integer >= 0.
    """
    mu: Array         # mu_t, (D,), (ngvi.5)
    Sigma_inv: Array  # Sigma_t^{-1}, (D, D), SPD, (ngvi.4)
    g_bar: Array      # momentum average of g_hat (likelihood gradient only), (D,), (ngvi.13)
    t: int            # steps taken, an integer >= 0


class FullInfo(NamedTuple):
    """The named intermediates of one full-Gaussian step, by equation.

    Each field is documented by its trailing comment (the equation tag last).
    """
    alpha_t: float    # mean step size of this step (ngvi.12)
    beta_t: float     # precision step size of this step (ngvi.12)
    theta: Array      # theta_s, (D, S) draws; (D, 0) for "exact"  (ngvi.6)
    G: Array          # g_{s,i}, (S, M, D) per-example gradients; (0, M, D) for "exact"  (ngvi.7)
    g_hat: Array      # minibatch estimate of E_q[grad sum_n l_n], (D,)  (ngvi.8) / (ngvi.11)
    C_hat: Array      # minibatch estimate of E_q[grad^2 sum_n l_n], (D, D)  (ngvi.9)-(ngvi.11)
    Sigma_inv: Array  # precision Sigma_{t+1}^{-1}, (D, D)  (ngvi.4)
    g_tilde: Array    # g_hat + lam * mu_t, (D,)  (ngvi.5)
    direction: Array  # g_bar bias-corrected + lam * mu_t (ngvi.13); = g_tilde when momentum = 0, (D,)
    Delta_mu: Array   # Sigma_{t+1} direction, (D,)  (ngvi.5)
    mu: Array         # mu_{t+1}, (D,)  (ngvi.5)


class MeanFieldState(NamedTuple):
    """Mean-field Gaussian state after t steps.

    Each field is documented by its trailing comment.  Every function that takes a state checks
    it and raises ValueError unless: mu is a finite float (float64 or float32) (D,) array;
    prec_diag and g_bar are finite (D,) arrays of mu's dtype; every prec_diag > 0 with
    1 / prec_diag finite; and t is an integer >= 0.
    """
    mu: Array         # mu_t, (D,), (ngvi.16)
    prec_diag: Array  # diag(Sigma_t^{-1}), (D,), > 0, (ngvi.15)
    g_bar: Array      # momentum average of g_hat (likelihood gradient only), (D,), (ngvi.13)
    t: int            # steps taken, an integer >= 0


class MeanFieldInfo(NamedTuple):
    """The named intermediates of one mean-field step, by equation.

    Each field is documented by its trailing comment (the equation tag last).
    """
    alpha_t: float    # mean step size of this step (ngvi.12)
    beta_t: float     # precision step size of this step (ngvi.12)
    theta: Array      # draws theta_s, (D, S); (D, 0) for "exact"  (ngvi.14)
    G: Array          # per-example gradients g_{s,i}, (S, M, D); (0, M, D) for "exact"  (ngvi.7)
    g_hat: Array      # minibatch gradient estimate, (D,)  (ngvi.8) / (ngvi.11)
    c_hat: Array      # diagonal curvature estimate, (D,)  (ngvi.9)-(ngvi.11), diagonals
    prec_diag: Array  # precision diagonal prec_diag_{t+1}, (D,)  (ngvi.15)
    g_tilde: Array    # g_hat + lam * mu_t, (D,)  (ngvi.16)
    direction: Array  # g_bar bias-corrected + lam * mu_t (ngvi.13); = g_tilde when momentum = 0, (D,)
    Delta_mu: Array   # direction / prec_diag_{t+1}, (D,)  (ngvi.16)
    mu: Array         # mu_{t+1}, (D,)  (ngvi.16)


# ----------------------------------------------------------------------------- checks

def _check_cfg(cfg, D=None, dtype=None):
    if not isinstance(cfg, NGVIConfig):
        raise ValueError(f"cfg: expected an NGVIConfig, got {type(cfg).__name__}")
    N = check_N(cfg.N)
    check_prior(cfg.lam, D, dtype)
    alpha, beta, decay, momentum = check_hyper(cfg.alpha, cfg.beta, cfg.decay, cfg.momentum)
    return N, alpha, beta, decay, momentum, check_curvature(cfg.curvature)


check_at_construction(NGVIConfig, _check_cfg)  # D, dtype unknown: lam's length and dtype later


def _check_mu(mu):
    check_array(mu, "mu", ndim=1)
    check_float(mu, "mu")
    return mu.shape[0]


# ----------------------------------------------------------------------------- full Gaussian

def init_full(mu, Sigma_inv) -> FullState:
    """Create the initial FullState at (mu, Sigma_inv), with g_bar = 0 and t = 0.

    The paper starts at mu = 0, Sigma_inv = I.

    Parameters
    ----------
    mu : array of shape (D,)
        Initial mean.
    Sigma_inv : array of shape (D, D)
        Initial precision, symmetric positive definite, same dtype as mu.

    Returns
    -------
    FullState
        The state (mu, Sigma_inv, zeros, 0).

    Raises
    ------
    ValueError
        If mu is not a finite float 1-d array, Sigma_inv not a finite, symmetric (D, D) array
        of mu's dtype whose Cholesky factorization succeeds, or the arrays mix NumPy and CuPy.
    """
    xp = xp_of(mu, Sigma_inv)
    D = _check_mu(mu)
    check_array(Sigma_inv, "Sigma_inv", shape=(D, D))
    check_same_dtype({"mu": mu, "Sigma_inv": Sigma_inv})
    check_symmetric(Sigma_inv, "Sigma_inv")  # Cholesky reads one triangle (check_spd's rule)
    _chol_precision(Sigma_inv, "Sigma_inv")
    return FullState(mu, Sigma_inv, xp.zeros_like(mu), 0)


def _chol_precision(Sigma_inv, name):
    # inside refbayes.unchecked() the caller vouches for the state: its precision was factored
    # (and checked) by the step that produced it, so CuPy need not read the status back again
    try:
        return cholesky(Sigma_inv, check=value_checks())
    except np.linalg.LinAlgError:
        raise ValueError(f"{name}: expected a symmetric positive-definite precision, "
                         "Cholesky failed") from None


def _check_full_state(state):
    if not isinstance(state, FullState):
        raise ValueError(f"state: expected a FullState, got {type(state).__name__}")
    D = _check_mu(state.mu)
    check_array(state.Sigma_inv, "state.Sigma_inv", shape=(D, D))
    check_array(state.g_bar, "state.g_bar", shape=(D,))
    check_same_dtype({"state.mu": state.mu, "state.Sigma_inv": state.Sigma_inv,
                      "state.g_bar": state.g_bar})
    check_symmetric(state.Sigma_inv, "state.Sigma_inv")
    check_t(state.t)
    return D


def _full_draws(mu, L_P, eps):
    """theta_s = mu + L^{-T} eps_s, L L^T = Sigma_inv, so Cov = L^{-T} L^{-1} = Sigma.  (ngvi.6)"""
    return mu[:, None] + solve_triangular(L_P.T, eps, lower=False)  # (ngvi.6)


def sample_full(state: FullState, eps):
    """Draw theta = mu + L^{-T} eps from the full Gaussian, L L^T = Sigma_inv (lower Cholesky).

    (ngvi.6)

    Parameters
    ----------
    state : FullState
        Current state.
    eps : array of shape (D, S)
        Standard-normal draws from the caller, one column per sample.

    Returns
    -------
    array of shape (D, S)
        The draws theta.

    Raises
    ------
    ValueError
        If state is invalid (see FullState), or eps is not a finite (D, S) array of the state's
        dtype.
    """
    D = _check_full_state(state)
    check_array(eps, "eps", shape=(D, None))
    check_same_dtype({"state.mu": state.mu, "eps": eps})
    return _full_draws(state.mu, _chol_precision(state.Sigma_inv, "state.Sigma_inv"), eps)


def step_full(state: FullState, batch, eps, cfg: NGVIConfig, model) -> tuple[FullState, FullInfo]:
    """Take one natural-gradient step of the full Gaussian.

    (ngvi.4)-(ngvi.13).  Deterministic given its inputs.

    Parameters
    ----------
    state : FullState
        Current state.
    batch : Batch
        The minibatch rows Batch(X_B (M, n_in), y_B (M,)), 1 <= M <= N.
    eps : array of shape (D, S) or None
        Standard-normal draws, one column per MC sample; None for curvature="exact".
    cfg : NGVIConfig
        Hyperparameters.
    model : FlatModel or CNN
        A refbayes.models model with D parameters (an MLP, a linear model or a CNN).

    Returns
    -------
    state : FullState
        The state after the step, t + 1.
    info : FullInfo
        The step's intermediates, by equation.

    Raises
    ------
    ValueError
        If state or cfg is invalid (see FullState, NGVIConfig); if model is not a FlatModel or
        CNN with D parameters or batch does not fit it (see Batch); if eps is not None for "exact", or not a
        finite (D, S >= 1) array of the state's dtype otherwise; if "exact" is used with a model
        that is not linear with one output and a Bernoulli or Gaussian likelihood; or if the arrays
        mix NumPy and CuPy. Also if the new precision is not positive definite (an indefinite
        curvature estimate), or if curvature is "hess" with CuPy arrays and a model whose Hessian
        is autograd's.
    """
    D = _check_full_state(state)
    xp = xp_of(state.mu, state.Sigma_inv)
    dtype = state.mu.dtype
    N, alpha, beta, decay, b, curvature = _check_cfg(cfg, D, dtype)
    check_model(model, D, cnn=True)
    if curvature == "hess":
        check_hessian_backend(model, xp, 'ngvi.step_full: cfg.curvature "hess"', _HESS_ON_CUPY)
    X, y, M = check_batch(batch, model, N, dtype)
    check_eps(eps, D, dtype, curvature)
    mu, lam = state.mu, cfg.lam
    alpha_t, beta_t = step_sizes(state.t, alpha, beta, decay)                     # (ngvi.12)
    L_P = _chol_precision(state.Sigma_inv, "state.Sigma_inv")
    if curvature == "exact":
        Xd, kind, tau = glm_design(model, X)
        Z = solve_triangular(L_P, Xd.T, lower=True)      # v_i = |L^{-1} x~_i|^2 = x~_i^T Sigma x~_i
        g_hat, w = exact_terms(Xd, y, mu, xp.sum(Z * Z, axis=0), kind, tau, N)   # (ngvi.11)
        theta, G = xp.zeros((D, 0), dtype=dtype), xp.zeros((0, M, D), dtype=dtype)
        C_hat = Xd.T @ (Xd * w[:, None])                                          # (ngvi.11)
    else:
        theta = _full_draws(mu, L_P, eps)                                         # (ngvi.6)
        G = per_example_grads(model, theta, X, y)                                 # (ngvi.7)
        g_hat = grad_estimate(G, N)                                               # (ngvi.8)
        C_hat = (ef_estimate(G, N) if curvature == "ef"                           # (ngvi.9)
                 else hess_estimate(model, theta, X, y, N))                       # (ngvi.10)
    Sigma_inv = (1 - beta_t) * state.Sigma_inv + beta_t * (C_hat + xp.diag(lam))  # (ngvi.4)
    try:
        L_new = cholesky(Sigma_inv)
    except np.linalg.LinAlgError:
        raise ValueError(f"step_full: the precision after step {state.t} is not positive "
                         f"definite (curvature={curvature!r} gave an indefinite estimate)") from None
    g_tilde = g_hat + lam * mu                                                    # (ngvi.5)
    g_bar, direction = momentum_direction(state.g_bar, g_hat, lam, mu, b, state.t)  # (ngvi.13)
    Delta_mu = cho_solve(L_new, direction)                                        # (ngvi.5)
    mu_new = mu - alpha_t * Delta_mu                                              # (ngvi.5)
    info = FullInfo(alpha_t, beta_t, theta, G, g_hat, C_hat, Sigma_inv, g_tilde, direction,
                    Delta_mu, mu_new)
    return FullState(mu_new, Sigma_inv, g_bar, state.t + 1), info


def dense_covariance(state: FullState):
    """Form the dense covariance Sigma = Sigma_inv^{-1} through the Cholesky factor.

    Parameters
    ----------
    state : FullState
        The state.

    Returns
    -------
    array of shape (D, D)
        The covariance Sigma.

    Raises
    ------
    ValueError
        If state is invalid (see FullState).
    """
    _check_full_state(state)
    xp = xp_of(state.mu)
    L_P = _chol_precision(state.Sigma_inv, "state.Sigma_inv")
    L_inv = solve_triangular(L_P, xp.eye(L_P.shape[0], dtype=L_P.dtype), lower=True)
    return L_inv.T @ L_inv


# ----------------------------------------------------------------------------- mean field

def init_meanfield(mu, prec_diag) -> MeanFieldState:
    """Create the initial MeanFieldState at (mu, prec_diag), with g_bar = 0 and t = 0.

    The paper starts at mu = 0, prec_diag = 1.

    Parameters
    ----------
    mu : array of shape (D,)
        Initial mean.
    prec_diag : array of shape (D,)
        Initial precision diagonal, > 0, same dtype as mu.

    Returns
    -------
    MeanFieldState
        The state (mu, prec_diag, zeros, 0).

    Raises
    ------
    ValueError
        If mu is not a finite float 1-d array, prec_diag not a finite (D,) array > 0 of mu's
        dtype, or the arrays mix NumPy and CuPy.
    """
    xp = xp_of(mu, prec_diag)
    D = _check_mu(mu)
    check_array(prec_diag, "prec_diag", shape=(D,))
    check_same_dtype({"mu": mu, "prec_diag": prec_diag})
    check_invertible_positive(prec_diag, "prec_diag")  # > 0 with 1 / prec_diag finite
    return MeanFieldState(mu, prec_diag, xp.zeros_like(mu), 0)


def _check_mf_state(state):
    if not isinstance(state, MeanFieldState):
        raise ValueError(f"state: expected a MeanFieldState, got {type(state).__name__}")
    D = _check_mu(state.mu)
    check_array(state.prec_diag, "state.prec_diag", shape=(D,))
    check_array(state.g_bar, "state.g_bar", shape=(D,))
    check_same_dtype({"state.mu": state.mu, "state.prec_diag": state.prec_diag,
                      "state.g_bar": state.g_bar})
    check_invertible_positive(state.prec_diag, "state.prec_diag")
    check_t(state.t)
    return D


def _meanfield_draws(mu, prec_diag, eps):
    """theta_s = mu + eps_s / sqrt(prec_diag).  (ngvi.14)"""
    return mu[:, None] + eps / xp_of(prec_diag).sqrt(prec_diag)[:, None]  # (ngvi.14)


def sample_meanfield(state: MeanFieldState, eps):
    """Draw theta = mu + eps / sqrt(prec_diag) from the mean-field Gaussian.

    (ngvi.14)

    Parameters
    ----------
    state : MeanFieldState
        Current state.
    eps : array of shape (D, S)
        Standard-normal draws from the caller, one column per sample.

    Returns
    -------
    array of shape (D, S)
        The draws theta.

    Raises
    ------
    ValueError
        If state is invalid (see MeanFieldState); if eps is not a finite (D, S) array of the
        state's dtype; or if the arrays mix NumPy and CuPy.
    """
    D = _check_mf_state(state)
    check_array(eps, "eps", shape=(D, None))
    check_same_dtype({"state.mu": state.mu, "eps": eps})
    xp_of(state.mu, eps)  # one backend
    return _meanfield_draws(state.mu, state.prec_diag, eps)  # (ngvi.14)


def step_meanfield(state: MeanFieldState, batch, eps, cfg: NGVIConfig,
                   model) -> tuple[MeanFieldState, MeanFieldInfo]:
    """Take one natural-gradient step of the mean-field Gaussian.

    (ngvi.7)-(ngvi.11) diagonals, (ngvi.12)-(ngvi.16).  Deterministic given its inputs.

    Parameters
    ----------
    state : MeanFieldState
        Current state.
    batch : Batch
        The minibatch rows Batch(X_B (M, n_in), y_B (M,)), 1 <= M <= N.
    eps : array of shape (D, S) or None
        Standard-normal draws, one column per MC sample; None for curvature="exact".
    cfg : NGVIConfig
        Hyperparameters.
    model : FlatModel or CNN
        A refbayes.models model with D parameters (an MLP, a linear model or a CNN).

    Returns
    -------
    state : MeanFieldState
        The state after the step, t + 1.
    info : MeanFieldInfo
        The step's intermediates, by equation.

    Raises
    ------
    ValueError
        If state or cfg is invalid (see MeanFieldState, NGVIConfig); if model, batch or eps is
        invalid, as for ``step_full``; if the new precision diagonal has an entry <= 0, or if
        curvature is "hess" with CuPy arrays and a model whose Hessian is autograd's.
    """
    D = _check_mf_state(state)
    xp = xp_of(state.mu, state.prec_diag)
    dtype = state.mu.dtype
    N, alpha, beta, decay, b, curvature = _check_cfg(cfg, D, dtype)
    check_model(model, D, cnn=True)
    if curvature == "hess":
        check_hessian_backend(model, xp, 'ngvi.step_meanfield: cfg.curvature "hess"',
                              _HESS_ON_CUPY)
    X, y, M = check_batch(batch, model, N, dtype)
    check_eps(eps, D, dtype, curvature)
    mu, lam = state.mu, cfg.lam
    alpha_t, beta_t = step_sizes(state.t, alpha, beta, decay)                     # (ngvi.12)
    if curvature == "exact":
        Xd, kind, tau = glm_design(model, X)
        v = (Xd * Xd) @ (1 / state.prec_diag)                 # x~_i^T diag(1/prec_diag) x~_i
        g_hat, w = exact_terms(Xd, y, mu, v, kind, tau, N)                        # (ngvi.11)
        theta, G = xp.zeros((D, 0), dtype=dtype), xp.zeros((0, M, D), dtype=dtype)
        c_hat = (Xd * Xd).T @ w                                                   # (ngvi.11)
    else:
        theta = _meanfield_draws(mu, state.prec_diag, eps)                        # (ngvi.14)
        G = per_example_grads(model, theta, X, y)                                 # (ngvi.7)
        g_hat = grad_estimate(G, N)                                               # (ngvi.8)
        c_hat = (ef_diag_estimate(G, N) if curvature == "ef"                      # (ngvi.9)
                 else hess_diag_estimate(model, theta, X, y, N))                  # (ngvi.10)
    prec_diag = (1 - beta_t) * state.prec_diag + beta_t * (c_hat + lam)           # (ngvi.15)
    if not bool(xp.all(prec_diag > 0)):
        raise ValueError(f"step_meanfield: the precision after step {state.t} has entries "
                         f"<= 0 (curvature={curvature!r} gave a negative diagonal)")
    g_tilde = g_hat + lam * mu                                                    # (ngvi.16)
    g_bar, direction = momentum_direction(state.g_bar, g_hat, lam, mu, b, state.t)  # (ngvi.13)
    Delta_mu = direction / prec_diag                                              # (ngvi.16)
    mu_new = mu - alpha_t * Delta_mu                                              # (ngvi.16)
    info = MeanFieldInfo(alpha_t, beta_t, theta, G, g_hat, c_hat, prec_diag, g_tilde, direction,
                         Delta_mu, mu_new)
    return MeanFieldState(mu_new, prec_diag, g_bar, state.t + 1), info


def dense_covariance_meanfield(state: MeanFieldState):
    """Form the dense covariance diag(1 / prec_diag), for tests.

    Parameters
    ----------
    state : MeanFieldState
        The state.

    Returns
    -------
    array of shape (D, D)
        The covariance.

    Raises
    ------
    ValueError
        If state is invalid (see MeanFieldState).
    """
    _check_mf_state(state)
    return xp_of(state.mu).diag(1 / state.prec_diag)
