"""refbayes' asv benchmarks.

Every benchmark process runs with its BLAS and OpenMP pools limited to REFBAYES_BENCH_THREADS
threads (default 1), set here through threadpoolctl when asv imports the package: on the 2-core
machines these figures come from, an unpinned BLAS under load made BLAS-heavy cases 30-65x
slower (SLANG step at D = 1e4: 240 ms against 7.5 ms), so ratios measured in one run would say
more about the load than the code. Set REFBAYES_BENCH_THREADS to time a threaded case on purpose.

Freed memory is kept for reuse, as in every ``refbayes reproduce`` process
(refbayes.experiments.retain_freed_memory): with glibc's defaults a step with (S, M, n)
temporaries of a few hundred kB faults their pages in on every call (VOGN's step at M = 128, S = 10:
2.3x its CPU time). REFBAYES_BENCH_MALLOC=default times glibc's defaults instead.
"""
import os

from refbayes.experiments import retain_freed_memory, thread_limit

BENCH_THREADS = int(os.environ.get("REFBAYES_BENCH_THREADS", "1"))
if BENCH_THREADS < 1:
    raise ValueError(f"REFBAYES_BENCH_THREADS: expected an integer >= 1, got {BENCH_THREADS}")
_LIMIT = thread_limit(BENCH_THREADS)  # kept: the limit lasts for the process (SciPy's BLAS too)
BENCH_MALLOC = os.environ.get("REFBAYES_BENCH_MALLOC", "retain")
if BENCH_MALLOC not in ("retain", "default"):
    raise ValueError(f"REFBAYES_BENCH_MALLOC: expected 'retain' or 'default', got {BENCH_MALLOC!r}")
if BENCH_MALLOC == "retain":
    retain_freed_memory()
