"""VON / VOGN / OGN (refbayes.methods.vogn) against a dense re-implementation, the Khan et al.
(2018) equations transcribed literally, the natural-gradient mean-field step of ngvi, the
data-parallel split, and the closed-form Bayesian linear-regression optimum and MAP."""
import numpy as np
import pytest

from refbayes.backend import cupy_available
from refbayes.datasets import make_logistic_regression
from refbayes.methods import ngvi, vogn
from refbayes.models import MLP, LogisticRegression, add_intercept
from tests.reference import vogn_dense as ref
from tests.reference.per_example import spec_of
from tests.tolerances import CONVERGED, EXACT_F32, EXACT_F64, assert_close

N, P, M = 40, 4, 6


def _rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def _logistic(seed=0):
    s = make_logistic_regression(N, P, seed)
    return s.X, s.y.astype(float), LogisticRegression(P)


def _mlp(likelihood, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, 3))
    if likelihood == "gaussian":
        y = np.sin(X.sum(axis=1)) + 0.1 * rng.standard_normal(N)
        return X, y, MLP([3, 4, 1], activation="tanh", likelihood="gaussian", noise_precision=2.0)
    return X, rng.integers(0, 3, N), MLP([3, 4, 3], activation="tanh", likelihood="categorical")


def _problem(name):
    return _logistic() if name == "logistic" else _mlp(name.split("-")[1])


def _start(D, seed=1):
    rng = np.random.default_rng(seed)
    return vogn.init(0.3 * rng.standard_normal(D), rng.uniform(0.2, 1.0, D))


def _batches(steps, D, S, seed=2):
    rng = np.random.default_rng(seed)
    return [(rng.permutation(N)[:M], rng.standard_normal((D, S))) for _ in range(steps)]


_SETTINGS = {
    "plain": {"alpha": 0.2, "beta1": 0.0, "beta2": 0.3},
    "tempered": {"alpha": 0.2, "beta1": 0.6, "beta2": 0.3, "gamma": 0.01, "tau": 0.7, "rho": 2.0},
}


def _delta(setting, D):
    return 0.8 if setting == "plain" else np.linspace(0.5, 2.0, D)


# ----------------------------------------------------------------------------- step vs dense

@pytest.mark.parametrize("draws", ["S=2", "ogn"])
@pytest.mark.parametrize("setting", ["plain", "tempered"])
@pytest.mark.parametrize("curvature", ["ef", "ggn"])
@pytest.mark.parametrize("problem", ["logistic", "mlp-gaussian", "mlp-categorical"])
def test_steps_match_dense(problem, curvature, setting, draws):
    """Three consecutive steps against tests/reference/vogn_dense.py (autograd per-example loops)
    with the same eps and minibatch: draws, s, m and mu to 1e-10."""
    # checks (vogn.4), (vogn.5)
    X, y, model = _problem(problem)
    D = model.D
    delta, hyper = _delta(setting, D), _SETTINGS[setting]
    cfg = vogn.VOGNConfig(N, delta, curvature=curvature, **hyper)
    state = _start(D)
    mu, s, m = state.mu, state.s, state.m
    spec = spec_of(model)
    for t, (idx, eps) in enumerate(_batches(3, D, 2)):
        e = None if draws == "ogn" else eps
        state, info = vogn.step(state, vogn.Batch(X[idx], y[idx]), e, cfg, model)
        est = ref.autograd_estimates(spec, X[idx], y[idx], curvature)
        mu, s, m, theta = ref.vogn_step(mu, s, m, est, e, N, delta, **hyper)
        assert_close(info.theta, theta, EXACT_F64, f"draws, step {t}")
        assert_close(state.s, s, EXACT_F64, f"s, step {t}")
        assert_close(state.m, m, EXACT_F64, f"m, step {t}")
        assert_close(state.mu, mu, EXACT_F64, f"mu, step {t}")


def test_info_contract_and_sampling():
    X, y, model = _logistic()
    D = model.D
    state = _start(D)
    (idx, eps), = _batches(1, D, 3)
    cfg = vogn.VOGNConfig(N, 0.8, tau=0.5, rho=2.0, gamma=0.1)
    new, info = vogn.step(state, vogn.Batch(X[idx], y[idx]), eps, cfg, model)
    assert new.t == 1 and new.mu.dtype == np.float64
    assert info.theta.shape == (D, 3) and info.g_k.shape == (3, D) and info.h_k.shape == (3, D)
    for name in ("sigma", "g_hat", "h_hat", "m", "s", "prec_diag", "Delta_mu", "mu"):
        assert getattr(info, name).shape == (D,), name
    assert info.N_eff == 2 * N
    assert_close(info.g_hat, info.g_k.mean(axis=0), EXACT_F64, "ghat = mean_k ghat_k")
    assert_close(info.theta, vogn.sample(state, eps, cfg), EXACT_F64, "draws = sample")
    assert_close(info.prec_diag, vogn.prec_diag(new, cfg), EXACT_F64, "prec_diag of the new state")
    assert_close(info.sigma ** -2, vogn.prec_diag(state, cfg), EXACT_F64, "sigma^-2 = prec_diag")
    R = vogn.sample(state, np.eye(D), cfg) - state.mu[:, None]
    assert_close(R @ R.T, vogn.dense_covariance(state, cfg), EXACT_F64, "sigma is a root of Sigma")


