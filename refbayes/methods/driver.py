"""The driver of every iterative method: the only place that draws random numbers.

``run`` walks epochs of shuffled minibatches and calls a pure ``step`` with draws from the
caller's ``numpy.random.Generator``, in this order, so another implementation can replay them
(each method's draws are its record's, ``refbayes.methods.records``)::

  per epoch:  perm = rng.permutation(N); the batches are perm[0:M], perm[M:2M], ... (the last
              one may be shorter; it is scaled by its own M);
  per step, by method:
    ngvi (full, mean field), vogn, vadam, noisy_adam, bbb, ktied:
              eps = rng.standard_normal((D, S)) (none for ngvi's curvature="exact", and none for
              vogn with S = 0, which is OGN: gradient and curvature at the mean);
    slang:    eps as above, then, with eig="randomized",
              Omega = rng.standard_normal((L + M S, L + oversample));
    mc_dropout: one mask per layer input, in layer order, masks[k] = rng.random((M, n_k)) >= p;
    adam (MAP), swag's SGD: nothing.

Draws are made in float64 and cast to the state's dtype. A floating-point overflow or invalid
operation inside a step (NumPy), or non-finite values in the new state, stop the run with a
``TrainingError`` naming the step and epoch, and everything the callback
saw before stays with the caller.

Examples
--------
``run`` takes the epochs of steps of any recorded method, drawing every minibatch and every eps
from the Generator it is given, in the order of the method's record; the same seed gives the
same state, bit for bit:

>>> import numpy as np
>>> from refbayes.datasets import make_logistic_regression
>>> from refbayes.methods import driver, vogn
>>> from refbayes.models import LogisticRegression
>>> data = make_logistic_regression(20, 3, 0)     # N = 20 rows, 3 features, seed 0
>>> model = LogisticRegression(3)                 # D = 4 with the intercept
>>> start = vogn.init(np.zeros(model.D), np.ones(model.D))
>>> cfg = vogn.VOGNConfig(N=20, delta=1.0, alpha=0.1)
>>> def fit(seed):
...     return driver.run(start, cfg, model, data.X, data.y.astype(float),
...                       rng=np.random.default_rng(seed), epochs=3, M=5, S=2)
>>> state = fit(0)
>>> int(state.t), bool(np.array_equal(state.mu, fit(0).mu))   # 3 epochs of 20 / 5 steps
(12, True)
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np

from refbayes._checks import check_array, check_int, unchecked
from refbayes.backend import xp_of
from refbayes.methods.records import draw_masks, record_of
from refbayes.methods._estimates import Batch, model_widths

__all__ = ["TrainingError", "check_data", "check_finite_state", "draw_masks", "epoch_batches",
           "guarded_step", "run"]


class TrainingError(ValueError):
    """A step produced non-finite values; the message names the step and the epoch."""


def epoch_batches(rng: np.random.Generator, N: int, M: int) -> list:
    """Draw one epoch of minibatch index arrays: rng.permutation(N) cut into ceil(N / M) pieces.

    The last piece may be shorter than M.  No validation.

    Parameters
    ----------
    rng : numpy.random.Generator
        Generator owned by the caller.
    N : int
        Number of training rows.
    M : int
        Minibatch size.

    Returns
    -------
    list of numpy.ndarray
        The ceil(N / M) index arrays, in order.
    """
    perm = rng.permutation(N)
    return [perm[i:i + M] for i in range(0, N, M)]


def _arrays(state) -> dict:
    return {name: a for name, a in state._asdict().items() if hasattr(a, "dtype")}


def _finite(state) -> list:
    """The names of the state's array fields, and fields holding a tuple of arrays (K-FAC's
    per-layer factors), that hold a non-finite value."""
    arrays = {name: (a,) if hasattr(a, "dtype") else a for name, a in state._asdict().items()
              if hasattr(a, "dtype") or (isinstance(a, tuple) and a
                                         and all(hasattr(b, "dtype") for b in a))}
    xp = xp_of(*(b for a in arrays.values() for b in a))
    finite = {name: xp.stack([xp.all(xp.isfinite(b)) for b in a]).all()
              for name, a in arrays.items()}
    # one read-back for the whole state (a synchronisation on CuPy); per field only on failure
    if bool(xp.stack(list(finite.values())).all()):
        return []
    return [name for name, ok in finite.items() if not bool(ok)]


def guarded_step(t: int, epoch: int, take_step: Callable[[], Any], checked: bool = True):
    """Run one step with NumPy's floating-point errors raised as a TrainingError.

    Overflow, invalid operations and division by zero inside ``take_step`` become a
    TrainingError naming step t and the epoch; the loops of ``run`` and of the experiments' own
    drivers take their steps through it, checked on their first step and inside
    ``refbayes.unchecked()`` after it (the data checked whole once, ``check_data``; the draws the
    driver's own: the same results, bit for bit).

    Parameters
    ----------
    t : int
        The 1-based number of the step, for the message.
    epoch : int
        The 1-based epoch, for the message.
    take_step : callable
        A zero-argument callable taking the step.
    checked : bool, default True
        False runs take_step inside ``refbayes.unchecked()`` (no value scans of its inputs).

    Returns
    -------
    object
        What take_step returns.

    Raises
    ------
    TrainingError
        If take_step raises FloatingPointError.
    """
    scope = contextlib.nullcontext() if checked else unchecked()
    try:
        with scope, np.errstate(over="raise", invalid="raise", divide="raise"):
            return take_step()
    except FloatingPointError as err:
        raise TrainingError(f"step {t} (epoch {epoch}): {err} in the step; the loss or its "
                            "gradient overflowed (lower the step sizes or check the inputs)"
                            ) from err


def check_data(model, X, y, dtype) -> int:
    """Check a training set whole, once, before a driver's unchecked steps.

    Parameters
    ----------
    model : FlatModel or CNN
        The model whose likelihood the targets are for.
    X : array of shape (N, n_in)
        Training inputs: finite, real, 2-d.
    y : array of shape (N,) or (N, n_out)
        Training targets the likelihood accepts in ``dtype`` (finite values, labels in range).
    dtype : numpy dtype
        The state's dtype.

    Returns
    -------
    int
        N, the rows of X.

    Raises
    ------
    ValueError
        Naming X or y, if either is not as above.
    """
    check_array(X, "X", ndim=2)
    N = X.shape[0]
    model.likelihood.check_targets(y, N, model_widths(model)[1], dtype)
    return N


def check_finite_state(state, t: int, epoch: int) -> None:
    """Refuse a state holding a non-finite value after step t.

    Checks every array field and every field holding a tuple of arrays (K-FAC's per-layer
    factors); CuPy does not raise on overflow, so this is what catches it there.

    Parameters
    ----------
    state : NamedTuple
        A method's State.
    t : int
        The 1-based number of the step just taken, for the message.
    epoch : int
        The 1-based epoch, for the message.

    Raises
    ------
    TrainingError
        Naming the fields that hold NaN or inf.
    """
    bad = _finite(state)
    if bad:
        raise TrainingError(f"step {t} (epoch {epoch}): non-finite values in {', '.join(bad)}; "
                            "the loss or its gradient overflowed (lower the step sizes or check "
                            "the inputs)")


def run(state, cfg, model, X, y, *, rng: np.random.Generator, epochs: int, M: int, S: int = 1,
        oversample: int = 10, callback: Callable[[int, Any], None] | None = None,
        progress: Callable[[int], None] | None = None):
    """Train for ``epochs`` epochs of shuffled minibatches, drawing every random number.

    The draws follow the order in the module docstring, so another implementation can replay
    them. X and y are checked whole once; the first step checks all its inputs, the later ones
    run inside ``refbayes.unchecked()`` (no value scans of the driver's own arrays: the same
    results, bit for bit), and the state is checked finite after every step.

    Parameters
    ----------
    state : NamedTuple
        A method's State: ngvi (full, mean field), slang, vogn, vadam, noisy_adam, bbb, ktied,
        mc_dropout, adam's MAPState, or swag's SGDState.
    cfg : NamedTuple
        The matching Config (a MAPConfig for MAPState, an SGDConfig for SGDState); cfg.N
        must equal N.
    model : FlatModel
        A refbayes.models model with the state's D parameters.
    X : array of shape (N, n_in)
        Training inputs.
    y : array of shape (N,) or (N, n_out)
        Training targets.
    rng : numpy.random.Generator
        Generator owned by the caller; the only source of randomness.
    epochs : int
        Number of epochs, >= 0.
    M : int
        Minibatch size, 1 <= M <= N.
    S : int, default 1
        Monte Carlo draws per step (ignored by ngvi's curvature="exact", mc_dropout,
        adam and SGD); S = 0 runs vogn as OGN and is refused by the other methods.
    oversample : int, default 10
        Oversampling p >= 0 of SLANG's randomized fast_eig.
    callback : callable, optional
        ``callback(epoch, state)`` after every epoch (1-based epoch numbers).
    progress : callable, optional
        ``progress(1)`` after every step (a tqdm ``update``).

    Returns
    -------
    NamedTuple
        The final state, of the type of ``state``.

    Raises
    ------
    ValueError
        If (state, cfg) is not a supported pair, rng is not a numpy.random.Generator, X is
        not a finite real 2-d array, cfg.N differs from N, epochs, M, S or oversample is out
        of range, or the arrays mix NumPy and CuPy; and whatever the method's ``step``
        raises for its inputs.
    TrainingError
        (A ValueError subclass.)  If a step overflows, divides by zero or produces an invalid
        operation (NumPy), or leaves non-finite values in the state; the message names the
        step and the epoch.
    """
    method = record_of(state, cfg)
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng: expected a numpy.random.Generator, got {type(rng).__name__}")
    first = next(iter(_arrays(state).values()))
    dtype = first.dtype
    # every row's targets once (labels in range for a classifier, finite values): the steps
    # after the first skip the value scans
    N = check_data(model, X, y, dtype)
    if cfg.N != N:
        raise ValueError(f"cfg.N: expected the number of rows of X ({N}), got {cfg.N}")
    epochs = check_int(epochs, "epochs", low=0)
    M = check_int(M, "M", low=1, high=N)
    S = check_int(S, "S", low=0 if method.zero_samples else 1)
    oversample = check_int(oversample, "oversample", low=0)
    xp = xp_of(first, X, y)
    taken = 0
    for epoch in range(1, epochs + 1):
        for idx in epoch_batches(rng, N, M):
            idx_x = xp.asarray(idx)
            batch = Batch(X[idx_x], y[idx_x])
            noise, kwargs = method.draws(rng, cfg, model, len(idx), S, oversample, dtype, xp)
            t = state.t + 1  # the step being taken, counted as the state counts them
            # the first step checks everything; the state is checked finite after each step
            # below, the data and the draws are the driver's own: the rest skip the value scans.
            # Overflow inside the step raises here (NumPy); CuPy is caught by the check below
            state, _ = guarded_step(t, epoch, lambda: method.step(state, batch, noise, cfg,
                                                                  model, **kwargs),
                                    checked=taken == 0)
            taken += 1
            check_finite_state(state, t, epoch)
            if progress is not None:
                progress(1)
        if callback is not None:
            callback(epoch, state)
    return state
