"""refbayes.linalg.kron against the dense oracles of tests/reference/dense_gaussian.py.

Inputs (hypothesis draws the sizes, a seed and delta; the seed drives a NumPy generator):
n_in in [1, 30], n_out in [1, 30 // n_in] (D = n_in n_out <= 30), delta in [0.1, 2], damping
and gamma in [0, 2].  SPD factors are B B^T / n + delta I with B standard normal (n, n): their
eigenvalues lie in [delta, ~4 + delta], so the Kronecker products have condition numbers below
~2000.  float32 cases cast the inputs (damping and gamma included) to float32 first and the
float64 oracle uses the cast values.  Samplers are checked as linear maps: with eps the identity basis, the stacked samples
form a square root of the covariance.

The ``xp`` fixture is function-scoped but returns a module and holds no state, so reusing it
across hypothesis examples is safe (hence the suppressed function_scoped_fixture health check).
"""
from typing import NamedTuple

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refbayes.linalg import kron
from tests.reference import dense_gaussian as ref
from tests.tolerances import assert_close, exact

HYP = settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
DTYPES = [pytest.param(np.float64, id="f64"), pytest.param(np.float32, id="f32")]


class Case(NamedTuple):
    n_in: int
    n_out: int
    seed: int
    delta: float
    damping: float