def test_ogn_is_the_step_at_the_mean():
    """eps=None evaluates at mu: identical to one all-zero draw (vogn.10)."""
    X, y, model = _logistic()
    state = _start(model.D)
    cfg = vogn.VOGNConfig(N, 0.8, curvature="ggn")
    a, info = vogn.step(state, vogn.Batch(X[:M], y[:M]), None, cfg, model)
    b, _ = vogn.step(state, vogn.Batch(X[:M], y[:M]), np.zeros((model.D, 1)), cfg, model)
    assert info.theta.shape == (model.D, 1)
    np.testing.assert_array_equal(info.theta[:, 0], state.mu)
    np.testing.assert_array_equal(a.mu, b.mu)
    np.testing.assert_array_equal(a.s, b.s)


# ----------------------------------------------------------------------------- data parallel

def _dp_step(state, parts, X, y, eps, cfg, model):
    ests = [vogn.local_estimates(state, vogn.Batch(X[p], y[p]), eps, cfg, model) for p in parts]
    g_hat, h_hat, M_all = vogn.allreduce(ests)
    assert M_all == sum(len(p) for p in parts)
    return vogn.apply(state, g_hat, h_hat, cfg)


@pytest.mark.parametrize("sizes", [(3, 3), (1, 2, 3)], ids=["equal", "unequal"])
@pytest.mark.parametrize("curvature", ["ef", "ggn"])
def test_data_parallel_step_equals_one_worker(curvature, sizes):
    """The minibatch split over workers with the same eps: apply(allreduce(local_estimates))
    gives the one-worker step on the concatenated rows (vogn.6), equal and unequal splits."""
    X, y, model = _mlp("categorical")
    cfg = vogn.VOGNConfig(N, 0.8, alpha=0.1, beta1=0.9, beta2=0.5, tau=0.5, curvature=curvature)
    one = many = _start(model.D)
    for t, (idx, eps) in enumerate(_batches(3, model.D, 2)):
        one, _ = vogn.step(one, vogn.Batch(X[idx], y[idx]), eps, cfg, model)
        parts = np.split(idx, np.cumsum(sizes)[:-1])
        many, info = _dp_step(many, parts, X, y, eps, cfg, model)
        assert info.theta.shape == (model.D, 0)
        for name in ("mu", "s", "m"):
            assert_close(getattr(many, name), getattr(one, name), EXACT_F64, f"{name}, step {t}")


def test_allreduce_weights_by_rows():
    """Unequal rows: the plain mean of the workers' estimates is not the one-worker estimate,
    the M-weighted mean is; with equal rows the two agree."""
    X, y, model = _logistic()
    state, cfg = _start(model.D), vogn.VOGNConfig(N, 0.8)
    (idx, eps), = _batches(1, model.D, 2)
    one = vogn.local_estimates(state, vogn.Batch(X[idx], y[idx]), eps, cfg, model)
    for sizes, plain_agrees in (((1, 5), False), ((3, 3), True)):
        parts = np.split(idx, np.cumsum(sizes)[:-1])
        ests = [vogn.local_estimates(state, vogn.Batch(X[p], y[p]), eps, cfg, model)
                for p in parts]
        red = vogn.allreduce(ests)
        assert red.M == M
        assert_close(red.g_hat, one.g_hat, EXACT_F64, f"weighted ghat {sizes}")
        assert_close(red.h_hat, one.h_hat, EXACT_F64, f"weighted hhat {sizes}")
        plain = np.mean([e.h_hat for e in ests], axis=0)
        assert (_rel(plain, one.h_hat) <= EXACT_F64) == plain_agrees, sizes


# ----------------------------------------------------------------------------- special cases

@pytest.mark.parametrize("curvature", ["hessian", "gn"])
def test_von2018_literal_transcription(curvature):
    """Khan et al. (2018) VON ("hessian") and VOGN ("gn": squared per-example gradients) as
    printed equal the library with beta1 = 0, alpha = beta2 = beta, tau = rho = 1, gamma = 0,
    curvature "ggn" / "ef" (vogn.11). Logistic regression, one draw, four steps."""
    X, y, model = _logistic()
    lam, beta = 0.8, 0.3
    cfg = vogn.VOGNConfig(N, lam, alpha=beta, beta1=0.0, beta2=beta,
                          curvature="ggn" if curvature == "hessian" else "ef")
    state = _start(model.D)
    mu, s = state.mu, state.s
    for t, (idx, eps) in enumerate(_batches(4, model.D, 1)):
        state, _ = vogn.step(state, vogn.Batch(X[idx], y[idx]), eps, cfg, model)
        mu, s = ref.von2018_step(mu, s, add_intercept(X[idx]), y[idx], eps[:, 0], N, lam, beta,
                                 curvature)
        assert_close(state.s, s, EXACT_F64, f"s, step {t}")
        assert_close(state.mu, mu, EXACT_F64, f"mu, step {t}")


