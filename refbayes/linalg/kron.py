"""Kronecker-factored curvature of one layer: A kron S acting on a row-major flattened weight.

Implements (kron.1)-(kron.11) of derivations/kron.md; (kron.3), (kron.12) and (kron.13) are
used by refbayes.linalg.gaussian for Kronecker-factored Gaussians.
Symbols: W = layer weight (n_in, n_out), flattened row-major, vec(W)[i * n_out + j] = W[i, j];
A = input-activation factor (n_in, n_in), S = pre-activation-gradient factor (n_out, n_out),
both SPD; the layer's curvature is A kron S (D, D), D = n_in * n_out, never formed except by
``dense``.  A = Q_A diag(lam_A) Q_A^T and S = Q_S diag(lam_S) Q_S^T are eigendecompositions,
L_A, L_S lower Cholesky factors (L_A L_A^T = A), gamma >= 0 a damping strength and
pi the factored-damping split (Martens & Grosse 2015, sec. 6.3).

Every routine costs O(n_in^3 + n_out^3) for the factors plus O(n_in n_out (n_in + n_out)) per
right-hand side, against O(D^3) for the dense matrix.  Batched right-hand sides: ``kron_matvec``
and the solves take X (..., n_in, n_out); the samplers take eps (n_in, n_out) or
(n_in, n_out, n_samples) with the sample index last, as ``lowrank.sample`` does.

The factors (A, S) of the routines that read them as symmetric, checked by each (ValueError
otherwise, naming the argument): A and S finite float (float64 or float32) non-empty square
matrices, symmetric to 100 roundoffs of their largest entry (the rule of ``check_spd``), of one
dtype and one backend (NumPy or CuPy).
"""
from __future__ import annotations

import math

from refbayes._checks import (
    check_array,
    check_float,
    check_in_range,
    check_same_dtype,
    check_spd,
    check_symmetric,
    value_checks,
)
from refbayes.backend import solve_triangular, xp_of

__all__ = ["dense", "kron_matvec", "solve", "logdet", "damped_eigh", "factored_damping_pi",
           "solve_factored", "factored_chol", "solve_chol", "sample", "sample_chol",
           "sample_cov"]


# ----------------------------------------------------------------------------- validation

def _check_square(M, name):
    check_array(M, name, ndim=2)
    check_float(M, name)
    if M.shape[0] != M.shape[1] or M.shape[0] == 0:
        raise ValueError(f"{name}: expected a non-empty square matrix, got shape {tuple(M.shape)}")
    return M.shape[0]


def _check_symmetric(M, name):
    """Square and symmetric to 100 roundoffs of max|M| (the rule of ``check_spd``)."""
    _check_square(M, name)
    check_symmetric(M, name)


def _check_rhs(X, name, n_in, n_out, dtype, *, batch):
    """X of shape (n_in, n_out), or (..., n_in, n_out) when ``batch``, in the factors' dtype."""
    check_array(X, name)
    check_float(X, name)
    ok_rank = X.ndim >= 2 if batch else X.ndim == 2
    if not ok_rank or tuple(X.shape[-2:]) != (n_in, n_out):
        want = f"(..., {n_in}, {n_out})" if batch else f"({n_in}, {n_out})"
        raise ValueError(f"{name}: expected shape {want} (n_in, n_out), got {tuple(X.shape)}")
    if X.dtype != dtype:
        raise ValueError(f"{name}, A: expected one dtype for all, got {name}: {X.dtype}, "
                         f"A: {dtype}")


def _check_eps(eps, n_in, n_out, dtype):
    """eps (n_in, n_out) or (n_in, n_out, n_samples): the sample index is last."""
    check_array(eps, "eps", ndim=(2, 3))
    check_float(eps, "eps")
    if tuple(eps.shape[:2]) != (n_in, n_out):
        raise ValueError(f"eps: expected shape ({n_in}, {n_out}) or ({n_in}, {n_out}, n_samples), "
                         f"got {tuple(eps.shape)}")
    if eps.dtype != dtype:
        raise ValueError(f"eps, W_mean: expected one dtype for all, got eps: {eps.dtype}, W_mean: {dtype}")


