"""refbayes.linalg.lowrank against the dense oracles of tests/reference/dense.py.

Inputs (hypothesis): D in [1, 40], L in [0, D], d_i in [0.1, 10], U_ij in [-1, 1] / sqrt(L), so
||U U^T||_2 <= ||U||_F^2 <= D and the eigenvalues of P lie in [0.1, 50]: cond(P) <= 500, the
bounded conditioning that tolerances.EXACT_F64 / EXACT_F32 assume.  float32 inputs are drawn as
float32 values, so the float64 oracle solves exactly the problem the float32 code was given.

The ``xp`` fixture is function-scoped but returns a module and holds no state, so reusing it
across hypothesis examples is safe (hence the suppressed function_scoped_fixture health check).
"""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from refbayes.linalg import lowrank
from tests.reference import dense
from tests.tolerances import EXACT_F64, assert_close, exact

HYP = settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
DTYPES = [pytest.param(np.float64, id="f64"), pytest.param(np.float32, id="f32")]


# ----------------------------------------------------------------------------- strategies

def _floats(dtype, lo, hi):
    """Values representable in ``dtype`` (bounds rounded to it: 0.1 becomes float32(0.1))."""
    to = np.dtype(dtype).type
    return st.floats(float(to(lo)), float(to(hi)), width=8 * np.dtype(dtype).itemsize,
                     allow_subnormal=False)


def _rhs_floats(dtype):
    """0 or 2^-20 <= |x| <= 1: quadratic forms square x, and squares of values below
    sqrt(smallest normal) (1e-19 in float32, 1e-154 in float64) underflow to 0, so x^T P x of an
    all-tiny x is not representable to relative accuracy in any implementation."""
    mag = _floats(dtype, 2.0 ** -20, 1)
    return st.one_of(st.just(0.0), mag, mag.map(lambda v: -v))


@st.composite
def factors(draw, dtype, min_L=0):
    """(U, d) with the bounds stated in the module docstring."""
    D = draw(st.integers(1, 40))
    L = draw(st.integers(min(min_L, D), D))
    U = draw(hnp.arrays(dtype, (D, L), elements=_floats(dtype, -1, 1)))
    U = (U / np.sqrt(max(L, 1))).astype(dtype)
    d = draw(hnp.arrays(dtype, (D,), elements=_floats(dtype, 0.1, 10)))
    return U, d


@st.composite
def factors_and_rhs(draw, dtype):
    """(U, d, x) with x (D,) or (D, K), K in [1, 4], entries from ``_rhs_floats``."""
    U, d = draw(factors(dtype))
    K = draw(st.sampled_from([None, 1, 4]))
    shape = (U.shape[0],) if K is None else (U.shape[0], K)
    x = draw(hnp.arrays(dtype, shape, elements=_rhs_floats(dtype)))
    return U, d, x


def _on(xp, *arrays):
    return tuple(xp.asarray(a) for a in arrays)


def _columns(x):
    """x as (D, K): the oracles below work column by column."""
    return x[:, None] if x.ndim == 1 else x


def _assert_dtype(result, dtype, what):
    assert result.dtype == dtype, f"{what}: dtype {result.dtype}, expected {np.dtype(dtype)}"


# ----------------------------------------------------------------------------- products and solves

@pytest.mark.parametrize("dtype", DTYPES)
@HYP
@given(data=st.data())
def test_matvec_matches_dense(xp, dtype, data):
    # checks (lowrank.1)
    U, d, x = data.draw(factors_and_rhs(dtype))
    got = lowrank.matvec(*_on(xp, U, d, x))
    _assert_dtype(got, dtype, "matvec")
    assert_close(got, dense.lowrank_precision(U, d) @ dense.host64(x), exact(dtype), "P x")


@pytest.mark.parametrize("dtype", DTYPES)
@HYP
@given(data=st.data())
def test_solve_matches_dense_inverse(xp, dtype, data):
    # checks (lowrank.3)
    U, d, g = data.draw(factors_and_rhs(dtype))
    got = lowrank.solve(*_on(xp, U, d, g))
    _assert_dtype(got, dtype, "solve")
    assert got.shape == g.shape
    assert_close(got, dense.inverse(dense.lowrank_precision(U, d)) @ dense.host64(g),
                 exact(dtype), "P^{-1} g")


def _log_eig_scale(U, d):
    """sum_i |log lam_i(P)|: the scale against which a sum of logs is accurate."""
    lam = np.linalg.eigvalsh(dense.lowrank_precision(U, d))
    return float(np.sum(np.abs(np.log(lam))))


@pytest.mark.parametrize("dtype", DTYPES)
@HYP
@given(data=st.data())
def test_logdet_matches_slogdet(xp, dtype, data):
    # log det P = sum_i log lam_i is a signed sum that can cancel to 0 (d = (0.1, 10), U = 0), so
    # its error is measured against sum_i |log lam_i| (each log lam_i is accurate relative to
    # itself); a relative error against |log det P| itself would be ill-posed near 0.
    # checks (lowrank.4)
    U, d = data.draw(factors(dtype))
    got = lowrank.logdet(*_on(xp, U, d))
    _assert_dtype(got, dtype, "logdet")
    assert got.shape == ()
    ref = dense.logdet(dense.lowrank_precision(U, d))
    scale = max(_log_eig_scale(U, d), 1e-300)
    err = abs(float(got) - ref) / scale
    assert err <= exact(dtype), f"log det P: error {err:.3e} (relative to sum |log lam|)"


