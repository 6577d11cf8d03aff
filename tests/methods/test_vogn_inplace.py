"""VOGN's step written in place (issue 37, item 3) equals the printed expressions bit for bit.

The reference below is the step as it was written before: fresh arrays for every operation of
(vogn.4)-(vogn.9), the model's checked ``sample_moments``, the mean over the draws and the
one-worker reduction 0.0 + (M / M) * mean (vogn.6). Compared as bits, so the sign of a zero counts.
"""
import numpy as np
import pytest

from refbayes.methods import vogn
from refbayes.methods._estimates import Batch
from refbayes.models import MLP, _layers


def _bits(a):
    a = np.ascontiguousarray(a)
    return a.view(np.uint64 if a.dtype == np.float64 else np.uint32)


def _reference_step(state, batch, eps, cfg, model):
    c = vogn._scales(cfg, model.D, state.mu.dtype)
    mu, s = state.mu, state.s
    sigma = np.sqrt(c.tau / (c.N_eff * (s + c.delta_tilde + c.gamma)))             # (vogn.4)
    theta = mu[:, None] + sigma[:, None] * eps                                       # (vogn.4)
    g, h = model.sample_moments(np.ascontiguousarray(theta.T), batch.X, batch.y, c.curvature)
    M = batch.X.shape[0]
    g_k, h_k = g / M, h / M                                                          # (vogn.5)
    g_hat = 0.0 + (M / M) * g_k.mean(axis=0)                                         # (vogn.6)
    h_hat = 0.0 + (M / M) * h_k.mean(axis=0)                                         # (vogn.6)
    m = c.beta1 * state.m + (g_hat + c.delta_tilde * mu)                             # (vogn.7)
    s_new = (1 - c.beta2) * s + c.beta2 * h_hat                                      # (vogn.8)
    Delta_mu = c.alpha * m / (s_new + c.delta_tilde + c.gamma)                       # (vogn.9)
    prec = (c.N_eff / c.tau) * (s_new + c.delta_tilde + c.gamma)                     # (vogn.4)
    return {"sigma": sigma, "theta": theta, "g_k": g_k, "h_k": h_k, "g_hat": g_hat,
            "h_hat": h_hat, "m": m, "s": s_new, "prec_diag": prec, "Delta_mu": Delta_mu,
            "mu": mu - Delta_mu}


def _problem(dtype, likelihood, K, array_delta, seed=0):
    rng = np.random.default_rng(seed)
    model = MLP([12, 9, K], "relu", likelihood)
    D, M = model.D, 16
    X = rng.standard_normal((M, 12)).astype(dtype)
    X[:, :3] = 0.0  # zero inputs: signed zeros in the first layer's sums
    y = (rng.integers(0, K, M) if likelihood == "categorical"
         else rng.standard_normal(M).astype(dtype))
    mu = model.init_theta(rng).astype(dtype)
    mu[12 * 9:12 * 9 + 9] -= 3.0  # negative biases: dead relu units, zero deltas
    state = vogn.VOGNState(mu, rng.uniform(0.1, 2.0, D).astype(dtype),
                           rng.standard_normal(D).astype(dtype), 4)
    delta = rng.uniform(0.5, 2.0, D).astype(dtype) if array_delta else 1.5
    return model, Batch(X, y), state, delta, rng


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("curvature", ["ef", "ggn"])
@pytest.mark.parametrize("S", [1, 3])
@pytest.mark.parametrize("likelihood,K", [("categorical", 4), ("gaussian", 1)])
@pytest.mark.parametrize("array_delta", [False, True])
def test_step_bitwise_equals_expressions(dtype, curvature, S, likelihood, K, array_delta):
    model, batch, state, delta, rng = _problem(dtype, likelihood, K, array_delta)
    cfg = vogn.VOGNConfig(200, delta, alpha=0.3, beta1=0.7, beta2=0.2, gamma=0.05, tau=0.8,
                          rho=1.5, curvature=curvature)
    eps = rng.standard_normal((model.D, S)).astype(dtype)
    new, info = vogn.step(state, batch, eps, cfg, model)
    ref = _reference_step(state, batch, eps, cfg, model)
    for name, want in ref.items():
        got = getattr(info, name)
        assert got.dtype == want.dtype and got.shape == want.shape, name
        np.testing.assert_array_equal(_bits(got), _bits(want), err_msg=name)
    for name in ("mu", "s", "m"):
        np.testing.assert_array_equal(_bits(getattr(new, name)), _bits(ref[name]), err_msg=name)
    # the public pieces agree with the step: sample, prec_diag, apply
    np.testing.assert_array_equal(_bits(vogn.sample(state, eps, cfg)), _bits(ref["theta"]))
    np.testing.assert_array_equal(_bits(vogn.prec_diag(new, cfg)), _bits(ref["prec_diag"]))
    applied = vogn.apply(state, info.g_hat, info.h_hat, cfg)[0]
    np.testing.assert_array_equal(_bits(applied.mu), _bits(ref["mu"]))


def test_apply_leaves_its_inputs_alone():
    model, _, state, delta, rng = _problem(np.float64, "categorical", 4, False)
    cfg = vogn.VOGNConfig(200, delta, alpha=0.3, gamma=0.05)
    g, h = rng.standard_normal(model.D), rng.uniform(0, 1, model.D)
    keep = [a.copy() for a in (g, h, state.mu, state.s, state.m)]
    vogn.apply(state, g, h, cfg)
    for a, b in zip((g, h, state.mu, state.s, state.m), keep):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("S", [1, 4])
@pytest.mark.parametrize("square", [False, True])
def test_blocks_batched_equals_concatenated_blocks(bias, S, square):
    rng = np.random.default_rng(1)
    M = 7
    acts = [rng.standard_normal((M, 5)), rng.standard_normal((S, M, 6))]
    e = [rng.standard_normal((S, M, 6)), rng.standard_normal((S, M, 3))]
    got = _layers._blocks_batched(np, acts, e, bias, square)
    blocks = []
    for a, el in zip(acts, e):
        a = a * a if square else a
        blocks.append((np.swapaxes(a, -1, -2) @ el).reshape(S, -1))
        if bias:
            blocks.append(np.ones(M) @ el)
    want = np.concatenate(blocks, axis=1)
    assert got.shape == (S, (5 + bias) * 6 + (6 + bias) * 3)
    np.testing.assert_array_equal(_bits(got), _bits(want))


def test_trusted_moments_equal_checked_and_still_check_labels():
    model, batch, state, _, rng = _problem(np.float64, "categorical", 4, False)
    thetas = state.mu[None] + 0.1 * rng.standard_normal((2, model.D))
    for curvature in ("ef", "ggn"):
        got = model._sample_moments_trusted(thetas, batch.X, batch.y, curvature)
        want = model.sample_moments(thetas, batch.X, batch.y, curvature)
        for a, b in zip(got, want):
            np.testing.assert_array_equal(_bits(a), _bits(b))
    bad = Batch(batch.X, np.full(batch.X.shape[0], 7))
    cfg = vogn.VOGNConfig(200, 1.0)
    with pytest.raises(ValueError, match="y"):
        vogn.step(state, bad, rng.standard_normal((model.D, 1)), cfg, model)
