"""Bayes-by-Backprop (refbayes.methods.bbb) on a CNN: steps on tiny_cnn against Adam by hand on the
autograd gradient of the Monte Carlo objective built from the model's own loss, and a driver run.
derivations/conv.md (conv.23)."""
import autograd
import autograd.numpy as anp
import numpy as np

from refbayes.methods import bbb, driver
from refbayes.models.conv import tiny_cnn
from tests.reference import bbb_dense as ref
from tests.tolerances import EXACT_F64, assert_close

N, M = 12, 4


def _problem(seed=0):
    rng = np.random.default_rng(seed)
    model = tiny_cnn()
    X = rng.standard_normal((N, model.n_in))  # rows (N, C H W), the methods' 2-D form
    return model, X, rng.integers(0, model.n_out, N)


def _objective(mu, rho, model, eps, X4, y, lam, kl_weight):
    """(N / (M S)) sum_s sum_i l_i(mu + softplus(rho) eps_s) + kl_weight KL, autograd-able."""
    sigma = anp.log1p(anp.exp(rho))
    data = sum(model._autograd_loss(mu + sigma * eps[:, s], X4, y) for s in range(eps.shape[1]))
    return (N / (len(X4) * eps.shape[1])) * data + kl_weight * ref._kl_autograd(mu, sigma, lam)


def test_steps_on_tiny_cnn_match_dense():
    # checks (conv.23) through (bbb.2)-(bbb.4), (bbb.10): sample_losses_and_grads on a CNN
    model, X, y = _problem()
    lam = np.linspace(0.2, 3.0, model.D)
    cfg = bbb.BBBConfig(N, lam, alpha=0.05, beta1=0.8, beta2=0.99, eps_adam=1e-6, kl_weight=0.9)
    rng = np.random.default_rng(1)
    state = bbb.init(0.5 * rng.standard_normal(model.D), rho0=rng.uniform(-3.0, 0.5, model.D))
    mu, rho, m, v = state.mu, state.rho, np.zeros(2 * model.D), np.zeros(2 * model.D)
    for t in range(3):
        idx, eps = rng.permutation(N)[:M], rng.standard_normal((model.D, 2))
        state, info = bbb.step(state, bbb.Batch(X[idx], y[idx]), eps, cfg, model)
        X4 = X[idx].reshape((M,) + model.input_shape)
        g_mu, g_rho = autograd.grad(_objective, (0, 1))(mu, rho, model, eps, X4, y[idx], lam, 0.9)
        assert_close(info.grad_mu, g_mu, EXACT_F64, f"dF/dmu, step {t}")
        assert_close(info.grad_rho, g_rho, EXACT_F64, f"dF/drho, step {t}")
        delta, m, v = ref.adam_hand(np.concatenate([g_mu, g_rho]), m, v, t, 0.05, 0.8, 0.99, 1e-6)
        mu, rho = mu + delta[:model.D], rho + delta[model.D:]
        assert_close(state.mu, mu, EXACT_F64, f"mu, step {t}")
        assert_close(state.rho, rho, EXACT_F64, f"rho, step {t}")


def test_driver_run_is_finite_and_deterministic():
    model, X, y = _problem()
    cfg = bbb.BBBConfig(N, 1.0, alpha=0.02)
    start = bbb.init(model.init_theta(np.random.default_rng(3)), sigma0=0.1)
    runs = [driver.run(start, cfg, model, X, y, rng=np.random.default_rng(4), epochs=1, M=M, S=2)
            for _ in range(2)]
    assert runs[0].t == 3
    assert np.array_equal(runs[0].mu, runs[1].mu) and np.array_equal(runs[0].rho, runs[1].rho)
    assert np.isfinite(runs[0].mu).all() and np.isfinite(runs[0].rho).all()
    assert not np.array_equal(runs[0].mu, start.mu)
