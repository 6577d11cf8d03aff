"""Jacobians, GGN, Hessian and the diagonal GGN against autograd oracles (tests/reference/per_example.py)."""
import numpy as np
import pytest

from refbayes.backend import to_numpy
from refbayes.models import MLP
from tests.models.cases import CASES, DEEP_CASES, LINEAR_CASES, batch, ids
from tests.reference import per_example as ref
from tests.tolerances import EXACT_F64, assert_close, exact

DTYPES = [np.float64, np.float32]


@pytest.fixture(scope="module")
def oracle():
    """Float64 oracle matrices per (case id, kind), computed once."""
    cache = {}

    def get(case, kind):
        key = (case.id, kind)
        if key not in cache:
            spec, (theta, X, y) = ref.spec_of(case.model), batch(case)
            fn = {"J": lambda: ref.jacobian_loop(spec, theta, X),
                  "ggn": lambda: ref.ggn_oracle(spec, theta, X, y),
                  "hess": lambda: ref.hessian_oracle(spec, theta, X, y)}[kind]
            cache[key] = fn()
        return cache[key]
    return get


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_jacobian(case, dtype, xp, oracle):
    # checks (peg.7)
    theta, X, _ = batch(case, dtype, xp)
    J = case.model.jacobian(theta, X)
    assert J.dtype == dtype and J.shape == (case.M, case.model.sizes[-1], case.model.D)
    assert_close(J, oracle(case, "J"), exact(dtype), "output Jacobian")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_ggn(case, dtype, xp, oracle):
    # checks (peg.8)
    theta, X, y = batch(case, dtype, xp)
    A = case.model.ggn(theta, X, y)
    assert A.dtype == dtype and A.shape == (case.model.D, case.model.D)
    assert_close(A, oracle(case, "ggn"), exact(dtype), "GGN vs sum_i J_i^T H_i J_i")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_diag_ggn(case, dtype, xp, oracle):
    theta, X, y = batch(case, dtype, xp)
    d = case.model.diag_ggn(theta, X, y)
    assert d.dtype == dtype and d.shape == (case.model.D,)
    assert_close(d, np.diag(oracle(case, "ggn")), exact(dtype), "diag GGN vs diag of the oracle GGN")
    assert_close(d, xp.diagonal(case.model.ggn(theta, X, y)), exact(dtype), "diag GGN vs diag(ggn)")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_hessian_numpy(case, dtype, oracle):
    theta, X, y = batch(case, dtype)
    H = case.model.hessian(theta, X, y)
    assert H.dtype == dtype and H.shape == (case.model.D, case.model.D)
    assert_close(H, oracle(case, "hess"), exact(dtype), "Hessian vs autograd.hessian")