@pytest.mark.parametrize("pair", [("ggn", "hess"), ("ef", "ef")])
def test_reduces_to_ngvi_meanfield(pair):
    """tau = rho = 1, gamma = 0, beta1 = 0: VOGN is ngvi.step_meanfield with prec_diag =
    N (s + delta / N), lam = delta, alpha, beta = beta2, no decay, no momentum, same eps (vogn.12).
    For logistic regression the Hessian is the GGN."""
    # checks (vogn.3)
    X, y, model = _logistic()
    D = model.D
    delta = np.linspace(0.5, 2.0, D)
    cfg = vogn.VOGNConfig(N, delta, alpha=0.3, beta1=0.0, beta2=0.2, curvature=pair[0])
    ncfg = ngvi.NGVIConfig(N, delta, alpha=0.3, beta=0.2, decay=0.0, curvature=pair[1])
    state = _start(D)
    mf = ngvi.init_meanfield(state.mu, N * (state.s + delta / N))
    for t, (idx, eps) in enumerate(_batches(4, D, 2)):
        state, _ = vogn.step(state, vogn.Batch(X[idx], y[idx]), eps, cfg, model)
        mf, _ = ngvi.step_meanfield(mf, ngvi.Batch(X[idx], y[idx]), eps, ncfg, model)
        assert_close(vogn.prec_diag(state, cfg), mf.prec_diag, EXACT_F64, f"precision, step {t}")
        assert_close(state.mu, mf.mu, EXACT_F64, f"mean, step {t}")


def _linear_regression(seed=3, noise=4.0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, P))
    y = X @ rng.standard_normal(P) + 0.5 * rng.standard_normal(N)
    return X, y, noise


def test_tempered_reduces_to_ngvi_via_noise():
    """tau, rho != 1 on a Gaussian likelihood: VOGN("ggn") equals ngvi("hess") on the model with
    noise precision rho tau_n / tau, prec_diag = (rho N / tau)(s + delta~) (vogn.12)."""
    # checks (vogn.3)
    X, y, noise = _linear_regression()
    tau, rho = 0.5, 3.0
    model = MLP([P, 1], likelihood="gaussian", noise_precision=noise)
    model_t = MLP([P, 1], likelihood="gaussian", noise_precision=rho * noise / tau)
    D, delta = model.D, 0.7
    cfg = vogn.VOGNConfig(N, delta, alpha=0.3, beta1=0.0, beta2=0.2, tau=tau, rho=rho,
                          curvature="ggn")
    ncfg = ngvi.NGVIConfig(N, np.full(D, delta), alpha=0.3, beta=0.2, decay=0.0, curvature="hess")
    state = _start(D)
    mf = ngvi.init_meanfield(state.mu, vogn.prec_diag(state, cfg))
    for t, (idx, eps) in enumerate(_batches(4, D, 2)):
        state, _ = vogn.step(state, vogn.Batch(X[idx], y[idx]), eps, cfg, model)
        mf, _ = ngvi.step_meanfield(mf, ngvi.Batch(X[idx], y[idx]), eps, ncfg, model_t)
        assert_close(vogn.prec_diag(state, cfg), mf.prec_diag, EXACT_F64, f"precision, step {t}")
        assert_close(state.mu, mf.mu, EXACT_F64, f"mean, step {t}")


def test_momentum_forms_are_a_reparameterisation():
    """Printed heavy-ball m <- beta1 m + d with alpha equals the exponential-average form
    m <- beta1 m + (1 - beta1) d with alpha / (1 - beta1) (the official code's grad_ema)."""
    X, y, model = _logistic()
    D, b1, alpha = model.D, 0.9, 0.02
    cfg = vogn.VOGNConfig(N, 0.8, alpha=alpha, beta1=b1, beta2=0.3)
    state = _start(D)
    mu, s, m = state.mu, state.s, np.zeros(D)
    spec = spec_of(model)
    for t, (idx, eps) in enumerate(_batches(4, D, 1)):
        state, _ = vogn.step(state, vogn.Batch(X[idx], y[idx]), eps, cfg, model)
        est = ref.autograd_estimates(spec, X[idx], y[idx], "ef")
        mu, s, m, _ = ref.vogn_step(mu, s, m, est, eps, N, 0.8, alpha / (1 - b1), b1, 0.3,
                                    momentum="ema")
        assert_close(state.mu, mu, EXACT_F64, f"mean, step {t}")


# ----------------------------------------------------------------------------- known answers

def _blr_optimum(X, y, noise, delta, tau=1.0, rho=1.0):
    """Exact mean-field optimum of (vogn.1): prec_j = (rho tau_n / tau)(X~^T X~)_jj + delta_j,
    mean = the tempered posterior mean (= the tempered MAP)."""
    Xd = add_intercept(X)
    c = rho * noise / tau
    A = c * Xd.T @ Xd + np.diag(delta)
    return np.linalg.solve(A, c * Xd.T @ y), np.diag(A)


@pytest.mark.parametrize("beta1", [0.0, 0.5])
@pytest.mark.parametrize("tau, rho", [(1.0, 1.0), (0.5, 2.0)])
def test_von_converges_to_the_meanfield_optimum(tau, rho, beta1):
    """Full batch, one draw eps = 0 (the gradient is linear in theta, so g(mu) = E_q[g]), GGN =
    Hessian: the iteration converges to the exact mean-field optimum to 1e-8 (vogn.md)."""
    # checks (vogn.1): the optimum of the tempered objective
    X, y, noise = _linear_regression()
    model = MLP([P, 1], likelihood="gaussian", noise_precision=noise)
    D = model.D
    delta = np.linspace(0.5, 2.0, D)
    cfg = vogn.VOGNConfig(N, delta, alpha=0.5, beta1=beta1, beta2=0.5, tau=tau, rho=rho,
                          curvature="ggn")
    state, zero = vogn.init(np.zeros(D), np.ones(D)), np.zeros((D, 1))
    for _ in range(400):
        state, _ = vogn.step(state, vogn.Batch(X, y), zero, cfg, model)
    mean, prec = _blr_optimum(X, y, noise, delta, tau, rho)
    assert_close(vogn.prec_diag(state, cfg), prec, CONVERGED, "precision")
    assert_close(state.mu, mean, CONVERGED, "mean")


