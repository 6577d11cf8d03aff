"""Evidence optimisation of the Laplace approximation (refbayes.methods.laplace,
(laplace.10)-(laplace.13), (laplace.17)): swapping the prior precision and the noise precision
without a refit equals a refit, the closed-form gradient equals autograd, the optimiser's
result is stationary, alternating MAP refits reach the exact Bayesian linear regression evidence
maximiser, the grid and Adam paths follow their literal definitions, and bad input."""
import autograd
import numpy as np
import pytest
from scipy.optimize import minimize

from refbayes.methods import laplace
from refbayes.methods.laplace import _diag_covariance, _with_prior_precision
from refbayes.models import MLP
from tests.reference import laplace_dense as ref
from tests.tolerances import EVIDENCE_OPTIMUM, EVIDENCE_STATIONARY, EXACT_F64, assert_close

# fit here is mostly at points that are not a MAP (the identities tested hold at any theta); its
# non-stationarity UserWarning is tested in test_laplace.py (test_fit_warns_away_from_a_minimum)
pytestmark = pytest.mark.filterwarnings(
    "ignore:laplace.fit. theta_map is not a stationary point:UserWarning")

N, P = 30, 3
NOISE = 4.0


def _blr_data(seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, P))
    y = X @ np.array([1.0, -2.0, 0.5]) + 0.3 + rng.standard_normal(N) / np.sqrt(NOISE)
    return X, y


def _net(tau=2.0, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, 3))
    y = np.sin(X.sum(axis=1)) + 0.1 * rng.standard_normal(N)
    model = MLP([3, 4, 1], activation="tanh", likelihood="gaussian", noise_precision=tau)
    return X, y, model, 0.5 * model.init_theta(np.random.default_rng(seed + 1))


DELTA = np.linspace(40.0, 50.0, 21)  # large enough that H + diag(delta) is SPD for the Hessian


# ----------------------------------------------------------------------------- (laplace.10)

@pytest.mark.parametrize("structure", ["full", "diag"])
@pytest.mark.parametrize("new", ["scalar", "vector"])
def test_with_prior_precision_equals_refit(structure, new):
    """P - diag(delta_old) + diag(delta_new) == fit with delta_new; diag(Sigma) == the diagonal
    of dense_covariance."""
    X, y, model, theta = _net()
    state = laplace.fit(model, theta, X, y, laplace.LaplaceConfig(DELTA[:model.D], structure))
    delta = np.full(model.D, 0.3) if new == "scalar" else np.linspace(0.2, 3.0, model.D)
    swapped = _with_prior_precision(state, delta)
    refit = laplace.fit(model, theta, X, y, laplace.LaplaceConfig(delta, structure))
    assert_close(laplace.dense_precision(swapped), laplace.dense_precision(refit), EXACT_F64,
                 "precision")
    assert_close(swapped.prior_prec, delta, EXACT_F64, "prior_prec")
    assert_close(_diag_covariance(refit), np.diagonal(laplace.dense_covariance(refit)),
                 EXACT_F64, "diag(Sigma)")


# ----------------------------------------------------------------------------- (laplace.11)-(13)

