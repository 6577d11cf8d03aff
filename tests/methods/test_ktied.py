"""The k-tied Normal (refbayes.methods.ktied) against autograd of the Monte Carlo objective
(tests/reference/ktied_dense.py), dense diagonal-Gaussian formulas, Eckart-Young, and
closed-form gradient moments of Bayesian linear regression."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refbayes.linalg import gaussian
from refbayes.methods import adam, bbb, ktied
from refbayes.models import MLP, LogisticRegression, SoftmaxRegression
from tests.reference import bbb_dense
from tests.reference import ktied_dense as ref
from tests.tolerances import EXACT_F32, EXACT_F64, MC_SIGMAS, assert_close

N, P, M = 40, 3, 8


def _mlp():
    return MLP([P, 5, 4, 2], activation="tanh", likelihood="categorical")


def _problem(model, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, model.sizes[0]))
    if model.likelihood.name == "gaussian":
        y = rng.standard_normal((N, model.sizes[-1]))
    elif model.likelihood.name == "bernoulli":
        y = rng.integers(0, 2, N).astype(float)
    else:
        y = rng.integers(0, model.sizes[-1], N)
    return X, y


def _start(model, k, seed=1, sigma0=0.3, jitter=0.4):
    rng = np.random.default_rng(seed)
    P_ = ktied.layout(model, k).P
    return ktied.init(0.5 * rng.standard_normal(model.D), model, k, sigma0,
                      rng.standard_normal(P_), jitter)


def _lam(D):
    return np.linspace(0.2, 3.0, D)


_MODELS = {"mlp": _mlp, "logistic": lambda: LogisticRegression(P),
           "gaussian-mlp": lambda: MLP([P, 4, 2], activation="sigmoid", likelihood="gaussian",
                                       noise_precision=2.0)}


@pytest.mark.parametrize("kl_weight", [1.0, 0.0])
@pytest.mark.parametrize("S", [1, 3])
@pytest.mark.parametrize("kind, k", [("mlp", 1), ("mlp", 2), ("mlp", (3, 1, 2)),
                                     ("logistic", 1), ("gaussian-mlp", 2)])
def test_gradients_are_autograd_of_the_mc_objective(kind, k, S, kl_weight):
    """grad_mu, grad_rho of the step = autograd of (N / (M S)) sum_s sum_i l_i(mu + sigma(rho)
    eps_s) + kl_weight KL with sigma built entry by entry (ktied.1)-(ktied.6)."""
    model = _MODELS[kind]()
    X, y = _problem(model)
    state = _start(model, k)
    rng = np.random.default_rng(2)
    eps, idx = rng.standard_normal((model.D, S)), rng.permutation(N)[:M]
    lam = _lam(model.D)
    _, info = ktied.step(state, ktied.Batch(X[idx], y[idx]), eps,
                         ktied.KTiedConfig(N, lam, kl_weight=kl_weight), model)
    kk = ktied.layout(model, k).k
    g_mu, g_rho = ref.grads(state.mu, state.rho, model, kk, eps, X[idx], y[idx], N, lam, kl_weight)
    assert_close(info.sigma, ref.sigma_of(state.rho, model, kk), EXACT_F64, "sigma (ktied.1)")
    assert_close(info.grad_mu, g_mu, EXACT_F64, "dF/dmu")
    assert_close(info.grad_rho, g_rho, EXACT_F64, "dF/drho (ktied.6)")
    F = ref.objective(state.mu, state.rho, model, kk, eps, X[idx], y[idx], N, lam, kl_weight)
    assert_close(-info.elbo, F, EXACT_F64, "negative ELBO estimate")


@pytest.mark.parametrize("kind, k", [("mlp", 2), ("logistic", 1)])
def test_steps_match_dense(kind, k):
    """Four steps, the same draws and rows, against autograd gradients and Adam by hand."""
    # checks (ktied.7)
    model = _MODELS[kind]()
    X, y = _problem(model, seed=5)
    lam = _lam(model.D)
    cfg = ktied.KTiedConfig(N, lam, alpha=0.05, beta1=0.8, beta2=0.99, eps_adam=1e-6,
                            kl_weight=0.9)
    state = _start(model, k)
    kk = state.k
    mu, rho = state.mu, state.rho
    m = v = np.zeros(model.D + len(rho))
    rng = np.random.default_rng(6)
    for t in range(4):
        idx, eps = rng.permutation(N)[:M], rng.standard_normal((model.D, 2))
        state, info = ktied.step(state, ktied.Batch(X[idx], y[idx]), eps, cfg, model)
        mu, rho, m, v = ref.step(mu, rho, m, v, t, model, kk, eps, X[idx], y[idx], N, lam, 0.9,
                                 0.05, 0.8, 0.99, 1e-6)
        assert_close(state.mu, mu, EXACT_F64, f"mu, step {t}")
        assert_close(state.rho, rho, EXACT_F64, f"rho, step {t}")
        assert_close(state.adam.v, v, EXACT_F64, f"Adam v, step {t}")
    assert state.t == 4 and state.k == kk


def test_kl_entropy_and_log_density_match_the_dense_gaussian():
    """(ktied.4) against linalg.gaussian's diagonal Gaussian and the dense KL formula."""
    model = _mlp()
    state = _start(model, 2)
    sigma = ktied.std(state, model)
    q = gaussian.DiagCov(state.mu, sigma ** 2)
    for lam in (_lam(model.D), 0.7):
        kl = ktied.kl_divergence(state, model, lam)
        prior = gaussian.DiagPrec(np.zeros(model.D), np.broadcast_to(lam, (model.D,)).astype(float))
        assert_close(kl, gaussian.kl(q, prior), EXACT_F64, "KL vs linalg.gaussian")
        assert_close(kl, bbb_dense.kl_dense(state.mu, sigma, lam), EXACT_F64, "KL dense")
    assert_close(ktied.entropy(state, model), gaussian.entropy(q), EXACT_F64, "entropy")
    x = ktied.sample(state, np.random.default_rng(3).standard_normal((model.D, 4)), model)
    assert_close(ktied.log_density(state, model, x),
                 np.array([gaussian.log_density(q, x[:, s]) for s in range(4)]), EXACT_F64,
                 "log q, (D, S)")
    assert_close(ktied.log_density(state, model, x[:, 0]), gaussian.log_density(q, x[:, 0]),
                 EXACT_F64, "log q, (D,)")