SUMMED_CASES = [c for c in LINEAR_CASES if not isinstance(c.model, MLP)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", SUMMED_CASES, ids=ids(SUMMED_CASES))
def test_linear_ggn_sum_over_parameter_vectors(case, dtype, xp):
    """ggn_sum and diag_ggn_sum at S = 3 parameter vectors: sum_s of the oracle GGN (autograd
    J_i^T H_i J_i) at each theta_s, i.e. (peg.20) with sum_s H_i(theta_s) in place of H_i."""
    spec = ref.spec_of(case.model)
    rows = [batch(case, seed=s) for s in range(3)]
    _, X, y = rows[0]
    thetas = np.stack([r[0] for r in rows])
    want = sum(ref.ggn_oracle(spec, th, X, y) for th in thetas)
    args = (xp.asarray(thetas.astype(dtype)), xp.asarray(X.astype(dtype)), xp.asarray(y))
    A = case.model.ggn_sum(*args)
    assert A.dtype == dtype and A.shape == (case.model.D, case.model.D)
    assert_close(A, want, exact(dtype), "sum_s GGN(theta_s)")
    d = case.model.diag_ggn_sum(*args)
    assert d.dtype == dtype and d.shape == (case.model.D,)
    assert_close(d, np.diag(want), exact(dtype), "sum_s diag GGN(theta_s)")
    for method in (case.model.ggn_sum, case.model.diag_ggn_sum):
        with pytest.raises(ValueError, match="thetas: expected shape"):
            method(args[0][:, 1:], args[1], args[2])


@pytest.mark.parametrize("case", LINEAR_CASES, ids=ids(LINEAR_CASES))
def test_linear_hessian_equals_ggn(case, xp, oracle):
    """f is linear in theta, so the Hessian is exactly the GGN (peg.20); checked against autograd."""
    theta, X, y = batch(case, xp=xp)
    if xp is np or not isinstance(case.model, MLP):  # MLP.hessian is autograd: NumPy only
        assert_close(case.model.hessian(theta, X, y), oracle(case, "hess"), EXACT_F64, "Hessian")
    assert_close(case.model.ggn(theta, X, y), oracle(case, "hess"), EXACT_F64, "GGN vs autograd Hessian")


@pytest.mark.parametrize("case", DEEP_CASES, ids=ids(DEEP_CASES))
def test_last_layer_block_of_hessian_equals_ggn(case, oracle):
    """f is linear in (W_L, b_L), so the Hessian's last-layer block is the GGN's (peg.21)."""
    theta, X, y = batch(case)
    n_in, n_out = case.model.sizes[-2:]
    last = slice(case.model.D - (n_in + 1) * n_out, case.model.D)
    H, A = oracle(case, "hess"), case.model.ggn(theta, X, y)
    assert_close(A[last, last], H[last, last], EXACT_F64, "last-layer block")
    # the identity must not hold trivially for the whole matrix of a deep net
    assert np.max(np.abs(A - H)) > 1e3 * EXACT_F64 * np.max(np.abs(H))


@pytest.mark.parametrize("case", [c for c in DEEP_CASES if c.model.likelihood.name == "gaussian"],
                         ids=ids([c for c in DEEP_CASES if c.model.likelihood.name == "gaussian"]))
def test_gaussian_ggn_is_hessian_of_linearized_model(case):
    """Gaussian: GGN = tau sum_i J_i^T J_i, the Hessian of a linear gaussian model on the rows of J.

    The linearized loss sum_ik tau/2 (y_ik - f_ik - J_ik (t - theta))^2 is a linear regression in t
    with design rows J_ik; its Hessian (by autograd, through MLP([D, 1]).hessian) is the GGN.
    """
    theta, X, y = batch(case)
    model = case.model
    J = to_numpy(model.jacobian(theta, X))
    M, K, D = J.shape
    lin = MLP([D, 1], likelihood="gaussian", noise_precision=model.likelihood.noise_precision)
    H_lin = lin.hessian(np.zeros(D + 1), J.reshape(M * K, D), np.zeros(M * K))
    assert_close(model.ggn(theta, X, y), H_lin[:D, :D], EXACT_F64, "gaussian GGN vs linear-model Hessian")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_sample_moments_batched_over_parameter_vectors(case, dtype, xp):
    """sample_moments at S = 3 parameter vectors in one batched pass: row s of g is
    sum_i g_i(theta_s), of h_ef sum_i g_i(theta_s)^2, of h_ggn diag GGN(theta_s), each against the
    autograd per-example loop / dense GGN oracle at that theta_s (peg.6), (peg.9)-(peg.11)."""
    spec = ref.spec_of(case.model)
    rows = [batch(case, seed=s) for s in range(3)]
    _, X, y = rows[0]
    thetas = np.stack([r[0] for r in rows])
    G = [ref.per_example_grads_loop(spec, th, X, y) for th in thetas]
    args = (xp.asarray(thetas.astype(dtype)), xp.asarray(X.astype(dtype)), xp.asarray(y))
    g, none = case.model.sample_moments(*args)
    assert none is None and g.dtype == dtype and g.shape == (3, case.model.D)
    assert_close(g, np.stack([Gs.sum(0) for Gs in G]), exact(dtype), "sum_i g_i per theta_s")
    _, h_ef = case.model.sample_moments(*args, curvature="ef")
    assert_close(h_ef, np.stack([(Gs ** 2).sum(0) for Gs in G]), exact(dtype), "sum_i g_i^2")
    _, h_ggn = case.model.sample_moments(*args, curvature="ggn")
    assert_close(h_ggn, np.stack([np.diag(ref.ggn_oracle(spec, th, X, y)) for th in thetas]),
                 exact(dtype), "diag GGN per theta_s")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_sample_losses_and_grads_batched_over_parameter_vectors(case, dtype, xp):
    """sample_losses_and_grads at S = 3 parameter vectors in one batched pass: loss[s] is
    sum_i l_i(theta_s) against the naive per-example loop (peg.17)-(peg.19), g[s] against the
    autograd per-example loop (peg.6), and g equals sample_moments' g."""
    spec = ref.spec_of(case.model)
    rows = [batch(case, seed=s) for s in range(3)]
    _, X, y = rows[0]
    thetas = np.stack([r[0] for r in rows])
    args = (xp.asarray(thetas.astype(dtype)), xp.asarray(X.astype(dtype)), xp.asarray(y))
    loss, g = case.model.sample_losses_and_grads(*args)
    assert loss.dtype == g.dtype == dtype and loss.shape == (3,) and g.shape == (3, case.model.D)
    targets = ref._targets(spec, y)
    assert_close(loss, [sum(ref.example_loss(spec, th, X[i], targets[i]) for i in range(len(X)))
                        for th in thetas], exact(dtype), "sum_i l_i per theta_s")
    assert_close(g, np.stack([ref.per_example_grads_loop(spec, th, X, y).sum(0)
                              for th in thetas]), exact(dtype), "sum_i g_i per theta_s")
    assert_close(g, case.model.sample_moments(*args)[0], exact(dtype), "as sample_moments")
    with pytest.raises(ValueError, match="thetas: expected shape"):
        case.model.sample_losses_and_grads(args[0][:, 1:], args[1], args[2])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_kfac_moments_is_the_mean_of_kfac_curvature_over_vectors(case, dtype, xp):
    """kfac_moments at S = 3 parameter vectors in one batched pass (peg.14): g[s] against the
    autograd per-example loop at theta_s (peg.6); each layer's (A_l, B_l) against the mean over s
    of kfac_curvature(theta_s) (peg.13) in float64, for "ggn", "ef" with the labels y, and "ef"
    with per-vector labels y_curv[s] (the Monte Carlo Fisher's sampled labels)."""
    spec = ref.spec_of(case.model)
    rows = [batch(case, seed=s) for s in range(3)]
    _, X, y = rows[0]
    y_curv = np.stack([r[2] for r in rows[::-1]])  # other valid targets per vector
    thetas = np.stack([r[0] for r in rows])
    args = (xp.asarray(thetas.astype(dtype)), xp.asarray(X.astype(dtype)), xp.asarray(y))
    g, none = case.model.kfac_moments(*args)
    assert none is None and g.dtype == dtype and g.shape == (3, case.model.D)
    assert_close(g, np.stack([ref.per_example_grads_loop(spec, th, X, y).sum(0)
                              for th in thetas]), exact(dtype), "sum_i g_i per theta_s")
    for curvature, labels in (("ggn", None), ("ef", None), ("ef", y_curv)):
        g2, factors = case.model.kfac_moments(
            *args, curvature=curvature, y_curv=None if labels is None else xp.asarray(labels))
        assert_close(g2, g, exact(dtype), "the gradient does not depend on the curvature")
        per = [case.model.kfac_curvature(th, X, y if labels is None else labels[s], curvature)
               for s, th in enumerate(thetas)]
        assert len(factors) == case.model.n_layers
        for l, (A, B) in enumerate(factors):
            assert A.dtype == dtype and B.dtype == dtype
            assert_close(A, sum(p[l][0] for p in per) / 3, exact(dtype), f"A_{l} ({curvature})")
            assert_close(B, sum(p[l][1] for p in per) / 3, exact(dtype), f"B_{l} ({curvature})")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_forward_batched_is_forward_per_vector(case, dtype, xp):
    """forward_batched at S = 3 parameter vectors: F[s] = forward(theta_s) (peg.1)."""
    rows = [batch(case, seed=s) for s in range(3)]
    X = xp.asarray(rows[0][1].astype(dtype))
    thetas = xp.asarray(np.stack([r[0] for r in rows]).astype(dtype))
    F = case.model.forward_batched(thetas, X)
    assert F.dtype == dtype and F.shape == (3, case.M, case.model.sizes[-1])
    for s in range(3):
        assert_close(F[s], case.model.forward(thetas[s], X), exact(dtype), f"F[{s}]")
    with pytest.raises(ValueError, match="thetas: expected shape"):
        case.model.forward_batched(thetas[:, 1:], X)


def test_kfac_moments_rejects_bad_input():
    model = MLP([3, 4, 2], likelihood="categorical")
    X, y = np.zeros((5, 3)), np.zeros(5, dtype=int)
    thetas = np.zeros((2, model.D))
    with pytest.raises(ValueError, match="thetas: expected shape"):
        model.kfac_moments(np.zeros((2, model.D + 1)), X, y)
    with pytest.raises(ValueError, match="curvature: expected None, 'ef' or 'ggn'"):
        model.kfac_moments(thetas, X, y, curvature="mc")
    with pytest.raises(ValueError, match="y_curv: only curvature 'ef'"):
        model.kfac_moments(thetas, X, y, curvature="ggn", y_curv=np.zeros((2, 5), dtype=int))
    with pytest.raises(ValueError, match="y_curv: expected shape"):
        model.kfac_moments(thetas, X, y, curvature="ef", y_curv=np.zeros((3, 5), dtype=int))
    with pytest.raises(ValueError, match="y_curv .*labels"):
        model.kfac_moments(thetas, X, y, curvature="ef", y_curv=np.full((2, 5), 7))


def test_sample_moments_rejects_bad_input():
    model = MLP([3, 4, 1])
    X, y = np.zeros((5, 3)), np.zeros(5)
    with pytest.raises(ValueError, match="thetas: expected shape"):
        model.sample_moments(np.zeros((2, model.D + 1)), X, y)
    with pytest.raises(ValueError, match="curvature: expected None, 'ef' or 'ggn'"):
        model.sample_moments(np.zeros((2, model.D)), X, y, curvature="hess")
    with pytest.raises(ValueError, match="thetas"):
        model.sample_moments(np.full((2, model.D), np.nan), X, y)
