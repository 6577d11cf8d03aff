"""Parser of LIBSVM / svmlight text files (``label index:value index:value ...``).

:func:`parse_libsvm` is the bare parser: it verifies nothing, so that the registry check
(:mod:`refbayes.datasets.digests`) can use it on a LIBSVM file's parsed content.
:func:`refbayes.datasets.loaders.load_libsvm` verifies a registered dataset file against the
registry before it parses it (and warns for any other file).
"""
from __future__ import annotations

import math
import os
import re
from pathlib import Path

import numpy as np

from refbayes._checks import check_int
from refbayes.datasets._containers import Data, float_dtype

__all__ = ["parse_libsvm"]


def _parse_entry(token: str, where: str) -> tuple[int, float]:
    idx_text, sep, val_text = token.partition(":")
    if not sep or not idx_text.isdigit():
        raise ValueError(f"{where}: expected 'index:value' with an integer index >= 1, got {token!r}")
    idx = int(idx_text)
    try:
        val = float(val_text)
    except ValueError:
        raise ValueError(f"{where}: expected a number after ':', got {token!r}") from None
    if idx < 1 or not math.isfinite(val):
        raise ValueError(f"{where}: expected index >= 1 and a finite value, got {token!r}")
    return idx, val


def _parse_label(token: str, where: str) -> float:
    try:
        label = float(token)
    except ValueError:
        raise ValueError(f"{where}: expected a numeric label first, got {token!r}") from None
    if not math.isfinite(label):
        raise ValueError(f"{where}: expected a finite label, got {token!r}")
    return label


_NEWLINE = re.compile(r"\r\n|\r|\n")  # universal newlines, as text mode reads them


def _lines(fh, path: Path):
    """``(line number, text)`` of a binary file, lines split as text mode would; a byte that is
    not ASCII is a ValueError naming the file and line (decoded line by line, not in blocks, so
    the line number is exact)."""
    lineno = 0
    for raw in fh:
        try:
            text = raw.decode("ascii")
        except UnicodeDecodeError as err:
            raise ValueError(f"{path}:{lineno + 1}: expected ASCII text, got byte "
                             f"{raw[err.start:err.start + 1]!r} at column {err.start + 1}") from None
        pieces = _NEWLINE.split(text)
        if pieces[-1] == "":
            pieces.pop()  # the piece after the final line terminator
        for line in pieces:
            lineno += 1
            yield lineno, line


def _parse_lines(path: Path, n_features):
    """Labels, and (row, 1-based index, value) triplets, of every non-blank line."""
    labels, rows, cols, vals = [], [], [], []
    with open(path, "rb") as fh:
        for lineno, line in _lines(fh, path):
            # svmlight allows a trailing '# comment'; blank lines carry no example.
            tokens = line.split("#", 1)[0].split()
            if not tokens:
                continue
            where = f"{path}:{lineno}"
            labels.append(_parse_label(tokens[0], where))
            seen = set()
            for token in tokens[1:]:
                idx, val = _parse_entry(token, where)
                if idx in seen:
                    raise ValueError(f"{where}: index {idx} appears twice on one line")
                if n_features is not None and idx > n_features:
                    raise ValueError(f"{where}: expected indices in [1, {n_features}] "
                                     f"(n_features={n_features}), got index {idx}")
                seen.add(idx)
                rows.append(len(labels) - 1)
                cols.append(idx)
                vals.append(val)
    return labels, rows, cols, vals


def _check_path_arg(path) -> None:
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"path: expected a file path, got {type(path).__name__}")


def parse_libsvm(path, n_features=None, *, dtype=np.float64) -> Data:
    """Dense (X, y) from LIBSVM text: ``X[i, j - 1] = v`` for each ``j:v`` on example line i.

    Indices are 1-based; absent entries are 0. The label is the first token ('+1', '1' and '-1'
    all parse as numbers; labels are returned as read, not mapped). Blank lines and trailing
    '# comments' are skipped; trailing spaces are fine. ``n_features`` fixes the number of
    columns (a1a needs 123 because features 120-123 never occur in its training file); when None
    it is the largest index present.

    No checksum verification (see :func:`refbayes.datasets.loaders.load_libsvm`).

    Parameters
    ----------
    path : path-like
        The file.
    n_features : int, optional
        Number of columns of X; None means the largest index present.
    dtype : numpy dtype, optional
        The dtype of X and y: float64 (default) or float32.

    Returns
    -------
    Data
        ``X`` (n, n_features) and ``y`` (n,) labels as read.

    Raises
    ------
    ValueError
        Naming the file and line for a malformed line, a byte that is not ASCII, a repeated
        index, or an index larger than ``n_features``; and for a file with no examples.
    """
    dt = float_dtype(dtype)
    _check_path_arg(path)
    path = Path(path)
    if n_features is not None:
        n_features = check_int(n_features, "n_features", low=1)
    labels, rows, cols, vals = _parse_lines(path, n_features)
    if not labels:
        raise ValueError(f"{path}: expected at least one 'label index:value ...' line, got none")
    cols = np.asarray(cols, dtype=np.int64)
    p = n_features if n_features is not None else int(cols.max(initial=0))
    X = np.zeros((len(labels), p), dtype=np.float64)
    X[np.asarray(rows, dtype=np.int64), cols - 1] = vals
    return Data(X.astype(dt, copy=False), np.asarray(labels, dtype=dt))
