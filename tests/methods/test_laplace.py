"""The Laplace approximation (refbayes.methods.laplace) against closed forms and dense oracles:
Bayesian linear regression (exact posterior, evidence and predictive), GGN == Hessian for
logistic regression, diagonal structures, the empirical Fisher, sampling as a linear map,
laplace-torch's evidence formula, the per-tensor prior, and bad input."""
import warnings

import numpy as np
import pytest

from refbayes.datasets import make_logistic_regression
from refbayes.methods import laplace
from refbayes.models import MLP, LogisticRegression
from tests.reference import laplace_dense as ref
from tests.tolerances import EXACT_F32, EXACT_F64, assert_close

# fit here is mostly at points that are not a MAP (the identities tested hold at any theta); its
# non-stationarity UserWarning is tested in test_laplace.py (test_fit_warns_away_from_a_minimum)
pytestmark = pytest.mark.filterwarnings(
    "ignore:laplace.fit. theta_map is not a stationary point:UserWarning")

N, P = 30, 3
NOISE = 4.0


def _blr(seed=0):
    """BLR data, the linear model, a per-parameter prior, and the exact posterior (laplace.8)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, P))
    y = X @ np.array([1.0, -2.0, 0.5]) + 0.3 + rng.standard_normal(N) / np.sqrt(NOISE)
    model = MLP([P, 1], likelihood="gaussian", noise_precision=NOISE)
    delta = np.linspace(0.5, 2.0, model.D)
    mean, Prec = ref.blr_posterior(X, y, NOISE, delta)
    return X, y, model, delta, mean, Prec


def _mlp(likelihood, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, 3))
    if likelihood == "gaussian":
        y = np.sin(X.sum(axis=1)) + 0.1 * rng.standard_normal(N)
        model = MLP([3, 4, 1], activation="tanh", likelihood="gaussian", noise_precision=2.0)
    else:
        y = rng.integers(0, 3, N)
        model = MLP([3, 4, 3], activation="tanh", likelihood="categorical")
    return X, y, model, 0.3 * model.init_theta(np.random.default_rng(seed + 1))


def _logistic(seed=0):
    s = make_logistic_regression(N, P, seed)
    model = LogisticRegression(P)
    theta = 0.5 * np.random.default_rng(seed + 1).standard_normal(model.D)
    return s.X, s.y.astype(float), model, theta


def _problem(name):
    if name == "logistic":
        return _logistic()
    return _mlp(name.split("-")[1])


# ----------------------------------------------------------------------------- BLR (laplace.8)

@pytest.mark.parametrize("curvature", ["hessian", "ggn"])
def test_blr_posterior_is_exact(curvature):
    """At the exact MAP, the full Laplace approximation is the exact posterior: mean and
    covariance (explicit inverse of tau_n X~^T X~ + diag(delta))."""
    # checks (laplace.1), (laplace.3)
    X, y, model, delta, mean, Prec = _blr()
    # theta* is the MAP: the gradient of the negative log joint vanishes there
    assert_close(model.grad(mean, X, y), -delta * mean, EXACT_F64, "stationarity")
    state = laplace.fit(model, mean, X, y, laplace.LaplaceConfig(delta, "full", curvature))
    assert_close(state.mu, mean, EXACT_F64, "mean")
    assert_close(laplace.dense_precision(state), Prec, EXACT_F64, "precision")
    assert_close(laplace.dense_covariance(state), np.linalg.inv(Prec), EXACT_F64, "covariance")


@pytest.mark.parametrize("prior", ["vector", "scalar"])
def test_blr_evidence_is_exact(prior):
    """(laplace.5) at the exact MAP equals log N(y; 0, X~ diag(delta)^{-1} X~^T + I / tau_n)."""
    X, y, model, delta, _, _ = _blr()
    if prior == "scalar":
        delta_cfg, delta = 0.7, np.full(model.D, 0.7)
    else:
        delta_cfg = delta
    mean, _ = ref.blr_posterior(X, y, NOISE, delta)
    cfg = laplace.LaplaceConfig(delta_cfg, "full", "ggn")
    state = laplace.fit(model, mean, X, y, cfg)
    lml = laplace.log_marginal_likelihood(model, state, X, y, cfg)
    exact = ref.blr_log_evidence(X, y, NOISE, delta)
    assert abs(lml - exact) <= EXACT_F64 * abs(exact), (lml, exact)
    # the evidence depends on where it is evaluated: away from the MAP it is not the evidence
    off = laplace.fit(model, mean + 0.1, X, y, cfg)
    assert abs(laplace.log_marginal_likelihood(model, off, X, y, cfg) - exact) > 1e-3


def test_blr_predictive_is_exact():
    """(laplace.7) equals the exact posterior predictive, full structure."""
    X, y, model, delta, mean, _ = _blr()
    state = laplace.fit(model, mean, X, y, laplace.LaplaceConfig(delta))
    X_star = np.random.default_rng(5).standard_normal((7, P))
    pred = laplace.glm_predictive(model, state, X_star)
    m, v = ref.blr_predictive(X, y, NOISE, delta, X_star)
    assert pred.f_mean.shape == (7, 1) and pred.f_var.shape == pred.y_var.shape == (7, 1, 1)
    assert_close(pred.f_mean[:, 0], m, EXACT_F64, "predictive mean")
    assert_close(pred.y_var[:, 0, 0], v, EXACT_F64, "predictive variance")
    assert_close(pred.f_var[:, 0, 0], v - 1.0 / NOISE, EXACT_F64, "function variance")


@pytest.mark.parametrize("problem", ["mlp-gaussian", "logistic"])
def test_lml_equals_laplace_torch_form(problem):
    """(laplace.5) == laplace-torch's log_likelihood - (log_det_ratio + scatter) / 2 (laplace.6),
    on a network (not at a MAP: the identity is algebraic) and on logistic regression."""
    X, y, model, theta = _problem(problem)
    delta = np.linspace(0.5, 3.0, model.D)
    for structure in ("full", "diag"):  # per-parameter delta; kron: test_laplace_kron.py
        cfg = laplace.LaplaceConfig(delta, structure, "ggn")
        state = laplace.fit(model, theta, X, y, cfg)
        lml = laplace.log_marginal_likelihood(model, state, X, y, cfg)
        other = ref.laplace_torch_lml(-model.loss(theta, X, y), laplace.dense_precision(state),
                                      delta, theta)
        assert abs(lml - other) <= EXACT_F64 * abs(other), (structure, lml, other)


def test_glm_predictive_diag_matches_dense():
    """The diagonal structure's predictive is J diag(1 / prec_diag) J^T (dense oracle)."""
    X, y, model, theta = _mlp("gaussian")
    state = laplace.fit(model, theta, X, y, laplace.LaplaceConfig(0.5, "diag", "ggn"))
    X_star = X[:5]
    pred = laplace.glm_predictive(model, state, X_star)
    J = model.jacobian(theta, X_star)
    Sigma = np.linalg.inv(laplace.dense_precision(state))
    assert_close(pred.f_var, np.einsum("mkd,de,mle->mkl", J, Sigma, J), EXACT_F64, "f_var")
    assert_close(pred.f_mean, model.forward(theta, X_star), EXACT_F64, "f_mean")


