"""Low-rank-plus-diagonal precision algebra: P = U U^T + diag(d).

Implements (lowrank.1)-(lowrank.12) of derivations/lowrank.md.
Symbols: U = low-rank precision factor (D, L), d = diagonal of the precision (D,), d > 0,
P = U U^T + diag(d) (D, D, never formed except by ``dense_*``), V = d^{-1/2} U (D, L),
C = I_L + V^T V the capacitance (L, L) with lower Cholesky factor R (R R^T = C),
W = a tall factor (D, K) whose rank-L truncation ``top_eig`` computes.

Every routine costs O(D L^2 + L^3) (plus O(D L K) for K right-hand sides) and touches no D x D
array; ``dense_precision`` and ``dense_covariance`` form the D x D matrices on purpose, for tests
and small D. All Cholesky factors are lower triangular: ``R = cholesky(C)`` means R R^T = C.

The factors (U, d), checked by every routine that takes them (ValueError otherwise, naming the
argument): U a finite float (float64 or float32) (D, L) array with L <= D; d a finite (D,) array
of U's dtype, every entry > 0 and at least the smallest normal number (so that 1 / d is finite);
U U^T finite and, for the routines that invert P, the capacitance I + U^T diag(d)^{-1} U finite
(``check_factor_values``); and U and d on one backend (NumPy or CuPy).
"""
from __future__ import annotations

import math

import numpy as np
import scipy.linalg.blas
import scipy.linalg.lapack

from refbayes._checks import (
    check_array,
    check_float,
    check_int,
    check_invertible_positive,
    check_same_dtype,
    value_checks,
)
from refbayes.backend import cho_solve, cholesky, linalg_of, solve_triangular, xp_of
from refbayes.linalg._kernels import column_extremes, scale_rows

# LAPACK's Cholesky solve by dtype (``_chol_solve``); other dtypes, L = 0 and CuPy take
# ``backend.cho_solve``
_POTRS = {np.dtype(np.float64): scipy.linalg.lapack.dpotrs,
          np.dtype(np.float32): scipy.linalg.lapack.spotrs}

__all__ = ["matvec", "solve", "logdet", "diag_inv", "trace_inv", "quad", "inv_quad",
           "sample", "sample_alg3", "top_eig", "dense_precision", "dense_covariance"]


# ----------------------------------------------------------------------------- validation

def _check_factors(U, d, *, inverse=True):
    """Validate (U, d) of a precision U U^T + diag(d); return (D, L).

    ``inverse``: the routine inverts P (forms the capacitance or d^{-1/2} U), see
    ``check_factor_values``.
    """
    check_array(U, "U", ndim=2)
    check_float(U, "U")
    D, L = U.shape
    if L > D:
        raise ValueError(f"U: expected shape (D, L) with L <= D, got {tuple(U.shape)}")
    check_array(d, "d", shape=(D,))
    check_float(d, "d")
    check_same_dtype({"U": U, "d": d})
    check_factor_values(U, d, inverse=inverse)
    return D, L


def check_factor_values(U, d, names=("U", "d"), *, inverse=True):
    """Check that finite factors U (D, L), d (D,) of one dtype give finite intermediates.

    d: every entry > 0 and at least the smallest normal number of the dtype, so that 1 / d is
    finite (1 / 1e-320 overflows float64). U: every row norm at most sqrt(max float), so that
    U U^T is finite (its entries are bounded by its diagonal, by Cauchy-Schwarz). With
    ``inverse`` also every column norm of d^{-1/2} U, so that the capacitance
    I + U^T diag(d)^{-1} U (lowrank.2) is finite. The squared norms are summed directly (a
    finite one is in bounds); only when one overflows are the norms recomputed from U / max|U|,
    which cannot overflow, for the message. Raises ValueError naming ``names``; not part of the
    public API (shared with refbayes.linalg.gaussian and the methods).
    """
    if not value_checks():  # refbayes.unchecked(): a driver's own arrays
        return
    xp = xp_of(U, d)
    check_invertible_positive(d, names[1])
    if U.size == 0:
        return
    # The squared norms in one pass each and no D x L temporary: a finite r^2 is <= max float,
    # i.e. r <= sqrt(max), so only an overflow (inf) needs the scaled norms, which name it.
    if not bool(xp.isfinite(xp.max(xp.einsum("ij,ij->i", U, U)))):
        _raise_scaled_norm(U, d, names, columns=False)
    if inverse and not bool(xp.all(xp.isfinite(xp.einsum("ij,ij,i->j", U, U, 1 / d)))):
        _raise_scaled_norm(U, d, names, columns=True)


