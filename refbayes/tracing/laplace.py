"""Traces of the Laplace methods at one MAP: laplace and riemannian-laplace.

One fit on the shipped 1-d regression (``problems.regression_problem``) at its deterministic MAP
(``problems.find_map``); the recipe, the draws and the traced quantities are in
``derivations/tracing.md``.
"""
from __future__ import annotations

import math
import warnings
from typing import Any, NamedTuple

import numpy as np
import scipy.linalg

from refbayes._checks import check_in_range, check_int
from refbayes.linalg import kron
from refbayes.methods import laplace, riemannian_laplace
from refbayes.tracing.chain import arrays_of, fit_arrays
from refbayes.tracing.problems import MAP_GTOL, MAPResult, regression_problem, shipped_map
from refbayes.tracing.tracer import Tracer, one_of, register

__all__ = ["LAPLACE_METHODS", "LaplaceInfo", "LaplaceTraceInputs", "RiemannianLaplaceInfo",
           "make_laplace_inputs", "trace_laplace"]

LAPLACE_METHODS = ("laplace", "riemannian-laplace")
LA_STRUCTURES = ("full", "diag", "kron")
# The smallest rtol riemannian_laplace accepts (below it solve_ivp raises rtol silently).
RTOL_MIN = 100 * float(np.finfo(np.float64).eps)


class LaplaceInfo(NamedTuple):
    """The named intermediates of ``refbayes trace laplace``, in the trace's output order.

    For structure "diag" H and the precision are diagonals (D,); for "kron" they are the dense
    blockdiag_l(A_l kron B_l) and its sum with diag(delta) (laplace.18).
    """
    H: Any              # curvature of sum_i l_i at theta*, (D, D) or (D,)  (laplace.2)
    precision: Any      # Sigma_inv (D, D) or prec_diag (D,)  (laplace.3)
    theta_s: Any        # mu + L^{-T} eps_s or mu + eps_s / sqrt(prec_diag), (D, S)  (laplace.4)
    log_lik: Any        # log p(D | theta*) = -sum_i l_i(theta*), ()  (laplace.5)
    log_prior: Any      # log p(theta*), ()  (laplace.5)
    log_det: Any        # log det of the precision, ()  (laplace.5)
    log_Z: Any          # log marginal likelihood, ()  (laplace.5)
    log_det_ratio: Any  # log det precision - sum_j log delta_j, ()  (laplace.6)
    scatter: Any        # theta*^T diag(delta) theta*, ()  (laplace.6)
    f_mean: Any         # f(x*, theta*), (M*, K)  (laplace.7)
    f_var: Any          # J Sigma J^T, (M*, K, K)  (laplace.7)
    y_var: Any          # f_var + I / noise_precision, (M*, K, K)  (laplace.7)


class RiemannianLaplaceInfo(NamedTuple):
    """The named intermediates of ``refbayes trace riemannian-laplace``, in output order.

    g vanishes in exact arithmetic (the MAP is stationary): it is compared by its absolute error
    against MAP_GTOL. speed_1 equals speed_0 up to the solver's error.
    """
    precision: Any  # Sigma_inv (D, D) or prec_diag (D,)  (laplace.3)
    theta_s: Any    # Laplace samples, (D, S)  (laplace.4)
    V: Any          # v_s = theta_map - theta_s, (D, S)  (riemannian_laplace.10)
    g: Any          # grad L(theta_map), (D,)  (riemannian_laplace.1)
    c: Any          # c_s(1) = Exp_{theta_map}(v_s), (D, S)  (riemannian_laplace.9)
    cdot: Any       # c_s'(1), (D, S)  (riemannian_laplace.8)
    nfev: Any       # solve_ivp right-hand-side evaluations, (S,)  (riemannian_laplace.8)
    n_steps: Any    # solve_ivp accepted steps, (S,)  (riemannian_laplace.8)
    speed_0: Any    # v_s^T M(theta_map) v_s, (S,)  (riemannian_laplace.2)
    speed_1: Any    # c'^T M(c) c' at t = 1, (S,)  (riemannian_laplace.11)


