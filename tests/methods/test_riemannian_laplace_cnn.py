"""The Riemannian Laplace approximation (refbayes.methods.riemannian_laplace) on a CNN
(refbayes.models.conv): the callables of ``loss_fns`` (the network, whose H[L] u is the CNN's
autograd product (conv.19), and the network linearized at a point, whose Hessian is the GGN)
against autograd on the loss written out plainly (tests/reference/conv_loops.py ``naive_output``,
one image at a time, and tests/reference/per_example.py ``naive_nll``); the geodesic acceleration
against the printed Christoffel form and the simplified formula of the note evaluated densely;
the exponential map and the sampler on the CNN (deterministic given eps, rows or NCHW images
alike), and the conservation of the metric speed on a smooth CNN. derivations/riemannian_laplace.md,
"On a CNN"."""
import autograd
import autograd.numpy as anp
import numpy as np
import pytest
from scipy.optimize import minimize

from refbayes.methods import laplace
from refbayes.methods import riemannian_laplace as rl
from refbayes.models.conv import CNN, Activation, AvgPool2d, Conv2d, Dense, Flatten, tiny_cnn
from tests.reference.conv_loops import LoopSpec, naive_output
from tests.reference.per_example import naive_nll
from tests.reference.riemannian_laplace_dense import metric_fn
from tests.tolerances import EXACT_F64, ODE_F64, assert_close, rel_err

N = 5
TIGHT = rl.RiemannianLaplaceConfig("DOP853", rtol=1e-12, atol=1e-12)


def _smooth_cnn():
    """A CNN with a smooth loss (tanh, average pooling): 1x5x5 -> conv 3x3 (2) -> tanh ->
    avgpool 2 stride 1 (-> 2x2x2) -> dense 2, gaussian (D = 38)."""
    return CNN((1, 5, 5), [Conv2d(1, 2, 3), Activation("tanh"), AvgPool2d(2, stride=1), Flatten(),
                           Dense(8, 2)], "gaussian", noise_precision=4.0)


def _data(likelihood, seed=0, images=False):
    """The model (tiny_cnn: conv, relu, maxpool, dense; or the smooth CNN for "smooth"), N rows
    of X (as rows (N, C H W), or NCHW images) and targets of its likelihood."""
    if likelihood == "smooth":
        model = _smooth_cnn()
    else:
        model = tiny_cnn(likelihood, n_out={"categorical": 3, "gaussian": 2, "bernoulli": 1}[likelihood])
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N,) + model.input_shape)
    K = model.n_out
    if model.likelihood.name == "gaussian":
        y = rng.standard_normal((N, K))
    elif model.likelihood.name == "bernoulli":
        y = rng.integers(0, 2, N).astype(float)
    else:
        y = rng.integers(0, K, N)
    return model, (X if images else X.reshape(N, model.n_in)), y


def _example_losses(spec, X, y, rows):
    """The rows B as one image (C, H, W) and target each, and the scale N / M."""
    rows = np.arange(len(X)) if rows is None else rows
    X = np.asarray(X).reshape((len(X),) + spec.input_shape)
    return [(X[i], y[i]) for i in rows], len(X) / len(rows)


def loop_loss(model, X, y, delta, rows=None):
    """theta -> L(theta) = (N / M) sum_{i in B} l(y_i, f(x_i, theta)) + (1/2) sum_d delta_d theta_d^2
    with f the plain-loop network, one image at a time (autograd-traceable).
    (riemannian_laplace.14)"""
    spec = LoopSpec(model)
    examples, scale = _example_losses(spec, X, y, rows)

    def L(theta):
        data = sum(naive_nll(spec, naive_output(spec, theta, x), t) for x, t in examples)
        return scale * data + 0.5 * anp.sum(delta * theta ** 2)
    return L


def loop_linearized_loss(model, X, y, delta, theta_lin, rows=None):
    """theta -> L_lin(theta): loop_loss with f(x_i, theta) replaced by f(x_i, theta_lin) +
    J_i (theta - theta_lin), J_i the autograd Jacobian of the plain-loop output at theta_lin.
    (riemannian_laplace.16), (riemannian_laplace.17)"""
    spec = LoopSpec(model)
    examples, scale = _example_losses(spec, X, y, rows)
    lin = [(np.asarray(naive_output(spec, theta_lin, x)),
            np.asarray(autograd.jacobian(lambda th, x=x: naive_output(spec, th, x))(theta_lin)), t)
           for x, t in examples]

    def L_lin(theta):
        data = sum(naive_nll(spec, f0 + anp.dot(J, theta - theta_lin), t) for f0, J, t in lin)
        return scale * data + 0.5 * anp.sum(delta * theta ** 2)
    return L_lin


