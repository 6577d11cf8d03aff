"""Info.G and Info.W of slang.step (issue 37): the raw per-example gradients and the scaled W.

The step keeps G in its own array and writes the scaled rows into W^T
(derivations/slang_experiments.md, "Info.G and W^T"); these tests pin that contract bit for bit:
Info.G is exactly the model's per-example gradients at the draws, and the last M S columns of
Info.W are exactly sqrt(beta_t N / (M S)) G^T (slang.2), (slang.8).
"""
import math

import numpy as np
import pytest

import refbayes
from refbayes.methods import slang
from refbayes.models import MLP, LogisticRegression


@pytest.mark.parametrize("S", [1, 3])
@pytest.mark.parametrize("model", [LogisticRegression(5), MLP([4, 6, 3], "tanh", "categorical")],
                         ids=["logistic", "mlp"])
@pytest.mark.parametrize("checked", [True, False])
def test_info_G_is_raw_and_W_holds_its_scaled_rows(model, S, checked):
    rng = np.random.default_rng(0)
    D, L, N, M = model.D, 2, 40, 7
    X = rng.standard_normal((M, model.sizes[0]))
    y = rng.integers(0, max(2, model.sizes[-1]), M)
    if model.sizes[-1] == 1:
        y = y.astype(float)
    state = slang.init(0.3 * rng.standard_normal(D), 0.5 * rng.standard_normal((D, L)),
                       rng.uniform(0.5, 1.5, D))._replace(t=3)
    cfg = slang.SLANGConfig(N=N, lam=np.ones(D), L=L)
    eps = rng.standard_normal((D, S))
    if checked:
        _, info = slang.step(state, slang.Batch(X, y), eps, cfg, model)
    else:
        with refbayes.unchecked():
            _, info = slang.step(state, slang.Batch(X, y), eps, cfg, model)
    assert info.G.shape == (S, M, D)
    for s in range(S):
        want = model.per_example_grads(np.ascontiguousarray(info.theta[:, s]), X, y)
        if S > 1:  # the batched pass: equal to the per-draw calls to rounding only
            want = model.per_example_grads_batched(np.ascontiguousarray(info.theta.T), X, y)[s]
        assert np.array_equal(info.G[s], want)
    scale = math.sqrt(info.beta_t * (N / (M * S)))  # as the step rounds it: c = N / (M S) first
    assert np.array_equal(info.W[:, L:], (info.G.reshape(S * M, D) * scale).T)
    assert np.array_equal(info.W[:, :L], state.U * math.sqrt(1.0 - info.beta_t))
    assert not np.shares_memory(info.G, info.W)  # W's rows are scaled: G must not be a view of them
