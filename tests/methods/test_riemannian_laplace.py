"""The geodesic core of the Riemannian Laplace approximation (refbayes.methods.riemannian_laplace)
against the printed general Christoffel form of the geodesic equation with dM/dc from autograd
(tests/reference/riemannian_laplace_dense.py), the invariants of a geodesic (conserved metric
speed, Exp(t v) = c(t), straight lines under a constant metric, Exp(0) = base point), the dense
Hessian path; the loss callables of ``loss_fns`` (network, linearized network, minibatch rows)
against autograd on the dense losses of the reference, and what the linearization does and does
not change; the sign convention of the velocities; and the input validation."""
import autograd
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
    # checks (riemannian_laplace.4), (riemannian_laplace.5), (riemannian_laplace.6)
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
    # checks (riemannian_laplace.1)
    p = problem("mlp")
    for c, cdot in _points(p):
        M = np.asarray(ref.metric_fn(p.L)(c))
        assert_close(np.array(rl.squared_speed(p.grad, c, cdot)), np.array(cdot @ M @ cdot),
                     EXACT_F64, "speed")


# ----------------------------------------------------------------------------- the exponential map

def test_exp_map_equals_the_dense_christoffel_solve():
    """c(1), c'(1) of exp_map equal a DOP853 solve of the printed Christoffel form, to the ODE
    tolerance; the geodesic is not the straight line theta + v."""
    # checks (riemannian_laplace.8), (riemannian_laplace.9)
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


# ----------------------------------------------------------------------------- the loss (loss_fns)

def _data(name, seed=6, n=12):
    """(model, X, y) of a gaussian or bernoulli tanh MLP, or of logistic regression, on n rows."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 2))
    if name == "mlp":
        return MLP([2, 3, 1], "tanh", "gaussian", noise_precision=4.0), X, np.sin(X.sum(axis=1))
    y = (X @ np.array([1.5, -1.0]) + rng.standard_normal(n) > 0).astype(float)
    if name == "mlp_bernoulli":
        return MLP([2, 3, 1], "tanh", "bernoulli"), X, y
    return LogisticRegression(2), X, y


@pytest.mark.parametrize("linearized", [False, True], ids=["network", "linearized"])
@pytest.mark.parametrize("name, batch, prior", [
    ("mlp", "all rows", "scalar"), ("mlp", "rows", "per-parameter"),
    ("mlp_bernoulli", "all rows", "per-parameter"), ("mlp_bernoulli", "rows", "scalar"),
    ("logistic", "rows", "per-parameter")])
def test_loss_fns_equal_autograd_of_the_dense_loss(name, batch, prior, linearized):
    """(riemannian_laplace.14)-(riemannian_laplace.19): grad_fn and hvp_fn equal autograd's
    gradient and dense Hessian times u of L written out in the reference (the network, or its
    linearization f(theta_lin) + J (theta - theta_lin) with J by autograd), on all rows or on 5
    of the 12 rows scaled by 12 / 5, with a scalar or per-parameter prior, at points away from
    theta_lin; to 1e-10."""
    model, X, y = _data(name)
    rng = np.random.default_rng(7)
    D = model.D
    delta = 1.3 if prior == "scalar" else rng.uniform(0.5, 2.0, D)
    rows = None if batch == "all rows" else rng.choice(X.shape[0], 5, replace=False)
    theta_lin = 0.5 * rng.standard_normal(D)
    spec = spec_of(model)
    if linearized:
        L = ref.linearized_posterior_loss(spec, X, y, delta, theta_lin, rows)
    else:
        L = ref.posterior_loss(spec, X, y, delta, rows)
    grad_fn, hvp_fn = rl.loss_fns(model, X, y, delta, rows=rows,
                                  linearize_at=theta_lin if linearized else None)
    for _ in range(2):
        theta, u = theta_lin + 0.8 * rng.standard_normal(D), rng.standard_normal(D)
        assert_close(grad_fn(theta), autograd.grad(L)(theta), EXACT_F64, "grad L")
        assert_close(hvp_fn(theta, u), autograd.hessian(L)(theta) @ u, EXACT_F64, "H[L] u")


def test_loss_fns_gradient_kept_from_hvp_fn_is_the_fresh_one_and_follows_theta():
    """hvp_fn keeps the gradient of its pass (grad_hvp) for grad_fn at the same theta: bit for bit
    what grad_fn computes afresh; at another theta, or after theta is changed in place, grad_fn
    computes anew (the kept value is keyed by theta's bytes, not the array's identity)."""
    model, X, y = _data("mlp")
    rng = np.random.default_rng(3)
    grad_fn, hvp_fn = rl.loss_fns(model, X, y, 1.3)
    fresh_fn, _ = rl.loss_fns(model, X, y, 1.3)
    theta, u = rng.standard_normal(model.D), rng.standard_normal(model.D)
    hvp_fn(theta, u)
    np.testing.assert_array_equal(grad_fn(theta), fresh_fn(theta))
    theta[0] += 0.5  # the same array, another point
    np.testing.assert_array_equal(grad_fn(theta), fresh_fn(theta))
    other = rng.standard_normal(model.D)
    np.testing.assert_array_equal(grad_fn(other), fresh_fn(other))
    assert not np.array_equal(fresh_fn(other), fresh_fn(theta))


@pytest.mark.parametrize("name", ["logistic", "mlp"])
def test_linearization_point_gradients_coincide_and_hvp_is_the_ggn(name):
    """(riemannian_laplace.20): at theta_lin, f_lin = f, so grad L_lin = grad L (to 1e-10, at a
    point where g != 0; theta_MAP is the case g = 0) and H[L_lin] u = (GGN + delta I) u, which
    for the tanh MLP is not H[L] u and for logistic regression (linear in theta) is.  The
    network callables are the Problem's grad / hvp, bit for bit."""
    p = problem(name)
    theta, u = _points(p)[0]
    g, h = rl.loss_fns(p.model, p.X, p.y, DELTA)
    g_lin, h_lin = rl.loss_fns(p.model, p.X, p.y, DELTA, linearize_at=theta)
    assert np.array_equal(g(theta), p.grad(theta)) and np.array_equal(h(theta, u), p.hvp(theta, u))
    assert_close(g_lin(theta), g(theta), EXACT_F64, "grad L_lin vs grad L at theta_lin")
    assert np.max(np.abs(g(theta))) > 1e-1
    ggn_u = p.model.ggn(theta, p.X, p.y) @ u + DELTA * u
    assert_close(h_lin(theta, u), ggn_u, EXACT_F64, "H[L_lin] u vs (GGN + delta I) u")
    if name == "mlp":
        assert rel_err(h_lin(theta, u), h(theta, u)) > 1e-3
    else:
        assert_close(h_lin(theta, u), h(theta, u), EXACT_F64, "GGN = Hessian, linear model")
    g_map, _ = rl.loss_fns(p.model, p.X, p.y, DELTA, linearize_at=p.theta_map)
    assert np.max(np.abs(g_map(p.theta_map))) < 1e-10  # the MAP stays a critical point


