"""The one runner of the ``refbayes reproduce`` experiments: jobs, resume, provenance, summaries.

An experiment module keeps only its protocol (what to fit, what to measure, its defaults, its
table and figure); everything else is here, once:

- **the path of a run**, the same for every ``reproduce`` command: plan (:class:`Unit`,
  :func:`plan`: every saved result checked before anything is computed), start
  (:func:`start`: the output folder checked, the progress line opened), jobs
  (:class:`Section`, :func:`execute`: the same job functions serially or in parallel, each
  result written by the experiment's ``on_result`` as it comes, so an interrupted run resumes
  from what finished), summary (:func:`read_saved` for results only read, :func:`mean_se`,
  :func:`write_csv`); the experiment gives its units, jobs, budget (:func:`overridden`) and
  its tables and figures;
- **jobs** (:class:`Job`, :func:`run_jobs`): where an experiment's independent jobs run (serially,
  ``--jobs`` local processes, a Dask cluster), with how many BLAS threads (see "Jobs" below);
- **result files and resume** (:func:`load_result` against a result ``SCHEMA``, :func:`reusable`,
  :func:`resume`): a saved result is reused only when its settings, its data checksums and its
  refbayes version equal the current ones; anything else stops the run with the --fresh hint;
- **provenance** (:func:`provenance`): every result file records ``{"provenance": {"data_sha256":
  {relative path: sha256}, "refbayes_version": ..., "code_sha256": ..., "git_commit": ...}}``.
  ``code_sha256`` (:func:`code_sha256`) identifies the code in every install, a wheel or a
  ``pip install .`` included (where ``git_commit`` is None): the sha256 of the installed
  ``refbayes`` package's ``*.py`` files. What reuse compares, and why, is :func:`reusable`'s
  docstring: settings, data checksums, refbayes version and the result schema; a result computed
  by other code is reused with a note naming both code digests, never refused. Files written
  before ``code_sha256`` existed lack it and are read and reused as before;
- **interrupted runs**: :func:`start` records the run (its folder, its results), so that
  ``refbayes: interrupted`` can say what was saved and how to resume (:func:`interrupted_note`);
  a summary written while results are still missing is marked (:func:`write_summary_csv`: a
  ``*.partial.csv`` name; the experiment's JSON summary: ``"complete": false``);
- **progress** (:class:`Progress`), the **output folder** check (:func:`output_writable`);
- **summaries**: :func:`mean_se`, :func:`write_csv`, :func:`write_json`, :func:`format_table`,
  :func:`pyplot` for figures (skipped without matplotlib);
- the **argument types and options** every experiment shares (:func:`positive_int`,
  :func:`seed_arg`, :func:`add_arguments` for ``--jobs`` / ``--dask-scheduler``).

Files are written atomically (``refbayes._files``), so an interrupted run never leaves half a file.

Jobs
----
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

import argparse
import concurrent.futures
import contextlib
import csv
import ctypes
import functools
import hashlib
import io
import json
import math
import multiprocessing
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple

import numpy as np
from threadpoolctl import threadpool_limits
from tqdm import tqdm

from refbayes import __version__
from refbayes._checks import check_int
from refbayes._files import atomic_write, atomic_write_text

__all__ = [
    "DATA_DIR_HELP",
    "FRESH_HINT",
    "PROGRESS",
    "QUIET",
    "RECOMPUTE_HINT",
    "Job",
    "MayLack",
    "Progress",
    "Quiet",
    "ResultFileError",
    "Section",
    "Unit",
    "add_arguments",
    "add_data_dir",
    "add_output_arguments",
    "as_saved",
    "check_scheduler",
    "check_worker_data",
    "code_sha256",
    "execute",
    "forget_run",
    "git_commit",
    "interrupted_note",
    "job_clocks",
    "job_options",
    "job_rng",
    "launch_order",
    "load_result",
    "mean_se",
    "output_writable",
    "overridden",
    "panel_grid",
    "partial_path",
    "plan",
    "positive_int",
    "provenance",
    "pyplot",
    "read_json",
    "read_saved",
    "resume",
    "retain_freed_memory",
    "reusable",
    "run_jobs",
    "save_figure",
    "seed_arg",
    "start",
    "sha256_arrays",
    "thread_limit",
    "writable_error",
    "worker_path",
    "write_csv",
    "write_summary_csv",
]

FRESH_HINT = "use --fresh to recompute it or another --out"
RECOMPUTE_HINT = "rerun with --fresh to recompute this run (or delete the file)"


class ResultFileError(ValueError):
    """A result file that cannot be read back (not JSON, or not the shape a result has).

    ``path`` is the file, ``reason`` what is wrong with it; the message is both, then ``hint``.
    """

    def __init__(self, path, reason: str, hint: str = ""):
        self.path, self.reason = Path(path), reason
        super().__init__(f"{path}: {reason}" + (f"; {hint}" if hint else ""))



# ----------------------------------------------------------------------------- result files

def read_json(path: Path):
    """The JSON value in ``path``, or None when it does not exist (a run not yet done).

    A file that is not valid JSON (truncated by a full disk, a copy cut short, edited by hand)
    raises :class:`ResultFileError` naming the file and the parser's complaint.
    """
    path = Path(path)
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError
        raise ResultFileError(path, f"not valid JSON ({err}); the file is damaged (cut short "
                                    "or overwritten)") from err


_JSON_KIND = {dict: "a JSON object", list: "a JSON array", str: "a JSON string",
              bool: "a JSON boolean", type(None): "null", int: "a number", float: "a number"}


def _kind(value) -> str:
    return _JSON_KIND.get(type(value), type(value).__name__)


class MayLack(NamedTuple):
    """A schema entry that files written before it existed lack: checked only when present."""
    want: object


def _schema_errors(obj, schema, prefix="") -> list[str]:
    """What is wrong with ``obj`` against ``schema`` ({key: type, nested schema or MayLack});
    float means any JSON number (not a boolean)."""
    if not isinstance(obj, dict):
        where = f"{prefix[:-1]}: " if prefix else ""
        return [f"{where}expected a JSON object, got {_kind(obj)}"]
    errors = []
    for key, want in schema.items():
        name = prefix + key
        if isinstance(want, MayLack):
            if key not in obj:
                continue
            want = want.want
        if key not in obj:
            errors.append(f"missing {name!r}")
        elif isinstance(want, dict):
            errors += _schema_errors(obj[key], want, name + ".")
        elif want is float:
            if isinstance(obj[key], bool) or not isinstance(obj[key], (int, float)):
                errors.append(f"{name}: expected a number, got {_kind(obj[key])}")
        elif not isinstance(obj[key], want):
            errors.append(f"{name}: expected {_JSON_KIND.get(want, want.__name__)}, got {_kind(obj[key])}")
    return errors


def load_result(path: Path, schema: dict, fresh: bool = False):
    """The saved result in ``path`` checked against ``schema``; None when there is none.

    ``schema`` maps each key a result must have to its type (``float`` for any number) or to a
    nested schema. A damaged file (not JSON, not an object, a key missing or of the wrong type)
    raises :class:`ResultFileError` naming the file, what is wrong and the remedy; with
    ``fresh`` it counts as not done (None), so the run is recomputed and the file replaced.
    """
    path = Path(path)
    try:
        obj = read_json(path)
    except ResultFileError as err:
        if fresh:
            return None
        raise ResultFileError(path, err.reason, RECOMPUTE_HINT) from err
    if obj is None:
        return None
    errors = _schema_errors(obj, schema)
    if not errors:
        return obj
    if fresh:
        return None
    shown = "; ".join(errors[:3]) + ("; ..." if len(errors) > 3 else "")
    raise ResultFileError(path, f"damaged result file: {shown}", RECOMPUTE_HINT)


# ----------------------------------------------------------------------------- provenance

def _source_root() -> Path:
    """The folder that holds the ``refbayes`` package (a checkout's root for an editable install)."""
    return Path(__file__).resolve().parents[2]


def _git_head(folder: Path):
    """``git rev-parse HEAD`` in ``folder`` when it is the root of a git checkout, else None
    (also None when git is not installed or fails)."""
    folder = Path(folder)
    if not (folder / ".git").exists():  # not a checkout: do not report an enclosing repository
        return None
    try:
        res = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    head = res.stdout.strip()
    return head if res.returncode == 0 and re.fullmatch(r"[0-9a-f]{40,64}", head) else None


@functools.cache
def git_commit():
    """The git commit of the refbayes source in use, or None (not a git checkout, or no git).

    Computed once per process.
    """
    return _git_head(_source_root())


def sha256_arrays(*arrays) -> str:
    """sha256 of the arrays' dtypes, shapes and C-order bytes: the identity of generated data."""
    h = hashlib.sha256()
    for a in arrays:
        h.update(f"{a.dtype.str}{tuple(a.shape)}".encode())
        h.update(memoryview(a.tobytes()))
    return h.hexdigest()


def _package_digest(root: Path) -> str:
    """sha256 over the ``*.py`` files under ``root``, sorted by their relative (POSIX) path:
    for each, the path, its length in bytes and its bytes (so no two file sets collide)."""
    root = Path(root)
    h = hashlib.sha256()
    for rel, path in sorted((p.relative_to(root).as_posix(), p) for p in root.rglob("*.py")):
        data = path.read_bytes()
        h.update(f"{rel}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


@functools.cache
def code_sha256() -> str:
    """The sha256 of the source of the ``refbayes`` package in use (its ``*.py`` files, sorted by
    relative path; :func:`_package_digest`): the code's identity in every install, a wheel or a
    ``pip install .`` included, where there is no git checkout. Computed once per process."""
    return _package_digest(Path(__file__).resolve().parents[1])


def provenance(data_sha256: dict) -> dict:
    """The provenance a result file records: the checksums of the data it read (relative path ->
    sha256), the refbayes version, the sha256 of the refbayes source (:func:`code_sha256`) and
    the git commit (None outside a git checkout)."""
    return {"data_sha256": dict(sorted(data_sha256.items())), "refbayes_version": __version__,
            "code_sha256": code_sha256(), "git_commit": git_commit()}


def _refusal(saved, settings, current):
    """Why ``saved`` may not stand for a run with ``settings`` and provenance ``current``, or None."""
    if saved.get("settings") != settings:
        old = saved.get("settings") if isinstance(saved.get("settings"), dict) else {}
        diff = sorted(k for k in set(settings) | set(old) if old.get(k) != settings.get(k))
        return f"holds a run with other settings (differs in {', '.join(diff)})"
    prov = saved.get("provenance")
    if not isinstance(prov, dict) or not isinstance(prov.get("data_sha256"), dict) \
            or "refbayes_version" not in prov:
        return ("records no data checksums or refbayes version (written by an older refbayes), "
                "so it may come from other data")
    old, new = prov["data_sha256"], current["data_sha256"]
    if old != new:
        changes = [f"{k} changed" for k in sorted(set(old) & set(new)) if old[k] != new[k]]
        changes += [f"{k} added" for k in sorted(set(new) - set(old))]
        changes += [f"{k} not read now" for k in sorted(set(old) - set(new))]
        return f"holds a run computed from other data ({', '.join(changes)})"
    if prov["refbayes_version"] != current["refbayes_version"]:
        return (f"holds a run written by refbayes {prov['refbayes_version']} (this is refbayes "
                f"{current['refbayes_version']})")
    return None


_STALE_NOTED: set = set()  # the (saved, current) code digests already noted in this process


def _note_other_code(path, saved, current) -> None:
    """A note on stderr, once per (saved, current) pair of code digests in this process, when
    ``saved`` (reused) was computed by other refbayes code than ``current`` names. Nothing for a
    file without a digest (written before it was recorded): there is nothing to compare."""
    old = saved["provenance"].get("code_sha256")
    new = current.get("code_sha256")
    if not isinstance(old, str) or not isinstance(new, str) or old == new:
        return
    if (old, new) in _STALE_NOTED:
        return
    _STALE_NOTED.add((old, new))
    print(f"note: {path} (and any other saved result from the same code) was computed by other "
          f"refbayes code (code_sha256 {old}; this is {new}); it is reused because its settings, "
          "data and refbayes version match; to recompute, delete it or choose another --out",
          file=sys.stderr)


def reusable(path: Path, saved: dict, settings: dict, current: dict, fresh: bool) -> bool:
    """Whether the saved result ``saved`` (read from ``path``) stands for the run now asked for.

    True when its settings, data checksums and refbayes version equal ``settings`` and
    ``current`` (from :func:`provenance`); its shape was checked against the result schema
    before (:func:`load_result`). Otherwise False with ``fresh`` (recompute it), else ValueError
    naming the file, what differs and the --fresh remedy.

    What is not compared, and why:

    - ``code_sha256``, the digest of the refbayes source: it changes with every edit of any
      file of the package (a docstring, a comment, a method the experiment never calls), and
      most edits do not change a result; refusing on it would throw away hours of saved runs
      (a default ktied run is over an hour, the UCI tables days of CPU) at every such edit, and
      with ``--fresh`` recompute them. The refbayes version is the promise about numbers (a
      release that changes results changes it). A result from other code is still made
      visible: it is reused with a note on stderr naming both digests and how to recompute
      (:func:`_note_other_code`; once per pair of digests, not once per file). A file without a
      digest (written before it was recorded, such as those under ``reproductions/``) is
      reused as before, silently: there is nothing to compare.
    - ``git_commit``, for the same reason: a development checkout moves to a new commit on
      every change, documentation included; and it is None outside a checkout.
    """
    why = _refusal(saved, settings, current)
    if why is None:
        _note_other_code(path, saved, current)
        return True
    if fresh:
        return False
    raise ValueError(f"--out: {path} {why}; {FRESH_HINT}")


def output_writable(out: Path, needed: bool) -> bool:
    """Whether results can be written under ``out``, checked before anything is computed.

    When they cannot: with ``needed`` (something is to be computed) a ValueError naming the
    folder; without (every result is already there) False, after a note on stderr that the
    summary files and figures are not updated, so the caller prints its table and writes nothing.
    """
    reason = writable_error(out)
    if reason is None:
        return True
    if needed:
        raise ValueError(f"--out: {reason}; nothing was computed; choose a writable --out")
    print(f"note: {out} is not writable ({reason}); every result is there, so the table is "
          "printed, but summary files and figures are not updated", file=sys.stderr)
    return False


# ----------------------------------------------------------------------------- progress

RUN_LOG_SECONDS = 300.0
"""Off a terminal, the least time between two lines of one run's :class:`LogBar`."""


class LogBar:
    """A run's progress off a terminal: ``<desc> k/N <unit> (elapsed .., remaining ~..)`` when
    :data:`RUN_LOG_SECONDS` have passed since the run's start or its last line, none after the
    last step. The remaining time is estimated from the steps counted after the first
    ``update``, which may be a resumed run's jump to its checkpoint."""

    def __init__(self, total: int, desc: str, unit: str, file):
        self.total, self.desc, self.unit, self.file = total, desc, unit, file
        self.n = 0
        self.t0 = self.last = time.monotonic()
        self.first = None  # (time, count) after the first update

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if self.first is None:
            self.first = (now, self.n)
        if now - self.last < RUN_LOG_SECONDS or self.n >= self.total:
            return
        self.last = now
        t1, n1 = self.first
        rate = (now - t1) / (self.n - n1) if self.n > n1 else None
        remaining = ("" if rate is None else
                     f", remaining ~{tqdm.format_interval(rate * (self.total - self.n))}")
        print(f"{self.desc} {self.n}/{self.total} {self.unit}s (elapsed "
              f"{tqdm.format_interval(now - self.t0)}{remaining})", file=self.file, flush=True)

    def set_postfix_str(self, *args, **kwargs) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class Progress:
    """One overall progress line over the units of work of an experiment, on stderr.

    On a terminal: a tqdm bar (runs done of all, elapsed, estimated remaining), with a transient
    bar per run from :meth:`run_bar`. Elsewhere (a CI log, nohup, a pipe): one plain line at the
    start and one per finished run, ``<desc>: run k/N done (<label>; elapsed .., remaining ~..)``,
    the estimate from the runs computed so far, and a line of a long run's own progress every
    :data:`RUN_LOG_SECONDS` (:class:`LogBar`). ``enabled=False`` prints nothing.
    """

    def __init__(self, total: int, done: int = 0, desc: str = "", enabled: bool = True, file=None,
                 resuming: dict | None = None):
        self.file = sys.stderr if file is None else file
        self.enabled = enabled
        self.tty = enabled and bool(getattr(self.file, "isatty", lambda: False)())
        self.total, self.k, self.done0, self.desc = total, done, done, desc
        self.t0 = time.monotonic()
        self.bar = None
        if self.tty:
            if resuming:
                print(f"{desc}: {self.plan_line(resuming)}", file=self.file, flush=True)
            self.bar = tqdm(total=total, initial=done, desc=desc, unit="run", file=self.file,
                            dynamic_ncols=True)
        elif enabled:
            print(f"{desc}: {total} run(s), {self.plan_line(resuming)}", file=self.file,
                  flush=True)

    def plan_line(self, resuming: dict | None = None) -> str:
        """"k already done, n to compute"; with ``resuming`` ({run: step} of the runs that go
        on from a checkpoint) those are named ("resuming k1 from step 300") and counted out of
        the runs to compute, and a count of 0 is left out."""
        resuming = resuming or {}
        fresh = self.total - self.done0 - len(resuming)
        if not resuming:
            return f"{self.done0} already done, {fresh} to compute"
        parts = [f"{self.done0} already done"] if self.done0 else []
        parts += [f"resuming {name} from step {step}" for name, step in resuming.items()]
        if fresh:
            parts.append(f"{fresh} to compute")
        return ", ".join(parts)

    def run_bar(self, total: int, desc: str, unit: str = "step"):
        """A bar over one run's steps: on a terminal a tqdm bar removed when the run ends;
        elsewhere (enabled) a :class:`LogBar`, a plain line at most every
        :data:`RUN_LOG_SECONDS`, so that a log shows a long run moving."""
        if not self.tty and self.enabled:
            return LogBar(total, f"{self.desc}: {desc}", unit, self.file)
        return tqdm(total=total, desc=desc, unit=unit, file=self.file, leave=False,
                    disable=not self.tty, dynamic_ncols=True)

    def advance(self, label: str) -> None:
        """One run (``label`` names it) has finished."""
        self.k += 1
        if self.bar is not None:
            self.bar.set_postfix_str(label, refresh=False)
            self.bar.update(1)
        elif self.enabled:
            elapsed = time.monotonic() - self.t0
            remaining = elapsed / (self.k - self.done0) * (self.total - self.k)
            print(f"{self.desc}: run {self.k}/{self.total} done ({label}; elapsed "
                  f"{tqdm.format_interval(elapsed)}, remaining ~{tqdm.format_interval(remaining)})",
                  file=self.file, flush=True)

    def echo(self, text: str = "", file=None) -> None:
        """Print ``text`` (to stdout by default) without breaking the bar on a terminal."""
        out = sys.stdout if file is None else file
        if self.bar is not None:
            with tqdm.external_write_mode(file=self.file):
                print(text, file=out, flush=True)
        else:
            print(text, file=out, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


# ----------------------------------------------------------------------------- output folder

def _probe(folder: Path) -> None:
    """Create and remove a temporary file in ``folder`` (raises OSError when it cannot)."""
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".refbayes-write-test.", suffix=".tmp")
    os.close(fd)
    os.unlink(tmp)


def writable_error(folder: Path):
    """Why results cannot be written under ``folder``, or None when they can.

    A missing ``folder`` counts as writable when its nearest existing ancestor is a writable
    folder (the writes create it). Nothing is left behind.
    """
    folder = Path(folder)
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a folder"
    try:
        _probe(existing)
    except OSError as err:
        return f"cannot write in {existing} ({err.strerror or err})"
    return None


def pyplot():
    """matplotlib.pyplot on the Agg backend, or None (with a note on stderr) when matplotlib, the
    ``plot`` extra, is not installed: the experiments then skip their figures."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("figures skipped: matplotlib is not installed (pip install 'refbayes[plot]')",
              file=sys.stderr)
        return None
    return plt


def panel_grid(plt, n: int, max_cols: int, panel=(3.2, 3.3)):
    """(fig, axes (rows, cols)) of n panels, at most max_cols per row, each ``panel`` inches;
    the last row's unused panels hidden. Fill ``axes.flat`` in order."""
    cols = min(max_cols, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(panel[0] * cols, panel[1] * rows),
                             squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, axes


def save_figure(fig, path: Path, dpi: int = 110, **kwargs) -> Path:
    """Write the matplotlib figure ``fig`` as a PNG under ``path`` atomically (``savefig`` with
    ``dpi`` and ``kwargs``), then close it; returns ``path``."""
    import matplotlib.pyplot as plt
    try:
        atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=dpi, **kwargs))
    finally:
        plt.close(fig)
    return Path(path)


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (epochs, restarts)."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return int(text)


def seed_arg(text: str) -> int:
    """argparse type: a master seed, an integer >= 0."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return int(text)


def job_rng(*coords) -> np.random.Generator:
    """The generator of one job: ``default_rng(SeedSequence([*coords]))``, the master seed first,
    then the job's coordinates as non-negative integers (a dataset's index, a split, a stream).
    So a job's draws depend on its coordinates only, not on where or in which order it runs."""
    return np.random.default_rng(np.random.SeedSequence(list(coords)))


