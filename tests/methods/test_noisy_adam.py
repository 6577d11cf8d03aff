"""Noisy Adam (refbayes.methods.noisy_adam) against a dense ascent-form re-implementation of
Algorithm 1 of Zhang et al. (2018), its reduction to the 2018 VOGN step and to Vadam, the errata of
the issue's printed lines, and the fixed point on Bayesian linear regression."""
import numpy as np
import pytest

from refbayes.backend import to_numpy
from refbayes.datasets import make_logistic_regression
from refbayes.methods import noisy_adam as na
from refbayes.methods import vadam
from refbayes.models import MLP, LogisticRegression, add_intercept
from tests.reference import noisy_adam_dense as ref
from tests.reference import vadam_dense
from tests.tolerances import CONVERGED, EXACT_F32, EXACT_F64, assert_close

N, P, M = 40, 5, 8
D = P + 1
ETA = np.array([1.0, 0.5, 2.0, 1.0, 0.3, 1e-2])


def _problem(seed=0):
    s = make_logistic_regression(N, P, seed)
    return s.X, s.y.astype(float), LogisticRegression(P)


def _start(seed=1):
    rng = np.random.default_rng(seed)
    st = na.init(0.3 * rng.standard_normal(D), rng.uniform(0.0, 0.3, D))
    return st._replace(m=0.1 * rng.standard_normal(D))


def _batches(steps, S, seed=2):
    rng = np.random.default_rng(seed)
    return [(rng.permutation(N)[:M], rng.standard_normal((D, S))) for _ in range(steps)]


@pytest.mark.parametrize("squares", ["minibatch", "per_example"])
@pytest.mark.parametrize("kl, gamma_ex", [(1.0, 0.0), (0.5, 0.1)])
@pytest.mark.parametrize("beta1", [0.0, 0.9])
@pytest.mark.parametrize("S", [1, 3])
def test_steps_match_dense(S, beta1, kl, gamma_ex, squares):
    # checks (noisy_adam.3), (noisy_adam.5), (noisy_adam.6), (noisy_adam.7), (noisy_adam.8), (noisy_adam.9), (noisy_adam.10)
    X, y, model = _problem()
    Xd = add_intercept(X)
    cfg = na.NoisyAdamConfig(N, ETA, alpha=0.05, beta1=beta1, beta2=0.8, kl_weight=kl,
                             gamma_ex=gamma_ex, squares=squares)
    state = _start()
    mu, m, f = state.mu, -state.m, state.f  # the dense m is the ascent-form momentum
    for t, (idx, eps) in enumerate(_batches(4, S)):
        state, info = na.step(state, na.Batch(X[idx], y[idx]), eps, cfg, model)
        mu, m, f, w = ref.noisy_adam_step(mu, m, f, t, vadam_dense.logistic_grads(Xd[idx], y[idx]),
                                          eps, N, ETA, 0.05, beta1, 0.8, kl, gamma_ex, squares)
        assert_close(info.w, w, EXACT_F64, f"draws, step {t}")
        assert_close(state.m, -m, EXACT_F64, f"m, step {t}")
        assert_close(state.f, f, EXACT_F64, f"f, step {t}")
        assert_close(state.mu, mu, EXACT_F64, f"mean, step {t}")
    assert state.t == 4


def test_mlp_steps_match_autograd_dense():
    rng = np.random.default_rng(5)
    model = MLP([3, 4, 1], activation="tanh", likelihood="bernoulli")
    X, y = rng.standard_normal((N, 3)), (rng.random(N) < 0.5).astype(float)
    cfg = na.NoisyAdamConfig(N, 0.8, alpha=0.02, beta1=0.9, beta2=0.99, squares="per_example")
    state = na.init(model.init_theta(rng), 0.05)
    mu, m, f = state.mu, state.m, state.f
    for t in range(3):
        idx, eps = rng.permutation(N)[:M], rng.standard_normal((model.D, 2))
        state, _ = na.step(state, na.Batch(X[idx], y[idx]), eps, cfg, model)
        mu, m, f, _ = ref.noisy_adam_step(mu, m, f, t,
                                          vadam_dense.autograd_grads(model, X[idx], y[idx]), eps,
                                          N, 0.8, 0.02, 0.9, 0.99, squares="per_example")
        assert_close(state.f, f, EXACT_F64, f"f, step {t}")
        assert_close(state.mu, mu, EXACT_F64, f"mean, step {t}")


