"""Naive re-implementations of one VOGN / VON / OGN step, written from derivations/vogn.md without
refbayes.methods: explicit loops over the draws and over the examples, per-example gradients and
GGN diagonals from autograd one example at a time (tests/reference/per_example.py, which never
imports refbayes.models), and a literal transcription of the Khan et al. (2018) VON / VOGN
equations for logistic regression with hand-written gradients and Hessians.

Every function works in float64 NumPy. ``spec`` is a tests.reference.per_example.Spec.
"""
import numpy as np

from tests.reference.per_example import (
    jacobian_loop,
    likelihood_hessian_loop,
    per_example_grads_loop,
)


def diag_ggn_loop(spec, theta, X, y):
    """diag(sum_i J_i^T H_i J_i) (D,), one example at a time."""
    J = jacobian_loop(spec, theta, X)
    H = likelihood_hessian_loop(spec, theta, X, y)
    return sum(np.diag(J[i].T @ H[i] @ J[i]) for i in range(len(J)))


def autograd_estimates(spec, X, y, curvature):
    """theta (D, S) -> (ghat, hhat) (D,): means over the draws and the M rows, per-example
    gradients and GGN diagonals by autograd one example at a time.  (vogn.5)"""
    M = X.shape[0]

    def est(theta):
        S = theta.shape[1]
        g_sum, h_sum = np.zeros(theta.shape[0]), np.zeros(theta.shape[0])
        for k in range(S):
            G = per_example_grads_loop(spec, theta[:, k], X, y)
            for i in range(M):
                g_sum += G[i]
                if curvature == "ef":
                    h_sum += G[i] ** 2
            if curvature == "ggn":
                h_sum += diag_ggn_loop(spec, theta[:, k], X, y)
        return g_sum / (M * S), h_sum / (M * S)
    return est


def blr_estimates(Xd, y, noise_precision):
    """Bayesian linear regression by hand: l_i = (tau_n / 2)(y_i - x_i^T theta)^2 + const, so
    g_i = tau_n (x_i^T theta - y_i) x_i and the Hessian = GGN diagonal is tau_n x_i^2.  (vogn.5)"""
    M = Xd.shape[0]

    def est(theta):
        S = theta.shape[1]
        g = sum(noise_precision * (Xd @ theta[:, k] - y) @ Xd for k in range(S)) / (M * S)
        h = noise_precision * (Xd ** 2).sum(axis=0) / M
        return g, h
    return est


def vogn_step(mu, s, m, est, eps, N, delta, alpha, beta1, beta2, gamma=0.0, tau=1.0, rho=1.0,
              printed=False, momentum="heavy-ball", printed_momentum=False):
    """-> (mu', s', m', theta). (vogn.2)-(vogn.10); eps None = OGN (theta = mu); est(theta) gives
    (ghat, hhat) at the draws theta (D, S).

    printed=True uses Algorithm 1's printed tempering lines (E-vogn.1): sigma = (N (s + delta~ +
    gamma))^{-1/2} and s <- (1 - tau beta2) s + beta2 hhat. momentum="ema" replaces (vogn.7) by
    the exponential-average form m <- beta1 m + (1 - beta1)(ghat + delta~ mu).
    printed_momentum=True uses Algorithm 1's printed momentum line (E-vogn.2), whose prior term is
    the FULL prior precision: m <- beta1 m + (ghat + delta mu); the preconditioner keeps delta~.
    """
    N_eff = rho * N
    dt = tau * delta / N_eff
    if printed:
        sigma = 1.0 / np.sqrt(N_eff * (s + dt + gamma))
    else:
        sigma = np.sqrt(tau / (N_eff * (s + dt + gamma)))
    if eps is None:
        theta = mu[:, None].copy()
    else:
        theta = np.stack([mu + sigma * eps[:, k] for k in range(eps.shape[1])], axis=1)
    g, h = est(theta)
    prior = delta if printed_momentum else dt
    if momentum == "ema":
        m_new = beta1 * m + (1 - beta1) * (g + prior * mu)
    else:
        m_new = beta1 * m + (g + prior * mu)
    s_new = (1 - tau * beta2) * s + beta2 * h if printed else (1 - beta2) * s + beta2 * h
    mu_new = mu - alpha * m_new / (s_new + dt + gamma)
    return mu_new, s_new, m_new, theta


def sigmoid(a):
    return 0.5 * (1 + np.tanh(a / 2))


def von2018_step(mu, s, Xd, y, eps, N, lam, beta, curvature="hessian"):
    """Khan et al. (2018), transcribed: logistic regression f_i = -log p(y_i | x_i, theta),
    f = (1/N) sum_i f_i, lambda~ = lambda / N, one draw theta_t ~ N(mu_t, sigma_t^2),
    sigma_t^2 = 1 / [N (s_t + lambda~)];
    s_{t+1} = (1 - beta) s_t + beta h, h = diag[(1/M) sum_i grad^2 f_i(theta_t)] (VON) or
    (1/M) sum_i [grad f_i(theta_t)]^2 (VOGN);
    mu_{t+1} = mu_t - beta (ghat(theta_t) + lambda~ mu_t) / (s_{t+1} + lambda~).
    Xd (M, D) with the intercept column; eps (D,). -> (mu', s')."""
    M = Xd.shape[0]
    lam_t = lam / N
    sigma2 = 1.0 / (N * (s + lam_t))
    theta = mu + np.sqrt(sigma2) * eps
    p = sigmoid(Xd @ theta)
    grads = [(p[i] - y[i]) * Xd[i] for i in range(M)]
    g = sum(grads) / M
    if curvature == "hessian":
        h = sum(p[i] * (1 - p[i]) * Xd[i] ** 2 for i in range(M)) / M
    else:
        h = sum(gi ** 2 for gi in grads) / M
    s_new = (1 - beta) * s + beta * h
    mu_new = mu - beta * (g + lam_t * mu) / (s_new + lam_t)
    return mu_new, s_new