# ----------------------------------------------------------------------------- summaries

def resume(path: Path, schema: dict, settings: dict, current: dict, fresh: bool):
    """The saved result in ``path`` when it stands for the run now asked for, else None (to compute).

    :func:`load_result` against ``schema`` (a damaged file raises, or counts as absent with
    ``fresh``), then :func:`reusable` against ``settings`` and provenance ``current`` (other
    settings, data or version raise, or count as absent with ``fresh``).
    """
    saved = load_result(path, schema, fresh)
    if saved is not None and reusable(path, saved, settings, current, fresh):
        return saved
    return None


def job_clocks(record: dict) -> Callable[[], None]:
    """A function that writes into ``record`` the job's wall seconds (``time.perf_counter``) and
    this process's CPU seconds (``time.process_time``: all its threads, not the time it waited
    for a core), both counted on from the "seconds" / "cpu_seconds" that ``record`` holds when
    this is called (0 for a new job; a checkpoint's for a resumed one). A record without
    "cpu_seconds" (a checkpoint written before it was recorded) gets none."""
    t0 = time.perf_counter() - record["seconds"]
    c0 = time.process_time() - record["cpu_seconds"] if "cpu_seconds" in record else None

    def clocks():
        record["seconds"] = time.perf_counter() - t0
        if c0 is not None:
            record["cpu_seconds"] = time.process_time() - c0
    return clocks


