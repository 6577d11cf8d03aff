"""Reader for LeCun's IDX format (the MNIST files), gzipped or not.

An IDX file is a big-endian header followed by the data in C order: a 32-bit magic number whose
third byte is the element type (0x08 = unsigned byte) and fourth the number of dimensions, then
one 32-bit size per dimension. MNIST's image files have magic 2051 (0x00000803: unsigned bytes,
3 dimensions: count, rows, columns) and its label files 2049 (0x00000801: unsigned bytes, one
dimension: count). The readers check the magic number, the count and the image shape against
what the caller expects and that exactly that many bytes follow the header; any difference is a
ValueError naming the file. They do not verify checksums: the loaders do that first
(:func:`refbayes.datasets.integrity.verified_file`).
"""
from __future__ import annotations

import gzip
import struct
import zlib
from pathlib import Path

import numpy as np

__all__ = ["IMAGES_MAGIC", "LABELS_MAGIC", "read_idx_images", "read_idx_labels"]

IMAGES_MAGIC = 2051  # 0x00000803: unsigned bytes, 3 dimensions (count, rows, columns)
LABELS_MAGIC = 2049  # 0x00000801: unsigned bytes, 1 dimension (count)
_KIND = {IMAGES_MAGIC: "an image file", LABELS_MAGIC: "a label file"}


def _read_bytes(path: Path) -> bytes:
    """The file's bytes, decompressed when it starts with the gzip magic bytes."""
    with open(path, "rb") as fh:
        gzipped = fh.read(2) == b"\x1f\x8b"
    if not gzipped:
        return path.read_bytes()
    try:
        with gzip.open(path, "rb") as fh:
            return fh.read()
    except (OSError, EOFError, zlib.error) as err:  # BadGzipFile is an OSError
        raise ValueError(f"{path}: damaged or truncated gzip stream: {err}") from err


def _header(path: Path, data: bytes, magic: int, n_dims: int) -> tuple:
    size = 4 * (1 + n_dims)
    if len(data) >= 4:  # the magic number first: a label file passed as images is named as such
        found = struct.unpack(">I", data[:4])[0]
        if found != magic:
            other = f" ({_KIND[found]})" if found in _KIND else ""
            raise ValueError(f"{path}: IDX magic number {found}{other}, expected {magic} "
                             f"({_KIND[magic]}: unsigned bytes, {n_dims} dimension"
                             f"{'s' if n_dims > 1 else ''})")
    if len(data) < size:
        raise ValueError(f"{path}: {len(data)} bytes, too short for the {size}-byte IDX header "
                         f"of {_KIND[magic]}")
    return struct.unpack(f">{n_dims}I", data[4:size]), size


def _body(path: Path, data: bytes, offset: int, n_bytes: int, what: str) -> np.ndarray:
    found = len(data) - offset
    if found != n_bytes:
        state = "truncated" if found < n_bytes else "trailing bytes"
        raise ValueError(f"{path}: {state}: the header announces {what} = {n_bytes} bytes after "
                         f"the {offset}-byte header, the file has {found}")
    return np.frombuffer(data, dtype=np.uint8, offset=offset)


def _check_count(path: Path, found: int, expected: int, what: str) -> None:
    if found != expected:
        raise ValueError(f"{path}: expected {expected} {what}, the IDX header says {found}")


def read_idx_images(path, n_images: int, shape: tuple = (28, 28)) -> np.ndarray:
    """Read an IDX image file (magic 2051) as a (n_images, rows * cols) uint8 array.

    Parameters
    ----------
    path : path-like
        The file, gzipped (``.gz``, detected by its first two bytes) or not.
    n_images : int
        The number of images the header must announce (60000 for MNIST train, 10000 for test).
    shape : tuple of int, default (28, 28)
        The (rows, cols) the header must announce.

    Returns
    -------
    numpy.ndarray
        uint8, shape (n_images, rows * cols); row i is image i flattened row-major, so
        ``X[i].reshape(rows, cols)`` displays upright. A read-only view of the decompressed bytes.

    Raises
    ------
    ValueError
        Naming the file: a damaged gzip stream, a wrong magic number, count or shape, or a body
        that is shorter (truncated) or longer than the header announces.
    """
    path = Path(path)
    data = _read_bytes(path)
    (n, rows, cols), offset = _header(path, data, IMAGES_MAGIC, 3)
    _check_count(path, n, n_images, "images")
    if (rows, cols) != tuple(shape):
        raise ValueError(f"{path}: expected images of {shape[0]} x {shape[1]} pixels, the IDX "
                         f"header says {rows} x {cols}")
    pixels = _body(path, data, offset, n * rows * cols, f"{n} x {rows} x {cols} pixels")
    return pixels.reshape(n, rows * cols)


def read_idx_labels(path, n_labels: int, n_classes: int = 10) -> np.ndarray:
    """Read an IDX label file (magic 2049) as a (n_labels,) int64 array of class indices.

    Parameters
    ----------
    path : path-like
        The file, gzipped (``.gz``, detected by its first two bytes) or not.
    n_labels : int
        The number of labels the header must announce.
    n_classes : int, default 10
        Labels must lie in 0 .. n_classes - 1.

    Returns
    -------
    numpy.ndarray
        int64, shape (n_labels,).

    Raises
    ------
    ValueError
        Naming the file: a damaged gzip stream, a wrong magic number or count, a body that is
        shorter (truncated) or longer than the header announces, or a label out of range.
    """
    path = Path(path)
    data = _read_bytes(path)
    (n,), offset = _header(path, data, LABELS_MAGIC, 1)
    _check_count(path, n, n_labels, "labels")
    labels = _body(path, data, offset, n, f"{n} labels").astype(np.int64)
    if labels.size and labels.max() >= n_classes:
        bad = sorted(np.unique(labels[labels >= n_classes]).tolist())
        raise ValueError(f"{path}: expected labels in 0..{n_classes - 1}, got {bad}")
    return labels
