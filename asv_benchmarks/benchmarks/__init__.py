"""refbayes' asv benchmarks.

Every benchmark process runs with its BLAS and OpenMP pools limited to REFBAYES_BENCH_THREADS
threads (default 1), set here through threadpoolctl when asv imports the package: on the 2-core
machines these figures come from, an unpinned BLAS under load made BLAS-heavy cases 30-65x
slower (SLANG step at D = 1e4: 240 ms against 7.5 ms), so ratios measured in one run would say
more about the load than the code. Set REFBAYES_BENCH_THREADS to time a threaded case on purpose.
"""
import os

from threadpoolctl import threadpool_limits

BENCH_THREADS = int(os.environ.get("REFBAYES_BENCH_THREADS", "1"))
if BENCH_THREADS < 1:
    raise ValueError(f"REFBAYES_BENCH_THREADS: expected an integer >= 1, got {BENCH_THREADS}")
_LIMIT = threadpool_limits(limits=BENCH_THREADS)  # kept: the limit lasts for the process
