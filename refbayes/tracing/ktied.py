"""The k-tied Normal trace (ktied): ``ktied.step`` from ``ktied.init`` with a drawn mean and a
jitter, chained to K steps.

The problem, the layout, the config, the draws and their order are in
``derivations/tracing.md``.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from refbayes._checks import check_int
from refbayes.methods import Batch, ktied
from refbayes.methods.driver import epoch_batches
from refbayes.tracing.chain import drawn_chain, run_chain
from refbayes.tracing.problems import KT_ROWS, MEAN_SCALE, MODELS, ktied_problem, problem_of
from refbayes.tracing.tracer import Tracer, register

__all__ = ["KTiedTraceInputs", "make_ktied_inputs"]

KT_LAM = 1.0
KT_SIGMA0 = 0.3  # ktied.init's sigma0: U_l V_l^T = sigma0 before the jitter
# ktied.init's jitter, well above its default 0.1, so that the k columns of each U_l, V_l differ
# visibly (equal columns hide a transposed or mis-sliced factor)
KT_JITTER = 0.5


class KTiedTraceInputs(NamedTuple):
    """Everything one traced k-tied step consumes, and how it was drawn.
    """
    method: str       # "ktied"
    seed: int         # of numpy.random.default_rng, the only source of the draws
    model: Any        # MLP([4, 5, 3], "tanh", "categorical"), D = 43 (or the tiny CNN, D = 47)
    X: np.ndarray     # (N, 4) the recipe's inputs
    y: np.ndarray     # (N,) class labels in {0, 1, 2}
    xi: np.ndarray    # (P,) the start's jitter draws (ktied.8)
    idx: np.ndarray   # (M,) minibatch rows, rng.permutation(N)[:M]
    eps: np.ndarray   # (D, S) standard-normal draws
    state: Any        # KTiedState
    cfg: Any          # KTiedConfig

    @property
    def batch(self) -> Batch:
        return Batch(self.X[self.idx], self.y[self.idx])

    @property
    def layout(self):
        """``ktied.layout(model, state.k)``: where R^U_l, R^V_l, r^b_l sit in rho."""
        return ktied.layout(self.model, self.state.k)


def make_ktied_inputs(method: str = "ktied", *, seed: int = 0, M: int = 8, S: int = 1,
                      k: int = 2, model: str | None = None) -> KTiedTraceInputs:
    """Build the problem, the starting state and the draws of one traced k-tied step.

    The draws are made in the order of ``derivations/tracing.md``: mu, xi (the start), idx,
    eps.

    Parameters
    ----------
    method : {"ktied"}, default "ktied"
        The traced step.
    seed : int, default 0
        Seed of ``numpy.random.default_rng``.
    M : int, default 8
        Minibatch rows, in [1, N].
    S : int, default 1
        Monte Carlo draws, >= 1.
    k : int, default 2
        The rank of every layer's tie, >= 1.
    model : str or None, default None
        None for the shipped MLP problem, or "tiny-cnn" (``problems.MODELS``): the tiny CNN on
        its synthetic images, each conv kernel tied as its im2col matrix (ktied.16).

    Returns
    -------
    KTiedTraceInputs
        The problem, state, config and draws.

    Raises
    ------
    ValueError
        If method is not ktied, an option is outside its range, or model is not one of
        ``problems.MODELS``.
    """
    if method != "ktied":
        raise ValueError(f"method: expected 'ktied', got {method!r}")
    seed = check_int(seed, "seed", low=0)
    net, X, y = problem_of(model, ktied_problem)
    N = KT_ROWS if model is None else X.shape[0]
    M = check_int(M, "M", low=1, high=N)
    S = check_int(S, "S", low=1)
    k = check_int(k, "k", low=1)
    lay = ktied.layout(net, k)
    cfg = ktied.KTiedConfig(N=N, lam=KT_LAM)

    rng = np.random.default_rng(seed)
    mu = MEAN_SCALE * rng.standard_normal(lay.D)
    xi = rng.standard_normal(lay.P)
    state = ktied.init(mu, net, k, sigma0=KT_SIGMA0, xi=xi, jitter=KT_JITTER)  # (ktied.8)
    idx = epoch_batches(rng, N, M)[0]
    eps = rng.standard_normal((lay.D, S))
    return KTiedTraceInputs(method, seed, net, X, y, xi, idx, eps, state, cfg)


def _run(seed, steps, dtype, **options):
    return run_chain(drawn_chain(make_ktied_inputs(seed=seed, **options), ktied.step), seed,
                     steps, dtype)


register(Tracer("ktied", "derivations/ktied.md", _run, {"S": 1, "M": 8, "k": 2}, models=MODELS))