def test_reduces_to_vogn_2018_at_eps_zero():
    """beta1 = 0, kl_weight = 1, gamma_ex = 0, per-example squares: with eps = 0 (so the prior
    term at the draw is at mu) Noisy Adam is the 2018 VOGN step with lam = eta,
    beta_t = 1 - beta2, alpha_t = alpha, and the same Vadam(beta1=0, no bias correction,
    sqrt=False) step; with eps != 0 the draws agree but the prior term is at w, not mu."""
    X, y, model = _problem()
    Xd = add_intercept(X)
    cfg = na.NoisyAdamConfig(N, ETA, alpha=0.3, beta1=0.0, beta2=0.8, squares="per_example")
    vcfg = vadam.VadamConfig(N, ETA, alpha=0.3, beta1=0.0, beta2=0.8, bias_correction=False,
                             squares="per_example", sqrt=False)
    state, vstate = _start(), vadam.init(_start().mu, _start().f)
    mu, s = state.mu, state.f
    for t, (idx, eps) in enumerate(_batches(4, 1)):
        zero = np.zeros_like(eps)
        state, _ = na.step(state, na.Batch(X[idx], y[idx]), zero, cfg, model)
        vstate, _ = vadam.step(vstate, vadam.Batch(X[idx], y[idx]), zero, vcfg, model)
        mu, s, _ = vadam_dense.vogn_2018_step(mu, s, vadam_dense.logistic_grads(Xd[idx], y[idx]),
                                              zero, N, ETA, 0.3, 0.2)
        assert_close(state.f, s, EXACT_F64, f"f, step {t}")
        assert_close(state.mu, mu, EXACT_F64, f"mean vs VOGN 2018, step {t}")
        assert_close(state.mu, vstate.mu, EXACT_F64, f"mean vs Vadam, step {t}")
    (idx, eps), = _batches(1, 1)
    _, info = na.step(_start(), na.Batch(X[idx], y[idx]), eps, cfg, model)
    _, vinfo = vadam.step(vadam.init(_start().mu, _start().f), vadam.Batch(X[idx], y[idx]), eps,
                          vcfg, model)
    assert_close(info.w, vinfo.theta, EXACT_F64, "same draws: (1/N)/(f + eta/N) = 1/(N f + eta)")
    assert_close(info.v - vinfo.m, ETA / N * (info.w[:, 0] - _start().mu), EXACT_F64,
                 "prior term at w instead of mu")


def _linear_regression(seed=3, tau=4.0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, P))
    y = X @ rng.standard_normal(P) + 0.5 * rng.standard_normal(N)
    return X, y, add_intercept(X), MLP([P, 1], likelihood="gaussian", noise_precision=tau)


@pytest.mark.parametrize("kl", [1.0, 0.5])
@pytest.mark.parametrize("beta1", [0.0, 0.9])
@pytest.mark.parametrize("squares, alpha, steps", [("minibatch", 0.003, 3000),
                                                   ("per_example", 0.05, 2000)])
