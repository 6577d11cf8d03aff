"""Whitespace- or comma-separated numeric text (``numpy.loadtxt``) with errors that name the file."""
from __future__ import annotations

import gzip
import zlib

import numpy as np

__all__ = ["loadtxt"]


def loadtxt(path, *, dtype, ndmin: int, delimiter=None) -> np.ndarray:
    """``numpy.loadtxt(path, ...)``; a parse error (bad number, ragged rows, bad gzip stream,
    non-text bytes) is re-raised as a ValueError that starts with the file's path."""
    try:
        return np.loadtxt(path, dtype=dtype, ndmin=ndmin, delimiter=delimiter)
    except (ValueError, EOFError, gzip.BadGzipFile, zlib.error) as err:
        # A damaged .gz stream raises BadGzipFile (an OSError), zlib.error or EOFError.
        raise ValueError(f"{path}: could not parse as numeric text: {err}") from err