def mean_se(values, ddof: int = 1):
    """(mean, standard error std(ddof) / sqrt(K)) over the K values that are not None.

    The error is None (JSON null) for one value; both are None for none.
    """
    v = np.asarray([x for x in values if x is not None], dtype=float)
    if v.size == 0:
        return None, None
    se = float(v.std(ddof=ddof) / math.sqrt(v.size)) if v.size > 1 else None  # (uci.8)
    return float(v.mean()), se


def write_csv(path: Path, rows, header=None):
    """Write ``rows`` as CSV under ``path`` (atomically); return the path, or None when there are
    no rows and no ``header`` (nothing is written then).

    ``rows`` are dicts (columns: ``header``, default every key in order of first appearance; a
    key missing from a row is an empty cell) or sequences (columns: ``header``, which they then
    need).
    """
    rows = list(rows)
    if not rows and header is None:
        return None
    buf = io.StringIO()
    if rows and isinstance(rows[0], dict):
        fields = list(header) if header is not None else list(dict.fromkeys(k for r in rows for k in r))
        writer = csv.DictWriter(buf, fieldnames=fields)
        writer.writeheader()
    else:
        writer = csv.writer(buf)
        writer.writerow(header)
    writer.writerows(rows)
    return atomic_write_text(path, buf.getvalue())