def _check_pair(A, S, names=("A", "S")):
    """Two symmetric factors of one dtype; returns (n_in, n_out)."""
    _check_symmetric(A, names[0])
    _check_symmetric(S, names[1])
    check_same_dtype({names[0]: A, names[1]: S})
    return A.shape[0], S.shape[0]


def _check_factor_sizes(A, S, n_in, n_out, names):
    if A.shape[0] != n_in:
        raise ValueError(f"{names[0]}: expected shape ({n_in}, {n_in}) (n_in from W_mean), "
                         f"got {tuple(A.shape)}")
    if S.shape[0] != n_out:
        raise ValueError(f"{names[1]}: expected shape ({n_out}, {n_out}) (n_out from W_mean), "
                         f"got {tuple(S.shape)}")



def _check_sampler(W_mean, A, S, eps, names):
    """Validate a matrix-variate normal's arguments; return the lower Cholesky factors of A, S."""
    check_array(W_mean, "W_mean", ndim=2)
    check_float(W_mean, "W_mean")
    n_in, n_out = W_mean.shape
    L_A, L_S = check_spd(A, names[0]), check_spd(S, names[1])
    _check_factor_sizes(A, S, n_in, n_out, names)
    check_same_dtype({"W_mean": W_mean, names[0]: A, names[1]: S})
    _check_eps(eps, n_in, n_out, W_mean.dtype)
    return L_A, L_S

# ----------------------------------------------------------------------------- private kernels

def _damped_eig(A, S, damping):
    """(Q_A, Q_S, lam) with A kron S + damping I = (Q_A kron Q_S) diag(vec lam) (...)^T.

    lam[i, j] = lam_A[i] lam_S[j] + damping, the eigenvalue for eigenvector q_A,i kron q_S,j.
    Raises ValueError when some lam <= 0 (the damped product is not positive definite).
    """
    xp = xp_of(A, S)
    lam_A, Q_A = xp.linalg.eigh(A)
    lam_S, Q_S = xp.linalg.eigh(S)
    lam = lam_A[:, None] * lam_S[None, :] + damping  # (kron.4)
    if not bool(xp.all(lam > 0)):
        raise ValueError("A, S, damping: expected A kron S + damping I positive definite, got "
                         f"smallest eigenvalue {float(xp.min(lam)):.3e}")
    return Q_A, Q_S, lam


def _tri_left(L, X, *, trans):
    """L^{-1} X (trans False) or L^{-T} X (trans True) for a stack X (B, n, m), L lower (n, n)."""
    B, n, m = X.shape
    flat = X.transpose(1, 0, 2).reshape(n, B * m)
    # the callers have checked (or computed) L and X: no second finite scan here
    Y = solve_triangular(L, flat, lower=True, trans="T" if trans else "N", check_finite=False)
    return Y.reshape(n, B, m).transpose(1, 0, 2)


def _tri_right(X, L, *, trans):
    """X L^{-1} (trans False) or X L^{-T} (trans True) for X (B, n, m), L lower (m, m).

    Uses (X L^{-1})^T = L^{-T} X^T and (X L^{-T})^T = L^{-1} X^T.
    """
    return _tri_left(L, X.transpose(0, 2, 1), trans=not trans).transpose(0, 2, 1)


def _solve_chol(L_A, L_S, X):
    """A^{-1} X S^{-1} for A = L_A L_A^T, S = L_S L_S^T and X (..., n_in, n_out).  (kron.9)"""
    n_in, n_out = L_A.shape[0], L_S.shape[0]
    Z = X.reshape((-1, n_in, n_out))
    Z = _tri_left(L_A, _tri_left(L_A, Z, trans=False), trans=True)  # A^{-1} = L_A^{-T} L_A^{-1}
    Z = _tri_right(_tri_right(Z, L_S, trans=True), L_S, trans=False)  # S^{-1} = L_S^{-T} L_S^{-1}
    return Z.reshape(X.shape)


