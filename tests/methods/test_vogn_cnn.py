"""VOGN (refbayes.methods.vogn) on a CNN: steps on tiny_cnn against the dense step of
tests/reference/vogn_dense.py fed by autograd (the model's own per-example gradients and the
plain-loop network's dense GGN), and a driver run. derivations/conv.md (conv.18), (conv.23)."""
import numpy as np
import pytest

from refbayes.methods import driver, vogn
from refbayes.models.conv import tiny_cnn
from tests.reference import conv_loops
from tests.reference import vadam_dense
from tests.reference import vogn_dense as ref
from tests.tolerances import EXACT_F64, assert_close

N, M = 12, 4


def _problem(seed=0):
    rng = np.random.default_rng(seed)
    model = tiny_cnn()
    X = rng.standard_normal((N, model.n_in))  # rows (N, C H W), the methods' 2-D form
    return model, X, rng.integers(0, model.n_out, N)


def _estimates(model, X, y, curvature):
    """theta (D, S) -> (ghat, hhat) (D,) by autograd, one draw and one example at a time."""
    X4 = X.reshape((len(X),) + model.input_shape)
    grads = vadam_dense.autograd_grads(model, X4, y)
    spec = conv_loops.LoopSpec(model)

    def est(theta):
        S = theta.shape[1]
        g, h = np.zeros(model.D), np.zeros(model.D)
        for k in range(S):
            G = grads(theta[:, k])
            g += G.sum(axis=0)
            h += ((G * G).sum(axis=0) if curvature == "ef"
                  else np.diag(conv_loops.ggn_loop(spec, theta[:, k], X4, y)))
        return g / (len(X) * S), h / (len(X) * S)
    return est


@pytest.mark.parametrize("curvature", ["ef", "ggn"])
def test_steps_on_tiny_cnn_match_dense(curvature):
    # checks (conv.18), (conv.23) through (vogn.4), (vogn.5): the batched CNN moments in a step
    model, X, y = _problem()
    rng = np.random.default_rng(1)
    cfg = vogn.VOGNConfig(N, 0.8, curvature=curvature, alpha=0.2, beta1=0.6, beta2=0.3)
    state = vogn.init(0.3 * rng.standard_normal(model.D), rng.uniform(0.2, 1.0, model.D))
    mu, s, m = state.mu, state.s, state.m
    for t in range(2):
        idx, eps = rng.permutation(N)[:M], rng.standard_normal((model.D, 2))
        state, info = vogn.step(state, vogn.Batch(X[idx], y[idx]), eps, cfg, model)
        mu, s, m, theta = ref.vogn_step(mu, s, m, _estimates(model, X[idx], y[idx], curvature),
                                        eps, N, 0.8, 0.2, 0.6, 0.3)
        assert_close(info.theta, theta, EXACT_F64, f"draws, step {t}")
        assert_close(state.s, s, EXACT_F64, f"s, step {t}")
        assert_close(state.m, m, EXACT_F64, f"m, step {t}")
        assert_close(state.mu, mu, EXACT_F64, f"mu, step {t}")


@pytest.mark.parametrize("S", [0, 2])
@pytest.mark.parametrize("curvature", ["ef", "ggn"])
def test_driver_run_is_finite_and_deterministic(curvature, S):
    model, X, y = _problem()
    cfg = vogn.VOGNConfig(N, 0.8, curvature=curvature, alpha=0.1)
    start = vogn.init(model.init_theta(np.random.default_rng(3)), np.ones(model.D))
    runs = [driver.run(start, cfg, model, X, y, rng=np.random.default_rng(4), epochs=1, M=M, S=S)
            for _ in range(2)]
    assert runs[0].t == 3  # N / M = 3 steps
    for a, b in zip(runs[0], runs[1]):
        assert np.array_equal(a, b)
    assert np.isfinite(runs[0].mu).all() and np.isfinite(runs[0].s).all()
    assert not np.array_equal(runs[0].mu, start.mu)