def test_ogn_converges_to_the_map():
    """OGN (eps=None), Gauss-Newton curvature, momentum 0.9: mu -> (tau_n X~^T X~ + Lam)^{-1}
    tau_n X~^T y to 1e-8."""
    X, y, noise = _linear_regression()
    model = MLP([P, 1], likelihood="gaussian", noise_precision=noise)
    D = model.D
    delta = np.linspace(0.5, 2.0, D)
    cfg = vogn.VOGNConfig(N, delta, alpha=0.05, beta1=0.9, beta2=0.5, curvature="ggn")
    state = vogn.init(np.zeros(D), np.ones(D))
    for _ in range(400):
        state, _ = vogn.step(state, vogn.Batch(X, y), None, cfg, model)
    Xd = add_intercept(X)
    MAP = np.linalg.solve(noise * Xd.T @ Xd + np.diag(delta), noise * Xd.T @ y)
    assert_close(state.mu, MAP, CONVERGED, "MAP")


# ----------------------------------------------------------------------------- errata

def test_erratum_tempering_fixed_point():
    """E-vogn.1: the printed pair sigma = (N (s + delta~))^{-1/2}, s <- (1 - tau beta2) s +
    beta2 hhat, iterated on Bayesian linear regression with tau = 0.5, stops at precision
    (N / tau) h + tau delta, not at the optimum's (N / tau) h + delta (its mean is right: only the
    preconditioner differs); the library reaches the optimum. delta = 50 is the official ResNet-18 config's 1 / prior_variance."""
    X, y, noise = _linear_regression()
    tau, delta, D = 0.5, 50.0, P + 1
    Xd = add_intercept(X)
    est = ref.blr_estimates(Xd, y, noise)
    mean, prec = _blr_optimum(X, y, noise, np.full(D, delta), tau)
    mu, s, m, zero = np.zeros(D), np.ones(D), np.zeros(D), np.zeros((D, 1))
    for _ in range(400):
        mu, s, m, _ = ref.vogn_step(mu, s, m, est, zero, N, delta, 0.5, 0.0, 0.5, tau=tau,
                                    printed=True)
    prec_printed = N * (s + tau * delta / N)
    h = noise * (Xd ** 2).sum(axis=0) / N
    assert_close(prec_printed, N * h / tau + tau * delta, CONVERGED, "the printed fixed point")
    assert _rel(prec_printed, prec) > 1e-2
    assert_close(mu, mean, CONVERGED, "the printed mean line has the right fixed point")
    cfg = vogn.VOGNConfig(N, delta, alpha=0.5, beta1=0.0, beta2=0.5, tau=tau, curvature="ggn")
    state = vogn.init(np.zeros(D), np.ones(D))
    model = MLP([P, 1], likelihood="gaussian", noise_precision=noise)
    for _ in range(400):
        state, _ = vogn.step(state, vogn.Batch(X, y), zero, cfg, model)
    assert_close(vogn.prec_diag(state, cfg), prec, CONVERGED, "library precision")
    assert_close(state.mu, mean, CONVERGED, "library mean")
    assert _rel(vogn.prec_diag(state, cfg), prec_printed) > 1e-2  # not the printed fixed point


@pytest.mark.parametrize("tau", [1.0, 0.5])
def test_erratum_tempering_step(tau):
    """One step: the printed tempering lines equal the derived step at tau = 1 and differ from it
    at tau = 0.5; the library is the derived step."""
    X, y, model = _logistic()
    D = model.D
    state = _start(D)
    (idx, eps), = _batches(1, D, 2)
    cfg = vogn.VOGNConfig(N, 0.8, alpha=0.2, beta1=0.0, beta2=0.3, tau=tau)
    new, _ = vogn.step(state, vogn.Batch(X[idx], y[idx]), eps, cfg, model)
    est = ref.autograd_estimates(spec_of(model), X[idx], y[idx], "ef")
    args = (state.mu, state.s, state.m, est, eps, N, 0.8, 0.2, 0.0, 0.3)
    derived = ref.vogn_step(*args, tau=tau)
    printed = ref.vogn_step(*args, tau=tau, printed=True)
    assert_close(new.mu, derived[0], EXACT_F64, "library vs derived")
    assert (_rel(printed[0], derived[0]) <= EXACT_F64) == (tau == 1.0)
    if tau != 1.0:
        assert _rel(printed[1], derived[1]) > 1e-2