class LaplaceTraceInputs(NamedTuple):
    """Everything one Laplace (or Riemannian Laplace) trace consumes, and how it was drawn.

    Attributes
    ----------
    method : str
        "laplace" or "riemannian-laplace".
    seed : int
        Seed of numpy.random.default_rng, the only source of eps.
    model : MLP
        ``MLP([1, 4, 1], activation="tanh", likelihood="gaussian", noise_precision=16.0)``.
    X : numpy.ndarray of shape (N, 1)
        The shipped training inputs.
    y : numpy.ndarray of shape (N,)
        The shipped training targets.
    X_star : numpy.ndarray of shape (M*, 1)
        Test inputs of the GLM predictive.
    map : MAPResult
        The MAP and its report.
    eps : numpy.ndarray of shape (D_q, S)
        Standard-normal draws, one row per random parameter (D_q = D for subset "all").
    cfg : LaplaceConfig
        Prior precision, structure and curvature.
    ode : RiemannianLaplaceConfig or None
        Solver settings (riemannian-laplace), else None.
    """
    method: str
    seed: int
    model: Any
    X: np.ndarray
    y: np.ndarray
    X_star: np.ndarray
    map: MAPResult
    eps: np.ndarray
    cfg: Any
    ode: Any

    @property
    def delta(self) -> np.ndarray:
        """The prior precision per parameter, (D,): the MAP's and L's prior on all of theta."""
        return np.full(self.model.D, float(self.cfg.prior_precision))


def make_laplace_inputs(method: str, *, seed: int = 0, S: int = 2, prior_precision: float = 1.0,
                        structure: str = "full", curvature: str = "ggn", ode_method: str = "RK45",
                        rtol: float = 1e-6, atol: float = 1e-3,
                        subset: str = "all") -> LaplaceTraceInputs:
    """Build the problem, the MAP, the config and the draws of a Laplace trace.

    The order and recipes are those of ``derivations/tracing.md``; the MAP depends on
    prior_precision only, never on seed.

    Parameters
    ----------
    method : {"laplace", "riemannian-laplace"}
        The traced method.
    seed : int, default 0
        Seed of ``numpy.random.default_rng``; eps = rng.standard_normal((D, S)).
    S : int, default 2
        Number of draws (samples, velocities), >= 1.
    prior_precision : float, default 1.0
        The prior precision delta > 0, the same for every parameter.
    structure : {"full", "diag", "kron"}, default "full"
        Precision structure of the Laplace approximation.
    curvature : {"ggn", "hessian", "ef"}, default "ggn"
        Curvature H of the Laplace precision (laplace-torch's default GGN).
    ode_method : {"RK45", "RK23", "DOP853"}, default "RK45"
        ``solve_ivp`` method (riemannian-laplace only).
    rtol : float, default 1e-6
        Relative tolerance of the solve (riemannian-laplace only).
    atol : float, default 1e-3
        Absolute tolerance of the solve (riemannian-laplace only).
    subset : {"all", "last_layer"}, default "all"
        The random parameters: all D, or the last layer's D_q (laplace.23).

    Returns
    -------
    LaplaceTraceInputs
        The problem, test inputs, MAP, draws and configs.

    Raises
    ------
    ValueError
        If method is not a Laplace method, seed < 0, S < 1, prior_precision not a finite
        value > 0, structure, curvature, subset or ode_method not one of the names above, rtol
        not in [100 eps, 1) or atol not in [0, inf), or the MAP recipe does not reach MAP_GTOL.
    """
    if method not in LAPLACE_METHODS:
        raise ValueError(f"method: expected one of {', '.join(LAPLACE_METHODS)}, got {method!r}")
    seed = check_int(seed, "seed", low=0)
    S = check_int(S, "S", low=1)
    prior_precision = check_in_range(prior_precision, "prior_precision", 0.0, math.inf,
                                     low_open=True, high_open=True)
    structure = one_of(structure, "structure", LA_STRUCTURES, method)
    curvature = one_of(curvature, "curvature", ("ggn", "hessian", "ef"), method)
    subset = one_of(subset, "subset", laplace.SUBSETS, method)
    cfg = laplace.LaplaceConfig(prior_precision=prior_precision, structure=structure,
                                curvature=curvature, subset=subset)
    ode = None
    if method == "riemannian-laplace":
        ode_method = one_of(ode_method, "ode_method", riemannian_laplace.METHODS, method)
        rtol = check_in_range(rtol, "rtol", RTOL_MIN, 1.0, high_open=True)
        atol = check_in_range(atol, "atol", 0.0, math.inf, high_open=True)
        ode = riemannian_laplace.RiemannianLaplaceConfig(ode_method, rtol, atol)
    model, X, y, X_star = regression_problem()
    found = shipped_map(prior_precision)
    D_q = model.last_layer(found.theta_map, X)[0].D if subset == "last_layer" else model.D
    eps = np.random.default_rng(seed).standard_normal((D_q, S))
    return LaplaceTraceInputs(method, seed, model, X, y, X_star, found, eps, cfg, ode)


