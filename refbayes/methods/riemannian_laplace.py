"""Riemannian Laplace approximation, the geodesic core (Bergamin et al. 2023, NeurIPS,
"Riemannian Laplace approximations for Bayesian neural networks").

Implements (riemannian_laplace.1)-(riemannian_laplace.21) of derivations/riemannian_laplace.md.

Symbols (derivations/notation.md, riemannian_laplace.md): L the full-batch negative log
posterior (summed loss plus the prior term), g = grad L (D,), H[L] its Hessian (D, D), never
formed here (only H[L] u through ``hvp_fn``); M(theta) = I_D + g g^T the metric of the
immersion theta -> [theta, L(theta)] (riemannian_laplace.1); c(t) (D,) a geodesic, cdot = c'(t)
(D,) its velocity; theta_map (D,) the base point; v (D,) an initial velocity; V (D, S) S of them.

Where N, M, S, tau, rho enter: the geodesic functions (``exp_map``, ``sample``) take L only
through the caller's ``grad_fn`` and ``hvp_fn``; S is the number of columns of V. ``loss_fns``
builds that pair for a FlatModel or a CNN (refbayes.models.conv; X as rows (N, C H W) or NCHW
images; H[L] u from the CNN's own ``grad_hvp``): L(theta) = (N / M) sum_{i in B} l_i(theta)
+ (1/2) theta^T diag(delta) theta, the summed loss over the N rows of X (B = all rows, M = N) or
over the M rows ``rows`` scaled by N / M (the prior is not scaled), optionally of the model
linearized at theta_map, f_lin = f(theta_map) + J (theta - theta_map) (riemannian_laplace.14)-
(riemannian_laplace.20). Tempering (tau) and data augmentation (rho) do not enter.

The geodesic equation as solved (riemannian_laplace.7), (riemannian_laplace.8)::

    c'' = -g(c) (c'^T H[L](c) c') / (1 + g(c)^T g(c)),    c(0) = theta_map, c'(0) = v,

and Exp_{theta_map}(v) = c(1) (riemannian_laplace.9), by ``scipy.integrate.solve_ivp`` on
t in [0, 1] (explicit Runge-Kutta; the config defaults are the official code's).

Backend: NumPy float64 only; the ODE is solved by scipy on the host (no CuPy path), so the
inputs must be NumPy float64 arrays and the callables must return them.

Randomness: nothing is drawn here; the velocities V and the minibatch rows come from the caller
(``velocities`` forms the printed v_s = theta_map - theta_s from draws
theta_s ~ N(theta_map, H^{-1}); the sign is a convention, riemannian_laplace.md, Conventions).

Examples
--------
Riemannian Laplace samples of a small MLP regression: the caller supplies the MAP and the
standard-normal draws; Laplace draws theta_s ~ N(theta_map, H^{-1}) give the velocities, and
each is mapped through the geodesic ODE (nothing is drawn here):

>>> import numpy as np
>>> from refbayes.datasets import make_linear_regression
>>> from refbayes.methods import laplace, riemannian_laplace as rla
>>> from refbayes.models import MLP
>>> data = make_linear_regression(20, 2, 0, 4.0)  # N = 20 rows, 2 features, seed 0, tau = 4
>>> model = MLP([2, 1], likelihood="gaussian", noise_precision=4.0)   # theta = [w; b]
>>> X1 = np.hstack([data.X, np.ones((20, 1))])
>>> theta_map = np.linalg.solve(4.0 * X1.T @ X1 + np.eye(3), 4.0 * X1.T @ data.y)  # delta = 1
>>> state = laplace.fit(model, theta_map, data.X, data.y,
...                     laplace.LaplaceConfig(prior_precision=1.0))
>>> eps = np.random.default_rng(0).standard_normal((model.D, 4))   # S = 4 draws
>>> V = rla.velocities(theta_map, laplace.sample(state, eps))
>>> grad_fn, hvp_fn = rla.loss_fns(model, data.X, data.y, 1.0)
>>> Theta, info = rla.sample(theta_map, V, grad_fn, hvp_fn, rla.RiemannianLaplaceConfig())
>>> Theta.shape, info.status.tolist()
((3, 4), [0, 0, 0, 0])
"""
from __future__ import annotations

