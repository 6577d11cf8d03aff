"""The SWAG trace (swag): T momentum-SGD steps from a drawn start, a snapshot collected after
each, then the SWAG and SWAG-Diagonal Gaussians, their draws and their log densities.

The problem, the draws and their order are in ``derivations/tracing.md``.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from refbayes._checks import check_in_range, check_int
from refbayes.methods import Batch, swag
from refbayes.methods.driver import epoch_batches
from refbayes.tracing.chain import fit_arrays
from refbayes.tracing.problems import MEAN_SCALE, MODELS, logistic_problem, problem_of
from refbayes.tracing.tracer import Tracer, register

__all__ = ["SWAGTraceInfo", "SWAGTraceInputs", "make_swag_inputs", "trace_swag"]

# The prior precision lam as weight decay, and SWAG-Diagonal at the paper's scale 1.
SWAG_LAM = 1.0
SWAG_DIAG_SCALE = 1.0


class SWAGTraceInfo(NamedTuple):
    """The named intermediates of ``refbayes trace swag``, in the trace's output order.

    The first six are stacked over the T steps: row t belongs to step t + 1 (its SGDInfo and the
    SWAGInfo of the collection after it); the last row of theta_bar is theta_SWA, the first dev
    is zero. z2's row j multiplies the j-th oldest deviation.
    """
    g: Any             # (N / M) sum_{i in B} grad l_i(theta_t) + lam theta_t, (T, D)  (swag.10)
    v: Any             # v_{t+1} = momentum v_t + g, (T, D)  (swag.11)
    theta: Any         # theta_{t+1} = theta_t - alpha v_{t+1}, the snapshots, (T, D)  (swag.11)
    theta_bar: Any     # theta_bar_n after each collection, (T, D)  (swag.1)
    theta2_bar: Any    # running second moment after each collection, (T, D)  (swag.2)
    dev: Any           # theta_n - theta_bar_n, (T, D)  (swag.3)
    Sigma_diag: Any    # max(theta2_bar - theta_bar^2, var_clamp), (D,)  (swag.4)
    D_hat: Any         # the last K' deviations as columns, oldest first, (D, K')  (swag.3)
    Sigma: Any         # scale (Sigma_diag + D_hat D_hat^T / (K' - 1)), (D, D)  (swag.6)
    theta_s: Any       # SWAG draws from z1, z2, (D, S)  (swag.7)
    log_q: Any         # log q(theta_s), (S,)  (swag.9)
    theta_s_diag: Any  # SWAG-Diagonal draws from z1 at scale 1, (D, S)  (swag.7)
    log_q_diag: Any    # SWAG-Diagonal log q(theta_s_diag), (S,)  (swag.9)


class SWAGTraceInputs(NamedTuple):
    """Everything ``refbayes trace swag`` consumes, and how it was drawn.
    """
    method: str          # "swag"
    seed: int            # of numpy.random.default_rng, the only source of the draws
    model: Any           # LogisticRegression(5), D = 6 (or the tiny CNN, D = 47)
    X: np.ndarray        # (N, 5) the shipped training set (the tiny CNN's: (N, 36) images)
    y: np.ndarray        # (N,) labels in {0, 1} (the tiny CNN's: int64 in {0, 1, 2})
    theta0: np.ndarray   # (D,) the start
    idx: np.ndarray      # (T, M) minibatch rows, row t for step t + 1
    z1: np.ndarray       # (D, S)
    z2: np.ndarray       # (K', S)
    sgd: Any             # swag.SGDConfig
    cfg: Any             # swag.SWAGConfig

    @property
    def diag_cfg(self):
        """The SWAG-Diagonal config: cfg at scale SWAG_DIAG_SCALE."""
        return self.cfg._replace(scale=SWAG_DIAG_SCALE)

    def batch(self, t: int) -> Batch:
        """The minibatch of step t + 1 (row t of idx)."""
        return Batch(self.X[self.idx[t]], self.y[self.idx[t]])


def _check_at_least_two(n, name: str) -> int:
    n = check_int(n, name)
    if n < 2:
        raise ValueError(f"{name}: expected an integer in [2, inf) (the low-rank covariance "
                         f"divides by K' - 1, K' = min(steps, K)), got {n}")
    return n


def make_swag_inputs(*, seed: int = 0, steps: int = 6, M: int = 8, S: int = 2, K: int = 4,
                     scale: float = 0.5, alpha: float = 2e-3,
                     momentum: float = 0.9, model: str | None = None) -> SWAGTraceInputs:
    """Build the problem, the configs and the draws of the SWAG trace.

    The draws are made in the order of ``derivations/tracing.md``.

    Parameters
    ----------
    seed : int, default 0
        Seed of ``numpy.random.default_rng``.
    steps : int, default 6
        SGD steps T, each followed by a collection, >= 2.
    M : int, default 8
        Minibatch rows, in [1, N].
    S : int, default 2
        Draws of each Gaussian, >= 1.
    K : int, default 4
        Deviation buffer size, >= 2.
    scale : float, default 0.5
        SWAG's covariance multiplier, > 0 (SWAG-Diagonal uses SWAG_DIAG_SCALE).
    alpha : float, default 2e-3
        SGD step size on the summed objective, > 0 (torch lr = N alpha).
    momentum : float, default 0.9
        Heavy-ball momentum, in [0, 1).
    model : str or None, default None
        None: the shipped logistic regression (D = 6); "tiny-cnn": the tiny-CNN problem
        (``problems.cnn_problem``, D = 47).

    Returns
    -------
    SWAGTraceInputs
        The problem, start, minibatches, draws and configs.

    Raises
    ------
    ValueError
        If an option is outside its range.
    """
    seed = check_int(seed, "seed", low=0)
    net, X, y = problem_of(model, logistic_problem)
    N, D = X.shape[0], net.D
    steps = _check_at_least_two(steps, "steps")
    M = check_int(M, "M", low=1, high=N)
    S = check_int(S, "S", low=1)
    K = _check_at_least_two(K, "K")
    scale = check_in_range(scale, "scale", 0.0, math.inf, low_open=True, high_open=True)
    alpha = check_in_range(alpha, "alpha", 0.0, math.inf, low_open=True, high_open=True)
    momentum = check_in_range(momentum, "momentum", 0.0, 1.0, high_open=True)
    sgd = swag.SGDConfig(N=N, lam=SWAG_LAM, alpha=alpha, momentum=momentum)
    cfg = swag.SWAGConfig(K=K, scale=scale)

    rng = np.random.default_rng(seed)
    theta0 = MEAN_SCALE * rng.standard_normal(D)
    idx = np.stack([epoch_batches(rng, N, M)[0] for _ in range(steps)])
    z1 = rng.standard_normal((D, S))
    z2 = rng.standard_normal((min(steps, K), S))
    return SWAGTraceInputs("swag", seed, net, X, y, theta0, idx, z1, z2, sgd, cfg)


def trace_swag(inputs: SWAGTraceInputs) -> SWAGTraceInfo:
    """Run the SWAG trace by direct calls of refbayes.methods.swag.

    ``sgd_init`` and ``init`` at theta0; per step ``sgd_step`` then ``collect`` of the new
    iterate; then ``diag_variance``, ``deviations``, ``dense_covariance``, ``sample`` and
    ``log_density`` (SWAG, cfg) and ``sample`` and ``log_density`` without the low-rank term
    (SWAG-Diagonal, ``inputs.diag_cfg``).

    Parameters
    ----------
    inputs : SWAGTraceInputs
        From ``make_swag_inputs``.

    Returns
    -------
    SWAGTraceInfo
        The intermediates, in the trace's output order.
    """
    model, cfg, diag = inputs.model, inputs.cfg, inputs.diag_cfg
    opt = swag.sgd_init(inputs.theta0.copy())
    state = swag.init(inputs.theta0, cfg)
    per_step = {f: [] for f in swag.SGDInfo._fields + swag.SWAGInfo._fields}
    for t in range(inputs.idx.shape[0]):
        opt, sgd_info = swag.sgd_step(opt, inputs.batch(t), None, inputs.sgd, model)
        state, swag_info = swag.collect(state, opt.theta, cfg)
        for f, value in (sgd_info._asdict() | swag_info._asdict()).items():
            per_step[f].append(np.array(value))  # a copy: collect's dev is a view of its buffer
    theta_s = swag.sample(state, inputs.z1, inputs.z2, cfg)
    theta_s_diag = swag.sample(state, inputs.z1, None, diag)
    return SWAGTraceInfo(
        **{f: np.stack(rows) for f, rows in per_step.items()},
        Sigma_diag=swag.diag_variance(state, cfg),
        D_hat=swag.deviations(state),
        Sigma=swag.dense_covariance(state, cfg),
        theta_s=theta_s,
        log_q=swag.log_density(state, theta_s, cfg),
        theta_s_diag=theta_s_diag,
        log_q_diag=swag.log_density(state, theta_s_diag, diag, low_rank=False))


def _run(seed, steps, dtype, **options):
    inputs = make_swag_inputs(seed=seed, steps=steps, **options)
    if dtype == "float32":  # the data, the start and the draws rounded (made in float64)
        inputs = inputs._replace(**{f: getattr(inputs, f).astype(np.float32)
                                    for f in ("X", "y", "theta0", "z1", "z2")
                                    if getattr(inputs, f).dtype.kind == "f"})
    return fit_arrays(inputs, trace_swag(inputs), configs=("cfg", "sgd"),
                      names={"theta0": "input.state.theta", "z1": "input.eps.z1",
                             "z2": "input.eps.z2"})


register(Tracer("swag", "derivations/swag.md", _run,
                {"S": 2, "M": 8, "momentum": 0.9, "K": 4, "scale": 0.5, "alpha": 2e-3},
                default_steps=6, models=MODELS))
