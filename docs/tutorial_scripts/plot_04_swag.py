"""
SWA and SWAG
============

``refbayes.methods.swag`` collects snapshots of an SGD run: ``collect(state, theta, cfg)`` updates
the running first and second moments and the ring of the last K deviations; ``sample(state, z1,
z2, cfg)`` maps your standard-normal draws to the SWAG Gaussian (``z2=None``: SWAG-Diagonal), and
``log_density`` evaluates it exactly. The base optimizer is momentum SGD on the summed MAP
objective (``sgd_step``), which ``driver.run`` drives with the pair (``SGDState``, ``SGDConfig``).
"""
import matplotlib.pyplot as plt
import numpy as np

from refbayes.methods import driver, swag
from refbayes.models import MLP

rng = np.random.default_rng(0)
N = 40
X = rng.uniform(-3, 3, (N, 1))
y = np.sin(X[:, 0]) + 0.1 * rng.standard_normal(N)
model = MLP([1, 20, 1], activation="tanh", likelihood="gaussian", noise_precision=25.0)

sgd_cfg = swag.SGDConfig(N, lam=1.0, alpha=1e-4, momentum=0.9)
sgd = driver.run(swag.sgd_init(model.init_theta(np.random.default_rng(1))), sgd_cfg, model, X, y,
                 rng=np.random.default_rng(2), epochs=300, M=10)

# %%
# Collect one snapshot per epoch, then sample
# -------------------------------------------

cfg = swag.SWAGConfig(K=10, scale=0.5)
state = swag.init(sgd.theta, cfg)


def collect(epoch, sgd_state):
    global state
    state, _ = swag.collect(state, sgd_state.theta, cfg)


driver.run(sgd, sgd_cfg, model, X, y, rng=np.random.default_rng(3), epochs=30, M=10,
           callback=collect)
print("snapshots:", state.n, " rank of the deviation matrix:", swag.rank(state))

S = 30
draws = swag.sample(state, rng.standard_normal((model.D, S)),
                    rng.standard_normal((swag.rank(state), S)), cfg)  # (D, S)
print("log density of the first three draws:", swag.log_density(state, draws[:, :3], cfg))

X_star = np.linspace(-5, 5, 200)[:, None]
F = np.stack([model.forward(draws[:, s], X_star)[:, 0] for s in range(S)])
fig, ax = plt.subplots(figsize=(6, 3))
ax.plot(X_star[:, 0], F.T, color="C0", alpha=0.2)
ax.plot(X_star[:, 0], model.forward(state.theta_bar, X_star)[:, 0], "C1", label="SWA mean")
ax.plot(X[:, 0], y, "k.", label="data")
ax.legend()
fig.tight_layout()