def _sample_chol(L_A, L_S, eps):
    """L_A^{-T} E L_S^{-1} for eps (n_in, n_out[, n]), shaped like eps.  (kron.10)"""
    return _from_stack(_tri_right(_tri_left(L_A, _as_stack(eps), trans=True), L_S, trans=False),
                       eps)


def _check_chol_pair(L_A, L_S):
    """Two square float factors of one dtype (only their lower triangles are read)."""
    n_in, n_out = _check_square(L_A, "L_A"), _check_square(L_S, "L_S")
    check_same_dtype({"L_A": L_A, "L_S": L_S})
    for L, name in ((L_A, "L_A"), (L_S, "L_S")):
        if value_checks() and not bool(xp_of(L).all(xp_of(L).diagonal(L) > 0)):
            raise ValueError(f"{name}: expected a Cholesky factor (positive diagonal), got a "
                             "diagonal entry <= 0")
    return n_in, n_out


def _as_stack(eps):
    """eps (n_in, n_out[, n]) -> (n, n_in, n_out), the layout the triangular kernels batch over."""
    return eps[None] if eps.ndim == 2 else eps.transpose(2, 0, 1)


def _from_stack(Z, like):
    return Z[0] if like.ndim == 2 else Z.transpose(1, 2, 0)


def _with_mean(W_mean, Z, like):
    return (W_mean if like.ndim == 2 else W_mean[:, :, None]) + _from_stack(Z, like)


# ----------------------------------------------------------------------------- public routines

def dense(A, S):
    """Form the Kronecker product A kron S explicitly, for tests and small layers only.

    Entry [i n_out + j, k n_out + l] = A[i, k] S[j, l].  (kron.1)

    Parameters
    ----------
    A : array of shape (n_in, n_in)
        Input-side factor.
    S : array of shape (n_out, n_out)
        Output-side factor, same dtype as A.

    Returns
    -------
    array of shape (n_in n_out, n_in n_out)
        The matrix A kron S.

    Raises
    ------
    ValueError
        If A or S is not a finite, float, non-empty square matrix (symmetry is not required), if
        their dtypes differ, or if the arrays mix NumPy and CuPy.
    """
    xp = xp_of(A, S)
    _check_square(A, "A")
    _check_square(S, "S")
    check_same_dtype({"A": A, "S": S})
    return xp.kron(A, S)  # (kron.1)


def kron_matvec(A, S, X):
    """Multiply by A kron S without forming it: (A kron S) vec(X) = vec(A X S^T).

    vec is row-major; the result is returned as the matrix A X S^T (for the symmetric K-FAC
    factors this is A X S).  (kron.2)

    Parameters
    ----------
    A : array of shape (n_in, n_in)
        Input-side factor, any square matrix.
    S : array of shape (n_out, n_out)
        Output-side factor, any square matrix, same dtype as A.
    X : array of shape (n_in, n_out) or (..., n_in, n_out)
        Matrix or stack of matrices, same dtype as A.

    Returns
    -------
    array of shape (..., n_in, n_out)
        The product A X S^T, shaped like X.

    Raises
    ------
    ValueError
        If A or S is not a finite, float, non-empty square matrix, if the dtypes differ, if X
        is not a finite float (..., n_in, n_out) array, or if the arrays mix NumPy and CuPy.
    """
    xp_of(A, S, X)  # one backend for all inputs (raises on a NumPy/CuPy mix)
    n_in, n_out = _check_square(A, "A"), _check_square(S, "S")
    check_same_dtype({"A": A, "S": S})
    _check_rhs(X, "X", n_in, n_out, A.dtype, batch=True)
    return A @ X @ S.T  # (kron.2)