def _dense_curvature(H):
    """H as traced: the array laplace.curvature returns, or for "kron" the dense block-diagonal
    blockdiag_l(A_l kron B_l) (laplace.18)."""
    if not isinstance(H, tuple):
        return H
    return scipy.linalg.block_diag(*[kron.dense(A, B) for A, B in H])


def _precision(state):
    if state.kron is not None:
        return laplace.dense_precision(state)  # (laplace.18)
    return state.Sigma_inv if state.Sigma_inv is not None else state.prec_diag


def _log_det(precision) -> float:
    if precision.ndim == 2:
        return float(2.0 * np.sum(np.log(np.diagonal(np.linalg.cholesky(precision)))))
    return float(np.sum(np.log(precision)))


def trace_laplace(inputs: LaplaceTraceInputs):
    """Compute every named intermediate of a Laplace trace by direct library calls.

    laplace: ``laplace.fit``, ``sample``, ``log_marginal_likelihood``, ``glm_predictive``;
    riemannian-laplace: the same fit and samples, then ``riemannian_laplace.velocities``,
    ``sample`` and ``squared_speed`` with L the negative log joint.

    Parameters
    ----------
    inputs : LaplaceTraceInputs
        From ``make_laplace_inputs``.

    Returns
    -------
    LaplaceInfo or RiemannianLaplaceInfo
        The intermediates, in the trace's output order.

    Raises
    ------
    ValueError
        If the library rejects the inputs (e.g. an indefinite precision).
    RuntimeError
        If a geodesic solve stops before t = 1.
    """
    model, X, y, cfg = inputs.model, inputs.X, inputs.y, inputs.cfg
    theta_map, delta = inputs.map.theta_map, inputs.delta
    state = laplace.fit(model, theta_map, X, y, cfg)  # (laplace.2), (laplace.3)
    precision = _precision(state)
    theta_s = laplace.sample(state, inputs.eps)  # (laplace.4)
    if inputs.method == "laplace":
        H = _dense_curvature(laplace.curvature(model, theta_map, X, y, cfg))  # (laplace.2)
        log_lik = -float(model.loss(theta_map, X, y))  # (laplace.5)
        # the random block theta[n_fixed:] and its prior (all of theta for subset "all")
        mu_q, delta_q = theta_map[state.n_fixed:], delta[state.n_fixed:]  # (laplace.23)
        D_q = mu_q.shape[0]
        log_prior = float(0.5 * (np.sum(np.log(delta_q)) - D_q * math.log(2.0 * math.pi)
                                 - np.sum(delta_q * mu_q * mu_q)))  # (laplace.5)
        log_det = _log_det(precision)  # (laplace.5)
        log_Z = laplace.log_marginal_likelihood(model, state, X, y, cfg)  # (laplace.5)
        log_det_ratio = log_det - float(np.sum(np.log(delta_q)))  # (laplace.6)
        scatter = float(np.sum(delta_q * mu_q * mu_q))  # (laplace.6)
        pred = laplace.glm_predictive(model, state, inputs.X_star)  # (laplace.7)
        return LaplaceInfo(H, precision, theta_s, log_lik, log_prior, log_det, log_Z,
                           log_det_ratio, scatter, pred.f_mean, pred.f_var, pred.y_var)

    # L = sum_i l_i + (1/2) theta^T diag(delta) theta  (riemannian_laplace.14)
    grad_fn, hvp_fn = riemannian_laplace.loss_fns(model, X, y, delta)

    V = riemannian_laplace.velocities(theta_map, theta_s)  # (riemannian_laplace.10)
    g = grad_fn(theta_map)  # (riemannian_laplace.1)
    C, rep = riemannian_laplace.sample(theta_map, V, grad_fn, hvp_fn, inputs.ode)
    S = V.shape[1]
    speed_0 = np.array([riemannian_laplace.squared_speed(grad_fn, theta_map, V[:, s].copy())
                        for s in range(S)])  # (riemannian_laplace.2)
    speed_1 = np.array([riemannian_laplace.squared_speed(grad_fn, C[:, s].copy(),
                                                         rep.cdot[:, s].copy())
                        for s in range(S)])  # (riemannian_laplace.11)
    return RiemannianLaplaceInfo(precision, theta_s, V, g, C, rep.cdot, rep.nfev, rep.n_steps,
                                 speed_0, speed_1)