def test_printed_algorithm_is_a_shifted_damping():
    """E-vogn.1, exactly: printed Algorithm 1 with (alpha, beta2, gamma, s_0) has the draws and
    means of the library with (tau alpha, tau beta2, tau (gamma - (1 - tau) delta / N_eff),
    tau s_0): the tempered step with the damping lowered by (1 - tau) delta / N_eff."""
    X, y, model = _logistic()
    D, tau, rho, delta, gamma = model.D, 0.5, 2.0, 2.0, 0.1
    hyper = {"alpha": 0.2, "beta1": 0.5, "beta2": 0.3}
    N_eff = rho * N
    cfg = vogn.VOGNConfig(N, delta, alpha=tau * 0.2, beta1=0.5, beta2=tau * 0.3, tau=tau, rho=rho,
                          gamma=tau * (gamma - (1 - tau) * delta / N_eff))
    start = _start(D)
    state = start._replace(s=tau * start.s)
    mu, s, m = start.mu, start.s, start.m
    spec = spec_of(model)
    for t, (idx, eps) in enumerate(_batches(3, D, 2)):
        state, info = vogn.step(state, vogn.Batch(X[idx], y[idx]), eps, cfg, model)
        est = ref.autograd_estimates(spec, X[idx], y[idx], "ef")
        mu, s, m, theta = ref.vogn_step(mu, s, m, est, eps, N, delta, **hyper, gamma=gamma,
                                        tau=tau, rho=rho, printed=True)
        assert_close(info.theta, theta, EXACT_F64, f"draws, step {t}")
        assert_close(state.s, tau * s, EXACT_F64, f"s, step {t}")
        assert_close(state.mu, mu, EXACT_F64, f"mu, step {t}")


@pytest.mark.parametrize("beta1", [0.0, 0.5])
def test_erratum_momentum_prior_precision(beta1):
    """E-vogn.2: Algorithm 1 prints m <- beta1 m + (ghat + delta mu) with the FULL prior precision;
    corrected (vogn.7): delta~ = tau delta / N. Bayesian linear regression (tau = rho = 1), full
    batch, eps = 0: the library's step lands on the posterior mean to 1e-8; the printed line,
    iterated otherwise identically (tests/reference/vogn_dense.py, printed_momentum=True), settles
    on the posterior under the prior N delta, 41% (relative) away from the posterior mean."""
    X, y, noise = _linear_regression()
    model = MLP([P, 1], likelihood="gaussian", noise_precision=noise)
    D = model.D
    delta = np.linspace(0.5, 2.0, D)
    Xd = add_intercept(X)
    post_mu = np.linalg.solve(noise * Xd.T @ Xd + np.diag(delta), noise * Xd.T @ y)
    cfg = vogn.VOGNConfig(N, delta, alpha=0.5, beta1=beta1, beta2=0.5, curvature="ggn")
    state, zero = vogn.init(np.zeros(D), np.ones(D)), np.zeros((D, 1))
    for _ in range(400):
        state, _ = vogn.step(state, vogn.Batch(X, y), zero, cfg, model)
    assert_close(state.mu, post_mu, CONVERGED, "library mean vs the posterior mean")
    est = ref.blr_estimates(Xd, y, noise)
    mu, s, m = np.zeros(D), np.ones(D), np.zeros(D)
    for _ in range(400):
        mu, s, m, _ = ref.vogn_step(mu, s, m, est, zero, N, delta, 0.5, beta1, 0.5,
                                    printed_momentum=True)
    # at rest ghat + delta mu = 0: (tau_n / N) X~^T (X~ mu - y) + delta mu = 0
    printed_mu = np.linalg.solve(noise * Xd.T @ Xd + N * np.diag(delta), noise * Xd.T @ y)
    assert_close(mu, printed_mu, CONVERGED, "the printed line's fixed point")
    err = _rel(mu, post_mu)
    assert err > 0.2, err


# ----------------------------------------------------------------------------- dtype, backend

@pytest.mark.parametrize("curvature", ["ef", "ggn"])
def test_float32_step_matches_float64(curvature):
    X, y, model = _mlp("gaussian")
    state = _start(model.D)
    (idx, eps), = _batches(1, model.D, 2)
    cfg = vogn.VOGNConfig(N, 0.8, alpha=0.1, beta2=0.3, tau=0.5, curvature=curvature)
    new64, _ = vogn.step(state, vogn.Batch(X[idx], y[idx]), eps, cfg, model)
    s32 = vogn.VOGNState(*[a.astype(np.float32) if hasattr(a, "dtype") else a for a in state])
    new32, info32 = vogn.step(s32, vogn.Batch(X[idx].astype(np.float32),
                                               y[idx].astype(np.float32)),
                              eps.astype(np.float32), cfg, model)
    assert new32.mu.dtype == np.float32 and info32.prec_diag.dtype == np.float32
    assert_close(new32.s, new64.s, EXACT_F32, "s")
    assert_close(new32.mu, new64.mu, EXACT_F32, "mu")


@pytest.mark.gpu
@pytest.mark.skipif(not cupy_available(), reason="CuPy with a CUDA device is not available")
@pytest.mark.parametrize("curvature", ["ef", "ggn"])
def test_cupy_step_matches_numpy(curvature):
    import cupy as cp
    X, y, model = _mlp("categorical")
    state = _start(model.D)
    (idx, eps), = _batches(1, model.D, 2)
    cfg = vogn.VOGNConfig(N, 0.8, alpha=0.1, beta2=0.3, tau=0.5, curvature=curvature)
    new, _ = vogn.step(state, vogn.Batch(X[idx], y[idx]), eps, cfg, model)
    gstate = vogn.VOGNState(*[cp.asarray(a) if hasattr(a, "dtype") else a for a in state])
    gnew, _ = vogn.step(gstate, vogn.Batch(cp.asarray(X[idx]), cp.asarray(y[idx])),
                        cp.asarray(eps), cfg, model)
    assert isinstance(gnew.mu, cp.ndarray)
    assert_close(gnew.mu, new.mu, EXACT_F64, "mu")
    assert_close(gnew.s, new.s, EXACT_F64, "s")