def solve(A, S, X, damping=0.0):
    """Solve (A kron S + damping I) vec(Z) = vec(X) exactly, by eigendecompositions.

    Z = Q_A [ (Q_A^T X Q_S) / (lam_A lam_S^T + damping) ] Q_S^T   (elementwise division),
    from A = Q_A diag(lam_A) Q_A^T and S = Q_S diag(lam_S) Q_S^T.  (kron.5)

    Parameters
    ----------
    A : array of shape (n_in, n_in)
        Input-side factor, symmetric.
    S : array of shape (n_out, n_out)
        Output-side factor, symmetric, same dtype as A.
    X : array of shape (n_in, n_out) or (..., n_in, n_out)
        Right-hand side(s), same dtype as A.
    damping : float, default 0.0
        Finite damping >= 0 added to the diagonal.

    Returns
    -------
    array of shape (..., n_in, n_out)
        The solution Z, shaped like X.

    Raises
    ------
    ValueError
        If A or S is invalid (see refbayes.linalg.kron); if X is not a finite float (..., n_in,
        n_out) array of A's dtype; if damping is not a real number >= 0, or if some lam_A[i]
        lam_S[j] + damping <= 0 (the damped product is not positive definite).
    """
    xp_of(A, S, X)
    n_in, n_out = _check_pair(A, S)
    _check_rhs(X, "X", n_in, n_out, A.dtype, batch=True)
    damping = check_in_range(damping, "damping", 0.0, math.inf, high_open=True)
    Q_A, Q_S, lam = _damped_eig(A, S, damping)
    return Q_A @ ((Q_A.T @ X @ Q_S) / lam) @ Q_S.T  # (kron.5)


def logdet(A, S, damping=0.0):
    """Log-determinant of A kron S + damping I.

    log det(A kron S + damping I) = sum_ij log(lam_A[i] lam_S[j] + damping).  With damping = 0
    this is n_out log det A + n_in log det S, computed from Cholesky diagonals.  (kron.6)

    Parameters
    ----------
    A : array of shape (n_in, n_in)
        Input-side factor, symmetric.
    S : array of shape (n_out, n_out)
        Output-side factor, symmetric, same dtype as A.
    damping : float, default 0.0
        Finite damping >= 0 added to the diagonal.

    Returns
    -------
    array of shape ()
        The log-determinant, as a 0-d array.

    Raises
    ------
    ValueError
        If A or S is invalid (see refbayes.linalg.kron); if damping is not a real number >= 0; with
        damping = 0, if A or S is not positive definite; with damping > 0, if some lam_A[i]
        lam_S[j] + damping <= 0.
    """
    xp = xp_of(A, S)
    n_in, n_out = _check_pair(A, S)
    damping = check_in_range(damping, "damping", 0.0, math.inf, high_open=True)
    if damping == 0.0:
        L_A, L_S = check_spd(A, "A"), check_spd(S, "S")
        ld_A = 2 * xp.sum(xp.log(xp.diagonal(L_A)))
        ld_S = 2 * xp.sum(xp.log(xp.diagonal(L_S)))
        return n_out * ld_A + n_in * ld_S  # (kron.6)
    _, _, lam = _damped_eig(A, S, damping)
    return xp.sum(xp.log(lam))  # (kron.6)


def damped_eigh(A, S, damping=0.0):
    """Eigendecompose A kron S + damping I through the factors.

    A = Q_A diag(lam_A) Q_A^T, S = Q_S diag(lam_S) Q_S^T, so A kron S + damping I =
    (Q_A kron Q_S) diag(vec Lam) (Q_A kron Q_S)^T with Lam[i, j] = lam_A[i] lam_S[j] + damping,
    the eigenvalue of the eigenvector q_A,i kron q_S,j.  (kron.4)

    Parameters
    ----------
    A : array of shape (n_in, n_in)
        Input-side factor, symmetric.
    S : array of shape (n_out, n_out)
        Output-side factor, symmetric, same dtype as A.
    damping : float, default 0.0
        Finite damping >= 0 added to the diagonal.

    Returns
    -------
    Q_A : array of shape (n_in, n_in)
        Orthonormal eigenvectors of A.
    Q_S : array of shape (n_out, n_out)
        Orthonormal eigenvectors of S.
    Lam : array of shape (n_in, n_out)
        The eigenvalues lam_A[i] lam_S[j] + damping, all > 0.

    Raises
    ------
    ValueError
        If A or S is invalid (see refbayes.linalg.kron); if damping is not a real number >= 0; or
        if some Lam[i, j] <= 0.
    """
    _check_pair(A, S)
    damping = check_in_range(damping, "damping", 0.0, math.inf, high_open=True)
    return _damped_eig(A, S, damping)  # (kron.4)