# ----------------------------------------------------------------------------- curvatures

def test_logistic_ggn_equals_hessian():
    """Logistic regression is a GLM: the GGN Laplace equals the Hessian Laplace; on a tanh MLP
    they differ (so the comparison can fail)."""
    X, y, model, theta = _logistic()
    fits = {c: laplace.fit(model, theta, X, y, laplace.LaplaceConfig(0.5, "full", c))
            for c in ("ggn", "hessian")}
    assert_close(fits["ggn"].Sigma_inv, fits["hessian"].Sigma_inv, EXACT_F64, "GGN vs Hessian")
    X, y, net, theta = _mlp("gaussian")
    a, b = net.ggn(theta, X, y), net.hessian(theta, X, y)
    assert np.max(np.abs(a - b)) > 1e-3 * np.max(np.abs(b))


@pytest.mark.parametrize("curvature", laplace.CURVATURES)
@pytest.mark.parametrize("problem", ["logistic", "mlp-gaussian", "mlp-categorical"])
def test_diag_is_the_diagonal_of_full(problem, curvature):
    """prec_diag of structure "diag" equals the diagonal of Sigma_inv of structure "full"."""
    X, y, model, theta = _problem(problem)
    delta = np.linspace(40.0, 50.0, model.D)  # large enough that H + diag(delta) is SPD
    full = laplace.fit(model, theta, X, y, laplace.LaplaceConfig(delta, "full", curvature))
    diag = laplace.fit(model, theta, X, y, laplace.LaplaceConfig(delta, "diag", curvature))
    assert diag.Sigma_inv is None and full.prec_diag is None
    assert_close(diag.prec_diag, np.diagonal(full.Sigma_inv), EXACT_F64, "diagonal")
    assert_close(laplace.dense_covariance(diag), np.diag(1.0 / diag.prec_diag), EXACT_F64, "cov")


