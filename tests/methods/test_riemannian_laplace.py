"""The geodesic core of the Riemannian Laplace approximation (refbayes.methods.riemannian_laplace)
against the printed general Christoffel form of the geodesic equation with dM/dc from autograd
(tests/reference/riemannian_laplace_dense.py), the invariants of a geodesic (conserved metric
speed, Exp(t v) = c(t), straight lines under a constant metric, Exp(0) = base point), the dense
Hessian path, and its input validation."""
import numpy as np
import pytest

from refbayes.methods import riemannian_laplace as rl
from refbayes.models import MLP, LogisticRegression
from tests.reference import riemannian_laplace_dense as ref
from tests.reference.per_example import spec_of
from tests.tolerances import EXACT_F64, ODE_F64, assert_close, rel_err

N, DELTA = 20, 1.0
TIGHT = rl.RiemannianLaplaceConfig("DOP853", rtol=1e-12, atol=1e-12)


class Problem:
    """L(theta) = model.loss + (delta / 2) |theta|^2 on N rows, its callables and its MAP."""

    def __init__(self, name, seed=0):
        rng = np.random.default_rng(seed)
        self.X = rng.standard_normal((N, 2))
        if name == "logistic":
            self.model = LogisticRegression(2)
            self.y = (self.X @ np.array([1.5, -1.0]) + rng.standard_normal(N) > 0).astype(float)
        else:
            self.model = MLP([2, 3, 1], "tanh", "gaussian", noise_precision=4.0)
            self.y = np.sin(self.X.sum(axis=1)) + 0.1 * rng.standard_normal(N)
        self.D = self.model.D
        self.L = ref.posterior_loss(spec_of(self.model), self.X, self.y, DELTA)
        self.theta_map = self._newton(0.1 * rng.standard_normal(self.D))

    def grad(self, theta):
        return self.model.grad(theta, self.X, self.y) + DELTA * theta

    def hvp(self, theta, u):
        return self.model.hvp(theta, u, self.X, self.y) + DELTA * u

    def hessian(self, theta):
        return self.model.hessian(theta, self.X, self.y) + DELTA * np.eye(self.D)

    def hvp_dense(self, theta, u):
        return self.hessian(theta) @ u

    def _newton(self, theta):
        for _ in range(50):
            theta = theta - np.linalg.solve(self.hessian(theta), self.grad(theta))
        assert np.max(np.abs(self.grad(theta))) < 1e-10
        return theta

    def velocity(self, seed=1, scale=2.0):
        """v = scale eps / sqrt(tr(H) / D) at the MAP: a draw of the Laplace scale, stretched so
        the geodesic bends (the MLP's Hessian there need not be positive definite)."""
        eps = np.random.default_rng(seed).standard_normal(self.D)
        return scale * eps / np.sqrt(np.trace(self.hessian(self.theta_map)) / self.D)


_PROBLEMS = {}


def problem(name):
    if name not in _PROBLEMS:
        _PROBLEMS[name] = Problem(name)
    return _PROBLEMS[name]


def _points(p, seed=3):
    """Three (c, c') pairs at random points around the MAP (g != 0 there; at the MAP itself
    g = 0 and both forms of c'' vanish)."""
    rng = np.random.default_rng(seed)
    return [(p.theta_map + 0.7 * rng.standard_normal(p.D), rng.standard_normal(p.D)) for _ in range(3)]


# ----------------------------------------------------------------------------- the right-hand side

@pytest.mark.parametrize("name", ["logistic", "mlp"])
def test_acceleration_equals_printed_christoffel_form(name):
    """(riemannian_laplace.7) = (riemannian_laplace.3): the simplified right-hand side equals the
    printed general form with dM/dc from autograd and an explicit solve against M, to 1e-10."""
    p = problem(name)
    for c, cdot in _points(p):
        a = rl.geodesic_acceleration(p.grad, p.hvp, c, cdot)
        dense = ref.christoffel_acceleration(p.L, c, cdot)
        assert_close(a, dense, EXACT_F64, "c'' vs Christoffel form")
        assert np.max(np.abs(dense)) > 1e-3  # away from the MAP c'' is not 0


@pytest.mark.parametrize("variant", ["no Sherman-Morrison denominator", "1 + |g| denominator",
                                     "factor 1/2 kept", "plus sign"])
def test_wrong_simplifications_fail_the_dense_check(variant):
    """The dense check separates (riemannian_laplace.7) from near misses of the derivation."""
    p = problem("logistic")
    c, cdot = _points(p)[1]
    g, quad = p.grad(c), cdot @ p.hvp(c, cdot)
    wrong = {
        "no Sherman-Morrison denominator": -g * quad,
        "1 + |g| denominator": -g * quad / (1.0 + np.linalg.norm(g)),
        "factor 1/2 kept": -0.5 * g * quad / (1.0 + g @ g),
        "plus sign": g * quad / (1.0 + g @ g),
    }[variant]
    assert rel_err(wrong, ref.christoffel_acceleration(p.L, c, cdot)) > 1e-3