def test_sample_is_a_linear_map_with_the_right_covariance():
    model = _mlp()
    state = _start(model, (2, 3, 1))
    R = ktied.sample(state, np.eye(model.D), model) - state.mu[:, None]
    assert_close(R @ R.T, ktied.dense_covariance(state, model), EXACT_F64, "sigma is a root")


def test_k1_is_a_kronecker_product_of_diagonals():
    """(ktied.9): with k = 1 the variances of vec_row(W_l) are diag(u^2) kron diag(v^2)."""
    model = _mlp()
    state = _start(model, 1)
    sigma = ktied.std(state, model)
    lay = ktied.layout(model, 1)
    for l, (U, V, sb) in enumerate(ktied.scale_parameters(state, model)):
        m, n = model.sizes[l], model.sizes[l + 1]
        block = sigma[lay.w_theta[l]:lay.w_theta[l] + m * n] ** 2
        assert_close(np.diag(block), np.kron(np.diag(U[:, 0] ** 2), np.diag(V[:, 0] ** 2)),
                     EXACT_F64, f"layer {l}")
        assert_close(sigma[lay.b_theta[l]:lay.b_theta[l] + n], sb, EXACT_F64, "bias scale")


def test_paper_vs_note_k1_column_major_vec_is_diag_p_kron_diag_q():
    """(ktied.9), Paper vs note: the supplement (App. A) writes the k = 1 variances of vec(W),
    vec stacking COLUMNS, as P kron Q = diag(p) kron diag(q) = diag(vec(q p^T)) with q over the
    rows and p over the columns of W; refbayes' theta is row-major, where the same variances are
    diag(u^2) kron diag(v^2). Both from the package's sigma, float64, against dense Kronecker
    products: the Kronecker factors swap with the order of vec."""
    # checks (ktied.9)
    model = _mlp()
    state = _start(model, 1)
    sigma = ktied.std(state, model)
    lay = ktied.layout(model, 1)
    for l, (U, V, _) in enumerate(ktied.scale_parameters(state, model)):
        m, n = model.sizes[l], model.sizes[l + 1]
        W_var = (sigma[lay.w_theta[l]:lay.w_theta[l] + m * n] ** 2).reshape(m, n)  # row-major
        q, p = U[:, 0] ** 2, V[:, 0] ** 2                 # the paper's q (rows), p (columns)
        col = W_var.reshape(-1, order="F")                # vec stacking columns (the paper's)
        assert_close(np.diag(col), np.kron(np.diag(p), np.diag(q)), EXACT_F64, f"paper, layer {l}")
        assert_close(col, np.outer(q, p).reshape(-1, order="F"), EXACT_F64, "diag(vec(q p^T))")
        assert_close(np.diag(W_var.reshape(-1)), np.kron(np.diag(q), np.diag(p)), EXACT_F64,
                     f"note, layer {l}")
        if min(m, n) > 1:  # the two orders differ unless a factor is a scalar
            assert not np.allclose(np.kron(np.diag(p), np.diag(q)), np.kron(np.diag(q), np.diag(p)))