def printed_acceleration(L, c, cdot):
    """c'' of the printed form (riemannian_laplace.3), contracted with c' kron c' term by term,
    dM/dc by autograd (no (riemannian_laplace.4)-(riemannian_laplace.7)): the first term
    sum_{k,j} d_k M_mj c'_k c'_j = d/ds [M(c + s c') c']_m at s = 0, the second
    sum_{i,j} d_m M_ij c'_i c'_j = d/dc_m (c'^T M(c) c'); then -(1/2) M^{-1} (2 first - second)."""
    M_of = metric_fn(L)
    first = np.asarray(autograd.jacobian(lambda s: anp.dot(M_of(c + s * cdot), cdot))(0.0))
    second = np.asarray(autograd.grad(lambda cc: anp.dot(cdot, anp.dot(M_of(cc), cdot)))(c))
    return -0.5 * np.linalg.solve(np.asarray(M_of(c)), 2.0 * first - second)


# ----------------------------------------------------------------------------- the loss L

@pytest.mark.parametrize("linearized", [False, True], ids=["network", "linearized"])
@pytest.mark.parametrize("likelihood, batch, prior, images", [
    ("categorical", "all rows", "scalar", False), ("categorical", "rows", "per-parameter", True),
    ("gaussian", "all rows", "per-parameter", True), ("bernoulli", "rows", "scalar", False)])
def test_cnn_loss_fns_equal_autograd_of_the_loop_loss(likelihood, batch, prior, images, linearized):
    """(riemannian_laplace.14)-(riemannian_laplace.19) on the tiny CNN (D = 47 categorical):
    grad_fn and hvp_fn equal autograd's gradient and dense Hessian times u of L written with the
    plain-loop network (or its linearization at theta_lin, J by autograd), on all 5 rows or 3 of
    them scaled by 5 / 3, a scalar or per-parameter prior, X as rows or NCHW images; to 1e-10."""
    # checks (riemannian_laplace.14)-(riemannian_laplace.19)
    model, X, y = _data(likelihood, images=images)
    rng = np.random.default_rng(7)
    D = model.D
    delta = 1.3 if prior == "scalar" else rng.uniform(0.5, 2.0, D)
    rows = None if batch == "all rows" else rng.choice(N, 3, replace=False)
    theta_lin = model.init_theta(rng)
    if linearized:
        L = loop_linearized_loss(model, X, y, delta, theta_lin, rows)
    else:
        L = loop_loss(model, X, y, delta, rows)
    grad_fn, hvp_fn = rl.loss_fns(model, X, y, delta, rows=rows,
                                  linearize_at=theta_lin if linearized else None)
    for _ in range(2):
        theta, u = theta_lin + 0.3 * rng.standard_normal(D), rng.standard_normal(D)
        Hu = hvp_fn(theta, u)  # first: grad_fn then reuses the gradient of its pass
        assert_close(grad_fn(theta), autograd.grad(L)(theta), EXACT_F64, "grad L")
        assert_close(Hu, autograd.hessian(L)(theta) @ u, EXACT_F64, "H[L] u")
        assert np.max(np.abs(grad_fn(theta) - delta * theta)) > 1e-2  # the data term is there


def test_cnn_linearized_hvp_at_theta_lin_is_the_ggn():
    """(riemannian_laplace.20) on the tiny CNN: at theta_lin grad L_lin = grad L and
    H[L_lin] u = (model.ggn + delta I) u (to 1e-10), which is not H[L] u (relu, max pooling and
    a dense head: f is not linear in theta)."""
    # checks (riemannian_laplace.20)
    model, X, y = _data("categorical")
    rng = np.random.default_rng(11)
    theta, u = model.init_theta(rng), rng.standard_normal(model.D)
    g, h = rl.loss_fns(model, X, y, 1.3)
    g_lin, h_lin = rl.loss_fns(model, X, y, 1.3, linearize_at=theta)
    assert_close(g_lin(theta), g(theta), EXACT_F64, "grad L_lin vs grad L at theta_lin")
    assert np.max(np.abs(g(theta))) > 1e-1
    ggn_u = model.ggn(theta, X, y) @ u + 1.3 * u
    assert_close(h_lin(theta, u), ggn_u, EXACT_F64, "H[L_lin] u vs (GGN + delta I) u")
    assert rel_err(h_lin(theta, u), h(theta, u)) > 1e-3
    np.testing.assert_array_equal(h(theta, u), model.grad_hvp(theta, u, X, y)[1] + 1.3 * u)
    assert_close(h(theta, u), model.hvp(theta, u, X, y) + 1.3 * u, EXACT_F64, "model.hvp")
    np.testing.assert_array_equal(g(theta), model.grad(theta, X, y) + 1.3 * theta)


