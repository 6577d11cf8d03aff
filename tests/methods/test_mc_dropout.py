"""MC dropout (refbayes.methods.mc_dropout) against a dense re-implementation (autograd of the
masked loss written layer by layer + a hand-written Adam, tests/reference/bbb_dense.py), the
MAP / Adam step it reduces to at p = 0, Gal's weight-decay formula, and a hand-written MC
predictive log-likelihood."""
import autograd
import autograd.numpy as anp
import numpy as np
import pytest
from scipy.special import logsumexp
from scipy.stats import norm

from refbayes.backend import to_numpy
from refbayes.methods import adam, mc_dropout
from refbayes.methods.driver import draw_masks
from refbayes.models import MLP
from refbayes.models import dropout as dr
from tests.reference import bbb_dense as ref
from tests.tolerances import EXACT_F32, EXACT_F64, assert_close

N, P, M = 40, 3, 8
TAU = 2.0


def _model(likelihood="gaussian"):
    if likelihood == "gaussian":
        return MLP([P, 5, 4, 2], activation="relu", likelihood="gaussian", noise_precision=TAU)
    return MLP([P, 6, 3], activation="tanh", likelihood="categorical")


def _data(model, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, P))
    y = rng.standard_normal((N, 2)) if model.likelihood.name == "gaussian" else \
        rng.integers(0, 3, N)
    return X, y, model.init_theta(rng)


def _lam_by_hand(model, l, p, inverted, decay_biases):
    """Prior precision from derivations/mc_dropout.md, placed with model.flatten."""
    lam_W = l * l / (1 - p) if inverted else l * l * (1 - p)
    lam_b = l * l if decay_biases else 0.0
    return model.flatten([(np.full(W.shape, lam_W), np.full(b.shape, lam_b))
                          for W, b in model.unflatten(np.zeros(model.D))])


@pytest.mark.parametrize("likelihood", ["gaussian", "categorical"])
@pytest.mark.parametrize("inverted", [True, False])
@pytest.mark.parametrize("decay_biases", [True, False])
def test_steps_match_dense(likelihood, inverted, decay_biases):
    # checks (mc_dropout.1), (mc_dropout.2), (mc_dropout.3), (mc_dropout.5), (mc_dropout.6)
    model = _model(likelihood)
    X, y, theta0 = _data(model)
    tau = TAU if likelihood == "gaussian" else 1.0
    cfg = mc_dropout.MCDropoutConfig(N, p=0.2, lengthscale=0.7, noise_precision=tau, alpha=0.02,
                                     beta1=0.8, beta2=0.99, eps_adam=1e-7, inverted=inverted,
                                     decay_biases=decay_biases)
    lam = _lam_by_hand(model, 0.7, 0.2, inverted, decay_biases)
    s = 1 / 0.8 if inverted else 1.0
    rng = np.random.default_rng(1)
    state = mc_dropout.init(theta0)
    theta, m, v = theta0, np.zeros(model.D), np.zeros(model.D)
    for t in range(4):
        idx = rng.permutation(N)[:M]
        masks = draw_masks(rng, model, M, 0.2)
        state, info = mc_dropout.step(state, mc_dropout.Batch(X[idx], y[idx]), masks, cfg, model)
        theta, m, v = ref.mc_dropout_step(model, theta, m, v, t, X[idx], y[idx], masks, s, N,
                                          lam, 0.02, 0.8, 0.99, 1e-7)
        assert_close(state.theta, theta, EXACT_F64, f"theta, step {t}")
        assert_close(state.adam.m, m, EXACT_F64, f"Adam m, step {t}")
    assert state.t == state.adam.t == 4
    assert_close(info.f, ref.masked_outputs(model, info.theta - info.delta, X[idx], masks, s),
                 EXACT_F64, "masked outputs")


@pytest.mark.parametrize("decay_biases", [True, False])
def test_p_zero_is_map_adam_with_l2(decay_biases):
    """p = 0, all-ones masks: the masked network is the plain one and both decays are l^2 (0 on
    biases with decay_biases=False), so every step is adam.step with that lam."""
    model = _model()
    X, y, theta0 = _data(model, seed=2)
    cfg = mc_dropout.MCDropoutConfig(N, p=0.0, lengthscale=0.5, noise_precision=TAU, alpha=0.01,
                                     decay_biases=decay_biases)
    lam = _lam_by_hand(model, 0.5, 0.0, True, decay_biases)
    acfg = adam.AdamConfig(alpha=0.01)
    s_mc, s_map = mc_dropout.init(theta0), adam.init(theta0)
    rng = np.random.default_rng(3)
    for t in range(3):
        idx = rng.permutation(N)[:M]
        ones = draw_masks(rng, model, M, 0.0)
        assert all(np.all(z == 1) for z in ones)
        s_mc, _ = mc_dropout.step(s_mc, mc_dropout.Batch(X[idx], y[idx]), ones, cfg, model)
        s_map, _ = adam.step(s_map, adam.Batch(X[idx], y[idx]), acfg, model, N, lam)
        assert_close(s_mc.theta, s_map.theta, EXACT_F64, f"step {t}")