@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 7), n=st.integers(1, 7), seed=st.integers(0, 2 ** 31),
       spread=st.floats(0.0, 8.0))
def test_the_exact_factors_represent_any_positive_matrix(m, n, seed, spread):
    """(ktied.11): U V^T = A with U, V > 0 and k = min(m, n), for A spread over e^spread."""
    rng = np.random.default_rng(seed)
    A = np.exp(rng.uniform(-spread, 0.0, (m, n)))
    U, V = ktied._exact_factors(np, A)
    assert U.shape == (m, min(m, n)) and V.shape == (n, min(m, n))
    assert np.all(U > 0) and np.all(V > 0)
    assert_close(U @ V.T, A, EXACT_F64, "U V^T")


def test_a_mean_field_posterior_converts_exactly_and_keeps_its_elbo_terms():
    """k_l = min(m_l, n_l) represents a trained mean-field sigma exactly: the same sigma, KL,
    entropy, and the same gradient in mu and ELBO estimate as BBB from that posterior."""
    model = _mlp()
    rng = np.random.default_rng(7)
    mu, rho = 0.5 * rng.standard_normal(model.D), rng.uniform(-4.0, 1.0, model.D)
    sigma = bbb.softplus(rho)
    state = ktied.from_mean_field(mu, sigma, model)
    assert state.k == (3, 4, 2)
    assert_close(ktied.std(state, model), sigma, EXACT_F64, "sigma")
    lam = _lam(model.D)
    assert_close(ktied.kl_divergence(state, model, lam), bbb.kl_divergence(mu, rho, lam),
                 EXACT_F64, "KL")
    X, y = _problem(model)
    eps = rng.standard_normal((model.D, 2))
    cfg = ktied.KTiedConfig(N, lam)
    _, i_k = ktied.step(state, ktied.Batch(X[:M], y[:M]), eps, cfg, model)
    _, i_b = bbb.step(bbb.init(mu, rho0=rho), bbb.Batch(X[:M], y[:M]), eps, cfg, model)
    assert_close(i_k.elbo, i_b.elbo, EXACT_F64, "ELBO estimate")
    assert_close(i_k.grad_mu, i_b.grad_mu, EXACT_F64, "dF/dmu")
    # dF/dsigma is the mean-field dF/drho without the softplus factor (bbb.6), (ktied.5)
    assert_close(i_k.grad_sigma * bbb._sigmoid(np, rho), i_b.grad_rho, EXACT_F64, "dF/dsigma")


def test_a_symmetric_start_stays_rank_one():
    """(ktied.8): with xi = 0 the k columns of U (and V) get equal gradients and stay equal, so
    the tie is rank 1; the jittered start breaks it."""
    model = _mlp()
    X, y = _problem(model)
    cfg = ktied.KTiedConfig(N, 1.0, alpha=0.05)
    rng = np.random.default_rng(8)
    lay = ktied.layout(model, 3)
    for jitter in (0.0, 0.1):
        state = ktied.init(0.3 * np.ones(model.D), model, 3, 0.2, rng.standard_normal(lay.P),
                           jitter)
        for _ in range(5):
            idx = rng.permutation(N)[:M]
            state, _ = ktied.step(state, ktied.Batch(X[idx], y[idx]),
                                  rng.standard_normal((model.D, 1)), cfg, model)
        U = ktied.scale_parameters(state, model)[1][0]
        spread = np.max(np.abs(U - U[:, :1]))
        if jitter == 0.0:
            assert spread == 0.0, spread
        else:
            assert spread > 1e-3, spread