def partial_path(path: Path) -> Path:
    """Where the summary ``path`` is written while the run is incomplete: ``summary.csv`` ->
    ``summary.partial.csv``."""
    path = Path(path)
    return path.with_name(f"{path.stem}.partial{path.suffix}")


def write_summary_csv(path: Path, rows, header=None, complete: bool = True):
    """:func:`write_csv` of a summary: under ``path`` when ``complete``, else under
    :func:`partial_path` (``summary.partial.csv``); the other of the two is removed, so a
    folder never shows a final-looking summary beside a newer partial one, nor the reverse.

    A separate name rather than a marker inside: every CSV reader (the csv module, pandas, a
    spreadsheet) keeps reading both files unchanged (a first comment line would become the
    header of most of them), a glob for ``summary.csv`` finds only complete summaries, and the
    name says what the file is to a person listing the folder. Returns the path written, or
    None (nothing written, nothing removed) when :func:`write_csv` writes nothing.
    """
    target, other = (Path(path), partial_path(path)) if complete else (partial_path(path), Path(path))
    written = write_csv(target, rows, header)
    if written is not None:
        other.unlink(missing_ok=True)
    return written


# ----------------------------------------------------------------------------- jobs

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


class _ProgressArgument:
    """The type of :data:`PROGRESS`."""

    def __repr__(self):
        return "PROGRESS"

    def __reduce__(self):  # one object, also after a pickle round trip
        return "PROGRESS"


