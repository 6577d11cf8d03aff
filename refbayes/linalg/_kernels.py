"""numba kernels of the low-rank-plus-diagonal algebra (NumPy only; CuPy uses its own products).

Compiled once per dtype and memory layout and cached to disk (``cache=True``).
"""
from __future__ import annotations

import numba

__all__ = ["scale_rows"]


@numba.njit(cache=True)
def scale_rows(U, w, out):
    """out[i, j] = w[i] U[i, j]: diag(w) U written into the preallocated ``out`` (same shape).

    NumPy's ``U * w[:, None]`` on a C-ordered (D, L) array runs its inner loop over the L
    entries of one row, D times; at L = 10 that measured 0.12 ms at D = 1e4 against this loop's
    0.057 ms (one thread). The product of each entry is the same single multiplication, so the
    result equals the broadcast one bit for bit.
    """
    D, L = U.shape
    for i in range(D):
        w_i = w[i]
        for j in range(L):
            out[i, j] = U[i, j] * w_i
    return out
