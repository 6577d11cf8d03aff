"""
The k-tied Normal
=================

``refbayes.methods.ktied`` is mean-field VI whose weight standard deviations are tied to rank k
per layer, A_l = U_l V_l^T with positive factors (Swiatkowski et al. 2020). ``init`` builds the
state from a mean, a rank and the caller's symmetry-breaking draws; ``step(state, batch, eps,
cfg, model)`` is one Adam step on the ELBO with the caller's draws ``eps`` (D, S); ``std`` gives
the tied standard deviations. The post-hoc analysis of a trained mean-field posterior
(``explained_variance``, ``truncate_sigma``) is in the same module.
"""
import matplotlib.pyplot as plt
import numpy as np

from refbayes.methods import bbb, driver, ktied
from refbayes.models import MLP

rng = np.random.default_rng(0)
N = 100
X = rng.standard_normal((N, 4))
y = (X[:, 0] * X[:, 1] + X[:, 2] > 0).astype(int)  # two classes
model = MLP([4, 16, 2], activation="tanh", likelihood="categorical")
lam = np.ones(model.D)

# %%
# Training the k-tied Normal (k = 2)
# ----------------------------------

k = 2
xi = rng.standard_normal(ktied.layout(model, k).P)
state = ktied.init(0.3 * rng.standard_normal(model.D), model, k, 0.05, xi)
cfg = ktied.KTiedConfig(N, lam, alpha=0.02)
elbo = []
for t in range(300):
    idx = rng.permutation(N)[:20]
    eps = rng.standard_normal((model.D, 2))
    state, info = ktied.step(state, ktied.Batch(X[idx], y[idx]), eps, cfg, model)
    elbo.append(info.elbo)
print("variational parameters: k-tied", ktied.n_variational_params(model, k),
      "vs mean field", ktied.n_variational_params(model))
sigma = ktied.std(state, model)
print("tied standard deviations: min %.3g, max %.3g" % (sigma.min(), sigma.max()))

# %%
# The post-hoc view of a mean-field posterior
# -------------------------------------------
# Train mean-field VI (Bayes-by-Backprop) and look at the spectrum of the first layer's
# standard deviations: after training, most of the variance sits in the first singular value
# (the k-tied paper's observation), from a start where it did not.

rho0 = bbb.inv_softplus(np.full(model.D, 0.05)) + 0.5 * rng.standard_normal(model.D)  # full rank
start = bbb.init(0.3 * rng.standard_normal(model.D), rho0=rho0)
mf = driver.run(start, bbb.BBBConfig(N, lam, alpha=0.02), model, X, y,
                rng=np.random.default_rng(1), epochs=60, M=20)
sigma_mf = bbb.softplus(mf.rho)
W1_start = model.unflatten(bbb.softplus(rho0))[0][0]  # (n_in, n_out) of the first layer
W1_sigma = model.unflatten(sigma_mf)[0][0]
print("explained variance of the first layer's std, at the start:",
      np.round(ktied.explained_variance(W1_start), 3))
print("                                          after training:",
      np.round(ktied.explained_variance(W1_sigma), 3))
sigma_1 = ktied.truncate_sigma(sigma_mf, model, 1)  # every weight block at rank 1
print("rank-1 truncation: largest relative change of a std %.3f"
      % np.max(np.abs(sigma_1 / sigma_mf - 1)))

fig, (a, b) = plt.subplots(1, 2, figsize=(8, 3))
a.plot(-np.array(elbo))
a.set_xlabel("step")
a.set_ylabel("-ELBO estimate (k-tied, k = 2)")
b.bar(np.arange(4) - 0.2, ktied.explained_variance(W1_start), 0.4, label="start")
b.bar(np.arange(4) + 0.2, ktied.explained_variance(W1_sigma), 0.4, label="trained")
b.legend()
b.set_xlabel("singular value")
b.set_ylabel("explained variance")
fig.tight_layout()
