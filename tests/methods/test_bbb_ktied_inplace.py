"""BBB's and the k-tied Normal's steps with Adam written in place (issue 37, item 5) equal the
printed expressions bit for bit.

The references below are the steps as they were written before: fresh arrays for every operation
of Adam (adam.1)-(adam.4), the gradient [dF/dmu; dF/drho] concatenated from its printed halves
(bbb.9), (ktied.5)-(ktied.6), and the model's checked ``sample_losses_and_grads`` (the one pass
that gives the gradients and loss_hat). Compared as bits, so the sign of a zero counts; the rule
is vogn's (tests/methods/test_vogn_inplace.py): a step writes in place only into arrays it
allocated itself, never into the caller's.
"""
import numpy as np
import pytest

from refbayes import unchecked
from refbayes.methods import adam, bbb, ktied
from refbayes.methods._estimates import Batch
from refbayes.models import MLP


def _bits(a):
    a = np.ascontiguousarray(a)
    return a.view(np.uint64 if a.dtype == np.float64 else np.uint32)


def _reference_adam(g, st, alpha, beta1, beta2, eps, t):
    m = beta1 * st.m + (1 - beta1) * g                  # (adam.1)
    v = beta2 * st.v + (1 - beta2) * (g * g)            # (adam.2)
    m_hat = m / (1 - beta1 ** (t + 1))                  # (adam.3)
    v_hat = v / (1 - beta2 ** (t + 1))                  # (adam.3)
    delta = -alpha * m_hat / (np.sqrt(v_hat) + eps)     # (adam.4)
    return delta, m, v


def _reference_bbb(state, batch, eps, cfg, model):
    X, y = batch
    M, S, D = X.shape[0], eps.shape[1], model.D
    lam = cfg.lam if isinstance(cfg.lam, np.ndarray) else float(cfg.lam)
    mu, rho = state.mu, state.rho
    c = cfg.N / (M * S)
    sigma, log_sigma, s = bbb.softplus(rho), bbb.log_softplus(rho), bbb._sigmoid(np, rho)
    theta = mu[:, None] + sigma[:, None] * eps                                       # (bbb.2)
    losses, g = model.sample_losses_and_grads(np.ascontiguousarray(theta.T), X, y)
    g_hat = c * g.sum(axis=0)                                                        # (bbb.5)
    g_rho = c * (g * eps.T).sum(axis=0) * s                                          # (bbb.6)
    kl = bbb._kl(np, mu, sigma, log_sigma, lam)                                      # (bbb.7)
    dkl_dmu, dkl_drho = bbb._kl_grads(np, mu, rho, sigma, log_sigma, s, lam)         # (bbb.8)
    grad_mu = g_hat + cfg.kl_weight * dkl_dmu                                        # (bbb.9)
    grad_rho = g_rho + cfg.kl_weight * dkl_drho                                      # (bbb.9)
    loss_hat = c * losses.sum()                                                      # (bbb.3)
    elbo = -(loss_hat + cfg.kl_weight * kl)                                          # (bbb.3)
    delta, m, v = _reference_adam(np.concatenate([grad_mu, grad_rho]), state.adam, cfg.alpha,
                                  cfg.beta1, cfg.beta2, cfg.eps_adam, state.t)
    return {"sigma": sigma, "theta": theta, "g": g, "g_hat": g_hat, "g_rho": g_rho, "kl": kl,
            "grad_mu": grad_mu, "grad_rho": grad_rho, "loss_hat": loss_hat, "elbo": elbo,
            "delta": delta, "mu": mu + delta[:D], "rho": rho + delta[D:], "m": m, "v": v}


def _reference_ktied(state, batch, eps, cfg, model):
    X, y = batch
    lay = ktied.layout(model, state.k)
    M, S, D = X.shape[0], eps.shape[1], lay.D
    lam = cfg.lam if isinstance(cfg.lam, np.ndarray) else float(cfg.lam)
    mu, rho = state.mu, state.rho
    c = cfg.N / (M * S)
    sigma, factors = ktied._sigma(np, rho, lay)                                      # (ktied.1)
    theta = mu[:, None] + sigma[:, None] * eps                                       # (ktied.2)
    losses, g = model.sample_losses_and_grads(np.ascontiguousarray(theta.T), X, y)
    g_hat = c * g.sum(axis=0)                                                        # (bbb.5)
    g_sigma = c * (g * eps.T).sum(axis=0)                                            # (ktied.5)
    log_sigma = ktied._log_sigma(np, rho, lay, sigma)
    kl = bbb._kl(np, mu, sigma, log_sigma, lam)                                      # (ktied.4)
    grad_mu = g_hat + cfg.kl_weight * (lam * mu)                                     # (bbb.9)
    grad_sigma = g_sigma + cfg.kl_weight * (lam * sigma - np.exp(-log_sigma))        # (ktied.5)
    grad_rho = ktied._chain(np, grad_sigma, rho, lay, factors)                       # (ktied.6)
    loss_hat = c * losses.sum()                                                      # (ktied.3)
    elbo = -(loss_hat + cfg.kl_weight * kl)                                          # (ktied.3)
    delta, m, v = _reference_adam(np.concatenate([grad_mu, grad_rho]), state.adam, cfg.alpha,
                                  cfg.beta1, cfg.beta2, cfg.eps_adam, state.t)
    return {"sigma": sigma, "theta": theta, "g": g, "g_hat": g_hat, "g_sigma": g_sigma,
            "kl": kl, "grad_mu": grad_mu, "grad_sigma": grad_sigma, "grad_rho": grad_rho,
            "loss_hat": loss_hat, "elbo": elbo, "delta": delta, "mu": mu + delta[:D],
            "rho": rho + delta[D:], "m": m, "v": v}


