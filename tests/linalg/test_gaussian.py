"""refbayes.linalg.gaussian against the dense oracles of tests/reference/dense_gaussian.py.

Inputs (hypothesis draws the sizes, a seed and delta; the seed drives a NumPy generator):
D = n_in n_out in [1, 30] (n_in in [1, 30], n_out in [1, 30 // n_in], so every D in [1, 30]
occurs and Kronecker forms share the D of the others), L in [0, D], delta in [0.1, 2].
SPD matrices are B B^T / n + delta I with B standard normal (n, n), so their eigenvalues lie in
[delta, ~4 + delta]; U is standard normal / sqrt(D), d and var are in [delta, delta + 2].  The
float32 cases cast these inputs to float32 first, and the float64 oracle is evaluated on the
cast values, so both sides solve the same problem.

The ``xp`` fixture is function-scoped but returns a module and holds no state, so reusing it
across hypothesis examples is safe (hence the suppressed function_scoped_fixture health check).
"""
import functools
import math
from typing import NamedTuple

import numpy as np
import pytest
import scipy.integrate
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refbayes.linalg import gaussian as g
from tests.reference import dense_gaussian as ref
from tests.tolerances import QUADRATURE, assert_close, exact, kl_zero

HYP = settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
DTYPES = [pytest.param(np.float64, id="f64"), pytest.param(np.float32, id="f32")]
KINDS = ["DenseCov", "DensePrec", "DiagCov", "DiagPrec", "LowRankPrec", "KronPrec", "KronCov"]


# ----------------------------------------------------------------------------- inputs

class Case(NamedTuple):
    n_in: int
    n_out: int
    L: int
    seed: int
    delta: float

    @property
    def D(self):
        return self.n_in * self.n_out


@st.composite
def cases(draw, max_D=30):
    n_in = draw(st.integers(1, max_D))
    n_out = draw(st.integers(1, max_D // n_in))
    L = draw(st.integers(0, n_in * n_out))
    seed = draw(st.integers(0, 2**32 - 1))
    delta = draw(st.floats(0.1, 2.0))
    return Case(n_in, n_out, L, seed, delta)


def _spd(rng, n, delta):
    B = rng.standard_normal((n, n))
    M = B @ B.T / n + delta * np.eye(n)
    return (M + M.T) / 2


def _fields(kind, case, rng):
    """float64 NumPy fields of a random distribution of ``kind`` with the bounds above."""
    D, delta = case.D, case.delta
    mu = rng.standard_normal(D)
    if kind in ("DenseCov", "DensePrec"):
        return mu, _spd(rng, D, delta)
    if kind in ("DiagCov", "DiagPrec"):
        return mu, delta + rng.uniform(0, 2, D)
    if kind == "LowRankPrec":
        return mu, rng.standard_normal((D, case.L)) / np.sqrt(D), delta + rng.uniform(0, 2, D)
    return mu, _spd(rng, case.n_in, delta), _spd(rng, case.n_out, delta)


def _put(kind, fields, xp, dtype):
    return getattr(g, kind)(*(xp.asarray(f.astype(dtype)) for f in fields))


def make(kind, case, rng, xp, dtype):
    return _put(kind, _fields(kind, case, rng), xp, dtype)


# ----------------------------------------------------------------------------- against the oracle

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES)
@HYP
@given(case=cases(), n=st.integers(1, 4))
def test_log_density_matches_dense(xp, dtype, kind, case, n):
    # checks (gaussian.1), (gaussian.5), (gaussian.6), (kron.3): every kind, Kronecker ones included
    rng = np.random.default_rng(case.seed)
    q = make(kind, case, rng, xp, dtype)
    x = rng.standard_normal((n, case.D)).astype(dtype)
    mu, Sigma = ref.mean_cov(q)
    want = ref.log_density(mu, Sigma, ref.as64(x))
    got = g.log_density(q, xp.asarray(x))
    assert got.shape == (n,) and got.dtype == dtype
    assert_close(got, want, exact(dtype), f"log_density {kind}, batch")
    assert_close(g.log_density(q, xp.asarray(x[0])), want[0], exact(dtype), f"log_density {kind}")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES)
@HYP
@given(case=cases())
def test_entropy_matches_dense(xp, dtype, kind, case):
    # checks (gaussian.2), (gaussian.5)
    q = make(kind, case, np.random.default_rng(case.seed), xp, dtype)
    got = g.entropy(q)
    assert got.dtype == dtype
    assert_close(got, ref.entropy(ref.mean_cov(q)[1]), exact(dtype), f"entropy {kind}")


