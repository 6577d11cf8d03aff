"""Return types shared by the readers, and the dtype argument check."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["Data", "TrainTest", "float_dtype"]


class Data(NamedTuple):
    X: np.ndarray  # (n, p) features
    y: np.ndarray  # (n,) labels or targets


class TrainTest(NamedTuple):
    X_train: np.ndarray  # (n_train, p)
    y_train: np.ndarray  # (n_train,)
    X_test: np.ndarray   # (n_test, p)
    y_test: np.ndarray   # (n_test,)


def float_dtype(dtype, name: str = "dtype") -> np.dtype:
    """``dtype`` as a NumPy dtype, which must be float64 or float32."""
    try:
        dt = np.dtype(dtype)
    except TypeError as err:
        raise ValueError(f"{name}: expected float64 or float32, got {dtype!r}") from err
    if dt not in (np.dtype(np.float64), np.dtype(np.float32)):
        raise ValueError(f"{name}: expected float64 or float32, got {dt}")
    return dt