@pytest.mark.parametrize("structure", ["full", "diag"])
@pytest.mark.parametrize("curvature", ["ggn", "hessian", "ef"])
def test_evidence_at_new_hyperparameters_equals_refit(curvature, structure):
    """log Z at (delta', tau') without a refit == log_marginal_likelihood of a fit with
    MLP(noise_precision=tau') and delta' at the same theta: H scales as tau (GGN, Hessian) or
    tau^2 (EF) (laplace.12); with the fit's own values it is log_marginal_likelihood."""
    X, y, model, theta = _net()
    cfg = laplace.LaplaceConfig(DELTA[:model.D], structure, curvature)
    state = laplace.fit(model, theta, X, y, cfg)
    same = laplace.log_marginal_likelihood_grad(model, state, X, y, cfg)
    assert same.grad_log_noise_prec is None
    lml = laplace.log_marginal_likelihood(model, state, X, y, cfg)
    assert abs(same.log_marglik - lml) <= EXACT_F64 * abs(lml)
    for tau_new in (0.7, 2.0, 5.0):
        delta_new = np.linspace(100.0, 150.0, model.D)
        got = laplace.log_marginal_likelihood_grad(model, state, X, y, cfg, delta_new, tau_new)
        other = MLP([3, 4, 1], activation="tanh", likelihood="gaussian", noise_precision=tau_new)
        cfg_new = laplace.LaplaceConfig(delta_new, structure, curvature)
        refit = laplace.fit(other, theta, X, y, cfg_new)
        want = laplace.log_marginal_likelihood(other, refit, X, y, cfg_new)
        assert abs(got.log_marglik - want) <= EXACT_F64 * abs(want), (tau_new, got, want)


@pytest.mark.parametrize("curvature", ["ggn", "ef"])
def test_kron_evidence_at_a_new_noise_precision_equals_refit(curvature):
    """The K-FAC branch of (laplace.12): each B_l scaled by c = (tau'/tau)^p (p = 1 GGN, 2 EF),
    against a refit at noise precision tau' (its B_l built from the new likelihood). A branch
    that scaled A_l and B_l both (c^2), or neither, fails: the change of tau moves log Z here."""
    X, y, model, theta = _net()
    cfg = laplace.LaplaceConfig(2.0, "kron", curvature)
    state = laplace.fit(model, theta, X, y, cfg)
    lml = laplace.log_marginal_likelihood(model, state, X, y, cfg)
    for tau_new in (0.7, 5.0):
        got = laplace.log_marginal_likelihood_grad(model, state, X, y, cfg, None, tau_new)
        other = MLP([3, 4, 1], activation="tanh", likelihood="gaussian", noise_precision=tau_new)
        want = laplace.log_marginal_likelihood(other, laplace.fit(other, theta, X, y, cfg), X,
                                               y, cfg)
        assert abs(got.log_marglik - want) <= EXACT_F64 * abs(want), (tau_new, got, want)
        assert abs(want - lml) > 1e-2 * abs(lml)


@pytest.mark.parametrize("structure", ["full", "diag"])
@pytest.mark.parametrize("curvature", ["ggn", "ef"])
def test_evidence_gradient_matches_autograd(curvature, structure):
    """d log Z / d log delta (laplace.11) and d log Z / d log tau (laplace.13) == autograd of
    the evidence written as a function of (log delta, log tau) (tests/reference)."""
    X, y, model, theta = _net()
    cfg = laplace.LaplaceConfig(1.0, structure, curvature)
    state = laplace.fit(model, theta, X, y, cfg)
    H0 = laplace.dense_precision(state) - np.eye(model.D)
    H0 = np.diagonal(H0).copy() if structure == "diag" else H0
    r = y - model.forward(theta, X)[:, 0]
    E, power = 0.5 * r @ r, 2 if curvature == "ef" else 1
    delta, tau = np.linspace(0.3, 4.0, model.D), 3.0
    fn = lambda ld, lt: ref.lml_of_log_hyper(ld, lt, H0, 2.0, power, E, N, theta)
    got = laplace.log_marginal_likelihood_grad(model, state, X, y, cfg, delta, tau)
    assert abs(got.log_marglik - fn(np.log(delta), np.log(tau))) <= EXACT_F64 * abs(got.log_marglik)
    assert_close(got.grad_log_prior_prec, autograd.grad(fn, 0)(np.log(delta), np.log(tau)),
                 EXACT_F64, "d/d log delta")
    want_tau = autograd.grad(fn, 1)(np.log(delta), np.log(tau))
    assert abs(got.grad_log_noise_prec - want_tau) <= EXACT_F64 * abs(want_tau)
    # the EF rule matters: the GGN's power p = 1 in place of p = 2 gives another gradient
    wrong = lambda lt: ref.lml_of_log_hyper(np.log(delta), lt, H0, 2.0, 3 - power, E, N, theta)
    assert abs(autograd.grad(wrong)(np.log(tau)) - want_tau) > 1e-3 * abs(want_tau)