import math
import numbers
from typing import Any, NamedTuple

import numpy as np
from scipy.integrate import solve_ivp

from refbayes._checks import (
    check_array,
    check_at_construction,
    check_in_range,
    check_positive,
    unchecked,
    value_checks,
)
from refbayes.backend import xp_of
from refbayes.methods._estimates import check_model, model_widths
from refbayes.models.conv import CNN

__all__ = [
    "ExpMapInfo",
    "METHODS",
    "RiemannianLaplaceConfig",
    "SampleInfo",
    "exp_map",
    "geodesic_acceleration",
    "loss_fns",
    "sample",
    "squared_speed",
    "velocities",
]

Array = Any

METHODS = ("RK45", "RK23", "DOP853")  # explicit Runge-Kutta methods of scipy.integrate.solve_ivp

_RTOL_MIN = 100 * float(np.finfo(np.float64).eps)  # below it solve_ivp raises rtol silently


class RiemannianLaplaceConfig(NamedTuple):
    """Settings of the geodesic ODE solve.

    The defaults are the official code's (federicobergamin/riemannian-laplace-approximation,
    ``geomai/utils/geometry.py``, ``new_solve_expmap``: ``solve_ivp`` with its default method
    RK45, atol = 1e-3, rtol = 1e-6).

    Each field is documented by its trailing comment. The functions that take a cfg check it
    and raise ValueError unless: method is one of METHODS; rtol is in [100 eps, 1), eps the
    float64 machine epsilon; and atol is a finite real >= 0.

    Construction (``RiemannianLaplaceConfig(...)``, and unpickling) checks these rules too;
    ``_replace`` and ``_make`` do not, so the functions check every cfg again.
    """
    method: str = "RK45"  # explicit Runge-Kutta method of scipy.integrate.solve_ivp, one of METHODS (riemannian_laplace.8)
    rtol: float = 1e-6    # relative tolerance of the adaptive step, in [100 eps_f64, 1) (riemannian_laplace.8)
    atol: float = 1e-3    # absolute tolerance of the adaptive step, >= 0 (riemannian_laplace.8)


class ExpMapInfo(NamedTuple):
    """The end state of one geodesic solve and the solver's report.

    Each field is documented by its trailing comment.
    """
    c: Array          # end point c(1) = Exp_{theta_map}(v), (D,) (riemannian_laplace.9)
    cdot: Array       # end velocity c'(1), (D,) (riemannian_laplace.8)
    status: int       # solve_ivp status, 0 = reached t = 1 (a failure raises instead)
    nfev: int         # right-hand-side evaluations, each one grad_fn and one hvp_fn call
    n_steps: int      # accepted steps
    n_nonfinite: int  # trial evaluations giving NaN or inf, each a rejected step (riemannian_laplace.22)
    #                   (grad_fn or hvp_fn at a trial point; the solver retries a shorter step)


class SampleInfo(NamedTuple):
    """The solver reports of a batch of geodesic solves, one column / entry per velocity.

    Each field is documented by its trailing comment.
    """
    cdot: Array         # end velocities c_s'(1), (D, S) (riemannian_laplace.8)
    status: Array       # (S,) int solve_ivp statuses, all 0 = reached t = 1 (a failure raises instead)
    nfev: Array         # (S,) int, right-hand-side evaluations per solve
    n_steps: Array      # (S,) int, accepted steps per solve
    n_nonfinite: Array  # (S,) int, non-finite trial evaluations per solve (riemannian_laplace.22)


# ----------------------------------------------------------------------------- checks

def _check_vector(a, name: str, D=None):
    """A finite NumPy float64 array of shape (D,) (any D >= 1 when D is None)."""
    # the geodesic's right-hand side checks five such vectors per evaluation: the common case in
    # one pass (measured: 11 -> 2 us each at D = 46), anything else by the checks that name it
    if (type(a) is np.ndarray and a.ndim == 1 and a.dtype == np.float64
            and (a.shape[0] >= 1 if D is None else a.shape[0] == D)
            and (not value_checks() or np.isfinite(a).all())):
        return a
    check_array(a, name, ndim=1)
    if xp_of(a) is not np:
        raise ValueError(f"{name}: expected a NumPy array (the ODE is solved by scipy on the "
                         f"host), got {type(a).__module__}.{type(a).__name__}")
    if a.dtype != np.float64:
        raise ValueError(f"{name}: expected dtype float64 (the ODE is solved in float64), "
                         f"got {a.dtype}")
    if D is None:
        if a.shape[0] < 1:
            raise ValueError(f"{name}: expected at least one entry, got shape {tuple(a.shape)}")
    elif a.shape[0] != D:
        raise ValueError(f"{name}: expected shape ({D},), got {tuple(a.shape)}")
    return a


