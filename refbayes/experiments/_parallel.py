"""Where an experiment's independent jobs run, and with how many BLAS threads.

An experiment is a set of independent jobs (dataset x method x split or restart x grid point),
each a call ``fn(*args)`` of a module-level function whose randomness comes from a seed derived
from the job's coordinates only. So the results do not depend on where or in which order the
jobs run, and ``run_jobs`` runs them:

- serially in this process (``jobs=1``, the default);
- in ``jobs`` local worker processes (``concurrent.futures.ProcessPoolExecutor``, spawned, so no
  state of this process leaks into a worker);
- on a Dask cluster the user already runs (``scheduler="tcp://host:8786"``, the ``distributed``
  package: the optional extra ``dask``). The scheduler reruns the job of a worker that dies
  (``distributed.scheduler.allowed-failures``, 3 by default); a job that raises is not rerun.

Order. Local processes and a Dask cluster start the jobs longest first, by the ``cost`` each
job carries (a relative estimate of its run time; equal costs keep their given order): with more
jobs than workers, a long job started last runs alone at the end while the other workers idle.
A serial run keeps the given order, which has no tail to shorten.

``on_result(key, result)`` is called in this process as each job finishes (in completion order),
so results are written as they come and a progress line advances; an interrupted run loses only
the jobs in flight, and the experiment's resume rule reuses what was written.

Threads. Every job runs under ``threadpoolctl.threadpool_limits(threads)`` (BLAS and OpenMP
pools; default 1): on the 2-core machines these experiments were measured on, an unpinned BLAS
under load ran BLAS-heavy steps 30-65x slower than one thread, and with several jobs per machine
one thread per job is what keeps the cores busy without oversubscription. Results are identical
for any ``jobs`` at a given ``threads``; a different thread count may change the last bits of a
BLAS reduction.

Memory. Every job's process also keeps the memory it frees for reuse (``retain_freed_memory``):
with glibc's defaults a Monte Carlo step page-faults its (S, M, n) temporaries in anew each time.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import multiprocessing
import platform
from typing import Callable, Iterable, NamedTuple

from refbayes._checks import check_int

__all__ = ["Job", "QUIET", "Quiet", "launch_order", "thread_limit", "retain_freed_memory",
           "run_jobs", "add_arguments", "check_scheduler", "check_worker_data"]

DASK_HINT = 'pip install "refbayes[dask]"'
CONNECT_TIMEOUT = "20s"  # how long to wait for the scheduler before giving up


class Job(NamedTuple):
    """One independent unit of an experiment: ``fn(*args)``, named ``key`` in results; ``cost``
    estimates its run time relative to the other jobs (only the order they start in uses it)."""
    key: str
    fn: Callable
    args: tuple
    cost: float = 1.0


def launch_order(jobs: list) -> list:
    """The jobs longest first (decreasing ``cost``; a stable sort, so ties keep their order)."""
    return sorted(jobs, key=lambda job: -job.cost)


class Quiet:
    """The progress of a job running in a worker: nothing is shown there (the main process
    reports each finished job). It stands for an experiment's ``Progress`` (``run_bar``,
    ``echo``) and for the bar ``run_bar`` yields (``update``, ``set_postfix_str``)."""
    enabled = tty = False
    file = None

    def run_bar(self, total=None, desc="", unit="step"):
        return contextlib.nullcontext(self)

    def update(self, n=1):
        pass

    def set_postfix_str(self, *args, **kwargs):
        pass

    def echo(self, text="", file=None):
        pass


QUIET = Quiet()


def check_worker_data(what: str, identity, prov: dict) -> None:
    """Refuse a job whose worker read other data than the main process (checksums differ).

    ``identity`` is the data's identity as ``_io.provenance`` takes it, ``prov`` the main
    process's provenance; the message names ``what`` and the --data-dir remedy.
    """
    from refbayes.experiments._io import provenance
    if provenance(identity)["data_sha256"] != prov["data_sha256"]:
        raise ValueError(f"{what}: the worker read other data than the main process ({identity} "
                         f"vs {prov['data_sha256']}); give --data-dir a folder every worker sees")


def thread_limit(threads: int):
    """Limit the BLAS and OpenMP thread pools of this process to ``threads`` (a context).

    threadpoolctl limits the pools loaded when it is called, not those loaded later, and SciPy
    ships its own OpenBLAS (scipy.linalg: eigh, Cholesky, triangular solves), loaded on first
    import. So scipy.linalg is imported first: otherwise a process that reaches SciPy after the
    limit ran its LAPACK with every core (a SLANG step at D = 501, S = 10 took 1,010 ms instead of
    5 ms beside two busy jobs on 2 cores).
    """
    import scipy.linalg  # noqa: F401  (loads SciPy's OpenBLAS, so that the limit reaches it)
    from threadpoolctl import threadpool_limits
    return threadpool_limits(limits=check_int(threads, "threads", low=1))


# glibc's mallopt parameters (malloc.h) and the values set: blocks up to 32 MiB (glibc's largest
# mmap threshold on 64 bits) come from the heap, and up to 256 MiB of freed heap is kept
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD, TRIM_THRESHOLD = 32 * 2**20, 256 * 2**20


def retain_freed_memory() -> bool:
    """Let glibc keep freed memory for reuse instead of returning it to the OS after each array.

    By default glibc serves an allocation above its mmap threshold (128 kB, raised as blocks
    are freed) with fresh pages and gives the freed top of its heap back to the OS beyond twice
    that, so a step that allocates (S, M, n) temporaries of a few hundred kB faults their pages
    in anew on every call. Measured (2-core VM, one thread): VOGN's ``sample_moments`` at
    [8, 50, 1], M = 128, S = 10 takes 468 minor page faults and 2.5 ms of CPU per call, half of
    it in the kernel; with these settings none and 0.89 ms. The same as starting Python with
    MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=268435456. The cost is up to
    TRIM_THRESHOLD bytes of freed memory held by the process. Process-wide and not undone;
    returns whether it applied (False where the C library is not glibc).
    """
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL("libc.so.6")
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
                and libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def _call(fn, args, threads):
    """Run one job under the thread limit (the function a worker executes)."""
    retain_freed_memory()
    with thread_limit(threads):
        return fn(*args)


def check_scheduler(scheduler):
    """The scheduler address, or ValueError when it is not a 'tcp://host:port'-like string."""
    if scheduler is None:
        return None
    if not isinstance(scheduler, str) or "://" not in scheduler and ":" not in scheduler:
        raise ValueError(f"dask_scheduler: expected an address such as tcp://127.0.0.1:8786, got "
                         f"{scheduler!r}")
    return scheduler


def _dask_client(scheduler: str):
    try:
        from distributed import Client
    except ImportError as err:
        raise ValueError(f"--dask-scheduler needs the 'distributed' package ({err}); install it "
                         f"with: {DASK_HINT}") from None
    try:
        return Client(scheduler, timeout=CONNECT_TIMEOUT, set_as_default=False)
    except (OSError, TimeoutError) as err:
        raise ValueError(f"dask_scheduler: cannot connect to {scheduler} ({err})") from None


def run_jobs(jobs: Iterable[Job], on_result: Callable[[str, object], None], *, n_jobs: int = 1,
             scheduler: str | None = None, threads: int = 1) -> None:
    """Run independent jobs serially, in local processes or on a Dask cluster.

    Parameters
    ----------
    jobs : iterable of Job
        The jobs; their functions must be importable module-level functions (they are pickled).
        Processes and Dask start them longest first (``launch_order``).
    on_result : callable
        ``on_result(key, result)``, in this process, as each job finishes.
    n_jobs : int, default 1
        Local worker processes (1: run in this process); ignored with ``scheduler``.
    scheduler : str or None, default None
        Address of a running Dask scheduler.
    threads : int, default 1
        BLAS / OpenMP threads of each job.

    Raises
    ------
    ValueError
        For n_jobs or threads < 1, an unusable scheduler address, or no ``distributed`` package.
    Exception
        The first exception a job raises (the jobs still running are cancelled; the results
        already handed to ``on_result`` stay).
    """
    jobs = list(jobs)
    n_jobs = check_int(n_jobs, "jobs", low=1)
    threads = check_int(threads, "threads", low=1)
    scheduler = check_scheduler(scheduler)
    if scheduler is not None:
        _run_dask(launch_order(jobs), on_result, scheduler, threads)
    elif n_jobs == 1 or len(jobs) <= 1:
        with thread_limit(threads):
            for job in jobs:
                on_result(job.key, job.fn(*job.args))
    else:
        _run_processes(launch_order(jobs), on_result, min(n_jobs, len(jobs)), threads)


def _run_processes(jobs, on_result, n_jobs, threads):
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=n_jobs, mp_context=ctx) as pool:
        futures = {pool.submit(_call, job.fn, job.args, threads): job.key for job in jobs}
        try:
            for future in concurrent.futures.as_completed(futures):
                on_result(futures[future], future.result())
        except BaseException:
            for future in futures:
                future.cancel()
            raise


def _run_dask(jobs, on_result, scheduler, threads):
    from distributed import as_completed
    client = _dask_client(scheduler)
    with contextlib.closing(client), client.as_current():  # as_completed finds it there
        # pure=False: two jobs with equal arguments are still two runs; keys name the jobs;
        # the scheduler runs higher priorities first
        futures = {client.submit(_call, job.fn, job.args, threads, key=f"refbayes-{job.key}",
                                 pure=False, priority=job.cost): job.key for job in jobs}
        try:
            for future in as_completed(futures):
                on_result(futures[future], future.result())
        except BaseException:
            client.cancel(list(futures))
            raise


def add_arguments(parser) -> None:
    """Add ``--jobs`` and ``--dask-scheduler`` to an experiment's parser.

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The experiment's parser.
    """
    from refbayes.experiments._io import positive_int
    parser.add_argument("--jobs", type=positive_int, default=1,
                        help="independent jobs run in this many local processes (default 1); "
                             "results are identical to a serial run")
    parser.add_argument("--dask-scheduler", dest="dask_scheduler", default=None,
                        metavar="ADDRESS",
                        help="run the jobs on a running Dask scheduler (e.g. "
                             f"tcp://10.0.0.1:8786; needs {DASK_HINT})")
