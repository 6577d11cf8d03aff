"""The problems the traces run on, shipped as recipes (no file needed), and the MAP recipe.

Each recipe and the reasons for its sizes are in ``derivations/tracing.md`` ("The problems").
``find_map`` is public: a Laplace approximation needs a MAP, and this one is deterministic.
"""
from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import numpy as np
from scipy.optimize import minimize

from refbayes.datasets import make_logistic_regression
from refbayes.models import MLP, LogisticRegression, tiny_cnn

__all__ = ["MODELS", "MAPResult", "cnn_problem", "find_map", "ktied_problem", "logistic_problem",
           "mlp_problem", "problem_of", "regression_problem", "shipped_map"]

# The logistic-regression data of the step methods, SWAG, the drivers and Noisy K-FAC.
N_ROWS = 50
N_FEATURES = 5
PROBLEM_SEED = 0
# The drivers' and Noisy K-FAC's network on it: D = 34, no other dimension of the traces equals it.
MLP_SIZES = (N_FEATURES, 4, 2)
MEAN_SCALE = 0.5  # every drawn start's mean: mu = MEAN_SCALE * rng.standard_normal(D)

# The Laplace traces' 1-d regression and its GLM-predictive test inputs.
LA_ROWS = 30
LA_HIDDEN = 4
LA_NOISE_PRECISION = 16.0
LA_PROBLEM_SEED = 0
LA_TEST_INPUTS = 5  # X_star = numpy.linspace(-3.0, 3.0, LA_TEST_INPUTS)[:, None]

# The MAP recipe.
MAP_INIT_SEED = 0   # theta0 = model.init_theta(numpy.random.default_rng(MAP_INIT_SEED))
MAP_LBFGS = {"gtol": 1e-12, "ftol": 0.0, "maxcor": 20, "maxiter": 10000}
MAX_NEWTON = 10
# |grad L(theta_map)|_2 the MAP recipe must reach: L-BFGS-B alone stops near 1e-7 on this
# problem, the Newton steps bring it to 1e-14..1e-15 (roundoff of a gradient of size ~10);
# 1e-10 leaves four orders of headroom and still makes grad L = 0 hold to the digits printed.
MAP_GTOL = 1e-10

# The k-tied trace's 3-class problem: X, a linear teacher W and label noise, all from
# numpy.random.default_rng(KT_PROBLEM_SEED); both weight matrices of the MLP are wider than the
# default tie rank.
KT_ROWS = 30
KT_SIZES = (4, 5, 3)
KT_PROBLEM_SEED = 0

# The tiny-CNN problem (``--model tiny-cnn``): N images 1x6x6, three classes of a noisy linear
# teacher on the pixels, all from numpy.random.default_rng(CNN_PROBLEM_SEED); N = N_ROWS, so
# the traces' M and their minibatch draws keep their ranges.
CNN_ROWS = N_ROWS
CNN_INPUT = (1, 6, 6)
CNN_CLASSES = 3
CNN_PROBLEM_SEED = 0

# The models a trace may run on instead of its shipped one (``refbayes trace METHOD --model``).
MODELS = ("tiny-cnn",)


def logistic_problem():
    """Build the logistic-regression problem of the step methods, SWAG and the drivers' data.

    Returns
    -------
    tuple
        (model, X, y): ``LogisticRegression(5)`` (intercept last, D = 6) and
        ``make_logistic_regression(50, 5, seed 0)``'s X (50, 5) and y (50,).
    """
    X, y, _ = make_logistic_regression(N_ROWS, N_FEATURES, PROBLEM_SEED)
    return LogisticRegression(N_FEATURES), X, y


def mlp_problem():
    """Build the MLP problem of the driven methods and Noisy K-FAC.

    Returns
    -------
    tuple
        (model, X, y): ``MLP([5, 4, 2], activation="tanh", likelihood="categorical")`` (D = 34)
        on the logistic data, its labels the two classes.
    """
    X, y, _ = make_logistic_regression(N_ROWS, N_FEATURES, PROBLEM_SEED)
    model = MLP(list(MLP_SIZES), activation="tanh", likelihood="categorical")
    return model, X, y


