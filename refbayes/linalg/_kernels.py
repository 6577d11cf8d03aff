"""numba kernels of the low-rank-plus-diagonal algebra (NumPy only; CuPy uses its own products).

Compiled once per dtype and memory layout and cached to disk (``cache=True``).
"""
from __future__ import annotations

import numba

__all__ = ["scale_rows"]


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