class _MAPPoint(NamedTuple):
    """What a trace records of the MAP: the point and the start, not how L-BFGS reached it
    (its iterations and ``|grad|`` at rounding level move with the BLAS thread count)."""
    theta_map: Any
    theta0: Any


def _run(method: str):
    def run(seed, steps, dtype, **options):
        inputs = make_laplace_inputs(method, seed=seed, **options)
        info = trace_laplace(inputs)
        found = inputs.map
        return fit_arrays(inputs._replace(map=_MAPPoint(found.theta_map, found.theta0)), info,
                          configs=("cfg", "ode"))
    return run


def _round32(a):
    return np.asarray(a).astype(np.float32).astype(np.float64)


def _rounded(method: str):
    """The fit in float64 on its inputs rounded to float32 (X, y, X_star, the MAP point, eps):
    the outputs ``build`` measures the condition numbers from (``Tracer.rounded``)."""
    def rounded(seed, steps, **options):
        inputs = make_laplace_inputs(method, seed=seed, **options)
        found = inputs.map._replace(theta_map=_round32(inputs.map.theta_map))
        inputs = inputs._replace(X=_round32(inputs.X), y=_round32(inputs.y),
                                 X_star=_round32(inputs.X_star), map=found,
                                 eps=_round32(inputs.eps))
        with warnings.catch_warnings():  # the rounded point is no MAP to 1e-10 any more
            warnings.simplefilter("ignore")
            info = trace_laplace(inputs)
        return {n: a[None] for n, a in arrays_of("", info).items()}
    return rounded


_OPTIONS = {"S": 2, "curvature": "ggn", "prior_precision": 1.0, "structure": "full",
            "subset": "all"}
register(Tracer("laplace", "derivations/laplace.md", _run("laplace"), dict(_OPTIONS),
                chained=False, float32=False, rounded=_rounded("laplace")))
register(Tracer("riemannian-laplace", "derivations/riemannian_laplace.md",
                _run("riemannian-laplace"),
                {**_OPTIONS, "ode_method": "RK45", "rtol": 1e-6, "atol": 1e-3},
                chained=False, float32=False, absolute=(("g", MAP_GTOL),),
                rounded=_rounded("riemannian-laplace")))
