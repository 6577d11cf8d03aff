"""Natural-gradient Gaussian VI (refbayes.methods.ngvi) against a dense re-implementation, the
exact-VI optimum it must converge to, and the closed-form Bayesian linear-regression posterior."""
import numpy as np
import pytest

from refbayes.datasets import make_logistic_regression
from refbayes.linalg import gaussian
from refbayes.methods import exact_vi, ngvi
from refbayes.models import MLP, LogisticRegression, add_intercept
from tests.reference import ngvi_dense as ref
from tests.tolerances import CONVERGED, EXACT_F32, EXACT_F64, assert_close

N, P, M = 40, 5, 8
D = P + 1
LAM = np.array([1.0, 0.5, 2.0, 1.0, 0.3, 1e-2])
KL_CONVERGED = CONVERGED  # a KL (nats) at the fixed point: the same bar


def _problem(seed=0):
    s = make_logistic_regression(N, P, seed)
    return s.X, s.y.astype(float), LogisticRegression(P)


def _start_full(seed=1):
    rng = np.random.default_rng(seed)
    A = 0.5 * rng.standard_normal((D, D))
    return ngvi.init_full(0.3 * rng.standard_normal(D), A @ A.T + np.eye(D))


def _start_mf(seed=1):
    rng = np.random.default_rng(seed)
    return ngvi.init_meanfield(0.3 * rng.standard_normal(D), rng.uniform(0.5, 2.0, D))


def _batches(steps, S, seed=2):
    rng = np.random.default_rng(seed)
    return [(rng.permutation(N)[:M], rng.standard_normal((D, S))) for _ in range(steps)]


@pytest.mark.parametrize("S", [1, 3])
def test_linear_hessian_estimates_take_the_summed_closed_form(S):
    """(ngvi.10) for LogisticRegression goes through ggn_sum / diag_ggn_sum (one batched pass);
    MLP([P, 1], "bernoulli") is the same function of the same theta and takes S model.hessian
    calls (autograd): both give the same H_hat and diagonal."""
    from refbayes.methods._estimates import hess_diag_estimate, hess_estimate
    X, y, model = _problem()
    mlp = MLP([P, 1], likelihood="bernoulli")
    theta = 0.5 * np.random.default_rng(3).standard_normal((D, S))
    H = hess_estimate(model, theta, X[:M], y[:M], N)
    assert_close(H, hess_estimate(mlp, theta, X[:M], y[:M], N), EXACT_F64, "H_hat")
    assert_close(hess_diag_estimate(model, theta, X[:M], y[:M], N), np.diag(H), EXACT_F64,
                 "diag H_hat")
    assert_close(hess_diag_estimate(mlp, theta, X[:M], y[:M], N), np.diag(H), EXACT_F64,
                 "diag H_hat, autograd path")


@pytest.mark.parametrize("curvature", ["ef", "hess", "exact"])
@pytest.mark.parametrize("momentum", [0.0, 0.9])
@pytest.mark.parametrize("decay", [0.0, 0.51])
@pytest.mark.parametrize("S", [1, 3])
def test_full_steps_match_dense(curvature, momentum, decay, S):
    # checks (ngvi.6), (ngvi.7)
    # checks (ngvi.8), (ngvi.11), (ngvi.12), (ngvi.13)
    X, y, model = _problem()
    cfg = ngvi.NGVIConfig(N, LAM, alpha=0.3, beta=0.2, decay=decay, curvature=curvature,
                          momentum=momentum)
    state = _start_full()
    mu, Pm, g_bar = state.mu, state.Sigma_inv, np.zeros(D)
    for t, (idx, eps) in enumerate(_batches(4, S)):
        e = None if curvature == "exact" else eps
        state, info = ngvi.step_full(state, ngvi.Batch(X[idx], y[idx]), e, cfg, model)
        mu, Pm, g_bar, theta = ref.full_step(mu, Pm, g_bar, t, add_intercept(X[idx]), y[idx], eps,
                                             N, LAM, 0.3, 0.2, decay, curvature, momentum)
        if curvature != "exact":
            assert_close(info.theta, theta, EXACT_F64, f"draws, step {t}")
        assert_close(state.Sigma_inv, Pm, EXACT_F64, f"precision, step {t}")
        assert_close(state.mu, mu, EXACT_F64, f"mean, step {t}")


