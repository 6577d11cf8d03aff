"""SLANG and NGVI (full and mean-field) on a CNN (issue 34): chained steps against the dense
algebra of tests/reference/ngvi_dense.py fed with the per-example gradients (and Hessians) of the
plainly written loop network of tests/reference/conv_loops.py, at EXACT_F64. NGVI-full stays a
small-D method (a D x D precision): the tiny CNN has D = 47."""
from __future__ import annotations

import autograd
import numpy as np
import pytest

from refbayes.methods import ngvi, slang
from refbayes.models import tiny_cnn
from tests.reference import ngvi_dense as ref
from tests.reference.conv_loops import LoopSpec, naive_output, per_example_grads_loop
from tests.reference.per_example import naive_nll
from tests.tolerances import EXACT_F64, assert_close

N, M = 40, 5


def _problem(likelihood="categorical"):
    model = tiny_cnn(likelihood=likelihood, n_out=3 if likelihood == "categorical" else 1)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((N,) + model.input_shape)
    y = rng.integers(0, 3, N) if likelihood == "categorical" else rng.standard_normal(N)
    return model, X, y, rng


def _grads_at(spec, thetas, X, y):
    """F (S M, D): the loop network's per-example gradients at each column of thetas."""
    return np.concatenate([per_example_grads_loop(spec, thetas[:, s], X, y)
                           for s in range(thetas.shape[1])])


def _hessian_sum(spec, thetas, X, y):
    """sum_s of the loop network's Hessian of sum_i l_i at each column of thetas (autograd)."""
    Y = np.asarray(y)

    def loss(th):
        return sum(naive_nll(spec, naive_output(spec, th, X[i]), Y[i]) for i in range(len(X)))
    return sum(autograd.hessian(loss)(thetas[:, s]) for s in range(thetas.shape[1]))


@pytest.mark.parametrize("S", [1, 2])
def test_slang_steps_on_a_cnn_match_the_dense_step(S):
    # checks (slang.2), (slang.3), (slang.4), (slang.5), (slang.6), (slang.8)
    model, X, y, rng = _problem()
    spec, D, L = LoopSpec(model), model.D, 2
    lam = np.full(D, 0.5)
    cfg = slang.SLANGConfig(N, lam, L=L, alpha=0.3, beta=0.2, momentum=0.9)
    U0 = 0.1 * rng.standard_normal((D, L))
    state = slang.init(model.init_theta(rng), U0, np.full(D, 2.0))
    mu, UUt, d, g_bar = state.mu, U0 @ U0.T, state.d, np.zeros(D)
    for t in range(3):
        idx, eps = rng.choice(N, M, replace=False), rng.standard_normal((D, S))
        theta = ref.symmetric_root_draw(mu, state.U, d, eps)
        state, info = slang.step(state, slang.Batch(X[idx].reshape(M, -1), y[idx]), eps, cfg,
                                 model)
        F = _grads_at(spec, theta, X[idx], y[idx])
        mu, UUt, d, g_bar, Delta_d = ref.slang_step_from_grads(
            mu, UUt, d, g_bar, t, F, M, S, N, lam, L, 0.3, 0.2, 0.51, 0.9)  # default decay
        assert_close(info.theta, theta, EXACT_F64, f"draws, step {t}")
        assert_close(state.U @ state.U.T, UUt, EXACT_F64, f"U U^T, step {t}")
        assert_close(state.d, d, EXACT_F64, f"d, step {t}")
        assert_close(state.mu, mu, EXACT_F64, f"mu, step {t}")


def _dense_ngvi(full, curvature, spec, mu, P_or_s, g_bar, t, X, y, theta, lam):
    """One NGVI step from the loop network's estimates at the draws theta (D, S)."""
    S = theta.shape[1]
    a_t, b_t = ref.rates(t, 0.2, 0.3, 0.51)  # the default decay
    F = _grads_at(spec, theta, X, y)
    c = N / (M * S)
    g_hat = c * F.sum(0)
    if curvature == "ef":
        C = c * F.T @ F
    else:
        C = c * _hessian_sum(spec, theta, X, y)
    g_bar, dirn = ref.direction(g_hat, lam, mu, 0.0, g_bar, t)
    if full:
        P = (1 - b_t) * P_or_s + b_t * (C + np.diag(lam))
        return mu - a_t * np.linalg.solve(P, dirn), P, g_bar
    s = (1 - b_t) * P_or_s + b_t * (np.diag(C) + lam)
    return mu - a_t * dirn / s, s, g_bar


@pytest.mark.parametrize("curvature", ["ef", "hess"])
@pytest.mark.parametrize("full", [True, False], ids=["full", "meanfield"])
def test_ngvi_steps_on_a_cnn_match_the_dense_step(full, curvature):
    # checks (ngvi.4), (ngvi.5), (ngvi.8), (ngvi.9), (ngvi.10), (ngvi.15), (ngvi.16)
    model, X, y, rng = _problem("gaussian" if curvature == "hess" else "categorical")
    spec, D = LoopSpec(model), model.D
    lam = np.full(D, 2.0)
    cfg = ngvi.NGVIConfig(N, lam, alpha=0.2, beta=0.3, curvature=curvature)
    mu0 = model.init_theta(rng)
    p0 = 2000.0  # large enough that the network's indefinite Hessian leaves P positive definite
    if full:
        state = ngvi.init_full(mu0, p0 * np.eye(D))
        P_or_s = p0 * np.eye(D)
    else:
        state = ngvi.init_meanfield(mu0, np.full(D, p0))
        P_or_s = np.full(D, p0)
    mu, g_bar = mu0, np.zeros(D)
    for t in range(2):
        idx, eps = rng.choice(N, M, replace=False), rng.standard_normal((D, 2))
        batch = ngvi.Batch(X[idx].reshape(M, -1), y[idx])
        if full:
            theta = mu[:, None] + np.linalg.solve(np.linalg.cholesky(P_or_s).T, eps)
            state, info = ngvi.step_full(state, batch, eps, cfg, model)
        else:
            theta = mu[:, None] + eps / np.sqrt(P_or_s)[:, None]
            state, info = ngvi.step_meanfield(state, batch, eps, cfg, model)
        mu, P_or_s, g_bar = _dense_ngvi(full, curvature, spec, mu, P_or_s, g_bar, t, X[idx],
                                        y[idx], theta, lam)
        assert_close(info.theta, theta, EXACT_F64, f"draws, step {t}")
        assert_close(state.mu, mu, EXACT_F64, f"mu, step {t}")
        if full:
            assert_close(state.Sigma_inv, P_or_s, EXACT_F64, f"precision, step {t}")
        else:
            assert_close(state.prec_diag, P_or_s, EXACT_F64, f"precision, step {t}")