def test_weight_decay_formula():
    """Gal's averaged coefficient l^2 (1 - p) / (2 N tau) (net/net.py's ``reg``) is the summed
    prior precision of the non-inverted weights divided by 2 N tau; the inverted weights carry
    l^2 / (1 - p); biases l^2 or 0."""
    model = _model()
    cfg = mc_dropout.MCDropoutConfig(N, p=0.1, lengthscale=1e-2, noise_precision=TAU,
                                     inverted=False)
    reg = 1e-2 ** 2 * 0.9 / (2 * N * TAU)
    assert abs(mc_dropout.gal_weight_decay(cfg) - reg) <= EXACT_F64 * reg
    lam = mc_dropout.prior_precision(cfg, model)
    assert_close(lam, _lam_by_hand(model, 1e-2, 0.1, False, True), EXACT_F64, "non-inverted")
    W0 = model.unflatten(lam)[0][0]
    assert_close(W0 / (2 * N * TAU), np.full(W0.shape, reg), EXACT_F64, "lam_W / (2 N tau)")
    inv = mc_dropout.prior_precision(cfg._replace(inverted=True, decay_biases=False), model)
    for W, b in model.unflatten(inv):
        assert_close(W, np.full(W.shape, 1e-4 / 0.9), EXACT_F64, "inverted lam_W")
        assert np.all(b == 0)
    assert mc_dropout.scale(cfg) == 1.0 and mc_dropout.scale(cfg._replace(inverted=True)) == 1 / 0.9


def _half_mse_objective(model, theta, X, y, masks, reg, half):
    """Gal's averaged objective (1/M) sum_i c |y_i - f_i|^2 + reg ||W||^2 (weights only), with
    c = 1/2 (the derivation's Euclidean loss) or c = 1 (Keras 'mean_squared_error', K = 1)."""
    f = ref.masked_outputs(model, theta, X, masks, 1.0)
    c = 0.5 if half else 1.0
    wsum = anp.sum(_weight_indicator(model) * theta ** 2)
    return c * anp.mean(anp.sum((y.reshape(f.shape) - f) ** 2, axis=1)) + reg * wsum


def _weight_indicator(model):
    return model.flatten([(np.ones(W.shape), np.zeros(b.shape))
                          for W, b in model.unflatten(np.zeros(model.D))])


def test_summed_objective_is_gal_averaged_objective_times_n_tau():
    """Full batch (M = N), non-inverted, biases undecayed: grad F / (N tau) is the gradient of
    (1/N) sum_i (1/2)|y_i - f_i|^2 + reg ||W||^2 with reg = gal_weight_decay (mc_dropout.md)."""
    model = MLP([P, 5, 1], activation="tanh", likelihood="gaussian", noise_precision=TAU)
    rng = np.random.default_rng(4)
    X, y, theta = rng.standard_normal((N, P)), rng.standard_normal(N), model.init_theta(rng)
    cfg = mc_dropout.MCDropoutConfig(N, p=0.25, lengthscale=0.3, noise_precision=TAU,
                                     inverted=False, decay_biases=False)
    masks = draw_masks(rng, model, N, 0.25)
    _, info = mc_dropout.step(mc_dropout.init(theta), mc_dropout.Batch(X, y), masks, cfg, model)
    g_avg = autograd.grad(_half_mse_objective, 1)(model, theta, X, y, masks,
                                                  mc_dropout.gal_weight_decay(cfg), True)
    assert_close(info.g / (N * TAU), g_avg, EXACT_F64, "F / (N tau) = Gal's objective")