def _raise_scaled_norm(U, d, names, *, columns):
    """Raise for the row norm of U (or column norm of d^{-1/2} U) that exceeds sqrt(max float).

    The norms are computed from U / max|U| and scaled by 1 / sqrt(D), so that they cannot
    overflow themselves. ``check_factor_values`` calls this only once a squared norm overflowed.
    """
    xp = xp_of(U, d)
    name_U, name_d = names
    big = float(xp.max(xp.abs(U)))
    root_max = math.sqrt(float(xp.finfo(U.dtype).max))
    Us = U / big  # entries in [-1, 1]
    if not columns:
        row = big * math.sqrt(float(xp.max(xp.sum(Us * Us, axis=1))))
        raise ValueError(f"{name_U}: expected entries small enough that U U^T is finite in "
                         f"{U.dtype}, got a row of norm {row:.3e} > sqrt(max {U.dtype}) = "
                         f"{root_max:.3e}")
    D = U.shape[0]
    Vs = Us / (xp.sqrt(d) * math.sqrt(D))[:, None]  # each squared entry <= 1 / (D tiny)
    col = big * math.sqrt(float(xp.max(xp.sum(Vs * Vs, axis=0)))) * math.sqrt(D)
    raise ValueError(f"{name_U}, {name_d}: expected U^T diag(d)^{{-1}} U (the capacitance) "
                     f"finite in {U.dtype}, got a column of d^(-1/2) U of norm "
                     f"{col:.3e} > sqrt(max {U.dtype}) = {root_max:.3e}")


def _check_rhs(x, name, D, dtype):
    """A right-hand side of shape (D,) or (D, K) in the factors' dtype."""
    check_array(x, name, ndim=(1, 2))
    if x.shape[0] != D:
        want = f"({D},) or ({D}, K)"
        raise ValueError(f"{name}: expected shape {want} (first dimension D = {D}), "
                         f"got {tuple(x.shape)}")
    check_float(x, name)
    if x.dtype != dtype:
        raise ValueError(f"{name}, U: expected one dtype for all, got {name}: {x.dtype}, U: {dtype}")


def _col(v, like):
    """v (D,) as a column (D, 1) when ``like`` is (D, K): explicit row scaling, no guessing."""
    return v[:, None] if like.ndim == 2 else v


# ----------------------------------------------------------------------------- private kernels

# BLAS gemm by dtype for a block's V_b^T V_b (``_weighted_gram``): NumPy's matmul sends a product
# of an array with its own transpose to syrk, which OpenBLAS runs 1.5-1.9x slower than gemm for
# these tall (rows, L) blocks (one thread, L = 10: 8192 rows 200 us against 108 us, 1808 rows
# 17.5 against 11.7; derivations/lowrank_experiments.md)
_GEMM = {np.dtype(np.float64): scipy.linalg.blas.dgemm,
         np.dtype(np.float32): scipy.linalg.blas.sgemm}

# Rows per block of the Gram sum on NumPy: a block of d^{-1/2} U then stays in cache (8192 x L
# doubles, 640 kB at L = 10) instead of a D x L temporary streamed through memory, and V_b^T V_b
# of one buffer is a symmetric rank-k product. Measured (one thread, L = 10) against
# U^T (U / d) in one piece: 1.07x faster at D = 1e4, 1.4x at 1e5, 1.9x at 1e6.
_ROWS_PER_BLOCK = 8192


def _weighted_gram(U, d):
    """U^T diag(d)^{-1} U = V^T V with V = d^{-1/2} U (L, L), summed over blocks of rows:
    sum_b V_b^T V_b. On NumPy each block is scaled into one reused (rows, L) buffer and no
    D x L temporary is formed; CuPy takes all rows in one product.

    The scaling, measured at 8192 rows (one thread): the broadcast product U_b * w_b[:, None]
    takes 0.0044 / 0.054 / 0.103 ms at L = 1 / 2 / 10, the numba loop ``_kernels.scale_rows``
    0.027 / 0.032 / 0.047 ms. At L = 1 the broadcast is one contiguous vector product, so it
    is kept there. Each block's V_b^T V_b is a BLAS gemm (``_GEMM``), not the syrk NumPy picks.
    """
    xp = xp_of(U, d)
    D, L = U.shape
    w = 1 / xp.sqrt(d)
    if xp is not np:
        V = U * w[:, None]
        return V.T @ V  # U^T d^{-1} U, the capacitance's Gram term of (lowrank.2)
    rows = _ROWS_PER_BLOCK
    G = np.zeros((L, L), dtype=U.dtype)
    buffer = np.empty((min(rows, D), L), dtype=U.dtype)
    gemm = _GEMM.get(U.dtype) if L > 0 else None
    for start in range(0, D, rows):
        U_b = U[start:start + rows]
        w_b, V_b = w[start:start + rows], buffer[:U_b.shape[0]]
        if L == 1:
            np.multiply(U_b, w_b[:, None], out=V_b)
        else:
            scale_rows(U_b, w_b, V_b)
        if gemm is None:
            G += V_b.T @ V_b  # U_b^T d_b^{-1} U_b, the capacitance's Gram term of (lowrank.2)
        else:  # the same product by gemm: V_b^T is Fortran-ordered, so no copy is made
            G += gemm(1.0, V_b.T, V_b.T, trans_b=1)  # (lowrank.2): U_b^T d_b^{-1} U_b
    return G