@pytest.mark.parametrize("linearized", [False, True], ids=["network", "linearized"])
def test_cnn_rows_and_images_give_the_same_callables(linearized):
    """X as rows (N, C H W) or as NCHW images (N, C, H, W): the same L, bit for bit; a later edit
    of the caller's X does not leak into the callables (they keep copies)."""
    model, X, y = _data("categorical")
    rng = np.random.default_rng(5)
    at = model.init_theta(rng) if linearized else None
    rows = np.array([4, 0, 0])
    Ximg = X.reshape((N,) + model.input_shape).copy()
    pairs = [rl.loss_fns(model, X, y, 0.7, linearize_at=at, rows=rows),
             rl.loss_fns(model, Ximg, y, 0.7, linearize_at=at, rows=rows)]
    theta, u = model.init_theta(rng), rng.standard_normal(model.D)
    ref = [f(theta, u) if k else f(theta) for k, f in enumerate(pairs[0])]
    Ximg[:] = 0.0
    for k, f in enumerate(pairs[1]):
        np.testing.assert_array_equal(f(theta, u) if k else f(theta), ref[k])


# ----------------------------------------------------------------------------- the geodesic

@pytest.mark.parametrize("linearized", [False, True], ids=["network", "linearized"])
def test_cnn_acceleration_equals_the_dense_formulas(linearized):
    """One geodesic point on the tiny CNN: geodesic_acceleration with loss_fns' callables equals
    (riemannian_laplace.7) with g and H formed densely by autograd on the plain-loop loss, and the
    printed Christoffel form (riemannian_laplace.3) with dM/dc by autograd; to 1e-10."""
    # checks (riemannian_laplace.3), (riemannian_laplace.7)
    model, X, y = _data("categorical")
    rng = np.random.default_rng(13)
    theta_lin = model.init_theta(rng)
    c, cdot = theta_lin + 0.3 * rng.standard_normal(model.D), rng.standard_normal(model.D)
    if linearized:
        L = loop_linearized_loss(model, X, y, 1.0, theta_lin)
    else:
        L = loop_loss(model, X, y, 1.0)
    grad_fn, hvp_fn = rl.loss_fns(model, X, y, 1.0,
                                  linearize_at=theta_lin if linearized else None)
    a = rl.geodesic_acceleration(grad_fn, hvp_fn, c, cdot)
    g, H = autograd.grad(L)(c), autograd.hessian(L)(c)
    dense = -g * (cdot @ H @ cdot) / (1.0 + g @ g)  # (riemannian_laplace.7), densely
    assert_close(a, dense, EXACT_F64, "c'' vs (riemannian_laplace.7) dense")
    assert_close(a, printed_acceleration(L, c, cdot), EXACT_F64, "c'' vs Christoffel form")
    assert np.max(np.abs(a)) > 1e-3


def _map(model, X, y, delta, rng):
    """The point where L-BFGS stops minimizing L = sum_i l_i + (delta / 2) |theta|^2 from an
    init_theta draw: near a minimum, not a stationary point (relu and max pooling make L
    non-smooth; max |grad L| ~ 0.1 there for the tiny CNN), hence check_stationary=False."""
    res = minimize(lambda th: (model.loss(th, X, y) + 0.5 * delta * th @ th,
                               model.grad(th, X, y) + delta * th),
                   model.init_theta(rng), jac=True, method="L-BFGS-B",
                   options={"gtol": 1e-10, "maxiter": 2000})
    return res.x


