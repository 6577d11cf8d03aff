"""Data-parallel VOGN over MPI (Osawa et al. 2019's setting): each rank holds a shard of every
minibatch, the ranks share the draws, and one Allreduce of the row-weighted sums per step makes
the step equal the one-process step on the whole minibatch.

Run under ``mpiexec -n R python your_script.py`` with the optional extra ``mpi`` (``mpi4py`` and
the ``mpich`` wheel, whose ``mpiexec`` lands in the environment's ``bin``: ``pip install
"refbayes[mpi]"`` is the whole setup).

Draws: decided, every rank holds a Generator built from the same seed and draws everything the
one-process driver draws, in its order (``driver.epoch_batches``, then each step's eps), and
keeps its shard ``numpy.array_split(idx, R)[rank]`` of each minibatch's rows. Nothing is
broadcast: the draws cost every rank the same few microseconds, while a broadcast of eps would
cost D S floats of communication per step; and the trajectory is then the one-process
``driver.run`` trajectory for the same seed (tested under ``mpiexec -n 2`` and ``-n 3`` with
unequal shards: equal to rounding). Shards may be unequal (M not a multiple of R): the reduction
weights each rank by its rows (vogn.6), so unequal shards are still the one-process step, where
the plain average of the ranks' means would not be.

Reduction (vogn.6): rank w sends [M_w ghat_w, M_w hhat_w, M_w] (its sums, not its means), one
``Allreduce(SUM)`` of 2 D + 1 floats, and every rank divides by M = sum_w M_w; then every rank
applies the same update (vogn.7)-(vogn.9) to its own copy of the state, so the copies stay equal.

Examples
--------
Each rank keeps its shard of every minibatch the shared Generator draws (M = 5 rows on R = 2
ranks: unequal shards are fine):

>>> import numpy as np
>>> from refbayes.methods import vogn_mpi
>>> idx = np.random.default_rng(0).choice(20, size=5, replace=False)
>>> [vogn_mpi.shard(idx, rank, 2).shape for rank in range(2)]
[(3,), (2,)]

A script run as ``mpiexec -n 2 python fit.py`` (needs the ``mpi`` extra) takes the same steps
as ``driver.run`` with the same seed::

    state = vogn_mpi.run(start, cfg, model, X, y, rng=np.random.default_rng(0), epochs=3, M=5, S=2)
"""
from __future__ import annotations

import contextlib

import numpy as np

from refbayes._checks import check_array, check_int, unchecked
from refbayes.methods import driver, records, vogn
from refbayes.methods._estimates import Batch

__all__ = ["MPI_HINT", "shard", "reduce_estimates", "step", "run"]

MPI_HINT = 'pip install "refbayes[mpi]"'


def _mpi():
    try:
        from mpi4py import MPI
    except ImportError as err:
        raise ValueError(f"vogn_mpi needs mpi4py and an MPI library ({err}); install them with: "
                         f"{MPI_HINT}") from None
    return MPI


def shard(idx, rank: int, size: int):
    """Return this rank's rows of a minibatch: ``numpy.array_split(idx, size)[rank]``.

    Parameters
    ----------
    idx : array of shape (M,)
        The minibatch's row indices, M >= size.
    rank : int
        This rank, in [0, size).
    size : int
        The number of ranks, >= 1.

    Returns
    -------
    numpy.ndarray
        The rank's indices: the first M mod size ranks hold one row more than the others.

    Raises
    ------
    ValueError
        If size or rank is out of range, or the minibatch has fewer rows than ranks.
    """
    size = check_int(size, "size", low=1)
    rank = check_int(rank, "rank", low=0, high=size - 1)
    if len(idx) < size:
        raise ValueError(f"M: expected at least one row per rank ({size}), got a minibatch of "
                         f"{len(idx)}")
    return np.array_split(np.asarray(idx), size)[rank]


def reduce_estimates(est: vogn.Estimates, comm) -> vogn.Estimates:
    """Reduce every rank's Estimates to their row-weighted mean with one Allreduce.

    Parameters
    ----------
    est : vogn.Estimates
        This rank's (g_hat (D,), h_hat (D,), M_w), from ``vogn.local_estimates``.
    comm : mpi4py.MPI.Comm
        The communicator of the ranks.

    Returns
    -------
    vogn.Estimates
        (sum_w M_w g_hat_w / M, sum_w M_w h_hat_w / M, M), M = sum_w M_w, on every rank
        (vogn.6).
    """
    MPI = _mpi()
    D = est.g_hat.shape[0]
    buf = np.concatenate([est.M * np.asarray(est.g_hat), est.M * np.asarray(est.h_hat),
                          [float(est.M)]]).astype(np.float64)
    comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)  # (vogn.6): the row-weighted sums
    M = buf[-1]
    dtype = np.asarray(est.g_hat).dtype
    return vogn.Estimates((buf[:D] / M).astype(dtype), (buf[D:2 * D] / M).astype(dtype),
                          int(round(M)))