def test_erratum_keras_mse_halves_the_prior():
    """(E-mc_dropout.1) net/net.py trains 'mean_squared_error' (no 1/2) with reg = l^2 (1 - p) /
    (2 N tau): its gradient is not grad F / (N tau); it equals the gradient of an objective
    whose prior precision is halved relative to the data."""
    model = MLP([P, 5, 1], activation="tanh", likelihood="gaussian", noise_precision=TAU)
    rng = np.random.default_rng(5)
    X, y, theta = rng.standard_normal((N, P)), rng.standard_normal(N), model.init_theta(rng)
    cfg = mc_dropout.MCDropoutConfig(N, p=0.25, lengthscale=3.0, noise_precision=TAU,
                                     inverted=False, decay_biases=False)
    masks = draw_masks(rng, model, N, 0.25)
    _, info = mc_dropout.step(mc_dropout.init(theta), mc_dropout.Batch(X, y), masks, cfg, model)
    reg = mc_dropout.gal_weight_decay(cfg)
    g_keras = autograd.grad(_half_mse_objective, 1)(model, theta, X, y, masks, reg, False)
    err = np.max(np.abs(g_keras - info.g / (N * TAU))) / np.max(np.abs(info.g / (N * TAU)))
    assert err > 0.1, "the printed objective should fail the dense check"
    lam_half = mc_dropout.prior_precision(cfg, model) / 2
    g_half_prior = (info.g_data + lam_half * theta) / (N * TAU)
    assert_close(g_keras / 2, g_half_prior, EXACT_F64, "Keras MSE = prior at half strength")


def test_erratum_inverted_dropout_needs_one_over_one_minus_p():
    """(E-mc_dropout.2) With inverted dropout the layer computes (z a / (1 - p)) W = (z a) M with
    M = W / (1 - p), Gal's variational parameter. The objective is a function of M, so
    F_inverted(W) = F_plain(M) and dF/dW = dF/dM / (1 - p). That holds with lam_W = l^2 / (1 - p)
    (mc_dropout.4); with the printed l^2 (1 - p) of net/net.py (Keras inverted dropout) it fails."""
    model = _model()
    X, y, theta = _data(model, seed=6)
    p = 0.3
    cfg = mc_dropout.MCDropoutConfig(N, p=p, lengthscale=10.0, noise_precision=TAU)
    rng = np.random.default_rng(7)
    masks = draw_masks(rng, model, M, p)
    w = _weight_indicator(model).astype(bool)
    theta_M = np.where(w, theta / (1 - p), theta)
    b = mc_dropout.Batch(X[:M], y[:M])
    _, inv = mc_dropout.step(mc_dropout.init(theta), b, masks, cfg, model)
    _, plain = mc_dropout.step(mc_dropout.init(theta_M), b, masks, cfg._replace(inverted=False),
                               model)
    chain = np.where(w, plain.g / (1 - p), plain.g)
    assert_close(inv.g, chain, EXACT_F64, "dF/dW = dF/dM / (1 - p)")
    printed = inv.g_data + _lam_by_hand(model, 10.0, p, False, True) * theta
    err = np.max(np.abs(printed - chain)) / np.max(np.abs(chain))
    assert err > 0.05, f"the printed decay should fail the chain-rule check, error {err:.2e}"


@pytest.mark.parametrize("K", [1, 2])
def test_predictive_log_likelihood_matches_hand_formula(K):
    # checks (mc_dropout.7), (mc_dropout.8)
    rng = np.random.default_rng(8)
    S, n, tau = 5, 6, 0.7
    F = rng.standard_normal((S, n, K)) * 2.0
    y = rng.standard_normal((n, K)) if K == 2 else rng.standard_normal(n)
    got = mc_dropout.predictive_log_likelihood(F, y, tau)
    yk = y.reshape(n, K)
    logp = norm.logpdf(yk[None], loc=F, scale=1 / np.sqrt(tau)).sum(axis=2)  # (S, n)
    assert_close(got, logsumexp(logp, axis=0) - np.log(S), EXACT_F64, "MC predictive")
    if K == 1:  # Gal's line in net/net.py, written out
        gal = (logsumexp(-0.5 * tau * (y[None] - F[:, :, 0]) ** 2, 0) - np.log(S)
               - 0.5 * np.log(2 * np.pi) + 0.5 * np.log(tau))
        assert_close(got, gal, EXACT_F64, "Gal's formula")
        assert_close(mc_dropout.predictive_log_likelihood(F[:, :, 0], y, tau), got, EXACT_F64,
                     "(S, n) input")


