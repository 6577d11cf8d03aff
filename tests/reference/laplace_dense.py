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
    """K-FAC factors per layer from independent pieces (peg.13): a~_i by a plain forward pass
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


# ----------------------------------------------------------------------------- predictives
# (laplace.14)-(laplace.16): explicit covariance inv(P), J Sigma J^T per test point, one
# np.linalg.cholesky per point, Python loops over draws.

def _probs(likelihood, f):
    """E[y | f] for one f (K,): sigmoid (Bernoulli, a scalar) or softmax (categorical)."""
    from scipy.special import expit, softmax
    return expit(f[0]) if likelihood == "bernoulli" else softmax(f)


def probit_literal(likelihood, f_mean, f_var):
    """laplace-torch's probit line written literally: kappa = 1 / sqrt(1 + pi/8 diag(f_var)),
    softmax(kappa * f_mean) (categorical), sigmoid(kappa * f) for one logit (laplace.14)."""
    out = []
    for m in range(f_mean.shape[0]):
        kappa = 1.0 / np.sqrt(1.0 + np.pi / 8.0 * np.diagonal(f_var[m]))
        out.append(_probs(likelihood, kappa * f_mean[m]))
    return np.array(out)


def glm_functional_dense(model, mu, P, X_star):
    """(f_mean (M, K), f_var (M, K, K)) with Sigma = inv(P) formed explicitly (laplace.7)."""
    Sigma = np.linalg.inv(P)
    J = model.jacobian(mu, X_star)
    f_var = np.stack([J[m] @ Sigma @ J[m].T for m in range(J.shape[0])])
    return model.forward(mu, X_star), f_var


def glm_mc_dense(model, mu, P, X_star, eps):
    """(1/S) sum_s E[y | f_mean + chol(f_var) eps_s] per test point, eps (K, S) shared by
    all points (laplace.15)."""
    f_mean, f_var = glm_functional_dense(model, mu, P, X_star)
    lik = model.likelihood.name
    out = []
    for m in range(f_mean.shape[0]):
        C = np.linalg.cholesky(f_var[m])
        out.append(np.mean([_probs(lik, f_mean[m] + C @ eps[:, s])
                            for s in range(eps.shape[1])], axis=0))
    return np.array(out)


def mc_predictive_dense(model, mu, P, X_star, eps):
    """theta_s = mu + inv(chol(P))^T eps_s, then (1/S) sum_s E[y | f(x*, theta_s)] and, for the
    Gaussian likelihood, (1/S) sum_s f_s f_s^T - mean mean^T + I / tau (laplace.16)."""
    R = np.linalg.inv(np.linalg.cholesky(P)).T
    lik = model.likelihood.name
    fs = [model.forward(mu + R @ eps[:, s], X_star) for s in range(eps.shape[1])]
    if lik == "gaussian":
        mean = np.mean(fs, axis=0)
        second = np.mean([np.einsum("mk,ml->mkl", f, f) for f in fs], axis=0)
        K = mean.shape[1]
        return mean, second - np.einsum("mk,ml->mkl", mean, mean) \
            + np.eye(K) / model.likelihood.noise_precision
    return np.mean([[_probs(lik, f[m]) for m in range(f.shape[0])] for f in fs], axis=0), None


# ----------------------------------------------------------------------------- evidence
# (laplace.10)-(laplace.13): the evidence as an autograd function of (log delta, log tau).

def lml_of_log_hyper(log_delta, log_tau, H0, tau0, power, E, NK, mu):
    """log Z = -(tau E + (N K / 2) log(2 pi / tau)) + (1/2) sum log delta
    - (1/2) mu^T diag(delta) mu
    - (1/2) log det((tau / tau0)^power H0 + diag(delta)); autograd-differentiable.  H0 is the
    curvature at tau0 (D, D), or its diagonal (D,) for the diagonal structure."""
    import autograd.numpy as anp
    delta, tau = anp.exp(log_delta), anp.exp(log_tau)
    c = (tau / tau0) ** power
    if H0.ndim == 1:
        logdet = anp.sum(anp.log(c * H0 + delta))
    else:
        logdet = anp.linalg.slogdet(c * H0 + anp.diag(delta))[1]
    log_lik = -(tau * E + 0.5 * NK * anp.log(2.0 * np.pi / tau))
    return log_lik + 0.5 * anp.sum(log_delta) - 0.5 * anp.sum(delta * mu * mu) - 0.5 * logdet


def adam_literal(grad_fn, x0, lr, n_steps, beta1=0.9, beta2=0.999, eps=1e-8):
    """torch.optim.Adam's update on x (minimising), written out: the iterates x_0..x_{n-1}."""
    x, m, v, xs = np.array(x0, dtype=float), 0.0, 0.0, []
    for t in range(1, n_steps + 1):
        xs.append(x.copy())
        g = grad_fn(x)
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        x = x - lr * (m / (1 - beta1 ** t)) / (np.sqrt(v / (1 - beta2 ** t)) + eps)
    return np.array(xs), x
