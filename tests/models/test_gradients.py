"""Losses, gradients and per-example gradients of every model case against naive autograd loops."""
import numpy as np
import pytest

from refbayes.backend import to_numpy
from tests.models.cases import CASES, batch, ids
from tests.reference import per_example as ref
from tests.tolerances import EXACT_F64, assert_close, exact

DTYPES = [np.float64, np.float32]


@pytest.fixture(scope="module")
def oracle_G():
    """Oracle per-example gradients per case id (float64; computed once, reused by dtype/impl)."""
    cache = {}

    def get(case):
        if case.id not in cache:
            theta, X, y = batch(case)
            cache[case.id] = ref.per_example_grads_loop(ref.spec_of(case.model), theta, X, y)
        return cache[case.id]
    return get


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_loss_matches_scipy(case, dtype, xp):
    theta, X, y = batch(case, dtype, xp)
    theta64, X64, y_host = batch(case)
    F = np.stack([ref.naive_output(ref.spec_of(case.model), theta64, x) for x in X64])
    want = ref.losses_scipy(ref.spec_of(case.model), F, y_host)
    got = case.model.per_example_losses(theta, X, y)
    assert got.dtype == dtype and got.shape == (case.M,)
    assert_close(got, want, exact(dtype), "per-example losses")
    assert_close(case.model.loss(theta, X, y), want.sum(), exact(dtype), "summed loss")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_forward_matches_naive(case, dtype, xp):
    theta, X, _ = batch(case, dtype, xp)
    want = np.stack([ref.naive_output(ref.spec_of(case.model), batch(case)[0], x) for x in batch(case)[1]])
    got = case.model.forward(theta, X)
    assert got.dtype == dtype and got.shape == (case.M, case.model.sizes[-1])
    assert_close(got, want, exact(dtype), "outputs f")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_vectorized_per_example_grads(case, dtype, xp, oracle_G):
    # checks (peg.2), (peg.3), (peg.5)
    theta, X, y = batch(case, dtype, xp)
    G = case.model.per_example_grads(theta, X, y, impl="vectorized")
    assert G.dtype == dtype and G.shape == (case.M, case.model.D)
    assert_close(G, oracle_G(case), exact(dtype), "vectorized G vs autograd loop")