@pytest.mark.parametrize("dtype", DTYPES)
@HYP
@given(data=st.data())
def test_diag_inv_and_trace_inv_match_dense(xp, dtype, data):
    # checks (lowrank.5), (lowrank.6)
    U, d = data.draw(factors(dtype))
    cov = dense.inverse(dense.lowrank_precision(U, d))
    got = lowrank.diag_inv(*_on(xp, U, d))
    _assert_dtype(got, dtype, "diag_inv")
    assert_close(got, np.diag(cov), exact(dtype), "diag(P^{-1})")
    tr = lowrank.trace_inv(*_on(xp, U, d))
    assert tr.shape == ()
    assert_close(tr, np.trace(cov), exact(dtype), "tr(P^{-1})")


@pytest.mark.parametrize("dtype", DTYPES)
@HYP
@given(data=st.data())
def test_quad_and_inv_quad_match_dense(xp, dtype, data):
    # checks (lowrank.7)
    U, d, x = data.draw(factors_and_rhs(dtype))
    P = dense.lowrank_precision(U, d)
    X = dense.host64(_columns(x))
    want_q = np.einsum("ik,ij,jk->k", X, P, X)
    want_iq = np.einsum("ik,ik->k", X, dense.solve(P, X))
    got_q = lowrank.quad(*_on(xp, U, d, x))
    got_iq = lowrank.inv_quad(*_on(xp, U, d, x))
    shape = () if x.ndim == 1 else (x.shape[1],)
    assert got_q.shape == shape and got_iq.shape == shape
    _assert_dtype(got_q, dtype, "quad")
    _assert_dtype(got_iq, dtype, "inv_quad")
    assert_close(got_q.reshape(-1), want_q, exact(dtype), "x^T P x")
    assert_close(got_iq.reshape(-1), want_iq, exact(dtype), "x^T P^{-1} x")


@pytest.mark.parametrize("dtype", DTYPES)
@HYP
@given(data=st.data())
def test_dense_twins_match_oracles(xp, dtype, data):
    # checks (lowrank.1), (lowrank.2)
    U, d = data.draw(factors(dtype))
    P = dense.lowrank_precision(U, d)
    got_P = lowrank.dense_precision(*_on(xp, U, d))
    got_cov = lowrank.dense_covariance(*_on(xp, U, d))
    _assert_dtype(got_cov, dtype, "dense_covariance")
    assert_close(got_P, P, exact(dtype), "dense P")
    assert_close(got_cov, dense.inverse(P), exact(dtype), "dense P^{-1}")


@pytest.mark.parametrize("rows", [1, 3, 7, 8192])
def test_row_blocked_capacitance_matches_dense(monkeypatch, rows):
    # The Gram matrix U^T d^{-1} U is summed over blocks of _ROWS_PER_BLOCK rows (8192 on NumPy,
    # more than the hypothesis cases' D <= 40): small blocks, a last partial block (D = 23 is
    # no multiple of 3 or 7) and one block of every row give the dense answers.
    monkeypatch.setattr(lowrank, "_ROWS_PER_BLOCK", rows)
    rng = np.random.default_rng(rows)
    D, L = 23, 5
    U = rng.uniform(-1, 1, (D, L)) / np.sqrt(L)
    d = rng.uniform(0.1, 10, D)
    X = rng.standard_normal((D, 3))
    P = dense.lowrank_precision(U, d)
    cov = dense.inverse(P)
    assert_close(lowrank.solve(U, d, X), cov @ X, EXACT_F64, "P^{-1} X")
    assert_close(lowrank.logdet(U, d), dense.logdet(P), EXACT_F64, "log det P")
    assert_close(lowrank.diag_inv(U, d), np.diag(cov), EXACT_F64, "diag(P^{-1})")
    assert_close(lowrank.inv_quad(U, d, X), np.einsum("ik,ik->k", X, cov @ X), EXACT_F64,
                 "x^T P^{-1} x")
    S = lowrank.sample(np.zeros(D), U, d, np.eye(D))
    assert_close(S @ S.T, cov, EXACT_F64, "S S^T")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["C", "F", "rows"])
def test_scale_rows_equals_the_broadcast_product_bit_for_bit(dtype, layout):
    # The numba loop of the Gram sum multiplies each entry once, as U * w[:, None] does, on
    # C-ordered, F-ordered and row-strided (every other row) inputs alike.
    from refbayes.linalg._kernels import scale_rows
    rng = np.random.default_rng(3)
    U = rng.standard_normal((2 * 37, 6)).astype(dtype)
    U = {"C": U[:37], "F": np.asfortranarray(U[:37]), "rows": U[::2]}[layout]
    w = rng.uniform(0.1, 3, 37).astype(dtype)
    out = np.full(U.shape, np.nan, dtype)
    got = scale_rows(U, w, out)
    assert got is out
    np.testing.assert_array_equal(out, U * w[:, None])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5,), (5, 3), (0,)])
def test_chol_solve_is_the_inverse_of_R_RT(dtype, shape):
    # C^{-1} B through C's Cholesky factor (LAPACK potrs on NumPy; L = 0 takes the
    # solve_triangular fallback) against the dense solve of C = R R^T.
    rng = np.random.default_rng(4)
    L = shape[0]
    A = rng.standard_normal((L, L))
    R = np.linalg.cholesky(np.eye(L) + A @ A.T / max(L, 1)).astype(dtype)
    B = rng.standard_normal(shape).astype(dtype)
    got = lowrank._chol_solve(R, B)
    assert got.dtype == dtype and got.shape == B.shape
    C = R.astype(np.float64) @ R.T.astype(np.float64)
    want = np.linalg.solve(C, B.astype(np.float64)) if L else B.astype(np.float64)
    assert_close(got, want, exact(dtype), "C^{-1} B")


