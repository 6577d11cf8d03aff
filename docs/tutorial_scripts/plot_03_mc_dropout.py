"""
MC dropout
==========

``refbayes.methods.mc_dropout`` trains a network with dropout (Gal and Ghahramani 2016): each
``step(state, batch, masks, cfg, model)`` is one Adam step on the dropout objective with the
caller's Bernoulli masks (one (M, n_k) array per layer input), and ``predict_samples`` runs the
S stochastic forward passes of the MC predictive with masks you draw. ``driver.run`` draws the
masks in a documented order (``driver.draw_masks``).
"""
import matplotlib.pyplot as plt
import numpy as np

from refbayes.methods import driver, mc_dropout
from refbayes.models import MLP

rng = np.random.default_rng(0)
N = 40
X = rng.uniform(-3, 3, (N, 1))
y = np.sin(X[:, 0]) + 0.1 * rng.standard_normal(N)
model = MLP([1, 50, 1], activation="relu", likelihood="gaussian", noise_precision=100.0)

cfg = mc_dropout.MCDropoutConfig(N, p=0.1, lengthscale=0.1, noise_precision=100.0, alpha=0.01)
state = mc_dropout.init(model.init_theta(np.random.default_rng(1)))
state = driver.run(state, cfg, model, X, y, rng=np.random.default_rng(2), epochs=300, M=20)
print("steps taken:", state.t)

# %%
# The MC predictive
# -----------------
# S forward passes, each with its own masks (n rows each).

X_star = np.linspace(-5, 5, 200)[:, None]
S = 50
masks = [driver.draw_masks(rng, model, len(X_star), cfg.p) for _ in range(S)]
F = mc_dropout.predict_samples(state, X_star, masks, cfg, model)  # (S, n, 1)
mean, std = F.mean(axis=0)[:, 0], F.std(axis=0)[:, 0]
print("predictive std at x = 0 and x = 5:", std[100].round(3), std[-1].round(3))

fig, ax = plt.subplots(figsize=(6, 3))
ax.plot(X[:, 0], y, "k.", label="data")
ax.plot(X_star[:, 0], mean, label="MC mean")
ax.fill_between(X_star[:, 0], mean - 2 * std, mean + 2 * std, alpha=0.3, label="+- 2 std")
ax.legend()
fig.tight_layout()