# ----------------------------------------------------------------------------- (laplace.17)

@pytest.mark.parametrize("prior_structure", laplace.PRIOR_STRUCTURES)
def test_lbfgs_optimum_is_stationary(prior_structure):
    """At the L-BFGS-B result the grouped gradient vanishes (to the rounding of log Z, see
    EVIDENCE_STATIONARY), the returned state is the
    precision at (delta*, tau*), and its evidence is log_marginal_likelihood of that state with
    a model of noise precision tau*.

    Every entry of theta is made nonzero: where theta_j = 0 for all j in a group,
    d log Z / d log delta_j = (1 - delta_j Sigma_jj) / 2 >= 0 (laplace.11), so log Z has no finite
    maximiser in delta_g, and whether L-BFGS-B reports convergence on its way to infinity
    depends on rounding (the zero biases of init_theta failed it under OpenBLAS's Haswell and
    Zen kernels)."""
    # checks (laplace.17)
    X, y, model, theta = _net()
    theta = theta + 0.1 * np.random.default_rng(2).standard_normal(model.D)
    assert np.all(theta != 0.0)
    cfg = laplace.LaplaceConfig(1.0, "full", "ggn")
    state = laplace.fit(model, theta, X, y, cfg)
    new, info = laplace.optimize_prior_precision(model, state, X, y, cfg, "lbfgs",
                                                 prior_structure, optimize_noise=True,
                                                 n_steps=1000)
    assert info.converged
    other = MLP([3, 4, 1], activation="tanh", likelihood="gaussian",
                noise_precision=info.noise_precision)
    cfg_new = laplace.LaplaceConfig(new.prior_prec, "full", "ggn")
    at = laplace.log_marginal_likelihood_grad(other, new, X, y, cfg_new, noise_precision=
                                              info.noise_precision)
    G, ids = laplace._prior_groups(model, state, prior_structure)
    g = np.bincount(ids, weights=at.grad_log_prior_prec, minlength=G)
    assert np.max(np.abs(g)) <= EVIDENCE_STATIONARY, (g, at)
    assert abs(at.grad_log_noise_prec) <= EVIDENCE_STATIONARY, (g, at)
    lml = laplace.log_marginal_likelihood(other, new, X, y, cfg_new)
    assert abs(lml - info.log_marglik) <= EXACT_F64 * abs(lml)
    assert info.log_marglik >= np.max(info.trace_log_marglik) - EXACT_F64 * abs(lml)
    refit = laplace.fit(other, theta, X, y, cfg_new)
    assert_close(new.Sigma_inv, refit.Sigma_inv, EXACT_F64, "state at the optimum")