class MAPResult(NamedTuple):
    """The deterministic MAP of the Laplace traces and how it was reached.
    """
    theta_map: Any     # the MAP estimate theta*, (D,)
    theta0: Any        # the start of L-BFGS-B, (D,)
    lbfgs_nit: int     # L-BFGS-B iterations
    newton_steps: int  # Newton steps kept after L-BFGS-B
    grad_norm: float   # |grad L(theta_map)|_2, L the negative log joint


def _neg_log_joint(model, X, y, delta):
    """(L, grad L) and theta -> H[L] of L = sum_i l_i + (1/2) theta^T diag(delta) theta."""
    def fun(theta):
        return (model.loss(theta, X, y) + 0.5 * np.sum(delta * theta * theta),
                model.grad(theta, X, y) + delta * theta)

    def hess(theta):
        return model.hessian(theta, X, y) + np.diag(delta)
    return fun, hess


def find_map(model, X, y, delta) -> MAPResult:
    """Find the MAP by the deterministic recipe of ``derivations/tracing.md``.

    L-BFGS-B on L(theta) = sum_i l_i(theta) + (1/2) theta^T diag(delta) theta from
    ``model.init_theta(numpy.random.default_rng(MAP_INIT_SEED))`` with the options MAP_LBFGS,
    then at most MAX_NEWTON Newton steps with the dense Hessian of L, each kept only if it
    reduces ``|grad L|_2``.  (laplace.1)

    Parameters
    ----------
    model : FlatModel
        A NumPy model (the Newton steps use its autograd Hessian).
    X : numpy.ndarray of shape (N, n_in)
        Training inputs, float64.
    y : numpy.ndarray of shape (N,) or (N, n_out)
        Training targets.
    delta : numpy.ndarray of shape (D,)
        Prior precision per parameter, > 0.

    Returns
    -------
    MAPResult
        The MAP theta_map, the start theta0, the iteration counts and ``|grad L(theta_map)|_2``.

    Raises
    ------
    ValueError
        If the recipe ends with ``|grad L|_2 >= MAP_GTOL`` (not a stationary point to the digits
        the trace prints).
    """
    fun, hess = _neg_log_joint(model, X, y, delta)
    theta0 = model.init_theta(np.random.default_rng(MAP_INIT_SEED), dtype=np.float64)
    res = minimize(fun, theta0, jac=True, method="L-BFGS-B", options=dict(MAP_LBFGS))
    theta = np.asarray(res.x, dtype=np.float64)
    gnorm = float(np.linalg.norm(fun(theta)[1]))
    steps = 0
    for _ in range(MAX_NEWTON):
        candidate = theta - np.linalg.solve(hess(theta), fun(theta)[1])
        cnorm = float(np.linalg.norm(fun(candidate)[1]))
        if not cnorm < gnorm:
            break
        theta, gnorm, steps = candidate, cnorm, steps + 1
    if not gnorm < MAP_GTOL:
        raise ValueError(f"MAP: the recipe stopped at |grad L|_2 = {gnorm:.3e}, expected below "
                         f"MAP_GTOL = {MAP_GTOL:g} (L-BFGS-B: {res.message})")
    return MAPResult(theta, theta0, int(res.nit), steps, gnorm)


def regression_problem():
    """Build the Laplace traces' 1-d regression by its recipe (``derivations/tracing.md``).

    Returns
    -------
    tuple
        (model, X, y, X_star): the tanh ``MLP([1, 4, 1])`` with Gaussian noise precision 16, the
        training set X (30, 1), y (30,), and the GLM-predictive test inputs X_star (5, 1).
    """
    prng = np.random.default_rng(LA_PROBLEM_SEED)
    X = prng.uniform(-3.0, 3.0, (LA_ROWS, 1))
    y = np.sin(X[:, 0]) + prng.standard_normal(LA_ROWS) / math.sqrt(LA_NOISE_PRECISION)
    model = MLP([1, LA_HIDDEN, 1], activation="tanh", likelihood="gaussian",
                noise_precision=LA_NOISE_PRECISION)
    X_star = np.linspace(-3.0, 3.0, LA_TEST_INPUTS)[:, None]
    return model, X, y, X_star