def _check_callable(f, name: str):
    if not callable(f):
        raise ValueError(f"{name}: expected a callable, got {type(f).__name__}")
    return f


def _check_cfg(cfg) -> RiemannianLaplaceConfig:
    if not isinstance(cfg, RiemannianLaplaceConfig):
        raise ValueError(f"cfg: expected a RiemannianLaplaceConfig, got {type(cfg).__name__}")
    if cfg.method not in METHODS:
        raise ValueError(f"cfg.method: expected one of {METHODS}, got {cfg.method!r}")
    rtol = check_in_range(cfg.rtol, "cfg.rtol", _RTOL_MIN, 1.0, high_open=True)
    atol = check_in_range(cfg.atol, "cfg.atol", 0.0, math.inf, high_open=True)
    return RiemannianLaplaceConfig._make((cfg.method, rtol, atol))  # checked: no second check


check_at_construction(RiemannianLaplaceConfig, _check_cfg)


def _call(f, name: str, D: int, *args, finite: bool = True):
    """``f(*args)``, checked to be a NumPy float64 (D,) array (the callable's contract), and finite
    unless ``finite`` is False (trial points inside the ODE solve, riemannian_laplace.22)."""
    out = f(*args)
    if not (hasattr(out, "shape") and hasattr(out, "dtype")):
        raise ValueError(f"{name}: expected it to return an array of shape ({D},), got "
                         f"{type(out).__name__}")
    if out.shape != (D,) or out.dtype != np.float64 or xp_of(out) is not np:
        raise ValueError(f"{name}: expected it to return a NumPy float64 array of shape ({D},), "
                         f"got {type(out).__name__} of shape {tuple(out.shape)} and dtype "
                         f"{out.dtype}")
    if finite and not bool(np.all(np.isfinite(out))):
        raise ValueError(f"{name}: returned NaN or inf at the point given")
    return out


# ----------------------------------------------------------------------------- the metric

def _acceleration(grad_L, hvp_L, c, cdot, D: int, names=("grad_L", "hvp_L"), finite=True):
    # hvp first: loss_fns' hvp_L keeps the gradient of its pass for grad_L at the same c
    Hu = _call(hvp_L, names[1], D, c, cdot, finite=finite)  # H[L](c) c'
    g = _call(grad_L, names[0], D, c, finite=finite)        # g = grad L(c) (riemannian_laplace.1)
    return -(g / (1.0 + g @ g)) * (cdot @ Hu)  # (riemannian_laplace.7)


def squared_speed(grad_fn, c, cdot) -> float:
    """Compute the squared metric speed ``c'^T M(c) c' = |c'|^2 + (grad L(c)^T c')^2``.

    M(c) = I_D + grad L(c) grad L(c)^T, the metric of the immersion c -> [c, L(c)]
    (riemannian_laplace.1), (riemannian_laplace.2); constant along a geodesic
    (riemannian_laplace.11).

    Parameters
    ----------
    grad_fn : callable
        The gradient: grad_fn(theta) -> grad L(theta), a NumPy float64 array of shape (D,).
    c : numpy.ndarray of shape (D,)
        The point, float64.
    cdot : numpy.ndarray of shape (D,)
        The velocity at c, float64.

    Returns
    -------
    float
        The squared speed.

    Raises
    ------
    ValueError
        If grad_fn is not callable or does not return a finite float64 (D,) NumPy array, or if
        c, cdot are not finite float64 NumPy arrays of one shape (D,), D >= 1.
    """
    _check_callable(grad_fn, "grad_fn")
    _check_vector(c, "c")
    D = c.shape[0]
    _check_vector(cdot, "cdot", D)
    g = _call(grad_fn, "grad_fn", D, c)
    return float(cdot @ cdot + (g @ cdot) ** 2)  # (riemannian_laplace.2)