def _capacitance_chol(U, d):
    """R lower with R R^T = C = I_L + U^T diag(d)^{-1} U.  (lowrank.2)"""
    xp = xp_of(U, d)
    C = xp.eye(U.shape[1], dtype=U.dtype) + _weighted_gram(U, d)  # capacitance of (lowrank.2)
    return cholesky(C, check=False)  # I + a Gram matrix: positive definite by construction


def _chol_solve(R, B):
    """C^{-1} B for C = R R^T (R lower): the triangular solves R Y = B, then R^T Z = Y.

    On NumPy both in one LAPACK call (potrs, the same two triangular solves), which saves the
    argument handling of two ``scipy.linalg.solve_triangular`` calls (about 20 us each, as much
    as the L x L work at L <= 32).  (lowrank.3)
    """
    xp = xp_of(R, B)
    if xp is np and R.dtype in _POTRS and R.shape[0] > 0:
        Z, info = _POTRS[R.dtype](R, B, lower=1)
        if info != 0:  # only an illegal argument: R comes from a successful Cholesky
            raise ValueError(f"R: LAPACK potrs reported info = {info}")
        return Z
    return cho_solve(R, B)


def _whitened_rhs(R, U, h):
    """Y = R^{-1} U^T h with h = d^{-1} x: the half-solve shared by solve and inv_quad."""
    return solve_triangular(R, U.T @ h, lower=True)


def _sqrt_weight(lam):
    """f(lam) = (1 - (1 + lam)^{-1/2}) / lam = 1 / (t (1 + t)), t = sqrt(1 + lam).

    The right-hand form is finite at lam = 0 (value 1/2) and never divides by lam, which is
    what makes ``sample`` well defined for rank-deficient U.  (lowrank.8)
    """
    xp = xp_of(lam)
    t = xp.sqrt(1 + xp.maximum(lam, 0))  # eigh may return -1e-17 for an exact zero eigenvalue
    return 1 / (t * (1 + t))  # (lowrank.8)


def _well_conditioned_chol(A):
    """A finite Cholesky factor with min_j A_jj > sqrt(eps) max_j A_jj (cond(A A^T) < ~1/eps)."""
    xp = xp_of(A)
    if A.shape[0] == 0:
        return True
    a = xp.diagonal(A)
    tiny = float(xp.finfo(A.dtype).eps) ** 0.5
    return bool(xp.all(xp.isfinite(a))) and bool(xp.min(a) > tiny * xp.max(a))


def _fix_signs(V):
    """Flip each column so that its largest-``|entry|`` (first one on ties) is >= 0.

    The column maxima and minima decide it (on a C-ordered NumPy V one numba pass over the rows,
    ``_kernels.column_extremes``, 5-10x faster than NumPy's reductions down its columns; else two
    reductions, ~10x faster than an argmax of ``|V|``); only a column whose largest
    positive and negative entries tie in magnitude takes the argmax, for the first-one rule
    (on NumPy only when there is such a column; on CuPy always, since asking would read a flag
    back from the device). V is flipped in place and returned.
    """
    xp = xp_of(V)
    if V.shape[1] == 0 or V.shape[0] == 0:
        return V
    if xp is np and V.flags.c_contiguous and V.shape[1] > 1:  # (D, 1): NumPy's own is faster
        top, bottom = np.empty(V.shape[1], V.dtype), np.empty(V.shape[1], V.dtype)
        column_extremes(V, top, bottom)  # one pass over the rows
    else:
        top, bottom = V.max(axis=0), V.min(axis=0)
    s = xp.where(top >= -bottom, 1.0, -1.0).astype(V.dtype)
    tie = (top == -bottom) & (top != 0)
    if xp is not np or bool(xp.any(tie)):
        idx = xp.argmax(xp.abs(V), axis=0)
        first = xp.sign(V[idx, xp.arange(V.shape[1])])
        s = xp.where(tie, xp.where(first == 0, 1, first), s).astype(V.dtype)
    V *= s  # in place: both callers pass the eigenvectors they just computed
    return V


# ----------------------------------------------------------------------------- products and solves

