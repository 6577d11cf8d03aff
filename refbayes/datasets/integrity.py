"""Verify-on-load: every read of a registered dataset file is checked against the registry first.

A loader asks :func:`verified_file` (or, for a path a user passed, :func:`check_path`) before it
parses a file. A file is verified exactly as ``refbayes data verify`` does it
(:func:`refbayes.datasets.digests.check_file_digest`): by sha256, and for the LIBSVM text
files also by parsed content, for the gzip files with a ``gunzipped`` record also by the sha256
of the decompressed bytes (``data verify`` accepts them those ways too). A registered file with
``alternates`` (full MNIST's staged ``.npm.gz`` beside LeCun's ``.gz``; CIFAR-10's eight staged
PNG and JSON files beside Toronto's archive) is read in whichever form the data directory holds,
the canonical one first; a staged form of several files is asked for by the names of its files. A file that does not
verify raises :class:`DataVerificationError` (a ValueError) naming the file, the expected and
found sha256 (and sizes where they differ) and the fix, ``refbayes data fetch NAME``; nothing is
parsed from it. A path that is no registered file (a user's own data) is read with an
:class:`UnverifiedDataWarning` (a UserWarning).

Verdict cache. Hashing a1a.t or a UCI folder on every split would dominate a quick run, so each
verdict is kept in the module-level dict ``_VERDICTS``, keyed by (resolved path, size in bytes,
mtime in ns) of the file when it was hashed (and by the registry entry it was checked against).
A later load of an unchanged file costs one ``stat``; any rewrite, truncation or ``touch``
changes the key and the file is hashed again. The cache lives in one process only (worker
processes verify for themselves) and is never written to disk. It cannot see a change that
keeps both the size and the mtime (e.g. a deliberate ``touch -d`` back to the old time): run
``refbayes data verify`` for a full check, or :func:`clear_cache`. A file whose stat changes
while it is hashed is not cached.
"""
from __future__ import annotations

import os
import warnings
from pathlib import Path

from refbayes.datasets import digests
from refbayes.datasets.paths import require_file, resolve_data_dir
from refbayes.datasets.registry import DATASETS, FileSpec, get_dataset

__all__ = ["DataVerificationError", "UnverifiedDataWarning", "verified_file", "check_path",
           "data_identity", "registered_file_of", "clear_cache"]


class DataVerificationError(ValueError):
    """A registered dataset file on disk does not match the registry (damaged, truncated, edited
    or another version); it was not read."""


class UnverifiedDataWarning(UserWarning):
    """A file that is no registered dataset file was read without a checksum check."""


# (resolved path, size, mtime_ns, registry path, registry sha256) -> (status, detail, digest)
_VERDICTS: dict = {}


def clear_cache() -> None:
    """Forget every cached verdict (the next load of each file hashes it again)."""
    _VERDICTS.clear()


def _stat_key(path: Path) -> tuple:
    st = os.stat(path)
    return (str(path.resolve()), st.st_size, st.st_mtime_ns)


def _verdict(spec: FileSpec, path: Path) -> tuple:
    """(status, detail, found sha256) of ``path`` against ``spec``, from the cache when the file
    is unchanged; the check itself is ``digests.check_file_digest``, as ``data verify``'s."""
    key = _stat_key(path) + (spec.path, spec.sha256)
    hit = _VERDICTS.get(key)
    if hit is not None:
        return hit
    status, digest = digests.check_file_digest(spec, path)
    verdict = (status.status, status.detail, digest)
    if _stat_key(path) + (spec.path, spec.sha256) == key:  # unchanged while it was read
        _VERDICTS[key] = verdict
    return verdict


def _mismatch_message(name: str, spec: FileSpec, path: Path, detail: str, digest: str,
                      root) -> str:
    size = path.stat().st_size
    lines = [(f"dataset {name!r}: {path} does not match the registry; it is damaged, truncated, "
              "edited or another version, and was not read."),
             f"  expected sha256 {spec.sha256}",
             f"  found sha256    {digest}"]
    if size != spec.size:
        lines += [f"  expected size   {spec.size} bytes", f"  found size      {size} bytes"]
    if spec.content is not None or spec.gunzipped is not None:  # say why the content failed too
        lines.append(f"  ({detail})")
    where = f" (pass `--data-dir {root}` to repair this folder)" if root is not None else ""
    lines.append(f"Fix: run `refbayes data fetch {name}` to replace it with a verified copy"
                 f"{where}, or restore the original file; `refbayes data verify {name}` checks "
                 "every file.")
    return "\n".join(lines)


def _verify(name: str, spec: FileSpec, path: Path, root=None) -> str:
    status, detail, digest = _verdict(spec, path)
    if status != "ok":
        raise DataVerificationError(_mismatch_message(name, spec, path, detail, digest, root))
    return digest


def _spec_of(name: str, relpath: str):
    """(registry entry of ``relpath``, True when it is a canonical name), or (None, False)."""
    for f in get_dataset(name).files:
        if f.path == relpath:
            return f, True
        for g in f.alternates:
            if g.path == relpath:
                return g, False
    return None, False


def _present(name: str, spec: FileSpec, data_dir) -> tuple:
    """(FileSpec, path) of the form of canonical entry ``spec`` the data directory holds;
    FileNotFoundError naming every accepted name when it holds none, or when the form present is
    a staged form of several files (which one name cannot stand for: ask for its files)."""
    forms = digests.present_forms(spec, resolve_data_dir(data_dir))
    if len(spec.alternates) > 1:  # a staged form of several files
        if forms != (spec,):
            path = resolve_data_dir(data_dir) / spec.path
            raise FileNotFoundError(
                f"dataset {name!r}: file not found: {path}; the data directory holds its staged "
                f"form instead, files {', '.join(g.path for g in forms)}: read those")
        return spec, require_file(name, spec.path, data_dir)
    (form,) = forms
    others = [g.path for g in (spec, *spec.alternates) if g.path != form.path]
    return form, require_file(name, form.path, data_dir, alternatives=others)