@pytest.mark.parametrize("impl", ["numba", "autograd"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_numpy_impls_per_example_grads(case, dtype, impl, oracle_G):
    # checks (peg.2), (peg.3), (peg.5)
    theta, X, y = batch(case, dtype)
    G = case.model.per_example_grads(theta, X, y, impl=impl)
    assert G.dtype == dtype and G.shape == (case.M, case.model.D)
    assert_close(G, oracle_G(case), exact(dtype), f"{impl} G vs autograd loop")


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_three_impls_agree_float64(case):
    theta, X, y = batch(case, seed=3)
    Gv = case.model.per_example_grads(theta, X, y, impl="vectorized")
    for impl in ("numba", "autograd"):
        assert_close(case.model.per_example_grads(theta, X, y, impl=impl), Gv, EXACT_F64,
                     f"{impl} vs vectorized")


def test_default_impl_on_numpy_is_numba(monkeypatch):
    import refbayes.models.base as base  # it imports the kernel at module level
    case = CASES[-1]
    calls = []
    real = base.per_example_grads_numba
    monkeypatch.setattr(base, "per_example_grads_numba", lambda *a: calls.append(1) or real(*a))
    case.model.per_example_grads(*batch(case))
    assert calls == [1]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_grad_is_sum_of_rows_and_matches_autograd(case, dtype, xp, oracle_G):
    theta, X, y = batch(case, dtype, xp)
    g = case.model.grad(theta, X, y)
    assert g.dtype == dtype and g.shape == (case.model.D,)
    assert_close(g, oracle_G(case).sum(axis=0), exact(dtype), "grad vs autograd")
    assert_close(g, case.model.per_example_grads(theta, X, y, impl="vectorized").sum(axis=0),
                 exact(dtype), "grad vs sum of rows")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_diag_ef_is_diag_of_GtG(case, dtype, xp, oracle_G):
    theta, X, y = batch(case, dtype, xp)
    G = oracle_G(case)
    assert_close(case.model.diag_ef(theta, X, y), np.diag(G.T @ G), exact(dtype), "diag EF")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_kfac_factors_rebuild_rows(case, dtype, xp, oracle_G):
    # checks (peg.12)
    theta, X, y = batch(case, dtype, xp)
    layers = case.model.kfac_factors(theta, X, y)
    assert len(layers) == len(case.model.sizes) - 1
    rows = []
    for l, (a, g) in enumerate(layers):
        assert a.shape == (case.M, case.model.sizes[l]) and g.shape == (case.M, case.model.sizes[l + 1])
        rows.append(np.einsum("mi,mo->mio", to_numpy(a), to_numpy(g)).reshape(case.M, -1))
        if case.model.bias:
            rows.append(to_numpy(g))
    assert_close(np.concatenate(rows, axis=1), oracle_G(case), exact(dtype), "K-FAC outer products")
    assert_close(layers[0].a, batch(case)[1], exact(dtype), "a_0 is X")


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_predict(case, xp):
    theta, X, _ = batch(case, xp=xp)
    f = to_numpy(case.model.forward(theta, X))
    p = case.model.predict(theta, X)
    name = case.model.likelihood.name
    if name == "gaussian":
        want = f
    elif name == "bernoulli":
        want = 1.0 / (1.0 + np.exp(-f[:, 0]))
    else:
        want = np.exp(f) / np.exp(f).sum(axis=1, keepdims=True)
    assert_close(p, want, EXACT_F64, "predictive mean")


@pytest.mark.parametrize("impl", ["numba", "vectorized"])
def test_relu_derivative_at_zero_is_zero(impl):
    """relu'(0) = 0 (derivations/per_example_gradients.md): with z_1 = 0 exactly, the bias
    gradient delta_1 = (delta_2 W_2^T) relu'(0) is 0 (it would be (-0.5, -0.25) with relu'(0) = 1)."""
    # checks (peg.5)
    from refbayes.models import MLP
    model = MLP([1, 2, 1], activation="relu")
    # W_1 = [[1, -1]], b_1 = [0, 0]: at x = 0 both hidden pre-activations are exactly 0
    theta = np.array([1.0, -1.0, 0.0, 0.0, 0.5, 0.25, 0.0])
    X, y = np.zeros((1, 1)), np.array([1.0])
    G = model.per_example_grads(theta, X, y, impl=impl)
    np.testing.assert_array_equal(G[0, :6], np.zeros(6))
    assert G[0, 6] == -1.0  # d/db_2 of (f - y)^2 / 2 at f = 0, y = 1


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_per_example_grads_batched_over_parameter_vectors(case, dtype, xp):
    """per_example_grads_batched at S = 3 parameter vectors: G[s] against the autograd
    per-example loop at theta_s (peg.4); S = 1 too."""
    spec = ref.spec_of(case.model)
    rows = [batch(case, seed=s) for s in range(3)]
    _, X, y = rows[0]
    thetas = np.stack([r[0] for r in rows])
    want = np.stack([ref.per_example_grads_loop(spec, th, X, y) for th in thetas])
    args = (xp.asarray(X.astype(dtype)), xp.asarray(y))
    G = case.model.per_example_grads_batched(xp.asarray(thetas.astype(dtype)), *args)
    assert G.dtype == dtype and G.shape == (3, case.M, case.model.D)
    assert_close(G, want, exact(dtype), "G[s] per theta_s")
    G1 = case.model.per_example_grads_batched(xp.asarray(thetas[:1].astype(dtype)), *args)
    assert_close(G1, want[:1], exact(dtype), "S = 1")
    with pytest.raises(ValueError, match="thetas: expected shape"):
        case.model.per_example_grads_batched(xp.asarray(thetas[:, 1:].astype(dtype)), *args)