def test_predictive_log_likelihood_is_stable_for_far_targets():
    """All samples far from y: the logsumexp is shifted, so no underflow to log(0)."""
    F = np.zeros((3, 2, 1))
    got = mc_dropout.predictive_log_likelihood(F, np.array([1e3, -1e3]), 4.0)
    assert_close(got, np.full(2, -2.0 * 1e6 + 0.5 * np.log(4.0 / (2 * np.pi))), EXACT_F64,
                 "far targets")


def test_predict_samples_contract():
    # checks (mc_dropout.7)
    model = _model()
    X, _, theta = _data(model, seed=9)
    cfg = mc_dropout.MCDropoutConfig(N, p=0.2, noise_precision=TAU)
    rng = np.random.default_rng(10)
    masks_list = [draw_masks(rng, model, 5, 0.2) for _ in range(4)]
    F = mc_dropout.predict_samples(mc_dropout.init(theta), X[:5], masks_list, cfg, model)
    assert F.shape == (4, 5, 2)
    assert_close(F[2], dr.masked_forward(model, theta, X[:5], masks_list[2], 1 / 0.8), EXACT_F64,
                 "pass 2")
    ones = [draw_masks(rng, model, 5, 0.0)] * 2
    F0 = mc_dropout.predict_samples(mc_dropout.init(theta), X[:5], ones,
                                    cfg._replace(p=0.0), model)
    assert_close(F0[1], model.forward(theta, X[:5]), EXACT_F64, "p = 0 is the plain network")


def test_draw_masks():
    model = _model()
    a = draw_masks(np.random.default_rng(11), model, 6, 0.4)
    b = draw_masks(np.random.default_rng(11), model, 6, 0.4)
    assert [z.shape for z in a] == [(6, 3), (6, 5), (6, 4)]
    assert all(np.array_equal(u, w) for u, w in zip(a, b))
    assert all(set(np.unique(z)) <= {0.0, 1.0} for z in a)
    assert draw_masks(np.random.default_rng(0), model, 2, 0.4,
                                 dtype=np.float32)[0].dtype == np.float32


def test_float32_step_matches_float64():
    model = _model()
    X, y, theta = _data(model, seed=12)
    cfg = mc_dropout.MCDropoutConfig(N, p=0.1, lengthscale=0.5, noise_precision=TAU, alpha=0.01)
    masks = draw_masks(np.random.default_rng(13), model, M, 0.1)
    s64, i64 = mc_dropout.step(mc_dropout.init(theta), mc_dropout.Batch(X[:M], y[:M]), masks,
                               cfg, model)
    f32 = lambda a: a.astype(np.float32)
    s32, i32 = mc_dropout.step(mc_dropout.init(f32(theta)),
                               mc_dropout.Batch(f32(X[:M]), f32(y[:M])), masks, cfg, model)
    assert s32.theta.dtype == s32.adam.v.dtype == np.float32
    assert_close(i32.g, i64.g, EXACT_F32, "float32 gradient")
    assert_close(s32.theta, s64.theta, EXACT_F32, "float32 theta")


_CFG = mc_dropout.MCDropoutConfig(N, p=0.2, noise_precision=TAU)
_BAD = [
    ({"cfg": _CFG._replace(p=1.0)}, r"p: expected a value in \[0.0, 1.0\)"),
    ({"cfg": _CFG._replace(p=-0.1)}, r"p: expected a value in \[0.0, 1.0\)"),
    ({"cfg": _CFG._replace(lengthscale=0.0)}, "lengthscale"),
    ({"cfg": _CFG._replace(noise_precision=1.0)},
     r"noise_precision: expected 2.0 \(the model's Gaussian noise_precision\)"),
    ({"cfg": _CFG._replace(beta2=1.0)}, "beta2"),
    ({"cfg": _CFG._replace(inverted=1)}, "inverted: expected True or False"),
    ({"masks": "drop"}, "masks: expected a list of 3 arrays"),
    ({"masks": lambda ms: ms[:2]}, "masks: expected a list of 3 arrays"),
    ({"masks": lambda ms: [ms[0][:, :2]] + ms[1:]}, r"masks\[0\]: expected shape \(8, 3\)"),
    ({"masks": lambda ms: ms[:1] + [2 * ms[1]] + ms[2:]}, r"masks\[1\]: expected binary"),
    ({"batch": mc_dropout.Batch(np.ones((M, P)), np.ones((M + 1, 2)))}, "batch.y: expected 8 rows"),
]


