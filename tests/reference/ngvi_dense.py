"""Naive dense re-implementations of one natural-gradient step (full, mean field, SLANG) for
Bayesian logistic regression, written from derivations/ngvi.md and slang.md without the library's
structured algebra: explicit inverses, D x D eigendecompositions, hand-written logistic gradients.

The "exact" expectations come from refbayes.methods.exact_vi.logistic_expectations, itself checked
against scipy.integrate.quad to 1e-12 in tests/methods/test_exact_vi.py.
Every function takes and returns float64 NumPy arrays; Xd is the design with the intercept column.
"""
import numpy as np

from refbayes.methods import exact_vi


def sigmoid(a):
    return 0.5 * (1 + np.tanh(a / 2))


def rates(t, alpha, beta, decay):
    """The official schedule: k = t + 1, rate / (1 + k^decay), constant at decay = 0."""
    if decay == 0:
        return alpha, beta
    return alpha / (1 + (t + 1) ** decay), beta / (1 + (t + 1) ** decay)


def grads(Xd, y, theta):
    """(S, M, D): g_{s,i} = (sigmoid(x_i^T theta_s) - y_i) x_i for theta (D, S)."""
    r = sigmoid(Xd @ theta).T - y[None, :]  # (S, M)
    return r[:, :, None] * Xd[None, :, :]


def hessian(Xd, theta_s):
    s = sigmoid(Xd @ theta_s)
    return (Xd * (s * (1 - s))[:, None]).T @ Xd


def exact_terms(Xd, y, mu, Sigma, N):
    m, v = Xd @ mu, np.einsum("id,de,ie->i", Xd, Sigma, Xd)
    _, E1, E2 = exact_vi.logistic_expectations(m, v, y)
    M = Xd.shape[0]
    return -(N / M) * Xd.T @ E1, -(N / M) * (Xd.T * E2) @ Xd


def direction(g_hat, lam, mu, b, g_bar, t):
    if b == 0:
        return g_bar, g_hat + lam * mu
    g_bar = b * g_bar + (1 - b) * g_hat
    return g_bar, g_bar / (1 - b ** (t + 1)) + lam * mu


def full_step(mu, P, g_bar, t, Xd, y, eps, N, lam, alpha, beta, decay, curvature, b=0.0):
    """-> (mu', P', g_bar', theta)."""
    a_t, b_t = rates(t, alpha, beta, decay)
    Sigma = np.linalg.inv(P)
    M = Xd.shape[0]
    if curvature == "exact":
        theta = np.zeros((len(mu), 0))
        g_hat, C = exact_terms(Xd, y, mu, Sigma, N)
    else:
        theta = mu[:, None] + np.linalg.inv(np.linalg.cholesky(P).T) @ eps
        S = eps.shape[1]
        G = grads(Xd, y, theta)
        g_hat = N / (M * S) * G.sum(axis=(0, 1))
        if curvature == "ef":
            F = G.reshape(-1, len(mu))
            C = N / (M * S) * F.T @ F
        else:
            C = N / (M * S) * sum(hessian(Xd, theta[:, s]) for s in range(S))
    P_new = (1 - b_t) * P + b_t * (C + np.diag(lam))
    g_bar, dirn = direction(g_hat, lam, mu, b, g_bar, t)
    return mu - a_t * np.linalg.inv(P_new) @ dirn, P_new, g_bar, theta


def meanfield_step(mu, s, g_bar, t, Xd, y, eps, N, lam, alpha, beta, decay, curvature, b=0.0):
    """-> (mu', prec_diag', g_bar')."""
    a_t, b_t = rates(t, alpha, beta, decay)
    M = Xd.shape[0]
    if curvature == "exact":
        g_hat, C = exact_terms(Xd, y, mu, np.diag(1 / s), N)
        c = np.diag(C)
    else:
        theta = mu[:, None] + eps / np.sqrt(s)[:, None]
        S = eps.shape[1]
        G = grads(Xd, y, theta)
        g_hat = N / (M * S) * G.sum(axis=(0, 1))
        c = (N / (M * S) * (G ** 2).sum(axis=(0, 1)) if curvature == "ef"
             else N / (M * S) * sum(np.diag(hessian(Xd, theta[:, k])) for k in range(S)))
    s_new = (1 - b_t) * s + b_t * (c + lam)
    g_bar, dirn = direction(g_hat, lam, mu, b, g_bar, t)
    return mu - a_t * dirn / s_new, s_new, g_bar


def symmetric_root_draw(mu, U, d, eps):
    """mu + d^{-1/2} (I + V V^T)^{-1/2} eps, V = d^{-1/2} U, through a D x D eigendecomposition."""
    V = U / np.sqrt(d)[:, None]
    w, Q = np.linalg.eigh(np.eye(len(d)) + V @ V.T)
    return mu[:, None] + ((Q / np.sqrt(w)) @ Q.T @ eps) / np.sqrt(d)[:, None]


def top_L(A, L):
    """Q_L diag(lam_L) Q_L^T, the best rank-L approximation of a PSD matrix A."""
    w, Q = np.linalg.eigh(A)
    w, Q = w[::-1][:L], Q[:, ::-1][:, :L]
    return (Q * w) @ Q.T


def slang_step(mu, UUt, d, g_bar, t, theta, Xd, y, N, lam, L, alpha, beta, decay, b=0.0,
               line7=None, line8_scaled=True, line10_beta=True, line11_scaled=True):
    """One SLANG step from the dense low-rank part UUt at the draws theta (D, S).

    -> (mu', U'U'^T, d', g_bar', Delta_d). The keyword switches reproduce the PRINTED lines of
    Algorithm 1 for the errata tests: line7="printed" uses columns delta u, beta g (so the
    truncated matrix is delta^2 U U^T + beta^2 G^T G / ...); line8_scaled=False drops N / (M S)
    on the gradient squares; line10_beta=False adds lam instead of beta lam; line11_scaled=False
    drops N / (M S) from the gradient.
    """
    M, S = Xd.shape[0], theta.shape[1]
    F = grads(Xd, y, theta).reshape(-1, len(mu))
    return slang_step_from_grads(mu, UUt, d, g_bar, t, F, M, S, N, lam, L, alpha, beta, decay, b,
                                 line7, line8_scaled, line10_beta, line11_scaled)


def slang_step_from_grads(mu, UUt, d, g_bar, t, F, M, S, N, lam, L, alpha, beta, decay, b=0.0,
                          line7=None, line8_scaled=True, line10_beta=True, line11_scaled=True):
    """``slang_step`` from the per-example gradients F (S M, D) at the draws, for any model."""
    a_t, b_t = rates(t, alpha, beta, decay)
    delta = 1 - b_t
    c = N / (M * S)
    if line7 == "printed":
        target = delta ** 2 * UUt + b_t ** 2 * F.T @ F
    else:
        target = delta * UUt + b_t * c * F.T @ F
    UUt_new = top_L(target, L)
    gsq = c * (F ** 2).sum(0) if line8_scaled else (F ** 2).sum(0)
    Delta_d = delta * np.diag(UUt) + b_t * gsq - np.diag(UUt_new)
    d_new = delta * d + Delta_d + (b_t * lam if line10_beta else lam)
    g_hat = (c if line11_scaled else 1.0) * F.sum(0)
    g_bar, dirn = direction(g_hat, lam, mu, b, g_bar, t)
    mu_new = mu - a_t * np.linalg.inv(UUt_new + np.diag(d_new)) @ dirn
    return mu_new, UUt_new, d_new, g_bar, Delta_d
