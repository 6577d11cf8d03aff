"""Laplace predictives for classification and by sampling (refbayes.methods.laplace,
(laplace.14)-(laplace.16)): the probit formula written literally, the Monte Carlo link against
a dense re-implementation and against quadrature of the expectation it estimates, linearized ==
sampling draw by draw for a linear model, the sampling predictive against a dense
re-implementation and against the exact BLR predictive, float32, and bad input."""
import numpy as np
import pytest
from scipy.integrate import quad
from scipy.special import expit

from refbayes.datasets import make_logistic_regression
from refbayes.methods import laplace
from refbayes.models import MLP, LogisticRegression
from tests.reference import laplace_dense as ref
from tests.tolerances import EXACT_F32, EXACT_F64, MC_SIGMAS, assert_close

# fit here is mostly at points that are not a MAP (the identities tested hold at any theta); its
# non-stationarity UserWarning is tested in test_laplace.py (test_fit_warns_away_from_a_minimum)
pytestmark = pytest.mark.filterwarnings(
    "ignore:laplace.fit. theta_map is not a stationary point:UserWarning")

N, P = 30, 3
NOISE = 4.0


def _logistic(structure="full", seed=0):
    s = make_logistic_regression(N, P, seed)
    model = LogisticRegression(P)
    theta = 0.5 * np.random.default_rng(seed + 1).standard_normal(model.D)
    state = laplace.fit(model, theta, s.X, s.y.astype(float),
                        laplace.LaplaceConfig(np.linspace(0.5, 2.0, model.D), structure))
    return model, state, s.X[:5]


def _mlp(likelihood, structure="full", seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, 3))
    if likelihood == "gaussian":
        y = np.sin(X.sum(axis=1)) + 0.1 * rng.standard_normal(N)
        model = MLP([3, 4, 1], activation="tanh", likelihood="gaussian", noise_precision=2.0)
    elif likelihood == "bernoulli":
        y = rng.integers(0, 2, N)
        model = MLP([3, 4, 1], activation="tanh", likelihood="bernoulli")
    else:
        y = rng.integers(0, 3, N)
        model = MLP([3, 4, 3], activation="tanh", likelihood="categorical")
    theta = 0.8 * model.init_theta(np.random.default_rng(seed + 1))
    state = laplace.fit(model, theta, X, y, laplace.LaplaceConfig(0.5, structure, "ggn"))
    return model, state, rng.standard_normal((4, 3))


def _problem(name, structure="full"):
    return _logistic(structure) if name == "logistic" else _mlp(name.split("-")[1], structure)


CLASSIFIERS = ["logistic", "mlp-bernoulli", "mlp-categorical"]


# ----------------------------------------------------------------------------- probit (laplace.14)

@pytest.mark.parametrize("structure", ["full", "diag"])
@pytest.mark.parametrize("problem", CLASSIFIERS)
def test_probit_is_laplace_torch_formula(problem, structure):
    """probs == the probit line written literally on the dense J inv(P) J^T; f_mean, f_var ==
    the dense oracle; Bernoulli probs are (M,), categorical (M, K) summing to 1."""
    # checks (laplace.14)
    model, state, X_star = _problem(problem, structure)
    pred = laplace.glm_class_predictive(model, state, X_star)
    f_mean, f_var = ref.glm_functional_dense(model, state.mu, laplace.dense_precision(state),
                                             X_star)
    assert_close(pred.f_mean, f_mean, EXACT_F64, "f_mean")
    assert_close(pred.f_var, f_var, EXACT_F64, "f_var")
    literal = ref.probit_literal(model.likelihood.name, f_mean, f_var)
    assert_close(pred.probs, literal, EXACT_F64, "probit")
    if model.likelihood.name == "bernoulli":
        assert pred.probs.shape == (X_star.shape[0],)
    else:
        assert pred.probs.shape == f_mean.shape
        assert_close(pred.probs.sum(axis=1), np.ones(X_star.shape[0]), EXACT_F64, "sum")
    # the variance matters: the MAP plug-in sigma(f_mean) / softmax(f_mean) is different
    plug_in = model.likelihood.mean(f_mean)
    assert np.max(np.abs(pred.probs - plug_in)) > 1e-4


# ----------------------------------------------------------------------------- MC link (laplace.15)