@pytest.mark.parametrize("curvature", ["ef", "hess", "exact"])
@pytest.mark.parametrize("momentum", [0.0, 0.9])
@pytest.mark.parametrize("decay", [0.0, 0.51])
def test_meanfield_steps_match_dense(curvature, momentum, decay):
    # checks (ngvi.14), (ngvi.16)
    X, y, model = _problem()
    cfg = ngvi.NGVIConfig(N, LAM, alpha=0.3, beta=0.2, decay=decay, curvature=curvature,
                          momentum=momentum)
    state = _start_mf()
    mu, s, g_bar = state.mu, state.prec_diag, np.zeros(D)
    for t, (idx, eps) in enumerate(_batches(4, 2)):
        e = None if curvature == "exact" else eps
        state, _ = ngvi.step_meanfield(state, ngvi.Batch(X[idx], y[idx]), e, cfg, model)
        mu, s, g_bar = ref.meanfield_step(mu, s, g_bar, t, add_intercept(X[idx]), y[idx], eps, N,
                                          LAM, 0.3, 0.2, decay, curvature, momentum)
        assert_close(state.prec_diag, s, EXACT_F64, f"precision, step {t}")
        assert_close(state.mu, mu, EXACT_F64, f"mean, step {t}")


def test_full_exact_converges_to_exact_vi():
    """Full batch, "exact" curvature, constant steps: the fixed point of (ngvi.4)-(ngvi.5) is the
    exact-VI optimum (derivations/ngvi.md), reached to symmetric KL <= 1e-8."""
    # checks (ngvi.1): the fixed point is the ELBO's maximiser
    X, y, model = _problem()
    cfg = ngvi.NGVIConfig(N, LAM, alpha=0.5, beta=0.5, decay=0.0, curvature="exact")
    state = ngvi.init_full(np.zeros(D), np.eye(D))
    for _ in range(120):
        state, _ = ngvi.step_full(state, ngvi.Batch(X, y), None, cfg, model)
    ex = exact_vi.fit_full(add_intercept(X), y, LAM)
    kl = gaussian.symmetric_kl(gaussian.DenseCov(ex.mu, ex.Sigma),
                               gaussian.DensePrec(state.mu, state.Sigma_inv))
    assert 0 <= kl <= KL_CONVERGED, kl


def test_meanfield_exact_converges_to_exact_meanfield():
    X, y, model = _problem()
    cfg = ngvi.NGVIConfig(N, LAM, alpha=0.5, beta=0.5, decay=0.0, curvature="exact")
    state = ngvi.init_meanfield(np.zeros(D), np.ones(D))
    for _ in range(300):
        state, _ = ngvi.step_meanfield(state, ngvi.Batch(X, y), None, cfg, model)
    ex = exact_vi.fit_meanfield(add_intercept(X), y, LAM)
    kl = gaussian.symmetric_kl(gaussian.DiagCov(ex.mu, ex.var),
                               gaussian.DiagPrec(state.mu, state.prec_diag))
    assert 0 <= kl <= KL_CONVERGED, kl


def _linear_regression(seed=3, tau=4.0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, P))
    y = X @ rng.standard_normal(P) + 0.5 * rng.standard_normal(N)
    Xd = add_intercept(X)
    Prec = tau * Xd.T @ Xd + np.diag(LAM)
    return X, y, MLP([P, 1], likelihood="gaussian", noise_precision=tau), Prec, \
        np.linalg.solve(Prec, tau * Xd.T @ y)


