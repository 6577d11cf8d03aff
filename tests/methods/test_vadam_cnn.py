"""Vadam (refbayes.methods.vadam) on a CNN: steps on tiny_cnn against the dense step of
tests/reference/vadam_dense.py fed by the model's own autograd per-example gradients, and a driver
run. derivations/conv.md (conv.10), (conv.23)."""
import numpy as np
import pytest

from refbayes.methods import driver, vadam
from refbayes.models.conv import tiny_cnn
from tests.reference import vadam_dense as ref
from tests.tolerances import EXACT_F64, assert_close

N, M = 12, 4


def _problem(seed=0):
    rng = np.random.default_rng(seed)
    model = tiny_cnn()
    X = rng.standard_normal((N, model.n_in))  # rows (N, C H W), the methods' 2-D form
    return model, X, rng.integers(0, model.n_out, N)


@pytest.mark.parametrize("squares", ["minibatch", "per_example"])
def test_steps_on_tiny_cnn_match_autograd_dense(squares):
    # checks (conv.10), (conv.23) through (vadam.4), (vadam.5): sample_moments on a CNN in a step
    model, X, y = _problem()
    rng = np.random.default_rng(5)
    cfg = vadam.VadamConfig(N, 0.8, alpha=0.02, beta1=0.9, beta2=0.99, squares=squares)
    state = vadam.init(model.init_theta(rng), 0.05)
    mu, m, s = state.mu, state.m, state.s
    for t in range(2):
        idx, eps = rng.permutation(N)[:M], rng.standard_normal((model.D, 2))
        state, _ = vadam.step(state, vadam.Batch(X[idx], y[idx]), eps, cfg, model)
        X4 = X[idx].reshape((M,) + model.input_shape)
        mu, m, s, _ = ref.vadam_step(mu, m, s, t, ref.autograd_grads(model, X4, y[idx]), eps,
                                     N, 0.8, 0.02, 0.9, 0.99, True, squares, True)
        assert_close(state.s, s, EXACT_F64, f"s, step {t}")
        assert_close(state.m, m, EXACT_F64, f"m, step {t}")
        assert_close(state.mu, mu, EXACT_F64, f"mean, step {t}")


@pytest.mark.parametrize("squares", ["minibatch", "per_example"])
def test_driver_run_is_finite_and_deterministic(squares):
    model, X, y = _problem()
    cfg = vadam.VadamConfig(N, 0.8, alpha=0.02, squares=squares)
    start = vadam.init(model.init_theta(np.random.default_rng(3)), 0.05)
    runs = [driver.run(start, cfg, model, X, y, rng=np.random.default_rng(4), epochs=1, M=M, S=2)
            for _ in range(2)]
    assert runs[0].t == 3
    for a, b in zip(runs[0], runs[1]):
        assert np.array_equal(a, b)
    assert np.isfinite(runs[0].mu).all() and np.isfinite(runs[0].s).all()
    assert not np.array_equal(runs[0].mu, start.mu)
