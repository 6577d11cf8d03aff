"""MC dropout on a CNN (issue 34): the masks multiply the input of every Conv2d (one entry per
pixel and channel) and Dense, and the masked network's outputs and gradients equal a plainly
written loop network (tests/reference/conv_loops.py, differentiated by autograd) at EXACT_F64;
the step is Adam on the summed-loss objective (mc_dropout.3) with the prior of (mc_dropout.4)."""
from __future__ import annotations

import numpy as np
import pytest

from refbayes.backend import to_numpy
from refbayes.methods import mc_dropout
from refbayes.methods.driver import draw_masks
from refbayes.models import CNN, AvgPool2d, Activation, Conv2d, Dense, Flatten, lenet5, tiny_cnn
from refbayes.models import dropout as dr
from tests.reference import bbb_dense as ref
from tests.reference.conv_loops import LoopSpec, masked_per_example_grads_loop, naive_output
from tests.tolerances import EXACT_F64, assert_close

N, M, P_DROP = 30, 4, 0.3


def _two_conv(likelihood="categorical"):
    """Two conv layers (one strided and padded) so that a mask sits inside the network, an
    average pool and a dense head."""
    return CNN((2, 6, 6), [Conv2d(2, 3, (3, 3), stride=1, padding=1), Activation("tanh"),
                           Conv2d(3, 2, (2, 2), stride=2), Activation("relu"), AvgPool2d(1),
                           Flatten(), Dense(18, 3 if likelihood == "categorical" else 1)],
               likelihood=likelihood, noise_precision=2.0)


MODELS = {"tiny": tiny_cnn, "two_conv": _two_conv,
          "two_conv_gaussian": lambda: _two_conv("gaussian")}