def _problem(dtype, likelihood, K, seed=0):
    rng = np.random.default_rng(seed)
    model = MLP([12, 9, 7, K], "relu", likelihood)
    M = 16
    X = rng.standard_normal((M, 12)).astype(dtype)
    X[:, :3] = 0.0  # zero inputs: signed zeros in the first layer's sums
    y = (rng.integers(0, K, M) if likelihood == "categorical"
         else rng.standard_normal(M).astype(dtype))
    mu = model.init_theta(rng).astype(dtype)
    mu[12 * 9:12 * 9 + 9] -= 3.0  # negative biases: dead relu units, zero gradients
    return model, Batch(X, y), mu, rng


def _moments(rng, n, dtype, t):
    """Adam moments after t steps (t > 0: nonzero m, v >= 0 with exact zeros)."""
    m = rng.standard_normal(n).astype(dtype)
    v = rng.uniform(0.0, 2.0, n).astype(dtype)
    v[::7] = 0.0
    m[::7] = 0.0
    return adam.AdamState(m, v, t)


def _cfg(array_lam, D, dtype, rng, kl_weight):
    lam = rng.uniform(0.5, 2.0, D).astype(dtype) if array_lam else 1.5
    return bbb.BBBConfig(200, lam, alpha=0.03, beta1=0.7, beta2=0.95, eps_adam=1e-6,
                         kl_weight=kl_weight)


def _assert_bits(got_state, info, ref):
    for name, want in ref.items():
        if name in ("m", "v"):
            continue
        got = getattr(info, name)
        got, want = np.asarray(got), np.asarray(want)
        assert got.dtype == want.dtype and got.shape == want.shape, name
        np.testing.assert_array_equal(_bits(got), _bits(want), err_msg=name)
    for name, got in (("mu", got_state.mu), ("rho", got_state.rho), ("m", got_state.adam.m),
                      ("v", got_state.adam.v)):
        assert got.dtype == ref[name].dtype, name
        np.testing.assert_array_equal(_bits(got), _bits(ref[name]), err_msg=name)


PROBLEMS = [("categorical", 4), ("gaussian", 1)]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("S", [1, 3])
@pytest.mark.parametrize("likelihood,K", PROBLEMS)
@pytest.mark.parametrize("array_lam", [False, True])
@pytest.mark.parametrize("t,kl_weight", [(0, 1.0), (5, 0.3)])
def test_bbb_step_bitwise_equals_expressions(dtype, S, likelihood, K, array_lam, t, kl_weight):
    model, batch, mu, rng = _problem(dtype, likelihood, K)
    D = model.D
    rho = rng.uniform(-6.0, 1.0, D).astype(dtype)
    rho[[7, 40, 41, 90]] = (-36.0, -40.0, -120.0, 30.0)  # both branches of log_softplus (bbb.1)
    state = bbb.BBBState(mu, rho, _moments(rng, 2 * D, dtype, t), t)
    cfg = _cfg(array_lam, D, dtype, rng, kl_weight)
    eps = rng.standard_normal((D, S)).astype(dtype)
    ref = _reference_bbb(state, batch, eps, cfg, model)
    new, info = bbb.step(state, batch, eps, cfg, model)
    _assert_bits(new, info, ref)
    assert new.t == t + 1 and new.adam.t == t + 1
    with unchecked():  # the driver's route: the same bits
        new_u, info_u = bbb.step(state, batch, eps, cfg, model)
    _assert_bits(new_u, info_u, ref)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("S", [1, 3])
@pytest.mark.parametrize("likelihood,K", PROBLEMS)
@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("array_lam,t,kl_weight", [(False, 0, 1.0), (True, 5, 0.3)])
def test_ktied_step_bitwise_equals_expressions(dtype, S, likelihood, K, k, array_lam, t,
                                               kl_weight):
    model, batch, mu, rng = _problem(dtype, likelihood, K)
    ks = tuple(min(k, K) if l == 2 else k for l in range(3))  # the output layer is 7 x K
    P = ktied.layout(model, ks).P
    fresh = ktied.init(mu, model, ks, 0.05, rng.standard_normal(P).astype(dtype))
    D = model.D
    state = fresh._replace(adam=_moments(rng, D + P, dtype, t), t=t)
    cfg = _cfg(array_lam, D, dtype, rng, kl_weight)
    eps = rng.standard_normal((D, S)).astype(dtype)
    ref = _reference_ktied(state, batch, eps, cfg, model)
    new, info = ktied.step(state, batch, eps, cfg, model)
    _assert_bits(new, info, ref)
    assert new.t == t + 1 and new.k == ks
    with unchecked():
        new_u, info_u = ktied.step(state, batch, eps, cfg, model)
    _assert_bits(new_u, info_u, ref)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("t", [0, 3, 10**6])