def test_init_starts_at_sigma0():
    model = _mlp()
    lay = ktied.layout(model, 3)
    state = ktied.init(np.zeros(model.D), model, 3, 0.0486, np.zeros(lay.P), 0.1)
    assert_close(ktied.std(state, model), np.full(model.D, 0.0486), EXACT_F64, "A = sigma0")
    assert state.adam.m.shape == (model.D + lay.P,) and state.t == 0


def test_parameter_counts_are_the_papers():
    """(ktied.10): the paper's MNIST MLP, 957k / 482k / 484k / 486k."""
    model = MLP([784, 400, 400, 10], likelihood="categorical")
    assert model.D == 478_410
    assert ktied.n_variational_params(model) == 956_820
    assert [ktied.n_variational_params(model, k) for k in (1, 2, 3)] == [481_614, 484_008, 486_402]
    assert [round(ktied.n_variational_params(model, k) / 1000) for k in (None, 1, 2, 3)] == \
        [957, 482, 484, 486]


@settings(max_examples=30, deadline=None)
@given(m=st.integers(2, 8), n=st.integers(2, 8), seed=st.integers(0, 2 ** 31))
def test_truncation_is_eckart_young_and_fractions_sum_to_one(m, n, seed):
    """(ktied.12)-(ktied.13): |A - A^(k)|_F^2 = sum_{i > k} gamma_i^2 = |A|_F^2 (1 - sum of the
    first k fractions), and no other rank-k matrix tried is closer."""
    rng = np.random.default_rng(seed)
    A = np.exp(rng.standard_normal((m, n)))
    frac = ktied.explained_variance(A)
    assert frac.shape == (min(m, n),) and np.all(np.diff(frac) <= 0)
    assert abs(frac.sum() - 1.0) <= EXACT_F64
    total = np.sum(A ** 2)
    for k in range(1, min(m, n) + 1):
        Ak = ktied.truncate(A, k)
        assert np.linalg.matrix_rank(Ak) <= k
        err2 = np.sum((A - Ak) ** 2)
        assert abs(err2 - total * (1.0 - frac[:k].sum())) <= EXACT_F64 * total
        for _ in range(3):
            other = rng.standard_normal((m, k)) @ rng.standard_normal((k, n)) + Ak
            other = np.linalg.svd(other)[0][:, :k] @ np.diag(np.linalg.svd(other)[1][:k]) \
                @ np.linalg.svd(other)[2][:k]
            assert np.sum((A - other) ** 2) >= err2 * (1 - EXACT_F64)
    assert_close(ktied.truncate(A, min(m, n)), A, EXACT_F64, "full rank")


def test_truncate_sigma_replaces_weight_blocks_only():
    model = _mlp()
    rng = np.random.default_rng(9)
    sigma = np.exp(rng.uniform(-3.0, 0.0, model.D))
    out = ktied.truncate_sigma(sigma, model, 1)
    lay = ktied.layout(model, 1)
    for l in range(3):
        m, n = model.sizes[l], model.sizes[l + 1]
        A = sigma[lay.w_theta[l]:lay.w_theta[l] + m * n].reshape(m, n)
        assert_close(out[lay.w_theta[l]:lay.w_theta[l] + m * n],
                     np.abs(ktied.truncate(A, 1)).ravel(), EXACT_F64, f"W_{l + 1}")
        assert np.array_equal(out[lay.b_theta[l]:lay.b_theta[l] + n],
                              sigma[lay.b_theta[l]:lay.b_theta[l] + n])
    with pytest.raises(ValueError, match=r"k: expected an integer in \[1, 2\]"):
        ktied.truncate_sigma(sigma, model, 3)


def _linear_regression(seed=7, tau=4.0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, P))
    y = X @ rng.standard_normal(P) + 0.5 * rng.standard_normal(N)
    Xd = np.concatenate([X, np.ones((N, 1))], axis=1)
    A, b = tau * Xd.T @ Xd, tau * Xd.T @ y
    return X, y, A, b, MLP([P, 1], likelihood="gaussian", noise_precision=tau)