PROGRESS = _ProgressArgument()
"""In a :class:`Job`'s ``args``: the progress the job reports to. ``run_jobs`` passes the run's
:class:`Progress` there when the job runs in this process, :data:`QUIET` when it runs in a
worker; so one job function serves the serial and the parallel run."""


def _with_progress(args: tuple, progress) -> tuple:
    progress = QUIET if progress is None else progress
    return tuple(progress if a is PROGRESS else a for a in args)


@contextlib.contextmanager
def _naming(key):
    """Give an exception raised inside the ``job_key`` of the job that raised it."""
    try:
        yield
    except BaseException as err:
        if getattr(err, "job_key", None) is None:
            with contextlib.suppress(AttributeError, TypeError):
                err.job_key = key
        raise


def check_worker_data(what: str, identity, prov: dict) -> None:
    """Refuse a job whose worker read other data than the main process (checksums differ).

    ``identity`` is the data's identity as :func:`provenance` takes it, ``prov`` the main
    process's provenance; the message names ``what`` and the --data-dir remedy.
    """
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
    """(a Client connected to scheduler, distributed.as_completed); ValueError naming the `dask`
    extra when the optional ``distributed`` package is not installed (every import of it is
    here), or the address when nothing answers there."""
    try:
        from distributed import Client, as_completed
    except ImportError as err:
        raise ValueError(f"--dask-scheduler needs the 'distributed' package ({err}); install it "
                         f"with: {DASK_HINT}") from None
    try:
        return Client(scheduler, timeout=CONNECT_TIMEOUT, set_as_default=False), as_completed
    except (OSError, TimeoutError) as err:
        raise ValueError(f"dask_scheduler: cannot connect to {scheduler} ({err})") from None