@pytest.mark.parametrize("prior_structure", ["scalar", "layerwise"])
def test_blr_alternating_optimum_is_exact_evidence_maximiser(prior_structure):
    """Alternate the exact BLR MAP for (delta, tau) with the post-hoc optimiser: at its fixed
    point the total derivative of the exact evidence vanishes (the MAP's own derivative drops
    out), so it is scipy's maximiser of log N(y; 0, X~ diag(delta)^{-1} X~^T + I / tau)."""
    # checks (laplace.17)
    X, y = _blr_data()
    model0 = MLP([P, 1], likelihood="gaussian", noise_precision=NOISE)
    G, ids = laplace._prior_groups(model0, laplace.LaplaceState(
        np.zeros(model0.D), None, np.ones(model0.D), np.ones(model0.D)), prior_structure)
    values, tau = np.ones(G), NOISE
    for _ in range(60):
        model = MLP([P, 1], likelihood="gaussian", noise_precision=tau)
        delta = values[ids]
        mean, _ = ref.blr_posterior(X, y, tau, delta)
        cfg = laplace.LaplaceConfig(delta)
        state = laplace.fit(model, mean, X, y, cfg)
        _, info = laplace.optimize_prior_precision(model, state, X, y, cfg, "lbfgs",
                                                   prior_structure, optimize_noise=True,
                                                   n_steps=1000)
        values, tau = np.atleast_1d(info.prior_precision), info.noise_precision
    neg = lambda x: -ref.blr_log_evidence(X, y, np.exp(x[-1]), np.exp(x[:-1])[ids])
    res = minimize(neg, np.zeros(G + 1), method="Nelder-Mead",
                   options=dict(xatol=1e-12, fatol=1e-14, maxiter=20000, maxfev=20000))
    assert_close(np.append(values, tau), np.exp(res.x), EVIDENCE_OPTIMUM, "maximiser")
    # one post-hoc optimisation without the MAP refits stops elsewhere
    model = MLP([P, 1], likelihood="gaussian", noise_precision=NOISE)
    mean, _ = ref.blr_posterior(X, y, NOISE, np.ones(model.D))
    cfg = laplace.LaplaceConfig(1.0)
    _, once = laplace.optimize_prior_precision(model, laplace.fit(model, mean, X, y, cfg), X, y,
                                               cfg, "lbfgs", prior_structure,
                                               optimize_noise=True)
    once_x = np.append(np.atleast_1d(once.prior_precision), once.noise_precision)
    assert np.max(np.abs(once_x - np.exp(res.x))) > 100 * EVIDENCE_OPTIMUM * np.max(np.exp(res.x))


def test_grid_is_argmax_of_refits():
    """"grid": each trace entry is log_marginal_likelihood of a refit at that scalar delta;
    the result is the argmax."""
    X, y, model, theta = _net()
    cfg = laplace.LaplaceConfig(1.0)
    state = laplace.fit(model, theta, X, y, cfg)
    grid = np.array([0.05, 0.3, 1.0, 4.0, 20.0])
    new, info = laplace.optimize_prior_precision(model, state, X, y, cfg, "grid", grid=grid)
    refits = [laplace.log_marginal_likelihood(model, laplace.fit(
        model, theta, X, y, laplace.LaplaceConfig(d)), X, y, laplace.LaplaceConfig(d))
        for d in grid]
    assert_close(info.trace_log_marglik[:len(grid)], np.array(refits), EXACT_F64, "grid scores")
    assert_close(np.exp(info.trace_log_hyper[:len(grid), 0]), grid, EXACT_F64, "grid points")
    assert info.prior_precision == pytest.approx(grid[int(np.argmax(refits))], rel=EXACT_F64)
    assert_close(new.prior_prec, np.full(model.D, info.prior_precision), EXACT_F64, "state")


def test_grid_scores_indefinite_points_minus_inf():
    """With the Hessian, a tiny delta leaves P indefinite: laplace-torch scores such a point
    as an infinite loss; here it scores -inf and is never chosen."""
    X, y, model, _ = _net()
    theta = 3.0 * model.init_theta(np.random.default_rng(7))
    cfg = laplace.LaplaceConfig(1e4, "full", "hessian")
    state = laplace.fit(model, theta, X, y, cfg)
    grid = np.array([1e-6, 1e4])
    _, info = laplace.optimize_prior_precision(model, state, X, y, cfg, "grid", grid=grid)
    assert info.trace_log_marglik[0] == -np.inf and info.prior_precision == 1e4