@pytest.mark.parametrize("problem", ["logistic", "mlp-gaussian", "mlp-categorical"])
def test_ef_is_sum_of_outer_products(problem):
    """EF precision - diag(delta) == sum_i g_i g_i^T (autograd per-example loop), and differs
    from the GGN at the training labels."""
    X, y, model, theta = _problem(problem)
    state = laplace.fit(model, theta, X, y, laplace.LaplaceConfig(0.5, "full", "ef"))
    EF = ref.ef_outer_loop(model, theta, X, y)
    assert_close(state.Sigma_inv - 0.5 * np.eye(model.D), EF, EXACT_F64, "EF")
    assert np.max(np.abs(EF - model.ggn(theta, X, y))) > 1e-3 * np.max(np.abs(EF))


def test_indefinite_hessian_raises():
    """A Hessian that is not positive definite plus a tiny prior is reported, not returned."""
    X, y, model, _ = _mlp("gaussian")
    theta = 3.0 * model.init_theta(np.random.default_rng(7))
    H = model.hessian(theta, X, y)
    assert np.linalg.eigvalsh(H)[0] < -1e-3  # the setting really is indefinite
    with pytest.raises(ValueError, match="Sigma_inv: expected a symmetric positive definite"):
        laplace.fit(model, theta, X, y, laplace.LaplaceConfig(1e-6, "full", "hessian"))


# ----------------------------------------------------------------------------- sampling

@pytest.mark.parametrize("structure", ["full", "diag"])  # kron: test_laplace_kron.py
def test_sample_is_a_linear_map(structure):
    """eps = I: (theta - mu)(theta - mu)^T == the covariance (explicit inverse); eps = 0: mu."""
    X, y, model, theta = _mlp("categorical")
    state = laplace.fit(model, theta, X, y,
                        laplace.LaplaceConfig(np.linspace(0.5, 2.0, model.D), structure))
    D = model.D
    S = laplace.sample(state, np.eye(D)) - state.mu[:, None]
    assert_close(S @ S.T, np.linalg.inv(laplace.dense_precision(state)), EXACT_F64, "S S^T")
    assert_close(laplace.sample(state, np.zeros((D, 2))), np.tile(theta[:, None], 2), EXACT_F64,
                 "eps = 0")


@pytest.mark.parametrize("structure", ["full", "diag", "kron"])
def test_sample_draws_are_the_printed_map(structure):
    """(laplace.4) / (laplace.20) draw by draw, written out here: full mu + L^{-T} eps (L the
    lower Cholesky factor of Sigma_inv, by an explicit inverse), diag mu + eps / sqrt(prec_diag),
    kron per layer mu_l + Sigma_l^{1/2} vec E_l with the symmetric root of the dense block
    covariance (numpy's eigh of the dense Sigma_l, whose basis does not matter for the root).
    test_sample_is_a_linear_map sees only S S^T, which a sign flip of the solve (mu - L^{-T} eps),
    a transposed factor, or a non-symmetric root leaves unchanged; this test does not."""
    X, y, model, theta = _mlp("categorical")
    cfg = laplace.LaplaceConfig(1.5, structure, "ggn")
    state = laplace.fit(model, theta, X, y, cfg)
    eps = np.random.default_rng(4).standard_normal((model.D, 3))
    if structure == "full":
        L = np.linalg.cholesky(state.Sigma_inv)
        step = np.linalg.inv(L).T @ eps  # (laplace.4)
    elif structure == "diag":
        step = eps / np.sqrt(state.prec_diag)[:, None]  # (laplace.4)
    else:
        step, start = np.empty_like(eps), 0
        for A, B in state.kron:
            stop = start + A.shape[0] * B.shape[0]
            lam, Q = np.linalg.eigh(np.linalg.inv(np.kron(A, B) + 1.5 * np.eye(stop - start)))
            root = (Q * np.sqrt(lam)) @ Q.T  # Sigma_l^{1/2}, symmetric (laplace.20)
            step[start:stop] = root @ eps[start:stop]  # vec E_l row-major = theta_l's order
            start = stop
    assert_close(laplace.sample(state, eps), theta[:, None] + step, EXACT_F64, "draws")
    assert np.max(np.abs(step)) > 1e-2  # the perturbation is not negligible