@pytest.mark.parametrize("over, match", _BAD, ids=[str(i) for i in range(len(_BAD))])
def test_bad_input_raises(over, match):
    model = _model()
    X, y, theta = _data(model)
    masks = draw_masks(np.random.default_rng(0), model, M, 0.2)
    kw = {"batch": mc_dropout.Batch(X[:M], y[:M]), "masks": masks, "cfg": _CFG}
    kw.update(over)
    if callable(kw["masks"]):
        kw["masks"] = kw["masks"](masks)
    with pytest.raises(ValueError, match=match):
        mc_dropout.step(mc_dropout.init(theta), kw["batch"], kw["masks"], kw["cfg"], model)


def test_bad_predictive_inputs_raise():
    model = _model("categorical")
    X, _, theta = _data(model)
    cfg = mc_dropout.MCDropoutConfig(N, p=0.2)
    with pytest.raises(ValueError, match="noise_precision: expected 1.0"):
        mc_dropout.step(mc_dropout.init(theta), mc_dropout.Batch(X[:2], np.array([0, 1])),
                        draw_masks(np.random.default_rng(0), model, 2, 0.2),
                        cfg._replace(noise_precision=3.0), model)
    good = draw_masks(np.random.default_rng(0), model, 4, 0.2)
    with pytest.raises(ValueError, match=r"masks_list\[1\]: masks\[0\]: expected shape \(4, 3\)"):
        mc_dropout.predict_samples(mc_dropout.init(theta), X[:4], [good, [good[0][:, :1], good[1]]],
                                   cfg, model)
    with pytest.raises(ValueError, match="masks_list: expected a non-empty list"):
        mc_dropout.predict_samples(mc_dropout.init(theta), X[:4], [], cfg, model)
    with pytest.raises(ValueError, match=r"noise_precision: expected a value in \(0.0, inf\)"):
        mc_dropout.predictive_log_likelihood(np.zeros((2, 3)), np.zeros(3), 0.0)
    with pytest.raises(ValueError, match=r"y: expected shape \(3, 2\) for 2 outputs"):
        mc_dropout.predictive_log_likelihood(np.zeros((2, 3, 2)), np.zeros(3), 1.0)
    with pytest.raises(ValueError, match=r"p: expected a value in \[0.0, 1.0\)"):
        draw_masks(np.random.default_rng(0), model, 2, 1.0)


def test_step_and_predictive_on_each_backend_match_dense(xp):
    """Two steps and the MC predictive on NumPy and, where a GPU is present, CuPy arrays,
    against the dense NumPy oracle and the hand-written predictive."""
    model = _model()
    X, y, theta0 = _data(model, seed=14)
    cfg = mc_dropout.MCDropoutConfig(N, p=0.2, lengthscale=0.7, noise_precision=TAU, alpha=0.02)
    lam = _lam_by_hand(model, 0.7, 0.2, True, True)
    rng = np.random.default_rng(15)
    state = mc_dropout.init(xp.asarray(theta0))
    theta, m, v = theta0, np.zeros(model.D), np.zeros(model.D)
    for t in range(2):
        idx = rng.permutation(N)[:M]
        masks = draw_masks(rng, model, M, 0.2)
        state, _ = mc_dropout.step(state, mc_dropout.Batch(xp.asarray(X[idx]), xp.asarray(y[idx])),
                                   [xp.asarray(z) for z in masks], cfg, model)
        theta, m, v = ref.mc_dropout_step(model, theta, m, v, t, X[idx], y[idx], masks, 1 / 0.8,
                                          N, lam, 0.02, 0.9, 0.999, 1e-8)
    assert_close(to_numpy(state.theta), theta, EXACT_F64, "theta")
    masks_list = [draw_masks(rng, model, 4, 0.2) for _ in range(3)]
    F = mc_dropout.predict_samples(state, xp.asarray(X[:4]),
                                   [[xp.asarray(z) for z in ms] for ms in masks_list], cfg, model)
    F_ref = np.stack([ref.masked_outputs(model, theta, X[:4], ms, 1 / 0.8) for ms in masks_list])
    assert_close(to_numpy(F), F_ref, EXACT_F64, "MC forward passes")
    ll = mc_dropout.predictive_log_likelihood(F, xp.asarray(y[:4]), TAU)
    logp = norm.logpdf(y[:4][None], loc=F_ref, scale=1 / np.sqrt(TAU)).sum(axis=2)
    assert_close(to_numpy(ll), logsumexp(logp, axis=0) - np.log(3), EXACT_F64, "predictive")