@pytest.mark.parametrize("structure", ["full", "diag"])
@pytest.mark.parametrize("problem", CLASSIFIERS)
def test_glm_mc_matches_dense(problem, structure):
    """The MC link with the caller's eps (K, S) == explicit inv(P), J Sigma J^T, one
    np.linalg.cholesky per test point and a loop over the draws."""
    # checks (laplace.15)
    model, state, X_star = _problem(problem, structure)
    K = model.sizes[-1]
    eps = np.random.default_rng(3).standard_normal((K, 7))
    pred = laplace.glm_class_predictive(model, state, X_star, "mc", eps)
    dense = ref.glm_mc_dense(model, state.mu, laplace.dense_precision(state), X_star, eps)
    assert pred.probs.shape == dense.shape
    assert_close(pred.probs, dense, EXACT_F64, "MC link")
    # eps = 0 (one draw) is the MAP plug-in
    zero = laplace.glm_class_predictive(model, state, X_star, "mc", np.zeros((K, 1)))
    assert_close(zero.probs, model.likelihood.mean(pred.f_mean), EXACT_F64, "eps = 0")


def test_glm_mc_estimates_the_gaussian_expectation():
    """The MC link converges to E[sigmoid(f)], f ~ N(f_mean, f_var), computed by adaptive
    quadrature: within MC_SIGMAS standard errors (sd from quadrature) at S = 40000. The probit
    approximation is not that expectation: it differs from the quadrature (no sampling) by more
    than 1e-4 at some point."""
    model, state, X_star = _logistic()
    X_star = 3.0 * X_star  # large f_var: the probit approximation's error is visible
    S = 40000
    eps = np.random.default_rng(11).standard_normal((1, S))
    pred = laplace.glm_class_predictive(model, state, X_star, "mc", eps)
    probit = laplace.glm_class_predictive(model, state, X_star).probs
    worst_probit = 0.0
    for m in range(X_star.shape[0]):
        mean, sd_f = pred.f_mean[m, 0], np.sqrt(pred.f_var[m, 0, 0])

        def moment(k):
            g = lambda z: expit(mean + sd_f * z) ** k * np.exp(-0.5 * z * z) / np.sqrt(2 * np.pi)
            return quad(g, -40.0, 40.0, epsabs=1e-13, epsrel=1e-13, limit=200)[0]

        e1, e2 = moment(1), moment(2)
        se = np.sqrt(e2 - e1 ** 2) / np.sqrt(S)
        assert abs(pred.probs[m] - e1) <= MC_SIGMAS * se, (m, pred.probs[m], e1, se)
        worst_probit = max(worst_probit, abs(probit[m] - e1))
    assert worst_probit > 1e-4  # probit is an approximation, not the expectation


# ----------------------------------------------------------------------------- linear model

@pytest.mark.parametrize("structure", ["full", "diag"])
def test_linear_model_linearized_equals_sampling_draw_by_draw(structure):
    """Logistic regression is linear in theta, so f(x*, theta_s) = f_lin(x*, theta_s): with
    eps_D (D, S) for ``sample`` and eps_K = J (theta_s - mu) / sqrt(f_var) (the same draw
    through the output-space square root), the MC link and the sampling predictive agree draw
    by draw and on average."""
    model, state, X_star = _logistic(structure)
    S = 6
    eps_D = np.random.default_rng(5).standard_normal((model.D, S))
    thetas = laplace.sample(state, eps_D)
    for m in range(X_star.shape[0]):
        x = X_star[m:m + 1]
        J = model.jacobian(state.mu, x)[0]  # (1, D)
        f_var = laplace.glm_class_predictive(model, state, x).f_var[0, 0, 0]
        eps_K = (J @ (thetas - state.mu[:, None])) / np.sqrt(f_var)  # (1, S)
        for s in range(S):
            lin = laplace.glm_class_predictive(model, state, x, "mc", eps_K[:, s:s + 1]).probs
            nn = laplace.mc_predictive(model, state, x, eps_D[:, s:s + 1]).y_mean
            assert_close(lin, nn, EXACT_F64, f"point {m}, draw {s}")
        lin = laplace.glm_class_predictive(model, state, x, "mc", eps_K).probs
        nn = laplace.mc_predictive(model, state, x, eps_D).y_mean
        assert_close(lin, nn, EXACT_F64, f"point {m}, average")