def matvec(U, d, x):
    """Multiply by the precision P = U U^T + diag(d).

    P x = U (U^T x) + d * x in O(D L K), without forming P.  (lowrank.1)

    Parameters
    ----------
    U : array of shape (D, L)
        Low-rank factor of the precision, L <= D.
    d : array of shape (D,)
        Diagonal of the precision, d > 0, same dtype as U.
    x : array of shape (D,) or (D, K)
        Vector or K right-hand sides, same dtype as U.

    Returns
    -------
    array of shape (D,) or (D, K)
        P x, shaped like x.

    Raises
    ------
    ValueError
        If U or d is invalid (see refbayes.linalg.lowrank), or x is not (D,) or (D, K) of U's
        dtype.
    """
    xp_of(U, d, x)  # one backend for all inputs (raises on a NumPy/CuPy mix); no xp call needed
    D, _ = _check_factors(U, d, inverse=False)
    _check_rhs(x, "x", D, U.dtype)
    return U @ (U.T @ x) + _col(d, x) * x  # (lowrank.1)


def solve(U, d, g):
    """Solve P z = g by the Woodbury identity, without forming P.

    P^{-1} g = d^{-1} g - d^{-1} U C^{-1} U^T d^{-1} g with C = I_L + U^T d^{-1} U.
    C = R R^T (lower Cholesky; C is SPD with eigenvalues >= 1), then two triangular solves:
    P^{-1} g = h - d^{-1} U R^{-T} R^{-1} U^T h with h = d^{-1} g.  (lowrank.3)
    This is the SLANG poster's Algorithm 2 (fast_inverse), whose printed lines are correct.

    Parameters
    ----------
    U : array of shape (D, L)
        Low-rank factor of the precision, L <= D.
    d : array of shape (D,)
        Diagonal of the precision, d > 0, same dtype as U.
    g : array of shape (D,) or (D, K)
        Right-hand side(s), same dtype as U.

    Returns
    -------
    array of shape (D,) or (D, K)
        P^{-1} g, shaped like g.

    Raises
    ------
    ValueError
        If U or d is invalid (see refbayes.linalg.lowrank), or g is not (D,) or (D, K) of U's
        dtype.
    """
    xp_of(U, d, g)  # refuses a NumPy / CuPy mix
    D, _ = _check_factors(U, d)
    _check_rhs(g, "g", D, U.dtype)
    R = _capacitance_chol(U, d)
    h = g / _col(d, g)
    z = _chol_solve(R, U.T @ h)  # C^{-1} U^T h = R^{-T} (R^{-1} (U^T h))
    return h - (U @ z) / _col(d, g)  # (lowrank.3): two thin products, no D x L temporary


def logdet(U, d):
    """Log-determinant of the precision P = U U^T + diag(d).

    log det P = log det(I_L + U^T d^{-1} U) + sum_i log d_i (matrix determinant lemma), with
    log det C = 2 sum_j log R_jj for R R^T = C.  (lowrank.4)

    Parameters
    ----------
    U : array of shape (D, L)
        Low-rank factor of the precision, L <= D.
    d : array of shape (D,)
        Diagonal of the precision, d > 0, same dtype as U.

    Returns
    -------
    array of shape ()
        The value log det P, as a 0-d array.

    Raises
    ------
    ValueError
        If U or d is invalid (see refbayes.linalg.lowrank).
    """
    xp = xp_of(U, d)
    _check_factors(U, d)
    R = _capacitance_chol(U, d)
    return 2 * xp.sum(xp.log(xp.diagonal(R))) + xp.sum(xp.log(d))  # (lowrank.4)


def diag_inv(U, d):
    """Diagonal of the covariance P^{-1}, without forming it.

    diag(P^{-1})_i = 1/d_i - sum_j Y_ji^2 with Y = R^{-1} U^T d^{-1} (L, D), R R^T = C,
    from P^{-1} = d^{-1} - (d^{-1} U R^{-T})(d^{-1} U R^{-T})^T.  (lowrank.5)

    Parameters
    ----------
    U : array of shape (D, L)
        Low-rank factor of the precision, L <= D.
    d : array of shape (D,)
        Diagonal of the precision, d > 0, same dtype as U.

    Returns
    -------
    array of shape (D,)
        The diagonal diag(P^{-1}).

    Raises
    ------
    ValueError
        If U or d is invalid (see refbayes.linalg.lowrank).
    """
    xp = xp_of(U, d)
    D, _ = _check_factors(U, d)
    R = _capacitance_chol(U, d)
    Y = solve_triangular(R, (U / d[:, None]).T, lower=True)
    return 1 / d - xp.sum(Y * Y, axis=0)  # (lowrank.5)


def trace_inv(U, d):
    """Trace of the covariance P^{-1}.

    tr(P^{-1}) = sum_i 1/d_i - ||R^{-1} U^T d^{-1}||_F^2, the sum of ``diag_inv``.  (lowrank.6)

    Parameters
    ----------
    U : array of shape (D, L)
        Low-rank factor of the precision, L <= D.
    d : array of shape (D,)
        Diagonal of the precision, d > 0, same dtype as U.

    Returns
    -------
    array of shape ()
        The value tr(P^{-1}), as a 0-d array.

    Raises
    ------
    ValueError
        If U or d is invalid (see refbayes.linalg.lowrank).
    """
    xp = xp_of(U, d)
    return xp.sum(diag_inv(U, d))  # (lowrank.6)