def test_float32_matches_float64():
    X, y, model, theta = _mlp("gaussian")
    cfg64 = laplace.LaplaceConfig(0.5, "full", "ggn")
    s64 = laplace.fit(model, theta, X, y, cfg64)
    s32 = laplace.fit(model, theta.astype(np.float32), X.astype(np.float32),
                      y.astype(np.float32), cfg64)
    assert s32.Sigma_inv.dtype == np.float32
    assert_close(s32.Sigma_inv, s64.Sigma_inv, EXACT_F32, "Sigma_inv")
    eps = np.random.default_rng(0).standard_normal((model.D, 3))
    assert_close(laplace.sample(s32, eps.astype(np.float32)), laplace.sample(s64, eps),
                 EXACT_F32, "sample")


# ----------------------------------------------------------------------------- prior (laplace.9)

def test_expand_prior_precision_per_tensor():
    # checks (laplace.9)
    model = MLP([3, 4, 2], activation="tanh")
    values = np.array([1.0, 2.0, 3.0, 4.0])
    delta = laplace.expand_prior_precision(model, values)
    assert delta.shape == (model.D,)
    for k, (W, b) in enumerate(model.unflatten(delta)):
        assert np.all(W == values[2 * k]) and np.all(b == values[2 * k + 1])
    no_bias = LogisticRegression(3, intercept=False)
    assert np.all(laplace.expand_prior_precision(no_bias, np.array([2.5])) == 2.5)


# ----------------------------------------------------------------------------- bad input

def _base():
    X, y, model, theta = _logistic()
    cfg = laplace.LaplaceConfig(1.0)
    return X, y, model, theta, cfg, laplace.fit(model, theta, X, y, cfg)


# the bad cfgs are made with _replace, which is not re-validated (LaplaceConfig(0.0) itself
# raises, tested in test_config_checked_at_construction), so that fit's own check is tested
@pytest.mark.parametrize("change, match", [
    (lambda a: {**a, "cfg": a["cfg"]._replace(prior_precision=0.0)},
     r"cfg\.prior_precision: expected"),
    (lambda a: {**a, "cfg": a["cfg"]._replace(prior_precision=-1.0)},
     r"cfg\.prior_precision: expected"),
    (lambda a: {**a, "cfg": a["cfg"]._replace(prior_precision=float("nan"))},
     r"cfg\.prior_precision:"),
    (lambda a: {**a, "cfg": laplace.LaplaceConfig(np.ones(3))},
     r"cfg\.prior_precision: expected shape \(4\)"),
    (lambda a: {**a, "cfg": laplace.LaplaceConfig(np.ones(4, dtype=np.float32))},
     r"cfg\.prior_precision: expected dtype float64"),
    (lambda a: {**a, "cfg": a["cfg"]._replace(structure="lowrank")},
     r"cfg\.structure: expected"),
    (lambda a: {**a, "cfg": a["cfg"]._replace(curvature="fisher")},
     r"cfg\.curvature: expected"),
    (lambda a: {**a, "cfg": (1.0, "full", "ggn")}, r"cfg: expected a LaplaceConfig"),
    (lambda a: {**a, "theta": np.full(4, np.nan)}, r"theta_map: expected finite"),
    (lambda a: {**a, "theta": np.zeros(5)},  # fit has no state: the model's D is named
     r"theta_map: expected shape \(4,\) \(the model's D = 4 parameters\), got \(5,\)"),
    (lambda a: {**a, "model": "logistic"}, r"model: expected a refbayes.models model"),
    (lambda a: {**a, "X": a["X"][:, :2]}, r"X: expected shape"),
    (lambda a: {**a, "y": a["y"] + 0.5}, r"y: expected"),
], ids=["delta0", "delta-neg", "delta-nan", "delta-shape", "delta-dtype", "structure",
        "curvature", "cfg-type", "theta-nan", "theta-shape", "model", "X", "y"])
def test_fit_bad_input_raises(change, match):
    X, y, model, theta, cfg, _ = _base()
    a = change({"X": X, "y": y, "model": model, "theta": theta, "cfg": cfg})
    with pytest.raises(ValueError, match=match):
        laplace.fit(a["model"], a["theta"], a["X"], a["y"], a["cfg"])