@pytest.mark.parametrize("inverted", [True, False])
def test_predict_samples_draws_are_the_printed_map(inverted):
    """The draws of MC dropout, written out here: masks z_k = (u >= p) for u ~ U(0, 1) drawn
    layer by layer (so P(z = 1) = 1 - p, the KEEP probability), and pass s of the predictive is
    the masked network a~_k = s z_k a_k, h_k = a~_k W_k + b_k, a_{k+1} = relu(h_k), f = h_{L-1},
    with W_k (n_k, n_{k+1}) row-major then b_k in theta and s = 1 / (1 - p) (inverted) or 1.
    Swapping keep and drop (u < p), the mask on the wrong side (on the outputs h_k), or a
    missing scale fails here."""
    # checks (mc_dropout.1), (mc_dropout.7)
    model = _model()
    X, _, theta = _data(model, seed=12)
    p = 0.3
    cfg = mc_dropout.MCDropoutConfig(N, p=p, noise_precision=TAU, inverted=inverted)
    masks_list = [draw_masks(np.random.default_rng(20 + s), model, 5, p) for s in range(3)]
    s_scale = 1 / (1 - p) if inverted else 1.0  # (mc_dropout.1)
    F = mc_dropout.predict_samples(mc_dropout.init(theta), X[:5], masks_list, cfg, model)
    for s, masks in enumerate(masks_list):
        u = np.random.default_rng(20 + s)
        z = [(u.random((5, n)) >= p).astype(float) for n in model.sizes[:-1]]  # z ~ Bern(1 - p)
        for zk, mk in zip(z, masks):
            np.testing.assert_array_equal(mk, zk)
        a, pos = X[:5], 0
        for k, (n_in, n_out) in enumerate(zip(model.sizes[:-1], model.sizes[1:])):
            W = theta[pos:pos + n_in * n_out].reshape(n_in, n_out)
            b = theta[pos + n_in * n_out:pos + n_in * n_out + n_out]
            pos += n_in * n_out + n_out
            h = (s_scale * z[k] * a) @ W + b  # (mc_dropout.1)
            a = np.maximum(h, 0.0) if k < len(z) - 1 else h
        assert pos == model.D
        assert_close(F[s], a, EXACT_F64, f"pass {s}")  # (mc_dropout.7)
    assert 0 < np.mean(np.concatenate([m.ravel() for m in masks_list[0]])) < 1


def test_paper_vs_note_weight_orientation_and_keep_probability():
    """Paper vs note, (mc_dropout.1): Gal and Ghahramani (2016), Sec. 3, give W_i the
    dimensions K_i x K_{i-1} (outputs x inputs, acting on a column input) and keep a unit when
    its binary variable is 1, with probability p_i; the note's W_k is (n_k, n_{k+1}) (rows =
    inputs, a row input times W) and z ~ Bernoulli(1 - p), p the DROP probability. The package's
    masked forward equals the paper's column form with W_i = W_k^T, and averaging it over every
    mask with keep probability 1 - p gives the mean weight (1 - p) W, the paper's p_i M_i with
    p_i = 1 - p (float64, all 2^3 masks enumerated)."""
    # checks (mc_dropout.1)
    rng = np.random.default_rng(11)
    model = MLP([3, 4, 2], activation="relu", likelihood="gaussian")
    theta = rng.standard_normal(model.D)
    X = rng.standard_normal((5, 3))
    masks = [rng.integers(0, 2, (5, n)).astype(float) for n in model.sizes[:-1]]
    params = model.unflatten(theta)
    for i in range(5):
        a = X[i]
        for k, (W, b) in enumerate(params):
            h = W.T @ (masks[k][i] * a) + b          # the paper's K_i x K_{i-1} matrix W^T
            a = np.maximum(h, 0.0) if k < len(params) - 1 else h
        assert_close(dr.masked_forward(model, theta, X, masks, 1.0)[i], a, EXACT_F64,
                     f"row {i}: column form")
    p = 0.3
    lin = MLP([3, 2], activation="relu", likelihood="gaussian")
    th = rng.standard_normal(lin.D)
    x = rng.standard_normal((1, 3))
    mean = np.zeros((1, 2))
    for bits in range(8):
        z = np.array([[(bits >> j) & 1 for j in range(3)]], dtype=float)
        weight = np.prod(np.where(z == 1.0, 1.0 - p, p))     # keep with probability 1 - p
        mean += weight * dr.masked_forward(lin, th, x, [z], 1.0)
    (W, b), = lin.unflatten(th)
    assert_close(mean, x @ ((1.0 - p) * W) + b, EXACT_F64, "E[W] = p_i M_i with p_i = 1 - p")