@pytest.mark.parametrize("curvature", ["exact", "hess"])
def test_one_full_batch_step_is_the_linear_regression_posterior(curvature):
    """alpha = beta = 1, full batch: Sigma'^{-1} = tau X~^T X~ + Lam, mu' = Sigma' tau X~^T y from
    any start (ngvi.md). "hess" with eps = 0 evaluates the gradient at mu (it is linear in theta);
    with random eps only the precision (which does not depend on theta) is exact."""
    X, y, model, Prec, post_mu = _linear_regression()
    cfg = ngvi.NGVIConfig(N, LAM, alpha=1.0, beta=1.0, decay=0.0, curvature=curvature)
    eps = None if curvature == "exact" else np.zeros((D, 1))
    new, _ = ngvi.step_full(_start_full(), ngvi.Batch(X, y), eps, cfg, model)
    assert_close(new.Sigma_inv, Prec, EXACT_F64, "precision")
    assert_close(new.mu, post_mu, EXACT_F64, "mean")
    if curvature == "hess":
        noisy, _ = ngvi.step_full(_start_full(), ngvi.Batch(X, y),
                                  np.random.default_rng(0).standard_normal((D, 2)), cfg, model)
        assert_close(noisy.Sigma_inv, Prec, EXACT_F64, "precision with random draws")


def test_one_meanfield_step_gives_the_diagonal_of_the_posterior_precision():
    """Mean field, alpha = beta = 1: prec_diag' = tau diag(X~^T X~) + lam (exact_vi.10)."""
    X, y, model, Prec, _ = _linear_regression()
    cfg = ngvi.NGVIConfig(N, LAM, alpha=1.0, beta=1.0, decay=0.0, curvature="exact")
    new, _ = ngvi.step_meanfield(_start_mf(), ngvi.Batch(X, y), None, cfg, model)
    assert_close(new.prec_diag, np.diag(Prec), EXACT_F64, "diagonal precision")


def test_float32_full_step_matches_float64():
    X, y, model = _problem()
    state = _start_full()
    (idx, eps), = _batches(1, 2)
    cfg = ngvi.NGVIConfig(N, LAM, alpha=0.3, beta=0.2, curvature="hess")
    new64, _ = ngvi.step_full(state, ngvi.Batch(X[idx], y[idx]), eps, cfg, model)
    s32 = ngvi.FullState(*[a.astype(np.float32) if hasattr(a, "dtype") else a for a in state])
    new32, _ = ngvi.step_full(s32, ngvi.Batch(X[idx].astype(np.float32),
                                              y[idx].astype(np.float32)),
                              eps.astype(np.float32), cfg._replace(lam=LAM.astype(np.float32)),
                              model)
    assert new32.Sigma_inv.dtype == np.float32
    assert_close(new32.Sigma_inv, new64.Sigma_inv, EXACT_F32, "precision")
    assert_close(new32.mu, new64.mu, EXACT_F32, "mean")


def test_info_contract_and_sampling():
    # checks (ngvi.6), (ngvi.14)
    X, y, model = _problem()
    state = _start_full()
    (idx, eps), = _batches(1, 3)
    new, info = ngvi.step_full(state, ngvi.Batch(X[idx], y[idx]), eps,
                               ngvi.NGVIConfig(N, LAM), model)
    assert info.theta.shape == (D, 3) and info.G.shape == (3, M, D)
    assert info.C_hat.shape == (D, D) and new.t == 1
    assert_close(info.theta, ngvi.sample_full(state, eps), EXACT_F64, "draws")
    R = ngvi.sample_full(state, np.eye(D)) - state.mu[:, None]
    assert_close(R @ R.T, ngvi.dense_covariance(state), EXACT_F64, "L^{-T} is a root of Sigma")
    mf = _start_mf()
    R = ngvi.sample_meanfield(mf, np.eye(D)) - mf.mu[:, None]
    assert_close(R @ R.T, ngvi.dense_covariance_meanfield(mf), EXACT_F64, "mean-field root")