@pytest.mark.parametrize("linearized", [False, True], ids=["network", "linearized"])
def test_cnn_sample_runs_and_is_deterministic_given_eps(linearized):
    """The whole scheme on the tiny CNN with the official solver settings: Laplace draws at an
    approximate MAP (refbayes.methods.laplace, full GGN) give the velocities (riemannian_laplace.10), each
    mapped by its geodesic (riemannian_laplace.12): the same eps gives the same samples bit for
    bit, again and with X as NCHW images; each column is exp_map of its velocity, bit for bit;
    the samples are finite and are not the Laplace draws themselves."""
    # checks (riemannian_laplace.12)
    delta = 1.0
    model, X, y = _data("categorical")
    rng = np.random.default_rng(17)
    theta_map = _map(model, X, y, delta, rng)
    state = laplace.fit(model, theta_map, X, y, laplace.LaplaceConfig(prior_precision=delta),
                        check_stationary=False)
    eps = np.random.default_rng(19).standard_normal((model.D, 3))
    draws = laplace.sample(state, eps)
    V = rl.velocities(theta_map, draws)
    at = theta_map if linearized else None
    cfg = rl.RiemannianLaplaceConfig()
    grad_fn, hvp_fn = rl.loss_fns(model, X, y, delta, linearize_at=at)
    Theta, info = rl.sample(theta_map, V, grad_fn, hvp_fn, cfg)
    assert Theta.shape == (model.D, 3) and np.all(np.isfinite(Theta))
    assert info.status.tolist() == [0, 0, 0] and np.all(info.nfev > 0)
    again, _ = rl.sample(theta_map, rl.velocities(theta_map, laplace.sample(state, eps.copy())),
                         grad_fn, hvp_fn, cfg)
    np.testing.assert_array_equal(again, Theta)
    g_img, h_img = rl.loss_fns(model, X.reshape((N,) + model.input_shape), y, delta,
                               linearize_at=at)
    np.testing.assert_array_equal(rl.sample(theta_map, V, g_img, h_img, cfg)[0], Theta)
    c1, _ = rl.exp_map(theta_map, V[:, 1].copy(), grad_fn, hvp_fn, cfg)
    np.testing.assert_array_equal(c1, Theta[:, 1])
    # the geodesic bends: its end is neither the draw theta_map + v nor the draw theta_map - v
    assert rel_err(Theta, theta_map[:, None] + V) > 1e-3
    assert rel_err(Theta, draws) > 1e-3


def test_cnn_geodesic_conserves_metric_speed():
    """(riemannian_laplace.11) on a smooth CNN (tanh, average pooling; relu and max pooling make
    g jump across kinks): c'^T M(c) c' at t = 1 equals its value at t = 0 to the ODE tolerance
    (DOP853 at 1e-12), and the end point is not the straight line theta + v."""
    # checks (riemannian_laplace.11)
    model, X, y = _data("smooth")
    rng = np.random.default_rng(23)
    theta = model.init_theta(rng)
    v = 0.5 * rng.standard_normal(model.D)
    grad_fn, hvp_fn = rl.loss_fns(model, X, y, 1.0)
    s0 = rl.squared_speed(grad_fn, theta, v)
    c1, info = rl.exp_map(theta, v, grad_fn, hvp_fn, TIGHT)
    assert info.status == 0
    assert_close(np.array(rl.squared_speed(grad_fn, c1, info.cdot)), np.array(s0), ODE_F64, "speed")
    assert rel_err(c1, theta + v) > 1e-3


# ----------------------------------------------------------------------------- bad input

_M = tiny_cnn()
_X = np.random.default_rng(0).standard_normal((4, 36))
_Y = np.array([0, 1, 2, 1])


@pytest.mark.parametrize("call, match", [
    (lambda: rl.loss_fns(_M, _X[:, :35], _Y, 1.0),
     r"^X: expected rows \(N, 36\) or NCHW images \(N, 1, 6, 6\) with N >= 1, got \(4, 35\)"),
    (lambda: rl.loss_fns(_M, _X.reshape(4, 1, 36, 1), _Y, 1.0), r"^X: expected rows \(N, 36\)"),
    (lambda: rl.loss_fns(_M, _X[:0], _Y[:0], 1.0), r"^X: expected rows .* with N >= 1"),
    (lambda: rl.loss_fns(_M, _X.reshape(4, 6, 6), _Y, 1.0), r"^X: expected"),
    (lambda: rl.loss_fns(_M, _X.astype(np.float32), _Y, 1.0), r"^X: expected dtype float64"),
    (lambda: rl.loss_fns(_M, _X, _Y[:3], 1.0), r"^y: expected shape \(4"),
    (lambda: rl.loss_fns(_M, _X, _Y + 1, 1.0), r"^y: expected labels in"),
    (lambda: rl.loss_fns(_M, _X, _Y, np.ones(46)), r"^prior_precision: expected shape \(47,\)"),
    (lambda: rl.loss_fns(_M, _X, _Y, 1.0, linearize_at=np.zeros(46)),
     r"^linearize_at: expected shape \(47,\)"),
    (lambda: rl.loss_fns(_M, _X, _Y, 1.0)[1](np.zeros(47), np.zeros(46)), r"^u: expected shape \(47,\)"),
], ids=lambda x: None if callable(x) else x)
def test_cnn_bad_input_raises(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_cnn_valid_input_of_the_bad_input_table_runs():
    """The table above changes one thing from these valid calls."""
    for X in (_X, _X.reshape(4, 1, 6, 6)):
        for at in (None, np.zeros(47)):
            grad_fn, hvp_fn = rl.loss_fns(_M, X, _Y, 1.0, linearize_at=at)
            assert grad_fn(np.ones(47)).shape == hvp_fn(np.ones(47), np.ones(47)).shape == (47,)