def step(state: vogn.VOGNState, batch, eps, cfg: vogn.VOGNConfig, model, comm):
    """Take one data-parallel VOGN step from this rank's rows.

    Parameters
    ----------
    state : vogn.VOGNState
        The state, the same on every rank.
    batch : Batch
        This rank's rows of the minibatch.
    eps : array of shape (D, S) or None
        The draws, the same on every rank (None: OGN).
    cfg : vogn.VOGNConfig
        Hyperparameters.
    model : FlatModel
        The model.
    comm : mpi4py.MPI.Comm
        The communicator of the ranks.

    Returns
    -------
    state : vogn.VOGNState
        The new state (the same on every rank).
    info : vogn.VOGNInfo
        The update's intermediates (vogn.apply's: no per-draw g_k, h_k).
    """
    est = vogn.local_estimates(state, batch, eps, cfg, model)  # (vogn.4), (vogn.5)
    total = reduce_estimates(est, comm)
    return vogn.apply(state, total.g_hat, total.h_hat, cfg)  # (vogn.7)-(vogn.9)


def run(state: vogn.VOGNState, cfg: vogn.VOGNConfig, model, X, y, *, rng: np.random.Generator,
        epochs: int, M: int, S: int = 1, comm=None) -> vogn.VOGNState:
    """Train VOGN data-parallel over the ranks of ``comm``: ``driver.run``'s trajectory.

    Every rank calls it with the same arguments (the same data, and a Generator from the same
    seed); each computes on its shard of every minibatch.

    Parameters
    ----------
    state : vogn.VOGNState
        The starting state.
    cfg : vogn.VOGNConfig
        Hyperparameters; cfg.N must equal N.
    model : FlatModel
        The model.
    X : array of shape (N, n_in)
        Training inputs (every rank holds them; each reads only its rows).
    y : array of shape (N,) or (N, n_out)
        Training targets.
    rng : numpy.random.Generator
        The same seed on every rank; draws as ``driver.run`` does.
    epochs : int
        Number of epochs, >= 0.
    M : int
        Minibatch size, R <= M <= N (R ranks).
    S : int, default 1
        Monte Carlo draws per step; 0 runs OGN.
    comm : mpi4py.MPI.Comm, optional
        Default ``MPI.COMM_WORLD``.

    Returns
    -------
    vogn.VOGNState
        The final state (the same on every rank).

    Raises
    ------
    ValueError
        If mpi4py is missing, rng is not a Generator, cfg.N differs from N, M is below the
        number of ranks or above N, or epochs or S is out of range; and whatever the step raises.
    """
    MPI = _mpi()
    comm = MPI.COMM_WORLD if comm is None else comm
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng: expected a numpy.random.Generator, got {type(rng).__name__}")
    N = X.shape[0]
    if cfg.N != N:
        raise ValueError(f"cfg.N: expected the number of rows of X ({N}), got {cfg.N}")
    epochs = check_int(epochs, "epochs", low=0)
    M = check_int(M, "M", low=comm.Get_size(), high=N)
    S = check_int(S, "S", low=0)
    rank, size = comm.Get_rank(), comm.Get_size()
    check_array(X, "X", ndim=2)
    # every row's targets once (labels in range for a classifier, finite values): the steps
    # after the first skip the value scans
    model.likelihood.check_targets(y, N, model.sizes[-1], state.mu.dtype)
    taken = 0
    draws = records.get_record("vogn").draws  # the driver's draws of one VOGN step
    for _ in range(epochs):
        for idx in driver.epoch_batches(rng, N, M):
            eps, _ = draws(rng, cfg, model, len(idx), S, 0, state.mu.dtype, np)
            mine = shard(idx, rank, size)
            with contextlib.nullcontext() if taken == 0 else unchecked():
                state, _ = step(state, Batch(X[mine], y[mine]), eps, cfg, model, comm)
            taken += 1
    return state
