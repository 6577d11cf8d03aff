"""Fixed-seed benchmark inputs, cached per process, and the backend switch.

``setup`` methods raise ``NotImplementedError`` to make asv skip a parameter combination (no CuPy,
or a dense reference too large to form); ``sync`` waits for the GPU so a timing covers the work.
"""
import functools

import numpy as np

from refbayes.backend import cupy_available, get_xp

BACKENDS = ["numpy", "cupy"]
DENSE_MAX_D = 2000  # a dense D x D inverse beyond this costs seconds and gigabytes: skipped


def backend(name):
    """The namespace for ``name``, or NotImplementedError (asv: skip) when it is not usable."""
    if name == "cupy" and not cupy_available():
        raise NotImplementedError("CuPy with a CUDA device is not available")
    return get_xp(name)


def sync(xp):
    if xp is not np:
        xp.cuda.get_current_stream().synchronize()


@functools.lru_cache(maxsize=None)
def _lowrank_host(D, L, K=1, seed=0):
    rng = np.random.default_rng(seed)
    U = rng.standard_normal((D, L)) / np.sqrt(D)
    d = rng.uniform(0.5, 2.0, D)
    g = rng.standard_normal((D, K)) if K > 1 else rng.standard_normal(D)
    return U, d, g


def lowrank_inputs(xp, D, L, K=1, seed=0):
    """(U, d, g) for a precision U U^T + diag(d) of size D and rank L; g has K columns (K=1: a vector)."""
    return tuple(xp.asarray(a) for a in _lowrank_host(D, L, K, seed))


@functools.lru_cache(maxsize=None)
def _regression_host(M, n_in, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((M, n_in)), rng.standard_normal(M)


def regression_batch(xp, M, n_in=8, seed=0):
    """A kin8nm-sized regression minibatch: X (M, 8), y (M,) standard normal."""
    return tuple(xp.asarray(a) for a in _regression_host(M, n_in, seed))


def interleaved_medians(cases: dict, rounds: int, min_time: float) -> dict:
    """{key: median seconds per call} of the zero-argument callables ``cases``, timed round by
    round in turn (each case once per round, looping until ``min_time`` seconds), after one
    warm-up call each: interleaving spreads the machine's drifts over all cases alike, so the
    ratios between them are what one run can defend."""
    import timeit
    for fn in cases.values():
        fn()
    times = {k: [] for k in cases}
    for _ in range(rounds):
        for k, fn in cases.items():
            timer = timeit.Timer(fn)
            number = max(1, int(min_time / max(timer.timeit(1), 1e-9)))
            times[k].append(timer.timeit(number) / number)
    return {k: float(np.median(ts)) for k, ts in times.items()}
