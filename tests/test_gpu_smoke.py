"""Every method on device arrays equals its NumPy run (the CuPy path, end to end).

For each method that ``driver.run`` knows (and each variant that takes another code path:
curvatures, eigensolvers, OGN), three driver steps from the same state, data and generator on
CuPy and on NumPy give the same state at EXACT_F64, and every array of the device state is a
device array (nothing came back to the host behind the caller's back). The same for Laplace
(each structure: fit, sample, the evidence and its gradient, the GLM and MC predictives), SWAG
(collect, sample, log-density), exact VI (full and mean field), and the metrics.

``xp`` is CuPy: a real device (``tools/device_check.py``), or the CuPy stand-in of
``tests/standin`` (``REFBAYES_CUPY_STANDIN=1``, CI's second pytest run). On a device the
arithmetic is cuBLAS / cuSOLVER's, and EXACT_F64 (1e-10 of the reference's scale) is still far
above float64 rounding after three steps.
"""
from __future__ import annotations

import numpy as np
import pytest

from refbayes import metrics
from refbayes.backend import to_numpy
from refbayes.methods import (adam, bbb, driver, exact_vi, ktied, laplace, mc_dropout, ngvi,
                              noisy_adam, noisy_kfac, records, riemannian_laplace, slang, swag,
                              vadam, vogn)
from refbayes.models import MLP, LogisticRegression
from tests.tolerances import EXACT_F64, assert_close

pytestmark = pytest.mark.gpu

N, M, STEPS = 24, 8, 3  # one epoch of three minibatches


@pytest.fixture
def cp():
    """CuPy (or its stand-in); the module is gpu-marked, so this runs only where one is there."""
    from refbayes.backend import cupy_available
    if not cupy_available():
        pytest.skip("CuPy with a CUDA device (or the stand-in, REFBAYES_CUPY_STANDIN=1) is not "
                    "available")
    import cupy
    return cupy


def _regression(seed=0):
    rng = np.random.default_rng(seed)
    model = MLP([3, 4, 1], activation="tanh", likelihood="gaussian")
    X = rng.standard_normal((N, 3))
    y = np.sin(X[:, 0]) + 0.1 * rng.standard_normal(N)
    return model, X, y, model.init_theta(rng)


def _classification(seed=1):
    rng = np.random.default_rng(seed)
    model = LogisticRegression(3)
    X = rng.standard_normal((N, 3))
    y = (X[:, 0] + 0.5 * rng.standard_normal(N) > 0).astype(float)
    return model, X, y, 0.1 * rng.standard_normal(model.D)