def test_snr_of_a_gaussian_gradient_with_axis_draws_is_exact():
    """(ktied.15): full batch on l = tau/2 |y - X~ theta|^2, grad_mu = A (mu + sigma eps) - b +
    lam mu has mean (A + lam) mu - b and variance sum_k A_jk^2 sigma_k^2. Over the axis draws
    eps = sqrt(D) [e_k, -e_k] (R = 2D) the sample mean and the ddof-0 variance equal these
    exactly, so snr = (R - 1) / R * mean^2 / var to rounding."""
    X, y, A, b, model = _linear_regression()
    D = model.D
    state = _start(model, 1, seed=11)
    sigma = ktied.std(state, model)
    lam = 0.5
    cfg = ktied.KTiedConfig(N, lam)
    axis = math.sqrt(D) * np.concatenate([np.eye(D), -np.eye(D)], axis=1)
    G = np.stack([ktied.step(state, ktied.Batch(X, y), axis[:, [r]], cfg, model)[1].grad_mu
                  for r in range(2 * D)])
    mean = (A + lam * np.eye(D)) @ state.mu - b
    var = (A ** 2) @ (sigma ** 2)
    R = 2 * D
    assert_close(ktied.snr(G), (R - 1) / R * mean ** 2 / var, EXACT_F64, "SNR of dF/dmu")


def test_snr_of_the_sigma_gradient_matches_its_closed_form():
    """(ktied.15) by Monte Carlo, R = 4000 Gaussian draws: g_sigma_j = (A theta - b)_j eps_j has
    mean A_jj sigma_j and variance a_j^2 + 2 A_jj^2 sigma_j^2 + sum_{k != j} A_jk^2 sigma_k^2
    (a = A mu - b; Isserlis); the estimate is within MC_SIGMAS standard deviations of the
    closed-form SNR (delta method: sd = SNR sqrt((4 / SNR + 2) / R) for a near-Gaussian g, the
    4th-moment term of a non-Gaussian g bounded by using the sample's own spread)."""
    X, y, A, b, model = _linear_regression()
    D = model.D
    state = _start(model, 1, seed=12, sigma0=0.8)
    sigma = ktied.std(state, model)
    cfg = ktied.KTiedConfig(N, 1.0, kl_weight=0.0)
    rng = np.random.default_rng(13)
    R = 4000
    G = np.stack([ktied.step(state, ktied.Batch(X, y), rng.standard_normal((D, 1)), cfg,
                             model)[1].g_sigma for _ in range(R)])
    a = A @ state.mu - b
    Ad = np.diag(A)
    mean = Ad * sigma
    var = a ** 2 + 2 * Ad ** 2 * sigma ** 2 + (A ** 2) @ (sigma ** 2) - Ad ** 2 * sigma ** 2
    want = mean ** 2 / var
    got = ktied.snr(G)
    # spread of the estimator from the batch-means of 20 blocks: no distributional assumption
    blocks = np.stack([ktied.snr(Gb) for Gb in np.split(G, 20)])
    sd = blocks.std(axis=0, ddof=1) / math.sqrt(20)
    assert np.all(np.abs(got - want) <= MC_SIGMAS * sd), (got, want, sd)
    # the transcribed E[g^2] / Var[g] reading is 1 + this: in sample moments mean(g^2) =
    # mean(g)^2 + (R - 1) / R var(g) (ddof 1)
    ratio = np.mean(G ** 2, axis=0) / G.var(axis=0, ddof=1)
    assert_close(ratio, got + (R - 1) / R, EXACT_F64, "E[g^2] / Var[g] = SNR + 1")


def test_snr_of_a_deterministic_gradient_is_inf_not_rounding_noise():
    """A column whose R gradients are all equal (no data term reaches the parameter) has
    variance exactly 0 and SNR inf, even where its mean has no exact binary representation (the
    naive two-pass variance leaves ~1e-33 and an SNR of ~1e30); a zero column gives nan."""
    c = 0.1 + 1e-3 * np.arange(7)
    G = np.column_stack([np.tile(c, (50, 1)), np.zeros((50, 1)),
                         np.random.default_rng(0).standard_normal((50, 1))])
    with np.errstate(divide="ignore", invalid="ignore"):
        snr = ktied.snr(G)
    assert np.all(np.isinf(snr[:7])) and np.isnan(snr[7]) and np.isfinite(snr[8])


