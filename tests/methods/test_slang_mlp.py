"""SLANG on multilayer perceptrons (issue 4): the step takes its per-example gradients from the
model (numba / vectorized on NumPy), and must agree with a dense re-implementation whose
gradients come from the autograd loop, with the full-Gaussian EF step at L = D, and across the
per-example-gradient implementations."""
import numpy as np
import pytest

from refbayes.linalg import lowrank
from refbayes.methods import ngvi, slang
from refbayes.models import MLP
from tests.reference import ngvi_dense as ref
from tests.tolerances import EXACT_F64, assert_close

N, M = 30, 7
SIZES = [3, 4, 2]  # a ReLU layer of 4 units, 2 outputs: D = 3*4 + 4 + 4*2 + 2 = 26


def _problem(likelihood, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, SIZES[0]))
    if likelihood == "gaussian":
        model, y = MLP(SIZES, "relu", "gaussian", noise_precision=2.0), rng.standard_normal((N, 2))
    else:
        model, y = MLP(SIZES, "tanh", "categorical"), rng.integers(0, SIZES[-1], N)
    return X, y, model


def _start(model, L, seed=1):
    rng = np.random.default_rng(seed)
    return slang.init(model.init_theta(rng), 0.1 * rng.standard_normal((model.D, L)),
                      1.0 + rng.random(model.D))


def _batches(D, steps, S, seed=2):
    rng = np.random.default_rng(seed)
    return [(rng.permutation(N)[:M], rng.standard_normal((D, S))) for _ in range(steps)]


@pytest.mark.parametrize("likelihood", ["gaussian", "categorical"])
@pytest.mark.parametrize("L,S,momentum", [(1, 1, 0.0), (3, 2, 0.9)])
def test_mlp_steps_match_dense_reimplementation(likelihood, L, S, momentum):
    """Four steps: U U^T, d and mu agree with explicit D x D algebra fed autograd per-example
    gradients (the loop oracle, peg.4) at the same draws, to 1e-10."""
    X, y, model = _problem(likelihood)
    D = model.D
    lam = np.full(D, 0.5)
    cfg = slang.SLANGConfig(N, lam, L=L, alpha=0.2, beta=0.3, decay=0.51, momentum=momentum)
    state = _start(model, L)
    mu, UUt, d, g_bar = state.mu, state.U @ state.U.T, state.d, np.zeros(D)
    for t, (idx, eps) in enumerate(_batches(D, 4, S)):
        theta = ref.symmetric_root_draw(mu, state.U, d, eps)
        F = np.concatenate([model.per_example_grads(theta[:, s], X[idx], y[idx], impl="autograd")
                            for s in range(S)])
        state, info = slang.step(state, slang.Batch(X[idx], y[idx]), eps, cfg, model)
        mu, UUt, d, g_bar, _ = ref.slang_step_from_grads(
            mu, UUt, d, g_bar, t, F, M, S, N, lam, L, 0.2, 0.3, 0.51, momentum)
        assert_close(info.theta, theta, EXACT_F64, f"draws, step {t}")
        assert_close(state.U @ state.U.T, UUt, EXACT_F64, f"U U^T, step {t}")
        assert_close(state.d, d, EXACT_F64, f"d, step {t}")
        assert_close(state.mu, mu, EXACT_F64, f"mu, step {t}")


def test_mlp_full_rank_slang_is_the_full_gaussian_ef_step():
    """L = D on an MLP (L + M S >= D with S = 4): SLANG is the full-Gaussian EF step (ngvi.4)-
    (ngvi.5) fed the same draw, as for logistic regression in test_slang.py."""
    X, y, model = _problem("gaussian")
    D = model.D
    lam = np.full(D, 0.5)
    scfg = slang.SLANGConfig(N, lam, L=D, alpha=0.2, beta=0.3, decay=0.0)
    fcfg = ngvi.NGVIConfig(N, lam, alpha=0.2, beta=0.3, decay=0.0, curvature="ef")
    state = _start(model, D)
    P = lowrank.dense_precision(state.U, state.d)
    full = ngvi.FullState(state.mu, P, state.g_bar, 0)
    for idx, eps in _batches(D, 3, 4):
        batch = slang.Batch(X[idx], y[idx])
        theta = slang.sample(state, eps)
        eps_full = np.linalg.cholesky(full.Sigma_inv).T @ (theta - state.mu[:, None])
        state, _ = slang.step(state, batch, eps, scfg, model)
        full, _ = ngvi.step_full(full, batch, eps_full, fcfg, model)
        assert_close(lowrank.dense_precision(state.U, state.d), full.Sigma_inv, EXACT_F64,
                     "precision")
        assert_close(state.mu, full.mu, EXACT_F64, "mean")


def test_mlp_step_uses_the_fast_per_example_path():
    """On NumPy an MLP's per-example gradients come from numba (the default), and agree with the
    vectorized einsum path the GPU uses: the step is the same either way."""
    X, y, model = _problem("gaussian")
    G_numba = model.per_example_grads(model.init_theta(np.random.default_rng(3)), X, y)
    G_vec = model.per_example_grads(model.init_theta(np.random.default_rng(3)), X, y,
                                    impl="vectorized")
    assert type(model)._numpy_impl == "numba"
    assert_close(G_numba, G_vec, EXACT_F64, "numba vs vectorized")
