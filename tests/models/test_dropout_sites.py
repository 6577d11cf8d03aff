"""MC dropout masks at chosen sites of a CNN (mc_dropout.10)-(mc_dropout.11): the mask of site k
multiplies the input of layer k (k = len(layers): the output f), the placement of torch's
``relu(dropout(layer(x)))`` with ``output_sites``. Outputs, summed and per-example gradients
equal autograd of the loop network of tests/reference/conv_loops.py with the masks at the same
sites, at EXACT_F64; the default sites are today's masks bit for bit; bad sites are refused."""
from __future__ import annotations

import numpy as np
import pytest

from refbayes.backend import to_numpy
from refbayes.methods import mc_dropout
from refbayes.methods.driver import draw_masks
from refbayes.models import (
    CNN,
    MLP,
    Activation,
    Conv2d,
    Dense,
    Flatten,
    MaxPool2d,
    lenet5,
)
from refbayes.models import dropout as dr
from tests.reference import bbb_dense as ref
from tests.reference.conv_loops import (
    LoopSpec,
    masked_per_example_grads_loop,
    naive_output,
)
from tests.tolerances import EXACT_F64, assert_close

N, M, P_DROP = 30, 3, 0.3


def _conv_pool_net():
    """LeNet-5's pattern (conv, relu, pool twice, flatten, dense, relu, dense) at toy size, one
    conv strided and padded, so that every kind of site is exercised."""
    return CNN((2, 8, 8), [Conv2d(2, 3, 3, padding=1), Activation("relu"), MaxPool2d(2),
                           Conv2d(3, 2, 2, stride=2), Activation("tanh"), MaxPool2d(1),
                           Flatten(), Dense(8, 5), Activation("relu"), Dense(5, 3)],
               "categorical")


def _small_lenet5():
    """lenet5() itself on a 1x16x16 input (16 -> 12 -> 6 -> 2 -> 1): the paper's layers and
    sites (1, 4, 8, 10, 12), small enough for the loop network."""
    return lenet5(n_classes=4, input_shape=(1, 16, 16))


# (model, sites): torch's placement, the inputs of pooling / flatten / a conv, the input pixels
CASES = {
    "conv_pool-output_sites": (_conv_pool_net, None),
    "conv_pool-pool_flatten_output": (_conv_pool_net, (0, 2, 6, 10)),
    "conv_pool-middle": (_conv_pool_net, (3, 5, 9)),
    "lenet5_16-output_sites": (_small_lenet5, None),
}