def test_evaluate_scores_a_posterior():
    """(ktied.14) against a by-hand computation with the same draws."""
    model = _mlp()
    X, y = _problem(model, seed=14)
    state = _start(model, 2)
    sigma = ktied.std(state, model)
    eps = np.random.default_rng(15).standard_normal((model.D, 3))
    ev = ktied.evaluate(state.mu, sigma, model, ktied.Batch(X[:30], y[:30]),
                        ktied.Batch(X[30:], y[30:]), eps, 1.0)
    theta = state.mu[:, None] + sigma[:, None] * eps
    probs = np.mean([model.predict(theta[:, s], X[30:]) for s in range(3)], axis=0)
    nll = -np.mean(np.log(probs[np.arange(10), y[30:]]))
    kl = bbb_dense.kl_dense(state.mu, sigma, 1.0)
    loss = np.mean([model.loss(theta[:, s], X[:30], y[:30]) for s in range(3)])
    assert_close(ev.nll, nll, EXACT_F64, "NLL")
    assert_close(ev.kl, kl, EXACT_F64, "KL")
    assert_close(ev.neg_elbo, (loss + kl) / 30, EXACT_F64, "-ELBO / N")
    assert ev.accuracy == np.mean(np.argmax(probs, axis=1) == y[30:])
    per_nll = -np.log(probs[np.arange(10), y[30:]])
    assert_close(ev.nll_se, np.std(per_nll, ddof=1) / math.sqrt(10), EXACT_F64, "NLL se")
    hits = np.argmax(probs, axis=1) == y[30:]
    assert_close(ev.accuracy_se, np.std(hits, ddof=1) / math.sqrt(10), EXACT_F64, "accuracy se")
    per_loss = np.mean([[model.loss(theta[:, s], X[n:n + 1], y[n:n + 1]) for s in range(3)]
                        for n in range(30)], axis=1)
    assert_close(ev.neg_elbo_se, np.std(per_loss, ddof=1) / math.sqrt(30), EXACT_F64, "ELBO se")


def test_info_contract():
    model = _mlp()
    X, y = _problem(model)
    eps = np.random.default_rng(9).standard_normal((model.D, 3))
    state = _start(model, 2)
    new, info = ktied.step(state, ktied.Batch(X[:M], y[:M]), eps, ktied.KTiedConfig(N, 1.0), model)
    D, Pk = model.D, ktied.layout(model, 2).P
    assert info.theta.shape == (D, 3) and info.g.shape == (3, D)
    assert info.delta.shape == (D + Pk,) and info.grad_rho.shape == (Pk,)
    assert np.ndim(info.kl) == np.ndim(info.elbo) == 0
    assert_close(info.theta, ktied.sample(state, eps, model), EXACT_F64, "draws")
    assert new.mu is info.mu and new.rho is info.rho and new.t == 1


def test_float32_step_matches_float64():
    model = _mlp()
    X, y = _problem(model)
    state = _start(model, 2)
    eps = np.random.default_rng(10).standard_normal((model.D, 2))
    cfg = ktied.KTiedConfig(N, _lam(model.D), alpha=0.01)
    n64, i64 = ktied.step(state, ktied.Batch(X[:M], y[:M]), eps, cfg, model)
    f32 = lambda a: a.astype(np.float32)  # noqa: E731
    s32 = state._replace(mu=f32(state.mu), rho=f32(state.rho),
                         adam=state.adam._replace(m=f32(state.adam.m), v=f32(state.adam.v)))
    n32, i32 = ktied.step(s32, ktied.Batch(f32(X[:M]), y[:M]), f32(eps),
                          cfg._replace(lam=f32(_lam(model.D))), model)
    assert n32.mu.dtype == n32.rho.dtype == n32.adam.v.dtype == np.float32
    assert_close(i32.grad_rho, i64.grad_rho, EXACT_F32, "float32 dF/drho")
    assert_close(n32.rho, n64.rho, EXACT_F32, "float32 rho")


