"""refbayes' asv benchmarks.

The thread pin. Every benchmark process runs with its BLAS and OpenMP pools limited to
REFBAYES_BENCH_THREADS threads (default 1): on the 2-core machines these figures come from, an
unpinned BLAS under load made BLAS-heavy cases 30-65x slower (SLANG step at D = 1e4: 240 ms against
7.5 ms), so ratios measured in one run would say more about the load than the code. Set
REFBAYES_BENCH_THREADS to time a threaded case on purpose. asv imports this package before any
benchmark module, in every process that runs benchmarks (its forkserver, then forks of it), so
the pin reaches every benchmark without an import in each file. It is set twice:

1. OPENBLAS_NUM_THREADS, OMP_NUM_THREADS, MKL_NUM_THREADS (and the other pools' variables) in
   os.environ, read by each library when it loads: set here, before NumPy, SciPy or numba are
   imported, and inherited by any process a benchmark starts. Only where NumPy is not loaded yet
   (asv's runner loads none of them): a process that imported NumPy first keeps its environment;
2. threadpoolctl's limit on the pools loaded then (SciPy's own OpenBLAS included: scipy.linalg is
   imported first), which also pins a process that had loaded NumPy before. Kept for the
   process's life.

``pin_report()`` says what is in force (tests/test_benchmarks.py checks it in a fresh process, as
asv runs them). The pin uses threadpoolctl directly, not refbayes' helpers, so that it holds for
the older commits that `asv run A..B` installs (threadpoolctl is a dependency since 2a0b4b5).

Freed memory is kept for reuse, as in every ``refbayes reproduce`` process
(refbayes.experiments.retain_freed_memory): with glibc's defaults a step with (S, M, n)
temporaries of a few hundred kB faults their pages in on every call (VOGN's step at M = 128, S = 10:
2.3x its CPU time). REFBAYES_BENCH_MALLOC=default times glibc's defaults instead.
"""
import os
import sys

BENCH_THREADS = int(os.environ.get("REFBAYES_BENCH_THREADS", "1"))
if BENCH_THREADS < 1:
    raise ValueError(f"REFBAYES_BENCH_THREADS: expected an integer >= 1, got {BENCH_THREADS}")
THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
               "BLIS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS",
               "NUMBA_NUM_THREADS")
NUMPY_BEFORE_PIN = "numpy" in sys.modules
if not NUMPY_BEFORE_PIN:  # a benchmark process, as asv starts them: nothing loaded yet
    for _var in THREAD_VARS:
        os.environ[_var] = str(BENCH_THREADS)
# else a process that loaded NumPy first (pytest's smoke run, an interactive session): its pools
# are loaded, so the variables would reach only the processes it starts later; they are left as
# they are, and threadpoolctl's limit below pins this process

import scipy.linalg  # noqa: F401  (loads SciPy's OpenBLAS, so that the limit reaches it)
from threadpoolctl import threadpool_info, threadpool_limits

_LIMIT = threadpool_limits(limits=BENCH_THREADS)  # kept: the limit lasts for the process


def pin_report() -> dict:
    """What the pin set: the threads asked for, the variables, and each loaded pool's threads."""
    return {"threads": BENCH_THREADS, "numpy_before_pin": NUMPY_BEFORE_PIN,
            "env": {v: os.environ.get(v) for v in THREAD_VARS},
            "pools": [(p["internal_api"], p["filepath"], p["num_threads"])
                      for p in threadpool_info()]}


BENCH_MALLOC = os.environ.get("REFBAYES_BENCH_MALLOC", "retain")
if BENCH_MALLOC not in ("retain", "default"):
    raise ValueError(f"REFBAYES_BENCH_MALLOC: expected 'retain' or 'default', got {BENCH_MALLOC!r}")
if BENCH_MALLOC == "retain":
    try:
        from refbayes.experiments import retain_freed_memory
    except ImportError:  # commits b308a26..2454a58 (asv run A..B installs old commits)
        try:
            from refbayes.experiments._parallel import retain_freed_memory
        except ImportError as err:
            raise ImportError("this refbayes has no retain_freed_memory (before commit b308a26): "
                              "time it with REFBAYES_BENCH_MALLOC=default") from err
    retain_freed_memory()