def quad(U, d, x):
    """Quadratic form x^T P x of the precision, per column of x.

    x^T P x = ||U^T x||^2 + sum_i d_i x_i^2.  (lowrank.7)

    Parameters
    ----------
    U : array of shape (D, L)
        Low-rank factor of the precision, L <= D.
    d : array of shape (D,)
        Diagonal of the precision, d > 0, same dtype as U.
    x : array of shape (D,) or (D, K)
        Vector or K vectors, same dtype as U.

    Returns
    -------
    array of shape () or (K,)
        The value x^T P x: 0-d for x (D,), one per column for x (D, K).

    Raises
    ------
    ValueError
        If U or d is invalid (see refbayes.linalg.lowrank), or x is not (D,) or (D, K) of U's
        dtype.
    """
    xp = xp_of(U, d, x)
    D, _ = _check_factors(U, d, inverse=False)
    _check_rhs(x, "x", D, U.dtype)
    Ux = U.T @ x
    return xp.sum(Ux * Ux, axis=0) + xp.sum(_col(d, x) * x * x, axis=0)  # (lowrank.7)


def inv_quad(U, d, x):
    """Quadratic form x^T P^{-1} x of the covariance, per column of x.

    x^T P^{-1} x = sum_i x_i^2 / d_i - ||R^{-1} U^T d^{-1} x||^2 with
    R R^T = I_L + U^T d^{-1} U.  (lowrank.7)

    Parameters
    ----------
    U : array of shape (D, L)
        Low-rank factor of the precision, L <= D.
    d : array of shape (D,)
        Diagonal of the precision, d > 0, same dtype as U.
    x : array of shape (D,) or (D, K)
        Vector or K vectors, same dtype as U.

    Returns
    -------
    array of shape () or (K,)
        The value x^T P^{-1} x: 0-d for x (D,), one per column for x (D, K).

    Raises
    ------
    ValueError
        If U or d is invalid (see refbayes.linalg.lowrank), or x is not (D,) or (D, K) of U's
        dtype.
    """
    xp = xp_of(U, d, x)
    D, _ = _check_factors(U, d)
    _check_rhs(x, "x", D, U.dtype)
    R = _capacitance_chol(U, d)
    h = x / _col(d, x)
    Y = _whitened_rhs(R, U, h)
    return xp.sum(x * h, axis=0) - xp.sum(Y * Y, axis=0)  # (lowrank.7)


# ----------------------------------------------------------------------------- sampling

def _check_sample_args(mu, U, d, eps):
    D, L = _check_factors(U, d)
    check_array(mu, "mu", shape=(D,))
    check_float(mu, "mu")
    check_same_dtype({"mu": mu, "U": U})
    _check_rhs(eps, "eps", D, U.dtype)
    return D, L


def sample(mu, U, d, eps):
    """Map standard-normal draws to draws from N(mu, P^{-1}).

    Returns mu + S eps with S = d^{-1/2} (I_D + V V^T)^{-1/2}, V = d^{-1/2} U, so S S^T = P^{-1}.
    The symmetric inverse square root is applied without forming it:
    (I_D + V V^T)^{-1/2} = I_D - V f(V^T V) V^T, f(lam) = 1 / (sqrt(1+lam) (1 + sqrt(1+lam))),
    with f(V^T V) from the eigendecomposition of the L x L Gram matrix.  Nothing is divided by
    an eigenvalue and nothing is Cholesky-factored, so U = 0 or repeated columns are fine.
    Then S S^T = d^{-1/2} (I + V V^T)^{-1} d^{-1/2} = (diag(d) + U U^T)^{-1}.  (lowrank.8)
    The SLANG poster's Algorithm 3 (fast_sample), as corrected, is ``sample_alg3``; both give
    the same distribution but not the same S.

    Parameters
    ----------
    mu : array of shape (D,)
        Mean, same dtype as U.
    U : array of shape (D, L)
        Low-rank factor of the precision, L <= D.
    d : array of shape (D,)
        Diagonal of the precision, d > 0, same dtype as U.
    eps : array of shape (D,) or (D, S)
        Standard-normal draws from the caller, one column per sample.

    Returns
    -------
    array of shape (D,) or (D, S)
        The draws mu + S eps, shaped like eps (mu added to every column).

    Raises
    ------
    ValueError
        If U or d is invalid (see refbayes.linalg.lowrank), or mu is not a finite float (D,) array
        or eps not (D,) or (D, S), of U's dtype.
    """
    xp = xp_of(mu, U, d, eps)
    _check_sample_args(mu, U, d, eps)
    s = _col(xp.sqrt(d), eps)
    lam, Q = xp.linalg.eigh(_weighted_gram(U, d))  # V^T V = U^T d^{-1} U
    F = (Q * _sqrt_weight(lam)) @ Q.T  # f(V^T V)  (lowrank.8)
    # V a = d^{-1/2} U a and V^T b = U^T (d^{-1/2} b): V = d^{-1/2} U is never formed
    T_eps = eps - (U @ (F @ (U.T @ (eps / s)))) / s  # (I + V V^T)^{-1/2} eps  (lowrank.8)
    return _col(mu, eps) + T_eps / s  # (lowrank.8)


