"""Naive oracles for the k-tied Normal, written from derivations/ktied.md without the library's
code: sigma built entry by entry from rho (sigma_ij = sum_c softplus(R^U_ic) softplus(R^V_jc)),
the objective's gradients by autograd (no chain rule by hand), Adam coordinate by coordinate.
Every function takes and returns float64 NumPy arrays."""
import autograd
import autograd.numpy as anp
import numpy as np

from tests.reference.bbb_dense import _kl_autograd, _targets, adam_hand


def _sp(x):
    return anp.log1p(anp.exp(x))


def sigma_of(rho, model, k):
    """sigma (D,) in theta's order from rho = concat_l (vec R^U_l, vec R^V_l, r^b_l), by loops:
    sigma[W_l][i, j] = sum_c softplus(R^U_l[i, c]) softplus(R^V_l[j, c])."""
    sizes, pos, out = model.sizes, 0, []
    for l, (m, n) in enumerate(zip(sizes[:-1], sizes[1:])):
        c = k[l]
        RU = rho[pos:pos + m * c]
        RV = rho[pos + m * c:pos + (m + n) * c]
        pos += (m + n) * c
        for i in range(m):
            for j in range(n):
                out.append(sum(_sp(RU[i * c + a]) * _sp(RV[j * c + a]) for a in range(c)))
        if model.bias:
            for j in range(n):
                out.append(_sp(rho[pos + j]))
            pos += n
    assert pos == len(rho)
    return anp.array(out) if isinstance(out[0], float) else anp.stack(out)


def objective(mu, rho, model, k, eps, X, y, N, lam, kl_weight):
    """(N / (M S)) sum_s sum_i l_i(mu + sigma(rho) eps_s) + kl_weight KL (ktied.3)."""
    M, S = X.shape[0], eps.shape[1]
    sigma = sigma_of(rho, model, k)
    yc = _targets(model, X, y)
    data = 0.0
    for s in range(S):
        data = data + model._autograd_loss(mu + sigma * eps[:, s], X, yc)
    return (N / (M * S)) * data + kl_weight * _kl_autograd(mu, sigma, lam)


def grads(mu, rho, model, k, eps, X, y, N, lam, kl_weight):
    """(dF/dmu, dF/drho) by autograd of ``objective``."""
    return autograd.grad(objective, (0, 1))(mu, rho, model, k, eps, X, y, N, lam, kl_weight)


def step(mu, rho, m, v, t, model, k, eps, X, y, N, lam, kl_weight, alpha, beta1, beta2, e):
    """-> (mu', rho', m', v'): Adam on [mu; rho] with the autograd gradient."""
    g_mu, g_rho = grads(mu, rho, model, k, eps, X, y, N, lam, kl_weight)
    delta, m, v = adam_hand(np.concatenate([g_mu, g_rho]), m, v, t, alpha, beta1, beta2, e)
    D = len(mu)
    return mu + delta[:D], rho + delta[D:], m, v