_CFG = ngvi.NGVIConfig(N, LAM)
_BAD = [
    (dict(cfg=_CFG._replace(alpha=-0.1)), "alpha"),
    (dict(cfg=_CFG._replace(beta=2.0)), "beta"),
    (dict(cfg=_CFG._replace(curvature="fisher")), "curvature: expected one of"),
    (dict(cfg=_CFG._replace(lam=np.zeros(D))), "lam: expected > 0"),
    (dict(cfg=_CFG._replace(momentum=1.0)), "momentum"),
    (dict(cfg=_CFG._replace(decay=-1.0)), "decay"),
    (dict(cfg=_CFG._replace(curvature="exact")), "eps: curvature='exact' takes no Monte Carlo"),
    (dict(eps=None), "eps: curvature='ef' needs"),
    (dict(batch=ngvi.Batch(np.ones((2, P)), np.array([1.0, -1.0]))), "batch.y: expected binary"),
    (dict(batch=ngvi.Batch(np.ones((2, P)), np.ones(3))), "batch.y: expected 2 rows"),
    (dict(model=MLP([P, 3, 1], likelihood="bernoulli"), ), "model: expected a model with D"),
]


@pytest.mark.parametrize("over, match", _BAD, ids=[str(i) for i in range(len(_BAD))])
@pytest.mark.parametrize("family", ["full", "meanfield"])
def test_bad_input_raises(family, over, match):
    X, y, model = _problem()
    (idx, eps), = _batches(1, 1)
    kw = dict(batch=ngvi.Batch(X[idx], y[idx]), eps=eps, cfg=_CFG, model=model)
    kw.update(over)
    state, step = ((_start_full(), ngvi.step_full) if family == "full"
                   else (_start_mf(), ngvi.step_meanfield))
    with pytest.raises(ValueError, match=match):
        step(state, kw["batch"], kw["eps"], kw["cfg"], kw["model"])


def test_exact_curvature_needs_a_linear_model():
    X, y, _ = _problem()
    model = MLP([P, 3, 1], likelihood="bernoulli")
    state = ngvi.init_full(np.zeros(model.D), np.eye(model.D))
    with pytest.raises(ValueError, match="model: curvature='exact' needs a linear model"):
        ngvi.step_full(state, ngvi.Batch(X[:4], y[:4]), None,
                       ngvi.NGVIConfig(N, np.ones(model.D), curvature="exact"), model)


def test_init_full_rejects_a_non_spd_precision():
    with pytest.raises(ValueError, match="Sigma_inv: expected a symmetric positive-definite"):
        ngvi.init_full(np.zeros(3), np.diag([1.0, -1.0, 1.0]))


def test_sample_draws_are_the_printed_map():
    """Draw by draw, written out here: full theta = mu + L^{-T} eps with L the lower Cholesky
    factor of Sigma_inv (explicit inverse), mean-field theta = mu + eps / sqrt(prec_diag). The
    covariance check above sees only R R^T, which a sign flip of the perturbation or L^{-1} in
    place of L^{-T} leaves unchanged; this test does not."""
    # checks (ngvi.6), (ngvi.14)
    eps = np.hstack([np.random.default_rng(5).standard_normal((D, 3)), np.eye(D)])
    state = _start_full()
    L = np.linalg.cholesky(state.Sigma_inv)
    by_hand = state.mu[:, None] + np.linalg.inv(L).T @ eps  # (ngvi.6)
    assert_close(ngvi.sample_full(state, eps), by_hand, EXACT_F64, "full draws")
    mf = _start_mf()
    by_hand = mf.mu[:, None] + eps / np.sqrt(mf.prec_diag)[:, None]  # (ngvi.14)
    assert_close(ngvi.sample_meanfield(mf, eps), by_hand, EXACT_F64, "mean-field draws")
    assert np.max(np.abs(by_hand - mf.mu[:, None])) > 1e-1  # the perturbation is not negligible
