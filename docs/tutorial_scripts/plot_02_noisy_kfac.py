"""
The K-FAC family: Noisy K-FAC and K-FAC
=======================================

``refbayes.methods.noisy_kfac`` keeps a matrix-variate normal per layer, with Kronecker factors
A (inputs) and S (output gradients). ``step(state, batch, eps, cfg, model)`` is one step of
Zhang et al.'s Algorithm 2 with the caller's draws ``eps`` (D, S); ``eps=None`` evaluates
everything at the mean, which is K-FAC.

On Bayesian linear regression (one linear layer, one output), K-FAC with exact damping is
Newton's method: it reaches the exact posterior mean and covariance in three full-batch steps.
"""
import matplotlib.pyplot as plt
import numpy as np

from refbayes.methods import noisy_kfac as nk
from refbayes.models import MLP

rng = np.random.default_rng(0)
N, p, tau, eta = 40, 3, 4.0, 2.0  # rows, features, noise precision, prior variance
X = rng.standard_normal((N, p))
y = X @ rng.standard_normal(p) + rng.standard_normal(N) / np.sqrt(tau)
model = MLP([p, 1], "relu", "gaussian", noise_precision=tau)  # linear: no hidden layer

# the exact posterior (the intercept is the last column)
Xt = np.hstack([X, np.ones((N, 1))])
prec = tau * Xt.T @ Xt + np.eye(p + 1) / eta
mu_star = np.linalg.solve(prec, tau * Xt.T @ y)

# %%
# K-FAC (eps = None) with exact damping
# -------------------------------------

cfg = nk.NoisyKFACConfig(N, eta=eta, alpha=1.0, beta=1.0, momentum=0.0, damping="exact")
state = nk.init(np.zeros(model.D), model)
batch = nk.Batch(X, y)
for t in range(3):
    state, info = nk.step(state, batch, None, cfg, model)
    print(f"step {t + 1}: |mu - mu*| = {np.abs(state.mu - mu_star).max():.2e}")
Sigma = nk.dense_covariance(state, cfg, model)
print("max |Sigma - Sigma*| =", np.abs(Sigma - np.linalg.inv(prec)).max())

# %%
# Noisy K-FAC: the same step with Monte Carlo draws
# -------------------------------------------------
# Each step evaluates the gradient and the factor statistics at S draws from q; the official
# damping is "factored" (the default).

cfg = nk.NoisyKFACConfig(N, eta=eta, alpha=0.02, beta=0.1)  # momentum 0.9, the default
state = nk.init(np.zeros(model.D), model)
err = []
for t in range(150):
    idx = rng.permutation(N)[:10]
    eps = rng.standard_normal((model.D, 2))
    state, info = nk.step(state, nk.Batch(X[idx], y[idx]), eps, cfg, model)
    err.append(np.abs(state.mu - mu_star).max())
print("Info fields:", ", ".join(info._fields))
print("Noisy K-FAC mean:", np.round(state.mu, 3), " exact:", np.round(mu_star, 3))
print("posterior std:   ", np.sqrt(np.diag(nk.dense_covariance(state, cfg, model))).round(3),
      " exact:", np.sqrt(np.diag(np.linalg.inv(prec))).round(3))

fig, ax = plt.subplots(figsize=(6, 3))
ax.semilogy(err)
ax.set_xlabel("step")
ax.set_ylabel("max |mu - mu*|")
fig.tight_layout()
