"""The one check of a dataset file against its registry entry: sha256, or parsed content.

Behind ``refbayes data verify`` and ``fetch`` (:mod:`refbayes.datasets.download`) and
verify-on-load (:mod:`refbayes.datasets.integrity`), which both import it from here. A file is
accepted when its sha256 matches the registry; a LIBSVM text file (its registry entry has a
``content`` record) is also accepted when its parsed content matches: the staged copies were
regenerated from SLANG's .mat files, so the upstream bytes may differ ('+1' vs '1', number
formatting), and then the row count, the label counts and :func:`libsvm_content_digest` decide.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import NamedTuple

import numpy as np

from refbayes.datasets.libsvm import parse_libsvm
from refbayes.datasets.registry import FileSpec

__all__ = ["FileStatus", "libsvm_content_digest", "sha256_file", "check_file_digest",
           "check_file"]

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
    (:mod:`refbayes.datasets.integrity`): sha256, or parsed content for LIBSVM text files.

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
    return (FileStatus(spec.path, "mismatch",
                       f"sha256 {digest[:16]}..., expected {spec.sha256[:16]}..."), digest)


def check_file(spec: FileSpec, path) -> FileStatus:
    """Status of the file at ``path`` against registry entry ``spec`` (see the module docstring)."""
    return check_file_digest(spec, path)[0]