def verified_file(name: str, relpath: str, data_dir=None) -> Path:
    """The path of registered file ``relpath`` of dataset ``name``, after verifying it.

    Parameters
    ----------
    name : str
        Registered dataset name (``refbayes data list``).
    relpath : str
        Path relative to the data directory, e.g. ``"australian/australian_scale"``. For a file
        with ``alternates`` (``"mnist-full/train-images-idx3-ubyte.gz"``), the canonical name
        stands for every form: the first one present is verified and returned.
    data_dir : path-like, optional
        Resolved as in :func:`refbayes.datasets.resolve_data_dir`.

    Returns
    -------
    pathlib.Path
        ``resolve_data_dir(data_dir) / relpath``, or the path of the alternate form present.

    Raises
    ------
    FileNotFoundError
        If the file is absent in every form (the message lists the places searched).
    DataVerificationError
        If the file does not match the registry.
    """
    spec, canonical = _spec_of(name, relpath)
    if canonical:
        spec, path = _present(name, spec, data_dir)
    else:
        path = require_file(name, relpath, data_dir)
    if spec is None:
        warnings.warn(f"{path}: not a registered file of dataset {name!r}; read unverified",
                      UnverifiedDataWarning, stacklevel=3)
        return path
    _verify(name, spec, path, resolve_data_dir(data_dir))
    return path


_BY_RELPATH = {g.path: (d.name, g) for d in DATASETS.values() for f in d.files
               for g in (f, *f.alternates)}


def registered_file_of(path):
    """Find the registry entry of a file given by its path.

    Parameters
    ----------
    path : path-like
        Any file path.

    Returns
    -------
    tuple of (str, FileSpec) or None
        ``(dataset name, FileSpec)`` when ``path`` ends in a registered relative path (it lies at
        ``<some data dir>/<relpath>``), else None.
    """
    parts = Path(os.path.abspath(path)).parts
    for k in range(1, len(parts)):
        hit = _BY_RELPATH.get("/".join(parts[-k:]))
        if hit is not None:
            return hit
    return None


def check_path(path) -> str | None:
    """Verify a file given by its path, as the loaders verify the files they read.

    A registered file (see :func:`registered_file_of`) is checked against the registry; any other
    file gets an :class:`UnverifiedDataWarning` naming it.

    Parameters
    ----------
    path : path-like
        The file about to be read.

    Returns
    -------
    str or None
        The found sha256 of a registered file; None for an unregistered one.

    Raises
    ------
    DataVerificationError
        If a registered file does not match the registry.
    FileNotFoundError
        If a registered file is absent.
    """
    hit = registered_file_of(path)
    if hit is None:
        warnings.warn(f"{path}: not a registered dataset file, so it was read without checksum "
                      "verification (unverified)", UnverifiedDataWarning, stacklevel=3)
        return None
    name, spec = hit
    path = Path(path)
    root = Path(os.path.abspath(path)).parents[spec.path.count("/")]  # path = root / spec.path
    return _verify(name, spec, path, root)


def data_identity(name: str, data_dir=None, relpaths=None) -> dict:
    """The verified sha256 of each file of registered dataset ``name``, for result provenance.

    Parameters
    ----------
    name : str
        Registered dataset name (``refbayes data list``).
    data_dir : path-like, optional
        The data directory, resolved as the loaders do: this argument (``--data-dir``), else
        ``$REFBAYES_DATA``, else the user cache.
    relpaths : iterable of str, optional
        The files to identify, relative to the data directory (e.g. the paths of
        :func:`refbayes.datasets.uci.uci_split_files`); a canonical name stands for the form
        present (see :func:`verified_file`). None means every registered file of the dataset
        present under the data directory, in whichever form.

    Returns
    -------
    dict of str to str
        ``{relative path: sha256 hex digest of the file's bytes}``, sorted by path, the path being
        that of the form read. The digest is the one found on disk; it equals the registry's
        except for a LIBSVM text file accepted by its parsed content or a gzip file accepted by
        its decompressed content.

    Raises
    ------
    ValueError
        If ``name`` is not registered, or a relative path is not a file of that dataset.
    FileNotFoundError
        If a requested file is absent, or (``relpaths=None``) no file of the dataset is present.
    DataVerificationError
        If a file does not match the registry (same check and cache as the loaders).
    """
    spec = get_dataset(name)
    root = resolve_data_dir(data_dir)
    if relpaths is None:
        files = [g for f in spec.files for g in digests.present_forms(f, root)]
        files = [f for f in files if (root / f.path).is_file()]
        if not files:
            # Let require_file word the error (places searched, how to fix).
            _present(name, spec.files[0], data_dir)
    else:
        if isinstance(relpaths, (str, os.PathLike)):
            raise ValueError(f"relpaths: expected a list of relative paths, got a single "
                             f"{type(relpaths).__name__} {relpaths!r}")
        files = []
        for rel in relpaths:
            f, canonical = _spec_of(name, str(rel))
            if f is None:
                raise ValueError(f"relpaths: {rel!r} is not a registered file of dataset "
                                 f"{name!r} (its files lie under {spec.folder}/)")
            files += digests.present_forms(f, root) if canonical else [f]
    out = {}
    for f in sorted(files, key=lambda f: f.path):
        path = require_file(name, f.path, data_dir)
        out[f.path] = _verify(name, f, path, root)
    return out
