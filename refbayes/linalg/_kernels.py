"""numba kernels of the low-rank-plus-diagonal algebra (NumPy only; CuPy uses its own products).

Compiled once per dtype and memory layout and cached to disk (``cache=True``).
"""
from __future__ import annotations

import numba
import numpy as np

__all__ = ["column_extremes", "scale_rows"]


@numba.njit(cache=True)
def scale_rows(U, w, out):
    """out[i, j] = w[i] U[i, j]: diag(w) U written into the preallocated ``out`` (same shape).

    Each entry is the same single multiplication as NumPy's ``U * w[:, None]``, so the result
    equals the broadcast one bit for bit; where it is faster (measured) is stated in
    ``lowrank._weighted_gram``, its caller.
    """
    D, L = U.shape
    for i in range(D):
        w_i = w[i]
        for j in range(L):
            out[i, j] = U[i, j] * w_i
    return out


@numba.njit(cache=True)
def column_extremes(V, top, bottom):
    """top[j] = max_i V[i, j], bottom[j] = min_i V[i, j] in one row-by-row pass over a C-ordered
    (D, L) array (NumPy's reductions down the columns of that layout are ~10x slower for small
    L); a column holding a NaN gets NaN in both, as NumPy's max and min give. Equal to
    ``V.max(axis=0)``, ``V.min(axis=0)`` (max and min are exact; where the extreme is a zero its
    sign may differ, which no caller's comparison sees)."""
    D, L = V.shape
    nan = np.zeros(L, dtype=np.bool_)
    for j in range(L):
        top[j] = -np.inf
        bottom[j] = np.inf
    for i in range(D):
        for j in range(L):
            x = V[i, j]
            if x > top[j]:
                top[j] = x
            if x < bottom[j]:
                bottom[j] = x
            if x != x:
                nan[j] = True
    for j in range(L):
        if nan[j]:
            top[j] = np.nan
            bottom[j] = np.nan