def test_adam_follows_the_literal_loop():
    """"adam" (laplace-torch's marglik tuning): the iterates are torch.optim.Adam's on
    -log Z in (log delta_g, log tau) from init_prior_prec and the model's tau."""
    X, y, model, theta = _net()
    cfg = laplace.LaplaceConfig(1.0)
    state = laplace.fit(model, theta, X, y, cfg)
    _, info = laplace.optimize_prior_precision(model, state, X, y, cfg, "adam", "layerwise",
                                               optimize_noise=True, init_prior_prec=0.5,
                                               n_steps=15, lr=0.1)
    G, ids = laplace._prior_groups(model, state, "layerwise")

    def grad(x):
        at = laplace.log_marginal_likelihood_grad(model, state, X, y, cfg, np.exp(x[:G])[ids],
                                                  float(np.exp(x[G])))
        g = np.bincount(ids, weights=at.grad_log_prior_prec, minlength=G)
        return -np.append(g, at.grad_log_noise_prec)

    xs, x_end = ref.adam_literal(grad, np.append(np.full(G, np.log(0.5)), np.log(2.0)), 0.1, 15)
    assert_close(info.trace_log_hyper[:15], xs, EXACT_F64, "iterates")
    assert_close(np.append(info.prior_precision, info.noise_precision), np.exp(x_end), EXACT_F64,
                 "result")
    assert not info.converged


# ----------------------------------------------------------------------------- bad input

def test_bad_input_raises():
    X, y, model, theta = _net()
    cfg = laplace.LaplaceConfig(1.0)
    state = laplace.fit(model, theta, X, y, cfg)
    opt = lambda **kw: laplace.optimize_prior_precision(model, state, X, y, cfg, **kw)
    cases = [
        (dict(method="marglik"), r"method: expected one of"),
        (dict(prior_structure="per-layer"), r"prior_structure: expected one of"),
        (dict(method="grid", prior_structure="diag"), r"prior_structure: expected 'scalar'"),
        (dict(method="grid", optimize_noise=True), r"optimize_noise: expected False"),
        (dict(method="grid", grid=np.array([1.0, -1.0])), r"grid: expected > 0"),
        (dict(method="grid", grid=np.zeros(0)), r"grid: expected at least one"),
        (dict(grid=np.ones(3)), r"grid: expected None"),
        (dict(optimize_noise=1), r"optimize_noise: expected a bool"),
        (dict(init_prior_prec=0.0), r"init_prior_prec: expected"),
        (dict(lr=float("nan")), r"lr: expected"),
        (dict(gtol=-1.0), r"gtol: expected"),
        (dict(n_steps=0), r"n_steps: expected an int >= 1"),
    ]
    for kwargs, match in cases:
        with pytest.raises(ValueError, match=match):
            opt(**kwargs)
    grad = lambda *a, **kw: laplace.log_marginal_likelihood_grad(model, state, X, y, *a, **kw)
    for args, kwargs, match in [
        ((cfg,), dict(prior_precision=-1.0), r"prior_precision: expected"),
        ((cfg,), dict(prior_precision=np.ones(3)), r"prior_precision: expected shape"),
        ((cfg,), dict(prior_precision=np.ones(model.D, dtype=np.float32)),
         r"prior_precision: expected dtype"),
        ((cfg,), dict(noise_precision=0.0), r"noise_precision: expected"),
        ((laplace.LaplaceConfig(2.0),), {}, r"cfg\.prior_precision: expected the prior"),
        ((laplace.LaplaceConfig(1.0, "diag"),), {}, r"cfg\.structure: expected 'full'"),
    ]:
        with pytest.raises(ValueError, match=match):
            grad(*args, **kwargs)
    cls = MLP([3, 4, 3], activation="tanh", likelihood="categorical")
    yc = np.random.default_rng(0).integers(0, 3, N)
    th = 0.3 * cls.init_theta(np.random.default_rng(1))
    sc = laplace.fit(cls, th, X, yc, cfg)
    with pytest.raises(ValueError, match="noise_precision: expected None for a 'categorical'"):
        laplace.log_marginal_likelihood_grad(cls, sc, X, yc, cfg, noise_precision=2.0)
    with pytest.raises(ValueError, match="optimize_noise: expected False for a 'categorical'"):
        laplace.optimize_prior_precision(cls, sc, X, yc, cfg, optimize_noise=True)