def test_squared_speed_is_the_dense_quadratic_form():
    """(riemannian_laplace.2): |c'|^2 + (g^T c')^2 = c'^T (I + g g^T) c' with M formed densely."""
    p = problem("mlp")
    for c, cdot in _points(p):
        M = np.asarray(ref.metric_fn(p.L)(c))
        assert_close(np.array(rl.squared_speed(p.grad, c, cdot)), np.array(cdot @ M @ cdot),
                     EXACT_F64, "speed")


# ----------------------------------------------------------------------------- the exponential map

def test_exp_map_equals_the_dense_christoffel_solve():
    """c(1), c'(1) of exp_map equal a DOP853 solve of the printed Christoffel form, to the ODE
    tolerance; the geodesic is not the straight line theta + v."""
    p = problem("logistic")
    v = p.velocity()
    c1, info = rl.exp_map(p.theta_map, v, p.grad, p.hvp, TIGHT)
    c_ref, cdot_ref = ref.solve_geodesic(p.L, p.theta_map, v)
    assert_close(c1, c_ref, ODE_F64, "c(1)")
    assert_close(info.cdot, cdot_ref, ODE_F64, "c'(1)")
    assert np.array_equal(info.c, c1) and info.status == 0 and info.nfev > 0 and info.n_steps > 0
    assert rel_err(p.theta_map + v, c_ref) > 1e-2


@pytest.mark.parametrize("name", ["logistic", "mlp"])
def test_metric_speed_is_conserved(name):
    """(riemannian_laplace.11): c'^T M(c) c' at t = 1 equals its value at t = 0 to the ODE
    tolerance; the official defaults (RK45, atol 1e-3) miss it by more than that."""
    p = problem(name)
    v = p.velocity()
    s0 = rl.squared_speed(p.grad, p.theta_map, v)
    c1, info = rl.exp_map(p.theta_map, v, p.grad, p.hvp, TIGHT)
    assert_close(np.array(rl.squared_speed(p.grad, c1, info.cdot)), np.array(s0), ODE_F64, "speed")
    c1, info = rl.exp_map(p.theta_map, v, p.grad, p.hvp, rl.RiemannianLaplaceConfig())
    assert rel_err(np.array(rl.squared_speed(p.grad, c1, info.cdot)), np.array(s0)) > ODE_F64


def test_constant_metric_gives_a_straight_line():
    """(riemannian_laplace.13): L(theta) = a^T theta has the constant metric I + a a^T and a zero
    Hessian, so c'' = 0 and Exp_theta(v) = theta + v (to roundoff), c'(1) = v."""
    rng = np.random.default_rng(4)
    D = 5
    a, theta, v = rng.standard_normal(D), rng.standard_normal(D), 3.0 * rng.standard_normal(D)
    for cfg in (rl.RiemannianLaplaceConfig(), TIGHT):
        c1, info = rl.exp_map(theta, v, lambda th: a.copy(), lambda th, u: np.zeros(D), cfg)
        assert_close(c1, theta + v, EXACT_F64, "straight line")
        assert_close(info.cdot, v, EXACT_F64, "constant velocity")


def test_zero_velocity_returns_the_base_point_exactly():
    """v = 0: c'' = 0 at every stage, so every Runge-Kutta stage adds exact zeros."""
    p = problem("mlp")
    theta = _points(p)[0][0]  # a point with g != 0
    for cfg in (rl.RiemannianLaplaceConfig(), TIGHT):
        c1, info = rl.exp_map(theta, np.zeros(p.D), p.grad, p.hvp, cfg)
        assert np.array_equal(c1, theta) and np.array_equal(info.cdot, np.zeros(p.D))


@pytest.mark.parametrize("t", [0.4, 1.7])
def test_exp_of_scaled_velocity_is_the_geodesic_at_t(t):
    """(riemannian_laplace.10): Exp_theta(t v) = c_v(t) and its end velocity is t c_v'(t), with
    c_v solved on [0, t] by the dense Christoffel oracle."""
    p = problem("logistic")
    v = p.velocity(seed=2)
    c1, info = rl.exp_map(p.theta_map, t * v, p.grad, p.hvp, TIGHT)
    c_t, cdot_t = ref.solve_geodesic(p.L, p.theta_map, v, t1=t)
    assert_close(c1, c_t, ODE_F64, "Exp(t v) vs c(t)")
    assert_close(info.cdot, t * cdot_t, ODE_F64, "c'_{tv}(1) vs t c'(t)")
    c_v, _ = ref.solve_geodesic(p.L, p.theta_map, v)
    assert rel_err(c1, p.theta_map + t * (c_v - p.theta_map)) > 1e-3  # not a rescaled chord