def factored_damping_pi(A, S):
    """Compute the factored-damping split pi of K-FAC.

    pi = sqrt((tr A / n_in) / (tr S / n_out)), the split of the factored damping that minimizes
    the trace of its error term (Martens & Grosse 2015, sec. 6.3).  (kron.8)

    Parameters
    ----------
    A : array of shape (n_in, n_in)
        Input-side factor, symmetric.
    S : array of shape (n_out, n_out)
        Output-side factor, symmetric, same dtype as A.

    Returns
    -------
    array of shape ()
        The split pi, as a 0-d array.

    Raises
    ------
    ValueError
        If A or S is invalid (see refbayes.linalg.kron); if tr A <= 0 or tr S <= 0.
    """
    xp = xp_of(A, S)
    n_in, n_out = _check_pair(A, S)
    tr_A, tr_S = xp.trace(A), xp.trace(S)
    if not bool((tr_A > 0) & (tr_S > 0)):  # one read-back (a synchronisation on CuPy)
        raise ValueError(f"A, S: expected tr A > 0 and tr S > 0, got tr A = {float(tr_A):.3e}, "
                         f"tr S = {float(tr_S):.3e}")
    return xp.sqrt((tr_A / n_in) / (tr_S / n_out))  # (kron.8)


def solve_factored(A, S, X, gamma):
    """Solve with K-FAC's factored Tikhonov damping, an approximation of ``solve``.

    ((A + pi gamma^{1/2} I) kron (S + gamma^{1/2} / pi I))^{-1} vec(X)
    = vec(A_g^{-1} X S_g^{-1}), A_g = A + pi sqrt(gamma) I, S_g = S + sqrt(gamma) / pi I,
    with pi from ``factored_damping_pi`` (Martens & Grosse 2015, sec. 6.3): an approximation of
    (A kron S + gamma I)^{-1} (see ``solve`` for the exact one).  (kron.7), (kron.9)

    Parameters
    ----------
    A : array of shape (n_in, n_in)
        Input-side factor, symmetric.
    S : array of shape (n_out, n_out)
        Output-side factor, symmetric, same dtype as A.
    X : array of shape (n_in, n_out) or (..., n_in, n_out)
        Right-hand side(s), same dtype as A.
    gamma : float
        Finite damping strength gamma >= 0.

    Returns
    -------
    array of shape (..., n_in, n_out)
        The matrix A_g^{-1} X S_g^{-1}, shaped like X.

    Raises
    ------
    ValueError
        If A or S is invalid (see refbayes.linalg.kron); if X is not a finite float (..., n_in,
        n_out) array of A's dtype; if gamma is not a real number >= 0, if tr A <= 0 or tr S <= 0,
        or if A_g or S_g is not positive definite.
    """
    xp_of(A, S, X)
    n_in, n_out = _check_pair(A, S)
    _check_rhs(X, "X", n_in, n_out, A.dtype, batch=True)
    return _solve_chol(*factored_chol(A, S, gamma), X)  # (kron.9)