def test_fixed_point_on_linear_regression(squares, alpha, steps, beta1, kl):
    """eps = 0, full batch: v = 0 iff g_hat + gamma_in mu = 0, i.e. the mean converges to the
    posterior mean under the prior precision kl_weight eta (the posterior mean for kl_weight = 1);
    f converges to the squared-gradient estimate there, not to the mean-field optimum."""
    # checks (noisy_adam.1), (noisy_adam.11): the optimum of the KL-weighted objective
    X, y, Xd, model = _linear_regression()
    eta = np.ones(D)
    post_mu = np.linalg.solve(4.0 * Xd.T @ Xd + np.diag(kl * eta), 4.0 * Xd.T @ y)
    cfg = na.NoisyAdamConfig(N, eta, alpha=alpha, beta1=beta1, beta2=0.9, kl_weight=kl,
                             squares=squares)
    state = na.init(np.zeros(D))
    for _ in range(steps):
        state, _ = na.step(state, na.Batch(X, y), np.zeros((D, 1)), cfg, model)
    assert_close(state.mu, post_mu, CONVERGED, "mean vs posterior mean")
    G = vadam_dense.linear_gaussian_grads(Xd, y, 4.0)(post_mu)
    f_star = G.mean(0) ** 2 if squares == "minibatch" else (G ** 2).mean(0)
    assert_close(state.f, f_star, CONVERGED, "f vs squared gradients at the mean")
    assert_close(na.prec_diag(state, cfg), N / kl * (f_star + kl * eta / N), CONVERGED,
                 "precision (N / kl)(f + gamma_in)")
    mf_opt = 4.0 * np.sum(Xd ** 2, axis=0) + kl * eta
    assert np.max(np.abs(kl * na.prec_diag(state, cfg) - mf_opt) / mf_opt) > 0.05


def test_erratum_sign_of_the_prior_term():
    """(E-noisy_adam.1) The issue prints m <- beta1 m + (1 - beta1)(g + gamma_in w) with g the
    LOG-likelihood gradient; Algorithm 1 / the derivation have g - gamma_in w. The printed sign
    fails the dense check, and its fixed point (eps = 0, full batch) solves
    (tau X~^T X~ - eta) mu = tau X~^T y: the prior pushes AWAY from 0. na.step itself, iterated
    the same way, lands on the posterior mean (eta > 0 is enforced, so the printed sign cannot be
    fed to it)."""
    X, y, model = _problem()
    Xd = add_intercept(X)
    (idx, eps), = _batches(1, 1)
    st = _start()
    new, _ = na.step(st, na.Batch(X[idx], y[idx]), eps, na.NoisyAdamConfig(N, ETA), model)
    args = (st.mu, -st.m, st.f, 0, vadam_dense.logistic_grads(Xd[idx], y[idx]), eps, N, ETA,
            1e-3, 0.9, 0.999)
    derived, *_ = ref.noisy_adam_step(*args)
    printed, *_ = ref.noisy_adam_step(*args, prior_sign=+1.0)
    assert_close(new.mu - st.mu, derived - st.mu, EXACT_F64, "derived line, the step")
    err = np.max(np.abs(printed - derived)) / np.max(np.abs(derived - st.mu))
    assert err > 1e-2, err

    Xl, yl, Xdl, lin = _linear_regression()
    eta = np.ones(D)
    grads = vadam_dense.linear_gaussian_grads(Xdl, yl, 4.0)
    mu, m, f = np.zeros(D), np.zeros(D), np.zeros(D)
    for t in range(2500):
        mu, m, f, _ = ref.noisy_adam_step(mu, m, f, t, grads, np.zeros((D, 1)), N, eta, 0.05, 0.9,
                                          0.9, squares="per_example", prior_sign=+1.0)
    wrong = np.linalg.solve(4.0 * Xdl.T @ Xdl - np.diag(eta), 4.0 * Xdl.T @ yl)
    post = np.linalg.solve(4.0 * Xdl.T @ Xdl + np.diag(eta), 4.0 * Xdl.T @ yl)
    assert_close(mu, wrong, CONVERGED, "printed sign's fixed point")
    assert np.max(np.abs(mu - post)) / np.max(np.abs(post)) > 1e-3
    cfg = na.NoisyAdamConfig(N, eta, alpha=0.05, beta1=0.9, beta2=0.9, squares="per_example")
    state = na.init(np.zeros(D))
    for _ in range(2500):
        state, _ = na.step(state, na.Batch(Xl, yl), np.zeros((D, 1)), cfg, lin)
    assert_close(state.mu, post, CONVERGED, "na.step lands on the posterior mean")


