"""Naive dense oracles for refbayes.methods.laplace: explicit inverses, autograd per-example loops,
scipy's multivariate normal, and laplace-torch's evidence line written literally."""
import numpy as np
from scipy.stats import multivariate_normal

from refbayes.models import add_intercept


def blr_posterior(X, y, noise_precision, delta):
    """Exact posterior of Bayesian linear regression with design X~ = [X, 1] (laplace.8):
    (mean, precision) = (P^{-1} tau_n X~^T y, tau_n X~^T X~ + diag(delta))."""
    Xt = add_intercept(X)
    P = noise_precision * Xt.T @ Xt + np.diag(delta)
    return np.linalg.inv(P) @ (noise_precision * Xt.T @ y), P


def blr_log_evidence(X, y, noise_precision, delta):
    """log N(y; 0, X~ diag(delta)^{-1} X~^T + I / tau_n), by scipy (laplace.8)."""
    Xt = add_intercept(X)
    C = Xt @ np.diag(1.0 / delta) @ Xt.T + np.eye(X.shape[0]) / noise_precision
    return float(multivariate_normal(np.zeros(X.shape[0]), C).logpdf(y))


def blr_predictive(X, y, noise_precision, delta, X_star):
    """Exact posterior predictive mean and variance x~*^T m, x~*^T Sigma x~* + 1 / tau_n."""
    mean, P = blr_posterior(X, y, noise_precision, delta)
    Sigma = np.linalg.inv(P)
    Xs = add_intercept(X_star)
    return Xs @ mean, np.einsum("md,de,me->m", Xs, Sigma, Xs) + 1.0 / noise_precision


def ef_outer_loop(model, theta, X, y):
    """sum_i g_i g_i^T with g_i from a per-example autograd loop, one outer product at a time."""
    G = model.per_example_grads(theta, X, y, impl="autograd")
    out = np.zeros((model.D, model.D))
    for g in G:
        out += np.outer(g, g)
    return out


def laplace_torch_lml(log_likelihood, P, delta, mu):
    """laplace-torch: log_likelihood - 0.5 * (log_det_ratio + scatter) (laplace.6), with
    log_det_ratio = logdet(P) - sum(log delta) and scatter = mu^T diag(delta) mu."""
    log_det_ratio = np.linalg.slogdet(P)[1] - np.sum(np.log(delta))
    scatter = (mu * delta) @ mu
    return log_likelihood - 0.5 * (log_det_ratio + scatter)


def kfac_reference(model, theta, X, y, curvature):
    """K-FAC factors per layer from independent pieces (peg.18): a~_i by a plain forward pass
    written out here, B_i as the bias-bias sub-block of the exact per-example GGN
    J_i^T H_i J_i (model.jacobian and the likelihood's H_i) or of g_i g_i^T (per-example
    autograd gradients), whose (bias, bias) block is 1 * B_i since a~_i ends in 1.  Returns
    [(A_l, B_l, exact_block_l)] with the exact layer block sum_i of the per-example blocks."""
    params = model.unflatten(theta)
    acts, a = [], X
    for l, (W, b) in enumerate(params):
        acts.append(a)
        z = a @ W + b
        a = np.tanh(z) if model.activation == "tanh" else z * (z > 0)
    if curvature == "ggn":
        J = model.jacobian(theta, X)
        f = model.forward(theta, X)
        Hf = model.likelihood.hess_f(f, y)
        blocks_i = np.einsum("mkd,mkl,mle->mde", J, Hf, J)
    else:
        G = model.per_example_grads(theta, X, y, impl="autograd")
        blocks_i = np.einsum("md,me->mde", G, G)
    out, off = [], 0
    for a_in, (W, b) in zip(acts, params):
        n_in, n_out = W.shape
        size = (n_in + 1) * n_out
        blk = blocks_i[:, off:off + size, off:off + size]
        B = blk[:, n_in * n_out:, n_in * n_out:].sum(axis=0)  # bias-bias: a~ = 1 there
        at = np.concatenate([a_in, np.ones((X.shape[0], 1))], axis=1)
        A = at.T @ at / X.shape[0]
        out.append((A, B, blk.sum(axis=0)))
        off += size
    return out