@pytest.mark.parametrize("kind_q", KINDS)
@pytest.mark.parametrize("dtype", DTYPES)
@HYP
@given(case=cases())
def test_kl_and_symmetric_kl_match_dense(xp, dtype, kind_q, case):
    """Every (q, p) pair with q of ``kind_q``: KL(q||p) and the symmetric KL against the
    textbook formula, KL >= 0, and symmetric_kl(q, p) == symmetric_kl(p, q)."""
    # checks (gaussian.3), (gaussian.4), (gaussian.7), (gaussian.8), (gaussian.9), (kron.3), (kron.12), (kron.13)
    rng = np.random.default_rng(case.seed)
    q = make(kind_q, case, rng, xp, dtype)
    mq, Sq = ref.mean_cov(q)
    for kind_p in KINDS:
        p = make(kind_p, case, rng, xp, dtype)
        mp, Sp = ref.mean_cov(p)
        what = f"q {kind_q}, p {kind_p}"
        got = g.kl(q, p)
        assert got.dtype == dtype
        assert float(got) >= 0, f"KL({what}) = {float(got)} < 0"
        # KL cancels terms of size `scale`: its error is relative to them, not to KL itself
        scale = ref.kl_scale(mq, Sq, mp, Sp)
        err = abs(float(got) - ref.kl(mq, Sq, mp, Sp))
        assert err <= exact(dtype) * scale, f"kl {what}: error {err:.3e}, term scale {scale:.3e}"
        skl = g.symmetric_kl(q, p)
        assert skl.dtype == dtype
        scale = 0.5 * (scale + ref.kl_scale(mp, Sp, mq, Sq))
        err = abs(float(skl) - ref.symmetric_kl(mq, Sq, mp, Sp))
        assert err <= exact(dtype) * scale, f"symmetric_kl {what}: error {err:.3e}, scale {scale:.3e}"
        assert abs(float(g.symmetric_kl(p, q)) - float(skl)) <= exact(dtype) * scale, \
            f"symmetric_kl swapped {what}"


# ----------------------------------------------------------------------------- zero divergences

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES)
@HYP
@given(case=cases())
def test_kl_of_q_with_itself_is_zero(xp, dtype, kind, case):
    q = make(kind, case, np.random.default_rng(case.seed), xp, dtype)
    bound = kl_zero(dtype, case.D)
    assert abs(float(g.kl(q, q))) <= bound, f"KL(q||q) = {float(g.kl(q, q))} for {kind}"
    assert abs(float(g.symmetric_kl(q, q))) <= bound


def _equivalents(case, rng):
    """Groups of float64 parameterizations (kind, fields) that describe one distribution each,
    converted through explicit float64 inverses."""
    D = case.D
    mu, U, d = _fields("LowRankPrec", case, rng)
    P = U @ U.T + np.diag(d)
    lowrank = [("LowRankPrec", (mu, U, d)), ("DensePrec", (mu, P)),
               ("DenseCov", (mu, np.linalg.inv(P)))]
    mu, var = _fields("DiagCov", case, rng)
    diag = [("DiagCov", (mu, var)), ("DiagPrec", (mu, 1 / var)),
            ("DenseCov", (mu, np.diag(var))), ("LowRankPrec", (mu, np.zeros((D, 0)), 1 / var))]
    mu, A, S = _fields("KronPrec", case, rng)
    kron = [("KronPrec", (mu, A, S)), ("KronCov", (mu, np.linalg.inv(A), np.linalg.inv(S))),
            ("DensePrec", (mu, np.kron(A, S)))]
    return [lowrank, diag, kron]


@pytest.mark.parametrize("dtype", DTYPES)
@HYP
@given(case=cases())
def test_kl_between_equivalent_parameterizations_is_zero(xp, dtype, case):
    """The same Gaussian written in two parameterizations: KL = 0 to tolerances.kl_zero."""
    bound = kl_zero(dtype, case.D)
    for group in _equivalents(case, np.random.default_rng(case.seed)):
        dists = [_put(kind, fields, xp, dtype) for kind, fields in group]
        for q in dists:
            for p in dists:
                value = float(g.kl(q, p))
                assert abs(value) <= bound, \
                    f"KL({type(q).__name__} || {type(p).__name__}) = {value:.3e} > {bound:.1e}"


# ----------------------------------------------------------------------------- quadrature, D = 1