def factored_chol(A, S, gamma):
    """Compute the lower Cholesky factors of K-FAC's factored-damped factors.

    L_A L_A^T = A_g = A + pi sqrt(gamma) I and L_S L_S^T = S_g = S + sqrt(gamma) / pi I with pi
    from ``factored_damping_pi``: (A_g kron S_g)^{-1} is ``solve_chol(L_A, L_S, .)``, the
    matrix-variate normal of precision A_g kron S_g ``sample_chol(L_A, L_S, .)``.  (kron.7)

    Parameters
    ----------
    A : array of shape (n_in, n_in)
        Input-side factor, symmetric.
    S : array of shape (n_out, n_out)
        Output-side factor, symmetric, same dtype as A.
    gamma : float
        Finite damping strength gamma >= 0.

    Returns
    -------
    L_A : array of shape (n_in, n_in)
        Lower Cholesky factor of A_g.
    L_S : array of shape (n_out, n_out)
        Lower Cholesky factor of S_g.

    Raises
    ------
    ValueError
        If A or S is invalid (see refbayes.linalg.kron); if gamma is not a real number >= 0, if tr
        A <= 0 or tr S <= 0, or if A_g or S_g is not positive definite.
    """
    xp = xp_of(A, S)
    gamma = check_in_range(gamma, "gamma", 0.0, math.inf, high_open=True)
    pi = factored_damping_pi(A, S)  # checks A and S symmetric, so A_g and S_g are
    root = math.sqrt(gamma)
    A_g = A + (pi * root) * xp.eye(A.shape[0], dtype=A.dtype)  # (kron.7)
    S_g = S + (root / pi) * xp.eye(S.shape[0], dtype=S.dtype)  # (kron.7)
    return (check_spd(A_g, "A + pi sqrt(gamma) I", symmetric_checked=True),
            check_spd(S_g, "S + sqrt(gamma) / pi I", symmetric_checked=True))


def solve_chol(L_A, L_S, X):
    """Solve with a Kronecker product given by the lower Cholesky factors of its two factors.

    (A kron S)^{-1} vec(X) = vec(A^{-1} X S^{-1}) = vec(L_A^{-T} L_A^{-1} X L_S^{-T} L_S^{-1})
    for A = L_A L_A^T and S = L_S L_S^T: the solve of ``solve_factored`` when the damped
    factors have been factored once and are reused (K-FAC between refreshes).  (kron.9)

    Parameters
    ----------
    L_A : array of shape (n_in, n_in)
        Lower Cholesky factor of the input-side factor (its upper triangle is not read).
    L_S : array of shape (n_out, n_out)
        Lower Cholesky factor of the output-side factor, same dtype.
    X : array of shape (n_in, n_out) or (..., n_in, n_out)
        Right-hand side(s), same dtype.

    Returns
    -------
    array of shape (..., n_in, n_out)
        The matrix A^{-1} X S^{-1}, shaped like X.

    Raises
    ------
    ValueError
        If L_A or L_S is not a finite, float, non-empty square matrix with a positive diagonal,
        if their dtypes differ, if X is not a finite float (..., n_in, n_out) array of their
        dtype, or if the arrays mix NumPy and CuPy.
    """
    xp_of(L_A, L_S, X)
    n_in, n_out = _check_chol_pair(L_A, L_S)
    _check_rhs(X, "X", n_in, n_out, L_A.dtype, batch=True)
    return _solve_chol(L_A, L_S, X)  # (kron.9)