def geodesic_acceleration(grad_L, hvp_L, c, cdot):
    """Compute the geodesic acceleration c'' = -g (c'^T H[L](c) c') / (1 + g^T g), g = grad L(c).

    The Christoffel form of the geodesic equation of M = I + g g^T (riemannian_laplace.3),
    simplified by Sherman-Morrison (riemannian_laplace.4)-(riemannian_laplace.7).

    Parameters
    ----------
    grad_L : callable
        The gradient: grad_L(theta) -> grad L(theta), a NumPy float64 array of shape (D,).
    hvp_L : callable
        The Hessian-vector product: hvp_L(theta, u) -> H[L](theta) u, a NumPy float64
        array of shape (D,).
    c : numpy.ndarray of shape (D,)
        The point, float64.
    cdot : numpy.ndarray of shape (D,)
        The velocity c', float64.

    Returns
    -------
    numpy.ndarray of shape (D,)
        The acceleration c''.

    Raises
    ------
    ValueError
        If grad_L or hvp_L is not callable or does not return a finite float64 (D,) NumPy
        array, or if c, cdot are not finite float64 NumPy arrays of one shape (D,), D >= 1.
    """
    _check_callable(grad_L, "grad_L")
    _check_callable(hvp_L, "hvp_L")
    _check_vector(c, "c")
    D = c.shape[0]
    _check_vector(cdot, "cdot", D)
    return _acceleration(grad_L, hvp_L, c, cdot, D)


# ----------------------------------------------------------------------------- the exponential map

def _solve(theta_map, v, grad_fn, hvp_fn, cfg: RiemannianLaplaceConfig):
    """Integrate (riemannian_laplace.8) on [0, 1]; the end state and the solver's counters."""
    D = theta_map.shape[0]
    names = ("grad_fn", "hvp_fn")
    y0 = np.concatenate([theta_map, v])       # [theta_map; v] (riemannian_laplace.8)
    n_nonfinite = 0

    def rhs(t, y):
        nonlocal n_nonfinite
        c, cdot = y[:D], y[D:]
        if t == 0.0 and np.array_equal(y, y0):  # the base point: finite, or ValueError
            return np.concatenate([cdot, _acceleration(grad_fn, hvp_fn, c, cdot, D, names)])
        if not bool(np.all(np.isfinite(y))):  # a stage built from an earlier non-finite one
            n_nonfinite += 1
            return np.full(2 * D, np.nan)  # (riemannian_laplace.22)
        with np.errstate(all="ignore"):  # a trial point may overflow the callables
            cddot = _acceleration(grad_fn, hvp_fn, c, cdot, D, names, finite=False)
        if not bool(np.all(np.isfinite(cddot))):
            n_nonfinite += 1
            cddot = np.full(D, np.nan)  # NaN error estimate: step rejected (riemannian_laplace.22)
        return np.concatenate([cdot, cddot])  # [c', c''] (riemannian_laplace.8)

    sol = solve_ivp(rhs, (0.0, 1.0), y0, method=cfg.method, rtol=cfg.rtol, atol=cfg.atol)
    if sol.status != 0:
        raise RuntimeError(f"exp_map: solve_ivp ({cfg.method}, rtol {cfg.rtol}, atol {cfg.atol}) "
                           f"stopped at t = {float(sol.t[-1])!r} with status {sol.status}: "
                           f"{sol.message}")
    y1 = sol.y[:, -1]
    if not bool(np.all(np.isfinite(y1))):
        raise RuntimeError(f"exp_map: solve_ivp ({cfg.method}, rtol {cfg.rtol}, atol {cfg.atol}) "
                           "ended at a non-finite state")
    c1 = y1[:D].copy()  # Exp_{theta_map}(v) (riemannian_laplace.9)
    return ExpMapInfo(c1, y1[D:].copy(), int(sol.status), int(sol.nfev), int(sol.t.shape[0] - 1),
                      n_nonfinite)