def _data(model, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((M,) + model.input_shape)
    y = rng.integers(0, model.n_out, M)
    return rng, X, y, model.init_theta(rng)


def test_output_sites_are_after_each_parameter_layer():
    net = lenet5()
    assert dr.output_sites(net) == (1, 4, 8, 10, 12)
    assert dr.mask_shapes(net, dr.output_sites(net)) == [(6, 28, 28), (16, 10, 10), (120,),
                                                         (84,), (10,)]
    assert dr.mask_shapes(_conv_pool_net(), (0, 2, 6, 10)) == [(2, 8, 8), (3, 8, 8), (2, 2, 2),
                                                               (3,)]
    rng = np.random.default_rng(0)
    masks = draw_masks(rng, net, 2, 0.1, sites=dr.output_sites(net))
    assert [z.shape for z in masks] == [(2, 6, 28, 28), (2, 16, 10, 10), (2, 120), (2, 84),
                                        (2, 10)]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("scale", [1.0, 1 / (1 - P_DROP)])
def test_masks_at_sites_equal_the_loop_network(case, scale):
    # checks (mc_dropout.10), (mc_dropout.11)
    make, sites = CASES[case]
    model = make()
    sites = dr.output_sites(model) if sites is None else sites
    rng, X, y, theta = _data(model)
    masks = draw_masks(rng, model, M, P_DROP, sites=sites)
    sz = [z * scale for z in masks]
    spec = LoopSpec(model)
    f_want = np.stack([naive_output(spec, theta, X[i], [s[i] for s in sz], sites)
                       for i in range(M)])
    assert_close(dr.masked_forward(model, theta, X, masks, scale, sites), f_want, EXACT_F64, "f")
    G_want = masked_per_example_grads_loop(spec, theta, X, y, sz, sites)
    G = dr.masked_per_example_grads(model, theta, X, y, masks, scale, sites)
    assert_close(G, G_want, EXACT_F64, "per-example gradients")
    f, g = dr.masked_output_and_grad(model, theta, X, y, masks, scale, sites)
    assert_close(g, G_want.sum(axis=0), EXACT_F64, "summed gradient")
    assert_close(f, f_want, EXACT_F64, "f of the gradient pass")
    assert_close(dr.masked_grad(model, theta, X, y, masks, scale, sites), g, EXACT_F64, "grad")
    losses = dr.masked_per_example_losses(model, theta, X, y, masks, scale, sites)
    f_max = f_want.max(axis=1)
    nll = f_max + np.log(np.exp(f_want - f_max[:, None]).sum(axis=1)) - f_want[np.arange(M), y]
    assert_close(losses, nll, EXACT_F64, "per-example losses")


def test_the_parameter_layers_sites_are_the_default_bit_for_bit():
    model = _conv_pool_net()
    _, X, y, theta = _data(model, seed=1)
    default = (0, 3, 7, 9)  # the parameter layers
    masks = draw_masks(np.random.default_rng(5), model, M, P_DROP)
    same_draws = draw_masks(np.random.default_rng(5), model, M, P_DROP, sites=default)
    assert all(np.array_equal(a, b) for a, b in zip(masks, same_draws))
    G = dr.masked_per_example_grads(model, theta, X, y, masks, 2.0)
    assert np.array_equal(G, dr.masked_per_example_grads(model, theta, X, y, masks, 2.0, default))
    f, g = dr.masked_output_and_grad(model, theta, X, y, masks, 2.0)
    f_s, g_s = dr.masked_output_and_grad(model, theta, X, y, masks, 2.0, default)
    assert np.array_equal(f, f_s) and np.array_equal(g, g_s)


def test_the_output_site_alone_scales_the_logits_and_their_error():
    # checks (mc_dropout.10), (mc_dropout.11) in closed form: f~ = s z f, and
    # grad = sum_i J_i^T (s z_i * r_i) with J_i the unmasked network's Jacobian, r_i = dl/df~_i
    model = _conv_pool_net()
    _, X, y, theta = _data(model, seed=2)
    z = np.array([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    s = 1 / (1 - P_DROP)
    f_t = s * z * model.forward(theta, X)
    assert_close(dr.masked_forward(model, theta, X, [z], s, (10,)), f_t, EXACT_F64, "f~")
    p = np.exp(f_t - f_t.max(axis=1, keepdims=True))
    r = p / p.sum(axis=1, keepdims=True) - np.eye(3)[y]  # the categorical loss's dl/df~
    g_want = np.einsum("ik,ikd->d", s * z * r, model.jacobian(theta, X))
    assert_close(dr.masked_grad(model, theta, X, y, [z], s, (10,)), g_want, EXACT_F64, "grad")


def test_steps_and_predictive_pass_cfg_sites():
    # checks (mc_dropout.10), (mc_dropout.11) through mc_dropout.step / predict_samples
    model = _conv_pool_net()
    rng, X, y, theta0 = _data(model, seed=3)
    sites = dr.output_sites(model)
    cfg = mc_dropout.MCDropoutConfig(N, p=P_DROP, lengthscale=0.7, alpha=0.02, beta1=0.8,
                                     beta2=0.99, eps_adam=1e-7, sites=sites)
    lam, s, spec = mc_dropout.prior_precision(cfg, model), mc_dropout.scale(cfg), LoopSpec(model)
    state, theta, m, v = mc_dropout.init(theta0), theta0, np.zeros(model.D), np.zeros(model.D)
    for t in range(2):
        masks = draw_masks(rng, model, M, P_DROP, sites=sites)
        state, info = mc_dropout.step(state, mc_dropout.Batch(X.reshape(M, -1), y), masks, cfg,
                                      model)
        g = (N / M) * masked_per_example_grads_loop(spec, theta, X, y, [z * s for z in masks],
                                                    sites).sum(0) + lam * theta
        assert_close(info.g, g, EXACT_F64, f"g, step {t}")
        delta, m, v = ref.adam_hand(g, m, v, t, 0.02, 0.8, 0.99, 1e-7)
        theta = theta + delta
        assert_close(state.theta, theta, EXACT_F64, f"theta, step {t}")
    lists = [draw_masks(rng, model, M, P_DROP, sites=sites) for _ in range(2)]
    F = mc_dropout.predict_samples(state, X, lists, cfg, model)
    for k, masks in enumerate(lists):
        assert np.array_equal(F[k], dr.masked_forward(model, state.theta, X, masks, s, sites))


def test_sites_on_each_backend_match_numpy(xp):
    """A step and the predictive at torch's sites on NumPy and, where a GPU (or the CI stand-in)
    is present, CuPy arrays, against the NumPy run."""
    model = _conv_pool_net()
    rng, X, y, theta0 = _data(model, seed=4)
    cfg = mc_dropout.MCDropoutConfig(N, p=P_DROP, alpha=0.02, sites=dr.output_sites(model))
    masks = draw_masks(rng, model, M, P_DROP, sites=cfg.sites)
    runs = []
    for lib in (np, xp):
        zs = [lib.asarray(z) for z in masks]
        state, _ = mc_dropout.step(mc_dropout.init(lib.asarray(theta0)), mc_dropout.Batch(
            lib.asarray(X.reshape(M, -1)), lib.asarray(y)), zs, cfg, model)
        F = mc_dropout.predict_samples(state, lib.asarray(X), [zs], cfg, model)
        runs.append((to_numpy(state.theta), to_numpy(F)))
    assert_close(runs[1][0], runs[0][0], EXACT_F64, "theta")
    assert_close(runs[1][1], runs[0][1], EXACT_F64, "F")


@pytest.mark.parametrize("sites, match", [
    ((1, 13), r"sites: expected an integer in \[0, 12\], got 13"),
    ((4, 1), r"sites: expected distinct increasing layer indices, got \(4, 1\)"),
    ((1, 1), r"sites: expected distinct increasing"),
    ((), r"sites: expected a non-empty tuple"),
    ((1.0,), r"sites: expected an integer"),
    ("1", r"sites: expected a non-empty tuple"),
])
def test_bad_sites_are_refused_naming_them(sites, match):
    net = lenet5()
    with pytest.raises(ValueError, match=match):
        dr.mask_shapes(net, sites)


def test_sites_on_an_mlp_and_masks_of_the_wrong_shape_are_refused():
    mlp = MLP([3, 4, 2], "relu", "categorical")
    with pytest.raises(ValueError, match=r"sites: mask sites are for a CNN .*MLP takes sites=None"):
        dr.mask_shapes(mlp, (1,))
    with pytest.raises(ValueError, match=r"model: expected a CNN"):
        dr.output_sites(mlp)
    model = _conv_pool_net()
    rng, X, y, theta = _data(model)
    default_masks = draw_masks(rng, model, M, P_DROP)  # 4 masks, the parameter layers' shapes
    with pytest.raises(ValueError, match=r"masks: expected a list of 4 arrays \(one per site of "
                                         r"\(1, 4, 8, 10\), shapes \[\(3, 3, 8, 8\)"):
        dr.masked_grad(model, theta, X, y, default_masks[:3] + [default_masks[3]] * 2, 1.0,
                       (1, 4, 8, 10))
    with pytest.raises(ValueError, match=r"masks\[0\]"):
        dr.masked_grad(model, theta, X, y, default_masks, 1.0, (1, 4, 8, 10))


@pytest.mark.parametrize("sites", [[1, 4], (1, True), (None,)])
def test_cfg_sites_must_be_a_tuple_of_ints(sites):
    with pytest.raises(ValueError, match=r"cfg.sites: expected None or a non-empty tuple"):
        mc_dropout.MCDropoutConfig(N, sites=sites)


def test_step_and_predictive_name_cfg_sites_when_they_do_not_fit_the_model():
    model = _conv_pool_net()
    rng, X, y, theta = _data(model)
    state = mc_dropout.init(theta)
    masks = draw_masks(rng, model, M, P_DROP)
    cfg = mc_dropout.MCDropoutConfig(N, p=P_DROP, sites=(1, 11))  # the net has 10 layers
    with pytest.raises(ValueError,
                       match=r"^cfg\.sites: expected an integer in \[0, 10\], got 11"):
        mc_dropout.step(state, mc_dropout.Batch(X.reshape(M, -1), y), masks, cfg, model)
    with pytest.raises(ValueError, match=r"^cfg\.sites: expected an integer in \[0, 10\]"):
        mc_dropout.predict_samples(state, X, [masks], cfg, model)
    mlp = MLP([3, 4, 2], "relu", "categorical")
    with pytest.raises(ValueError, match=r"^cfg\.sites: mask sites are for a CNN"):
        mc_dropout.predict_samples(mc_dropout.init(np.zeros(mlp.D)), np.zeros((2, 3)),
                                   [draw_masks(rng, mlp, 2, P_DROP)],
                                   mc_dropout.MCDropoutConfig(N, sites=(1,)), mlp)