# ----------------------------------------------------------------------------- sampling

def _factor_of(sampler, xp, U, d):
    """S of ``sampler`` as a linear map: mu = 0 and eps = I_D give S itself."""
    D = U.shape[0]
    zero, eye = np.zeros(D, U.dtype), np.eye(D, dtype=U.dtype)
    return sampler(*_on(xp, zero, U, d, eye))


@pytest.mark.parametrize("dtype", DTYPES)
@HYP
@given(data=st.data())
def test_sample_factor_squares_to_covariance(xp, dtype, data):
    U, d = data.draw(factors(dtype))
    S = dense.host64(_factor_of(lowrank.sample, xp, U, d))
    assert_close(S @ S.T, dense.inverse(dense.lowrank_precision(U, d)), exact(dtype), "S S^T")


@pytest.mark.parametrize("dtype", DTYPES)
@HYP
@given(data=st.data())
def test_sample_shapes_and_mean(xp, dtype, data):
    U, d, eps = data.draw(factors_and_rhs(dtype))
    D = U.shape[0]
    mu = data.draw(hnp.arrays(dtype, (D,), elements=_floats(dtype, -1, 1)))
    got = lowrank.sample(*_on(xp, mu, U, d, eps))
    _assert_dtype(got, dtype, "sample")
    assert got.shape == eps.shape
    U64, d64 = dense.host64(U), dense.host64(d)
    V = U64 / np.sqrt(d64)[:, None]
    S = dense.sym_inv_sqrt(np.eye(D) + V @ V.T) / np.sqrt(d64)[:, None]  # the dense oracle of (lowrank.8)
    want = _columns(dense.host64(mu)[:, None] + S @ dense.host64(_columns(eps)))
    assert_close(_columns(dense.host64(got)), want, exact(dtype), "mu + S eps")


def _rank_deficient_cases(D, dtype):
    rng = np.random.default_rng(20180306)
    u = rng.standard_normal((D, 1))
    return {
        "zeros": np.zeros((D, 3)),
        "repeated_columns": np.repeat(u, 3, axis=1),
        "rank_one_square": u @ rng.standard_normal((1, D)) / np.sqrt(D),
    }


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ["zeros", "repeated_columns", "rank_one_square"])
def test_sample_rank_deficient_U(xp, dtype, case):
    D = 9
    U = _rank_deficient_cases(D, dtype)[case].astype(dtype)
    d = np.linspace(0.1, 10, D).astype(dtype)
    S = dense.host64(_factor_of(lowrank.sample, xp, U, d))
    assert np.all(np.isfinite(S))
    assert_close(S @ S.T, dense.inverse(dense.lowrank_precision(U, d)), exact(dtype),
                 f"S S^T, U {case}")


def test_sample_is_d_scaled_symmetric_root():
    # S = d^{-1/2} (I + V V^T)^{-1/2}: the symmetric inverse square root of I + V V^T scaled by
    # d^{-1/2} (lowrank.8), not just any root of P^{-1}; S itself is not symmetric
    rng = np.random.default_rng(7)
    U, d = rng.standard_normal((6, 2)), rng.uniform(0.1, 10, 6)
    V = U / np.sqrt(d)[:, None]
    want = dense.sym_inv_sqrt(np.eye(6) + V @ V.T) / np.sqrt(d)[:, None]
    assert_close(_factor_of(lowrank.sample, np, U, d), want, exact(np.float64), "S")


@st.composite
def full_rank_factors(draw, dtype):
    """(U, d) with U = Q diag(s), Q orthonormal (D, L), s_j in [0.5, 2], d in [0.5, 2]:
    cond(V^T V) <= 64, because Algorithm 3 inverts C, which amplifies cond(V^T V)."""
    D = draw(st.integers(1, 40))
    L = draw(st.integers(1, D))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    Q = np.linalg.qr(rng.standard_normal((D, L)))[0]
    s = draw(hnp.arrays(np.float64, (L,), elements=st.floats(0.5, 2)))
    d = draw(hnp.arrays(dtype, (D,), elements=_floats(dtype, 0.5, 2)))
    return (Q * s).astype(dtype), d


@pytest.mark.parametrize("dtype", DTYPES)
@HYP
@given(data=st.data())
def test_sample_alg3_corrected_matches_dense(xp, dtype, data):
    # checks (lowrank.12)
    U, d = data.draw(full_rank_factors(dtype))
    S = _factor_of(lowrank.sample_alg3, xp, U, d)
    _assert_dtype(S, dtype, "sample_alg3")
    S = dense.host64(S)
    assert_close(S @ S.T, dense.inverse(dense.lowrank_precision(U, d)), exact(dtype), "S S^T")


@pytest.mark.parametrize("case", ["zeros", "repeated_columns"])
def test_sample_alg3_rejects_singular_gram(xp, case):
    U = xp.asarray(_rank_deficient_cases(9, np.float64)[case])
    d, mu, eps = xp.ones(9), xp.zeros(9), xp.ones(9)
    with pytest.raises(ValueError, match=r"U: Algorithm 3 needs V\^T V .* positive definite"):
        lowrank.sample_alg3(mu, U, d, eps)


# ----------------------------------------------------------------------------- poster errata

def alg2_as_printed(g, U, d):
    """The poster's Algorithm 2 (fast_inverse), line by line as printed."""
    d_inv = 1 / d[:, None]                                              # g is (D, K)
    A = np.linalg.inv(np.eye(U.shape[1]) + U.T @ (d_inv * U))           # line 1
    y = d_inv * g - d_inv * U @ A @ U.T @ (d_inv * g)                   # line 2
    return y                                                            # line 3


