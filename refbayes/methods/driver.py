"""The driver of the natural-gradient family: the only place that draws random numbers.

``run`` walks epochs of shuffled minibatches and calls a pure ``step`` (ngvi.step_full,
ngvi.step_meanfield or slang.step) with draws from the caller's ``numpy.random.Generator``,
in this order, so another implementation can replay them:

  per epoch:  perm = rng.permutation(N); the batches are perm[0:M], perm[M:2M], ... (the last
              one may be shorter; it is scaled by its own M);
  per step:   eps = rng.standard_normal((D, S)) (skipped for curvature="exact"), then, for SLANG
              with eig="randomized", Omega = rng.standard_normal((L + M S, L + oversample)).

Draws are made in float64 and cast to the state's dtype. A floating-point overflow or invalid
operation inside a step (NumPy), or non-finite values in the new state, stop the run with a
``TrainingError`` naming the step and epoch, and everything the callback
saw before stays with the caller.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from refbayes._checks import check_array, check_int
from refbayes.backend import xp_of
from refbayes.methods import ngvi, slang
from refbayes.methods._estimates import Batch

__all__ = ["TrainingError", "epoch_batches", "run"]


class TrainingError(ValueError):
    """A step produced non-finite values; the message names the step and the epoch."""


def epoch_batches(rng: np.random.Generator, N: int, M: int) -> list:
    """One epoch of minibatch index arrays: rng.permutation(N) cut into ceil(N / M) pieces."""
    perm = rng.permutation(N)
    return [perm[i:i + M] for i in range(0, N, M)]


def _stepper(state, cfg):
    if isinstance(state, ngvi.FullState) and isinstance(cfg, ngvi.NGVIConfig):
        return ngvi.step_full
    if isinstance(state, ngvi.MeanFieldState) and isinstance(cfg, ngvi.NGVIConfig):
        return ngvi.step_meanfield
    if isinstance(state, slang.SLANGState) and isinstance(cfg, slang.SLANGConfig):
        return slang.step
    raise ValueError("state, cfg: expected (FullState | MeanFieldState, NGVIConfig) or "
                     f"(SLANGState, SLANGConfig), got ({type(state).__name__}, "
                     f"{type(cfg).__name__})")


def _finite(state) -> list:
    xp = xp_of(state.mu)
    return [name for name, a in state._asdict().items()
            if hasattr(a, "dtype") and not bool(xp.all(xp.isfinite(a)))]


def run(state, cfg, model, X, y, *, rng: np.random.Generator, epochs: int, M: int, S: int = 1,
        oversample: int = 10, callback: Callable[[int, Any], None] | None = None,
        progress: Callable[[int], None] | None = None):
    """Train for ``epochs`` epochs; returns the final state.

    X (N, n_in), y (N,) the training set (cfg.N must equal N); M minibatch size; S Monte Carlo
    draws per step (ignored for curvature="exact"); oversample p of the randomized fast_eig.
    ``callback(epoch, state)`` runs after every epoch (1-based epoch numbers); ``progress(n)``
    after every step with n = 1 (a tqdm ``update``).
    """
    step_fn = _stepper(state, cfg)
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng: expected a numpy.random.Generator, got {type(rng).__name__}")
    check_array(X, "X", ndim=2)
    N = X.shape[0]
    if cfg.N != N:
        raise ValueError(f"cfg.N: expected the number of rows of X ({N}), got {cfg.N}")
    epochs = check_int(epochs, "epochs", low=0)
    M = check_int(M, "M", low=1, high=N)
    S = check_int(S, "S", low=1)
    oversample = check_int(oversample, "oversample", low=0)
    xp = xp_of(state.mu, X, y)
    D, dtype = state.mu.shape[0], state.mu.dtype
    exact = getattr(cfg, "curvature", "ef") == "exact"
    randomized = getattr(cfg, "eig", "exact") == "randomized"
    for epoch in range(1, epochs + 1):
        for idx in epoch_batches(rng, N, M):
            idx_x = xp.asarray(idx)
            batch = Batch(X[idx_x], y[idx_x])
            eps = None if exact else xp.asarray(rng.standard_normal((D, S)), dtype=dtype)
            kwargs = {}
            if randomized:
                K = cfg.L + len(idx) * S
                kwargs["Omega"] = xp.asarray(rng.standard_normal((K, cfg.L + oversample)),
                                             dtype=dtype)
            t = state.t + 1  # the step being taken, counted as the state counts them
            try:
                # overflow inside the step raises here (NumPy); CuPy is caught by the check below
                with np.errstate(over="raise", invalid="raise", divide="raise"):
                    state, _ = step_fn(state, batch, eps, cfg, model, **kwargs)
            except FloatingPointError as err:
                raise TrainingError(f"step {t} (epoch {epoch}): {err} in the step; the loss or "
                                    "its gradient overflowed (lower alpha / beta or check the "
                                    "inputs)") from err
            bad = _finite(state)
            if bad:
                raise TrainingError(f"step {t} (epoch {epoch}): non-finite values in "
                                    f"{', '.join(bad)}; the loss or its gradient overflowed "
                                    "(lower alpha / beta or check the inputs)")
            if progress is not None:
                progress(1)
        if callback is not None:
            callback(epoch, state)
    return state