def test_step_on_each_backend_matches_numpy(xp):
    """Two steps on NumPy and, where a GPU is present, CuPy arrays, against float64 NumPy."""
    model = _mlp()
    X, y = _problem(model, seed=16)
    state0 = _start(model, 2)
    to = lambda a: xp.asarray(a)  # noqa: E731
    state = state0._replace(mu=to(state0.mu), rho=to(state0.rho),
                            adam=adam.adam_init(to(np.zeros(len(state0.adam.m)))))
    ref_state = state0
    rng = np.random.default_rng(17)
    cfg = ktied.KTiedConfig(N, 1.0, alpha=0.05)
    for _ in range(2):
        idx, eps = rng.permutation(N)[:M], rng.standard_normal((model.D, 2))
        state, _ = ktied.step(state, ktied.Batch(to(X[idx]), to(y[idx])), to(eps), cfg, model)
        ref_state, _ = ktied.step(ref_state, ktied.Batch(X[idx], y[idx]), eps, cfg, model)
    got = state.rho if xp is np else state.rho.get()
    assert_close(got, ref_state.rho, EXACT_F64, "rho after two steps")


_CFG = ktied.KTiedConfig(N, 1.0)
_BAD_STEP = [
    ({"cfg": _CFG._replace(lam=0.0)}, "lam: expected a finite prior precision > 0"),
    ({"cfg": _CFG._replace(alpha=-1.0)}, "alpha"),
    ({"cfg": _CFG._replace(N=3)}, "batch.X: expected 1 <= M <= N = 3"),
    ({"eps": np.ones((5, 2))}, r"eps: expected shape \(D, S\)"),
    ({"model": MLP([P, 5, 4, 3], likelihood="categorical")}, r"state.mu: expected shape \(59\), got \(54,\)"),
    ({"cfg": {"N": N}}, "cfg: expected a BBBConfig"),
]


@pytest.mark.parametrize("over, match", _BAD_STEP, ids=[str(i) for i in range(len(_BAD_STEP))])
def test_bad_step_input_raises(over, match):
    model = _mlp()
    X, y = _problem(model)
    kw = {"batch": ktied.Batch(X[:M], y[:M]), "eps": np.ones((model.D, 2)), "cfg": _CFG,
          "model": model}
    kw.update(over)
    with pytest.raises(ValueError, match=match):
        ktied.step(_start(model, 2), kw["batch"], kw["eps"], kw["cfg"], kw["model"])


def test_bad_init_state_and_analysis_input_raise():
    model = _mlp()
    P2 = ktied.layout(model, 2).P
    with pytest.raises(ValueError, match="k: expected an integer >= 1 or a sequence of 3"):
        ktied.layout(model, 0)
    with pytest.raises(ValueError, match="k: expected an integer >= 1 or a sequence of 3"):
        ktied.layout(model, (1, 2))
    with pytest.raises(ValueError, match="sigma0: expected a finite number > 0"):
        ktied.init(np.zeros(model.D), model, 2, 0.0, np.zeros(P2))
    with pytest.raises(ValueError, match="jitter: expected a finite number >= 0"):
        ktied.init(np.zeros(model.D), model, 2, 0.1, np.zeros(P2), -1.0)
    with pytest.raises(ValueError, match=rf"xi: expected shape \({P2}\), got \({P2 + 1},\)"):
        ktied.init(np.zeros(model.D), model, 2, 0.1, np.zeros(P2 + 1))
    s = _start(model, 2)
    with pytest.raises(ValueError, match="state: expected a KTiedState"):
        ktied.std(s.mu, model)
    with pytest.raises(ValueError, match=r"state.rho: expected shape"):
        ktied.std(s._replace(rho=s.rho[:3]), model)
    with pytest.raises(ValueError, match="sigma: expected > 0 everywhere"):
        ktied.from_mean_field(np.zeros(model.D), np.zeros(model.D), model)
    with pytest.raises(ValueError, match="G: expected at least 2 gradients"):
        ktied.snr(np.ones((1, 3)))
    with pytest.raises(ValueError, match="A: expected a non-zero matrix"):
        ktied.explained_variance(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="model: expected a classifier"):
        reg = MLP([P, 2], likelihood="gaussian")
        ktied.evaluate(np.zeros(reg.D), np.ones(reg.D), reg, (np.ones((2, P)), np.ones(2)),
                       (np.ones((2, P)), np.ones(2)), np.ones((reg.D, 1)), 1.0)
    with pytest.raises(ValueError, match=r"test.X: expected shape"):
        ktied.evaluate(s.mu, ktied.std(s, model), model, (np.ones((4, P)), np.zeros(4, int)),
                       (np.ones((4, P + 1)), np.zeros(4, int)), np.ones((model.D, 1)), 1.0)