def _one_dim(kind, mu, v):
    """A 1-D Gaussian N(mu, v) written in ``kind`` (float64 NumPy)."""
    m, a = np.array([mu]), 2.0
    return {
        "DenseCov": lambda: g.DenseCov(m, np.array([[v]])),
        "DensePrec": lambda: g.DensePrec(m, np.array([[1 / v]])),
        "DiagCov": lambda: g.DiagCov(m, np.array([v])),
        "DiagPrec": lambda: g.DiagPrec(m, np.array([1 / v])),
        # U U^T + d = 0.5 / v + 0.5 / v
        "LowRankPrec": lambda: g.LowRankPrec(m, np.array([[math.sqrt(0.5 / v)]]), np.array([0.5 / v])),
        "KronPrec": lambda: g.KronPrec(m, np.array([[a]]), np.array([[1 / (v * a)]])),
        "KronCov": lambda: g.KronCov(m, np.array([[a]]), np.array([[v / a]])),
    }[kind]()


# Each example runs two adaptive quadratures (hundreds of log_density calls); the integrand's
# shape does not depend on (mu, v) beyond a shift and a scale, so 15 examples per form suffice.
@pytest.mark.parametrize("kind", KINDS)
@settings(HYP, max_examples=15)
@given(mu=st.floats(-3, 3), v=st.floats(0.1, 10))
def test_log_density_integrates_to_one_and_to_the_entropy(kind, mu, v):
    """D = 1: int q = 1 and -int q log q = H[q] by adaptive quadrature over mu +- 40 sd (the
    mass outside is below e^{-800}); var >= 0.1 keeps H >= 0.27, away from 0."""
    q = _one_dim(kind, mu, v)
    lo, hi = mu - 40 * math.sqrt(v), mu + 40 * math.sqrt(v)

    @functools.lru_cache(maxsize=None)
    def logq(t):
        return float(g.log_density(q, np.array([t])))

    opts = dict(epsabs=1e-13, epsrel=1e-13, limit=200, points=[mu])
    mass = scipy.integrate.quad(lambda t: math.exp(logq(t)), lo, hi, **opts)[0]
    ent = scipy.integrate.quad(lambda t: -math.exp(logq(t)) * logq(t), lo, hi, **opts)[0]
    assert_close(mass, 1.0, QUADRATURE, f"int q, {kind}")
    assert_close(ent, float(g.entropy(q)), QUADRATURE, f"-int q log q vs entropy, {kind}")


# ----------------------------------------------------------------------------- cost

def test_diagonal_and_lowrank_pairs_never_form_a_D_by_D_array():
    """D = 300000: a D x D float64 array would need 720 GB, so any pair that formed one (or
    its Cholesky factor) would raise MemoryError; the O(D L^2) identities take milliseconds.
    The values themselves are checked against the oracle at small D above."""
    D, L = 300_000, 2
    rng = np.random.default_rng(0)
    mu = rng.standard_normal(D)
    dists = [g.DiagCov(mu, 1 + rng.uniform(0, 1, D)), g.DiagPrec(mu + 1, 1 + rng.uniform(0, 1, D)),
             g.LowRankPrec(mu - 1, rng.standard_normal((D, L)) / 100, 1 + rng.uniform(0, 1, D)),
             g.LowRankPrec(mu, rng.standard_normal((D, L + 1)) / 100, 1 + rng.uniform(0, 1, D))]
    for q in dists:
        for p in dists:
            assert np.isfinite(float(g.kl(q, p))) and np.isfinite(float(g.symmetric_kl(q, p)))
        assert np.isfinite(float(g.entropy(q)))
        assert np.isfinite(float(g.log_density(q, mu)))


def test_kronecker_pairs_of_equal_shape_never_form_a_D_by_D_array():
    """n_in = n_out = 500, D = 250000: the Kronecker trace identity (kron.12) keeps it to
    500 x 500 factors; a dense fallback would need 500 GB and raise MemoryError."""
    n = 500
    rng = np.random.default_rng(1)
    A, S = _spd(rng, n, 0.5), _spd(rng, n, 0.5)
    mu = rng.standard_normal(n * n)
    q, p = g.KronPrec(mu, A, S), g.KronCov(mu + 1, S, A)
    assert np.isfinite(float(g.kl(q, p))) and np.isfinite(float(g.symmetric_kl(p, q)))


# ----------------------------------------------------------------------------- bad inputs