def test_dense_hessian_path_equals_hvp_path():
    """hvp_fn = (model.hessian + delta I) @ u and hvp_fn = model.hvp + delta u give the same
    right-hand side (to roundoff) and the same geodesic (to the ODE tolerance)."""
    p = problem("mlp")
    for c, cdot in _points(p):
        assert_close(rl.geodesic_acceleration(p.grad, p.hvp_dense, c, cdot),
                     rl.geodesic_acceleration(p.grad, p.hvp, c, cdot), EXACT_F64, "rhs")
    v = p.velocity()
    c_dense, i_dense = rl.exp_map(p.theta_map, v, p.grad, p.hvp_dense, TIGHT)
    c_hvp, i_hvp = rl.exp_map(p.theta_map, v, p.grad, p.hvp, TIGHT)
    assert_close(c_dense, c_hvp, ODE_F64, "c(1)")
    assert_close(i_dense.cdot, i_hvp.cdot, ODE_F64, "c'(1)")
    assert rel_err(p.theta_map + v, c_hvp) > 1e-3


# ----------------------------------------------------------------------------- sampling

def test_sample_maps_each_column_by_exp_map():
    """(riemannian_laplace.12): column s of sample is exp_map of column s, bit for bit; the
    printed velocities are theta_map - theta_s (riemannian_laplace.10)."""
    p = problem("logistic")
    rng = np.random.default_rng(5)
    chol = np.linalg.cholesky(np.linalg.inv(p.hessian(p.theta_map)))
    Theta_s = p.theta_map[:, None] + chol @ rng.standard_normal((p.D, 3))  # theta_s ~ N(map, H^-1)
    V = rl.velocities(p.theta_map, Theta_s)
    assert np.array_equal(V, p.theta_map[:, None] - Theta_s)
    cfg = rl.RiemannianLaplaceConfig()
    Theta, info = rl.sample(p.theta_map, V, p.grad, p.hvp, cfg)
    assert Theta.shape == (p.D, 3) and info.cdot.shape == (p.D, 3)
    assert info.status.shape == info.nfev.shape == info.n_steps.shape == (3,)
    for s in range(3):
        c1, one = rl.exp_map(p.theta_map, V[:, s].copy(), p.grad, p.hvp, cfg)
        assert np.array_equal(Theta[:, s], c1) and np.array_equal(info.cdot[:, s], one.cdot)
        assert (info.status[s], info.nfev[s], info.n_steps[s]) == (one.status, one.nfev, one.n_steps)
    assert not np.allclose(Theta[:, 0], Theta[:, 1])


# ----------------------------------------------------------------------------- bad input

_D = 3
_TH = np.zeros(_D)
_G = lambda th: th + 1.0  # noqa: E731
_H = lambda th, u: 2.0 * u  # noqa: E731
_CFG = rl.RiemannianLaplaceConfig()


