"""Naive oracles for Adam, Bayes-by-Backprop and MC dropout, written from derivations/bbb.md and
derivations/mc_dropout.md without the library's code: Adam coordinate by coordinate in Python
floats, gradients by autograd of the Monte Carlo objective (no reparameterization algebra by
hand), the KL from the dense Gaussian formula with D x D matrices, and the masked network
re-written layer by layer in autograd.numpy.

(The MC-dropout oracles live here too: this task owns one reference module.)
Every function takes and returns float64 NumPy arrays.
"""
import math

import autograd
import autograd.numpy as anp
import numpy as np

# ----------------------------------------------------------------------------- Adam


def adam_hand(g, m, v, t, alpha, beta1, beta2, eps):
    """One Adam update, one coordinate at a time: -> (delta, m', v'); t = updates already taken."""
    D = len(g)
    delta, m_new, v_new = np.empty(D), np.empty(D), np.empty(D)
    k = t + 1
    for j in range(D):
        m_new[j] = beta1 * m[j] + (1 - beta1) * g[j]
        v_new[j] = beta2 * v[j] + (1 - beta2) * g[j] ** 2
        m_hat = m_new[j] / (1 - beta1 ** k)
        v_hat = v_new[j] / (1 - beta2 ** k)
        delta[j] = -alpha * m_hat / (math.sqrt(v_hat) + eps)
    return delta, m_new, v_new


def _targets(model, X, y):
    """y in the likelihood's canonical form ((M, K) reals or (M,) labels) for _autograd_loss."""
    return model.likelihood.check_targets(y, X.shape[0], model.sizes[-1], np.float64)


def map_objective(model, theta, X, y, N, lam):
    """(N / M) sum_i l_i(theta) + (1/2) sum_j lam_j theta_j^2, autograd-able."""
    M = X.shape[0]
    return (N / M) * model._autograd_loss(theta, X, _targets(model, X, y)) \
        + 0.5 * anp.sum(lam * theta ** 2)


def map_step(model, theta, m, v, t, X, y, N, lam, alpha, beta1, beta2, eps):
    """-> (theta', m', v') by autograd of map_objective and adam_hand."""
    g = autograd.grad(map_objective, 1)(model, theta, X, y, N, lam)
    delta, m, v = adam_hand(g, m, v, t, alpha, beta1, beta2, eps)
    return theta + delta, m, v


# ----------------------------------------------------------------------------- Bayes-by-Backprop


def kl_dense(mu, sigma, lam):
    """KL(N(mu, Sigma) || N(0, Lam^{-1})) = (tr(Lam Sigma) + mu^T Lam mu - D
    + log det Lam^{-1} - log det Sigma) / 2 with Sigma = diag(sigma^2), Lam = diag(lam) formed
    as D x D matrices."""
    D = len(mu)
    Sigma = np.diag(sigma ** 2)
    Lam = np.diag(np.broadcast_to(lam, (D,)).astype(float))
    _, logdet_S = np.linalg.slogdet(Sigma)
    _, logdet_P = np.linalg.slogdet(np.linalg.inv(Lam))
    return 0.5 * (np.trace(Lam @ Sigma) + mu @ Lam @ mu - D + logdet_P - logdet_S)


def _kl_autograd(mu, sigma, lam):
    """The same KL term by term (autograd cannot differentiate slogdet of a diagonal here
    cheaply): sum_j (lam_j (sigma_j^2 + mu_j^2) - 1 - log(lam_j sigma_j^2)) / 2."""
    return 0.5 * anp.sum(lam * (sigma ** 2 + mu ** 2) - 1 - anp.log(lam * sigma ** 2))


def bbb_objective(mu, rho, model, eps, X, y, N, lam, kl_weight):
    """(N / (M S)) sum_s sum_i l_i(mu + softplus(rho) eps_s) + kl_weight KL: the Monte Carlo
    objective whose exact gradient the BBB step must return."""
    M, S = X.shape[0], eps.shape[1]
    sigma = anp.log1p(anp.exp(rho))
    yc = _targets(model, X, y)
    data = 0.0
    for s in range(S):
        data = data + model._autograd_loss(mu + sigma * eps[:, s], X, yc)
    return (N / (M * S)) * data + kl_weight * _kl_autograd(mu, sigma, lam)


def bbb_grads(mu, rho, model, eps, X, y, N, lam, kl_weight):
    """(dF/dmu, dF/drho) by autograd of bbb_objective."""
    return autograd.grad(bbb_objective, (0, 1))(mu, rho, model, eps, X, y, N, lam, kl_weight)


def bbb_step(mu, rho, m, v, t, model, eps, X, y, N, lam, kl_weight, alpha, beta1, beta2, e):
    """-> (mu', rho', m', v'): Adam on [mu; rho] with the autograd gradient."""
    g_mu, g_rho = bbb_grads(mu, rho, model, eps, X, y, N, lam, kl_weight)
    delta, m, v = adam_hand(np.concatenate([g_mu, g_rho]), m, v, t, alpha, beta1, beta2, e)
    D = len(mu)
    return mu + delta[:D], rho + delta[D:], m, v


# ----------------------------------------------------------------------------- MC dropout


def _act(h, activation):
    if activation == "relu":
        return anp.maximum(h, 0.0)
    if activation == "tanh":
        return anp.tanh(h)
    return 1.0 / (1.0 + anp.exp(-h))


def masked_outputs(model, theta, X, masks, scale):
    """f of the masked network, layer by layer: a~_k = scale z_k a_k, h_k = a~_k W_k + b_k."""
    sizes, pos, a = model.sizes, 0, X
    L = len(sizes) - 1
    for k in range(L):
        n_in, n_out = sizes[k], sizes[k + 1]
        W = anp.reshape(theta[pos:pos + n_in * n_out], (n_in, n_out))
        pos += n_in * n_out
        h = anp.dot(a * (scale * masks[k]), W)
        if model.bias:
            h = h + theta[pos:pos + n_out]
            pos += n_out
        if k == L - 1:
            return h
        a = _act(h, model.activation)


def masked_loss(model, theta, X, y, masks, scale):
    """sum_i l_i of the masked network (the likelihood's own loss formula, autograd-able)."""
    f = masked_outputs(model, theta, X, masks, scale)
    yc = _targets(model, X, y)
    return anp.sum(model.likelihood._losses(anp, f, yc))


def mc_dropout_objective(model, theta, X, y, masks, scale, N, lam):
    M = X.shape[0]
    return (N / M) * masked_loss(model, theta, X, y, masks, scale) + 0.5 * anp.sum(lam * theta ** 2)


def mc_dropout_step(model, theta, m, v, t, X, y, masks, scale, N, lam, alpha, beta1, beta2, e):
    """-> (theta', m', v') by autograd of the masked objective and adam_hand."""
    g = autograd.grad(mc_dropout_objective, 1)(model, theta, X, y, masks, scale, N, lam)
    delta, m, v = adam_hand(g, m, v, t, alpha, beta1, beta2, e)
    return theta + delta, m, v
