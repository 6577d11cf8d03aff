"""Naive oracles for refbayes.models: one example at a time, autograd derivatives, textbook formulas.

Nothing here imports refbayes.models. The network is rebuilt from its hyperparameters (``Spec``)
by walking theta in the documented order (W_1 row-major, b_1, W_2, b_2, ...), the likelihoods are
written in their plain textbook form (safe for the moderate outputs the tests draw), and every
derivative comes from autograd on a single example. All arithmetic is float64.
"""
from typing import NamedTuple

import autograd
import autograd.numpy as anp
import numpy as np
import scipy.special
import scipy.stats

__all__ = ["Spec", "spec_of", "naive_params", "naive_output", "naive_nll", "example_loss",
           "per_example_grads_loop", "jacobian_loop", "likelihood_hessian_loop", "ggn_oracle",
           "hessian_oracle", "losses_scipy"]


class Spec(NamedTuple):
    sizes: tuple
    activation: str
    likelihood: str
    tau: float
    bias: bool


def spec_of(model) -> Spec:
    """The hyperparameters of a refbayes model (read as plain attributes only)."""
    lik = model.likelihood
    return Spec(tuple(model.sizes), model.activation, lik.name,
                getattr(lik, "noise_precision", 1.0), model.bias)


def naive_params(spec, theta):
    """Walk theta front to back: for each layer, n_in * n_out weights row by row, then n_out biases."""
    params, pos = [], 0
    for n_in, n_out in zip(spec.sizes[:-1], spec.sizes[1:]):
        rows = []
        for p in range(n_in):
            rows.append(theta[pos:pos + n_out])
            pos += n_out
        W = anp.stack(rows)
        b = None
        if spec.bias:
            b = theta[pos:pos + n_out]
            pos += n_out
        params.append((W, b))
    assert pos == len(theta)
    return params


def _act(name, z):
    if name == "relu":
        return anp.where(z > 0, z, 0.0)
    if name == "tanh":
        return anp.tanh(z)
    return 1.0 / (1.0 + anp.exp(-z))


def naive_output(spec, theta, x):
    """f(x; theta) (K,) for one example x (n_in,)."""
    params = naive_params(spec, theta)
    h = x
    for l, (W, b) in enumerate(params):
        h = anp.dot(h, W) + (0.0 if b is None else b)
        if l < len(params) - 1:
            h = _act(spec.activation, h)
    return h


def naive_nll(spec, f, y):
    """-log p(y | f) for one example (f (K,))."""
    if spec.likelihood == "gaussian":
        K = f.shape[0]
        return 0.5 * spec.tau * anp.sum((y - f) ** 2) + 0.5 * K * np.log(2 * np.pi) - 0.5 * K * np.log(spec.tau)
    if spec.likelihood == "bernoulli":
        # log s = -log(1 + e^{-f}), log(1 - s) = -log(1 + e^{f}): no cancellation in 1 - s
        return y * anp.log1p(anp.exp(-f[0])) + (1 - y) * anp.log1p(anp.exp(f[0]))
    e = anp.exp(f)
    return -anp.log(e[int(y)] / anp.sum(e))


def _targets(spec, Y):
    """Per-example targets: gaussian rows (K,), labels as ints."""
    if spec.likelihood == "gaussian":
        return np.asarray(Y, dtype=np.float64).reshape(len(Y), spec.sizes[-1])
    return np.asarray(Y).astype(int)


def example_loss(spec, theta, x, y):
    return naive_nll(spec, naive_output(spec, theta, x), y)


def per_example_grads_loop(spec, theta, X, Y):
    """G (M, D): row i = autograd.grad of example i's loss."""
    theta, X, Y = np.asarray(theta, np.float64), np.asarray(X, np.float64), _targets(spec, Y)
    g = autograd.grad(lambda th, x, y: example_loss(spec, th, x, y))
    return np.stack([g(theta, X[i], Y[i]) for i in range(len(X))])


def jacobian_loop(spec, theta, X):
    """J (M, K, D): autograd.jacobian of the outputs, example by example."""
    theta, X = np.asarray(theta, np.float64), np.asarray(X, np.float64)
    jac = autograd.jacobian(lambda th, x: naive_output(spec, th, x))
    return np.stack([jac(theta, X[i]) for i in range(len(X))])


def likelihood_hessian_loop(spec, theta, X, Y):
    """H (M, K, K): autograd.hessian of -log p(y_i | f) in f at f_i."""
    theta, X, Y = np.asarray(theta, np.float64), np.asarray(X, np.float64), _targets(spec, Y)
    hess = autograd.hessian(lambda f, y: naive_nll(spec, f, y))
    return np.stack([hess(naive_output(spec, theta, X[i]), Y[i]) for i in range(len(X))])


def ggn_oracle(spec, theta, X, Y):
    """sum_i J_i^T H_i J_i as an explicit loop of dense products (D, D)."""
    J = jacobian_loop(spec, theta, X)
    H = likelihood_hessian_loop(spec, theta, X, Y)
    return sum(J[i].T @ H[i] @ J[i] for i in range(len(J)))


def hessian_oracle(spec, theta, X, Y):
    """autograd.hessian of sum_i l_i (D, D)."""
    theta, X, Y = np.asarray(theta, np.float64), np.asarray(X, np.float64), _targets(spec, Y)

    def total(th):
        return sum(example_loss(spec, th, X[i], Y[i]) for i in range(len(X)))
    return autograd.hessian(total)(theta)


def losses_scipy(spec, F, Y):
    """Per-example -log p(y_i | f_i) (M,) from scipy.stats / scipy.special, given outputs F (M, K)."""
    F = np.asarray(F, np.float64)
    Y = _targets(spec, Y)
    if spec.likelihood == "gaussian":
        return -scipy.stats.norm.logpdf(Y, loc=F, scale=1.0 / np.sqrt(spec.tau)).sum(axis=1)
    if spec.likelihood == "bernoulli":
        return -scipy.stats.bernoulli.logpmf(Y, scipy.special.expit(F[:, 0]))
    return -scipy.special.log_softmax(F, axis=1)[np.arange(len(Y)), Y]