def alg3_as_printed(mu, U, d, eps, corrected=()):
    """The poster's Algorithm 3 (fast_sample) as printed; ``corrected`` lists the line numbers
    (4, 6, 7) to take in their corrected form.  Cholesky is lower: A A^T = V^T V, B B^T = ...
    eps is (D, S) and is passed in (line 1 draws it)."""
    I_L = np.eye(U.shape[1])
    r = np.sqrt(d)[:, None]
    V = U / r                                                           # line 2
    A = np.linalg.cholesky(V.T @ V)                                     # line 3
    B = np.linalg.cholesky(I_L + (A.T @ A if 4 in corrected else V.T @ V))  # line 4
    A_inv = np.linalg.inv(A)
    C = A_inv.T @ (B - I_L) @ A_inv                                     # line 5
    K = np.linalg.inv((np.linalg.inv(C).T if 6 in corrected else C) + V.T @ V)  # line 6
    if 7 in corrected:
        y = (eps - V @ K @ V.T @ eps) / r                               # line 7
    else:
        y = eps / r - V @ K @ V.T @ eps                                 # line 7 (printed)
    return mu[:, None] + y                                              # line 8


def _poster_case(D=8, L=3, seed=1806):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((D, L)), np.exp(rng.uniform(np.log(0.1), np.log(10), D))


FAR = 1e6  # "far more than the tolerance": a printed line is wrong by >= 1e6 * EXACT_F64


def _alg3_cov_error(U, d, corrected):
    D = U.shape[0]
    S = alg3_as_printed(np.zeros(D), U, d, np.eye(D), corrected)
    cov = dense.inverse(dense.lowrank_precision(U, d))
    return np.max(np.abs(S @ S.T - cov)) / np.max(np.abs(cov))


def test_poster_alg2_as_printed_is_correct():
    U, d = _poster_case()
    g = np.random.default_rng(0).standard_normal((8, 2))
    want = dense.inverse(dense.lowrank_precision(U, d)) @ g
    assert_close(alg2_as_printed(g, U, d), want, exact(np.float64), "Alg. 2 as printed")
    assert_close(lowrank.solve(U, d, g), alg2_as_printed(g, U, d), exact(np.float64), "solve")


def test_poster_alg3_printed_fails_dense_check():
    U, d = _poster_case()
    tol = exact(np.float64)
    assert _alg3_cov_error(U, d, corrected=()) > FAR * tol, "Alg. 3 as printed"
    # each correction is needed: leaving any one of lines 4, 6, 7 as printed still fails
    for printed in (4, 6, 7):
        kept = tuple(n for n in (4, 6, 7) if n != printed)
        err = _alg3_cov_error(U, d, corrected=kept)
        assert err > FAR * tol, f"Alg. 3 with only line {printed} as printed: error {err:.2e}"
    assert _alg3_cov_error(U, d, corrected=(4, 6, 7)) <= tol, "Alg. 3 corrected"
    D = U.shape[0]
    assert_close(lowrank.sample_alg3(np.zeros(D), U, d, np.eye(D)),
                 alg3_as_printed(np.zeros(D), U, d, np.eye(D), (4, 6, 7)), tol,
                 "sample_alg3 vs the corrected lines")


def test_poster_alg3_line4_is_right_only_for_L1():
    # with L = 1, A^T A = A A^T = V^T V (scalars), so printed line 4 is harmless there; the
    # errata test above therefore needs L >= 2
    U, d = _poster_case(L=1)
    assert _alg3_cov_error(U, d, corrected=(6, 7)) <= exact(np.float64)
    assert _alg3_cov_error(U, d, corrected=(4, 7)) > FAR * exact(np.float64)


# ----------------------------------------------------------------------------- top_eig

def _orthonormal(rng, n, r):
    return np.linalg.qr(rng.standard_normal((n, r)))[0]


