"""refbayes.models.conv curvature (second slice): Jacobian, GGN, diagonal GGN, Hessian, the
R-operator products and the batched S-sample passes, against dense autograd answers.

Equations: derivations/conv.md (conv.16)-(conv.23). Oracles: autograd of the plain-loop network of
tests/reference/conv_loops.py (its Jacobian, its output Hessians, its loss Hessian), built densely;
the batched passes against S single-theta calls. Everything float64, EXACT_F64.
"""
import autograd
import numpy as np
import pytest

from refbayes.backend import to_numpy
from refbayes.models.conv import (CNN, Activation, AvgPool2d, Conv2d, Dense, Flatten, MaxPool2d,
                                  tiny_cnn)
from tests.reference import conv_loops as ref
from tests.reference.per_example import naive_nll
from tests.tolerances import EXACT_F64, assert_close


def _avgpool_net(likelihood="categorical", n_out=3):
    """A strided, padded conv, an overlapping strided average pool, tanh and a no-bias conv."""
    return CNN((2, 7, 6), [
        Conv2d(2, 3, 3, stride=2, padding=1), Activation("tanh"),
        AvgPool2d(2, stride=1),
        Conv2d(3, 2, (2, 1), padding=(0, 1), bias=False), Activation("relu"),
        MaxPool2d(2, stride=1), Flatten(), Dense(2 * 1 * 3, n_out)], likelihood)


MODELS = {
    "tiny-categorical": tiny_cnn(),
    "tiny-gaussian": tiny_cnn("gaussian", n_out=2, noise_precision=2.5),
    "tiny-bernoulli": tiny_cnn("bernoulli", n_out=1),
    "avgpool-categorical": _avgpool_net(),
    "avgpool-gaussian": _avgpool_net("gaussian", 2),
}


def _batch(model, M=3, seed=0, rows=False):
    rng = np.random.default_rng(seed)
    theta = model.init_theta(rng, scheme="pytorch")
    X = rng.normal(size=(M,) + model.input_shape)
    if rows:
        X = X.reshape(M, -1)
    K, lik = model.n_out, model.likelihood.name
    if lik == "gaussian":
        y = rng.normal(size=(M, K))
    else:
        y = rng.integers(0, 2 if lik == "bernoulli" else K, size=M)
    return theta, X, y, rng.normal(size=model.D)


def _dense(model, theta, X, y):
    """(J (M, K, D), H (M, K, K), GGN, Hessian) by autograd of the plain-loop network."""
    spec = ref.LoopSpec(model)
    X = X.reshape((len(X),) + model.input_shape)
    J = np.stack([autograd.jacobian(lambda t, x=x: ref.naive_output(spec, t, x))(theta) for x in X])
    f = np.stack([ref.naive_output(spec, theta, x) for x in X])
    H = np.stack([autograd.hessian(lambda g, t=t: naive_nll(spec, g, t))(fi) for fi, t in zip(f, y)])
    ggn = sum(Ji.T @ Hi @ Ji for Ji, Hi in zip(J, H))

    def total(t):
        return sum(naive_nll(spec, ref.naive_output(spec, t, x), yi) for x, yi in zip(X, y))
    return J, H, ggn, autograd.hessian(total)(theta)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_jacobian_and_ggn_match_dense_autograd(name):
    # checks (conv.16), (conv.17): K seeded backward passes give J; sum_i J_i^T H_i J_i
    model = MODELS[name]
    theta, X, y, _ = _batch(model)
    J, _, ggn, _ = _dense(model, theta, X, y)
    assert model.jacobian(theta, X).shape == J.shape
    assert_close(model.jacobian(theta, X), J, EXACT_F64, f"{name} jacobian")
    assert_close(model.ggn(theta, X, y), ggn, EXACT_F64, f"{name} ggn")


@pytest.mark.parametrize("name", sorted(MODELS))
def test_diag_ggn_is_the_dense_diagonal(name):
    # checks (conv.18): R backward passes of the columns of C_i, squared per layer and summed
    model = MODELS[name]
    theta, X, y, _ = _batch(model, seed=1)
    _, _, ggn, _ = _dense(model, theta, X, y)
    assert_close(model.diag_ggn(theta, X, y), np.diag(ggn), EXACT_F64, f"{name} diag_ggn")


@pytest.mark.parametrize("name", sorted(MODELS))
def test_hessian_and_hvp_match_loop_network_hessian(name):
    # checks (conv.19): autograd of the vectorized pass against autograd of the plain loops
    model = MODELS[name]
    theta, X, y, v = _batch(model, seed=2)
    _, _, _, H = _dense(model, theta, X, y)
    assert_close(model.hessian(theta, X, y), H, EXACT_F64, f"{name} hessian")
    assert_close(model.hvp(theta, v, X, y), H @ v, EXACT_F64, f"{name} hvp")
    g, Hv = model.grad_hvp(theta, v, X, y)
    assert np.array_equal(g, model.grad(theta, X, y)) and np.array_equal(Hv, model.hvp(theta, v, X, y))


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("rows", [False, True])
def test_jvp_and_ggn_vp_match_dense(name, rows):
    # checks (conv.20), (conv.21), (conv.22): the R-operator forward pass through conv, pooling
    # (max winners fixed, strided overlapping average) and flatten; then the summed backward pass
    model = MODELS[name]
    theta, X, y, v = _batch(model, seed=3, rows=rows)
    J, _, ggn, _ = _dense(model, theta, X, y)
    assert_close(model.jvp(theta, v, X), J @ v, EXACT_F64, f"{name} jvp")
    assert_close(model.ggn_vp(theta, v, X, y), ggn @ v, EXACT_F64, f"{name} ggn_vp")