@pytest.mark.parametrize("call, match", [
    (lambda: rl.exp_map(np.zeros(_D + 1), np.ones(_D), _G, _H, _CFG), r"^v: expected shape \(4,\)"),
    (lambda: rl.exp_map(_TH, np.ones(_D + 1), _G, _H, _CFG), r"^v: expected shape \(3,\), got \(4,\)"),
    (lambda: rl.exp_map(np.zeros((_D, 1)), np.ones(_D), _G, _H, _CFG), r"^theta_map: expected 1 dim"),
    (lambda: rl.exp_map(np.zeros(0), np.ones(0), _G, _H, _CFG), r"^theta_map: expected at least one"),
    (lambda: rl.exp_map(_TH.astype(np.float32), np.ones(_D), _G, _H, _CFG), r"^theta_map: expected dtype float64"),
    (lambda: rl.exp_map(_TH, np.ones(_D, dtype=np.float32), _G, _H, _CFG), r"^v: expected dtype float64"),
    (lambda: rl.exp_map(np.full(_D, np.nan), np.ones(_D), _G, _H, _CFG), r"^theta_map: expected finite"),
    (lambda: rl.exp_map(_TH, np.full(_D, np.inf), _G, _H, _CFG), r"^v: expected finite"),
    (lambda: rl.exp_map([0.0] * _D, np.ones(_D), _G, _H, _CFG), r"^theta_map: expected an array"),
    (lambda: rl.exp_map(_TH, np.ones(_D), None, _H, _CFG), r"^grad_fn: expected a callable"),
    (lambda: rl.exp_map(_TH, np.ones(_D), _G, "hvp", _CFG), r"^hvp_fn: expected a callable"),
    (lambda: rl.exp_map(_TH, np.ones(_D), lambda th: np.ones(_D + 1), _H, _CFG),
     r"^grad_fn: expected it to return a NumPy float64 array of shape \(3,\)"),
    (lambda: rl.exp_map(_TH, np.ones(_D), lambda th: np.ones(_D, np.float32), _H, _CFG),
     r"^grad_fn: expected it to return a NumPy float64 array"),
    (lambda: rl.exp_map(_TH, np.ones(_D), lambda th: 1.0, _H, _CFG), r"^grad_fn: expected it to return an array"),
    (lambda: rl.exp_map(_TH, np.ones(_D), _G, lambda th, u: np.full(_D, np.nan), _CFG),
     r"^hvp_fn: returned NaN or inf"),
    (lambda: rl.exp_map(_TH, np.ones(_D), _G, _H, (1e-6, 1e-3)), r"^cfg: expected a RiemannianLaplaceConfig"),
    (lambda: rl.exp_map(_TH, np.ones(_D), _G, _H, _CFG._replace(method="Euler")), r"^cfg.method: expected one of"),
    (lambda: rl.exp_map(_TH, np.ones(_D), _G, _H, _CFG._replace(method="Radau")), r"^cfg.method: expected one of"),
    (lambda: rl.exp_map(_TH, np.ones(_D), _G, _H, _CFG._replace(rtol=0.0)), r"^cfg.rtol: expected a value in"),
    (lambda: rl.exp_map(_TH, np.ones(_D), _G, _H, _CFG._replace(rtol=1e-15)), r"^cfg.rtol: expected a value in"),
    (lambda: rl.exp_map(_TH, np.ones(_D), _G, _H, _CFG._replace(rtol=1.0)), r"^cfg.rtol: expected a value in"),
    (lambda: rl.exp_map(_TH, np.ones(_D), _G, _H, _CFG._replace(atol=-1e-3)), r"^cfg.atol: expected a value in"),
    (lambda: rl.sample(_TH, np.ones(_D), _G, _H, _CFG), r"^V: expected 2 dim"),
    (lambda: rl.sample(_TH, np.ones((_D, 0)), _G, _H, _CFG), r"^V: expected shape \(3, S\) with S >= 1"),
    (lambda: rl.sample(_TH, np.ones((_D + 1, 2)), _G, _H, _CFG), r"^V: expected shape \(3, S\)"),
    (lambda: rl.sample(_TH, np.ones((_D, 2), np.float32), _G, _H, _CFG), r"^V: expected dtype float64"),
    (lambda: rl.sample(_TH, np.ones((_D, 2)), _G, _H, _CFG._replace(atol=np.nan)), r"^cfg.atol: expected a finite"),
    (lambda: rl.velocities(_TH, np.ones((_D + 1, 2))), r"^Theta: expected shape \(3, S\)"),
    (lambda: rl.geodesic_acceleration(_G, _H, _TH, np.ones(_D + 1)), r"^cdot: expected shape \(3,\)"),
    (lambda: rl.geodesic_acceleration(_G, lambda th, u: np.ones(2), _TH, np.ones(_D)),
     r"^hvp_L: expected it to return"),
    (lambda: rl.geodesic_acceleration(_G, 2.0, _TH, np.ones(_D)), r"^hvp_L: expected a callable"),
    (lambda: rl.squared_speed(lambda th: np.ones(2), _TH, np.ones(_D)), r"^grad_fn: expected it to return"),
], ids=lambda x: None if callable(x) else x)
def test_bad_input_raises(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_valid_input_of_the_bad_input_table_runs():
    """The table above changes one thing from this valid call (so its errors come from it)."""
    c1, info = rl.exp_map(_TH, np.ones(_D), _G, _H, _CFG)
    assert info.status == 0 and np.all(np.isfinite(c1))
    Theta, _ = rl.sample(_TH, np.ones((_D, 2)), _G, _H, _CFG)
    assert Theta.shape == (_D, 2)


def test_solver_failure_raises():
    """A right-hand side that blows up before t = 1 (c'' = -(1 + c^2)^2 c'^2 / 2 from c' < 0)
    stops solve_ivp with status -1; exp_map raises instead of returning a point short of t = 1."""
    with pytest.raises(RuntimeError, match=r"exp_map: solve_ivp \(RK45.*status -1"):
        rl.exp_map(np.zeros(1), np.array([-3.0]), lambda th: np.ones(1),
                   lambda th, u: u * (1.0 + th ** 2) ** 2, _CFG)
