"""FlatModel.hvp (the Hessian-vector product the geodesic ODE of riemannian_laplace consumes)
against the dense Hessian of FlatModel.hessian (and the closed-form Hessian of the linear models)
times v, on every declarative model case; and its input validation."""
import numpy as np
import pytest

from refbayes.models import MLP
from tests.models.cases import CASES, batch, ids
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
def test_hvp_rejects_bad_v(v, match):
    rng = np.random.default_rng(0)
    theta, X, y = rng.standard_normal(_NET.D), rng.standard_normal((4, 3)), rng.standard_normal(4)
    with pytest.raises(ValueError, match=match):
        _NET.hvp(theta, v, X, y)


def test_hvp_rejects_bad_theta():
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((4, 3)), rng.standard_normal(4)
    with pytest.raises(ValueError, match=r"^theta: expected shape"):
        _NET.hvp(np.ones(_NET.D + 1), np.ones(_NET.D), X, y)