def to_device(value, xp):
    """Every NumPy array inside value (NamedTuples, tuples, lists) as an ``xp`` array."""
    if isinstance(value, np.ndarray):
        return xp.asarray(value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(to_device(v, xp) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(to_device(v, xp) for v in value)
    return value


def assert_same(got, ref, xp, what):
    """got (device) equals ref (NumPy) at EXACT_F64, and every array of got is on the device."""
    if isinstance(ref, np.ndarray):
        assert isinstance(got, xp.ndarray), \
            f"{what}: expected a device array, got {type(got).__name__}"
        assert got.shape == ref.shape and got.dtype == ref.dtype, what
        assert_close(to_numpy(got), ref, EXACT_F64, what)
    elif isinstance(ref, tuple) and hasattr(ref, "_fields"):
        for name in ref._fields:
            assert_same(getattr(got, name), getattr(ref, name), xp, f"{what}.{name}")
    elif isinstance(ref, (tuple, list)):
        assert len(got) == len(ref), what
        for i, (g, r) in enumerate(zip(got, ref)):
            assert_same(g, r, xp, f"{what}[{i}]")
    elif isinstance(ref, float):
        assert isinstance(got, float), f"{what}: expected a float, got {type(got).__name__}"
        assert_close(got, ref, EXACT_F64, what)
    else:
        assert got == ref, f"{what}: {got!r} != {ref!r}"


# --------------------------------------------------------------- driver.run: every method

def _driver_cases():
    reg, cls = _regression(), _classification()
    D = reg[0].D
    lam = np.linspace(0.5, 1.5, D)
    mu = reg[3]
    return {
        "ngvi-full-ef": (reg, ngvi.init_full(mu, 10.0 * np.eye(D)),
                         ngvi.NGVIConfig(N, lam, curvature="ef"), 2),
        "ngvi-full-exact": (cls, ngvi.init_full(cls[3], np.eye(cls[0].D)),
                            ngvi.NGVIConfig(N, np.ones(cls[0].D), curvature="exact"), 1),
        "ngvi-meanfield-ef": (reg, ngvi.init_meanfield(mu, 10.0 * np.ones(D)),
                              ngvi.NGVIConfig(N, lam, curvature="ef"), 2),
        "ngvi-meanfield-hess": (cls, ngvi.init_meanfield(cls[3], np.ones(cls[0].D)),
                                ngvi.NGVIConfig(N, np.ones(cls[0].D), curvature="hess"), 2),
        "slang-exact": (reg, slang.init(mu, 0.1 * np.ones((D, 2)), 10.0 * np.ones(D)),
                        slang.SLANGConfig(N, lam, L=2), 2),
        "slang-randomized": (reg, slang.init(mu, 0.1 * np.ones((D, 2)), 10.0 * np.ones(D)),
                             slang.SLANGConfig(N, lam, L=2, eig="randomized"), 2),
        "vogn-ef": (reg, vogn.init(mu, np.ones(D)), vogn.VOGNConfig(N, 1.0, alpha=1e-2), 2),
        "vogn-ggn": (reg, vogn.init(mu, np.ones(D)),
                     vogn.VOGNConfig(N, 1.0, alpha=1e-2, curvature="ggn"), 2),
        "ogn": (reg, vogn.init(mu, np.ones(D)), vogn.VOGNConfig(N, 1.0, alpha=1e-2), 0),
        "vadam": (reg, vadam.init(mu), vadam.VadamConfig(N, 1.0, alpha=1e-2), 2),
        "noisy-adam": (reg, noisy_adam.init(mu), noisy_adam.NoisyAdamConfig(N, 1.0, alpha=1e-2), 2),
        "bbb": (reg, bbb.init(mu, sigma0=0.1 * np.ones(D)), bbb.BBBConfig(N, 1.0, alpha=1e-2), 2),
        "mc-dropout": (reg, mc_dropout.init(mu), mc_dropout.MCDropoutConfig(N, p=0.2), 1),
        "map-adam": (reg, adam.init(mu), adam.MAPConfig(N, lam, adam.AdamConfig(alpha=1e-2)), 1),
        "sgd": (reg, swag.sgd_init(mu), swag.SGDConfig(N, 1.0, alpha=1e-3), 1),
        "ktied": (reg, ktied.init(mu, reg[0], 2, sigma0=0.1,
                                  xi=np.zeros(ktied.layout(reg[0], 2).P)),
                  ktied.KTiedConfig(N, 1.0, alpha=1e-2), 2),
    }


DRIVER_CASES = _driver_cases()


def test_the_cases_cover_every_method_of_the_driver():
    covered = {(type(state), type(cfg)) for _, state, cfg, _ in DRIVER_CASES.values()}
    assert covered == {(r.state, r.config) for r in records.RECORDS.values()}


def _run(problem, state, cfg, S, xp):
    model, X, y, _ = problem
    return driver.run(to_device(state, xp), to_device(cfg, xp), model, to_device(X, xp),
                      to_device(y, xp), rng=np.random.default_rng(5), epochs=STEPS * M // N, M=M,
                      S=S, oversample=2)


@pytest.mark.parametrize("case", sorted(DRIVER_CASES))
def test_three_driver_steps_on_the_device_equal_numpy(cp, case):
    problem, state, cfg, S = DRIVER_CASES[case]
    ref = _run(problem, state, cfg, S, np)
    got = _run(problem, state, cfg, S, cp)
    assert ref.t == STEPS
    assert_same(got, ref, cp, case)


# --------------------------------------------------------------- Laplace

LAPLACE_CASES = [(s, c) for s in laplace.STRUCTURES for c in ("ggn", "ef")] + [("full", "hessian")]


def _laplace_run(xp, structure, curvature, problem):
    model, X, y, theta = problem
    cfg = laplace.LaplaceConfig(prior_precision=2.0, structure=structure, curvature=curvature)
    Xd, yd, th = to_device(X, xp), to_device(y, xp), to_device(theta, xp)
    state = laplace.fit(model, th, Xd, yd, cfg)
    eps = np.random.default_rng(6).standard_normal((model.D, 3))
    X_star = to_device(X[:5], xp)
    return {
        "state": state,
        "sample": laplace.sample(state, to_device(eps, xp)),
        "log_marglik": laplace.log_marginal_likelihood(model, state, Xd, yd, cfg),
        "log_marglik_grad": laplace.log_marginal_likelihood_grad(model, state, Xd, yd, cfg),
        "glm": (laplace.glm_predictive(model, state, X_star) if model.likelihood.name == "gaussian"
                else laplace.glm_class_predictive(model, state, X_star)),
        "mc": laplace.mc_predictive(model, state, X_star, to_device(eps, xp)),
    }


@pytest.mark.parametrize("structure,curvature", LAPLACE_CASES)
def test_laplace_on_the_device_equals_numpy(cp, structure, curvature):
    problem = _classification() if curvature == "hessian" else _regression()
    ref = _laplace_run(np, structure, curvature, problem)
    got = _laplace_run(cp, structure, curvature, problem)
    for key in ref:
        assert_same(got[key], ref[key], cp, f"laplace {structure}/{curvature} {key}")


def test_laplace_class_predictive_on_the_device_equals_numpy(cp):
    model, X, y, theta = _classification()
    cfg = laplace.LaplaceConfig(prior_precision=2.0)
    ref = laplace.glm_class_predictive(model, laplace.fit(model, theta, X, y, cfg), X[:5])
    state = laplace.fit(model, cp.asarray(theta), cp.asarray(X), cp.asarray(y), cfg)
    got = laplace.glm_class_predictive(model, state, cp.asarray(X[:5]))
    assert_same(got, ref, cp, "glm_class_predictive")


# --------------------------------------------------------------- SWAG, exact VI, metrics

def _swag_run(xp):
    cfg = swag.SWAGConfig(K=3)
    thetas = np.random.default_rng(7).standard_normal((5, 6))
    state = swag.init(to_device(thetas[0], xp), cfg)
    for th in thetas:
        state, _ = swag.collect(state, to_device(th, xp), cfg)
    z1 = np.random.default_rng(8).standard_normal((6, 2))
    z2 = np.random.default_rng(9).standard_normal((3, 2))
    return {"state": state, "sample": swag.sample(state, to_device(z1, xp), to_device(z2, xp), cfg),
            "log_density": swag.log_density(state, to_device(z1, xp), cfg),
            "covariance": swag.dense_covariance(state, cfg)}


def test_swag_on_the_device_equals_numpy(cp):
    ref, got = _swag_run(np), _swag_run(cp)
    for key in ref:
        assert_same(got[key], ref[key], cp, f"swag {key}")


@pytest.mark.parametrize("fit", [exact_vi.fit_full, exact_vi.fit_meanfield],
                         ids=["full", "meanfield"])
def test_exact_vi_on_the_device_equals_numpy(cp, fit):
    _, X, y, _ = _classification()
    lam = np.ones(X.shape[1])
    ref = fit(X, y, lam, max_iter=50)
    got = fit(cp.asarray(X), cp.asarray(y), cp.asarray(lam), max_iter=50)
    # grad_norm at the optimum is what the stopping rule left (<= tol = 1e-10): rounding noise of
    # the reductions (4.10e-11 against 4.10e-11, 1.6e-5 relative, on an H100), so it is compared
    # as the golden traces compare a vanishing gradient, by its absolute size, not relatively
    assert max(got.grad_norm, ref.grad_norm) <= 1e-10, (got.grad_norm, ref.grad_norm)
    assert_same(got._replace(grad_norm=ref.grad_norm), ref, cp, fit.__name__)


def test_metrics_on_the_device_equal_numpy(cp):
    rng = np.random.default_rng(10)
    probs = rng.dirichlet(np.ones(3), size=20)
    y = rng.integers(0, 3, size=20)
    for name in ("nll", "accuracy", "brier", "ece", "mce", "misclassification_auroc"):
        f = getattr(metrics, name)
        assert f(cp.asarray(probs), cp.asarray(y)) == f(probs, y), name
    assert metrics.ood_auroc(cp.asarray(probs[:10]), cp.asarray(probs[10:])) == \
        metrics.ood_auroc(probs[:10], probs[10:])
    mean, var, t = rng.standard_normal(20), rng.random(20) + 0.1, rng.standard_normal(20)
    assert metrics.gaussian_nll(cp.asarray(mean), cp.asarray(var), cp.asarray(t)) == \
        metrics.gaussian_nll(mean, var, t)
    assert metrics.rmse(cp.asarray(mean), cp.asarray(t)) == metrics.rmse(mean, t)


# --------------------------------------------------------------- what refuses the device

def test_riemannian_laplace_refuses_device_arrays_with_its_clear_error(cp):
    """The geodesic ODE is solved by scipy on the host: device inputs are refused up front, by
    loss_fns (the network's callables) and by sample (the base point and velocities)."""
    model, X, y, theta = _regression()
    with pytest.raises(ValueError, match="NumPy"):
        riemannian_laplace.loss_fns(model, cp.asarray(X), cp.asarray(y), 1.0)
    grad_fn, hvp_fn = riemannian_laplace.loss_fns(model, X, y, 1.0)
    with pytest.raises(ValueError, match="NumPy"):
        riemannian_laplace.sample(cp.asarray(theta), cp.asarray(np.zeros((model.D, 1))), grad_fn,
                                  hvp_fn, riemannian_laplace.RiemannianLaplaceConfig())


def test_the_autograd_hessian_paths_refuse_device_arrays_naming_the_method(cp):
    """NGVI's curvature "hess" and Laplace's "hessian" on an MLP are autograd's (NumPy only):
    a ValueError names the method, the curvature and what runs on CuPy."""
    model, X, y, theta = _regression()
    D = model.D
    batch = ngvi.Batch(cp.asarray(X[:M]), cp.asarray(y[:M]))
    cfg = to_device(ngvi.NGVIConfig(N, np.ones(D), curvature="hess"), cp)
    eps = cp.asarray(np.zeros((D, 1)))
    for step, state in ((ngvi.step_full, ngvi.init_full(theta, np.eye(D))),
                        (ngvi.step_meanfield, ngvi.init_meanfield(theta, np.ones(D)))):
        with pytest.raises(ValueError, match=rf'ngvi.{step.__name__}: cfg.curvature "hess".*'
                                             r'autograd.*on CuPy use cfg.curvature "ef"'):
            step(to_device(state, cp), batch, eps, cfg, model)
    with pytest.raises(ValueError, match=r'laplace: cfg.curvature "hessian".*autograd.*'
                                         r'on CuPy use cfg.curvature "ggn" or "ef"'):
        laplace.fit(model, cp.asarray(theta), cp.asarray(X), cp.asarray(y),
                    laplace.LaplaceConfig(curvature="hessian"))


# --------------------------------------------------------------- synchronisations (stand-in only)

# Implicit device synchronisations (a value read back to the host) per driver step after the
# first, inside refbayes.unchecked(): driver.run's one finite-state check of the new state, and
# the step's own error where the method has one that a finite state would not show:
#   ngvi full: the new precision must be positive definite (the status of its Cholesky factor;
#              an indefinite "hess" estimate);
#   ngvi mean field: the new precision diagonal must be > 0 (the same, diagonal);
#   slang: d must stay > 0 (randomized fast_eig can overshoot diag(W W^T));
#   ngvi "exact": also the quadrature's verified range |m| <= M_MAX, 0 <= v <= V_MAX.
SYNCS_PER_STEP = {case: 1 for case in DRIVER_CASES}
SYNCS_PER_STEP.update({"ngvi-full-ef": 2, "ngvi-full-exact": 3, "ngvi-meanfield-ef": 2,
                       "ngvi-meanfield-hess": 2, "slang-exact": 2, "slang-randomized": 2})


@pytest.mark.parametrize("case", sorted(DRIVER_CASES))
def test_unchecked_driver_steps_synchronise_only_where_a_check_needs_it(cp, case):
    if not hasattr(cp, "_standin"):
        pytest.skip("counting synchronisations needs the CuPy stand-in (REFBAYES_CUPY_STANDIN=1)")
    (model, X, y, _), state, cfg, S = DRIVER_CASES[case]
    counts = []
    with cp._standin.count_syncs() as log:
        driver.run(to_device(state, cp), to_device(cfg, cp), model, cp.asarray(X), cp.asarray(y),
                   rng=np.random.default_rng(5), epochs=2, M=M, S=S, oversample=2,
                   progress=lambda _: counts.append(log.implicit))
    per_step = {b - a for a, b in zip(counts, counts[1:])}
    assert per_step == {SYNCS_PER_STEP[case]}, dict(log.by_site)


@pytest.mark.parametrize("damping", noisy_kfac.DAMPINGS)
def test_unchecked_noisy_kfac_steps_synchronise_only_at_refreshes(cp, damping):
    """Between refreshes of the factors' inverses (the first step builds them, then every
    T_inv = 3 steps: steps 1, 3, 6) a Noisy K-FAC step reads nothing back; a refresh reads
    back, per layer, "exact": the damped eigenvalues' sign (one), and
    "factored": the damping split pi's traces (one per factored_chol, two calls) and, for each
    of the four damped factors, its Cholesky status and its finite, positive diagonal (eight)."""
    if not hasattr(cp, "_standin"):
        pytest.skip("counting synchronisations needs the CuPy stand-in (REFBAYES_CUPY_STANDIN=1)")
    import refbayes
    from tests.methods.test_noisy_kfac import _cycle_inputs
    model, batch, state, eps = _cycle_inputs()
    cfg = noisy_kfac.NoisyKFACConfig(20, eta=0.5, alpha=0.05, beta=0.3, gamma_ex=1e-2, T_inv=3,
                                     damping=damping)
    state, batch = to_device(state, cp), to_device(batch, cp)
    per_refresh = {"exact": 1, "factored": 10}[damping] * (len(model.sizes) - 1)
    counts = []
    for e in eps:
        with cp._standin.count_syncs() as log, refbayes.unchecked():
            state, _ = noisy_kfac.step(state, batch, cp.asarray(e), cfg, model)
        counts.append(log.implicit)
    assert counts == [per_refresh if t == 1 or t % 3 == 0 else 0 for t in range(1, len(eps) + 1)]