def test_jvp_of_a_first_layer_without_parameters_upstream():
    # checks (conv.20), (conv.21): R{x} = 0 through a leading pool and activation
    model = CNN((1, 6, 6), [AvgPool2d(2), Activation("tanh"), Conv2d(1, 2, 2), MaxPool2d(2),
                            Flatten(), Dense(2, 3)])
    theta, X, y, v = _batch(model, seed=4)
    J, _, ggn, _ = _dense(model, theta, X, y)
    assert_close(model.jvp(theta, v, X), J @ v, EXACT_F64, "jvp")
    assert_close(model.ggn_vp(theta, v, X, y), ggn @ v, EXACT_F64, "ggn_vp")


@pytest.mark.parametrize("name", ["tiny-categorical", "avgpool-gaussian", "tiny-bernoulli"])
def test_batched_passes_equal_single_theta_calls(name):
    # checks (conv.23): the S-sample passes are S single-theta calls, FlatModel's shapes
    model = MODELS[name]
    theta, X, y, _ = _batch(model, M=4, seed=5, rows=True)
    rng = np.random.default_rng(6)
    thetas = theta + 0.3 * rng.normal(size=(3, model.D))
    F = model.forward_batched(thetas, X)
    loss, g = model.sample_losses_and_grads(thetas, X, y)
    G = model.per_example_grads_batched(thetas, X, y)
    assert F.shape == (3, 4, model.n_out) and loss.shape == (3,) and g.shape == (3, model.D)
    assert G.shape == (3, 4, model.D)
    for curvature, single in ((None, None), ("ef", model.diag_ef), ("ggn", model.diag_ggn)):
        gs, hs = model.sample_moments(thetas, X, y, curvature)
        assert (hs is None) == (curvature is None)
        for s, th in enumerate(thetas):
            assert_close(gs[s], model.grad(th, X, y), EXACT_F64, f"sample_moments g[{s}]")
            if single is not None:
                assert_close(hs[s], single(th, X, y), EXACT_F64, f"{curvature} h[{s}]")
    for s, th in enumerate(thetas):
        assert_close(F[s], model.forward(th, X), EXACT_F64, f"forward_batched[{s}]")
        assert_close(loss[s], model.loss(th, X, y), EXACT_F64, f"loss[{s}]")
        assert_close(g[s], model.grad(th, X, y), EXACT_F64, f"grad[{s}]")
        assert_close(G[s], model.per_example_grads(th, X, y), EXACT_F64, f"per-example[{s}]")


def test_curvature_inputs_are_checked():
    model = tiny_cnn()
    theta, X, y, v = _batch(model)
    with pytest.raises(ValueError, match=r"^v"):
        model.hvp(theta, v[:-1], X, y)
    with pytest.raises(ValueError, match=r"^theta, v"):
        model.jvp(theta, v.astype(np.float32), X)
    with pytest.raises(ValueError, match=r"^thetas"):
        model.sample_moments(theta, X, y)
    with pytest.raises(ValueError, match=r"^thetas"):
        model.forward_batched(np.zeros((0, model.D)), X)
    with pytest.raises(ValueError, match=r"^curvature"):
        model.sample_moments(theta[None], X, y, "kfac")
    with pytest.raises(ValueError, match=r"^X"):
        model.per_example_grads_batched(theta[None], X[:, :, :5], y)
    with pytest.raises(ValueError, match=r"^y"):
        model.sample_losses_and_grads(theta[None], X, None)


@pytest.mark.parametrize("name", ["tiny-categorical", "avgpool-gaussian"])
def test_closed_forms_stay_on_the_inputs_backend(name, xp):
    # checks (conv.16)-(conv.18), (conv.20)-(conv.23) on the xp backend (CuPy where present)
    model = MODELS[name]
    theta, X, y, v = _batch(model, seed=7)
    a_theta, a_X, a_y, a_v = (xp.asarray(a) for a in (theta, X, y, v))
    thetas = np.stack([theta, theta + 0.1 * v])
    pairs = [
        (model.jacobian(a_theta, a_X), model.jacobian(theta, X), "jacobian"),
        (model.ggn(a_theta, a_X, a_y), model.ggn(theta, X, y), "ggn"),
        (model.diag_ggn(a_theta, a_X, a_y), model.diag_ggn(theta, X, y), "diag_ggn"),
        (model.jvp(a_theta, a_v, a_X), model.jvp(theta, v, X), "jvp"),
        (model.ggn_vp(a_theta, a_v, a_X, a_y), model.ggn_vp(theta, v, X, y), "ggn_vp"),
        (model.sample_moments(xp.asarray(thetas), a_X, a_y, "ggn")[1],
         model.sample_moments(thetas, X, y, "ggn")[1], "sample_moments"),
    ]
    for got, want, what in pairs:
        assert isinstance(got, xp.ndarray), what
        assert_close(to_numpy(got), want, EXACT_F64, f"{what} on xp")
    if xp is not np:  # the dense Hessian stays autograd's (the HVP is closed form, conv.34)
        with pytest.raises(ValueError, match=r"^theta"):
            model.hessian(a_theta, a_X, a_y)