def sample(W_mean, A_prec, S_prec, eps):
    """Sample the matrix-variate normal with precision A_prec kron S_prec (noisy K-FAC).

    W = W_mean + L_A^{-T} E L_S^{-1}, with L_A L_A^T = A_prec and L_S L_S^T = S_prec, so that
    Cov(vec W) = (A_prec kron S_prec)^{-1} = A_prec^{-1} kron S_prec^{-1} for E ~ N(0, I).
    (kron.10)

    Parameters
    ----------
    W_mean : array of shape (n_in, n_out)
        Mean of W.
    A_prec : array of shape (n_in, n_in)
        Input-side precision factor, symmetric positive definite.
    S_prec : array of shape (n_out, n_out)
        Output-side precision factor, symmetric positive definite.
    eps : array of shape (n_in, n_out) or (n_in, n_out, n_samples)
        Standard-normal draws E from the caller, sample index last.

    Returns
    -------
    array of shape (n_in, n_out) or (n_in, n_out, n_samples)
        The draws W, shaped like eps.

    Raises
    ------
    ValueError
        If W_mean is not a finite float 2-d array, if A_prec or S_prec is not symmetric positive
        definite with sizes (n_in, n_in) and (n_out, n_out) from W_mean, if eps is not a finite
        (n_in, n_out) or (n_in, n_out, n_samples) array, if the dtypes differ, or if the arrays
        mix NumPy and CuPy.
    """
    xp_of(W_mean, A_prec, S_prec, eps)
    L_A, L_S = _check_sampler(W_mean, A_prec, S_prec, eps, ("A_prec", "S_prec"))
    Z = _sample_chol(L_A, L_S, eps)  # (kron.10)
    return (W_mean if eps.ndim == 2 else W_mean[:, :, None]) + Z


def sample_chol(L_A, L_S, eps):
    """Sample a zero-mean matrix-variate normal from the Cholesky factors of its precision.

    Z = L_A^{-T} E L_S^{-1}, so Cov(vec Z) = (L_A L_A^T)^{-1} kron (L_S L_S^T)^{-1} for
    E ~ N(0, I): the draws of ``sample`` (less the mean) when the precision factors have been
    factored once and are reused (Noisy K-FAC between refreshes).  (kron.10)

    Parameters
    ----------
    L_A : array of shape (n_in, n_in)
        Lower Cholesky factor of the input-side precision factor (upper triangle not read).
    L_S : array of shape (n_out, n_out)
        Lower Cholesky factor of the output-side precision factor, same dtype.
    eps : array of shape (n_in, n_out) or (n_in, n_out, n_samples)
        Standard-normal draws E from the caller, sample index last, same dtype.

    Returns
    -------
    array of shape (n_in, n_out) or (n_in, n_out, n_samples)
        The draws Z, shaped like eps.

    Raises
    ------
    ValueError
        If L_A or L_S is not a finite, float, non-empty square matrix with a positive diagonal,
        if their dtypes differ, if eps is not a finite (n_in, n_out) or (n_in, n_out,
        n_samples) array of their dtype, or if the arrays mix NumPy and CuPy.
    """
    xp_of(L_A, L_S, eps)
    n_in, n_out = _check_chol_pair(L_A, L_S)
    _check_eps(eps, n_in, n_out, L_A.dtype)
    return _sample_chol(L_A, L_S, eps)  # (kron.10)


def sample_cov(W_mean, A_cov, S_cov, eps):
    """Sample the matrix-variate normal with covariance A_cov kron S_cov.

    W = W_mean + L_A E L_S^T with L_A L_A^T = A_cov, L_S L_S^T = S_cov, so
    Cov(vec W) = A_cov kron S_cov.  (kron.11)

    Parameters
    ----------
    W_mean : array of shape (n_in, n_out)
        Mean of W.
    A_cov : array of shape (n_in, n_in)
        Input-side covariance factor, symmetric positive definite.
    S_cov : array of shape (n_out, n_out)
        Output-side covariance factor, symmetric positive definite.
    eps : array of shape (n_in, n_out) or (n_in, n_out, n_samples)
        Standard-normal draws E from the caller, sample index last.

    Returns
    -------
    array of shape (n_in, n_out) or (n_in, n_out, n_samples)
        The draws W, shaped like eps.

    Raises
    ------
    ValueError
        If any argument is invalid, as for ``sample`` (A_cov, S_cov in place of A_prec, S_prec).
    """
    xp_of(W_mean, A_cov, S_cov, eps)
    L_A, L_S = _check_sampler(W_mean, A_cov, S_cov, eps, ("A_cov", "S_cov"))
    Z = L_A @ _as_stack(eps) @ L_S.T  # (kron.11)
    return _with_mean(W_mean, Z, eps)