def sample_alg3(mu, U, d, eps):
    """Sample N(mu, P^{-1}) by the SLANG poster's Algorithm 3, its printing errors corrected.

    With V = d^{-1/2} U, lower Cholesky factors A A^T = V^T V and B B^T = I_L + A^T A, and
    X = A^{-T} (B - I) A^{-1}, the matrix W0 = I_D + V X V^T satisfies W0 W0^T = I_D + V V^T
    (Ambikasaran and O'Neil's symmetric factorization), so S = d^{-1/2} W0^{-T} gives
    S S^T = P^{-1}, and W0^{-T} = I_D - V (X^{-T} + V^T V)^{-1} V^T by Woodbury.  Returns
    mu + S eps.  (lowrank.12)  Use ``sample`` in library code; this one exists to compare with
    the official implementation line by line.

    Parameters
    ----------
    mu : array of shape (D,)
        Mean, same dtype as U.
    U : array of shape (D, L)
        Low-rank factor of the precision, L <= D, of full column rank.
    d : array of shape (D,)
        Diagonal of the precision, d > 0, same dtype as U.
    eps : array of shape (D,) or (D, S)
        Standard-normal draws from the caller, one column per sample.

    Returns
    -------
    array of shape (D,) or (D, S)
        The draws mu + S eps, shaped like eps.

    Raises
    ------
    ValueError
        If U or d is invalid (see refbayes.linalg.lowrank), or mu is not a finite float (D,) array
        or eps not (D,) or (D, S), of U's dtype. Also if V^T V is not positive definite (U = 0,
        repeated columns), numerically when min_j A_jj <= sqrt(machine eps) max_j A_jj, i.e.
        cond(V^T V) >~ 1/eps, where line 6 would return rounding noise.
    """
    xp = xp_of(mu, U, d, eps)
    _, L = _check_sample_args(mu, U, d, eps)
    I_L = xp.eye(L, dtype=U.dtype)
    s = xp.sqrt(d)
    V = U / s[:, None]                                       # [poster] Alg. 3 line 2
    VtV = V.T @ V
    try:
        A = cholesky(VtV)                                    # line 3, lower: A A^T = V^T V
    except np.linalg.LinAlgError:
        A = xp.full((L, L), xp.nan, dtype=U.dtype)
    if not _well_conditioned_chol(A):
        raise ValueError("U: Algorithm 3 needs V^T V = U^T diag(d)^{-1} U positive definite "
                         "(U of full column rank), got a singular one; use sample() instead")
    # NOTE: printed line 4 factors I + V^T V; the identity needs I + A^T A (lowrank.12)
    B = cholesky(I_L + A.T @ A, check=False)                 # line 4 (corrected)
    A_inv = solve_triangular(A, I_L, lower=True)
    C = A_inv.T @ (B - I_L) @ A_inv                          # line 5: C = X
    # NOTE: printed line 6 reads (C + V^T V)^{-1}; Woodbury for W0^{-T} needs C^{-T}
    K = xp.linalg.inv(xp.linalg.inv(C).T + VtV)              # line 6 (corrected)  (lowrank.12)
    # NOTE: printed line 7 leaves d^{-1/2} off the second term; both terms need it
    y = (eps - V @ (K @ (V.T @ eps))) / _col(s, eps)         # line 7 (corrected)  (lowrank.12)
    return _col(mu, eps) + y                                 # line 8


# ----------------------------------------------------------------------------- rank-L truncation

# Only the top L eigenpairs of an n x n Gram matrix are needed: LAPACK's MRRR driver (syevr) with
# an index range computes just those. Measured (one thread) against NumPy's full eigh: n = 64,
# L = 10 even; n = 128 1.8x, 256 2.3x, 785 3.2x faster; L = 32 wins from n = 192; below n = 64 or
# for L > n / 6 the full decomposition is as fast or faster.
SUBSET_EIGH_MIN_N = 64
SUBSET_EIGH_MAX_FRACTION = 1 / 6