# ----------------------------------------------------------------------------- bad input

_CFG = vogn.VOGNConfig(N, 0.8)
_BAD = [
    ({"cfg": _CFG._replace(N=0)}, "N: expected an integer in"),
    ({"cfg": _CFG._replace(delta=0.0)}, "delta: expected a value in"),
    ({"cfg": _CFG._replace(delta=np.ones(3))}, r"delta: expected shape \(5\)"),
    ({"cfg": _CFG._replace(delta=-np.ones(P + 1))}, "delta: expected > 0"),
    ({"cfg": _CFG._replace(alpha=0.0)}, "alpha: expected a value in"),
    ({"cfg": _CFG._replace(beta1=1.0)}, "beta1: expected a value in"),
    ({"cfg": _CFG._replace(beta2=0.0)}, "beta2: expected a value in"),
    ({"cfg": _CFG._replace(beta2=1.5)}, "beta2: expected a value in"),
    ({"cfg": _CFG._replace(gamma=-1e-3)}, "gamma: expected a value in"),
    ({"cfg": _CFG._replace(tau=0.0)}, "tau: expected a value in"),
    ({"cfg": _CFG._replace(rho=-1.0)}, "rho: expected a value in"),
    ({"cfg": _CFG._replace(curvature="hess")}, "curvature: expected one of"),
    ({"cfg": ngvi.NGVIConfig(N, np.ones(P + 1))}, "cfg: expected a VOGNConfig"),
    ({"eps": np.ones((3, 1))}, r"eps: expected shape \(D, S\)"),
    ({"eps": np.ones((P + 1, 1), dtype=np.float32)}, "eps: expected dtype float64"),
    ({"eps": np.full((P + 1, 1), np.nan)}, "eps: expected finite"),
    ({"batch": vogn.Batch(np.ones((2, P)), np.array([1.0, -1.0]))}, "batch.y: expected binary"),
    ({"batch": vogn.Batch(np.ones((2, P)), np.ones(3))}, "batch.y: expected 2 rows"),
    ({"model": MLP([P, 3, 1], likelihood="bernoulli")}, "model: expected a model with D"),
    ({"state": vogn.VOGNState(np.zeros(P + 1), -np.ones(P + 1), np.zeros(P + 1), 0)},
     "state.s: expected >= 0"),
    ({"state": vogn.VOGNState(np.zeros(P + 1), np.ones(P + 1), np.zeros(P + 1), -1)},
     "state.t: expected a non-negative integer"),
]


@pytest.mark.parametrize("over, match", _BAD, ids=[str(i) for i in range(len(_BAD))])
def test_bad_input_raises(over, match):
    X, y, model = _logistic()
    (idx, eps), = _batches(1, model.D, 1)
    kw = {"state": _start(model.D), "batch": vogn.Batch(X[idx], y[idx]), "eps": eps,
          "cfg": _CFG, "model": model}
    kw.update(over)
    with pytest.raises(ValueError, match=match):
        vogn.step(kw["state"], kw["batch"], kw["eps"], kw["cfg"], kw["model"])


def test_bad_estimates_and_init_raise():
    D = P + 1
    e = vogn.Estimates(np.zeros(D), np.zeros(D), 3)
    with pytest.raises(ValueError, match="estimates: expected a non-empty list"):
        vogn.allreduce([])
    with pytest.raises(ValueError, match=r"estimates\[1\].g_hat: expected shape"):
        vogn.allreduce([e, vogn.Estimates(np.zeros(D + 1), np.zeros(D + 1), 3)])
    with pytest.raises(ValueError, match=r"estimates\[0\].M: expected an integer in"):
        vogn.allreduce([e._replace(M=0)])
    with pytest.raises(ValueError, match="h_hat: expected shape"):
        vogn.apply(_start(D), np.zeros(D), np.zeros(D + 1), _CFG)
    with pytest.raises(ValueError, match="h_hat: expected >= 0"):
        vogn.apply(_start(D), np.zeros(D), -np.ones(D), _CFG)
    with pytest.raises(ValueError, match="s: expected >= 0"):
        vogn.init(np.zeros(D), -np.ones(D))
    with pytest.raises(ValueError, match="eps: expected an array"):
        vogn.sample(_start(D), None, _CFG)
    with pytest.raises(ValueError, match="state: expected a VOGNState"):  # not an AttributeError
        vogn.dense_covariance(None, _CFG)