def test_adam_update_bitwise_equals_expressions(dtype, t):
    rng = np.random.default_rng(2)
    n = 50
    g = rng.standard_normal(n).astype(dtype)
    g[:5] = 0.0
    g[5:10] *= np.asarray(1e-30, dtype)  # underflowing squares
    st = _moments(rng, n, dtype, t)
    cfg = adam.AdamConfig(alpha=0.3, beta1=0.6, beta2=0.9, eps_adam=1e-4)
    delta, new = adam.adam_update(g, st, cfg)
    want = _reference_adam(g, st, 0.3, 0.6, 0.9, 1e-4, t)
    for got, ref in zip((delta, new.m, new.v), want):
        assert got.dtype == ref.dtype
        np.testing.assert_array_equal(_bits(got), _bits(ref))
    assert new.t == t + 1


def test_steps_leave_their_inputs_alone():
    model, batch, mu, rng = _problem(np.float64, "categorical", 4)
    D = model.D
    cfg = _cfg(True, D, np.float64, rng, 0.5)
    eps = rng.standard_normal((D, 2))
    st_b = bbb.BBBState(mu, rng.uniform(-4, 0, D), _moments(rng, 2 * D, np.float64, 2), 2)
    P = ktied.layout(model, (2, 2, 2)).P
    st_k = ktied.init(mu, model, (2, 2, 2), 0.05, rng.standard_normal(P))
    st_k = st_k._replace(adam=_moments(rng, D + P, np.float64, 2), t=2)
    for step, st in ((bbb.step, st_b), (ktied.step, st_k)):
        arrays = (st.mu, st.rho, st.adam.m, st.adam.v, eps, batch.X, cfg.lam)
        keep = [a.copy() for a in arrays]
        new, info = step(st, batch, eps, cfg, model)
        for a, b in zip(arrays, keep):
            np.testing.assert_array_equal(_bits(a), _bits(b))
        # the new state shares no memory with the old one
        for a in (new.mu, new.rho, new.adam.m, new.adam.v):
            for b in arrays:
                assert not np.shares_memory(a, b)


@pytest.mark.parametrize("bad,match", [
    (np.nan, "state.adam.v: expected finite values"),
    (np.inf, "state.adam.v: expected finite values"),
    (-1.0, r"state.adam.v: expected >= 0"),
])
def test_adam_state_v_checked_by_two_reductions_same_errors(bad, match):
    """check_adam_state scans v by min and max; a bad v still gets the usual message."""
    model, batch, mu, rng = _problem(np.float64, "categorical", 4)
    D = model.D
    st = bbb.BBBState(mu, rng.uniform(-4, 0, D), _moments(rng, 2 * D, np.float64, 1), 1)
    v = st.adam.v.copy()
    v[3] = bad
    st = st._replace(adam=st.adam._replace(v=v))
    eps = rng.standard_normal((D, 1))
    with pytest.raises(ValueError, match=match):
        bbb.step(st, batch, eps, _cfg(False, D, np.float64, rng, 1.0), model)
    with pytest.raises(ValueError, match=match.replace("state.adam.v", "state.v")):
        adam.adam_update(np.zeros(2 * D), st.adam, adam.AdamConfig())
    with unchecked(), np.errstate(invalid="ignore"):  # no value scans there
        bbb.step(st, batch, eps, _cfg(False, D, np.float64, rng, 1.0), model)
    # the order of the errors is the old one: finiteness, then the dtype, then the sign
    st32 = st._replace(adam=st.adam._replace(v=v.astype(np.float32)))
    first = match if match.endswith("finite values") else "state.adam.v: expected dtype float64"
    with pytest.raises(ValueError, match=first):
        bbb.step(st32, batch, eps, _cfg(False, D, np.float64, rng, 1.0), model)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_scales_log_sigma_equals_log_softplus_bitwise(dtype):
    """bbb._scales takes log sigma from sigma where rho >= -36: log_softplus's bits."""
    rng = np.random.default_rng(5)
    big = np.finfo(dtype).max
    rho = np.concatenate([rng.uniform(-800, 800, 2000), rng.uniform(-40, -30, 2000),
                          rng.uniform(-5, 5, 2000),
                          [-36.0, np.nextafter(-36.0, 0.0), np.nextafter(-36.0, -37.0), -745.0,
                           -746.0, -big, big, 0.0, -0.0, 710.0, 89.0, -104.0]]).astype(dtype)
    sigma, log_sigma, s = bbb._scales(np, rho)
    for got, want in ((sigma, bbb.softplus(rho)), (log_sigma, bbb.log_softplus(rho)),
                      (s, bbb._sigmoid(np, rho))):
        assert got.dtype == want.dtype == dtype
        np.testing.assert_array_equal(_bits(got), _bits(want))