def test_erratum_dataset_gradient_scaling():
    """(E-noisy_adam.2) g must be the minibatch MEAN log-likelihood gradient (gamma_in = eta / N is
    per example). Read as grad log p(D | w) summed over the (full) batch, the fixed point is the
    posterior under eta / N. na.step itself lands on the posterior mean; fed N times the
    per-example gradients (the summed reading, through a model with noise precision N tau_n) it
    lands on the eta / N one."""
    Xl, yl, Xdl, lin = _linear_regression()
    eta = np.ones(D)
    grads = vadam_dense.linear_gaussian_grads(Xdl, yl, 4.0)
    mu, m, f = np.zeros(D), np.zeros(D), np.zeros(D)
    for t in range(1000):  # alpha ~ N times larger: f grows like N^2, the gradient like N
        mu, m, f, _ = ref.noisy_adam_step(mu, m, f, t, grads, np.zeros((D, 1)), N, eta, 5.0, 0.9,
                                          0.9, squares="per_example", grad_scale=N)
    wrong = np.linalg.solve(4.0 * Xdl.T @ Xdl + np.diag(eta / N), 4.0 * Xdl.T @ yl)
    post = np.linalg.solve(4.0 * Xdl.T @ Xdl + np.diag(eta), 4.0 * Xdl.T @ yl)
    assert_close(mu, wrong, CONVERGED, "summed-gradient reading's fixed point")
    assert np.max(np.abs(mu - post)) / np.max(np.abs(post)) > 1e-3
    # the library's step: (1/M) sum_i g_i with gamma_in = eta / N (noisy_adam.4), (noisy_adam.2)
    summed = MLP([P, 1], likelihood="gaussian", noise_precision=N * 4.0)  # g_i -> N g_i
    for mdl, alpha, steps, want, what in [
            (lin, 0.05, 2500, post, "na.step lands on the posterior mean"),
            (summed, 5.0, 1000, wrong, "na.step, summed reading, on the eta / N one")]:
        cfg = na.NoisyAdamConfig(N, eta, alpha=alpha, beta1=0.9, beta2=0.9, squares="per_example")
        state = na.init(np.zeros(D))
        for _ in range(steps):
            state, _ = na.step(state, na.Batch(Xl, yl), np.zeros((D, 1)), cfg, mdl)
        assert_close(state.mu, want, CONVERGED, what)


def test_info_contract_and_sampling():
    # checks (noisy_adam.3), (noisy_adam.9), (noisy_adam.11)
    X, y, model = _problem()
    state = _start()
    (idx, eps), = _batches(1, 3)
    cfg = na.NoisyAdamConfig(N, ETA, kl_weight=0.5, gamma_ex=0.2)
    new, info = na.step(state, na.Batch(X[idx], y[idx]), eps, cfg, model)
    assert isinstance(new, na.NoisyAdamState) and new.t == 1
    assert info.w.shape == (D, 3) and info.g.shape == (3, D)
    for name in ("sigma", "g_hat", "h_hat", "v", "m", "f", "m_tilde", "m_hat", "mu"):
        assert getattr(info, name).shape == (D,), name
        assert getattr(info, name).dtype == np.float64, name
    assert_close(info.gamma_in, 0.5 * ETA / N, EXACT_F64, "gamma_in = kl prior_precision / N = kl / (N eta)")
    assert_close(info.m_hat, info.m_tilde / (info.f + 0.5 * ETA / N + 0.2), EXACT_F64,
                 "gamma = gamma_in + gamma_ex in the mean update")
    assert_close(info.w, na.sample(state, eps, cfg), EXACT_F64, "draws")
    R = na.sample(state, np.eye(D), cfg) - state.mu[:, None]
    assert_close(R @ R.T, np.diag(1 / na.prec_diag(state, cfg)), EXACT_F64,
                 "sample is a root of (kl / N) diag(f + gamma_in)^{-1} (no gamma_ex)")
    prior = na.init(np.zeros(D))
    assert_close(na.prec_diag(prior, cfg), ETA, EXACT_F64, "f0 = 0: the prior's precision")


