"""SWAG's SGD (refbayes.methods.swag) on a CNN: momentum-SGD steps on tiny_cnn against the same
steps by hand on the autograd gradient of the model's own loss, a driver run, and the SWAG moments
of its iterates. derivations/conv.md (conv.8)."""
import autograd
import numpy as np

from refbayes.methods import driver, swag
from refbayes.models.conv import tiny_cnn
from tests.tolerances import EXACT_F64, assert_close

N, M = 12, 4


def _problem(seed=0):
    rng = np.random.default_rng(seed)
    model = tiny_cnn()
    X = rng.standard_normal((N, model.n_in))  # rows (N, C H W), the methods' 2-D form
    return model, X, rng.integers(0, model.n_out, N)


def test_sgd_steps_on_tiny_cnn_match_dense():
    # checks (conv.8) through (swag.10), (swag.11): the CNN's closed-form gradient in an SGD step
    model, X, y = _problem()
    rng = np.random.default_rng(5)
    cfg = swag.SGDConfig(N, lam=0.6, alpha=0.01, momentum=0.9)
    theta = model.init_theta(rng)
    state, v = swag.sgd_init(theta), np.zeros(model.D)
    for t in range(3):
        idx = rng.permutation(N)[:M]
        state, info = swag.sgd_step(state, swag.Batch(X[idx], y[idx]), None, cfg, model)
        X4 = X[idx].reshape((M,) + model.input_shape)
        g = (N / M) * autograd.grad(model._autograd_loss)(theta, X4, y[idx]) + 0.6 * theta
        v = 0.9 * v + g
        theta = theta - 0.01 * v
        assert_close(info.g, g, EXACT_F64, f"g, step {t}")
        assert_close(state.v, v, EXACT_F64, f"v, step {t}")
        assert_close(state.theta, theta, EXACT_F64, f"theta, step {t}")


def test_driver_run_is_finite_and_deterministic_and_feeds_swag():
    model, X, y = _problem()
    cfg = swag.SGDConfig(N, lam=1.0, alpha=1e-2)
    start = swag.sgd_init(model.init_theta(np.random.default_rng(3)))
    runs = [driver.run(start, cfg, model, X, y, rng=np.random.default_rng(4), epochs=1, M=M)
            for _ in range(2)]
    assert runs[0].t == 3
    assert np.array_equal(runs[0].theta, runs[1].theta)
    assert np.isfinite(runs[0].theta).all() and not np.array_equal(runs[0].theta, start.theta)
    scfg = swag.SWAGConfig(K=2)
    moments = swag.init(start.theta, scfg)
    for snap in (start.theta, runs[0].theta):
        moments, _ = swag.collect(moments, snap, scfg)
    assert_close(moments.theta_bar, (start.theta + runs[0].theta) / 2, EXACT_F64, "SWA mean")