def test_apply_signed_takes_a_negative_curvature_by_the_same_equations():
    """signed=True (IVON's Hessian estimates, conformance/ivon.py) runs (vogn.7)-(vogn.9) on a
    signed h_hat: checked against the equations written out with the dense reference's scales."""
    D = 5
    rng = np.random.default_rng(3)
    state = _start(D)._replace(m=rng.standard_normal(D))
    g_hat, h_hat = rng.standard_normal(D), rng.standard_normal(D)
    assert h_hat.min() < 0
    new, info = vogn.apply(state, g_hat, h_hat, _CFG, signed=True)
    dt = _CFG.tau * _CFG.delta / (_CFG.rho * _CFG.N)                       # (vogn.2)
    m = _CFG.beta1 * state.m + g_hat + dt * state.mu                       # (vogn.7)
    s = (1 - _CFG.beta2) * state.s + _CFG.beta2 * h_hat                    # (vogn.8)
    mu = state.mu - _CFG.alpha * m / (s + dt + _CFG.gamma)                 # (vogn.9)
    assert_close(new.m, m, EXACT_F64)
    assert_close(new.s, s, EXACT_F64)
    assert_close(new.mu, mu, EXACT_F64)
    assert_close(info.delta_tilde, dt, EXACT_F64)


# ----------------------------------------------------------------------------- IVON (vogn.13)-(vogn.18)

@pytest.mark.parametrize("hess_approx", ["price", "gradsq"])
def test_ivon_step_is_the_printed_equations_by_hand(hess_approx):
    """IVON's step (refbayes/conformance/ivon.py) against (vogn.13)-(vogn.18) written out on
    logistic regression with the hand gradient (sigmoid(x~^T theta) - y) x~ averaged over the M
    rows: two steps from h != f and m != 0, beta1 > 0 with debiasing, the rescaled step size and a
    clip radius that binds in some coordinates and not in others."""
    from refbayes.conformance import ivon

    X, y, model = _logistic()
    Xd, D, S, wd, r = add_intercept(X), model.D, 3, 0.05, 0.5
    cfg = ivon.IVONConfig(lr=0.3, ess=N, hess_init=0.4, beta1=0.8, beta2=0.7, weight_decay=wd,
                          clip_radius=r, hess_approx=hess_approx)
    rng = np.random.default_rng(4)
    state = ivon.init(0.3 * rng.standard_normal(D), cfg)
    state = state._replace(m=0.1 * rng.standard_normal(D), h=rng.uniform(0.2, 1.0, D))
    mu, m, h = state.mu, state.m, state.h
    bound = []
    for t, (idx, eps) in enumerate(_batches(2, D, S, seed=5)):
        state, info = ivon.step(state, (X[idx], y[idx]), eps, cfg, model)
        sigma = 1.0 / np.sqrt(N * (h + wd))                                        # (vogn.13)
        theta = mu[:, None] + sigma[:, None] * eps                                  # (vogn.13)
        g = np.array([np.mean([(0.5 * (1 + np.tanh(Xd[i] @ theta[:, k] / 2)) - y[i]) * Xd[i]
                               for i in idx], axis=0) for k in range(S)])          # (vogn.14)
        g_hat = g.mean(axis=0)                                                      # (vogn.14)
        if hess_approx == "price":
            f = np.mean([g[k] * eps[:, k] / sigma for k in range(S)], axis=0)      # (vogn.15)
        else:
            f = N * np.mean([g[k] ** 2 for k in range(S)], axis=0)                 # (vogn.15)
        m = 0.8 * m + 0.2 * g_hat                                                   # (vogn.16)
        h = 0.7 * h + 0.3 * f + 0.3 ** 2 * (h - f) ** 2 / (2 * (h + wd))           # (vogn.17)
        raw = (m / (1 - 0.8 ** (t + 1)) + wd * mu) / (h + wd)                       # (vogn.18)
        mu = mu - 0.3 * (0.4 + wd) * np.clip(raw, -r, r)                            # (vogn.18)
        bound += list(np.abs(raw) > r)
        assert_close(info.theta, theta, EXACT_F64, f"draws, step {t}")
        assert_close(info.g_hat, g_hat, EXACT_F64, f"g_hat, step {t}")
        assert_close(info.f, f, EXACT_F64, f"f, step {t}")
        assert_close(state.m, m, EXACT_F64, f"m, step {t}")
        assert_close(state.h, h, EXACT_F64, f"h, step {t}")
        assert_close(state.mu, mu, EXACT_F64, f"mu, step {t}")
    assert any(bound) and not all(bound), "the clip radius must bind in some coordinates only"


def test_sample_draws_are_the_printed_map():
    """Draw by draw, written out here: theta_k = mu + sigma * eps_k with sigma = (tau / (N_eff
    (s + delta~ + gamma)))^{1/2}, N_eff = rho N, delta~ = tau delta / N_eff. The covariance check
    above sees only R R^T, blind to a sign flip of the perturbation; this test is not."""
    # checks (vogn.2), (vogn.4)
    D = 5
    state = _start(D)
    cfg = vogn.VOGNConfig(N, 0.8, tau=0.5, rho=2.0, gamma=0.1)
    eps = np.hstack([np.random.default_rng(7).standard_normal((D, 3)), np.eye(D)])
    N_eff = 2.0 * N  # (vogn.2)
    delta_tilde = 0.5 * 0.8 / N_eff  # (vogn.2)
    sigma = np.sqrt(0.5 / (N_eff * (state.s + delta_tilde + 0.1)))  # (vogn.4)
    by_hand = state.mu[:, None] + sigma[:, None] * eps  # (vogn.4)
    assert_close(vogn.sample(state, eps, cfg), by_hand, EXACT_F64, "draws")
    assert np.max(np.abs(by_hand - state.mu[:, None])) > 1e-2  # the perturbation is not negligible


