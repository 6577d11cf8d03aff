"""Multivariate normals on R^D in the parameterizations the methods use: log-density, entropy,
KL(q || p) and the symmetric KL for every pair of parameterizations.

Implements (gaussian.1)-(gaussian.9) of derivations/gaussian.md; uses (kron.2), (kron.3), (kron.6),
(kron.12), (kron.13) of derivations/kron.md and lowrank.{logdet,quad,solve,diag_inv}.
Symbols: mu = mean (D,), Sigma = covariance (D, D), P = Sigma^{-1} = precision (D, D),
var / prec_diag = diagonal covariance / precision (D,), U (D, L), d (D,) = factors of a precision
U U^T + diag(d), A (n_in, n_in), S (n_out, n_out) = Kronecker factors with D = n_in n_out on a
row-major flattened (n_in, n_out) weight (see derivations/kron.md); L_X = lower Cholesky factor
of a matrix X (L_X L_X^T = X); m = mu_q - mu_p (D,).

Cost: dense forms are handled through Cholesky factors and triangular solves (no inverse, no
determinant); log-determinants come from Cholesky diagonals.  Any pair made only of diagonal and
low-rank-plus-diagonal forms costs O(D L^2) and forms no D x D array; Kronecker pairs with the
same (n_in, n_out) cost O(n_in^3 + n_out^3).  Other pairs fall back to dense Cholesky factors
(O(D^3)): a low-rank q against a dense p, as when SLANG is compared with the exact posterior.

Every function checks each distribution it takes and raises ValueError (naming the field)
unless: it is one of the seven parameterizations below; mu is a finite float (float64 or
float32) (D,) array with D >= 1; Sigma, Sigma_inv (D, D) and the Kronecker factors are finite,
symmetric and positive definite (their Cholesky factorization succeeds), with n_in n_out = D;
var, prec_diag and d are finite (D,) arrays > 0 with finite reciprocals; U is a finite
(D, L) array, 0 <= L <= D, with U U^T and the capacitance finite
(``lowrank.check_factor_values``); and all its arrays share one dtype and one backend.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

from refbayes._checks import (
    check_array,
    check_float,
    check_invertible_positive,
    check_same_dtype,
    check_spd,
)
from refbayes.backend import solve_triangular, xp_of
from refbayes.linalg import lowrank
from refbayes.linalg.kron import _tri_left, _tri_right

__all__ = ["DenseCov", "DensePrec", "DiagCov", "DiagPrec", "LowRankPrec", "KronPrec", "KronCov",
           "log_density", "entropy", "kl", "symmetric_kl"]

Array = Any
_LOG_2PI = math.log(2 * math.pi)


# ----------------------------------------------------------------------------- parameterizations

class DenseCov(NamedTuple):
    """N(mu, Sigma) with a dense SPD covariance.

    Each field is documented by its trailing comment.
    """
    mu: Array     # mean mu, (D,)
    Sigma: Array  # covariance Sigma, (D, D), SPD


class DensePrec(NamedTuple):
    """N(mu, Sigma_inv^{-1}) with a dense SPD precision.

    Each field is documented by its trailing comment.
    """
    mu: Array         # mean mu, (D,)
    Sigma_inv: Array  # precision P = Sigma^{-1}, (D, D), SPD


class DiagCov(NamedTuple):
    """N(mu, diag(var)), a diagonal covariance.

    Each field is documented by its trailing comment.
    """
    mu: Array   # mean mu, (D,)
    var: Array  # variances diag(Sigma), (D,), > 0


class DiagPrec(NamedTuple):
    """N(mu, diag(prec_diag)^{-1}) (mean-field VI / VOGN / Vadam posteriors).

    Each field is documented by its trailing comment.
    """
    mu: Array         # mean mu, (D,)
    prec_diag: Array  # precision diagonal diag(P), (D,), > 0


class LowRankPrec(NamedTuple):
    """N(mu, (U U^T + diag(d))^{-1}) (SLANG's posterior).

    Each field is documented by its trailing comment.
    """
    mu: Array  # mean mu, (D,)
    U: Array   # low-rank factor U of the precision, (D, L), 0 <= L <= D
    d: Array   # diagonal part d of the precision, (D,), > 0


class KronPrec(NamedTuple):
    """Matrix-variate normal on W (n_in, n_out) with Kronecker-factored precision (noisy K-FAC).

    W is flattened row-major into mu's index i n_out + j, with precision A_prec kron S_prec:
    Cov(vec W) = A_prec^{-1} kron S_prec^{-1}.  A_prec acts on the input (row) index i, S_prec
    on the output (column) index j.

    Each field is documented by its trailing comment.
    """
    mu: Array      # mean vec(M), (D,) = (n_in n_out,), row-major
    A_prec: Array  # input-side precision factor A, (n_in, n_in), SPD
    S_prec: Array  # output-side precision factor S, (n_out, n_out), SPD


class KronCov(NamedTuple):
    """Matrix-variate normal on W (n_in, n_out) with Kronecker-factored covariance.

    W is flattened row-major, with Cov(vec W) = A_cov kron S_cov: A_cov is the covariance among
    rows (inputs i), S_cov among columns (j).

    Each field is documented by its trailing comment.
    """
    mu: Array     # mean vec(M), (D,) = (n_in n_out,), row-major
    A_cov: Array  # input-side covariance factor, (n_in, n_in), SPD
    S_cov: Array  # output-side covariance factor, (n_out, n_out), SPD


_TYPES = (DenseCov, DensePrec, DiagCov, DiagPrec, LowRankPrec, KronPrec, KronCov)
_DIAG = (DiagCov, DiagPrec)
_KRON = (KronPrec, KronCov)
_COV_FORMS = (DenseCov, DiagCov, KronCov)  # the stored matrices are covariances


class _Checked(NamedTuple):
    """A validated distribution with the Cholesky factors its validation produced."""
    q: Any       # the parameterization tuple
    name: str    # "q" or "p", for error messages
    D: int
    chol: Any    # L (D, D) for dense forms, (L_A, L_S) for Kronecker forms, None otherwise


# ----------------------------------------------------------------------------- validation

def _fields(q):
    """The arrays of a parameterization (nothing for other objects, which validation rejects)."""
    return tuple(q) if isinstance(q, _TYPES) else ()


def _check_vec(a, name, D):
    check_array(a, name, shape=(D,))
    check_float(a, name)


def _check_spd_shape(M, name, n):
    L = check_spd(M, name)
    if M.shape[0] != n:
        raise ValueError(f"{name}: expected shape ({n}, {n}), got {tuple(M.shape)}")
    return L


def _check_dist(q, name) -> _Checked:
    """Validate shapes, dtypes, finiteness, positivity and SPD-ness of one distribution."""
    if not isinstance(q, _TYPES):
        raise ValueError(f"{name}: expected one of {', '.join(t.__name__ for t in _TYPES)}, "
                         f"got {type(q).__name__}")
    check_array(q.mu, f"{name}.mu", ndim=1)
    check_float(q.mu, f"{name}.mu")
    D = q.mu.shape[0]
    if D == 0:
        raise ValueError(f"{name}.mu: expected shape (D,) with D >= 1, got (0,)")
    chol = None
    if isinstance(q, (DenseCov, DensePrec)):
        chol = _check_spd_shape(q[1], f"{name}.{q._fields[1]}", D)
    elif isinstance(q, _DIAG):
        _check_vec(q[1], f"{name}.{q._fields[1]}", D)
        check_invertible_positive(q[1], f"{name}.{q._fields[1]}")  # 1 / var, 1 / prec_diag
    elif isinstance(q, LowRankPrec):
        _check_lowrank(q, name, D)
    else:
        chol = _check_kron(q, name, D)
    check_same_dtype({f"{name}.{k}": v for k, v in q._asdict().items()})
    return _Checked(q, name, D, chol)


def _check_lowrank(q, name, D):
    check_array(q.U, f"{name}.U", ndim=2)
    check_float(q.U, f"{name}.U")
    if q.U.shape[0] != D or q.U.shape[1] > D:
        raise ValueError(f"{name}.U: expected shape ({D}, L) with 0 <= L <= {D}, "
                         f"got {tuple(q.U.shape)}")
    _check_vec(q.d, f"{name}.d", D)
    lowrank.check_factor_values(q.U, q.d, (f"{name}.U", f"{name}.d"))


def _check_kron(q, name, D):
    fa, fs = q._fields[1], q._fields[2]
    L_A = check_spd(q[1], f"{name}.{fa}")
    L_S = check_spd(q[2], f"{name}.{fs}")
    n_in, n_out = q[1].shape[0], q[2].shape[0]
    if n_in * n_out != D:
        raise ValueError(f"{name}.{fa}, {name}.{fs}: expected n_in * n_out = D = {D} (from "
                         f"{name}.mu), got {n_in} * {n_out} = {n_in * n_out}")
    return L_A, L_S


def _check_pair(q, p):
    cq, cp = _check_dist(q, "q"), _check_dist(p, "p")
    if cq.D != cp.D:
        raise ValueError(f"p: expected dimension D = {cq.D} (that of q), got D = {cp.D}")
    if q.mu.dtype != p.mu.dtype:
        raise ValueError(f"q, p: expected one dtype for both, got q: {q.mu.dtype}, "
                         f"p: {p.mu.dtype}")
    return cq, cp


# ----------------------------------------------------------------------------- per-form pieces

def _logdet_chol(L):
    """log det(L L^T) = 2 sum_i log L_ii.  (gaussian.5)"""
    xp = xp_of(L)
    return 2 * xp.sum(xp.log(xp.diagonal(L)))  # (gaussian.5)


def _diag_of_inverse(L):
    """diag((L L^T)^{-1})_i = sum_k ((L^{-1})_ki)^2, since (L L^T)^{-1} = L^{-T} L^{-1}.

    (gaussian.7)
    """
    xp = xp_of(L)
    L_inv = solve_triangular(L, xp.eye(L.shape[0], dtype=L.dtype), lower=True)
    return xp.sum(L_inv * L_inv, axis=0)  # (gaussian.7)


def _kron_diag(a, s):
    """diag(A kron S) = diag(A) kron diag(S), row-major.  (kron.12)"""
    return (a[:, None] * s[None, :]).reshape(-1)  # (kron.12)


def _logdet_cov(c: _Checked):
    """log det Sigma from the form's own factors: Cholesky diagonals, sums of logs, or the
    matrix determinant lemma (lowrank.4); log det(A kron S) = n_out log det A + n_in log det S.
    (gaussian.5), (kron.6)
    """
    xp, q = xp_of(c.q.mu), c.q
    sign = 1 if isinstance(q, _COV_FORMS) else -1
    if isinstance(q, (DenseCov, DensePrec)):
        return sign * _logdet_chol(c.chol)  # (gaussian.5)
    if isinstance(q, _DIAG):
        return sign * xp.sum(xp.log(q[1]))  # (gaussian.5)
    if isinstance(q, LowRankPrec):
        return -lowrank.logdet(q.U, q.d)  # (gaussian.5)
    L_A, L_S = c.chol
    return sign * (L_S.shape[0] * _logdet_chol(L_A) + L_A.shape[0] * _logdet_chol(L_S))  # (kron.6)


def _mahalanobis(c: _Checked, R):
    """r^T Sigma^{-1} r for each row r of R (n, D) -> (n,).  (gaussian.6)

    Dense covariance: ||L^{-1} r||^2; dense precision: ||L^T r||^2; Kronecker:
    (L_A kron L_S)^T vec(X) = vec(L_A^T X L_S) and
    (L_A kron L_S)^{-1} vec(X) = vec(L_A^{-1} X L_S^{-T}).
    """
    xp, q = xp_of(R), c.q
    if isinstance(q, DenseCov):
        Y = solve_triangular(c.chol, R.T, lower=True).T
    elif isinstance(q, DensePrec):
        Y = R @ c.chol
    elif isinstance(q, DiagCov):
        return xp.sum(R * R / q.var, axis=1)  # (gaussian.6)
    elif isinstance(q, DiagPrec):
        return xp.sum(R * R * q.prec_diag, axis=1)  # (gaussian.6)
    elif isinstance(q, LowRankPrec):
        return lowrank.quad(q.U, q.d, R.T)  # (gaussian.6)
    else:
        L_A, L_S = c.chol
        X = R.reshape((R.shape[0], L_A.shape[0], L_S.shape[0]))
        if isinstance(q, KronPrec):
            Y = L_A.T @ X @ L_S  # (kron.2)
        else:
            Y = _tri_right(_tri_left(L_A, X, trans=False), L_S, trans=True)  # (kron.3)
        Y = Y.reshape((R.shape[0], -1))
    return xp.sum(Y * Y, axis=1)  # (gaussian.6)


def _diag_cov(c: _Checked):
    """diag(Sigma) (D,) of any form without forming Sigma unless it is stored.  (gaussian.7)"""
    q = c.q
    if isinstance(q, DenseCov):
        return xp_of(q.Sigma).diagonal(q.Sigma)
    if isinstance(q, DensePrec):
        return _diag_of_inverse(c.chol)  # (gaussian.7)
    if isinstance(q, DiagCov):
        return q.var
    if isinstance(q, DiagPrec):
        return 1 / q.prec_diag
    if isinstance(q, LowRankPrec):
        return lowrank.diag_inv(q.U, q.d)  # (lowrank.5)
    if isinstance(q, KronCov):
        xp = xp_of(q.A_cov)
        return _kron_diag(xp.diagonal(q.A_cov), xp.diagonal(q.S_cov))  # (kron.12)
    return _kron_diag(_diag_of_inverse(c.chol[0]), _diag_of_inverse(c.chol[1]))  # (kron.3)


def _diag_prec(c: _Checked):
    """diag(Sigma^{-1}) (D,) of any form.  (gaussian.7)"""
    q = c.q
    if isinstance(q, DenseCov):
        return _diag_of_inverse(c.chol)  # (gaussian.7)
    if isinstance(q, DensePrec):
        return xp_of(q.Sigma_inv).diagonal(q.Sigma_inv)
    if isinstance(q, DiagCov):
        return 1 / q.var
    if isinstance(q, DiagPrec):
        return q.prec_diag
    if isinstance(q, LowRankPrec):
        return xp_of(q.U).sum(q.U * q.U, axis=1) + q.d  # diag(U U^T + diag d)  (lowrank.1)
    if isinstance(q, KronPrec):
        xp = xp_of(q.A_prec)
        return _kron_diag(xp.diagonal(q.A_prec), xp.diagonal(q.S_prec))  # (kron.12)
    return _kron_diag(_diag_of_inverse(c.chol[0]), _diag_of_inverse(c.chol[1]))  # (kron.3)


def _dense_chol(c: _Checked):
    """("cov" | "prec", L) with L L^T the dense covariance or precision, whichever the form
    stores; chol(A kron S) = L_A kron L_S (lower triangular).  Only for the dense fallback.
    """
    q = c.q
    if isinstance(q, (DenseCov, DensePrec)):
        return ("cov" if isinstance(q, DenseCov) else "prec"), c.chol
    if isinstance(q, LowRankPrec):
        P = lowrank.dense_precision(q.U, q.d)
        return "prec", check_spd(P, f"{c.name}: U U^T + diag(d)")
    xp = xp_of(q.mu)
    return ("cov" if isinstance(q, KronCov) else "prec"), xp.kron(*c.chol)  # (kron.13)


def _trace_chol(kind_p, L_p, kind_q, L_q):
    """tr(Sigma_p^{-1} Sigma_q) = ||Y||_F^2 from Cholesky factors of whichever matrices are
    stored, by triangular solves only.  (gaussian.9)

    prec/cov: Y = L_p^T L_q;  cov/cov: Y = L_p^{-1} L_q;  prec/prec: Y = L_q^{-1} L_p;
    cov/prec: Y = L_p^{-1} L_q^{-T}.
    """
    xp = xp_of(L_p, L_q)
    tri = solve_triangular
    if kind_p == "prec" and kind_q == "cov":
        Y = L_p.T @ L_q
    elif kind_p == "cov" and kind_q == "cov":
        Y = tri(L_p, L_q, lower=True)
    elif kind_p == "prec" and kind_q == "prec":
        Y = tri(L_q, L_p, lower=True)
    else:
        I = xp.eye(L_q.shape[0], dtype=L_q.dtype)
        Y = tri(L_p, tri(L_q, I, lower=True, trans="T"), lower=True)
    return xp.sum(Y * Y)  # (gaussian.9)


def _kron_kind(q):
    return "cov" if isinstance(q, KronCov) else "prec"


def _same_kron_shape(cp, cq):
    return (isinstance(cp.q, _KRON) and isinstance(cq.q, _KRON)
            and cp.chol[0].shape == cq.chol[0].shape)


def _trace(cp: _Checked, cq: _Checked):
    """tr(Sigma_p^{-1} Sigma_q) by the cheapest identity that applies to the pair.

    One side diagonal: sum_i diag(P_p)_i diag(Sigma_q)_i  (gaussian.7).
    Both low-rank: tr(U_p^T P_q^{-1} U_p) + sum_i d_p,i diag(P_q^{-1})_i  (gaussian.8).
    Both Kronecker with equal factor sizes: tr(P_A Sigma_A) tr(P_S Sigma_S)  (kron.12).
    Otherwise the dense Cholesky identity (gaussian.9).
    """
    xp = xp_of(cp.q.mu, cq.q.mu)
    if isinstance(cp.q, _DIAG) or isinstance(cq.q, _DIAG):
        return xp.sum(_diag_prec(cp) * _diag_cov(cq))  # (gaussian.7)
    if isinstance(cp.q, LowRankPrec) and isinstance(cq.q, LowRankPrec):
        U_p, d_p, U_q, d_q = cp.q.U, cp.q.d, cq.q.U, cq.q.d
        low = xp.sum(U_p * lowrank.solve(U_q, d_q, U_p))
        return low + xp.sum(d_p * lowrank.diag_inv(U_q, d_q))  # (gaussian.8)
    if _same_kron_shape(cp, cq):
        kp, kq = _kron_kind(cp.q), _kron_kind(cq.q)
        t_A = _trace_chol(kp, cp.chol[0], kq, cq.chol[0])
        return t_A * _trace_chol(kp, cp.chol[1], kq, cq.chol[1])  # (kron.12)
    return _trace_chol(*_dense_chol(cp), *_dense_chol(cq))  # (gaussian.9)


# ----------------------------------------------------------------------------- public routines

def log_density(q, x):
    """Evaluate the log-density of a Gaussian at one point or at n points.

    log N(x | mu, Sigma) = -(D log(2 pi) + log det Sigma + (x - mu)^T Sigma^{-1} (x - mu)) / 2.
    (gaussian.1)

    Parameters
    ----------
    q : DenseCov, DensePrec, DiagCov, DiagPrec, LowRankPrec, KronPrec or KronCov
        The distribution, in any parameterization of this module.
    x : array of shape (D,) or (n, D)
        Point(s), same dtype as q.mu.

    Returns
    -------
    array of shape () or (n,)
        The log-density: 0-d for x (D,), one value per row for x (n, D).

    Raises
    ------
    ValueError
        If q is invalid (see refbayes.linalg.gaussian), or x is not a finite float (D,) or (n, D)
        array of q.mu's dtype.
    """
    xp = xp_of(*_fields(q), x)
    c = _check_dist(q, "q")
    check_array(x, "x", ndim=(1, 2))
    check_float(x, "x")
    if x.shape[-1] != c.D:
        raise ValueError(f"x: expected shape ({c.D},) or (n, {c.D}), got {tuple(x.shape)}")
    if x.dtype != q.mu.dtype:
        raise ValueError(f"x, q.mu: expected one dtype for both, got x: {x.dtype}, "
                         f"q.mu: {q.mu.dtype}")
    R = xp.reshape(x, (-1, c.D)) - q.mu
    out = -0.5 * (c.D * _LOG_2PI + _logdet_cov(c) + _mahalanobis(c, R))  # (gaussian.1)
    return out[0] if x.ndim == 1 else out


def entropy(q):
    """Compute the differential entropy of a Gaussian.

    H[q] = (D (1 + log(2 pi)) + log det Sigma) / 2.  (gaussian.2)

    Parameters
    ----------
    q : DenseCov, DensePrec, DiagCov, DiagPrec, LowRankPrec, KronPrec or KronCov
        The distribution, in any parameterization of this module.

    Returns
    -------
    array of shape ()
        The entropy H[q], as a 0-d array.

    Raises
    ------
    ValueError
        If q is invalid (see refbayes.linalg.gaussian).
    """
    xp_of(*_fields(q))
    c = _check_dist(q, "q")
    return 0.5 * (c.D * (1 + _LOG_2PI) + _logdet_cov(c))  # (gaussian.2)


def kl(q, p):
    """Compute the Kullback-Leibler divergence KL(q || p) between two Gaussians.

    ::

        KL(q || p) = (tr(Sigma_p^{-1} Sigma_q) + m^T Sigma_p^{-1} m - D
                      + log det Sigma_p - log det Sigma_q) / 2,   m = mu_q - mu_p.

    The trace term uses the cheapest identity for the pair (see the module docstring).
    (gaussian.3)

    Parameters
    ----------
    q : DenseCov, DensePrec, DiagCov, DiagPrec, LowRankPrec, KronPrec or KronCov
        First distribution, in any parameterization of this module.
    p : DenseCov, DensePrec, DiagCov, DiagPrec, LowRankPrec, KronPrec or KronCov
        Second distribution, any parameterization, same D, dtype and backend as q.

    Returns
    -------
    array of shape ()
        The divergence KL(q || p), as a 0-d array.

    Raises
    ------
    ValueError
        If q or p is invalid (see refbayes.linalg.gaussian), or q and p differ in D or dtype.
    """
    xp_of(*_fields(q), *_fields(p))
    cq, cp = _check_pair(q, p)
    m = (q.mu - p.mu)[None, :]
    quad = _mahalanobis(cp, m)[0]
    return 0.5 * (_trace(cp, cq) + quad - cq.D + _logdet_cov(cp) - _logdet_cov(cq))  # (gaussian.3)


def symmetric_kl(q, p):
    """Compute the symmetrized KL divergence (KL(q || p) + KL(p || q)) / 2.

    ::

        (KL(q || p) + KL(p || q)) / 2
        = (tr(Sigma_p^{-1} Sigma_q) + tr(Sigma_q^{-1} Sigma_p)
           + m^T (Sigma_p^{-1} + Sigma_q^{-1}) m - 2 D) / 4,   m = mu_q - mu_p:

    the log-determinants cancel, so none is computed.  (gaussian.4)

    Parameters
    ----------
    q : DenseCov, DensePrec, DiagCov, DiagPrec, LowRankPrec, KronPrec or KronCov
        First distribution, in any parameterization of this module.
    p : DenseCov, DensePrec, DiagCov, DiagPrec, LowRankPrec, KronPrec or KronCov
        Second distribution, any parameterization, same D, dtype and backend as q.

    Returns
    -------
    array of shape ()
        The symmetric divergence, as a 0-d array.

    Raises
    ------
    ValueError
        If q or p is invalid (see refbayes.linalg.gaussian), or q and p differ in D or dtype.
    """
    xp_of(*_fields(q), *_fields(p))
    cq, cp = _check_pair(q, p)
    m = (q.mu - p.mu)[None, :]
    quad = _mahalanobis(cp, m)[0] + _mahalanobis(cq, m)[0]
    return 0.25 * (_trace(cp, cq) + _trace(cq, cp) + quad - 2 * cq.D)  # (gaussian.4)
