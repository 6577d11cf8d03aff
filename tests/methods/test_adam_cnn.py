"""MAP / Adam (refbayes.methods.adam) on a CNN: steps on tiny_cnn against Adam written by hand
(tests/reference/bbb_dense.adam_hand) on the autograd gradient of the model's own loss, and a
driver run. derivations/conv.md (conv.8)."""
import autograd
import autograd.numpy as anp
import numpy as np
import pytest

from refbayes.methods import adam, driver
from refbayes.models.conv import tiny_cnn
from tests.reference import bbb_dense as ref
from tests.tolerances import EXACT_F64, assert_close

N, M = 12, 4


def _problem(seed=0):
    rng = np.random.default_rng(seed)
    model = tiny_cnn()
    X = rng.standard_normal((N, model.n_in))  # rows (N, C H W), the methods' 2-D form
    return model, X, rng.integers(0, model.n_out, N)


def _map_step(model, theta, m, v, t, X, y, lam, alpha, beta1, beta2, eps):
    """(N / M) sum_i l_i + lam theta^2 / 2 differentiated by autograd, then Adam by hand."""
    X4 = X.reshape((len(X),) + model.input_shape)

    def objective(th):
        return (N / len(X)) * model._autograd_loss(th, X4, y) + 0.5 * anp.sum(lam * th ** 2)
    delta, m, v = ref.adam_hand(autograd.grad(objective)(theta), m, v, t, alpha, beta1, beta2, eps)
    return theta + delta, m, v


@pytest.mark.parametrize("lam", [0.0, 0.7])
def test_map_steps_on_tiny_cnn_match_dense(lam):
    # checks (conv.8) through (adam.5), (adam.6): the CNN's closed-form gradient in a MAP step
    model, X, y = _problem()
    rng = np.random.default_rng(5)
    theta0 = model.init_theta(rng)
    state = adam.init(theta0)
    theta, m, v = theta0, np.zeros(model.D), np.zeros(model.D)
    cfg = adam.AdamConfig(alpha=0.02, beta1=0.8, beta2=0.99, eps_adam=1e-7)
    for t in range(3):
        idx = rng.permutation(N)[:M]
        state, _ = adam.step(state, adam.Batch(X[idx], y[idx]), cfg, model, N, lam)
        theta, m, v = _map_step(model, theta, m, v, t, X[idx], y[idx], np.full(model.D, lam),
                                0.02, 0.8, 0.99, 1e-7)
        assert_close(state.theta, theta, EXACT_F64, f"theta, step {t}")
        assert_close(state.adam.m, m, EXACT_F64, f"m, step {t}")
        assert_close(state.adam.v, v, EXACT_F64, f"v, step {t}")


def test_driver_run_is_finite_and_deterministic():
    model, X, y = _problem()
    cfg = adam.MAPConfig(N, 0.5, adam.AdamConfig(alpha=0.02))
    start = adam.init(model.init_theta(np.random.default_rng(3)))
    runs = [driver.run(start, cfg, model, X, y, rng=np.random.default_rng(4), epochs=1, M=M)
            for _ in range(2)]
    assert runs[0].t == 3
    assert np.array_equal(runs[0].theta, runs[1].theta)
    assert np.array_equal(runs[0].adam.v, runs[1].adam.v)
    assert np.isfinite(runs[0].theta).all() and not np.array_equal(runs[0].theta, start.theta)
