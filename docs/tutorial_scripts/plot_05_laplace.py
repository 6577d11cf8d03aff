"""
Laplace and Riemannian Laplace
==============================

``refbayes.methods.laplace`` builds a Gaussian at a MAP estimate you give it:
``fit(model, theta_map, X, y, cfg)`` forms the curvature (full or diagonal Hessian / GGN /
empirical Fisher, or K-FAC, over all parameters or the last layer) plus the prior precision;
``sample(state, eps)``, ``log_marginal_likelihood`` and ``glm_predictive`` use it.
``refbayes.methods.riemannian_laplace`` maps Laplace draws through the exponential map of the
loss surface (Bergamin et al. 2023): ``loss_fns`` gives the gradient and Hessian-vector
product, ``velocities`` turns Laplace draws into initial velocities, and ``sample`` solves one
geodesic ODE per draw.
"""
import matplotlib.pyplot as plt
import numpy as np
from scipy.optimize import minimize

from refbayes.methods import laplace
from refbayes.methods import riemannian_laplace as rl
from refbayes.models import MLP

rng = np.random.default_rng(0)
N = 30
X = rng.uniform(-2, 2, (N, 1))
y = np.sin(2 * X[:, 0]) + 0.3 * rng.standard_normal(N)
model = MLP([1, 5, 1], activation="tanh", likelihood="gaussian", noise_precision=10.0)
delta = 1.0  # prior precision

# %%
# The MAP: minimise the summed loss plus the prior term
# -----------------------------------------------------
# Laplace and the Riemannian Laplace approximation assume a stationary point.


def objective(theta):
    value = model.loss(theta, X, y) + 0.5 * delta * theta @ theta
    return value, model.grad(theta, X, y) + delta * theta


res = minimize(objective, model.init_theta(np.random.default_rng(1)), jac=True,
               method="L-BFGS-B", options={"gtol": 1e-9, "ftol": 1e-15, "maxiter": 5000})
theta_map = res.x
print("gradient norm at the MAP:", np.linalg.norm(objective(theta_map)[1]))

# %%
# The Laplace approximation, its evidence and its GLM predictive
# --------------------------------------------------------------

cfg = laplace.LaplaceConfig(prior_precision=delta, structure="full", curvature="ggn")
state = laplace.fit(model, theta_map, X, y, cfg)
print("log evidence:", laplace.log_marginal_likelihood(model, state, X, y, cfg))
X_star = np.linspace(-4, 4, 100)[:, None]
pred = laplace.glm_predictive(model, state, X_star)
f_mean, f_std = pred.f_mean[:, 0], np.sqrt(pred.f_var[:, 0, 0])

# %%
# Riemannian Laplace samples
# --------------------------
# The same Gaussian draws, moved along geodesics of the loss surface.

S = 5
theta_la = laplace.sample(state, rng.standard_normal((model.D, S)))  # (D, S)
grad_fn, hvp_fn = rl.loss_fns(model, X, y, delta)
V = rl.velocities(theta_map, theta_la)
theta_rla, info = rl.sample(theta_map, V, grad_fn, hvp_fn, rl.RiemannianLaplaceConfig())
for name, T in (("Laplace", theta_la), ("Riemannian Laplace", theta_rla)):
    nll = np.mean([model.loss(T[:, s], X, y) for s in range(S)])
    print(f"{name:18s} mean training loss of the draws: {nll:.1f}")

fig, axes = plt.subplots(1, 2, figsize=(8, 3), sharey=True)
for ax, (name, T) in zip(axes, (("Laplace", theta_la), ("Riemannian Laplace", theta_rla))):
    for s in range(S):
        ax.plot(X_star[:, 0], model.forward(T[:, s], X_star)[:, 0], "C0", alpha=0.3)
    ax.plot(X[:, 0], y, "k.")
    ax.set_title(name)
    ax.set_ylim(-3, 3)
axes[0].fill_between(X_star[:, 0], f_mean - 2 * f_std, f_mean + 2 * f_std, color="C1",
                     alpha=0.3, label="GLM predictive +- 2 std")
axes[0].legend(fontsize=7)
fig.tight_layout()