def run_jobs(jobs: Iterable[Job], on_result: Callable[[str, object], None], *, n_jobs: int = 1,
             scheduler: str | None = None, threads: int = 1, progress=None) -> None:
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
    progress : Progress or None, default None
        What a job's :data:`PROGRESS` argument becomes when the job runs in this process
        (None: :data:`QUIET`); a job run elsewhere gets :data:`QUIET`.

    Raises
    ------
    ValueError
        For n_jobs or threads < 1, an unusable scheduler address, or no ``distributed`` package.
    Exception
        The first exception a job raises, with the job's key as its ``job_key`` attribute (the
        jobs still running are cancelled; the results already handed to ``on_result`` stay).
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
                with _naming(job.key):
                    result = job.fn(*_with_progress(job.args, progress))
                on_result(job.key, result)
    else:
        _run_processes(launch_order(jobs), on_result, min(n_jobs, len(jobs)), threads)



def job_options(args) -> dict:
    """The keyword arguments of :func:`run_jobs` and :func:`execute` a command line asked for:
    ``--jobs``, ``--dask-scheduler`` and ``--threads`` (1 when the parser has none)."""
    return {"n_jobs": args.jobs, "scheduler": args.dask_scheduler,
            "threads": getattr(args, "threads", 1)}


def _run_processes(jobs, on_result, n_jobs, threads):
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=n_jobs, mp_context=ctx) as pool:
        futures = {pool.submit(_call, job.fn, _with_progress(job.args, None), threads): job.key
                   for job in jobs}
        try:
            for future in concurrent.futures.as_completed(futures):
                with _naming(futures[future]):
                    result = future.result()
                on_result(futures[future], result)
        except BaseException:
            for future in futures:
                future.cancel()
            raise