def _top_eigh(A, L):
    """The top L eigenpairs (lam (L,), Q (n, L)) of a symmetric A, in ascending order as eigh
    gives them: the subset driver where it is faster (NumPy, n >= SUBSET_EIGH_MIN_N, L <= n / 6),
    else the last L of the full decomposition."""
    xp = xp_of(A)
    n = A.shape[0]
    if xp is np and 0 < L and n >= SUBSET_EIGH_MIN_N and L <= SUBSET_EIGH_MAX_FRACTION * n:
        return linalg_of(xp).eigh(A, subset_by_index=[n - L, n - 1], driver="evr")
    lam, Q = xp.linalg.eigh(A)  # ascending eigenvalues
    return lam[n - L:], Q[:, n - L:]


def _top_eig_exact(W, L):
    """V V^T = [W W^T]_L through the smaller Gram matrix.  (lowrank.9)

    K <= D: W^T W = R diag(lam) R^T, V = W R_L. K > D (many gradients, small D): W W^T =
    Q diag(lam) Q^T, V = Q_L diag(lam_L)^{1/2}; eigh of D x D instead of K x K. Either way only
    the top L eigenpairs are computed (``_top_eigh``).
    """
    xp = xp_of(W)
    D, K = W.shape
    if K <= D:
        _, R = _top_eigh(W.T @ W, L)
        return W @ R[:, ::-1]  # (lowrank.9)
    lam, Q = _top_eigh(W @ W.T, L)
    lam, Q = lam[::-1], Q[:, ::-1]
    return Q * xp.sqrt(xp.maximum(lam, 0))  # (lowrank.9); lam < 0 only by rounding


# CholeskyQR2 is used while the first pass's factor has diag(R) ratio >= this: then
# cond(Y) <~ 1 / ratio stays well below u^{-1/2} ~ 1e8 (float64), where two Cholesky-QR passes
# are orthogonal to rounding (Yamamoto et al. 2015); below it, Householder QR.
CHOLQR_MIN_RATIO = 1e-5


def _chol_qr(Y):
    """One Cholesky-QR pass: Q = Y R^{-1}, R^T R = Y^T Y; None when the factor fails or is too
    ill-conditioned for CholeskyQR2."""
    xp = xp_of(Y)
    try:
        R_T = cholesky(Y.T @ Y)  # lower: R_T R_T^T = Y^T Y
    except np.linalg.LinAlgError:
        return None
    diag = xp.diagonal(R_T)
    if not bool(xp.all(xp.isfinite(R_T))) or not float(diag.min()) > \
            CHOLQR_MIN_RATIO * float(diag.max()):
        return None
    # Q^T = R_T^{-1} Y^T: one triangular solve with the tall Y's rows as right-hand sides
    return solve_triangular(R_T, Y.T, lower=True).T


def _orth(Y):
    """An orthonormal basis of Y's columns (D, k): CholeskyQR2 (two Cholesky-QR passes, two
    GEMMs each: ~2-4x cheaper than Householder QR of a tall matrix), Householder QR when Y is too
    ill-conditioned for it. Both give a basis of the same span; the Rayleigh-Ritz step of
    ``_top_eig_randomized`` does not depend on which. On CuPy always Householder QR (cuSOLVER
    geqrf): CholeskyQR2's conditioning test would read three values back from the device per
    pass, a synchronisation each."""
    if xp_of(Y) is not np:
        return xp_of(Y).linalg.qr(Y, mode="reduced")[0]
    Q = _chol_qr(Y)
    if Q is not None:
        Q = _chol_qr(Q)  # the second pass restores orthogonality to rounding
    if Q is None:
        Q = xp_of(Y).linalg.qr(Y, mode="reduced")[0]
    return Q


def _top_eig_randomized(W, L, Omega, n_iter):
    """Subspace iteration Q = orth((W W^T)^q W Omega), then Rayleigh-Ritz on Q.  (lowrank.10)"""
    xp = xp_of(W, Omega)
    Q = _orth(W @ Omega)
    for _ in range(n_iter):
        # re-orthonormalizing both half-steps keeps sigma_i^{2q+1} from underflowing the basis
        Q = _orth(W @ _orth(W.T @ Q))  # (lowrank.10)
    B = Q.T @ W
    lam, S = xp.linalg.eigh(B @ B.T)
    lam, S = lam[::-1][:L], S[:, ::-1][:, :L]
    return Q @ (S * xp.sqrt(xp.maximum(lam, 0)))  # (lowrank.10)