def test_float32_step_matches_float64():
    X, y, model = _problem()
    state = _start()
    (idx, eps), = _batches(1, 2)
    for squares in ("minibatch", "per_example"):
        cfg = na.NoisyAdamConfig(N, ETA, alpha=0.05, squares=squares, gamma_ex=0.1)
        new64, _ = na.step(state, na.Batch(X[idx], y[idx]), eps, cfg, model)
        s32 = na.NoisyAdamState(*[a.astype(np.float32) if hasattr(a, "dtype") else a
                                  for a in state])
        new32, info = na.step(s32, na.Batch(X[idx].astype(np.float32), y[idx].astype(np.float32)),
                              eps.astype(np.float32), cfg._replace(prior_precision=ETA.astype(np.float32)),
                              model)
        assert new32.mu.dtype == new32.f.dtype == info.w.dtype == np.float32
        assert_close(new32.f, new64.f, EXACT_F32, f"f ({squares})")
        assert_close(new32.mu, new64.mu, EXACT_F32, f"mean ({squares})")


_CFG = na.NoisyAdamConfig(N, ETA)
_BAD = [
    ({"cfg": _CFG._replace(beta1=1.0)}, "beta1: expected a value in"),
    ({"cfg": _CFG._replace(beta2=1.5)}, "beta2: expected a value in"),
    ({"cfg": _CFG._replace(alpha=-1e-3)}, "alpha: expected a value in"),
    ({"cfg": _CFG._replace(prior_precision=0.0)}, "prior_precision: expected a finite prior precision > 0"),
    ({"cfg": _CFG._replace(prior_precision=-ETA)}, "prior_precision: expected > 0"),
    ({"cfg": _CFG._replace(prior_precision=np.ones((D, 1)))}, "prior_precision: expected shape"),
    ({"cfg": _CFG._replace(kl_weight=0.0)}, "kl_weight: expected a value in"),
    ({"cfg": _CFG._replace(gamma_ex=-0.1)}, "gamma_ex: expected a value in"),
    ({"cfg": _CFG._replace(squares="ef")}, "squares: expected one of"),
    ({"cfg": vadam.VadamConfig(N, ETA)}, "cfg: expected a NoisyAdamConfig"),
    ({"eps": None}, "eps: expected standard-normal draws"),
    ({"eps": np.zeros((D, 0))}, r"eps: expected shape \(D, S\)"),
    ({"eps": np.zeros((D, 1), dtype=np.float32)}, "eps: expected dtype float64"),
    ({"state": _start()._replace(f=-np.ones(D))}, "state.f: expected >= 0"),
    ({"state": _start()._replace(m=np.ones(D + 1))}, "state.m: expected shape"),
    ({"batch": na.Batch(np.ones((2, P)), np.ones(3))}, "batch.y: expected 2 rows"),
    ({"model": MLP([P, 3, 1], likelihood="bernoulli")}, "model: expected a model with D"),
]


@pytest.mark.parametrize("over, match", _BAD, ids=[str(i) for i in range(len(_BAD))])
def test_bad_input_raises(over, match):
    X, y, model = _problem()
    (idx, eps), = _batches(1, 1)
    kw = {"state": _start(), "batch": na.Batch(X[idx], y[idx]), "eps": eps, "cfg": _CFG,
          "model": model}
    kw.update(over)
    with pytest.raises(ValueError, match=match):
        na.step(kw["state"], kw["batch"], kw["eps"], kw["cfg"], kw["model"])


def test_init_rejects_bad_f0():
    with pytest.raises(ValueError, match="f0: expected a finite value >= 0"):
        na.init(np.zeros(3), float("nan"))
    with pytest.raises(ValueError, match="f0: expected >= 0"):
        na.init(np.zeros(3), np.array([0.0, -1.0, 0.0]))