def _run_dask(jobs, on_result, scheduler, threads):
    client, as_completed = _dask_client(scheduler)
    with contextlib.closing(client), client.as_current():  # as_completed finds it there
        # pure=False: two jobs with equal arguments are still two runs; keys name the jobs;
        # the scheduler runs higher priorities first
        futures = {client.submit(_call, job.fn, _with_progress(job.args, None), threads,
                                 key=f"refbayes-{job.key}", pure=False, priority=job.cost): job.key
                   for job in jobs}
        try:
            for future in as_completed(futures):
                with _naming(futures[future]):
                    result = future.result()
                on_result(futures[future], result)
        except BaseException:
            client.cancel(list(futures))
            raise


# ----------------------------------------------------------------------------- the path of a run

class Unit(NamedTuple):
    """One result file an experiment's plan checks before anything is computed: ``key`` names
    it in the plan; the file at ``path`` must hold ``schema`` and stands for the run asked for
    when it records ``settings`` and ``provenance`` (:func:`resume`)."""
    key: object
    path: Path
    schema: dict
    settings: dict
    provenance: dict


def plan(units: Iterable[Unit], fresh: bool) -> tuple[dict, list]:
    """Check every unit's saved result, in order, before anything is computed.

    Returns ({key: saved result} of the units whose file stands for the run asked for,
    [unit] of those to compute, in order). A damaged file, or one with other settings, data or
    version, raises ValueError naming it (:func:`resume`), unless ``fresh`` (then it is to
    compute).
    """
    saved, todo = {}, []
    for unit in units:
        prev = resume(unit.path, unit.schema, unit.settings, unit.provenance, fresh)
        if prev is None:
            todo.append(unit)
        else:
            saved[unit.key] = prev
    return saved, todo


def read_saved(path: Path, schema: dict, settings=None, current=None, noted=None,
               what: str = "the summary"):
    """A saved result that a summary only reads (never recomputes), or None.

    None when there is none, when it is damaged (a note on stderr naming the file, that it is
    left out of ``what``; once per file when ``noted``, a set, collects the files noted), or,
    given ``settings``, when it does not stand for ``settings`` and provenance ``current`` (a
    dict, or a callable returning it, called only when there is a file to compare).
    """
    try:
        saved = load_result(path, schema)
    except ResultFileError as err:
        if noted is None or err.path not in noted:
            if noted is not None:
                noted.add(err.path)
            print(f"note: {err.path}: {err.reason}; left out of {what}", file=sys.stderr)
        return None
    if saved is None or settings is None:
        return saved
    current = current() if callable(current) else current
    return saved if reusable(path, saved, settings, current, fresh=True) else None


def as_saved(obj):
    """``obj`` in the form it has when read back from a result file (a JSON round trip: tuples
    become lists, keys strings), so that settings compare equal to the saved ones."""
    return json.loads(json.dumps(obj))


def overridden(defaults: dict, args, keys: Iterable[str]) -> dict:
    """An experiment's budget: a copy of ``defaults`` (its default or --quick budget) with the
    ``keys`` the command line sets (attributes of ``args`` that are not None) replaced."""
    budget = dict(defaults)
    for key in keys:
        if getattr(args, key, None) is not None:
            budget[key] = getattr(args, key)
    return budget


def worker_path(path):
    """``path`` (None stays None) as a job run in another process or machine needs it: absolute,
    since a Dask worker runs in a folder of its own."""
    return None if path is None else Path(path).resolve()


_RUN: dict = {}  # the run this process started last (start), for interrupted_note


