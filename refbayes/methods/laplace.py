"""Laplace approximation at a MAP estimate (MacKay 1992; Daxberger et al. 2021, "Laplace Redux",
with the conventions of the laplace-torch library).

Implements (laplace.1)-(laplace.9) of derivations/laplace.md.

Symbols (derivations/notation.md): theta (D,) flat parameters; mu = theta* the MAP estimate,
the mean of q; delta (D,) prior precision, p(theta) = N(0, diag(delta)^{-1}) (``prior_precision``:
a scalar, a (D,) array, or per parameter tensor through ``expand_prior_precision``); H the
curvature of the SUMMED negative log-likelihood sum_i l_i at mu ("hessian", "ggn" = sum_i
J_i^T H_i J_i, "ef" = sum_i g_i g_i^T); Sigma_inv (D, D) the dense posterior precision
H + diag(delta) (structure "full"); prec_diag (D,) its diagonal counterpart diag(H) + delta
(structure "diag"); J(x) (K, D) the output Jacobian at mu; noise_precision the Gaussian
likelihood's 1 / sigma_noise^2.

Scaling: the curvature is of the summed loss over all N rows passed to ``fit`` (no N / M factor:
the Laplace approximation uses the full training set); delta enters unscaled. No tempering
(laplace-torch's temperature = 1; see derivations/laplace.md, Conventions).

q(theta) = N(mu, Sigma_inv^{-1}) or N(mu, diag(1 / prec_diag)) (laplace.3), (laplace.4):
    Sigma_inv = H + diag(delta)                                               (laplace.3)
    theta_s   = mu + L^{-T} eps_s, L L^T = Sigma_inv  /  mu + eps_s / sqrt(prec_diag)  (laplace.4)
    log Z     = log p(D | mu) + log p(mu) + (D / 2) log 2 pi - (1 / 2) log det Sigma_inv (laplace.5)
    f(x*)     ~ N(f(x*, mu), J Sigma J^T);  y* ~ N(f(x*, mu), J Sigma J^T + I / noise_precision)
                                                                              (laplace.7)

Randomness: nothing is drawn here; eps (D, S) comes from the caller.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, NamedTuple

from refbayes._checks import (
    check_array,
    check_float,
    check_in_range,
    check_invertible_positive,
    check_positive,
    check_same_dtype,
    check_spd,
    check_symmetric,
)
from refbayes.backend import linalg_of, xp_of
from refbayes.methods._estimates import check_model
from refbayes.models.base import FlatModel
from refbayes.models.likelihoods import Gaussian

__all__ = [
    "CURVATURES",
    "STRUCTURES",
    "GLMPredictive",
    "LaplaceConfig",
    "LaplaceState",
    "dense_covariance",
    "dense_precision",
    "expand_prior_precision",
    "fit",
    "glm_predictive",
    "log_marginal_likelihood",
    "sample",
]

Array = Any

CURVATURES = ("hessian", "ggn", "ef")
STRUCTURES = ("full", "diag")


class LaplaceConfig(NamedTuple):
    """Laplace approximation hyperparameters.

    Defaults follow laplace-torch: prior_precision = 1.0 and the GGN curvature (its default
    backend for full and diagonal structures); structure defaults to "full" (laplace-torch's
    default "kron" is not implemented here).

    Attributes
    ----------
    prior_precision : float or array of shape (D,)
        Prior precision delta > 0 of p(theta) = N(0, diag(delta)^{-1}): a scalar, or one entry
        per parameter (``expand_prior_precision`` builds it from per-tensor values).
        (laplace.1), (laplace.3)
    structure : {"full", "diag"}
        Dense precision Sigma_inv (D, D) or its diagonal prec_diag (D,).  (laplace.3)
    curvature : {"hessian", "ggn", "ef"}
        The curvature H of the summed negative log-likelihood at the MAP: the Hessian, the
        generalized Gauss-Newton sum_i J_i^T H_i J_i, or the empirical Fisher sum_i g_i g_i^T.
        (laplace.2)
    """
    prior_precision: Any = 1.0   # delta: float > 0 or (D,) array > 0 (laplace.1), (laplace.3)
    structure: str = "full"      # "full" Sigma_inv (D, D) or "diag" prec_diag (D,) (laplace.3)
    curvature: str = "ggn"       # "hessian", "ggn" or "ef" (laplace.2)


class LaplaceState(NamedTuple):
    """The Laplace posterior q(theta) = N(mu, precision^{-1}).

    Exactly one of Sigma_inv (structure "full") and prec_diag (structure "diag") is an array;
    the other is None.

    Attributes
    ----------
    mu : array of shape (D,)
        Mean, the MAP estimate theta*.  (laplace.1)
    Sigma_inv : array of shape (D, D) or None
        Dense precision H + diag(delta) (structure "full"), else None.  (laplace.3)
    prec_diag : array of shape (D,) or None
        Diagonal precision diag(H) + delta (structure "diag"), else None.  (laplace.3)
    prior_prec : array of shape (D,)
        The prior precision delta inside the precision, per parameter.  (laplace.1)
    """
    mu: Array          # theta*, (D,) (laplace.1)
    Sigma_inv: Array   # H + diag(delta), (D, D), or None for "diag" (laplace.3)
    prec_diag: Array   # diag(H) + delta, (D,), or None for "full" (laplace.3)
    prior_prec: Array  # delta, (D,) (laplace.1)


class GLMPredictive(NamedTuple):
    """The linearized (GLM) predictive of a Gaussian-likelihood model at M test inputs.

    Attributes
    ----------
    f_mean : array of shape (M, K)
        Predictive mean f(x*, mu).  (laplace.7)
    f_var : array of shape (M, K, K)
        Covariance of the linearized outputs, J(x*) Sigma J(x*)^T.  (laplace.7)
    y_var : array of shape (M, K, K)
        Covariance of y*, f_var + I_K / noise_precision.  (laplace.7)
    """
    f_mean: Array  # f(x*, mu), (M, K) (laplace.7)
    f_var: Array   # J Sigma J^T, (M, K, K) (laplace.7)
    y_var: Array   # f_var + I / noise_precision, (M, K, K) (laplace.7)


# ----------------------------------------------------------------------------- checks

def _check_cfg(cfg, D: int, dtype, xp):
    """Validate cfg; return (structure, curvature, delta (D,) in dtype).  (laplace.1)"""
    if not isinstance(cfg, LaplaceConfig):
        raise ValueError(f"cfg: expected a LaplaceConfig, got {type(cfg).__name__}")
    delta = cfg.prior_precision
    if not isinstance(delta, numbers.Real):  # an array (a Python or NumPy scalar goes below)
        check_array(delta, "cfg.prior_precision", shape=(D,))
        check_float(delta, "cfg.prior_precision")
        if delta.dtype != dtype:
            raise ValueError(f"cfg.prior_precision: expected dtype {dtype} (theta's), "
                             f"got {delta.dtype}")
        check_positive(delta, "cfg.prior_precision")
        if xp_of(delta) is not xp:
            raise ValueError("cfg.prior_precision: expected an array on theta's backend, "
                             "got NumPy and CuPy mixed")
    else:
        value = check_in_range(delta, "cfg.prior_precision", 0.0, math.inf,
                               low_open=True, high_open=True)
        delta = xp.full(D, value, dtype=dtype)  # (laplace.1)
    if cfg.structure not in STRUCTURES:
        raise ValueError(f"cfg.structure: expected one of {STRUCTURES}, got {cfg.structure!r}")
    if cfg.curvature not in CURVATURES:
        raise ValueError(f"cfg.curvature: expected one of {CURVATURES}, got {cfg.curvature!r}")
    return cfg.structure, cfg.curvature, delta


def _check_state(state):
    """A LaplaceState of finite float arrays of one dtype and one structure; returns (D, xp)."""
    if not isinstance(state, LaplaceState):
        raise ValueError(f"state: expected a LaplaceState, got {type(state).__name__}")
    check_array(state.mu, "state.mu", ndim=1)
    check_float(state.mu, "state.mu")
    D = state.mu.shape[0]
    if (state.Sigma_inv is None) == (state.prec_diag is None):
        raise ValueError("state.Sigma_inv, state.prec_diag: expected exactly one of them to be an "
                         "array (structure 'full' or 'diag'), got "
                         f"{'both' if state.Sigma_inv is not None else 'neither'}")
    check_array(state.prior_prec, "state.prior_prec", shape=(D,))
    check_positive(state.prior_prec, "state.prior_prec")
    arrays = {"state.mu": state.mu, "state.prior_prec": state.prior_prec}
    if state.Sigma_inv is not None:
        check_array(state.Sigma_inv, "state.Sigma_inv", shape=(D, D))
        check_symmetric(state.Sigma_inv, "state.Sigma_inv")
        arrays["state.Sigma_inv"] = state.Sigma_inv
    else:
        check_array(state.prec_diag, "state.prec_diag", shape=(D,))
        check_invertible_positive(state.prec_diag, "state.prec_diag")
        arrays["state.prec_diag"] = state.prec_diag
    check_same_dtype(arrays)
    return D, xp_of(*arrays.values())


def _structure(state) -> str:
    return "full" if state.Sigma_inv is not None else "diag"


def _chol(state):
    """Lower Cholesky factor L of state.Sigma_inv (L L^T = Sigma_inv), or ValueError."""
    return check_spd(state.Sigma_inv, "state.Sigma_inv")


# ----------------------------------------------------------------------------- prior

def expand_prior_precision(model, values):
    """Expand one prior precision per parameter tensor to one per parameter.

    laplace-torch's "layerwise" prior precision.

    The tensors in theta order are W_1, b_1, W_2, b_2, ..., W_L, b_L (no b_l without a bias),
    the order of laplace-torch's ``model.parameters()`` for an ``nn.Sequential`` of ``Linear``
    layers; every entry of tensor t gets values[t].  (laplace.9)

    Parameters
    ----------
    model : FlatModel
        A refbayes.models model.
    values : array of shape (T,)
        Prior precisions > 0, T = 2 L with biases, L without.

    Returns
    -------
    array of shape (D,)
        The per-parameter prior precision delta, in values' dtype and backend.

    Raises
    ------
    ValueError
        If model is not a FlatModel, or values is not a finite float (T,) array > 0.
    """
    if not isinstance(model, FlatModel):
        raise ValueError(f"model: expected a refbayes.models model, got {type(model).__name__}")
    sizes = []
    for n_in, n_out in zip(model.sizes[:-1], model.sizes[1:]):
        sizes.append(n_in * n_out)
        if model.bias:
            sizes.append(n_out)
    check_array(values, "values", shape=(len(sizes),))
    check_float(values, "values")
    check_positive(values, "values")
    return xp_of(values).repeat(values, sizes)  # (laplace.9)


# ----------------------------------------------------------------------------- fit

def _curvature(model, theta, X, y, structure: str, curvature: str):
    """H or diag(H) of sum_i l_i at theta.  (laplace.2)"""
    xp = xp_of(theta)
    if curvature == "ggn":
        if structure == "full":
            return model.ggn(theta, X, y)  # (laplace.2)
        return model.diag_ggn(theta, X, y)  # (laplace.2)
    if curvature == "ef":
        if structure == "full":
            G = model.per_example_grads(theta, X, y)
            return G.T @ G  # (laplace.2)
        return model.diag_ef(theta, X, y)  # (laplace.2)
    H = model.hessian(theta, X, y)  # (laplace.2)
    return H if structure == "full" else xp.diagonal(H).copy()  # (laplace.2)


def fit(model, theta_map, X, y, cfg: LaplaceConfig) -> LaplaceState:
    """Fit the Laplace approximation N(theta_map, (H + diag(delta))^{-1}) at a MAP estimate.

    H is the curvature of the summed negative log-likelihood sum_i l_i over all rows of (X, y) at
    theta_map (laplace.2), delta the prior precision (laplace.1); Sigma_inv = H + diag(delta) for
    structure "full", prec_diag = diag(H) + delta for "diag" (laplace.3).  theta_map is taken as
    given: the approximation is a Laplace approximation only where theta_map minimises
    sum_i l_i + (1/2) theta^T diag(delta) theta (no check is made).

    Parameters
    ----------
    model : FlatModel
        A refbayes.models model with D parameters (curvature "hessian" needs NumPy arrays).
    theta_map : array of shape (D,)
        The MAP estimate theta*, float64 or float32.
    X : array of shape (N, n_in)
        All training inputs, in theta_map's dtype.
    y : array of shape (N,) or (N, n_out)
        All training targets.
    cfg : LaplaceConfig
        Prior precision, structure and curvature.

    Returns
    -------
    LaplaceState
        The state (theta_map, Sigma_inv or None, prec_diag or None, delta).

    Raises
    ------
    ValueError
        If theta_map is not a finite float (D,) array; if model is not a FlatModel with D
        parameters; if cfg is not a LaplaceConfig with prior_precision a finite float > 0 or a
        finite (D,) array > 0 in theta_map's dtype, structure in STRUCTURES and curvature in
        CURVATURES; if X, y do not fit the model (see ``FlatModel.ggn``); or if the precision
        is not positive definite (an indefinite Hessian away from a minimum; for "diag", an
        entry below the smallest normal float).
    """
    check_array(theta_map, "theta_map", ndim=1)
    check_float(theta_map, "theta_map")
    D = theta_map.shape[0]
    xp = xp_of(theta_map)
    structure, curvature, delta = _check_cfg(cfg, D, theta_map.dtype, xp)
    check_model(model, D)
    H = _curvature(model, theta_map, X, y, structure, curvature)  # (laplace.2)
    if structure == "full":
        Sigma_inv = H + xp.diag(delta)  # (laplace.3)
        Sigma_inv = 0.5 * (Sigma_inv + Sigma_inv.T)  # exact symmetry for the Cholesky routines
        check_spd(Sigma_inv, "Sigma_inv")
        return LaplaceState(theta_map, Sigma_inv, None, delta)
    prec_diag = H + delta  # (laplace.3)
    check_invertible_positive(prec_diag, "prec_diag")
    return LaplaceState(theta_map, None, prec_diag, delta)


# ----------------------------------------------------------------------------- the Gaussian

def sample(state: LaplaceState, eps):
    """Draw theta_s = mu + L^{-T} eps_s (full, L L^T = Sigma_inv) or mu + eps_s / sqrt(prec_diag).

    (laplace.4)  A linear map of eps: with eps the identity, the columns minus mu form a square
    root of the covariance.

    Parameters
    ----------
    state : LaplaceState
        The Laplace posterior.
    eps : array of shape (D, S)
        Standard-normal draws from the caller, one column per sample, in the state's dtype.

    Returns
    -------
    array of shape (D, S)
        The draws theta.

    Raises
    ------
    ValueError
        If state is not a valid LaplaceState (finite float arrays of one dtype, exactly one of
        Sigma_inv (D, D) symmetric positive definite and prec_diag (D,) > 0, prior_prec (D,)
        > 0), or eps is not a finite (D, S) array of the state's dtype.
    """
    D, xp = _check_state(state)
    check_array(eps, "eps", shape=(D, None))
    check_same_dtype({"state.mu": state.mu, "eps": eps})
    if xp_of(eps) is not xp:
        raise ValueError("eps: expected an array on the state's backend, got NumPy and CuPy mixed")
    if _structure(state) == "full":
        L = _chol(state)
        sla = linalg_of(xp)
        return state.mu[:, None] + sla.solve_triangular(L.T, eps, lower=False)  # (laplace.4)
    return state.mu[:, None] + eps / xp.sqrt(state.prec_diag)[:, None]  # (laplace.4)


def dense_precision(state: LaplaceState):
    """Form the dense precision: Sigma_inv, or diag(prec_diag).

    (laplace.3)

    Parameters
    ----------
    state : LaplaceState
        The Laplace posterior.

    Returns
    -------
    array of shape (D, D)
        The precision.

    Raises
    ------
    ValueError
        If state is not a valid LaplaceState (see ``sample``).
    """
    _, xp = _check_state(state)
    if _structure(state) == "full":
        return state.Sigma_inv.copy()
    return xp.diag(state.prec_diag)


def dense_covariance(state: LaplaceState):
    """Form the dense covariance: Sigma_inv^{-1} by its Cholesky factor, or diag(1 / prec_diag).

    (laplace.3)

    Parameters
    ----------
    state : LaplaceState
        The Laplace posterior.

    Returns
    -------
    array of shape (D, D)
        The covariance Sigma.

    Raises
    ------
    ValueError
        If state is not a valid LaplaceState (see ``sample``).
    """
    D, xp = _check_state(state)
    if _structure(state) == "full":
        L = _chol(state)
        L_inv = linalg_of(xp).solve_triangular(L, xp.eye(D, dtype=L.dtype), lower=True)
        return L_inv.T @ L_inv  # (laplace.3)
    return xp.diag(1.0 / state.prec_diag)  # (laplace.3)


def _logdet_precision(state):
    """log det of the precision: 2 sum log diag(L), or sum log prec_diag."""
    xp = xp_of(state.mu)
    if _structure(state) == "full":
        return 2.0 * xp.sum(xp.log(xp.diagonal(_chol(state))))
    return xp.sum(xp.log(state.prec_diag))


# ----------------------------------------------------------------------------- evidence

def log_marginal_likelihood(model, state: LaplaceState, X, y, cfg: LaplaceConfig) -> float:
    """Compute the Laplace estimate of the log evidence log p(D).

    log Z = log p(D | mu) + log p(mu) + (D / 2) log 2 pi - (1 / 2) log det P (laplace.5), with
    log p(D | mu) = -sum_i l_i(mu), p = N(0, diag(delta)^{-1}) and P the state's precision;
    equal to laplace-torch's log_likelihood - (1 / 2)(log det P - log det diag(delta) +
    mu^T diag(delta) mu) (laplace.6).  Exact for Bayesian linear regression with the Hessian or
    GGN (laplace.8).

    Parameters
    ----------
    model : FlatModel
        The model the state was fit with.
    state : LaplaceState
        The Laplace posterior from ``fit``.
    X : array of shape (N, n_in)
        The training inputs the state was fit on.
    y : array of shape (N,) or (N, n_out)
        The training targets.
    cfg : LaplaceConfig
        The config the state was fit with (its prior precision and structure must match the
        state's; refit to evaluate another prior precision).

    Returns
    -------
    float
        The log marginal likelihood estimate, in nats.

    Raises
    ------
    ValueError
        If state is not a valid LaplaceState (see ``sample``); if cfg is not a valid
        LaplaceConfig (see ``fit``), its structure differs from the state's or its prior
        precision from state.prior_prec; if model is not a FlatModel with D parameters; or if
        X, y do not fit the model.
    """
    D, xp = _check_state(state)
    structure, _, delta = _check_cfg(cfg, D, state.mu.dtype, xp)
    if structure != _structure(state):
        raise ValueError(f"cfg.structure: expected {_structure(state)!r} (the state's), "
                         f"got {structure!r}")
    if not bool(xp.all(delta == state.prior_prec)):
        raise ValueError("cfg.prior_precision: expected the prior precision the state was fit "
                         "with (state.prior_prec); refit to evaluate another one")
    check_model(model, D)
    mu = state.mu
    log_lik = -model.loss(mu, X, y)  # (laplace.5)
    log_prior = 0.5 * (xp.sum(xp.log(delta)) - D * math.log(2.0 * math.pi)
                       - xp.sum(delta * mu * mu))  # (laplace.1)
    logdet = _logdet_precision(state)
    lml = log_lik + log_prior + 0.5 * D * math.log(2.0 * math.pi) - 0.5 * logdet  # (laplace.5)
    return float(lml)


# ----------------------------------------------------------------------------- predictive

def _functional_covariance(state, J):
    """J Sigma J^T per test point, for J (M, K, D) the output Jacobians at mu.  (laplace.7)

    Full: V = L^{-1} J^T (L L^T = Sigma_inv), J Sigma J^T = V^T V; diag: J diag(1/prec_diag) J^T.
    """
    xp = xp_of(state.mu)
    M, K, D = J.shape
    if _structure(state) == "full":
        L = _chol(state)
        V = linalg_of(xp).solve_triangular(L, J.reshape(M * K, D).T, lower=True)  # L^{-1} J^T
        V = V.reshape(D, M, K)
        return xp.einsum("dmk,dml->mkl", V, V)  # (laplace.7)
    return xp.einsum("mkd,mld->mkl", J / state.prec_diag, J)  # (laplace.7)


def glm_predictive(model, state: LaplaceState, X_star) -> GLMPredictive:
    """Compute the linearized (GLM) predictive of a Gaussian-likelihood model in closed form.

    f_lin(x, theta) = f(x, mu) + J(x)(theta - mu) under q gives f* ~ N(f(x*, mu),
    J Sigma J^T) and y* ~ N(f(x*, mu), J Sigma J^T + I / noise_precision), J = J(x*) at mu
    (laplace.7).

    Parameters
    ----------
    model : FlatModel
        A model with a Gaussian likelihood and D parameters.
    state : LaplaceState
        The Laplace posterior.
    X_star : array of shape (M, n_in)
        Test inputs, in the state's dtype.

    Returns
    -------
    GLMPredictive
        The mean f_mean (M, K) and the covariances f_var, y_var (M, K, K).

    Raises
    ------
    ValueError
        If state is not a valid LaplaceState (see ``sample``); if model is not a FlatModel
        with D parameters and a Gaussian likelihood; or if X_star is not a finite float
        (M, n_in) array with M >= 1 in the state's dtype.
    """
    D, xp = _check_state(state)
    check_model(model, D)
    if not isinstance(model.likelihood, Gaussian):
        raise ValueError("model: expected a Gaussian likelihood for the closed-form GLM "
                         f"predictive, got {model.likelihood.name!r}")
    check_array(X_star, "X_star", shape=(None, model.sizes[0]))
    if X_star.shape[0] < 1:
        raise ValueError(f"X_star: expected at least one row, got shape {tuple(X_star.shape)}")
    check_same_dtype({"state.mu": state.mu, "X_star": X_star})
    f_mean = model.forward(state.mu, X_star)  # (laplace.7)
    J = model.jacobian(state.mu, X_star)  # (M, K, D)
    f_var = _functional_covariance(state, J)  # (laplace.7)
    K = J.shape[1]
    eye = xp.eye(K, dtype=f_var.dtype) / model.likelihood.noise_precision
    y_var = f_var + eye[None]  # (laplace.7)
    return GLMPredictive(f_mean, f_var, y_var)