def _good(D=4):
    rng = np.random.default_rng(2)
    case = Case(2, D // 2, 1, 0, 0.5)
    return {kind: make(kind, case, rng, np, np.float64) for kind in KINDS}


def _bad_cases():
    G = _good()
    dc, dp, vc, vp, lr, kp, kc = (G[k] for k in KINDS)
    nonsym = dc.Sigma.copy()
    nonsym[0, 1] += 1.0
    indefinite = dc.Sigma - 10 * np.eye(4)
    nan_prec = dp.Sigma_inv.copy()
    nan_prec[1, 1] = np.nan
    other = make("DiagCov", Case(1, 5, 0, 0, 0.5), np.random.default_rng(3), np, np.float64)
    f32 = g.DiagCov(vc.mu.astype(np.float32), vc.var.astype(np.float32))
    return [
        ("not a parameterization", lambda: g.entropy((dc.mu, dc.Sigma)), r"q: expected one of DenseCov"),
        ("mu 2-D", lambda: g.entropy(g.DiagCov(vc.mu[None], vc.var)), r"q\.mu: expected 1 dimensions"),
        ("mu integer", lambda: g.entropy(g.DiagCov(np.arange(4), vc.var)),
         r"q\.mu: expected a floating dtype"),
        ("Sigma wrong shape", lambda: g.entropy(g.DenseCov(dc.mu, dc.Sigma[:3, :3])),
         r"q\.Sigma: expected shape \(4, 4\), got \(3, 3\)"),
        ("Sigma not square", lambda: g.entropy(g.DenseCov(dc.mu, dc.Sigma[:3])),
         r"q\.Sigma: expected a square matrix"),
        ("Sigma not symmetric", lambda: g.entropy(g.DenseCov(dc.mu, nonsym)),
         r"q\.Sigma: expected a symmetric matrix"),
        ("Sigma indefinite", lambda: g.entropy(g.DenseCov(dc.mu, indefinite)),
         r"q\.Sigma: expected a symmetric positive definite matrix"),
        ("Sigma_inv NaN", lambda: g.entropy(g.DensePrec(dp.mu, nan_prec)),
         r"q\.Sigma_inv: expected finite values"),
        ("var zero", lambda: g.entropy(g.DiagCov(vc.mu, vc.var * 0)), r"q\.var: expected > 0"),
        ("prec_diag wrong shape", lambda: g.entropy(g.DiagPrec(vp.mu, vp.prec_diag[:3])),
         r"q\.prec_diag: expected shape \(4\)"),
        ("U wrong rows", lambda: g.entropy(g.LowRankPrec(lr.mu, lr.U[:3], lr.d)),
         r"q\.U: expected shape \(4, L\) with 0 <= L <= 4, got \(3, 1\)"),
        ("U too many columns", lambda: g.entropy(g.LowRankPrec(lr.mu, np.ones((4, 5)), lr.d)),
         r"q\.U: expected shape \(4, L\) with 0 <= L <= 4, got \(4, 5\)"),
        ("d negative", lambda: g.entropy(g.LowRankPrec(lr.mu, lr.U, -lr.d)), r"q\.d: expected > 0"),
        ("Kron sizes", lambda: g.entropy(g.KronPrec(kp.mu, kp.A_prec, np.eye(3))),
         r"q\.A_prec, q\.S_prec: expected n_in \* n_out = D = 4"),
        ("Kron factor indefinite", lambda: g.entropy(g.KronCov(kc.mu, kc.A_cov, -kc.S_cov)),
         r"q\.S_cov: expected a symmetric positive definite matrix"),
        ("mixed dtype in q", lambda: g.entropy(g.DiagCov(vc.mu, vc.var.astype(np.float32))),
         r"expected one dtype for all"),
        ("p invalid", lambda: g.kl(dc, g.DiagPrec(vp.mu, -vp.prec_diag)), r"p\.prec_diag: expected > 0"),
        ("D mismatch", lambda: g.kl(dc, other), r"p: expected dimension D = 4 \(that of q\), got D = 5"),
        ("dtype mismatch", lambda: g.symmetric_kl(f32, dc), r"q, p: expected one dtype for both"),
        ("x wrong D", lambda: g.log_density(dc, np.zeros((2, 5))), r"x: expected shape \(4,\) or \(n, 4\)"),
        ("x 3-D", lambda: g.log_density(dc, np.zeros((1, 2, 4))), r"x: expected 1 or 2 dimensions"),
        ("x dtype", lambda: g.log_density(dc, np.zeros(4, np.float32)), r"x, q\.mu: expected one dtype"),
        ("x NaN", lambda: g.log_density(dc, np.full(4, np.nan)), r"x: expected finite values"),
    ]


@pytest.mark.parametrize("call, match", [pytest.param(c, m, id=i) for i, c, m in _bad_cases()])
def test_bad_input_raises(call, match):
    with pytest.raises(ValueError, match=match):
        call()