def exp_map(theta_map, v, grad_fn, hvp_fn, cfg: RiemannianLaplaceConfig):
    """Compute Exp_{theta_map}(v) = c(1), the end of the geodesic from theta_map with velocity v.

    Solves [c, c']' = [c', c''] (riemannian_laplace.8), c'' of ``geodesic_acceleration``, with
    c(0) = theta_map, c'(0) = v, by ``scipy.integrate.solve_ivp`` on t in [0, 1] (on the host,
    in float64) (riemannian_laplace.9).  v = 0 returns theta_map exactly (c'' = 0 there).

    Parameters
    ----------
    theta_map : numpy.ndarray of shape (D,)
        Base point (the MAP estimate), float64.
    v : numpy.ndarray of shape (D,)
        Initial velocity, float64.
    grad_fn : callable
        The gradient: grad_fn(theta) -> grad L(theta), a NumPy float64 array of shape (D,); L is the
        full-batch negative log posterior (summed loss plus the prior term).
    hvp_fn : callable
        The Hessian-vector product: hvp_fn(theta, u) -> H[L](theta) u, a NumPy float64
        array of shape (D,).
    cfg : RiemannianLaplaceConfig
        Solver settings (method, rtol, atol).

    Returns
    -------
    c1 : numpy.ndarray of shape (D,)
        The end point c(1).
    info : ExpMapInfo
        The end point c(1), the end velocity c'(1) and the solver's counters.

    Raises
    ------
    ValueError
        If theta_map, v are not finite float64 NumPy arrays of one shape (D,), D >= 1; if grad_fn
        or hvp_fn is not callable or returns anything but a float64 (D,) NumPy array, or returns
        NaN or inf at the base point (at a trial point inside the solve a non-finite value rejects
        the step instead, riemannian_laplace.22); if cfg is invalid (see RiemannianLaplaceConfig).
    RuntimeError
        If ``solve_ivp`` stops before t = 1 (its step size underflows, e.g. no shorter step
        avoids non-finite values).
    """
    c = _check_cfg(cfg)
    _check_vector(theta_map, "theta_map")
    _check_vector(v, "v", theta_map.shape[0])
    _check_callable(grad_fn, "grad_fn")
    _check_callable(hvp_fn, "hvp_fn")
    info = _solve(theta_map, v, grad_fn, hvp_fn, c)
    return info.c, info


def velocities(theta_map, Theta):
    """Form the printed initial velocities v_s = theta_map - theta_s of draws theta_s.

    (riemannian_laplace.10)  With theta_s ~ N(theta_map, H^{-1}) the v_s are N(0, H^{-1}); the
    official code draws v_s = +H^{-1/2} eps_s directly, the opposite sign for the same eps.
    The printed sign is kept (riemannian_laplace.md, Conventions): N(0, H^{-1}) is symmetric, so
    both signs give one distribution of velocities and of samples Exp(v_s); per draw they differ,
    Exp(-v) != Exp(v) in general, and Exp(-v) = 2 theta_map - Exp(v) for a loss even about theta_map
    (riemannian_laplace.21).  To reproduce the official code draw by draw, pass
    V = H^{-1/2} eps (= -velocities(theta_map, theta_map + H^{-1/2} eps)) to ``sample``.

    Parameters
    ----------
    theta_map : numpy.ndarray of shape (D,)
        The MAP estimate, float64.
    Theta : numpy.ndarray of shape (D, S)
        Draws theta_s, one per column, float64.

    Returns
    -------
    numpy.ndarray of shape (D, S)
        The velocities V, column s = theta_map - theta_s.

    Raises
    ------
    ValueError
        If theta_map is not a finite float64 NumPy (D,) array or Theta not a finite float64
        NumPy (D, S) array with S >= 1.
    """
    _check_vector(theta_map, "theta_map")
    D = theta_map.shape[0]
    _check_columns(Theta, "Theta", D)
    return theta_map[:, None] - Theta  # (riemannian_laplace.10)


def _check_columns(V, name: str, D: int):
    check_array(V, name, ndim=2)
    if xp_of(V) is not np:
        raise ValueError(f"{name}: expected a NumPy array (the ODE is solved by scipy on the "
                         f"host), got {type(V).__module__}.{type(V).__name__}")
    if V.shape[0] != D or V.shape[1] < 1:
        raise ValueError(f"{name}: expected shape ({D}, S) with S >= 1, got {tuple(V.shape)}")
    if V.dtype != np.float64:
        raise ValueError(f"{name}: expected dtype float64 (the ODE is solved in float64), "
                         f"got {V.dtype}")
    return V