def test_network_linearized_differs_from_sampling():
    """On a tanh MLP the same construction does not make the two agree (so the test above can
    fail): f(x*, theta_s) != f_lin(x*, theta_s)."""
    model, state, X_star = _mlp("bernoulli")
    eps_D = 3.0 * np.random.default_rng(5).standard_normal((model.D, 1))
    theta = laplace.sample(state, eps_D)
    x = X_star[:1]
    J = model.jacobian(state.mu, x)[0]
    f_var = laplace.glm_class_predictive(model, state, x).f_var[0, 0, 0]
    eps_K = (J @ (theta - state.mu[:, None])) / np.sqrt(f_var)
    lin = laplace.glm_class_predictive(model, state, x, "mc", eps_K).probs
    nn = laplace.mc_predictive(model, state, x, eps_D).y_mean
    assert np.max(np.abs(lin - nn)) > 1e-4


# ---------------------------------------------------------------------------- sampling (laplace.16)

@pytest.mark.parametrize("structure", ["full", "diag"])
@pytest.mark.parametrize("problem", ["mlp-gaussian", "mlp-bernoulli", "mlp-categorical"])
def test_mc_predictive_matches_dense(problem, structure):
    """y_mean (and the Gaussian mixture covariance) == theta_s = mu + inv(chol(P))^T eps_s,
    a forward pass per draw, and the averages written out."""
    # checks (laplace.16)
    model, state, X_star = _problem(problem, structure)
    eps = np.random.default_rng(7).standard_normal((model.D, 9))
    pred = laplace.mc_predictive(model, state, X_star, eps)
    mean, var = ref.mc_predictive_dense(model, state.mu, laplace.dense_precision(state),
                                        X_star, eps)
    assert pred.f_samples.shape == (9, X_star.shape[0], model.sizes[-1])
    assert_close(pred.y_mean, mean, EXACT_F64, "y_mean")
    if var is None:
        assert pred.y_var is None
    else:
        assert_close(pred.y_var, var, EXACT_F64, "y_var")


