"""numba kernels for per-example gradients of a dense network (NumPy only, the CPU default).

Implements (peg.1)-(peg.5) of derivations/per_example_gradients.md as batched BLAS products
(``@`` inside the jitted code) plus explicit loops over examples, generic over the number of layers: the network is one flat theta plus an offsets table
(``Layout``), the activation is an integer code. Two kernels run back to back: ``forward_kernel``
stores every layer's output in one (M, sum(sizes)) buffer, the caller turns the outputs f into
r = dl/df with the likelihood (so its formulas live in one place), and ``backward_kernel``
propagates the errors and writes the (M, D) per-example gradients into a preallocated array
with no allocation inside the row loop.

Compiled once per dtype and cached to disk (``cache=True``); ``warmup()`` triggers both the
float64 and the float32 specializations.
"""
from __future__ import annotations

import functools

import numba
import numpy as np

from refbayes.models._layers import layout

__all__ = ["ACT_CODES", "per_example_grads_numba", "warmup"]

ACT_CODES = {"relu": 0, "tanh": 1, "sigmoid": 2}


@numba.njit(cache=True)
def _act(z, code):
    if code == 0:
        return z if z > 0 else z * 0  # relu, with relu'(0) = 0 below  (peg.5)
    if code == 1:
        return np.tanh(z)
    return 0.5 * (np.tanh(0.5 * z) + 1.0)


@numba.njit(cache=True)
def _act_prime(a, code):
    """act'(z) through a = act(z). (peg.5)"""
    if code == 0:
        return 1.0 if a > 0 else 0.0
    if code == 1:
        return 1.0 - a * a
    return a * (1.0 - a)


@numba.njit(cache=True)
def forward_kernel(theta, X, sizes, w_off, b_off, a_off, act_code, A):
    """A[:, a_off[l]:a_off[l+1]] = a_l for every example (a_0 = X; the last block is f). (peg.1)

    The product a_{l-1} W_l goes to BLAS through ``@`` (a view of theta's row-major block);
    bias and activation are loops.
    """
    M = X.shape[0]
    L = sizes.shape[0] - 1
    A[:, :sizes[0]] = X
    for l in range(L):
        n_in, n_out = sizes[l], sizes[l + 1]
        src, dst, w0, b0 = a_off[l], a_off[l + 1], w_off[l], b_off[l]
        W = theta[w0:w0 + n_in * n_out].reshape((n_in, n_out))
        Z = np.ascontiguousarray(A[:, src:src + n_in]) @ W  # (peg.1)
        for i in range(M):
            for q in range(n_out):
                z = (Z[i, q] + theta[b0 + q]) if b0 >= 0 else Z[i, q]  # (peg.1)
                A[i, dst + q] = _act(z, act_code) if l < L - 1 else z  # (peg.1)


@numba.njit(cache=True)
def backward_kernel(theta, A, R, sizes, w_off, b_off, a_off, act_code, G, E):
    """G[i] = per-example gradient of example i from r_i = R[i]. (peg.2)-(peg.4)

    E (M, sum(sizes[1:])) receives delta_l for every layer: first the errors by BLAS products
    over the batch, then the (M, D) rows by loops, with no allocation in the row loop.
    """
    M = A.shape[0]
    L = sizes.shape[0] - 1
    n0 = sizes[0]
    E[:, a_off[L] - n0:a_off[L + 1] - n0] = R  # (peg.2)
    for l in range(L - 1, 0, -1):
        n_in, n_out = sizes[l], sizes[l + 1]
        W = theta[w_off[l]:w_off[l] + n_in * n_out].reshape((n_in, n_out))
        back = np.ascontiguousarray(E[:, a_off[l + 1] - n0:a_off[l + 2] - n0]) @ W.T  # (peg.3)
        for i in range(M):
            for p in range(n_in):
                E[i, a_off[l] - n0 + p] = back[i, p] * _act_prime(A[i, a_off[l] + p], act_code)  # (peg.3)
    for i in range(M):
        # 1-d views of the rows: unit-stride inner loops that LLVM vectorizes (2-d indexing
        # G[i, row + q] did not: 3x slower at [784, 100, 10], M = 128; the same products)
        g, e, a = G[i], E[i], A[i]
        for l in range(L):
            n_in, n_out = sizes[l], sizes[l + 1]
            src, w0, b0, e0 = a_off[l], w_off[l], b_off[l], a_off[l + 1] - n0
            el = e[e0:e0 + n_out]
            for p in range(n_in):
                ap = a[src + p]
                gr = g[w0 + p * n_out:w0 + (p + 1) * n_out]
                for q in range(n_out):
                    gr[q] = ap * el[q]  # (peg.4)
            if b0 >= 0:
                for q in range(n_out):
                    g[b0 + q] = el[q]  # (peg.4)


@functools.lru_cache(maxsize=None)
def _tables(sizes: tuple, bias: bool):
    lay = layout(sizes, bias)
    tables = (np.asarray(sizes, dtype=np.int64), np.asarray(lay.w_off, dtype=np.int64),
              np.asarray(lay.b_off, dtype=np.int64),
              np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64))
    for t in tables:
        t.setflags(write=False)
    return tables + (lay.D,)


def per_example_grads_numba(theta, X, sizes, bias, activation, r_of_f, out=None):
    """(M, D) per-example gradients; ``r_of_f(f)`` maps the outputs (M, K) to dl/df (M, K).

    Unchecked: the caller has validated theta (D,), X (M, n_in) as C-contiguous NumPy arrays of
    one float dtype, and ``out`` (if given) as a C-contiguous (M, D) array of that dtype, which
    receives the rows (and is returned) instead of a fresh array.
    """
    sizes_a, w_off, b_off, a_off, D = _tables(tuple(sizes), bool(bias))
    theta = np.ascontiguousarray(theta)
    X = np.ascontiguousarray(X)
    # a one-layer (linear) model has no hidden activation: its code is never read
    code = ACT_CODES[activation] if len(sizes) > 2 else -1
    M, dtype = X.shape[0], theta.dtype
    A = np.empty((M, int(a_off[-1])), dtype=dtype)
    forward_kernel(theta, X, sizes_a, w_off, b_off, a_off, code, A)
    R = np.ascontiguousarray(r_of_f(A[:, int(a_off[-2]):]), dtype=dtype)
    G = np.empty((M, D), dtype=dtype) if out is None else out
    E = np.empty((M, int(a_off[-1]) - sizes[0]), dtype=dtype)
    backward_kernel(theta, A, R, sizes_a, w_off, b_off, a_off, code, G, E)
    return G


def warmup():
    """Compile (or load from the disk cache) the float64 and float32 per-example-gradient kernels.

    The activation is a runtime code, so one specialization per dtype serves them all.  Calling
    it first keeps the compilation out of the first ``per_example_grads(..., impl="numba")``.
    """
    for dtype in (np.float64, np.float32):
        theta = np.zeros(layout((2, 2, 1), True).D, dtype=dtype)
        X = np.zeros((1, 2), dtype=dtype)
        per_example_grads_numba(theta, X, (2, 2, 1), True, "relu", lambda f: f)