def sample(theta_map, V, grad_fn, hvp_fn, cfg: RiemannianLaplaceConfig):
    """Map velocities to Riemannian Laplace samples, column s -> Exp_{theta_map}(V[:, s]).

    (riemannian_laplace.9), (riemannian_laplace.12): one ``exp_map`` per column, in order.
    With V from ``velocities`` (or V = H^{-1/2} eps, the official code's sign) the columns of
    the result are the paper's samples.

    Parameters
    ----------
    theta_map : numpy.ndarray of shape (D,)
        Base point (the MAP estimate), float64.
    V : numpy.ndarray of shape (D, S)
        Initial velocities, one per column, float64, S >= 1.
    grad_fn : callable
        The gradient: grad_fn(theta) -> grad L(theta), a NumPy float64 array of shape (D,).
    hvp_fn : callable
        The Hessian-vector product: hvp_fn(theta, u) -> H[L](theta) u, a NumPy float64
        array of shape (D,).
    cfg : RiemannianLaplaceConfig
        Solver settings (method, rtol, atol).

    Returns
    -------
    Theta : numpy.ndarray of shape (D, S)
        The samples, column s = Exp_{theta_map}(V[:, s]).
    info : SampleInfo
        End velocities and the solver's counters, per column.

    Raises
    ------
    ValueError
        If theta_map is not a finite float64 NumPy (D,) array, V not a finite float64 NumPy (D, S)
        array with S >= 1; if grad_fn or hvp_fn is not callable or returns anything but a float64
        (D,) NumPy array, or NaN or inf at the base point (see ``exp_map``); if cfg is invalid (see
        RiemannianLaplaceConfig).
    RuntimeError
        If ``solve_ivp`` stops before t = 1 for a column.
    """
    c = _check_cfg(cfg)
    _check_vector(theta_map, "theta_map")
    D = theta_map.shape[0]
    _check_columns(V, "V", D)
    _check_callable(grad_fn, "grad_fn")
    _check_callable(hvp_fn, "hvp_fn")
    infos = [_solve(theta_map, np.ascontiguousarray(V[:, s]), grad_fn, hvp_fn, c)
             for s in range(V.shape[1])]  # (riemannian_laplace.12)
    Theta = np.stack([i.c for i in infos], axis=1)
    return Theta, SampleInfo(np.stack([i.cdot for i in infos], axis=1),
                             np.array([i.status for i in infos]),
                             np.array([i.nfev for i in infos]),
                             np.array([i.n_steps for i in infos]),
                             np.array([i.n_nonfinite for i in infos]))


# ----------------------------------------------------------------------------- the loss L

def _check_data(model, X, y):
    """X a finite NumPy float64 (N, n_in) array, N >= 1 (for a CNN also its NCHW images
    (N, C, H, W)); y the likelihood's targets for N rows."""
    n_in, K = model_widths(model)  # sizes[0], sizes[-1]; a CNN's C H W and n_out
    cnn = isinstance(model, CNN)
    check_array(X, "X", ndim=(2, 4) if cnn else 2)
    if xp_of(X) is not np:
        raise ValueError(f"X: expected a NumPy array (the ODE is solved by scipy on the host), "
                         f"got {type(X).__module__}.{type(X).__name__}")
    if cnn and (X.shape[1:] not in ((n_in,), model.input_shape) or X.shape[0] < 1):
        C, H, W = model.input_shape
        raise ValueError(f"X: expected rows (N, {n_in}) or NCHW images (N, {C}, {H}, {W}) with "
                         f"N >= 1, got {tuple(X.shape)}")
    if not cnn and (X.shape[1] != n_in or X.shape[0] < 1):
        raise ValueError(f"X: expected shape (N, {n_in}) with N >= 1, got "
                         f"{tuple(X.shape)}")
    if X.dtype != np.float64:
        raise ValueError(f"X: expected dtype float64 (the ODE is solved in float64), "
                         f"got {X.dtype}")
    check_array(y, "y", ndim=(1, 2))
    if xp_of(y) is not np:
        raise ValueError(f"y: expected a NumPy array, got {type(y).__module__}.{type(y).__name__}")
    model.likelihood.check_targets(y, X.shape[0], K, np.float64)
    return X, y