@functools.lru_cache(maxsize=8)
def _cached_map(prior_precision: float) -> MAPResult:
    model, X, y, _ = regression_problem()
    return find_map(model, X, y, np.full(model.D, prior_precision))


def shipped_map(prior_precision: float) -> MAPResult:
    """Find the MAP of ``regression_problem()`` (deterministic, so cached; fresh arrays).

    Parameters
    ----------
    prior_precision : float
        The prior precision delta > 0 of every parameter.

    Returns
    -------
    MAPResult
        ``find_map``'s result.
    """
    found = _cached_map(prior_precision)
    return found._replace(theta_map=found.theta_map.copy(), theta0=found.theta0.copy())


def ktied_problem():
    """Build the k-tied trace's 3-class problem by its recipe (``derivations/tracing.md``).

    Returns
    -------
    tuple
        (model, X, y): ``MLP([4, 5, 3], activation="tanh", likelihood="categorical")`` (D = 43),
        X (30, 4) and int64 labels y (30,) of a noisy linear teacher.
    """
    prng = np.random.default_rng(KT_PROBLEM_SEED)
    n_in, _, n_out = KT_SIZES
    X = prng.standard_normal((KT_ROWS, n_in))
    W = prng.standard_normal((n_in, n_out))
    y = np.argmax(X @ W + prng.standard_normal((KT_ROWS, n_out)), axis=1).astype(np.int64)
    model = MLP(list(KT_SIZES), activation="tanh", likelihood="categorical")
    return model, X, y


def cnn_problem():
    """Build the tiny-CNN problem by its recipe (``derivations/tracing.md``, "The tiny CNN").

    ``prng = numpy.random.default_rng(CNN_PROBLEM_SEED)``, ``X = prng.standard_normal((50,
    36))`` (each row a 1x6x6 image flattened row-major in (c, h, w), the 2-D form the methods
    pass), ``W = prng.standard_normal((36, 3))``, ``y = argmax(X @ W + prng.standard_normal((50,
    3)), axis=1)``.

    Returns
    -------
    tuple
        (model, X, y): ``tiny_cnn()`` (Conv2d(1, 2, 3), relu, MaxPool2d(2), Flatten, Dense(8, 3),
        categorical, D = 47), X (50, 36) and int64 labels y (50,) in {0, 1, 2}.
    """
    prng = np.random.default_rng(CNN_PROBLEM_SEED)
    n_in = math.prod(CNN_INPUT)
    X = prng.standard_normal((CNN_ROWS, n_in))
    W = prng.standard_normal((n_in, CNN_CLASSES))
    y = np.argmax(X @ W + prng.standard_normal((CNN_ROWS, CNN_CLASSES)), axis=1).astype(np.int64)
    return tiny_cnn("categorical", CNN_CLASSES), X, y


def problem_of(model, default):
    """The problem a trace runs on: its shipped one, or the one ``--model`` names.

    Parameters
    ----------
    model : str or None
        None for the trace's shipped problem, else one of ``MODELS``.
    default : callable
        The trace's shipped problem, ``default() -> (model, X, y)``.

    Returns
    -------
    tuple
        (model, X, y).

    Raises
    ------
    ValueError
        If model is neither None nor one of ``MODELS``.
    """
    if model is None:
        return default()
    if model not in MODELS:
        raise ValueError(f"model: expected one of {', '.join(MODELS)} (or none: the trace's "
                         f"shipped model), got {model!r}")
    return cnn_problem()