# ----------------------------------------------------------------------------- paper vs note
# Each "Paper vs note:" line of derivations/vogn.md names one of these: the library's step on a
# D = 2 linear regression (the note's worked example) against the note's line written out here in
# float64, and the issue's transcription of Algorithm 1's line, which differs.

def _paper_vs_note_step(tau=2.0, rho=2.0, delta=2.0, gamma=0.5, beta1=0.5, beta2=0.5):
    model = MLP([1, 1], likelihood="gaussian", noise_precision=1.0)   # theta = (w, b)
    X, y = np.array([[1.0], [2.0], [4.0]]), np.array([1.0, 3.0, 2.0])
    cfg = vogn.VOGNConfig(3, delta, alpha=1.0, beta1=beta1, beta2=beta2, gamma=gamma, tau=tau,
                          rho=rho)
    state = vogn.init(np.array([0.5, -0.5]), np.array([0.5, 0.25]))._replace(m=np.array([0.2, -0.1]))
    eps = np.array([[1.0], [-1.0]])
    new, info = vogn.step(state, vogn.Batch(X, y), eps, cfg, model)
    theta = info.theta[:, 0]
    r = X[:, 0] * theta[0] + theta[1] - y                       # residuals f - y
    G = r[:, None] * np.column_stack([X[:, 0], np.ones(3)])      # per-example gradients (3, 2)
    return state, cfg, new, info, G


def test_paper_vs_note_sigma_carries_tau_and_n_eff():
    """(vogn.4): sigma = (tau / (N_eff (s + delta~ + gamma)))^{1/2}, N_eff = rho N; the transcribed
    Alg. 1 line (1 / (N (s + delta~ + gamma)))^{1/2}, N = rho N, is smaller by sqrt(tau) at tau = 2."""
    # checks (vogn.4)
    state, cfg, new, info, _ = _paper_vs_note_step()
    N_eff = 2.0 * 3                                             # (vogn.2)
    dt = 2.0 * 2.0 / N_eff                                      # (vogn.2)
    note = np.sqrt(2.0 / (N_eff * (state.s + dt + 0.5)))        # (vogn.4)
    printed = np.sqrt(1.0 / (N_eff * (state.s + dt + 0.5)))
    assert_close(info.sigma, note, EXACT_F64, "sigma")
    assert_close(info.sigma / printed, np.full(2, np.sqrt(2.0)), EXACT_F64, "ratio to printed")
    assert_close(info.prec_diag, (N_eff / 2.0) * (new.s + dt + 0.5), EXACT_F64, "prec_diag")


def test_paper_vs_note_allreduce_is_row_weighted():
    """(vogn.6): workers with M_w = 1 and 2 rows; the reduction is the M-weighted mean (= the
    one-worker estimate), not the transcribed plain mean of the workers' estimates."""
    # checks (vogn.6)
    state, cfg, _, info, G = _paper_vs_note_step()
    model = MLP([1, 1], likelihood="gaussian", noise_precision=1.0)
    X, y = np.array([[1.0], [2.0], [4.0]]), np.array([1.0, 3.0, 2.0])
    eps = np.array([[1.0], [-1.0]])
    parts = ([0], [1, 2])
    ests = [vogn.local_estimates(state, vogn.Batch(X[p], y[p]), eps, cfg, model) for p in parts]
    red = vogn.allreduce(ests)
    assert_close(red.g_hat, G.mean(axis=0), EXACT_F64, "weighted ghat")
    assert_close(red.h_hat, (G ** 2).mean(axis=0), EXACT_F64, "weighted hhat")
    plain = 0.5 * (G[0] + G[1:].mean(axis=0))
    assert _rel(plain, G.mean(axis=0)) > 1e-2


def test_paper_vs_note_momentum_prior_is_delta_tilde():
    """(vogn.7): m <- beta1 m + (ghat + delta~ mu), delta~ = tau delta / N_eff; the transcribed
    line's delta mu differs by (delta - delta~) mu."""
    # checks (vogn.7)
    state, cfg, new, info, G = _paper_vs_note_step()
    dt = 2.0 * 2.0 / 6.0                                        # (vogn.2)
    note = 0.5 * state.m + (G.mean(axis=0) + dt * state.mu)     # (vogn.7)
    printed = 0.5 * state.m + (G.mean(axis=0) + 2.0 * state.mu)
    assert_close(new.m, note, EXACT_F64, "m")
    assert_close(printed - new.m, (2.0 - dt) * state.mu, EXACT_F64, "printed - note")


@pytest.mark.parametrize("tau", [1.0, 2.0])
def test_paper_vs_note_curvature_average_has_no_tau(tau):
    """(vogn.8): s <- (1 - beta2) s + beta2 hhat; the transcribed (1 - tau beta2) s + beta2 hhat
    agrees at tau = 1 only."""
    # checks (vogn.8)
    state, cfg, new, info, G = _paper_vs_note_step(tau=tau, beta2=0.25)
    hhat = (G ** 2).mean(axis=0)                                # (vogn.5)
    note = 0.75 * state.s + 0.25 * hhat                         # (vogn.8)
    printed = (1 - tau * 0.25) * state.s + 0.25 * hhat
    assert_close(new.s, note, EXACT_F64, "s")
    assert (_rel(printed, note) <= EXACT_F64) == (tau == 1.0)