def top_eig(W, L, *, method="exact", Omega=None, n_iter=2):
    """Compute V (D, L) with V V^T = [W W^T]_L, the best rank-L approximation of W W^T.

    "exact": eigendecomposition of the K x K Gram matrix, W^T W = R diag(lam) R^T, and
    V = W R_L, whose columns are sigma_i u_i (u_i the left singular vectors of W); O(D K^2).
    "randomized": Q = orth((W W^T)^q W Omega) by ``n_iter`` = q rounds of QR-stabilised
    subspace iteration from the caller's test matrix Omega (K, L + p), then Rayleigh-Ritz:
    Q^T W W^T Q = S diag(lam) S^T and V = Q S_L diag(lam_L)^{1/2}; O(D K (L + p) (q + 1)).
    Exact (for a generic Omega) when rank(W) <= L + p; otherwise see the error bound in derivations/lowrank.md.

    Columns are ordered by decreasing eigenvalue and each has its largest-``|entry|`` made
    non-negative, so results agree across backends.  SLANG uses
    W = [sqrt(1 - beta) U, sqrt(beta) G^T] so that W W^T = (1 - beta) U U^T + beta G^T G
    (with G (M, D) the per-example gradients, scaled as the SLANG module states).  (lowrank.11)

    Parameters
    ----------
    W : array of shape (D, K)
        Tall factor whose Gram matrix W W^T is truncated.
    L : int
        Target rank, 0 <= L <= min(D, K).
    method : {"exact", "randomized"}, default "exact"
        Eigendecomposition of the Gram matrix (lowrank.9) or subspace iteration (lowrank.10).
    Omega : array of shape (K, L + p), optional
        Random test matrix from the caller, same dtype as W; required by "randomized" only.
    n_iter : int, default 2
        Subspace-iteration rounds q >= 0 ("randomized" only).

    Returns
    -------
    array of shape (D, L)
        V, columns by decreasing eigenvalue, each with its largest-``|entry|`` non-negative.

    Raises
    ------
    ValueError
        If W is not a finite float 2-d array, L is not an integer in [0, min(D, K)], method is
        neither "exact" nor "randomized", Omega is given with "exact" or missing with
        "randomized", Omega is not a finite (K, >= L) array of W's dtype, or n_iter is not an
        integer >= 0.
    """
    xp_of(W, Omega)  # one backend for all inputs (raises on a NumPy/CuPy mix)
    check_array(W, "W", ndim=2)
    check_float(W, "W")
    D, K = W.shape
    L = check_int(L, "L", low=0)
    if L > K or L > D:
        raise ValueError(f"L: expected L <= K = {K} (columns of W) and L <= D = {D} (rows of W), "
                         f"got L = {L}")
    if method == "exact":
        if Omega is not None:
            raise ValueError("Omega: only used by method='randomized', got an array with "
                             "method='exact'")
        return _fix_signs(_top_eig_exact(W, L))
    if method != "randomized":
        raise ValueError(f"method: expected 'exact' or 'randomized', got {method!r}")
    if Omega is None:
        raise ValueError("Omega: method='randomized' needs the caller's test matrix of shape "
                         f"(K, L + p) = ({K}, >= {L}), got None")
    check_array(Omega, "Omega", ndim=2)
    if Omega.shape[0] != K or Omega.shape[1] < L:
        raise ValueError(f"Omega: expected shape ({K}, L + p) with L + p >= L = {L}, "
                         f"got {tuple(Omega.shape)}")
    check_float(Omega, "Omega")
    check_same_dtype({"W": W, "Omega": Omega})
    n_iter = check_int(n_iter, "n_iter", low=0)
    return _fix_signs(_top_eig_randomized(W, L, Omega, n_iter))


# ----------------------------------------------------------------------------- dense twins

def dense_precision(U, d):
    """Form the precision P = U U^T + diag(d) explicitly, for tests and small D only.

    (lowrank.1)

    Parameters
    ----------
    U : array of shape (D, L)
        Low-rank factor of the precision, L <= D.
    d : array of shape (D,)
        Diagonal of the precision, d > 0, same dtype as U.

    Returns
    -------
    array of shape (D, D)
        P.

    Raises
    ------
    ValueError
        If U or d is invalid (see refbayes.linalg.lowrank).
    """
    xp = xp_of(U, d)
    _check_factors(U, d, inverse=False)
    return U @ U.T + xp.diag(d)  # (lowrank.1)


def dense_covariance(U, d):
    """Form the covariance P^{-1} explicitly, for tests and small D only.

    P^{-1} = d^{-1} - Y^T Y with Y = R^{-1} U^T d^{-1} (Woodbury in O(D^2 L) rather than a
    D x D inverse; exactly symmetric by construction).  (lowrank.2)

    Parameters
    ----------
    U : array of shape (D, L)
        Low-rank factor of the precision, L <= D.
    d : array of shape (D,)
        Diagonal of the precision, d > 0, same dtype as U.

    Returns
    -------
    array of shape (D, D)
        P^{-1}.

    Raises
    ------
    ValueError
        If U or d is invalid (see refbayes.linalg.lowrank).
    """
    xp = xp_of(U, d)
    _check_factors(U, d)
    R = _capacitance_chol(U, d)
    Y = solve_triangular(R, (U / d[:, None]).T, lower=True)
    return xp.diag(1 / d) - Y.T @ Y  # (lowrank.2)
