"""S parameter vectors on one batch share the first Conv2d's unfolded input (conv._first_unfold):
the S-draw methods give, bit for bit, what S separate one-vector calls give, on a CNN whose first
layer is a Conv2d (LeNet-5 at a small batch, the strided tiny CNN) and on one that starts with a
pooling layer (no sharing)."""
import numpy as np
import pytest

from refbayes.models import conv
from refbayes.models.conv import CNN, Activation, AvgPool2d, Conv2d, Dense, Flatten, lenet5


def _pool_first():
    return CNN((1, 6, 6), [AvgPool2d(2), Conv2d(1, 2, 2), Activation("tanh"), Flatten(),
                           Dense(8, 3)], "categorical")


def _strided():
    return CNN((2, 7, 7), [Conv2d(2, 3, 3, stride=2, padding=1), Activation("relu"), Flatten(),
                           Dense(48, 3)], "categorical")


MODELS = {"lenet5": lenet5, "strided": _strided, "pool-first": _pool_first}


def _batch(model, dtype, S=3, M=5):
    rng = np.random.default_rng(0)
    thetas = np.stack([model.init_theta(rng) for _ in range(S)]).astype(dtype)
    X = rng.standard_normal((M, model.n_in)).astype(dtype)
    return thetas, X, rng.integers(0, model.n_out, M)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_s_draw_passes_equal_separate_calls_bit_for_bit(name, dtype):
    model = MODELS[name]()
    thetas, X, y = _batch(model, dtype)
    shared = conv._first_unfold(np, model.layers, X.reshape((-1,) + model.input_shape), 3)
    assert (shared is not None) == (name != "pool-first")
    for curvature in (None, "ef", "ggn"):
        g, h = model.sample_moments(thetas, X, y, curvature)
        for s, th in enumerate(thetas):
            g1, h1 = model.sample_moments(th[None], X, y, curvature)  # S = 1: no sharing
            np.testing.assert_array_equal(g[s], g1[0])
            if curvature is not None:
                np.testing.assert_array_equal(h[s], h1[0])
    loss, g = model.sample_losses_and_grads(thetas, X, y)
    F = model.forward_batched(thetas, X)
    for s, th in enumerate(thetas):
        np.testing.assert_array_equal(loss[s], model.loss(th, X, y))
        np.testing.assert_array_equal(g[s], model.grad(th, X, y))
        np.testing.assert_array_equal(F[s], model.forward(th, X))
    g, factors = model.kfac_moments(thetas, X, y, "ef")
    gs = [model.kfac_moments(th[None], X, y, "ef") for th in thetas]
    for s in range(3):
        np.testing.assert_array_equal(g[s], gs[s][0][0])


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_ef_moments_of_one_backward_pass_are_grad_and_diag_ef_bit_for_bit(name, dtype):
    # sample_moments' "ef" takes the sums and the sums of squares from ONE backward pass
    # ("sum+sum_sq"); each equals its own pass (grad: "sum", diag_ef: "sum_sq") to the bit
    model = MODELS[name]()
    thetas, X, y = _batch(model, dtype, S=1)
    g, h = model.sample_moments(thetas, X, y, "ef")
    np.testing.assert_array_equal(g[0], model.grad(thetas[0], X, y))
    np.testing.assert_array_equal(h[0], model.diag_ef(thetas[0], X, y))