def test_softmax_regression_has_one_tied_layer():
    model = SoftmaxRegression(P, 4)
    state = _start(model, 2)
    assert ktied.layout(model, 2).P == 2 * (model.sizes[0] + 4) + (4 if model.bias else 0)
    assert_close(ktied.std(state, model), ref.sigma_of(state.rho, model, state.k), EXACT_F64,
                 "sigma")


def test_sample_draws_are_the_printed_map():
    """Draw by draw, written out here: rho walked in its printed order concat_l (vec R^U_l,
    vec R^V_l, r^b_l), A_l = softplus(R^U_l) softplus(R^V_l)^T, sigma = concat_l (vec A_l,
    softplus(r^b_l)) in theta's order, theta_s = mu + sigma * eps_s. The covariance test
    above sees only R R^T, blind to a sign flip of the perturbation; a transposed A_l (U^T
    against V, or rows and columns of W_l swapped) changes the draws and is caught here."""
    # checks (ktied.1), (ktied.2)
    model = _mlp()
    k = (2, 3, 1)
    state = _start(model, k)
    eps = np.hstack([np.random.default_rng(7).standard_normal((model.D, 3)), np.eye(model.D)])
    def sp(x):  # softplus, (bbb.1)
        return np.log1p(np.exp(x))

    parts, r = [], 0
    for l, c in enumerate(k):
        m, n = model.sizes[l], model.sizes[l + 1]
        U = sp(state.rho[r:r + m * c].reshape(m, c))
        r += m * c
        V = sp(state.rho[r:r + n * c].reshape(n, c))
        r += n * c
        parts += [(U @ V.T).reshape(-1), sp(state.rho[r:r + n])]  # (ktied.1): W_l row-major, b_l
        r += n
    assert r == state.rho.shape[0]
    sigma = np.concatenate(parts)
    by_hand = state.mu[:, None] + sigma[:, None] * eps  # (ktied.2)
    assert_close(ktied.sample(state, eps, model), by_hand, EXACT_F64, "draws")
    assert np.max(np.abs(by_hand - state.mu[:, None])) > 1e-2  # the perturbation is not negligible


def test_a_layers_snr_figure_is_the_median_with_the_mean_beside():
    """(ktied.15): a layer's SNR is summarised by the MEDIAN of ktied.snr over its parameters,
    the mean beside it (both over the finite values; a deterministic gradient's inf is not
    counted), as the experiment's snr.csv and report table print it ("median (mean)"). Fed
    gradients with known per-parameter SNRs, through the experiment's own summary."""
    # checks (ktied.15)
    from types import SimpleNamespace

    from refbayes.experiments import ktied as experiment
    R, M = 6, 2
    g = np.random.default_rng(15).standard_normal((R, 5))
    g[:, 3] += 40.0          # one near-deterministic parameter: a huge SNR drags the mean
    g[:, 4] = 1.5            # a deterministic one: SNR inf, not counted
    queue = list(g)

    def step(state, batch, eps):
        row = queue.pop(0)
        return None, SimpleNamespace(grad_rho=row, grad_mu=row[:2])

    method = SimpleNamespace(step=step, scale_slices=[slice(0, 5)], mean_slices=[slice(0, 2)])
    data = SimpleNamespace(train=(np.zeros((4, 1)), np.zeros(4)))
    state = SimpleNamespace(mu=np.zeros(2))
    rows = experiment._snr(method, state, data, seed=0, t=1, R=R, M=M)
    scale = next(r for r in rows if r["kind"] == "scale")
    snr = ktied.snr(g)
    finite = snr[np.isfinite(snr)]
    assert np.isinf(snr[4]) and scale["n"] == 5 and scale["n_finite"] == 4
    assert scale["median"] == float(np.median(finite)) and scale["mean"] == float(np.mean(finite))
    assert scale["mean"] > 10 * scale["median"]  # the two summaries are not interchangeable
