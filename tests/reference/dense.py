"""Naive dense oracles: explicit D x D matrices, inverses, determinants and eigendecompositions.

Every oracle takes NumPy or CuPy arrays of any float dtype, moves them to the host, works in
float64 with the most direct formula (``numpy.linalg.inv``, ``slogdet``, ``eigh``), and returns
float64 NumPy arrays.  They are slow and obvious on purpose: a structured routine is right when
it agrees with them.  Nothing here is imported by the package.
"""
import numpy as np

from refbayes.backend import to_numpy

__all__ = ["host64", "lowrank_precision", "inverse", "solve", "logdet", "eigh_desc", "sym_sqrt",
           "sym_inv_sqrt", "chol_lower", "rank_truncation", "orth_projector", "spectral_norm"]


def host64(a) -> np.ndarray:
    """``a`` as a float64 NumPy array (a device-to-host copy for CuPy)."""
    return np.asarray(to_numpy(a), dtype=np.float64)


def lowrank_precision(U, d) -> np.ndarray:
    """U U^T + diag(d), explicitly."""
    U, d = host64(U), host64(d)
    return U @ U.T + np.diag(d)


def inverse(M) -> np.ndarray:
    """M^{-1} by LU (``numpy.linalg.inv``)."""
    return np.linalg.inv(host64(M))


def solve(M, b) -> np.ndarray:
    """M^{-1} b by LU."""
    return np.linalg.solve(host64(M), host64(b))


def logdet(M) -> float:
    """log det M for a matrix with positive determinant (asserted)."""
    sign, value = np.linalg.slogdet(host64(M))
    assert sign > 0, "logdet oracle: determinant is not positive"
    return float(value)


def eigh_desc(M):
    """Eigenvalues (decreasing) and matching eigenvectors (columns) of a symmetric M."""
    lam, Q = np.linalg.eigh(host64(M))
    return lam[::-1], Q[:, ::-1]


def sym_sqrt(M) -> np.ndarray:
    """The symmetric PSD square root Q diag(sqrt(lam)) Q^T of a symmetric PSD M."""
    lam, Q = np.linalg.eigh(host64(M))
    return (Q * np.sqrt(np.clip(lam, 0.0, None))) @ Q.T


def sym_inv_sqrt(M) -> np.ndarray:
    """The symmetric inverse square root Q diag(lam^{-1/2}) Q^T of a symmetric PD M."""
    lam, Q = np.linalg.eigh(host64(M))
    assert lam.min() > 0, "sym_inv_sqrt oracle: matrix is not positive definite"
    return (Q / np.sqrt(lam)) @ Q.T


def chol_lower(M) -> np.ndarray:
    """Lower-triangular R with R R^T = M (``numpy.linalg.cholesky``)."""
    return np.linalg.cholesky(host64(M))


def rank_truncation(M, L: int) -> np.ndarray:
    """[M]_L = sum_{i <= L} lam_i q_i q_i^T, the best rank-L approximation of a symmetric PSD M."""
    lam, Q = eigh_desc(M)
    return (Q[:, :L] * lam[:L]) @ Q[:, :L].T


def orth_projector(V) -> np.ndarray:
    """The orthogonal projector onto range(V) (V of full column rank), from a QR of V."""
    Q = np.linalg.qr(host64(V))[0]
    return Q @ Q.T


def spectral_norm(M) -> float:
    """||M||_2, the largest singular value."""
    return float(np.linalg.norm(host64(M), 2))