def test_state_and_other_bad_input_raises():
    X, y, model, _, _, state = _base()
    D = model.D
    with pytest.raises(ValueError, match=r"eps: expected shape \(4, \*\)"):
        laplace.sample(state, np.ones((3, 2)))
    with pytest.raises(ValueError, match=r"eps: expected finite"):
        laplace.sample(state, np.full((D, 2), np.inf))
    with pytest.raises(ValueError, match=r"state: expected a LaplaceState"):
        laplace.dense_covariance(tuple(state))
    with pytest.raises(ValueError, match=r"state.Sigma_inv, state.prec_diag, state.kron: expected "
                                         r"exactly one"):
        laplace.dense_precision(state._replace(prec_diag=np.ones(D)))
    with pytest.raises(ValueError, match=r"state.Sigma_inv: expected a symmetric positive def"):
        laplace.dense_covariance(state._replace(Sigma_inv=-np.eye(D)))
    with pytest.raises(ValueError, match=r"state.Sigma_inv: expected a symmetric matrix"):
        laplace.sample(state._replace(Sigma_inv=np.triu(np.ones((D, D)))), np.eye(D))
    with pytest.raises(ValueError, match=r"state.prec_diag: expected .*> 0"):
        laplace.sample(state._replace(Sigma_inv=None, prec_diag=-np.ones(D)), np.eye(D))
    with pytest.raises(ValueError, match=r"cfg.prior_precision: expected the prior precision"):
        laplace.log_marginal_likelihood(model, state, X, y, laplace.LaplaceConfig(2.0))
    with pytest.raises(ValueError, match=r"cfg.structure: expected 'full'"):
        laplace.log_marginal_likelihood(model, state, X, y, laplace.LaplaceConfig(1.0, "diag"))
    with pytest.raises(ValueError, match=r"model: expected a Gaussian likelihood"):
        laplace.glm_predictive(model, state, X)
    net = MLP([P, 1], likelihood="gaussian")
    with pytest.raises(ValueError, match=r"X_star: expected shape \(\*, 3\)"):
        laplace.glm_predictive(net, state, X[:, :2])
    with pytest.raises(ValueError, match=r"X_star: expected at least one row"):
        laplace.glm_predictive(net, state, X[:0])
    with pytest.raises(ValueError, match=r"state.mu, X_star: expected one dtype"):
        laplace.glm_predictive(net, state, X.astype(np.float32))
    with pytest.raises(ValueError, match=r"values: expected shape \(2\)"):
        laplace.expand_prior_precision(net, np.ones(3))
    with pytest.raises(ValueError, match=r"values: expected .*> 0"):
        laplace.expand_prior_precision(net, np.array([1.0, 0.0]))


def test_curvature_names_the_models_D_for_a_theta_of_the_wrong_length():
    X, y, model, theta, cfg, _ = _base()
    with pytest.raises(ValueError, match=r"theta_map: expected shape \(4,\) \(the model's D = 4"):
        laplace.curvature(model, np.zeros(5), X, y, cfg)


def test_fit_warns_away_from_a_minimum():
    # L(theta) = sum_i l_i + (1/2) delta |theta|^2: its minimiser passes silently (the test
    # runs with every warning an error), a point off it is named with |grad L|_2 and the bound
    X, y, model, _, cfg, _ = _base()
    from scipy.optimize import minimize
    res = minimize(lambda th: model.loss(th, X, y) + 0.5 * th @ th,
                   np.zeros(model.D), jac=lambda th: model.grad(th, X, y) + th,
                   method="L-BFGS-B", options={"gtol": 1e-12, "ftol": 1e-15})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        laplace.fit(model, res.x, X, y, cfg)
    off = res.x + 1e-2
    g = np.linalg.norm(model.grad(off, X, y) + off)
    bound = laplace.STATIONARY_RTOL * (np.linalg.norm(model.grad(off, X, y)) + np.linalg.norm(off))
    assert g > bound
    with pytest.warns(UserWarning, match=rf"\|grad L\|_2 = {g:.3g} > {bound:.3g} = "
                                         r"STATIONARY_RTOL \(0\.001\)") as rec:
        state = laplace.fit(model, off, X, y, cfg)
    assert len(rec) == 1 and rec[0].filename == __file__  # stacklevel: the caller's line
    np.testing.assert_array_equal(state.mu, off)  # the state is returned all the same
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quiet = laplace.fit(model, off, X, y, cfg, check_stationary=False)
    np.testing.assert_array_equal(quiet.Sigma_inv, state.Sigma_inv)
    with pytest.raises(ValueError, match=r"^check_stationary: expected a bool, got 1"):
        laplace.fit(model, off, X, y, cfg, check_stationary=1)
