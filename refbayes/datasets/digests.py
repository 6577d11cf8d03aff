"""The one check of a dataset file against its registry entry: sha256, or parsed content.

Behind ``refbayes data verify`` and ``fetch`` (:mod:`refbayes.datasets.download`) and
verify-on-load (:mod:`refbayes.datasets.integrity`), which both import it from here. A file is
accepted when its sha256 matches the registry; a LIBSVM text file (its registry entry has a
``content`` record) is also accepted when its parsed content matches: the staged copies were
regenerated from SLANG's .mat files, so the upstream bytes may differ ('+1' vs '1', number
formatting), and then the row count, the label counts and :func:`libsvm_content_digest` decide.
A gzip file whose entry has a ``gunzipped`` record (full MNIST, Fashion-MNIST) is also accepted
when the sha256 and size of its DECOMPRESSED bytes match that record: the same IDX content
circulates gzipped with different bytes (LeCun's .gz, the staged re-gzipped .npm.gz, Debian's
recompressed Fashion-MNIST). A registry entry may have ``alternates``, the staged form of the same
content (one file for a full-MNIST .gz, eight for CIFAR-10's archive); :func:`present_forms`
gives the files of the form a data directory holds.
"""
from __future__ import annotations

import gzip
import hashlib
import zlib
from pathlib import Path
from typing import NamedTuple

import numpy as np

from refbayes.datasets.libsvm import parse_libsvm
from refbayes.datasets.registry import FileSpec

__all__ = ["FileStatus", "libsvm_content_digest", "sha256_file", "gunzip_sha256",
           "present_form", "present_forms", "check_file_digest", "check_file"]

_CHUNK = 1 << 16


class FileStatus(NamedTuple):
    path: str    # relative to the data directory
    status: str  # "ok", "missing" or "mismatch"
    detail: str  # how it was verified, or what differs


def libsvm_content_digest(X, y) -> str:
    """sha256 of ``X`` as little-endian float64 bytes (C order) followed by those of ``y``."""
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(X, dtype="<f8").tobytes())
    h.update(np.ascontiguousarray(y, dtype="<f8").tobytes())
    return h.hexdigest()


def sha256_file(path) -> str:
    """Hex sha256 of a file's bytes, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def gunzip_sha256(path, max_size: int) -> tuple:
    """(hex sha256, size) of a gzip file's decompressed bytes, streamed in chunks.

    Stops reading once more than ``max_size`` bytes came out (the size returned is then
    ``max_size + 1``: too long), so a wrong file cannot make it decompress without bound.
    ValueError naming the file if it is no gzip stream or the stream is damaged or truncated.
    """
    h = hashlib.sha256()
    size = 0
    try:
        with gzip.open(path, "rb") as fh:
            while size <= max_size:
                chunk = fh.read(min(_CHUNK * 16, max_size + 1 - size))
                if not chunk:
                    break
                h.update(chunk)
                size += len(chunk)
    except (OSError, EOFError, zlib.error) as err:  # BadGzipFile is an OSError
        raise ValueError(f"{path}: not a readable gzip stream: {err}") from err
    return h.hexdigest(), size


def present_form(spec: FileSpec, root) -> FileSpec:
    """The form of ``spec`` (itself, else one of ``spec.alternates``) that is a file under
    ``root``; ``spec`` itself when none is, so a missing file is reported by its canonical name."""
    for form in (spec, *spec.alternates):
        if (Path(root) / form.path).is_file():
            return form
    return spec


def present_forms(spec: FileSpec, root) -> tuple:
    """The registry entries of the form of ``spec`` a data directory holds.

    ``(spec,)`` when its own file is under ``root``; else ``spec.alternates`` (all of them: a
    staged form may be several files, each then checked, an absent one reported missing) when any
    of them is there; else ``(spec,)``, so a file present in no form is reported by its canonical
    name. For a one-file staged form this is ``(present_form(spec, root),)``.
    """
    root = Path(root)
    if (root / spec.path).is_file() or not any((root / g.path).is_file()
                                               for g in spec.alternates):
        return (spec,)
    return tuple(spec.alternates)


def _check_gunzipped(spec: FileSpec, path: Path) -> FileStatus:
    want = spec.gunzipped
    try:
        digest, size = gunzip_sha256(path, want.size)
    except ValueError as err:
        return FileStatus(spec.path, "mismatch", f"sha256 differs and {err}")
    if size != want.size or digest != want.sha256:
        found = f"more than {want.size}" if size > want.size else str(size)
        return FileStatus(spec.path, "mismatch",
                          f"sha256 differs and the decompressed content differs: {found} bytes "
                          f"with sha256 {digest[:16]}..., expected {want.size} bytes with sha256 "
                          f"{want.sha256[:16]}...")
    return FileStatus(spec.path, "ok", "sha256 of the decompressed content (gzip bytes differ)")


def _check_content(spec: FileSpec, path: Path) -> FileStatus:
    want = spec.content
    try:
        X, y = parse_libsvm(path, want.n_features)
    except ValueError as err:
        return FileStatus(spec.path, "mismatch", f"sha256 differs and the file does not parse: {err}")
    labels, counts = np.unique(y, return_counts=True)
    got_counts = tuple(zip(labels.tolist(), counts.tolist()))
    if X.shape[0] != want.n_rows or got_counts != tuple(want.label_counts):
        return FileStatus(spec.path, "mismatch",
                          f"sha256 differs and content differs: {X.shape[0]} rows with label counts "
                          f"{got_counts}, expected {want.n_rows} rows with {tuple(want.label_counts)}")
    if libsvm_content_digest(X, y) != want.digest:
        return FileStatus(spec.path, "mismatch",
                          "sha256 differs and the parsed values differ (content digest)")
    return FileStatus(spec.path, "ok", "content (bytes differ from the staged copy; parsed X, y identical)")


def check_file_digest(spec: FileSpec, path) -> tuple:
    """Check a file against its registry entry and return the digest found.

    The one check behind :func:`check_file`, ``data verify`` and verify-on-load
    (:mod:`refbayes.datasets.integrity`): sha256, or parsed content for LIBSVM text files, or
    the sha256 of the decompressed bytes for gzip files with a ``gunzipped`` record.

    Parameters
    ----------
    spec : FileSpec
        The registry entry.
    path : path-like
        The file on disk.

    Returns
    -------
    tuple of (FileStatus, str or None)
        The status, and the sha256 of the file's bytes (None for a missing file).
    """
    path = Path(path)
    if not path.is_file():
        return FileStatus(spec.path, "missing", str(path)), None
    digest = sha256_file(path)
    if digest == spec.sha256:
        return FileStatus(spec.path, "ok", "sha256"), digest
    if spec.content is not None:
        return _check_content(spec, path), digest
    if spec.gunzipped is not None:
        return _check_gunzipped(spec, path), digest
    return (FileStatus(spec.path, "mismatch",
                       f"sha256 {digest[:16]}..., expected {spec.sha256[:16]}..."), digest)


def check_file(spec: FileSpec, path) -> FileStatus:
    """Status of the file at ``path`` against registry entry ``spec`` (see the module docstring)."""
    return check_file_digest(spec, path)[0]
