"""
Gaussian variational inference: SLANG, NGVI, VOGN, Vadam, Noisy Adam, BBB
=========================================================================

Every Gaussian-VI method of refbayes has the same shape: ``init`` builds a state (a NamedTuple
of arrays), ``step(state, batch, eps, cfg, model)`` takes one pure, deterministic step given the
minibatch and the standard-normal draws ``eps``, and returns the new state and an ``Info`` that
names every intermediate by its equation. ``refbayes.methods.driver.run`` draws the minibatches
and ``eps`` from a ``numpy.random.Generator`` you own and calls ``step``.

Here all six fit the same small Bayesian logistic regression (Gaussian prior with precision 1).
"""
import matplotlib.pyplot as plt
import numpy as np

from refbayes.datasets import make_logistic_regression
from refbayes.methods import bbb, driver, ngvi, noisy_adam, slang, vadam, vogn
from refbayes.models import LogisticRegression

data = make_logistic_regression(60, 4, 0)  # N = 60 rows, 4 features, seed 0
X, y = data.X, data.y.astype(float)
model = LogisticRegression(4)  # an intercept: D = 5 parameters
N, D = X.shape[0], model.D
lam = np.ones(D)  # prior precision

# %%
# One step by hand
# ----------------
# A step never draws random numbers: the caller passes the rows and ``eps`` (D, S). Feeding
# another implementation the same inputs gives it the same step to reproduce.

state = slang.init(np.zeros(D), np.zeros((D, 2)), np.ones(D))  # mu, U (rank L = 2), d
cfg = slang.SLANGConfig(N, lam, L=2)
rng = np.random.default_rng(0)
idx = rng.permutation(N)[:10]
eps = rng.standard_normal((D, 3))  # S = 3 Monte Carlo draws
new, info = slang.step(state, slang.Batch(X[idx], y[idx]), eps, cfg, model)
print("Info fields:", ", ".join(info._fields))
print("mu after one step:", np.round(new.mu, 4))

# %%
# Training with the driver
# ------------------------
# ``driver.run`` walks shuffled minibatches (M rows) for a number of epochs; each method's
# Config holds its paper's defaults, overridden here for a short run (larger steps; for the
# Adam-like methods beta2 = 0.9, so that their curvature average warms up within 120 steps, and
# per-example squared gradients: Vadam's and Noisy Adam's printed algorithms square the
# minibatch gradient, ``squares="minibatch"``, their default, which near a mode underestimates
# the curvature by about a factor M and so overestimates the variances: derivations/vadam.md).

fits = {
    "NGVI full": (ngvi.init_full(np.zeros(D), np.eye(D)), ngvi.NGVIConfig(N, lam, alpha=0.2,
                                                                        beta=0.2)),
    "NGVI mean field": (ngvi.init_meanfield(np.zeros(D), np.ones(D)),
                        ngvi.NGVIConfig(N, lam, alpha=0.2, beta=0.2)),
    "SLANG L=2": (slang.init(np.zeros(D), np.zeros((D, 2)), np.ones(D)),
                  slang.SLANGConfig(N, lam, L=2, alpha=0.2, beta=0.2)),
    "VOGN": (vogn.init(np.zeros(D), np.zeros(D)), vogn.VOGNConfig(N, 1.0, alpha=0.05,
                                                                   beta1=0.0, beta2=0.2)),
    "Vadam": (vadam.init(np.zeros(D)), vadam.VadamConfig(N, lam, alpha=0.05, beta2=0.9,
                                                           squares="per_example")),
    "Noisy Adam": (noisy_adam.init(np.zeros(D)),
                   noisy_adam.NoisyAdamConfig(N, 1.0, alpha=0.05, beta2=0.9,
                                              squares="per_example")),
    "BBB": (bbb.init(np.zeros(D), sigma0=0.5), bbb.BBBConfig(N, lam, alpha=0.05)),
}
std = {}
for name, (state, cfg) in fits.items():
    out = driver.run(state, cfg, model, X, y, rng=np.random.default_rng(1), epochs=40, M=20, S=2)
    if name == "NGVI full":
        var = np.diag(ngvi.dense_covariance(out))
    elif name == "NGVI mean field":
        var = np.diag(ngvi.dense_covariance_meanfield(out))
    elif name == "SLANG L=2":
        var = np.diag(slang.dense_covariance(out))
    elif name == "VOGN":
        var = np.diag(vogn.dense_covariance(out, cfg))
    elif name == "BBB":
        var = 1.0 / bbb.prec_diag(out)
    else:  # Vadam, Noisy Adam
        var = 1.0 / (vadam if name == "Vadam" else noisy_adam).prec_diag(out, cfg)
    std[name] = np.sqrt(var)
    print(f"{name:16s} mu = {np.round(out.mu, 2)}")

# %%
# The posterior standard deviations
# ---------------------------------
# The full-covariance fit is the reference here; the mean-field methods (all but NGVI full and
# SLANG) underestimate the marginal variances of correlated parameters, and SLANG's low-rank
# term adds variance along the directions it keeps.

fig, ax = plt.subplots(figsize=(7, 3))
width = 0.8 / len(std)
for k, (name, s) in enumerate(std.items()):
    ax.bar(np.arange(D) + k * width, s, width, label=name)
ax.set_xlabel("parameter")
ax.set_ylabel("posterior std")
ax.legend(fontsize=7, ncol=2)
fig.tight_layout()