def _data(model, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((M,) + model.input_shape)
    y = (rng.standard_normal(M) if model.likelihood.name == "gaussian"
         else rng.integers(0, model.n_out, M))
    return rng, X, y, model.init_theta(rng)


def test_mask_shapes_are_the_inputs_of_the_layers_with_parameters():
    assert dr.mask_shapes(tiny_cnn()) == [(1, 6, 6), (8,)]
    assert dr.mask_shapes(lenet5()) == [(3, 32, 32), (6, 14, 14), (400,), (120,), (84,)]
    rng = np.random.default_rng(0)
    masks = draw_masks(rng, _two_conv(), 5, 0.5)
    assert [z.shape for z in masks] == [(5, 2, 6, 6), (5, 3, 6, 6), (5, 18)]
    assert all(set(np.unique(z)) <= {0.0, 1.0} for z in masks)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("scale", [1.0, 1 / (1 - P_DROP)])
def test_masked_outputs_and_gradients_equal_the_loop_network(name, scale):
    # checks (mc_dropout.1), (mc_dropout.2)
    model = MODELS[name]()
    rng, X, y, theta = _data(model)
    masks = draw_masks(rng, model, M, P_DROP)
    sz = [z * scale for z in masks]
    spec = LoopSpec(model)
    f_want = np.stack([naive_output(spec, theta, X[i], [s[i] for s in sz]) for i in range(M)])
    assert_close(dr.masked_forward(model, theta, X, masks, scale), f_want, EXACT_F64, "f")
    G_want = masked_per_example_grads_loop(spec, theta, X, y, sz)
    G = dr.masked_per_example_grads(model, theta, X, y, masks, scale)
    assert_close(G, G_want, EXACT_F64, "per-example gradients")
    f, g = dr.masked_output_and_grad(model, theta, X, y, masks, scale)
    assert_close(g, G_want.sum(axis=0), EXACT_F64, "summed gradient")
    assert_close(f, f_want, EXACT_F64, "f of the gradient pass")
    losses = dr.masked_per_example_losses(model, theta, X, y, masks, scale)
    assert losses.shape == (M,) and np.all(np.isfinite(losses))


def test_all_ones_masks_at_scale_one_are_the_plain_network_bit_for_bit():
    model = _two_conv()
    rng, X, y, theta = _data(model, seed=3)
    ones = [np.ones((M,) + s) for s in dr.mask_shapes(model)]
    assert np.array_equal(dr.masked_forward(model, theta, X, ones, 1.0), model.forward(theta, X))
    assert np.array_equal(dr.masked_grad(model, theta, X, y, ones, 1.0), model.grad(theta, X, y))


def test_a_mask_of_the_wrong_shape_names_it_and_the_expected_shapes():
    model = tiny_cnn()
    rng, X, y, theta = _data(model)
    masks = draw_masks(rng, model, M, P_DROP)
    with pytest.raises(ValueError, match=r"masks\[0\]"):
        dr.masked_grad(model, theta, X, y, [masks[0][:, 0], masks[1]], 1.0)
    with pytest.raises(ValueError, match=r"masks: expected a list of 2 arrays .*\(4, 1, 6, 6\)"):
        dr.masked_grad(model, theta, X, y, masks[:1], 1.0)


@pytest.mark.parametrize("decay_biases", [True, False])
@pytest.mark.parametrize("inverted", [True, False])
def test_prior_precision_puts_the_bias_decay_on_the_cnns_biases(inverted, decay_biases):
    # checks (mc_dropout.4)
    model = _two_conv()
    cfg = mc_dropout.MCDropoutConfig(N, p=0.2, lengthscale=0.7, inverted=inverted,
                                     decay_biases=decay_biases)
    lam = mc_dropout.prior_precision(cfg, model)
    is_bias = np.zeros(model.D, bool)
    pos = 0
    for kind, f in LoopSpec(model).layers:  # theta walked front to back, as conv.md (conv.2)
        if kind == "Conv2d":
            n_w, n_b = f["c_out"] * f["c_in"] * f["kernel"][0] * f["kernel"][1], f["c_out"]
        elif kind == "Dense":
            n_w, n_b = f["n_in"] * f["n_out"], f["n_out"]
        else:
            continue
        is_bias[pos + n_w:pos + n_w + n_b] = True
        pos += n_w + n_b
    lam_W = 0.7 * 0.7 / 0.8 if inverted else 0.7 * 0.7 * 0.8
    assert_close(lam[~is_bias], np.full((~is_bias).sum(), lam_W), EXACT_F64, "weights")
    assert np.array_equal(lam[is_bias], np.full(is_bias.sum(), 0.7 * 0.7 if decay_biases else 0.0))


@pytest.mark.parametrize("name", ["tiny", "two_conv_gaussian"])
def test_steps_on_a_cnn_are_adam_on_the_masked_objective(name):
    # checks (mc_dropout.3), (mc_dropout.5), (mc_dropout.6)
    model = MODELS[name]()
    rng, X, y, theta0 = _data(model, seed=4)
    tau = 2.0 if name.endswith("gaussian") else 1.0
    cfg = mc_dropout.MCDropoutConfig(N, p=P_DROP, lengthscale=0.7, noise_precision=tau,
                                     alpha=0.02, beta1=0.8, beta2=0.99, eps_adam=1e-7)
    lam = mc_dropout.prior_precision(cfg, model)
    s = mc_dropout.scale(cfg)
    spec = LoopSpec(model)
    state = mc_dropout.init(theta0)
    theta, m, v = theta0, np.zeros(model.D), np.zeros(model.D)
    for t in range(3):
        masks = draw_masks(rng, model, M, P_DROP)
        state, info = mc_dropout.step(state, mc_dropout.Batch(X.reshape(M, -1), y), masks, cfg,
                                      model)  # a batch holds rows (check_batch)
        g = (N / M) * masked_per_example_grads_loop(spec, theta, X, y,
                                                    [z * s for z in masks]).sum(0) + lam * theta
        assert_close(info.g, g, EXACT_F64, f"g, step {t}")
        delta, m, v = ref.adam_hand(g, m, v, t, 0.02, 0.8, 0.99, 1e-7)
        theta = theta + delta
        assert_close(state.theta, theta, EXACT_F64, f"theta, step {t}")
    assert state.t == 3


def test_the_mc_predictive_on_a_cnn_runs_one_masked_pass_per_mask_list():
    # checks (mc_dropout.7)
    model = tiny_cnn()
    rng, X, y, theta = _data(model, seed=5)
    cfg = mc_dropout.MCDropoutConfig(N, p=P_DROP)
    lists = [draw_masks(rng, model, M, P_DROP) for _ in range(3)]
    F = mc_dropout.predict_samples(mc_dropout.init(theta), X, lists, cfg, model)
    assert F.shape == (3, M, model.n_out)
    for s, masks in enumerate(lists):
        assert np.array_equal(F[s], dr.masked_forward(model, theta, X, masks, mc_dropout.scale(cfg)))


def test_a_cnn_step_and_predictive_on_each_backend_match_numpy(xp):
    """Two steps and the MC predictive on NumPy and, where a GPU (or the CI stand-in) is
    present, CuPy arrays, against the NumPy run."""
    model = _two_conv()
    rng, X, y, theta0 = _data(model, seed=6)
    cfg = mc_dropout.MCDropoutConfig(N, p=P_DROP, lengthscale=0.7, alpha=0.02)
    draws = [draw_masks(rng, model, M, P_DROP) for _ in range(2)]
    runs = []
    for lib in (np, xp):
        state = mc_dropout.init(lib.asarray(theta0))
        for masks in draws:
            batch = mc_dropout.Batch(lib.asarray(X.reshape(M, -1)), lib.asarray(y))
            state, _ = mc_dropout.step(state, batch, [lib.asarray(z) for z in masks], cfg, model)
        F = mc_dropout.predict_samples(state, lib.asarray(X), [[lib.asarray(z) for z in d]
                                                               for d in draws], cfg, model)
        runs.append((to_numpy(state.theta), to_numpy(F)))
    assert_close(runs[1][0], runs[0][0], EXACT_F64, "theta")
    assert_close(runs[1][1], runs[0][1], EXACT_F64, "F")