def test_blr_mc_predictive_converges_to_exact():
    """Bayesian linear regression at the exact MAP: the sampling predictive's mean and mixture
    variance converge to the exact predictive (laplace.8) within MC_SIGMAS standard errors
    (f_s ~ N(m, v) exactly: se(mean) = sqrt(v / S), se(variance) = v sqrt(2 / S))."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((N, P))
    y = X @ np.array([1.0, -2.0, 0.5]) + 0.3 + rng.standard_normal(N) / np.sqrt(NOISE)
    model = MLP([P, 1], likelihood="gaussian", noise_precision=NOISE)
    delta = np.linspace(0.5, 2.0, model.D)
    mean, _ = ref.blr_posterior(X, y, NOISE, delta)
    state = laplace.fit(model, mean, X, y, laplace.LaplaceConfig(delta))
    X_star = np.random.default_rng(5).standard_normal((5, P))
    m, v_y = ref.blr_predictive(X, y, NOISE, delta, X_star)
    v_f = v_y - 1.0 / NOISE
    S = 20000
    pred = laplace.mc_predictive(model, state, X_star, np.random.default_rng(9).standard_normal(
        (model.D, S)))
    err_mean = np.abs(pred.y_mean[:, 0] - m) / np.sqrt(v_f / S)
    err_var = np.abs(pred.y_var[:, 0, 0] - v_y) / (v_f * np.sqrt(2.0 / S))
    assert np.all(err_mean <= MC_SIGMAS), err_mean
    assert np.all(err_var <= MC_SIGMAS), err_var
    # without the noise term the variance would be many standard errors off
    assert np.all(np.abs(pred.y_var[:, 0, 0] - 1.0 / NOISE - v_y) / (v_f * np.sqrt(2.0 / S))
                  > 10 * MC_SIGMAS)


def test_float32_matches_float64():
    model, state, X_star = _mlp("categorical")
    s32 = laplace.LaplaceState(*(a.astype(np.float32) if isinstance(a, np.ndarray) else a
                                 for a in state))
    eps = np.random.default_rng(0).standard_normal((3, 5))
    for link, e in (("probit", None), ("mc", eps)):
        p64 = laplace.glm_class_predictive(model, state, X_star, link, e).probs
        e32 = None if e is None else e.astype(np.float32)
        p32 = laplace.glm_class_predictive(model, s32, X_star.astype(np.float32), link, e32).probs
        assert p32.dtype == np.float32
        assert_close(p32, p64, EXACT_F32, link)
    epsD = np.random.default_rng(1).standard_normal((model.D, 4))
    a = laplace.mc_predictive(model, s32, X_star.astype(np.float32), epsD.astype(np.float32))
    assert a.y_mean.dtype == np.float32
    assert_close(a.y_mean, laplace.mc_predictive(model, state, X_star, epsD).y_mean, EXACT_F32,
                 "mc_predictive")


# ----------------------------------------------------------------------------- bad input

def test_glm_class_predictive_bad_input_raises():
    model, state, X_star = _mlp("categorical")
    eps = np.zeros((3, 2))
    cases = [
        (dict(link="bridge"), r"link: expected one of"),
        (dict(link="mc"), r"eps: expected a \(3, S\) array"),
        (dict(link="mc", eps=np.zeros((2, 2))), r"eps: expected shape \(3"),
        (dict(link="mc", eps=np.zeros((3, 0))), r"eps: expected at least one column"),
        (dict(link="mc", eps=eps.astype(np.float32)), r"eps"),
        (dict(link="mc", eps=np.full((3, 2), np.nan)), r"eps: expected finite"),
        (dict(eps=eps), r"eps: expected None for link 'probit'"),
        (dict(X_star=X_star[:, :2]), r"X_star: expected shape"),
        (dict(X_star=X_star[:0]), r"X_star: expected at least one row"),
        (dict(X_star=X_star.astype(np.float32)), r"X_star"),
    ]
    for kwargs, match in cases:
        args = dict(X_star=X_star, link="probit", eps=None)
        args.update(kwargs)
        with pytest.raises(ValueError, match=match):
            laplace.glm_class_predictive(model, state, **args)
    reg, rstate, rX = _mlp("gaussian")
    with pytest.raises(ValueError, match="model: expected a bernoulli or categorical"):
        laplace.glm_class_predictive(reg, rstate, rX)
    with pytest.raises(ValueError, match="model: expected a model with D"):
        laplace.glm_class_predictive(LogisticRegression(3), state, X_star)
    with pytest.raises(ValueError, match="state: expected a LaplaceState"):
        laplace.glm_class_predictive(model, tuple(state), X_star)


def test_mc_predictive_bad_input_raises():
    model, state, X_star = _mlp("gaussian")
    D = model.D
    cases = [
        (None, X_star, r"eps: expected a \(%d, S\) array" % D),
        (np.zeros((D - 1, 2)), X_star, r"eps: expected shape"),
        (np.zeros((D, 0)), X_star, r"eps: expected at least one column"),
        (np.zeros((D, 2), dtype=np.float32), X_star, r"eps"),
        (np.zeros((D, 2)), X_star[:, :1], r"X_star: expected shape"),
    ]
    for eps, Xs, match in cases:
        with pytest.raises(ValueError, match=match):
            laplace.mc_predictive(model, state, Xs, eps)


def test_linearized_outputs_are_f_plus_j_dtheta():
    """(laplace.7) at given samples: f(x*, theta*) + J (theta_s - theta*) against a per-sample
    dense product; for a model linear in theta (logistic regression) the network itself; and
    the samples enter only through theta_s - theta*."""
    rng = np.random.default_rng(4)
    X_star = rng.standard_normal((5, 3))
    model = MLP([3, 4, 3], activation="tanh", likelihood="categorical")
    theta = 0.5 * model.init_theta(np.random.default_rng(1))
    Theta = theta[:, None] + 0.3 * rng.standard_normal((model.D, 4))
    F = laplace.linearized_outputs(model, theta, Theta, X_star)
    J, f0 = model.jacobian(theta, X_star), model.forward(theta, X_star)
    for s in range(4):
        assert_close(F[s], f0 + J @ (Theta[:, s] - theta), EXACT_F64, f"sample {s}")
    assert np.max(np.abs(F[0] - model.forward(Theta[:, 0], X_star))) > 1e-3  # a real network
    lin = LogisticRegression(3)
    th = rng.standard_normal(lin.D)
    Th = th[:, None] + rng.standard_normal((lin.D, 3))
    F_lin = laplace.linearized_outputs(lin, th, Th, X_star)
    for s in range(3):
        assert_close(F_lin[s], lin.forward(Th[:, s], X_star), EXACT_F64, "linear model")
    with pytest.raises(ValueError, match=r"Theta: expected shape \(31, \*\)"):
        laplace.linearized_outputs(model, theta, Theta[:5], X_star)
    with pytest.raises(ValueError, match=r"Theta: expected at least one column"):
        laplace.linearized_outputs(model, theta, Theta[:, :0], X_star)