@pytest.mark.parametrize("squares", ["minibatch", "per_example"])
def test_step_on_each_backend_matches_dense(xp, squares):
    """Two steps on NumPy and, where a GPU is present, CuPy arrays, against the NumPy oracle."""
    X, y, model = _problem()
    Xd = add_intercept(X)
    st0 = _start()
    state = na.NoisyAdamState(xp.asarray(st0.mu), xp.asarray(st0.m), xp.asarray(st0.f), 0)
    cfg = na.NoisyAdamConfig(N, xp.asarray(ETA), alpha=0.05, kl_weight=0.5, gamma_ex=0.1,
                             squares=squares)
    mu, m, f = st0.mu, -st0.m, st0.f
    for t, (idx, eps) in enumerate(_batches(2, 2)):
        state, _ = na.step(state, na.Batch(xp.asarray(X[idx]), xp.asarray(y[idx])),
                           xp.asarray(eps), cfg, model)
        mu, m, f, _ = ref.noisy_adam_step(mu, m, f, t, vadam_dense.logistic_grads(Xd[idx], y[idx]),
                                          eps, N, ETA, 0.05, 0.9, 0.999, 0.5, 0.1, squares)
    assert_close(to_numpy(state.f), f, EXACT_F64, "f")
    assert_close(to_numpy(state.mu), mu, EXACT_F64, "mean")
    assert_close(to_numpy(na.prec_diag(state, cfg)), N / 0.5 * (f + 0.5 * ETA / N), EXACT_F64,
                 "precision")


def test_sample_draws_are_the_printed_map():
    """Draw by draw, written out here: w_s = mu + sigma o eps_s, sigma = sqrt(lambda / N) /
    sqrt(f + gamma_in), gamma_in = lambda eta / N (gamma_ex not in it). The covariance check
    above sees only R R^T, blind to a sign flip of the perturbation; this test is not."""
    # checks (noisy_adam.2), (noisy_adam.3)
    state = _start()
    kl = 0.5
    cfg = na.NoisyAdamConfig(N, ETA, kl_weight=kl, gamma_ex=0.2)
    eps = np.hstack([np.random.default_rng(7).standard_normal((D, 3)), np.eye(D)])
    gamma_in = kl * ETA / N  # (noisy_adam.2)
    sigma = np.sqrt(kl / N) / np.sqrt(state.f + gamma_in)  # (noisy_adam.3)
    by_hand = state.mu[:, None] + sigma[:, None] * eps  # (noisy_adam.3)
    assert_close(na.sample(state, eps, cfg), by_hand, EXACT_F64, "draws")
    assert np.max(np.abs(by_hand - state.mu[:, None])) > 1e-2  # the perturbation is not negligible


def test_the_former_names_eta_and_tau_still_work_for_one_release_with_a_warning():
    """Issue 38, item 3: NoisyAdamConfig.eta (a prior PRECISION, against the paper's and
    NoisyKFACConfig's prior variance eta) is renamed prior_precision, step(tau=) is renamed
    noise_precisions=; the old names give the same result and a DeprecationWarning."""
    with pytest.warns(DeprecationWarning, match="renamed NoisyAdamConfig.prior_precision"):
        old = na.NoisyAdamConfig(N, eta=0.7, alpha=0.05)
    assert old == na.NoisyAdamConfig(N, prior_precision=0.7, alpha=0.05)
    with pytest.warns(DeprecationWarning, match="renamed"):
        assert old.eta == 0.7
    with pytest.raises(ValueError, match="prior_precision= only"):
        na.NoisyAdamConfig(N, eta=0.7, prior_precision=0.7)
    with pytest.raises(ValueError, match="cfg.prior_precision"):
        with pytest.warns(DeprecationWarning):
            na.NoisyAdamConfig(N, eta=-1.0)
    model = MLP([2, 3, 1], activation="tanh", likelihood="gaussian", noise_precision=1.0)
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((5, 2)), rng.standard_normal(5)
    st = na.init(model.init_theta(rng))
    eps = rng.standard_normal((model.D, 2))
    cfg = na.NoisyAdamConfig(5, 1.0, alpha=0.05)
    taus = np.array([2.0, 0.5])
    want, _ = na.step(st, na.Batch(X, y), eps, cfg, model, noise_precisions=taus)
    with pytest.warns(DeprecationWarning, match=r"noisy_adam.step\(tau=\) is renamed"):
        got, _ = na.step(st, na.Batch(X, y), eps, cfg, model, tau=taus)
    assert np.array_equal(got.mu, want.mu) and np.array_equal(got.f, want.f)
    with pytest.raises(ValueError, match="noise_precisions= only"):
        na.step(st, na.Batch(X, y), eps, cfg, model, noise_precisions=taus, tau=taus)