@st.composite
def gapped_W(draw, dtype, max_rank_over_L=None):
    """W = Q_D diag(sigma) Q_K^T (D, K), sigma_1..L in [2, 4], the rest in [0, 1]: a gap
    lam_L / lam_{L+1} >= 4 in W W^T, so [W W^T]_L is unique.  With ``max_rank_over_L`` = p,
    rank(W) <= L + p.  Returns (W, L, rng)."""
    D, K = draw(st.integers(1, 40)), draw(st.integers(1, 40))
    L = draw(st.integers(1, min(D, K)))
    r = min(D, K) if max_rank_over_L is None else min(D, K, L + max_rank_over_L)
    top = draw(hnp.arrays(np.float64, (L,), elements=st.floats(2, 4)))
    rest = draw(hnp.arrays(np.float64, (r - L,), elements=st.floats(0, 1)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    sigma = np.concatenate([top, rest])
    W = (_orthonormal(rng, D, r) * sigma) @ _orthonormal(rng, K, r).T
    return W.astype(dtype), L, rng


def _check_columns(V, W, L, dtype):
    """Decreasing eigenvalues down the columns (V^T V = diag(lam_1..L)) and the sign rule."""
    lam = dense.eigh_desc(dense.host64(W) @ dense.host64(W).T)[0][:L]
    Vh = dense.host64(V)
    assert_close(Vh.T @ Vh, np.diag(lam), exact(dtype), "V^T V = diag(lam_1..L)")
    lead = Vh[np.argmax(np.abs(Vh), axis=0), np.arange(L)]
    assert np.all(lead >= 0), "largest-|entry| of each column is non-negative"


@pytest.mark.parametrize("dtype", DTYPES)
@HYP
@given(data=st.data())
def test_top_eig_exact_is_the_rank_L_truncation(xp, dtype, data):
    # checks (lowrank.9)
    W, L, _ = data.draw(gapped_W(dtype))
    V = lowrank.top_eig(xp.asarray(W), L)
    _assert_dtype(V, dtype, "top_eig")
    assert V.shape == (W.shape[0], L)
    Vh = dense.host64(V)
    want = dense.rank_truncation(dense.host64(W) @ dense.host64(W).T, L)
    assert_close(Vh @ Vh.T, want, exact(dtype), "V V^T = [W W^T]_L")
    _check_columns(V, W, L, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D, K, L", [(100, 300, 5), (300, 80, 10), (300, 80, 1), (80, 300, 14),
                                     (300, 64, 10), (300, 63, 10)])
def test_top_eig_exact_top_L_eigensolver_matches_the_truncation(xp, dtype, D, K, L):
    """Gram matrices of n >= 64 rows with L <= n / 6 take the subset eigensolver (only the top L
    pairs), both for K > D (n = D) and K <= D (n = K); the others the full one (L = 14 > 80 / 6,
    n = 63): every case gives [W W^T]_L, decreasing columns and the sign rule."""
    uses_subset = min(D, K) >= lowrank.SUBSET_EIGH_MIN_N and L <= min(D, K) / 6
    assert uses_subset == ((D, K, L) in [(100, 300, 5), (300, 80, 10), (300, 80, 1), (300, 64, 10)])
    rng = np.random.default_rng(D + K + L)
    r = min(D, K)
    sigma = np.concatenate([rng.uniform(2, 4, L), rng.uniform(0, 1, r - L)])
    W = ((_orthonormal(rng, D, r) * sigma) @ _orthonormal(rng, K, r).T).astype(dtype)
    V = lowrank.top_eig(xp.asarray(W), L)
    _assert_dtype(V, dtype, "top_eig")
    Vh = dense.host64(V)
    want = dense.rank_truncation(dense.host64(W) @ dense.host64(W).T, L)
    assert_close(Vh @ Vh.T, want, exact(dtype), "V V^T = [W W^T]_L")
    _check_columns(V, W, L, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@HYP
@given(data=st.data(), n_iter=st.integers(0, 3))
def test_top_eig_randomized_exact_when_rank_at_most_L_plus_p(xp, dtype, data, n_iter):
    # rank(W) <= L + p: W Omega spans range(W) for a Gaussian Omega (almost surely), so the
    # Rayleigh-Ritz step sees all of W W^T and returns its exact truncation
    # checks (lowrank.10)
    W, L, rng = data.draw(gapped_W(dtype, max_rank_over_L=5))
    Omega = rng.standard_normal((W.shape[1], L + 5)).astype(dtype)
    V = lowrank.top_eig(*_on(xp, W), L, method="randomized", Omega=xp.asarray(Omega),
                        n_iter=n_iter)
    _assert_dtype(V, dtype, "top_eig randomized")
    Vh = dense.host64(V)
    want = dense.rank_truncation(dense.host64(W) @ dense.host64(W).T, L)
    assert_close(Vh @ Vh.T, want, exact(dtype), "V V^T = [W W^T]_L")
    _check_columns(V, W, L, dtype)


def _hmt_range_bound(sigma, Qk, Omega, L, q):
    """Halko, Martinsson & Tropp (2011), Thms 9.1 + 9.2, with the actual Omega:
    ||(I - P_Y) W|| <= (sigma_{L+1}^{2(2q+1)} + ||Sigma_2^{2q+1} Omega_2 Omega_1^+||^2)^{1/(2(2q+1))}
    for Y = (W W^T)^q W Omega, Omega_1 = V_1^T Omega, Omega_2 = V_2^T Omega (V = right sing. vecs)."""
    e = 2 * q + 1
    Om1, Om2 = Qk[:, :L].T @ Omega, Qk[:, L:].T @ Omega
    tail = np.linalg.norm((sigma[L:, None] ** e) * (Om2 @ np.linalg.pinv(Om1)), 2)
    return (sigma[L] ** (2 * e) + tail ** 2) ** (1 / (2 * e))


@pytest.mark.parametrize("dtype", DTYPES)
@HYP
@given(D=st.integers(2, 40), K=st.integers(2, 40), L=st.integers(1, 10),
       rho=st.floats(0.7, 0.95), n_iter=st.integers(0, 4), seed=st.integers(0, 2**32 - 1))
def test_top_eig_randomized_decaying_spectrum_within_hmt_bound(xp, dtype, D, K, L, rho,
                                                              n_iter, seed):
    # sigma_i = rho^{i-1} (no gap).  Deterministic bounds that hold for the given Omega:
    #   Eckart-Young:          sigma_{L+1} <= ||(I - P_V) W||_2
    #   HMT Thm 9.3 (+9.1/9.2): ||(I - P_V) W||_2 <= sigma_{L+1} + bound_q  (_hmt_range_bound)
    # P_V = projector on range(V) = Q [Q^T W]_L's range.  bound_q shrinks with q, so this checks
    # that the power iterations and the Rayleigh-Ritz truncation do their job; rounding adds at
    # most exact(dtype) * sigma_1 (the reference scale).  L <= 10 keeps sigma_{L+1} >= 0.7^10
    # ~ 0.03, well above the float32 rounding slack, so neither side is vacuous.
    r = min(D, K)
    L = min(L, r - 1)
    rng = np.random.default_rng(seed)
    Qd, Qk = _orthonormal(rng, D, r), _orthonormal(rng, K, r)
    sigma = rho ** np.arange(r)
    W = ((Qd * sigma) @ Qk.T).astype(dtype)
    Omega = rng.standard_normal((K, L + 5)).astype(dtype)
    V = lowrank.top_eig(*_on(xp, W), L, method="randomized", Omega=xp.asarray(Omega),
                        n_iter=n_iter)
    Wh = dense.host64(W)
    resid = dense.spectral_norm(Wh - dense.orth_projector(V) @ Wh)
    slack = exact(dtype) * sigma[0]
    bound = _hmt_range_bound(sigma, Qk, dense.host64(Omega), L, n_iter)
    assert resid >= sigma[L] - slack, f"below Eckart-Young: {resid} < {sigma[L]}"
    assert resid <= sigma[L] + bound + slack, f"{resid} > sigma_(L+1) + HMT bound {bound}"
    Vh = dense.host64(V)
    ritz = np.sort(np.linalg.eigvalsh(Vh.T @ Vh))[::-1]
    assert np.all(ritz <= sigma[:L] ** 2 + slack), "Ritz values exceed sigma_i^2 (interlacing)"


@pytest.mark.parametrize("dtype", DTYPES)
@HYP
@given(data=st.data())
def test_top_eig_randomized_converges_to_exact_truncation(xp, dtype, data):
    # Full-rank W (rank > L + p, so W Omega alone does not capture range(W)) with a gap:
    # sigma_1..L in [2, 4], sigma_L+1.. in [0.5, 1], so gamma = sigma_{L+1} / sigma_L <= 1/2.
    # Subspace iteration converges to the top-L left singular subspace with
    # ||tan Theta_q|| <= t_q = gamma^{2q+1} ||Omega_2 Omega_1^+||  (Golub & Van Loan, Thm 8.2.2;
    # the constant for a given Omega as in Halko et al. 2011, Thm 9.1), and the Ritz truncation
    # then errs by O(kappa t_q) relative, kappa = sigma_1^2 / sigma_L^2 <= 4.  We take the
    # smallest q with kappa t_q <= 1e-2 * tol and require the exact truncation to tolerance;
    # with q = 0 (no power iteration) the error is ~ gamma, far above it.
    L = data.draw(st.integers(1, 8))
    D, K = data.draw(st.integers(L + 6, 40)), data.draw(st.integers(L + 6, 40))
    r = min(D, K)
    top = data.draw(hnp.arrays(np.float64, (L,), elements=st.floats(2, 4)))
    rest = data.draw(hnp.arrays(np.float64, (r - L,), elements=st.floats(0.5, 1)))
    sigma = np.sort(np.concatenate([top, rest]))[::-1]
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    Qd, Qk = _orthonormal(rng, D, r), _orthonormal(rng, K, r)
    W = ((Qd * sigma) @ Qk.T).astype(dtype)
    Omega = rng.standard_normal((K, L + 5)).astype(dtype)
    coupling = np.linalg.norm((Qk[:, L:].T @ Omega) @ np.linalg.pinv(Qk[:, :L].T @ Omega), 2)
    gamma, kappa = sigma[L] / sigma[L - 1], (sigma[0] / sigma[L - 1]) ** 2
    target = 1e-2 * exact(dtype)
    q = next(q for q in range(200) if kappa * gamma ** (2 * q + 1) * coupling <= target)
    V = lowrank.top_eig(*_on(xp, W), L, method="randomized", Omega=xp.asarray(Omega), n_iter=q)
    Vh = dense.host64(V)
    want = dense.rank_truncation(dense.host64(W) @ dense.host64(W).T, L)
    assert_close(Vh @ Vh.T, want, exact(dtype), f"V V^T after q = {q} power iterations")


def test_top_eig_slang_factor_scaling():
    # W = [sqrt(1 - beta) U, sqrt(beta) G^T] gives W W^T = (1 - beta) U U^T + beta G^T G; the
    # poster's fast_eig(delta u_j, beta g_i) read literally (unrooted) would give delta^2, beta^2
    # checks (lowrank.11)
    rng = np.random.default_rng(3)
    D, L, M, beta = 12, 3, 4, 0.3
    U, G = rng.standard_normal((D, L)), rng.standard_normal((M, D))
    W = np.concatenate([np.sqrt(1 - beta) * U, np.sqrt(beta) * G.T], axis=1)
    V = lowrank.top_eig(W, L)
    want = dense.rank_truncation((1 - beta) * U @ U.T + beta * G.T @ G, L)
    assert_close(V @ V.T, want, exact(np.float64), "SLANG U_{t+1} U_{t+1}^T")
    literal = np.concatenate([(1 - beta) * U, beta * G.T], axis=1)
    Vl = lowrank.top_eig(literal, L)
    assert dense.spectral_norm(Vl @ Vl.T - want) > FAR * exact(np.float64) * np.abs(want).max()


def test_top_eig_randomized_uses_no_hidden_randomness():
    rng = np.random.default_rng(11)
    W, Omega = rng.standard_normal((20, 9)), rng.standard_normal((9, 7))
    a = lowrank.top_eig(W, 2, method="randomized", Omega=Omega, n_iter=1)
    b = lowrank.top_eig(W, 2, method="randomized", Omega=Omega, n_iter=1)
    assert np.array_equal(a, b)


# ----------------------------------------------------------------------------- validation

def _good(D=5, L=2, K=3):
    rng = np.random.default_rng(0)
    return rng.standard_normal((D, L)), rng.uniform(0.5, 2, D), rng.standard_normal((D, K))


BAD_FACTORS = [
    ("U_1d", lambda U, d: (U[:, 0], d), r"U: expected 2 dimensions"),
    ("U_wide", lambda U, d: (np.ones((2, 3)), d[:2]), r"U: expected shape \(D, L\) with L <= D"),
    ("U_nan", lambda U, d: (np.where(U > 0, np.nan, U), d), r"U: expected finite"),
    ("U_int", lambda U, d: (np.ones(U.shape, dtype=np.int64), d), r"U: expected a floating"),
    ("d_shape", lambda U, d: (U, d[:-1]), r"d: expected shape \(5\)"),
    ("d_2d", lambda U, d: (U, d[:, None]), r"d: expected shape \(5\)"),
    ("d_zero", lambda U, d: (U, np.where(d > 1, 0.0, d)), r"d: expected > 0"),
    ("d_negative", lambda U, d: (U, -d), r"d: expected > 0"),
    ("d_inf", lambda U, d: (U, np.where(d > 1, np.inf, d)), r"d: expected finite"),
    ("dtype_mix", lambda U, d: (U.astype(np.float32), d), r"U, d: expected one dtype"),
]


def _factor_calls(U, d, x):
    mu = np.zeros(U.shape[0], dtype=U.dtype)
    return {
        "matvec": lambda: lowrank.matvec(U, d, x), "solve": lambda: lowrank.solve(U, d, x),
        "logdet": lambda: lowrank.logdet(U, d), "diag_inv": lambda: lowrank.diag_inv(U, d),
        "trace_inv": lambda: lowrank.trace_inv(U, d), "quad": lambda: lowrank.quad(U, d, x),
        "inv_quad": lambda: lowrank.inv_quad(U, d, x),
        "sample": lambda: lowrank.sample(mu, U, d, x),
        "sample_alg3": lambda: lowrank.sample_alg3(mu, U, d, x),
        "dense_precision": lambda: lowrank.dense_precision(U, d),
        "dense_covariance": lambda: lowrank.dense_covariance(U, d),
    }


@pytest.mark.parametrize("fn", list(_factor_calls(*_good()).keys()))
@pytest.mark.parametrize("name,corrupt,match", BAD_FACTORS, ids=[b[0] for b in BAD_FACTORS])
def test_bad_factors_raise(fn, name, corrupt, match):
    U, d, x = _good()
    U, d = corrupt(U, d)
    x = np.zeros((U.shape[0], 3), dtype=U.dtype)
    with pytest.raises(ValueError, match=match):
        _factor_calls(U, d, x)[fn]()


BAD_RHS = [
    ("first_dim", lambda x: x[:-1], r"expected shape \(5,\) or \(5, K\)"),
    ("3d", lambda x: x[..., None], r"expected 1 or 2 dimensions"),
    ("nan", lambda x: np.where(x > 0, np.nan, x), r"expected finite"),
    ("float32", lambda x: x.astype(np.float32), r"expected one dtype"),
    ("int", lambda x: np.ones(x.shape, dtype=np.int64), r"expected a floating"),
]


@pytest.mark.parametrize("fn,arg", [("matvec", "x"), ("solve", "g"), ("quad", "x"),
                                    ("inv_quad", "x"), ("sample", "eps"), ("sample_alg3", "eps")])
@pytest.mark.parametrize("name,corrupt,match", BAD_RHS, ids=[b[0] for b in BAD_RHS])
def test_bad_rhs_raise(fn, arg, name, corrupt, match):
    U, d, x = _good()
    with pytest.raises(ValueError, match=rf"{arg}(, U)?: {match}"):
        _factor_calls(U, d, corrupt(x))[fn]()


@pytest.mark.parametrize("sampler", [lowrank.sample, lowrank.sample_alg3])
@pytest.mark.parametrize("mu,match", [
    (np.zeros(4), r"mu: expected shape \(5\)"),
    (np.zeros((5, 1)), r"mu: expected shape \(5\)"),
    (np.zeros(5, dtype=np.float32), r"mu, U: expected one dtype"),
    (np.full(5, np.inf), r"mu: expected finite"),
], ids=["short", "2d", "float32", "inf"])
def test_bad_mu_raise(sampler, mu, match):
    U, d, eps = _good()
    with pytest.raises(ValueError, match=match):
        sampler(mu, U, d, eps)


def _W_Omega():
    rng = np.random.default_rng(1)
    return rng.standard_normal((6, 4)), rng.standard_normal((4, 5))


@pytest.mark.parametrize("kwargs,match", [
    (dict(L=5), r"L: expected L <= K = 4 \(columns of W\) and L <= D = 6"),
    (dict(W=np.ones((3, 8)), L=4), r"L: expected L <= K = 8 .* and L <= D = 3"),
    (dict(L=-1), r"L: expected an integer in \[0, inf\)"),
    (dict(L=2.0), r"L: expected an integer"),
    (dict(W=np.ones(6)), r"W: expected 2 dimensions"),
    (dict(W=np.full((6, 4), np.nan)), r"W: expected finite"),
    (dict(method="svd"), r"method: expected 'exact' or 'randomized'"),
    (dict(method="exact", Omega="given"), r"Omega: only used by method='randomized'"),
    (dict(method="randomized"), r"Omega: method='randomized' needs"),
    (dict(method="randomized", Omega=np.ones((5, 5))), r"Omega: expected shape \(4, L \+ p\)"),
    (dict(method="randomized", Omega=np.ones((4, 1))), r"Omega: expected shape \(4, L \+ p\) "
                                                         r"with L \+ p >= L = 2"),
    (dict(method="randomized", Omega="f32"), r"W, Omega: expected one dtype"),
    (dict(method="randomized", Omega="given", n_iter=-1), r"n_iter: expected an integer in"),
])
def test_top_eig_bad_inputs_raise(kwargs, match):
    W, Omega = _W_Omega()
    args = dict(W=W, L=2)
    args.update(kwargs)
    if isinstance(args.get("Omega"), str):
        args["Omega"] = Omega.astype(np.float32) if args["Omega"] == "f32" else Omega
    with pytest.raises(ValueError, match=match):
        lowrank.top_eig(args.pop("W"), args.pop("L"), **args)


def test_fix_signs_keeps_the_first_largest_entry_rule_on_ties():
    """The max / min shortcut of _fix_signs gives the argmax rule's signs, ties included."""
    from refbayes.linalg.lowrank import _fix_signs
    V = np.array([[1.0, -2.0, 2.0, 0.0, -3.0],
                  [-1.0, 2.0, -2.0, 0.0, 3.0],
                  [0.5, 1.0, 1.0, 0.0, 1.0]])
    # columns: tie (+1 first), tie (-2 first), tie (+2 first), all zero, tie (-3 first)
    want = V * np.array([1.0, -1.0, 1.0, 1.0, -1.0])
    np.testing.assert_array_equal(_fix_signs(V.copy()), want)
    rng = np.random.default_rng(0)
    W = rng.standard_normal((50, 7))
    idx = np.argmax(np.abs(W), axis=0)
    s = np.sign(W[idx, np.arange(7)])
    np.testing.assert_array_equal(_fix_signs(W.copy()), W * s)


def test_orth_is_orthonormal_and_spans_y_on_both_paths():
    """CholeskyQR2 for well-conditioned Y, Householder when Y is near rank-deficient: both give
    an orthonormal basis of Y's columns."""
    from refbayes.linalg import lowrank as lr
    rng = np.random.default_rng(3)
    good = rng.standard_normal((500, 12))
    bad = good.copy()
    bad[:, -1] = bad[:, 0] + 1e-9 * rng.standard_normal(500)  # cond ~ 1e9: Householder
    assert lr._chol_qr(good) is not None and lr._chol_qr(bad) is None
    for Y in (good, bad):
        Q = lr._orth(Y)
        assert_close(Q.T @ Q, np.eye(12), EXACT_F64, "Q^T Q")
        assert_close(Q @ (Q.T @ Y), Y, EXACT_F64, "projection onto span(Q)")


def test_sample_draws_are_the_printed_maps():
    """(lowrank.8) and (lowrank.12) draw by draw, in the note's own forms, mu != 0 and random and
    unit eps: T = I - V f(V^T V) V^T with f(lam) = 1 / (t (1 + t)), t = sqrt(1 + lam), from the
    eigendecomposition of V^T V, theta = mu + d^{-1/2} T eps; and K = (X^{-T} + V^T V)^{-1},
    theta = mu + d^{-1/2} (eps - V K V^T eps). A sign flip of the perturbation, X^{-1} for
    X^{-T}, or T applied after d^{-1/2} instead of before fails here."""
    # checks (lowrank.8), (lowrank.12)
    rng = np.random.default_rng(12)
    D, L = 9, 3
    U = rng.standard_normal((D, L))
    d = np.linspace(0.2, 5.0, D)
    mu = rng.standard_normal(D)
    eps = np.hstack([rng.standard_normal((D, 3)), np.eye(D)])
    V = U / np.sqrt(d)[:, None]
    lam, Q = np.linalg.eigh(V.T @ V)
    t = np.sqrt(1 + lam)
    T = np.eye(D) - V @ ((Q / (t * (1 + t))) @ Q.T) @ V.T  # (lowrank.8)
    by_hand = mu[:, None] + (T @ eps) / np.sqrt(d)[:, None]  # (lowrank.8)
    assert_close(lowrank.sample(mu, U, d, eps), by_hand, EXACT_F64, "sample")
    A = np.linalg.cholesky(V.T @ V)
    B = np.linalg.cholesky(np.eye(L) + A.T @ A)
    A_inv = np.linalg.inv(A)
    X = A_inv.T @ (B - np.eye(L)) @ A_inv
    K = np.linalg.inv(np.linalg.inv(X).T + V.T @ V)  # (lowrank.12)
    by_hand = mu[:, None] + (eps - V @ K @ V.T @ eps) / np.sqrt(d)[:, None]  # (lowrank.12)
    assert_close(lowrank.sample_alg3(mu, U, d, eps), by_hand, EXACT_F64, "sample_alg3")
    assert np.max(np.abs(by_hand - mu[:, None])) > 1e-1  # the perturbation is not negligible


def test_column_extremes_kernel_is_numpys_max_and_min():
    """_kernels.column_extremes (the C-ordered path of _fix_signs) equals V.max(axis=0) and
    V.min(axis=0): random columns, a NaN column (NaN in both), +-inf, a one-row V; and _fix_signs
    flips the same columns on C- and F-ordered copies of V."""
    from refbayes.linalg._kernels import column_extremes
    from refbayes.linalg.lowrank import _fix_signs
    rng = np.random.default_rng(3)
    V = rng.standard_normal((200, 6))
    V[5, 1], V[9, 2], V[0, 3] = np.nan, np.inf, -np.inf
    V[:, 4] = -np.abs(V[:, 4])
    for A in (V, V[:1], V.astype(np.float32)):
        top, bottom = np.empty(A.shape[1], A.dtype), np.empty(A.shape[1], A.dtype)
        column_extremes(np.ascontiguousarray(A), top, bottom)
        np.testing.assert_array_equal(top, A.max(axis=0))
        np.testing.assert_array_equal(bottom, A.min(axis=0))
    W = rng.standard_normal((300, 5))
    np.testing.assert_array_equal(_fix_signs(W.copy()), _fix_signs(np.asfortranarray(W)))