def test_linear_in_theta_model_has_the_same_linearized_and_network_geodesic():
    """(riemannian_laplace.20): logistic regression's output is linear in theta, so L_lin = L
    and the two geodesics from theta_MAP coincide (one solver, DOP853 at 1e-12: to ODE_F64);
    for the tanh MLP they differ by more than 1e-3."""
    for name in ("logistic", "mlp"):
        p = problem(name)
        v = p.velocity()
        c, _ = rl.exp_map(p.theta_map, v, *rl.loss_fns(p.model, p.X, p.y, DELTA), TIGHT)
        c_lin, _ = rl.exp_map(p.theta_map, v, *rl.loss_fns(p.model, p.X, p.y, DELTA,
                                                             linearize_at=p.theta_map), TIGHT)
        if name == "logistic":
            assert_close(c_lin, c, ODE_F64, "linearized vs network geodesic, linear model")
        else:
            assert rel_err(c_lin, c) > 1e-3
        assert rel_err(p.theta_map + v, c) > 1e-3  # the geodesic bends


def test_gaussian_linearized_loss_is_quadratic():
    """(riemannian_laplace.20): with a gaussian likelihood L_lin is quadratic: H[L_lin] u is the
    same at far-apart points and equals (tau sum_i J_i^T J_i + delta I) u, and
    grad L_lin(theta_1) - grad L_lin(theta_0) = H[L_lin] (theta_1 - theta_0) (to 1e-10); the
    network's Hessian is not constant.  For MLP [2, 1] (linear in theta) the network's L is
    that quadratic itself."""
    p = problem("mlp")
    g_lin, h_lin = rl.loss_fns(p.model, p.X, p.y, DELTA, linearize_at=p.theta_map)
    _, h = rl.loss_fns(p.model, p.X, p.y, DELTA)
    rng = np.random.default_rng(8)
    t0, t1, u = (p.theta_map + 2.0 * rng.standard_normal(p.D) for _ in range(3))
    J = p.model.jacobian(p.theta_map, p.X)[:, 0, :]
    Hu = p.model.likelihood.noise_precision * J.T @ (J @ u) + DELTA * u
    assert_close(h_lin(t0, u), Hu, EXACT_F64, "H[L_lin] u at t0")
    assert_close(h_lin(t1, u), Hu, EXACT_F64, "H[L_lin] u at t1")
    assert_close(g_lin(t1) - g_lin(t0), h_lin(t0, t1 - t0), EXACT_F64, "affine gradient")
    assert rel_err(h(t1, u), h(t0, u)) > 1e-3
    model = MLP([2, 1], "tanh", "gaussian", noise_precision=4.0)
    g, h = rl.loss_fns(model, p.X, p.y, DELTA)
    g_lin, h_lin = rl.loss_fns(model, p.X, p.y, DELTA, linearize_at=rng.standard_normal(3))
    t0, u = rng.standard_normal(3), rng.standard_normal(3)
    assert_close(g_lin(t0), g(t0), EXACT_F64, "linear model: grad")
    assert_close(h_lin(t0, u), h(t0, u), EXACT_F64, "linear model: hvp")