def _check_prior(delta, D: int):
    """delta >= 0, finite: a real number (NumPy scalars included), or a NumPy float64 (D,) array."""
    if isinstance(delta, numbers.Real):
        return check_in_range(delta, "prior_precision", 0.0, math.inf, high_open=True)
    _check_vector(delta, "prior_precision", D)
    check_positive(delta, "prior_precision", strict=False)
    return delta


def _check_rows(rows, N: int):
    """A NumPy integer (M,) array of row indices in [0, N), M >= 1 (repeats allowed)."""
    check_array(rows, "rows", ndim=1)
    if xp_of(rows) is not np:
        raise ValueError(f"rows: expected a NumPy array, got {type(rows).__module__}."
                         f"{type(rows).__name__}")
    if rows.dtype.kind not in "iu":
        raise ValueError(f"rows: expected an integer array of row indices, got dtype {rows.dtype}")
    if rows.shape[0] < 1:
        raise ValueError("rows: expected at least one row index, got shape (0,)")
    if int(rows.min()) < 0 or int(rows.max()) >= N:
        raise ValueError(f"rows: expected indices in [0, {N}) (the rows of X), got values in "
                         f"[{int(rows.min())}, {int(rows.max())}]")
    return rows


def loss_fns(model, X, y, prior_precision, *, linearize_at=None, rows=None):
    """Build the (grad_fn, hvp_fn) pair of the negative log posterior L of a FlatModel or a CNN.

    L(theta) = (N / M) sum_{i in B} l(y_i, f(x_i, theta)) + (1/2) theta^T diag(delta) theta
    (riemannian_laplace.14), with l_i = -log p(y_i | f_i) summed over the rows B of X (all N of
    them, M = N, by default; the M rows ``rows``, scaled by N / M, otherwise; the prior term is
    not scaled), delta = ``prior_precision``.  The callables are what ``exp_map`` and ``sample``
    take: grad_fn(theta) = grad L(theta) and hvp_fn(theta, u) = H[L](theta) u.

    - ``linearize_at`` None: the network itself, grad L = (N / M) model.grad + delta theta,
      H[L] u = (N / M) model.hvp + delta u, the exact Hessian (riemannian_laplace.15) (for a
      CNN its own exact product, ``CNN.grad_hvp``, derivations/conv.md).
    - ``linearize_at`` = theta_lin: the model linearized there,
      f_lin(x, theta) = f(x, theta_lin) + J(x) (theta - theta_lin) with J = model.jacobian at
      theta_lin, formed once for the rows B (riemannian_laplace.16); L_lin is L with f_lin for f
      (riemannian_laplace.17); grad L_lin = (N / M) sum_i J_i^T r_i + delta theta with
      r_i = dl/df at f_lin(x_i, theta) (riemannian_laplace.18); H[L_lin] u =
      (N / M) sum_i J_i^T H_i J_i u + delta u with H_i = d^2 l / df^2 at f_lin(x_i, theta), the
      exact Hessian of L_lin, a GGN evaluated at f_lin (riemannian_laplace.19).

    Parameters
    ----------
    model : FlatModel or CNN
        The network and likelihood (``MLP``, ``LogisticRegression``, ``SoftmaxRegression``, or a
        ``refbayes.models.conv.CNN``).
    X : numpy.ndarray of shape (N, n_in), or (N, C, H, W) for a CNN
        All N training inputs, float64, as the model takes them (no ones column: a linear
        model's intercept is its bias; a CNN's images NCHW, or as rows of C H W entries).
    y : numpy.ndarray of shape (N,) or (N, n_out)
        The targets, in the form the model's likelihood takes.
    prior_precision : float or numpy.ndarray of shape (D,)
        The prior precision delta >= 0, finite: the prior N(0, diag(delta)^{-1}) (a float is
        delta I); 0 drops the prior term.
    linearize_at : numpy.ndarray of shape (D,), optional
        The point theta_lin, float64, usually theta_map: differentiate the loss of the model
        linearized there.  None (the default): the loss of the network.
    rows : numpy.ndarray of shape (M,), optional
        Integer indices into the rows of X (repeats allowed; drawn by the caller, once per
        geodesic in the official code): L uses these M rows, scaled by N / M.  None (the
        default): all N rows, no scaling.

    Returns
    -------
    grad_fn : callable
        The gradient, grad_fn(theta) -> grad L(theta), a NumPy float64 array of shape (D,).
    hvp_fn : callable
        The Hessian-vector product, hvp_fn(theta, u) -> H[L](theta) u, a NumPy float64 array
        of shape (D,).

    Raises
    ------
    ValueError
        If model is not a FlatModel or a CNN; X is not a finite NumPy float64 (N, n_in) array
        (for a CNN, or (N, C, H, W)) with N >= 1; y does not fit the likelihood for N rows; prior_precision is not a finite real
        >= 0 or a finite NumPy float64 (D,) array >= 0; linearize_at is not a finite NumPy
        float64 (D,) array; rows is not a NumPy integer (M,) array, M >= 1, of indices in
        [0, N).  The returned callables raise ValueError if theta or u is not a finite NumPy
        float64 (D,) array.
    """
    check_model(model, cnn=True)
    D = model.D
    X, y = _check_data(model, X, y)
    delta = _check_prior(prior_precision, D)
    N = X.shape[0]
    if rows is None:
        Xb, yb, scale = X.copy(), y.copy(), 1.0  # copies: later edits of X, y do not leak in
    else:
        _check_rows(rows, N)
        Xb, yb = X[rows], y[rows]   # the rows B
        scale = N / rows.shape[0]  # N / M (riemannian_laplace.14)
    if linearize_at is None:
        # Xb, yb were checked once above and are private copies; theta and u are checked on
        # entry, so the model's own scans of the same values are skipped (unchecked). hvp_fn
        # computes the gradient at theta in the same passes (grad_hvp) and keeps it, with the
        # bytes of theta: grad_fn at that same point (the geodesic's right-hand side asks for
        # both, hvp first) returns it instead of a second forward and backward pass; the
        # values are those of model.grad bit for bit.
        last = {"theta": None, "g": None}

        def grad_fn(theta):
            _check_vector(theta, "theta", D)
            if last["theta"] is not None and last["theta"] == theta.tobytes():
                g = last["g"]
            else:
                with unchecked():
                    g = model.grad(theta, Xb, yb)
            return scale * g + delta * theta  # (riemannian_laplace.15)

        def hvp_fn(theta, u):
            _check_vector(theta, "theta", D)
            _check_vector(u, "u", D)
            with unchecked():
                g, Hu = model.grad_hvp(theta, u, Xb, yb)  # the R-operator (peg.22)-(peg.26)
            last["theta"], last["g"] = theta.tobytes(), g
            return scale * Hu + delta * u  # (riemannian_laplace.15)

        return grad_fn, hvp_fn

    theta_lin = _check_vector(linearize_at, "linearize_at", D).copy()
    lik = model.likelihood
    M, K = Xb.shape[0], model_widths(model)[1]
    f0 = model.forward(theta_lin, Xb)  # f(x_i, theta_lin), (M, K)
    J = model.jacobian(theta_lin, Xb).reshape(M * K, D)  # J_i stacked (riemannian_laplace.16)

    def f_lin(theta):
        return f0 + (J @ (theta - theta_lin)).reshape(M, K)  # (riemannian_laplace.16)

    def grad_fn(theta):
        _check_vector(theta, "theta", D)
        r = lik.grad_f(f_lin(theta), yb)                  # r_i at f_lin, (M, K)
        return scale * (J.T @ r.reshape(M * K)) + delta * theta  # (riemannian_laplace.18)

    def hvp_fn(theta, u):
        _check_vector(theta, "theta", D)
        _check_vector(u, "u", D)
        H = lik.hess_f(f_lin(theta), yb)                  # H_i at f_lin, (M, K, K)
        HJu = (H @ (J @ u).reshape(M, K, 1)).reshape(M * K)
        return scale * (J.T @ HJu) + delta * u            # (riemannian_laplace.19)

    return grad_fn, hvp_fn
