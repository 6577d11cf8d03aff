"""FlatModel.hvp (the Hessian-vector product the geodesic ODE of riemannian_laplace consumes, by the
R-operator (peg.22)-(peg.26)) against the dense Hessian of FlatModel.hessian (and the closed-form
Hessian of the linear models) times v and against autograd's reverse-over-reverse product, on
every declarative model case and both backends; jvp (peg.22) and ggn_vp (peg.27) against the
dense Jacobian and GGN; and their input validation."""
import functools

import numpy as np
import pytest

from refbayes.backend import to_numpy
from refbayes.models import MLP
from tests.models.cases import CASES, batch, ids
from tests.reference import per_example as ref
from tests.tolerances import EXACT_F64, assert_close, exact


def _vector(case, dtype, seed=5):
    return np.random.default_rng(seed).standard_normal(case.model.D).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_hvp_equals_dense_hessian_times_v(case, dtype):
    """H v from one reverse-over-reverse pass equals hessian(theta) @ v."""
    theta, X, y = batch(case, dtype)
    v = _vector(case, dtype)
    Hv = case.model.hvp(theta, v, X, y)
    assert Hv.shape == (case.model.D,) and Hv.dtype == dtype
    assert_close(Hv, case.model.hessian(theta, X, y) @ v, exact(dtype), "hvp vs hessian @ v")


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_hvp_equals_autograds_reverse_over_reverse_product(case):
    """The closed form (peg.22)-(peg.26) against autograd on the same loss, float64."""
    theta, X, y = batch(case)
    v = _vector(case, np.float64)
    m = case.model
    assert_close(m.hvp(theta, v, X, y), m._hvp_autograd(theta, v, X, y), EXACT_F64,
                 "R-operator vs autograd")


@functools.cache
def _oracles(case_id):
    """(J (M, K, D), GGN, Hessian) of the case's float64 batch, by the reference loops."""
    case = next(c for c in CASES if c.id == case_id)
    spec, (theta, X, y) = ref.spec_of(case.model), batch(case)
    return (ref.jacobian_loop(spec, theta, X), ref.ggn_oracle(spec, theta, X, y),
            ref.hessian_oracle(spec, theta, X, y))


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_hvp_jvp_and_ggn_vp_on_both_backends(case, dtype, xp):
    """hvp, jvp and ggn_vp on NumPy and CuPy against the float64 oracles of
    tests/reference/per_example.py: the dense Hessian, the Jacobian loop and the GGN, times v."""
    # checks (peg.27)
    theta, X, y = batch(case, dtype, xp)
    v64 = _vector(case, np.float64)
    v = xp.asarray(v64.astype(dtype))
    J, GGN, H = _oracles(case.id)
    m = case.model
    Hv, Jv, Gv = m.hvp(theta, v, X, y), m.jvp(theta, v, X), m.ggn_vp(theta, v, X, y)
    assert Hv.dtype == Jv.dtype == Gv.dtype == dtype
    assert type(Hv) is type(theta) and Jv.shape == (case.M, m.sizes[-1])
    assert_close(to_numpy(Jv), J @ v64, exact(dtype), "jvp vs J v")
    assert_close(to_numpy(Gv), GGN @ v64, exact(dtype), "ggn_vp vs GGN v")
    assert_close(to_numpy(Hv), H @ v64, exact(dtype), "hvp vs H v")


def test_hvp_differs_from_ggn_vp_by_the_second_derivative_term():
    """On a net with hidden units and a nonzero residual, H v != GGN v: the (peg.24) terms that
    ggn_vp drops (V_{l+1}, act'') carry the sum_i r_i d^2 f_i / dtheta^2 of (peg.21)."""
    case = next(c for c in CASES if c.id == "mlp-tanh-gaussian2out-2h")
    theta, X, y = batch(case)
    v = _vector(case, np.float64)
    m = case.model
    Hv, Gv = m.hvp(theta, v, X, y), m.ggn_vp(theta, v, X, y)
    assert np.linalg.norm(Hv - Gv) > 1e-2 * np.linalg.norm(Hv)
    assert_close(Hv - Gv, (m.hessian(theta, X, y) - m.ggn(theta, X, y)) @ v, EXACT_F64,
                 "H v - GGN v vs (H - GGN) v")


@pytest.mark.parametrize("case", CASES[:2] + CASES[-2:], ids=ids(CASES[:2] + CASES[-2:]))
def test_hvp_is_linear_in_v(case):
    """H (a u + b w) = a H u + b H w; a product that ignored v (or used v twice) fails."""
    theta, X, y = batch(case)
    u, w = _vector(case, np.float64, 1), _vector(case, np.float64, 2)
    m = case.model
    lhs = m.hvp(theta, 2.0 * u - 0.5 * w, X, y)
    assert_close(lhs, 2.0 * m.hvp(theta, u, X, y) - 0.5 * m.hvp(theta, w, X, y), EXACT_F64, "linear")
    assert np.max(np.abs(m.hvp(theta, u, X, y) - m.hvp(theta, w, X, y))) > 1e-3


def test_hvp_of_columns_is_the_hessian():
    """Stacking H e_j over the unit vectors rebuilds the dense Hessian, column by column."""
    case = CASES[-1]
    theta, X, y = batch(case)
    m = case.model
    cols = np.stack([m.hvp(theta, e, X, y) for e in np.eye(m.D)], axis=1)
    assert_close(cols, m.hessian(theta, X, y), EXACT_F64, "columns")


_NET = MLP([3, 4, 1], "tanh", "gaussian")


@pytest.mark.parametrize("v, match", [
    (np.ones(_NET.D + 1), r"^v: expected shape \(%d\), got \(%d,\)" % (_NET.D, _NET.D + 1)),
    (np.ones((_NET.D, 1)), r"^v: expected shape"),
    (np.full(_NET.D, np.nan), r"^v: expected finite values"),
    (np.ones(_NET.D, dtype=np.float32), r"theta, v: expected one dtype"),
    ([1.0] * _NET.D, r"^v: expected an array"),
], ids=["long", "2d", "nan", "float32", "list"])
@pytest.mark.parametrize("method", ["hvp", "ggn_vp", "jvp"])
def test_hvp_rejects_bad_v(v, match, method):
    rng = np.random.default_rng(0)
    theta, X, y = rng.standard_normal(_NET.D), rng.standard_normal((4, 3)), rng.standard_normal(4)
    args = (theta, v, X) if method == "jvp" else (theta, v, X, y)
    with pytest.raises(ValueError, match=match):
        getattr(_NET, method)(*args)


def test_hvp_rejects_bad_theta():
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((4, 3)), rng.standard_normal(4)
    with pytest.raises(ValueError, match=r"^theta: expected shape"):
        _NET.hvp(np.ones(_NET.D + 1), np.ones(_NET.D), X, y)



@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_grad_hvp_is_grad_and_hvp_bit_for_bit(case):
    """grad_hvp's one pass returns exactly grad's and hvp's values (peg.6), (peg.22)-(peg.25)."""
    theta, X, y = batch(case)
    v = _vector(case, np.float64)
    g, Hv = case.model.grad_hvp(theta, v, X, y)
    np.testing.assert_array_equal(g, case.model.grad(theta, X, y))
    np.testing.assert_array_equal(Hv, case.model.hvp(theta, v, X, y))