@pytest.mark.parametrize("linearized", [False, True], ids=["network", "linearized"])
def test_every_row_twice_is_the_full_batch(linearized):
    """(riemannian_laplace.14): rows = each of the N rows twice is M = 2 N rows scaled by
    N / M = 1/2, the full-batch L (to 1e-10); rows = the first half alone is not."""
    p = problem("mlp")
    N = p.X.shape[0]
    at = p.theta_map if linearized else None
    theta, u = _points(p)[1]
    g, h = rl.loss_fns(p.model, p.X, p.y, DELTA, linearize_at=at)
    g2, h2 = rl.loss_fns(p.model, p.X, p.y, DELTA, linearize_at=at,
                         rows=np.concatenate([np.arange(N), np.arange(N)[::-1]]))
    assert_close(g2(theta), g(theta), EXACT_F64, "grad")
    assert_close(h2(theta, u), h(theta, u), EXACT_F64, "hvp")
    g_half, _ = rl.loss_fns(p.model, p.X, p.y, DELTA, linearize_at=at, rows=np.arange(N // 2))
    assert rel_err(g_half(theta), g(theta)) > 1e-3


# ----------------------------------------------------------------------------- velocity sign

def test_velocity_sign_changes_each_draw_not_the_distribution():
    """(riemannian_laplace.10), Conventions: fed the identity as eps, the printed velocities
    theta_map - (theta_map + C eps) and the official C eps (C C^T = H^{-1}) are negatives of
    each other with one covariance H^{-1} (to 1e-10): one distribution.  Per draw the samples
    differ: Exp(v) != Exp(-v), and Exp(-v) is not the reflection 2 theta_map - Exp(v) of a loss
    that is not even; Exp of the printed v for eps equals Exp of the official v for -eps."""
    p = problem("logistic")
    C = np.linalg.cholesky(np.linalg.inv(p.hessian(p.theta_map)))
    E = np.eye(p.D)
    V = rl.velocities(p.theta_map, p.theta_map[:, None] + C @ E)
    V_official = C @ E
    assert_close(V, -V_official, EXACT_F64, "printed = -official")
    assert_close(V @ V.T, np.linalg.inv(p.hessian(p.theta_map)), EXACT_F64, "printed covariance")
    assert_close(V_official @ V_official.T, V @ V.T, EXACT_F64, "one covariance")
    v = 2.0 * V[:, 0]  # stretched so the geodesic bends
    c_plus, _ = rl.exp_map(p.theta_map, v, p.grad, p.hvp, TIGHT)
    c_minus, _ = rl.exp_map(p.theta_map, -v, p.grad, p.hvp, TIGHT)
    assert rel_err(c_minus, c_plus) > 1e-2
    assert rel_err(c_minus, 2.0 * p.theta_map - c_plus) > 1e-3
    c_off, _ = rl.exp_map(p.theta_map, -2.0 * V_official[:, 0], p.grad, p.hvp, TIGHT)
    assert_close(c_off, c_plus, ODE_F64, "printed v(eps) vs official v(-eps)")


def test_exp_of_minus_v_is_the_reflection_for_an_even_loss():
    """(riemannian_laplace.21): for L_e(theta) = L(theta) + L(2 theta_0 - theta), even about
    theta_0 (the logistic regression's L, theta_0 a point with grad L != 0), Exp_{theta_0}(-v) =
    2 theta_0 - Exp_{theta_0}(v) to ODE_F64 while Exp(-v) != Exp(v)."""
    p = problem("logistic")
    theta0 = _points(p)[0][0]

    def grad_e(theta):
        return p.grad(theta) - p.grad(2.0 * theta0 - theta)

    def hvp_e(theta, u):
        return p.hvp(theta, u) + p.hvp(2.0 * theta0 - theta, u)

    assert np.array_equal(grad_e(theta0), np.zeros(p.D))
    v = 2.0 * p.velocity(seed=4)
    c_plus, _ = rl.exp_map(theta0, v, grad_e, hvp_e, TIGHT)
    c_minus, _ = rl.exp_map(theta0, -v, grad_e, hvp_e, TIGHT)
    assert_close(c_minus, 2.0 * theta0 - c_plus, ODE_F64, "Exp(-v) vs reflection")
    assert rel_err(c_minus, c_plus) > 1e-2
    assert rel_err(theta0 + v, c_plus) > 1e-3  # the geodesic bends


# ----------------------------------------------------------------------------- bad input

_D = 3
_TH = np.zeros(_D)
_G = lambda th: th + 1.0  # noqa: E731
_H = lambda th, u: 2.0 * u  # noqa: E731
_CFG = rl.RiemannianLaplaceConfig()
_LM = LogisticRegression(2)  # D = 3
_X = np.array([[0.5, -1.0], [1.0, 2.0], [-0.3, 0.2], [2.0, 0.1]])
_Y = np.array([0.0, 1.0, 1.0, 0.0])
_R = np.array([0, 2])


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
    (lambda: rl.loss_fns("logistic", _X, _Y, 1.0), r"^model: expected a refbayes.models model"),
    (lambda: rl.loss_fns(_LM, _X[:, :1], _Y, 1.0), r"^X: expected shape \(N, 2\)"),
    (lambda: rl.loss_fns(_LM, _X[:0], _Y[:0], 1.0), r"^X: expected shape \(N, 2\) with N >= 1"),
    (lambda: rl.loss_fns(_LM, _X.ravel(), _Y, 1.0), r"^X: expected 2 dim"),
    (lambda: rl.loss_fns(_LM, _X.astype(np.float32), _Y, 1.0), r"^X: expected dtype float64"),
    (lambda: rl.loss_fns(_LM, np.full((4, 2), np.nan), _Y, 1.0), r"^X: expected finite"),
    (lambda: rl.loss_fns(_LM, _X, _Y[:3], 1.0), r"^y: expected shape \(4\)"),
    (lambda: rl.loss_fns(_LM, _X, _Y + 1.0, 1.0), r"^y: expected labels in"),
    (lambda: rl.loss_fns(_LM, _X, _Y, -1.0), r"^prior_precision: expected a value in"),
    (lambda: rl.loss_fns(_LM, _X, _Y, np.inf), r"^prior_precision: expected"),
    (lambda: rl.loss_fns(_LM, _X, _Y, "1.0"), r"^prior_precision: expected an array"),
    (lambda: rl.loss_fns(_LM, _X, _Y, np.array(1.0)), r"^prior_precision: expected 1 dim"),
    (lambda: rl.loss_fns(_LM, _X, _Y, np.ones(4)), r"^prior_precision: expected shape \(3,\)"),
    (lambda: rl.loss_fns(_LM, _X, _Y, np.array([1.0, -1.0, 1.0])), r"^prior_precision: expected >= 0"),
    (lambda: rl.loss_fns(_LM, _X, _Y, np.ones(3, np.float32)), r"^prior_precision: expected dtype float64"),
    (lambda: rl.loss_fns(_LM, _X, _Y, 1.0, linearize_at=np.zeros(4)), r"^linearize_at: expected shape \(3,\)"),
    (lambda: rl.loss_fns(_LM, _X, _Y, 1.0, linearize_at=np.zeros(3, np.float32)),
     r"^linearize_at: expected dtype float64"),
    (lambda: rl.loss_fns(_LM, _X, _Y, 1.0, rows=np.array([0.0, 1.0])), r"^rows: expected an integer array"),
    (lambda: rl.loss_fns(_LM, _X, _Y, 1.0, rows=np.array([0, 4])), r"^rows: expected indices in \[0, 4\)"),
    (lambda: rl.loss_fns(_LM, _X, _Y, 1.0, rows=np.array([-1, 2])), r"^rows: expected indices in"),
    (lambda: rl.loss_fns(_LM, _X, _Y, 1.0, rows=np.zeros(0, int)), r"^rows: expected at least one"),
    (lambda: rl.loss_fns(_LM, _X, _Y, 1.0, rows=np.zeros((2, 1), int)), r"^rows: expected 1 dim"),
    (lambda: rl.loss_fns(_LM, _X, _Y, 1.0, rows=[0, 1]), r"^rows: expected an array"),
    (lambda: rl.loss_fns(_LM, _X, _Y, 1.0)[0](np.zeros(4)), r"^theta: expected shape \(3,\)"),
    (lambda: rl.loss_fns(_LM, _X, _Y, 1.0)[1](np.zeros(3), np.zeros(2)), r"^u: expected shape \(3,\)"),
    (lambda: rl.loss_fns(_LM, _X, _Y, 1.0, linearize_at=np.zeros(3))[0](np.zeros(3, np.float32)),
     r"^theta: expected dtype float64"),
    (lambda: rl.loss_fns(_LM, _X, _Y, 1.0, linearize_at=np.zeros(3))[1](np.zeros(3), np.full(3, np.nan)),
     r"^u: expected finite"),
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
    for at in (None, np.zeros(3)):
        for delta in (1.0, 0.0, np.float64(2.0), 3, np.ones(3)):
            grad_fn, hvp_fn = rl.loss_fns(_LM, _X, _Y, delta, linearize_at=at, rows=_R)
            assert grad_fn(np.ones(3)).shape == hvp_fn(np.ones(3), np.ones(3)).shape == (3,)


def test_solver_failure_raises():
    """A right-hand side that blows up before t = 1 (c'' = -(1 + c^2)^2 c'^2 / 2 from c' < 0)
    stops solve_ivp with status -1; exp_map raises instead of returning a point short of t = 1."""
    with pytest.raises(RuntimeError, match=r"exp_map: solve_ivp \(RK45.*status -1"):
        rl.exp_map(np.zeros(1), np.array([-3.0]), lambda th: np.ones(1),
                   lambda th, u: u * (1.0 + th ** 2) ** 2, _CFG)


# ----------------------------------------------------------------------------- non-finite trial points

def _flaky(f, bad_calls, value):
    """f, except that its calls numbered in bad_calls (1-based) return ``value(out)``."""
    count = [0]

    def wrapped(*args):
        count[0] += 1
        out = f(*args)
        return value(out) if count[0] in bad_calls else out
    return wrapped


@pytest.mark.parametrize("kind", ["nan", "overflow"])
def test_a_nonfinite_trial_evaluation_is_a_rejected_step(kind):
    """(riemannian_laplace.22): grad_fn giving NaN, or overflowing to inf with numpy's warning,
    at one trial point of the solve (its 100th call) makes the solver reject that step and retry a
    shorter one: the end point equals the clean solve to the ODE tolerance, the info counts it,
    and no warning escapes (pytest turns RuntimeWarnings into errors here)."""
    p = problem("mlp-gaussian")
    v = p.velocity()
    clean = rl.exp_map(p.theta_map, v, p.grad, p.hvp, TIGHT)[1]
    bad = {"nan": lambda out: np.full_like(out, np.nan),
           "overflow": lambda out: out * np.exp(np.full_like(out, 1e3))}[kind]
    c, info = rl.exp_map(p.theta_map, v, _flaky(p.grad, {100}, bad), p.hvp, TIGHT)
    assert clean.n_nonfinite == 0 and info.n_nonfinite >= 1
    assert_close(c, clean.c, ODE_F64, "end point")


def test_nonfinite_everywhere_but_the_base_point_raises():
    """No finite trial point at any step size: the step underflows and exp_map raises; a
    non-finite value at the base point itself is bad input (ValueError, the table above)."""
    p = problem("mlp-gaussian")
    always = _flaky(p.grad, set(range(2, 10 ** 6)), lambda out: np.full_like(out, np.nan))
    with pytest.raises(RuntimeError, match=r"exp_map: solve_ivp \(DOP853.*status -1"):
        rl.exp_map(p.theta_map, p.velocity(), always, p.hvp, TIGHT)
