"""Traces of Noisy K-FAC and K-FAC (noisy-kfac, kfac): K chained ``noisy_kfac.step``s (default
2) from drawn non-identity factors, K-FAC being the same steps with eps = None.

A step preconditions with the factors of the last refresh and only then refreshes (the official
code's order, not Algorithm 2's: ``ORDER_NOTE``), so the curvature statistics reach P from step
2 on.

The problem, the config, the draws, their order and the sampling map are in
``derivations/tracing.md``.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from refbayes._checks import check_in_range, check_int
from refbayes.linalg import kron
from refbayes.methods import Batch, noisy_kfac
from refbayes.methods.driver import epoch_batches
from refbayes.tracing.chain import Chain, run_chain
from refbayes.tracing.problems import MEAN_SCALE, MODELS, mlp_problem, problem_of
from refbayes.tracing.tracer import Tracer, one_of, register

__all__ = ["KFAC_METHODS", "NoisyKFACTraceInfo", "NoisyKFACTraceInputs", "make_noisy_kfac_inputs",
           "noisy_kfac_chain", "trace_noisy_kfac"]

KFAC_METHODS = ("noisy-kfac", "kfac")  # kfac: noisy_kfac.step with eps = None
# A config in which every hyperparameter is distinct from 1 and from the others' misreadings
# (gamma_in = 0.5 / (50 * 0.2) = 0.05).
NK_CONFIG = {"eta": 0.2, "kl_weight": 0.5, "alpha": 0.1, "beta": 0.2, "momentum": 0.9,
             "gamma_ex": 0.01, "T_stats": 1, "T_inv": 1}
NK_MOMENTUM_SCALE = 0.05  # m = NK_MOMENTUM_SCALE * rng.standard_normal(D): about |P|'s entries


class NoisyKFACTraceInfo(NamedTuple):
    """The named intermediates of ``refbayes trace noisy-kfac`` (and ``kfac``), in output order.

    The fields w .. nu are those of ``noisy_kfac.NoisyKFACInfo`` (for K-FAC w is the mean as one
    column; nu = min(1, sqrt(kl_clip / (alpha^2 <V, P>))) is already applied to P); A and S are
    the new state's running factors, also its new A_ref, S_ref (T_inv = 1). pi is the
    factored-damping split sqrt((tr A_ref / (n_in + 1)) / (tr S_ref / n_out)) of each layer, of
    the A_ref, S_ref the step starts with: the split of its sampler and of its mean step's solve
    alike. Per step; the trace adds the new state's A_ref, S_ref and t (``state.*``).
    """
    pi: Any      # damping split per layer, (L,), or None for exact damping (noisy_kfac.5)
    w: Any       # draws, (D, S) (noisy_kfac.7)
    V: Any       # gradient at the draws + gamma_in w, (D,) (noisy_kfac.8)
    P: Any       # preconditioned gradient, (D,) (noisy_kfac.9)
    m: Any       # new momentum buffer, (D,) (noisy_kfac.11)
    mu: Any      # new mean, (D,) (noisy_kfac.11)
    A_hat: Any   # minibatch input statistics, per layer (noisy_kfac.3)
    S_hat: Any   # minibatch output statistics, per layer (noisy_kfac.3)
    nu: Any      # KL-clipping factor applied to P, 1 without clipping (noisy_kfac.10)
    A: Any       # running A_l after the step, (n_in + 1, n_in + 1) each (noisy_kfac.4)
    S: Any       # running S_l after the step, (n_out, n_out) each (noisy_kfac.4)


class NoisyKFACTraceInputs(NamedTuple):
    """Everything one traced Noisy K-FAC (or K-FAC) step consumes, and how it was drawn.
    """
    method: str       # "noisy-kfac" | "kfac"
    seed: int         # of numpy.random.default_rng, the only source of the draws
    model: Any        # MLP([5, 4, 2], "tanh", "categorical"), D = 34 (or the tiny CNN, D = 47)
    X: np.ndarray     # (N, 5) the shipped training set (the tiny CNN's: (N, 36) images)
    y: np.ndarray     # (N,) class labels in {0, 1} (the tiny CNN's: {0, 1, 2})
    idx: np.ndarray   # (M,) minibatch rows, rng.permutation(N)[:M]
    eps: Any          # (D, S) standard-normal draws, or None for kfac
    u: Any            # (S, M) uniforms of the sampled labels, or None
    probs: Any        # (S, M, C) the predictive at the draws, or None
    y_tilde: Any      # (S, M) sampled labels, or None
    state: Any        # NoisyKFACState
    cfg: Any          # NoisyKFACConfig

    @property
    def batch(self) -> Batch:
        return Batch(self.X[self.idx], self.y[self.idx])


def _spd_factor(rng, n: int) -> np.ndarray:
    """B B^T / n + I / 2 with B = rng.standard_normal((n, n)): SPD, eigenvalues >= 1/2."""
    B = rng.standard_normal((n, n))
    return B @ B.T / n + 0.5 * np.eye(n)


def _sampled_labels(probs, u):
    """y[s, i] = min(#{c : cumsum(probs[s, i])_c <= u[s, i]}, C - 1): the inverse CDF."""
    C = probs.shape[-1]
    count = np.sum(np.cumsum(probs, axis=-1) <= u[..., None], axis=-1)
    return np.minimum(count, C - 1).astype(np.int64)


def _labels(rng, state, eps, cfg, model, X_B) -> dict:
    """The sampled labels of curvature "mc" after the step's eps (``derivations/tracing.md``):
    u = rng.random((S, M)), then the inverse CDF of the predictive at the step's own draws w
    (the mean for kfac)."""
    S = 1 if eps is None else eps.shape[1]
    u = rng.random((S, X_B.shape[0]))
    w = state.mu[:, None] if eps is None else noisy_kfac.sample(state, eps, cfg, model)
    probs = np.stack([model.predict(w[:, s], X_B) for s in range(S)])
    return {"u": u, "probs": probs, "y_tilde": _sampled_labels(probs, u)}


def make_noisy_kfac_inputs(method: str, *, seed: int = 0, M: int = 8, S: int | None = None,
                           curvature: str = "ggn", damping: str = "factored",
                           kl_clip: float | None = None,
                           model: str | None = None) -> NoisyKFACTraceInputs:
    """Build the problem, the starting state and the draws of one traced Noisy K-FAC step.

    The draws are made in the order of ``derivations/tracing.md``; kfac draws no eps and takes
    S = 1.

    Parameters
    ----------
    method : {"noisy-kfac", "kfac"}
        The traced step (kfac: eps = None).
    seed : int, default 0
        Seed of ``numpy.random.default_rng``.
    M : int, default 8
        Minibatch rows, in [1, N].
    S : int or None, default None
        Draws of the weights, >= 1 (None: 2); kfac draws none and takes None or 1.
    curvature : {"ggn", "ef", "mc"}, default "ggn"
        Output-factor statistics; "mc" draws the sampled labels.
    damping : {"factored", "exact"}, default "factored"
        The damping of the sampler and the solve.
    kl_clip : float or None, default None
        The KL-clipping bound kappa > 0 (noisy_kfac.10), or None for no clipping.
    model : str or None, default None
        None: the shipped MLP problem; "tiny-cnn": the tiny-CNN problem
        (``problems.cnn_problem``; a conv layer's A_l is (C_in k_h k_w + 1) square).

    Returns
    -------
    NoisyKFACTraceInputs
        The problem, state, config and draws.

    Raises
    ------
    ValueError
        If method is not noisy-kfac or kfac, or an option is outside its range.
    """
    if method not in KFAC_METHODS:
        raise ValueError(f"method: expected one of {', '.join(KFAC_METHODS)}, got {method!r}")
    seed = check_int(seed, "seed", low=0)
    net, X, y = problem_of(model, mlp_problem)
    N = X.shape[0]
    M = check_int(M, "M", low=1, high=N)
    if method == "kfac":
        if S not in (None, 1):
            raise ValueError(f"S: kfac draws no weights (eps = None, S = 1), got {S!r}")
        S = 1
    else:
        S = check_int(2 if S is None else S, "S", low=1)
    curvature = one_of(curvature, "curvature", noisy_kfac.CURVATURES, method)
    damping = one_of(damping, "damping", noisy_kfac.DAMPINGS, method)
    if kl_clip is not None:
        kl_clip = check_in_range(kl_clip, "kl_clip", 0.0, math.inf, low_open=True,
                                 high_open=True)
    model = net
    cfg = noisy_kfac.NoisyKFACConfig(N, damping=damping, curvature=curvature, kl_clip=kl_clip,
                                     **NK_CONFIG)
    blocks = noisy_kfac.layer_slices(model)
    D = model.D

    rng = np.random.default_rng(seed)
    mu = MEAN_SCALE * rng.standard_normal(D)
    m = NK_MOMENTUM_SCALE * rng.standard_normal(D)
    A = tuple(_spd_factor(rng, n_in) for _, _, n_in, _ in blocks)
    Sf = tuple(_spd_factor(rng, n_out) for _, _, _, n_out in blocks)
    idx = epoch_batches(rng, N, M)[0]
    eps = rng.standard_normal((D, S)) if method == "noisy-kfac" else None
    state = noisy_kfac.NoisyKFACState(mu, m, A, Sf, A, Sf, 0)
    u = probs = y_tilde = None
    if curvature == "mc":
        u, probs, y_tilde = _labels(rng, state, eps, cfg, model, X[idx]).values()
    return NoisyKFACTraceInputs(method, seed, model, X, y, idx, eps, u, probs, y_tilde, state,
                                cfg)


def _traced_step(state, batch, eps, cfg, model, u=None, probs=None, y_tilde=None):
    """One ``noisy_kfac.step`` as traced: (new state, NoisyKFACTraceInfo).

    u and probs are recorded inputs that the step does not take (y_tilde is made from them).
    The new state's ``inv`` (a cache of the refreshed factors' decompositions, no quantity of
    its own) is dropped; the next step recomputes it from A_ref, S_ref.
    """
    new, info = noisy_kfac.step(state, batch, eps, cfg, model, y_tilde=y_tilde)
    pi = None
    if cfg.damping == "factored":
        pi = np.array([kron.factored_damping_pi(A, S)  # (noisy_kfac.5)
                       for A, S in zip(state.A_ref, state.S_ref)], dtype=state.mu.dtype)
    return new._replace(inv=None), NoisyKFACTraceInfo(pi, *info, A=new.A, S=new.S)


def trace_noisy_kfac(inputs: NoisyKFACTraceInputs) -> NoisyKFACTraceInfo:
    """Take the traced step by a direct call of ``noisy_kfac.step``, and collect its intermediates.

    pi from ``linalg.kron.factored_damping_pi`` of the state's A_ref, S_ref (factored damping):
    the split of this step's sampler (noisy_kfac.7) and of its mean step's solve (noisy_kfac.9)
    alike, both with the factors of the last refresh; w .. nu are the step's
    ``NoisyKFACInfo``; A and S the new state's running factors.

    Parameters
    ----------
    inputs : NoisyKFACTraceInputs
        From ``make_noisy_kfac_inputs``.

    Returns
    -------
    NoisyKFACTraceInfo
        The intermediates, in the trace's output order.
    """
    return _traced_step(inputs.state, inputs.batch, inputs.eps, inputs.cfg, inputs.model,
                        y_tilde=inputs.y_tilde)[1]


def noisy_kfac_chain(inputs: NoisyKFACTraceInputs) -> Chain:
    """Chain K traced steps from ``inputs`` (its step 1).

    Steps k + 1 >= 2 draw the minibatch, eps (noisy-kfac) and for curvature "mc" the labels at
    their own draws, from ``default_rng([seed, k])`` (``derivations/tracing.md``).

    Parameters
    ----------
    inputs : NoisyKFACTraceInputs
        From ``make_noisy_kfac_inputs``.

    Returns
    -------
    Chain
        Ready for ``run_chain``.
    """
    eps, cfg, model = inputs.eps, inputs.cfg, inputs.model

    def draws(rng, M):
        return (None if eps is None else rng.standard_normal(eps.shape)), {}

    def labels(rng, state, X_B, noise):
        return _labels(rng, state, noise, cfg, model, X_B)

    first = {} if inputs.y_tilde is None else {"u": inputs.u, "probs": inputs.probs,
                                               "y_tilde": inputs.y_tilde}
    return Chain(inputs.state, cfg, model, inputs.X, inputs.y, len(inputs.idx), _traced_step,
                 draws, None, first=(inputs.idx, eps, first),
                 labels=labels if cfg.curvature == "mc" else None)


def _run(method: str):
    def run(seed, steps, dtype, **options):
        inputs = make_noisy_kfac_inputs(method, seed=seed, **options)
        return run_chain(noisy_kfac_chain(inputs), seed, steps, dtype)
    return run


_OPTIONS = {"curvature": "ggn", "M": 8, "damping": "factored", "kl_clip": None}
# Two steps by default: step 1 preconditions with the drawn factors (the last refresh), so its
# P, m and mu do not depend on the curvature; step 2 preconditions with step 1's refresh.
# The update order, as the printed trace and the manifest state it (derivations/noisy_kfac.md, C4).
ORDER_NOTE = ("each step samples w and preconditions V (P, m, mu) with the factors of the LAST "
              "refresh (the drawn A_ref, S_ref at step 1; step k's refresh at step k + 1), and "
              "only then takes the statistics A_hat, S_hat at w, updates A, S and refreshes "
              "(T_inv = 1): the official code's order, not Algorithm 2's (factors and inverses "
              "updated before the mean step), so step k's own A_hat, S_hat reach P only at "
              "step k + 1; pi is the split of the step's sampler and of its mean step alike")
register(Tracer("noisy-kfac", "derivations/noisy_kfac.md", _run("noisy-kfac"),
                {"S": 2, **_OPTIONS}, default_steps=2, note=ORDER_NOTE, models=MODELS))
register(Tracer("kfac", "derivations/noisy_kfac.md", _run("kfac"), dict(_OPTIONS),
                default_steps=2, note=ORDER_NOTE, models=MODELS))