def start(out: Path, needed: bool, total: int, done: int, desc: str, enabled: bool = True, *,
          resuming: dict | None = None, partial: Callable[[], list] | None = None,
          resumable: bool = True):
    """(write, progress) of a run whose plan is made: ``out`` checked (:func:`output_writable`:
    ValueError when something is ``needed`` and it is not writable, else ``write`` False), then
    the :class:`Progress` over ``total`` units, ``done`` of them already saved; ``resuming``
    ({run: step}) names the runs that go on from a checkpoint.

    The run is recorded for :func:`interrupted_note`: its folder, its progress, ``partial`` (a
    callable listing the partial work saved, such as checkpoints, called only after an
    interrupt) and whether it resumes (``resumable``).
    """
    write = output_writable(Path(out), needed=needed)
    progress = Progress(total, done, desc, enabled=enabled, resuming=resuming)
    _RUN.clear()
    _RUN.update(out=Path(out), progress=progress, partial=partial, resumable=resumable)
    return write, progress


def forget_run() -> None:
    """Forget the run :func:`start` recorded (the command line calls it before each command)."""
    _RUN.clear()


def interrupted_note():
    """What the run this process started (:func:`start`) saved before it was interrupted, and
    how to go on; None when no run had started (interrupted while planning: nothing written).

    "3 of 8 result(s) saved under results/uci (2 by this run); k2 checkpointed at step 300;
    to resume, run the same command again: saved results that match are reused, --fresh is not
    needed". A run that does not resume (``resumable=False``) says that it starts again.
    """
    if not _RUN:
        return None
    progress, out = _RUN["progress"], _RUN["out"]
    now = progress.k - progress.done0
    text = f"{progress.k} of {progress.total} result(s) saved under {out} ({now} by this run)"
    partial = []
    if _RUN["partial"] is not None:
        with contextlib.suppress(Exception):  # a note must not hide the interrupt
            partial = list(_RUN["partial"]())
    if partial:
        text += "; " + ", ".join(partial)
    if _RUN["resumable"]:
        return (text + "; to resume, run the same command again: saved results that match are "
                "reused (without --fresh)")
    return text + "; this command does not resume: run it again to start over"


class Section(NamedTuple):
    """Jobs whose results a run shows together: ``before()`` (a heading) and ``after()`` (its
    table) run around them (both optional)."""
    jobs: list
    before: Callable | None = None
    after: Callable | None = None


def execute(sections: Iterable[Section], on_result: Callable[[str, object], None], progress, *,
            n_jobs: int = 1, scheduler: str | None = None, threads: int = 1) -> None:
    """Run an experiment's jobs, section by section, the one way every experiment runs them.

    Serially (``n_jobs`` 1, no ``scheduler``), each section's ``before``, its jobs in this
    process (their :data:`PROGRESS` argument is ``progress``), its ``after``: a table is shown
    as soon as its jobs are done. Otherwise every job of every section at once
    (:func:`run_jobs`: local processes or a Dask cluster), then each section's ``before`` and
    ``after`` in order. ``on_result(key, result)`` writes each result as it comes in both cases,
    so an interrupted run keeps what finished and the next one resumes from it.
    """
    sections = list(sections)
    serial = n_jobs == 1 and scheduler is None
    every = [job for s in sections for job in s.jobs]
    if every and not serial:  # nothing to compute: no cluster needed
        run_jobs(every, on_result, n_jobs=n_jobs, scheduler=scheduler, threads=threads,
                 progress=progress)
    for s in sections:
        if s.before is not None:
            s.before()
        if s.jobs and serial:
            run_jobs(s.jobs, on_result, threads=threads, progress=progress)
        if s.after is not None:
            s.after()


DATA_DIR_HELP = "folder of the benchmark data (default: $REFBAYES_DATA, then the user cache)"


def add_output_arguments(parser, name: str, unit: str | None = "run", out_type=Path) -> None:
    """Add ``--out`` (default ``results/<name>``, parsed by ``out_type``) and, for an
    experiment that resumes (``unit`` names what its result files hold: run, split, part),
    ``--fresh`` to an experiment's parser."""
    parser.add_argument("--out", type=out_type, default=Path(f"results/{name}"),
                        help=f"output folder (default: results/{name})")
    if unit is not None:
        parser.add_argument("--fresh", action="store_true",
                            help=f"recompute {unit}s whose saved settings differ instead of "
                                 "stopping")


def add_data_dir(parser) -> None:
    """Add ``--data-dir`` (the benchmark data's folder) to an experiment's parser."""
    parser.add_argument("--data-dir", type=Path, default=None, help=DATA_DIR_HELP)


def add_arguments(parser) -> None:
    """Add ``--jobs`` and ``--dask-scheduler`` to an experiment's parser.

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The experiment's parser.
    """
    parser.add_argument("--jobs", type=positive_int, default=1,
                        help="independent jobs run in this many local processes (default 1); "
                             "results are identical to a serial run")
    parser.add_argument("--dask-scheduler", dest="dask_scheduler", default=None,
                        metavar="ADDRESS",
                        help="run the jobs on a running Dask scheduler (e.g. "
                             f"tcp://10.0.0.1:8786; needs {DASK_HINT})")
