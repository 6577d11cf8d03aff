"""Naive re-implementations of one Vadam / Vprop step and of the 2018 VOGN step, written from
derivations/vadam.md and from Khan et al. (2018) without the library: explicit loops over draws and
examples, hand-written per-example gradients, every average spelled out.

Per-example gradients come from `logistic_grads` / `linear_gaussian_grads` (hand formulas on the
design Xd with its intercept column) or, for other models, from `autograd_grads` (a loop of
autograd.grad over examples, through the model's private autograd loss). Every function takes
and returns float64 NumPy arrays.
"""
import numpy as np


def sigmoid(a):
    return 0.5 * (1 + np.tanh(a / 2))


def logistic_grads(Xd, y):
    """theta -> (M, D): g_i = (sigmoid(x_i^T theta) - y_i) x_i, one example at a time."""
    def grads(theta):
        return np.array([(sigmoid(Xd[i] @ theta) - y[i]) * Xd[i] for i in range(len(y))])
    return grads


def linear_gaussian_grads(Xd, y, noise_precision):
    """theta -> (M, D): g_i = noise_precision (x_i^T theta - y_i) x_i."""
    def grads(theta):
        return np.array([noise_precision * (Xd[i] @ theta - y[i]) * Xd[i] for i in range(len(y))])
    return grads


def autograd_grads(model, X, y):
    """theta -> (M, D) by autograd.grad of the model's loss on one row at a time."""
    import autograd

    grad_fn = autograd.grad(model._autograd_loss)

    def grads(theta):
        return np.array([grad_fn(theta, X[i:i + 1], y[i:i + 1]) for i in range(X.shape[0])])
    return grads


def moments(grads, theta, squares):
    """(g_hat, h_hat) from the draws theta (D, S): g_hat = mean over draws of the minibatch-mean
    gradient; h_hat = mean over draws of its square ("minibatch") or mean over draws and
    examples of the per-example squares ("per_example")."""
    D, S = theta.shape
    g_hat, h_hat = np.zeros(D), np.zeros(D)
    for k in range(S):
        G = grads(theta[:, k])
        M = G.shape[0]
        g_k = sum(G[i] for i in range(M)) / M
        g_hat += g_k / S
        if squares == "minibatch":
            h_hat += g_k * g_k / S
        else:
            h_hat += sum(G[i] * G[i] for i in range(M)) / (M * S)
    return g_hat, h_hat


def vadam_step(mu, m, s, t, grads, eps, N, lam, alpha, beta1, beta2, bias_correction=True,
               squares="minibatch", sqrt=True, damping=None, grad_scale=1.0):
    """Fig. 1 of Khan et al. (2018), lines 2-7, with t steps already taken.

    -> (mu', m', s', theta). `damping` replaces lam / N in the mean's denominator (the issue's
    printed "eta / 3" is damping = lam / 3); `grad_scale` multiplies the minibatch-mean gradient
    (grad_scale = M reproduces a SUMMED minibatch gradient) for the errata tests.
    """
    lam_t = lam / N
    sigma = 1 / np.sqrt(N * s + lam)                      # line 2
    theta = mu[:, None] + sigma[:, None] * eps            # line 2
    g, h = moments(grads, theta, squares)                 # line 3
    g, h = grad_scale * g, grad_scale ** 2 * h
    m = beta1 * m + (1 - beta1) * (g + lam_t * mu)        # line 4
    s = beta2 * s + (1 - beta2) * h                       # line 5
    if bias_correction:                                   # line 6
        m_hat, s_hat = m / (1 - beta1 ** (t + 1)), s / (1 - beta2 ** (t + 1))
    else:
        m_hat, s_hat = m, s
    d = lam_t if damping is None else damping
    denom = (np.sqrt(s_hat) if sqrt else s_hat) + d
    return mu - alpha * m_hat / denom, m, s, theta        # line 7


def vogn_2018_step(mu, s, grads, eps, N, lam, alpha_t, beta_t):
    """The 2018 VOGN update (Khan et al. 2018, VON with the per-example squared-gradient curvature),
    transcribed literally, S draws averaged:

        sigma_t^2 = 1 / (N (s_t + lam~)),  lam~ = lam / N,  theta = mu_t + sigma_t eps
        s_{t+1}   = (1 - beta_t) s_t + beta_t (1/M) sum_i g_i(theta)^2
        mu_{t+1}  = mu_t - alpha_t (g^(theta) + lam~ mu_t) / (s_{t+1} + lam~),  g^ = (1/M) sum_i g_i

    -> (mu', s', theta).
    """
    lam_t = lam / N
    theta = mu[:, None] + eps / np.sqrt(N * (s + lam_t))[:, None]
    g_hat, h_hat = moments(grads, theta, "per_example")
    s_new = (1 - beta_t) * s + beta_t * h_hat
    return mu - alpha_t * (g_hat + lam_t * mu) / (s_new + lam_t), s_new, theta