@st.composite
def cases(draw, max_D=30):
    n_in = draw(st.integers(1, max_D))
    n_out = draw(st.integers(1, max_D // n_in))
    seed = draw(st.integers(0, 2**32 - 1))
    delta = draw(st.floats(0.1, 2.0))
    damping = draw(st.one_of(st.just(0.0), st.floats(0.0, 2.0)))
    return Case(n_in, n_out, seed, delta, damping)


def _spd(rng, n, delta):
    B = rng.standard_normal((n, n))
    M = B @ B.T / n + delta * np.eye(n)
    return (M + M.T) / 2


def _inputs(case, dtype, batch=()):
    """(A, S, X) as ``dtype`` NumPy arrays; X of shape batch + (n_in, n_out)."""
    rng = np.random.default_rng(case.seed)
    A, S = _spd(rng, case.n_in, case.delta), _spd(rng, case.n_out, case.delta)
    X = rng.standard_normal(batch + (case.n_in, case.n_out))
    return A.astype(dtype), S.astype(dtype), X.astype(dtype)


def _rep(x, dtype):
    """x rounded to ``dtype``: a float32 call gets the same damping as its float64 oracle."""
    return float(np.dtype(dtype).type(x))


def _on(xp, *arrays):
    return tuple(xp.asarray(a) for a in arrays)


def _each(X):
    """The (n_in, n_out) slices of a stack (..., n_in, n_out)."""
    return X.reshape((-1,) + X.shape[-2:])


# ----------------------------------------------------------------------------- products

@pytest.mark.parametrize("dtype", DTYPES)
@HYP
@given(case=cases(max_D=16))
def test_dense_is_the_kronecker_definition(xp, dtype, case):
    """dense(A, S)[i n_out + j, k n_out + l] = A[i, k] S[j, l]: the row-major vec convention."""
    # checks (kron.1)
    A, S, _ = _inputs(case, dtype)
    got = kron.dense(*_on(xp, A, S))
    assert got.dtype == dtype
    assert_close(got, ref.kron_entry(ref.as64(A), ref.as64(S)), exact(dtype), "dense")


@pytest.mark.parametrize("dtype", DTYPES)
@HYP
@given(case=cases(), batch=st.sampled_from([(), (3,), (2, 2)]))
def test_kron_matvec_matches_dense(xp, dtype, case, batch):
    """(A kron S) vec(X) for general (non-symmetric) square factors, against the dense product
    applied to X.reshape(-1), the row-major flattening of DESIGN.md."""
    # checks (kron.2)
    rng = np.random.default_rng(case.seed)
    A = rng.standard_normal((case.n_in, case.n_in)).astype(dtype)
    S = rng.standard_normal((case.n_out, case.n_out)).astype(dtype)
    X = rng.standard_normal(batch + (case.n_in, case.n_out)).astype(dtype)
    got = kron.kron_matvec(*_on(xp, A, S, X))
    assert got.shape == X.shape and got.dtype == dtype
    K = ref.kron_entry(ref.as64(A), ref.as64(S))
    want = np.stack([(K @ x.reshape(-1)).reshape(x.shape) for x in _each(ref.as64(X))])
    assert_close(got, want.reshape(X.shape), exact(dtype), "kron_matvec")


# ----------------------------------------------------------------------------- solves and log-determinants

@pytest.mark.parametrize("dtype", DTYPES)
@HYP
@given(case=cases(), batch=st.sampled_from([(), (3,)]))
def test_solve_matches_dense_inverse(xp, dtype, case, batch):
    # checks (kron.4), (kron.5)
    A, S, X = _inputs(case, dtype, batch)
    damping = _rep(case.damping, dtype)
    got = kron.solve(*_on(xp, A, S, X), damping=damping)
    assert got.shape == X.shape and got.dtype == dtype
    A64, S64 = ref.as64(A), ref.as64(S)
    want = np.stack([ref.kron_solve(A64, S64, x, damping) for x in _each(ref.as64(X))])
    assert_close(got, want.reshape(X.shape), exact(dtype), f"solve, damping {damping}")


@pytest.mark.parametrize("dtype", DTYPES)
@HYP
@given(case=cases(), rank=st.integers(0, 30), damping=st.floats(0.1, 2.0))
def test_solve_with_singular_factor_and_damping(xp, dtype, case, rank, damping):
    """A = B B^T / n_in with rank(B) < n_in is only PSD; A kron S + damping I is still SPD and
    the eigenbasis solve must handle it (the K-FAC case of fewer examples than inputs)."""
    # checks (kron.5)
    rng = np.random.default_rng(case.seed)
    damping = _rep(damping, dtype)
    r = min(rank, case.n_in - 1)
    B = rng.standard_normal((case.n_in, r))
    A = (B @ B.T / case.n_in).astype(dtype)
    S = _spd(rng, case.n_out, case.delta).astype(dtype)
    X = rng.standard_normal((case.n_in, case.n_out)).astype(dtype)
    got = kron.solve(*_on(xp, A, S, X), damping=damping)
    want = ref.kron_solve(ref.as64(A), ref.as64(S), ref.as64(X), damping)
    assert_close(got, want, exact(dtype), "solve, singular A")
    assert_close(kron.logdet(*_on(xp, A, S), damping=damping),
                 ref.kron_logdet(ref.as64(A), ref.as64(S), damping), exact(dtype), "logdet, singular A")


@pytest.mark.parametrize("dtype", DTYPES)
@HYP
@given(case=cases())
def test_logdet_matches_slogdet(xp, dtype, case):
    # checks (kron.4), (kron.6)
    A, S, _ = _inputs(case, dtype)
    damping = _rep(case.damping, dtype)
    got = kron.logdet(*_on(xp, A, S), damping=damping)
    assert got.dtype == dtype
    want = ref.kron_logdet(ref.as64(A), ref.as64(S), damping)
    assert_close(got, want, exact(dtype), f"logdet, damping {damping}")


# ----------------------------------------------------------------------------- factored damping

@pytest.mark.parametrize("dtype", DTYPES)
@HYP
@given(case=cases())
def test_factored_damping_pi_is_the_printed_formula_and_minimizes_the_trace(xp, dtype, case):
    """pi equals Martens & Grosse's printed trace-norm formula, and it minimizes
    f(pi) = tr(sqrt(gamma) (pi I kron S + A kron I / pi)) = sqrt(gamma)(pi n_in tr S + n_out tr A / pi),
    the trace of the error term of (kron.7): f(pi) <= f(pi (1 +- 1e-2))."""
    # checks (kron.8)
    A, S, _ = _inputs(case, dtype)
    pi = kron.factored_damping_pi(*_on(xp, A, S))
    A64, S64 = ref.as64(A), ref.as64(S)
    assert_close(pi, ref.factored_pi(A64, S64), exact(dtype), "pi")

    def f(p):
        return p * case.n_in * np.trace(S64) + case.n_out * np.trace(A64) / p

    pi = float(pi)
    assert f(pi) <= f(pi * 1.01) and f(pi) <= f(pi / 1.01)


@pytest.mark.parametrize("dtype", DTYPES)
@HYP
@given(case=cases(), batch=st.sampled_from([(), (2,)]))
def test_solve_factored_matches_dense(xp, dtype, case, batch):
    """Against the explicit inverse of the printed factored matrix, and against the expanded
    form (kron.7): A kron S + gamma I + sqrt(gamma)(pi I kron S + A kron I / pi)."""
    A, S, X = _inputs(case, dtype, batch)
    gamma = _rep(case.damping, dtype)
    got = kron.solve_factored(*_on(xp, A, S, X), gamma)
    assert got.shape == X.shape and got.dtype == dtype
    A64, S64 = ref.as64(A), ref.as64(S)
    K = ref.factored_kron(A64, S64, gamma)
    xs = _each(ref.as64(X))
    want = np.stack([(np.linalg.inv(K) @ x.reshape(-1)).reshape(x.shape) for x in xs])
    assert_close(got, want.reshape(X.shape), exact(dtype), "solve_factored")
    pi, r = ref.factored_pi(A64, S64), np.sqrt(gamma)
    I_in, I_out = np.eye(case.n_in), np.eye(case.n_out)
    expanded = (np.kron(A64, S64) + gamma * np.eye(K.shape[0])
                + r * (pi * np.kron(I_in, S64) + np.kron(A64, I_out) / pi))
    back = np.stack([expanded @ y.reshape(-1) for y in _each(ref.as64(got))])
    assert_close(back, np.stack([x.reshape(-1) for x in xs]), exact(dtype),
                 "expanded factored matrix times solve_factored")


# ----------------------------------------------------------------------------- sampling

def _identity_eps(n_in, n_out, dtype):
    """eps[:, :, k] = the k-th basis matrix: stacked samples are the columns of the map."""
    D = n_in * n_out
    return np.eye(D, dtype=dtype).reshape(n_in, n_out, D)


@pytest.mark.parametrize("dtype", DTYPES)
@HYP
@given(case=cases())
def test_sample_is_a_square_root_of_the_inverse_kronecker(xp, dtype, case):
    """With eps = identity basis, C[:, k] = vec(W_k - W_mean) gives C C^T = (A kron S)^{-1}; the
    unbatched eps gives the same column as the batched one."""
    A, S, W_mean = _inputs(case, dtype)
    E = _identity_eps(case.n_in, case.n_out, dtype)
    D = E.shape[-1]
    W = kron.sample(*_on(xp, W_mean, A, S, E))
    assert W.shape == E.shape and W.dtype == dtype
    C = (ref.as64(W) - ref.as64(W_mean)[:, :, None]).reshape(D, D)
    want = np.linalg.inv(np.kron(ref.as64(A), ref.as64(S)))
    assert_close(C @ C.T, want, exact(dtype), "sample: C C^T vs (A kron S)^{-1}")
    one = kron.sample(*_on(xp, W_mean, A, S, np.ascontiguousarray(E[:, :, 0])))
    assert_close(one, ref.as64(W)[:, :, 0], exact(dtype), "sample: unbatched eps")


@pytest.mark.parametrize("dtype", DTYPES)
@HYP
@given(case=cases())
def test_sample_cov_is_a_square_root_of_the_kronecker(xp, dtype, case):
    # checks (kron.11)
    A, S, W_mean = _inputs(case, dtype)
    E = _identity_eps(case.n_in, case.n_out, dtype)
    D = E.shape[-1]
    W = kron.sample_cov(*_on(xp, W_mean, A, S, E))
    assert W.shape == E.shape and W.dtype == dtype
    C = (ref.as64(W) - ref.as64(W_mean)[:, :, None]).reshape(D, D)
    assert_close(C @ C.T, np.kron(ref.as64(A), ref.as64(S)), exact(dtype),
                 "sample_cov: C C^T vs A kron S")
    one = kron.sample_cov(*_on(xp, W_mean, A, S, np.ascontiguousarray(E[:, :, -1])))
    assert_close(one, ref.as64(W)[:, :, -1], exact(dtype), "sample_cov: unbatched eps")


@pytest.mark.parametrize("dtype", DTYPES)
@HYP
@given(case=cases(), batch=st.sampled_from([(), (2,)]))
def test_solve_chol_and_sample_chol_from_the_factors(xp, dtype, case, batch):
    """(kron.9), (kron.10) from Cholesky factors computed once: solve_chol(L_A, L_S, X) is
    (A kron S)^{-1} vec X against the dense inverse, and sample_chol(L_A, L_S, E) with the identity
    basis is a square root of (A kron S)^{-1}, equal to ``sample``'s map less the mean; the upper
    triangles are not read (filled with garbage)."""
    A, S, X = _inputs(case, dtype, batch)
    L_A, L_S = np.linalg.cholesky(ref.as64(A)), np.linalg.cholesky(ref.as64(S))
    # factored_chol (kron.7): the Cholesky factors of the damped factors of ref.factored_kron
    gamma = _rep(case.damping, dtype)
    F_A, F_S = kron.factored_chol(*_on(xp, A, S), gamma)
    assert F_A.dtype == dtype and F_S.dtype == dtype
    assert_close(np.kron(ref.as64(F_A) @ ref.as64(F_A).T, ref.as64(F_S) @ ref.as64(F_S).T),
                 ref.factored_kron(ref.as64(A), ref.as64(S), gamma), exact(dtype),
                 "factored_chol: L_A L_A^T kron L_S L_S^T")
    junk_A = (L_A + 7.0 * np.triu(np.ones_like(L_A), 1)).astype(dtype)
    junk_S = (L_S + 7.0 * np.triu(np.ones_like(L_S), 1)).astype(dtype)
    got = kron.solve_chol(*_on(xp, junk_A, junk_S, X))
    assert got.shape == X.shape and got.dtype == dtype
    K_inv = np.linalg.inv(np.kron(ref.as64(A), ref.as64(S)))
    want = np.stack([(K_inv @ x.reshape(-1)).reshape(x.shape) for x in _each(ref.as64(X))])
    assert_close(got, want.reshape(X.shape), exact(dtype), "solve_chol")
    E = _identity_eps(case.n_in, case.n_out, dtype)
    Z = kron.sample_chol(*_on(xp, junk_A, junk_S, E))
    assert Z.shape == E.shape and Z.dtype == dtype
    C = ref.as64(Z).reshape(E.shape[-1], E.shape[-1])
    assert_close(C @ C.T, K_inv, exact(dtype), "sample_chol: C C^T vs (A kron S)^{-1}")
    W = kron.sample(*_on(xp, np.zeros((case.n_in, case.n_out), dtype), A, S, E))
    assert_close(Z, ref.as64(W), exact(dtype), "sample_chol vs sample's map")


def test_solve_chol_and_sample_chol_reject_bad_factors():
    L = np.linalg.cholesky(np.eye(3) + 0.1)
    X = np.ones((3, 2))
    L2 = np.eye(2)
    for call, name in (
            (lambda: kron.solve_chol(-L, L2, X), "L_A: expected a Cholesky factor"),
            (lambda: kron.solve_chol(L, L2.astype(np.float32), X), "L_A, L_S"),
            (lambda: kron.solve_chol(L, L2, X.T), "X: expected shape"),
            (lambda: kron.sample_chol(L, np.full((2, 2), np.nan), X), "L_S"),
            (lambda: kron.sample_chol(L, L2, np.ones((2, 3))), "eps: expected shape"),
            (lambda: kron.sample_chol(L[:, :2], L2, X), "L_A")):
        with pytest.raises(ValueError, match=name):
            call()


# ----------------------------------------------------------------------------- bad inputs

def _bad_cases():
    A, S, X = _inputs(Case(2, 3, 0, 0.5, 0.0), np.float64)
    nonsym = S.copy()
    nonsym[0, 2] += 1
    E = np.zeros((2, 3, 4))
    return [
        ("A not square", lambda: kron.kron_matvec(A[:1], S, X), r"A: expected a non-empty square matrix"),
        ("X wrong shape", lambda: kron.kron_matvec(A, S, X.T), r"X: expected shape \(\.\.\., 2, 3\)"),
        ("X dtype", lambda: kron.solve(A, S, X.astype(np.float32)), r"X, A: expected one dtype"),
        ("factor dtypes", lambda: kron.dense(A, S.astype(np.float32)), r"A, S: expected one dtype"),
        ("integer factor", lambda: kron.dense(A.astype(int), S), r"A: expected a floating dtype"),
        ("S not symmetric", lambda: kron.solve(A, nonsym, X), r"S: expected a symmetric matrix"),
        ("A NaN", lambda: kron.solve(A * np.nan, S, X), r"A: expected finite values"),
        ("negative damping", lambda: kron.solve(A, S, X, damping=-1.0),
         r"damping: expected a value in \[0\.0, inf\)"),
        ("indefinite, undamped", lambda: kron.solve(A, S - 10 * np.eye(3), X),
         r"A, S, damping: expected A kron S \+ damping I positive definite"),
        ("indefinite logdet", lambda: kron.logdet(-A, S),
         r"A: expected a symmetric positive definite matrix"),
        ("indefinite damped logdet", lambda: kron.logdet(A, S - 10 * np.eye(3), damping=0.5),
         r"A, S, damping: expected A kron S \+ damping I positive definite"),
        ("negative gamma", lambda: kron.solve_factored(A, S, X, -0.1),
         r"gamma: expected a value in \[0\.0, inf\)"),
        ("trace not positive", lambda: kron.factored_damping_pi(A - 10 * np.eye(2), S),
         r"A, S: expected tr A > 0 and tr S > 0"),
        ("gamma 0, singular A", lambda: kron.solve_factored(np.diag([1.0, 0.0]), S, X, 0.0),
         r"A \+ pi sqrt\(gamma\) I: expected a symmetric positive definite matrix"),
        ("A_prec indefinite", lambda: kron.sample(X, -A, S, E), r"A_prec: expected a symmetric positive definite"),
        ("S_prec wrong size", lambda: kron.sample(X, A, A, E), r"S_prec: expected shape \(3, 3\) \(n_out from W_mean\)"),
        ("A_cov wrong size", lambda: kron.sample_cov(X, S, S, E), r"A_cov: expected shape \(2, 2\) \(n_in from W_mean\)"),
        ("eps wrong shape", lambda: kron.sample(X, A, S, E.transpose(2, 0, 1)),
         r"eps: expected shape \(2, 3\) or \(2, 3, n_samples\)"),
        ("eps dtype", lambda: kron.sample_cov(X, A, S, E.astype(np.float32)), r"eps, W_mean: expected one dtype"),
        ("W_mean 3-D", lambda: kron.sample(E, A, S, E), r"W_mean: expected 2 dimensions"),
    ]


@pytest.mark.parametrize("call, match", [pytest.param(c, m, id=i) for i, c, m in _bad_cases()])
def test_bad_input_raises(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_samplers_draws_are_the_printed_maps():
    """(kron.10), (kron.11) draw by draw, written out with explicit inverses: W = W_mean +
    L_A^{-T} E L_S^{-1} (sample; sample_chol without the mean) and W = W_mean + L_A E L_S^T
    (sample_cov), L lower Cholesky factors, for a stack of random E and one unbatched E. The
    C C^T tests above are blind to a sign flip and to L^{-1} in place of L^{-T} on one side
    composed with the matching change on the other; this test is not."""
    # checks (kron.10), (kron.11)
    EXACT_F64 = exact(np.float64)  # tests/tolerances.py
    rng = np.random.default_rng(10)
    n_in, n_out = 4, 3
    GA, GS = rng.standard_normal((n_in, n_in)), rng.standard_normal((n_out, n_out))
    A, S = GA @ GA.T + 0.5 * np.eye(n_in), GS @ GS.T + 0.5 * np.eye(n_out)
    W_mean = rng.standard_normal((n_in, n_out))
    E = rng.standard_normal((n_in, n_out, 5))
    L_A, L_S = np.linalg.cholesky(A), np.linalg.cholesky(S)
    prec = np.stack([np.linalg.inv(L_A).T @ E[:, :, k] @ np.linalg.inv(L_S) for k in range(5)],
                    axis=-1)  # (kron.10)
    cov = np.stack([L_A @ E[:, :, k] @ L_S.T for k in range(5)], axis=-1)  # (kron.11)
    assert_close(kron.sample(W_mean, A, S, E), W_mean[:, :, None] + prec, EXACT_F64, "sample")
    assert_close(kron.sample_chol(L_A, L_S, E), prec, EXACT_F64, "sample_chol")
    assert_close(kron.sample_cov(W_mean, A, S, E), W_mean[:, :, None] + cov, EXACT_F64,
                 "sample_cov")
    E0 = np.ascontiguousarray(E[:, :, 0])
    assert_close(kron.sample(W_mean, A, S, E0), W_mean + prec[:, :, 0], EXACT_F64, "unbatched")
    assert_close(kron.sample_cov(W_mean, A, S, E0), W_mean + cov[:, :, 0], EXACT_F64,
                 "sample_cov unbatched")
    assert np.max(np.abs(prec)) > 1e-1 and np.max(np.abs(cov)) > 1e-1  # not negligible
