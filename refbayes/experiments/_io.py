"""Result files for experiments (atomic writes, so an interrupted run never leaves half a file),
their checks on reading (a damaged file is named, with what is wrong and the --fresh remedy), the
provenance each result records, the rule for reusing a saved result, the overall progress line,
and the argument types their command lines share.

Provenance: every result file records ``{"provenance": {"data_sha256": {relative path: sha256},
"refbayes_version": ..., "git_commit": ...}}``. A saved result is reused only when its settings,
its data checksums and its refbayes version equal the current ones (:func:`reusable`); anything
else stops the run with the --fresh hint. The git commit is recorded for provenance only: a
development checkout moves to a new commit on every change, documentation included, so refusing
on it would throw away every result at each commit; the version is the promise about numbers (a
release that changes results changes it), and the data checksums catch changed inputs.
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
from tqdm import tqdm

from refbayes import __version__
from refbayes._files import publish

__all__ = ["MayLack", "Progress", "ResultFileError", "atomic_write_npz", "atomic_write_text", "format_table", "git_commit", "pyplot",
           "load_result", "output_writable", "positive_int", "provenance", "read_json", "reusable", "seed_arg",
           "sha256_arrays", "writable_error", "write_json"]

FRESH_HINT = "use --fresh to recompute it or another --out"
RECOMPUTE_HINT = "rerun with --fresh to recompute this run (or delete the file)"


class ResultFileError(ValueError):
    """A result file that cannot be read back (not JSON, or not the shape a result has).

    ``path`` is the file, ``reason`` what is wrong with it; the message is both, then ``hint``.
    """

    def __init__(self, path, reason: str, hint: str = ""):
        self.path, self.reason = Path(path), reason
        super().__init__(f"{path}: {reason}" + (f"; {hint}" if hint else ""))


def _atomic_write(path: Path, mode: str, write) -> Path:
    """Call ``write(f)`` on a temporary file beside ``path`` opened in ``mode``, then rename it
    over ``path``; the temporary file is removed if anything fails."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **({"encoding": "utf-8"} if "b" not in mode else {})) as f:
            write(f)
        publish(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: Path, text: str) -> Path:
    """Write ``text`` to a temporary file beside ``path``, then rename it over ``path``."""
    return _atomic_write(path, "w", lambda f: f.write(text))


def atomic_write_npz(path: Path, **arrays) -> Path:
    """Write ``arrays`` as an uncompressed .npz (no pickles), atomically like atomic_write_text."""
    return _atomic_write(path, "wb", lambda f: np.savez(f, **arrays))


def write_json(path: Path, obj) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


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


def provenance(data_sha256: dict) -> dict:
    """The provenance a result file records: the checksums of the data it read (relative path ->
    sha256), the refbayes version and the git commit (None outside a git checkout)."""
    return {"data_sha256": dict(sorted(data_sha256.items())), "refbayes_version": __version__,
            "git_commit": git_commit()}


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


def reusable(path: Path, saved: dict, settings: dict, current: dict, fresh: bool) -> bool:
    """Whether the saved result ``saved`` (read from ``path``) stands for the run now asked for.

    True when its settings, data checksums and refbayes version equal ``settings`` and
    ``current`` (from :func:`provenance`); the git commit is not compared (see the module
    docstring). Otherwise False with ``fresh`` (recompute it), else ValueError naming the file,
    what differs and the --fresh remedy.
    """
    why = _refusal(saved, settings, current)
    if why is None:
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

class Progress:
    """One overall progress line over the units of work of an experiment, on stderr.

    On a terminal: a tqdm bar (runs done of all, elapsed, estimated remaining), with a transient
    bar per run from :meth:`run_bar`. Elsewhere (a CI log, nohup, a pipe): one plain line at the
    start and one per finished run, ``<desc>: run k/N done (<label>; elapsed .., remaining ~..)``,
    the estimate from the runs computed so far. ``enabled=False`` prints nothing.
    """

    def __init__(self, total: int, done: int = 0, desc: str = "", enabled: bool = True, file=None):
        self.file = sys.stderr if file is None else file
        self.enabled = enabled
        self.tty = enabled and bool(getattr(self.file, "isatty", lambda: False)())
        self.total, self.k, self.done0, self.desc = total, done, done, desc
        self.t0 = time.monotonic()
        self.bar = None
        if self.tty:
            self.bar = tqdm(total=total, initial=done, desc=desc, unit="run", file=self.file,
                            dynamic_ncols=True)
        elif enabled:
            print(f"{desc}: {total} run(s), {done} already done, {total - done} to compute",
                  file=self.file, flush=True)

    def run_bar(self, total: int, desc: str, unit: str = "step"):
        """A bar over one run's steps: shown on a terminal only, removed when the run ends."""
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


def format_table(header: list[str], rows: list[list]) -> str:
    """A plain-text table, columns padded to their widest cell."""
    cells = [header] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([line(cells[0]), line(["-" * w for w in widths])] + [line(r) for r in cells[1:]])


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
