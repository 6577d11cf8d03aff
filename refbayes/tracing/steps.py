"""Traces of the step methods on logistic regression: slang, ngvi-full, ngvi-meanfield.

One step from a drawn state (``make_inputs``), chained to K steps by ``chain.run_chain``; the
problem, the draws and their order are in ``derivations/tracing.md``.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from refbayes._checks import check_int
from refbayes.linalg import lowrank
from refbayes.methods import Batch, ngvi, slang
from refbayes.methods.driver import epoch_batches
from refbayes.tracing.chain import drawn_chain, run_chain
from refbayes.tracing.problems import MEAN_SCALE, N_FEATURES, N_ROWS, logistic_problem
from refbayes.tracing.tracer import Tracer, register

__all__ = ["STEP_METHODS", "TraceInputs", "make_inputs", "step"]

STEP_METHODS = ("slang", "ngvi-full", "ngvi-meanfield")
STEPS = {"slang": slang.step, "ngvi-full": ngvi.step_full, "ngvi-meanfield": ngvi.step_meanfield}


class TraceInputs(NamedTuple):
    """Everything one traced step consumes, and how it was drawn.
    """
    method: str     # one of STEP_METHODS
    seed: int       # of numpy.random.default_rng, the only source of the draws
    L: int          # columns of the drawn U (SLANG's rank; the low-rank part of the ngvi start)
    model: Any      # LogisticRegression(N_FEATURES), D = N_FEATURES + 1
    X: np.ndarray   # (N, N_FEATURES) the shipped training set
    y: np.ndarray   # (N,) labels in {0, 1}
    idx: np.ndarray  # (M,) minibatch rows, rng.permutation(N)[:M]
    eps: Any        # (D, S) standard-normal draws, or None for curvature "exact"
    state: Any      # SLANGState | FullState | MeanFieldState
    cfg: Any        # SLANGConfig | NGVIConfig

    @property
    def batch(self) -> Batch:
        return Batch(self.X[self.idx], self.y[self.idx])


def make_inputs(method: str, *, seed: int = 0, M: int = 8, S: int = 1, L: int = 2,
                curvature: str | None = None, momentum: float = 0.0, t: int = 0) -> TraceInputs:
    """Build the problem, the starting state and the draws of one traced step.

    The draws are made in the order of ``derivations/tracing.md``.

    Parameters
    ----------
    method : {"slang", "ngvi-full", "ngvi-meanfield"}
        The traced step.
    seed : int, default 0
        Seed of ``numpy.random.default_rng``.
    M : int, default 8
        Minibatch rows, in [1, N].
    S : int, default 1
        Monte Carlo draws, >= 1.
    L : int, default 2
        Columns of the drawn U, in [1, D].
    curvature : {"ef", "hess", "exact"} or None, default None
        Curvature of the ngvi methods (None: "ef"); SLANG is "ef" only.
    momentum : float, default 0.0
        The momentum b of (ngvi.13).
    t : int, default 0
        Steps already taken (sets alpha_t, beta_t and the bias correction).

    Returns
    -------
    TraceInputs
        The problem, state, config and draws.

    Raises
    ------
    ValueError
        If method is not a step method or an option is outside its range.
    """
    if method not in STEP_METHODS:
        raise ValueError(f"method: expected one of {', '.join(STEP_METHODS)}, got {method!r}")
    seed = check_int(seed, "seed", low=0)
    N, D = N_ROWS, N_FEATURES + 1
    M = check_int(M, "M", low=1, high=N)
    S = check_int(S, "S", low=1)
    L = check_int(L, "L", low=1, high=D)
    t = check_int(t, "t", low=0)
    curvature = "ef" if curvature is None else curvature
    if curvature not in ngvi.CURVATURES:
        raise ValueError(f"curvature: expected one of {ngvi.CURVATURES}, got {curvature!r}")
    if method == "slang" and curvature != "ef":
        raise ValueError("curvature: SLANG uses the empirical Fisher only ('ef'), "
                         f"got {curvature!r}")
    model, X, y = logistic_problem()
    lam = np.ones(D)

    rng = np.random.default_rng(seed)
    mu = MEAN_SCALE * rng.standard_normal(D)
    U = 0.5 * rng.standard_normal((D, L))
    d = rng.uniform(0.5, 1.5, D)
    g_bar = rng.standard_normal(D) if t > 0 else np.zeros(D)
    idx = epoch_batches(rng, N, M)[0]
    eps = None if curvature == "exact" else rng.standard_normal((D, S))

    if method == "slang":
        state = slang.init(mu, U, d)
        cfg = slang.SLANGConfig(N=N, lam=lam, L=L, momentum=momentum)
    elif method == "ngvi-full":
        state = ngvi.init_full(mu, lowrank.dense_precision(U, d))
        cfg = ngvi.NGVIConfig(N=N, lam=lam, curvature=curvature, momentum=momentum)
    else:
        state = ngvi.init_meanfield(mu, d + np.sum(U * U, axis=1))
        cfg = ngvi.NGVIConfig(N=N, lam=lam, curvature=curvature, momentum=momentum)
    state = state._replace(g_bar=g_bar, t=t)
    return TraceInputs(method, seed, L, model, X, y, idx, eps, state, cfg)


def step(inputs: TraceInputs):
    """Take the method's step on these inputs: a direct, deterministic call.

    Parameters
    ----------
    inputs : TraceInputs
        From ``make_inputs``.

    Returns
    -------
    state : NamedTuple
        The new state.
    info : NamedTuple
        The step's Info, the traced intermediates.
    """
    return STEPS[inputs.method](inputs.state, inputs.batch, inputs.eps, inputs.cfg, inputs.model)


def _run(method: str):
    def run(seed, steps, dtype, **opts):
        chain = drawn_chain(make_inputs(method, seed=seed, **opts), STEPS[method])
        return run_chain(chain, seed, steps, dtype)
    return run


_OPTIONS = {"S": 1, "curvature": "ef", "M": 8, "L": 2, "momentum": 0.0, "t": 0}
for _m in STEP_METHODS:
    register(Tracer(_m, "derivations/slang.md" if _m == "slang" else "derivations/ngvi.md",
                    _run(_m), dict(_OPTIONS), sign_free=("U",) if _m == "slang" else ()))
