"""Naive dense oracles for refbayes.linalg.gaussian and refbayes.linalg.kron.

Everything here is the textbook formula on explicit D x D matrices in float64 NumPy: explicit
inverses (numpy.linalg.inv), determinants via slogdet, np.kron, and loops where a loop is the
definition.  No structure is exploited, so these share no algorithm with the code under test.
"""
import numpy as np

from refbayes.backend import to_numpy

__all__ = ["as64", "mean_cov", "log_density", "entropy", "kl", "symmetric_kl", "kron_entry",
           "kron_solve", "kron_logdet", "factored_pi", "factored_kron"]


def as64(a):
    """A float64 NumPy copy (from NumPy or CuPy, any float dtype)."""
    return np.asarray(to_numpy(a), dtype=np.float64)


def mean_cov(q):
    """(mu, Sigma) of any refbayes.linalg.gaussian parameterization, by explicit inverses."""
    f = {k: as64(v) for k, v in q._asdict().items()}
    name = type(q).__name__
    if name == "DenseCov":
        Sigma = f["Sigma"]
    elif name == "DensePrec":
        Sigma = np.linalg.inv(f["Sigma_inv"])
    elif name == "DiagCov":
        Sigma = np.diag(f["var"])
    elif name == "DiagPrec":
        Sigma = np.diag(1.0 / f["prec_diag"])
    elif name == "LowRankPrec":
        Sigma = np.linalg.inv(f["U"] @ f["U"].T + np.diag(f["d"]))
    elif name == "KronPrec":
        Sigma = np.linalg.inv(np.kron(f["A_prec"], f["S_prec"]))
    elif name == "KronCov":
        Sigma = np.kron(f["A_cov"], f["S_cov"])
    else:
        raise TypeError(name)
    return f["mu"], Sigma


def log_density(mu, Sigma, x):
    """-(D log 2 pi + log det Sigma + (x - mu)^T Sigma^{-1} (x - mu)) / 2, row by row."""
    x = np.atleast_2d(x)
    P = np.linalg.inv(Sigma)
    logdet = np.linalg.slogdet(Sigma)[1]
    out = np.array([-0.5 * (len(mu) * np.log(2 * np.pi) + logdet + (r - mu) @ P @ (r - mu))
                    for r in x])
    return out


def entropy(Sigma):
    """(D (1 + log 2 pi) + log det Sigma) / 2."""
    return 0.5 * (Sigma.shape[0] * (1 + np.log(2 * np.pi)) + np.linalg.slogdet(Sigma)[1])


def kl(mu_q, Sigma_q, mu_p, Sigma_p):
    """KL(q || p) = (tr(Sigma_p^{-1} Sigma_q) + m^T Sigma_p^{-1} m - D
                     + ln|Sigma_p| - ln|Sigma_q|) / 2."""
    P_p = np.linalg.inv(Sigma_p)
    m = mu_p - mu_q
    return 0.5 * (np.trace(P_p @ Sigma_q) + m @ P_p @ m - len(m)
                  + np.linalg.slogdet(Sigma_p)[1] - np.linalg.slogdet(Sigma_q)[1])


def kl_scale(mu_q, Sigma_q, mu_p, Sigma_p):
    """The size of the terms kl() adds up, (tr + quad + D + |ln|Sigma_p|| + |ln|Sigma_q||) / 2:
    KL cancels them, so its rounding error is this times the unit roundoff, whatever KL is (a
    KL of 3e-5 from terms of size 1 has relative error ~2e-3 in float32)."""
    P_p = np.linalg.inv(Sigma_p)
    m = mu_p - mu_q
    return 0.5 * (abs(np.trace(P_p @ Sigma_q)) + abs(m @ P_p @ m) + len(m)
                  + abs(np.linalg.slogdet(Sigma_p)[1]) + abs(np.linalg.slogdet(Sigma_q)[1]))


def symmetric_kl(mu_q, Sigma_q, mu_p, Sigma_p):
    return 0.5 * (kl(mu_q, Sigma_q, mu_p, Sigma_p) + kl(mu_p, Sigma_p, mu_q, Sigma_q))


def kron_entry(A, S):
    """The Kronecker product by its definition: K[i n_out + j, k n_out + l] = A[i, k] S[j, l]."""
    n_in, n_out = A.shape[0], S.shape[0]
    K = np.empty((n_in * n_out, n_in * n_out))
    for i in range(n_in):
        for j in range(n_out):
            for k in range(n_in):
                for l in range(n_out):
                    K[i * n_out + j, k * n_out + l] = A[i, k] * S[j, l]
    return K


def kron_solve(A, S, X, damping):
    """(A kron S + damping I)^{-1} vec(X) for row-major vec(X), by an explicit inverse."""
    K = np.kron(A, S) + damping * np.eye(A.shape[0] * S.shape[0])
    return (np.linalg.inv(K) @ X.reshape(-1)).reshape(X.shape)


def kron_logdet(A, S, damping):
    return np.linalg.slogdet(np.kron(A, S) + damping * np.eye(A.shape[0] * S.shape[0]))[1]


def factored_pi(A, S):
    """Martens & Grosse (2015) sec. 6.3, trace-norm choice, as printed:
    pi = sqrt((tr(A) / dim A) / (tr(G) / dim G)), A the input (activation) factor."""
    return np.sqrt((np.trace(A) / A.shape[0]) / (np.trace(S) / S.shape[0]))


def factored_kron(A, S, gamma):
    """(A + pi sqrt(gamma) I) kron (S + sqrt(gamma)/pi I), explicitly."""
    pi = factored_pi(A, S)
    r = np.sqrt(gamma)
    return np.kron(A + pi * r * np.eye(A.shape[0]), S + r / pi * np.eye(S.shape[0]))
