"""Inputs of refbayes.linalg that used to fail with a message about internals (a scipy or NumPy
error, an overflow warning) or silently: subnormal diagonals whose reciprocal overflows, factors
so large that U U^T or the capacitance overflows, non-symmetric matrices where a Cholesky factor
reads one triangle, and non-finite damping (issue 9, item 5). Each raises a ValueError naming the
argument."""
import re

import numpy as np
import pytest

from refbayes.linalg import gaussian as g
from refbayes.linalg import kron, lowrank

D, L = 5, 2
_rng = np.random.default_rng(0)
_U = _rng.standard_normal((D, L))
_X = _rng.standard_normal((D, 3))
_MU = np.zeros(D)

# every public routine of lowrank that takes the factors (U, d)
LOWRANK = {
    "matvec": lambda U, d: lowrank.matvec(U, d, _X.astype(U.dtype)),
    "solve": lambda U, d: lowrank.solve(U, d, _X.astype(U.dtype)),
    "logdet": lambda U, d: lowrank.logdet(U, d),
    "diag_inv": lambda U, d: lowrank.diag_inv(U, d),
    "trace_inv": lambda U, d: lowrank.trace_inv(U, d),
    "quad": lambda U, d: lowrank.quad(U, d, _X.astype(U.dtype)),
    "inv_quad": lambda U, d: lowrank.inv_quad(U, d, _X.astype(U.dtype)),
    "sample": lambda U, d: lowrank.sample(_MU.astype(U.dtype), U, d, _X.astype(U.dtype)),
    "sample_alg3": lambda U, d: lowrank.sample_alg3(_MU.astype(U.dtype), U, d, _X.astype(U.dtype)),
    "dense_precision": lambda U, d: lowrank.dense_precision(U, d),
    "dense_covariance": lambda U, d: lowrank.dense_covariance(U, d),
    "gaussian.entropy": lambda U, d: g.entropy(g.LowRankPrec(_MU.astype(U.dtype), U, d)),
}
# the routines that invert the precision (they form the capacitance I + U^T d^{-1} U or d^{-1/2} U)
INVERTING = ["solve", "logdet", "diag_inv", "trace_inv", "inv_quad", "sample", "sample_alg3",
             "dense_covariance", "gaussian.entropy"]


def _prefix(name):
    return "q." if name.startswith("gaussian.") else ""


@pytest.mark.parametrize("dtype, tiny_value", [(np.float64, 1e-320), (np.float32, 1e-40)],
                         ids=["float64", "float32"])
@pytest.mark.parametrize("name", list(LOWRANK))
def test_subnormal_d_is_rejected(name, dtype, tiny_value):
    """d = 1e-320 (float64) / 1e-40 (float32) is > 0 but subnormal: 1/d overflows. lowrank.solve
    used to fail with scipy's 'array must not contain infs or NaNs'."""
    U = _U.astype(dtype)
    d = np.ones(D, dtype=dtype)
    d[3] = tiny_value
    with np.errstate(over="ignore"):
        assert d[3] > 0 and not np.isfinite(np.ones(1, dtype=dtype) / d[3]).all()
    want = rf"{re.escape(_prefix(name))}d: expected entries >= .* \(the smallest normal " \
           rf"{np.dtype(dtype).name}\)"
    with pytest.raises(ValueError, match=want):
        LOWRANK[name](U, d)


@pytest.mark.parametrize("dtype, big", [(np.float64, 1e160), (np.float32, 1e20)],
                         ids=["float64", "float32"])
@pytest.mark.parametrize("name", list(LOWRANK))
def test_overflowing_U_is_rejected(name, dtype, big):
    """Entries of U so large that U U^T overflows (every routine uses U U^T or U^T d^{-1} U)."""
    U = _U.astype(dtype)
    U[1, 0] = big
    with np.errstate(over="ignore"):
        assert not np.isfinite(U @ U.T).all()
    want = rf"{re.escape(_prefix(name))}U: expected .*U U\^T.* finite"
    with pytest.raises(ValueError, match=want):
        LOWRANK[name](U, np.ones(D, dtype=dtype))


@pytest.mark.parametrize("name", INVERTING)
def test_overflowing_capacitance_is_rejected(name):
    """U U^T finite (1e300) but U^T d^{-1} U = 1e320 overflows: the inverting routines say so."""
    U = np.zeros((D, L))
    U[0, 0] = 1e150
    d = np.ones(D)
    d[0] = 1e-20
    assert np.isfinite(U @ U.T).all()
    want = rf"{re.escape(_prefix(name))}U, {re.escape(_prefix(name))}d: expected U\^T " \
           r"diag\(d\)\^\{-1\} U .*finite"
    with pytest.raises(ValueError, match=want):
        LOWRANK[name](U, d)


@pytest.mark.parametrize("name", sorted(set(LOWRANK) - set(INVERTING)))
def test_non_inverting_routines_accept_a_large_capacitance(name):
    """matvec, quad and dense_precision never form U^T d^{-1} U: the same inputs are fine."""
    U = np.zeros((D, L))
    U[0, 0] = 1e150
    d = np.ones(D)
    d[0] = 1e-20
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        LOWRANK[name](U, d)


def test_smallest_normal_d_is_accepted():
    d = np.ones(D)
    d[0] = np.finfo(np.float64).tiny
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        x = lowrank.solve(np.zeros((D, L)), d, np.ones(D))
    assert np.isfinite(x).all()


# ----------------------------------------------------------------------------- gaussian

@pytest.mark.parametrize("make, name", [
    (lambda v: g.DiagCov(_MU, v), "q.var"),
    (lambda v: g.DiagPrec(_MU, v), "q.prec_diag"),
    (lambda v: g.LowRankPrec(_MU, _U, v), "q.d"),
], ids=["DiagCov", "DiagPrec", "LowRankPrec"])
@pytest.mark.parametrize("fn", [
    lambda q: g.entropy(q),
    lambda q: g.log_density(q, np.ones(D)),
    lambda q: g.kl(q, g.DiagPrec(_MU, np.ones(D))),
    lambda q: g.symmetric_kl(g.DiagCov(_MU, np.ones(D)), q),
], ids=["entropy", "log_density", "kl", "symmetric_kl"])
def test_subnormal_diagonal_is_rejected(fn, make, name):
    v = np.ones(D)
    v[2] = 1e-320
    with pytest.raises(ValueError, match=rf"[qp]\.{re.escape(name[2:])}: expected entries >= "):
        fn(make(v))


def _asym(n):
    A = 2.0 * np.eye(n)
    A[0, 1] = 0.5  # upper triangle only
    return A


@pytest.mark.parametrize("fn, name", [
    (lambda: g.entropy(g.DenseCov(_MU, _asym(D))), "q.Sigma"),
    (lambda: g.entropy(g.DensePrec(_MU, _asym(D))), "q.Sigma_inv"),
    (lambda: g.kl(g.DiagCov(_MU, np.ones(D)), g.DensePrec(_MU, _asym(D))), "p.Sigma_inv"),
    (lambda: g.entropy(g.KronPrec(np.zeros(6), _asym(2), np.eye(3))), "q.A_prec"),
    (lambda: g.entropy(g.KronCov(np.zeros(6), np.eye(2), _asym(3))), "q.S_cov"),
    (lambda: kron.solve(_asym(2), np.eye(3), np.ones((2, 3))), "A"),
    (lambda: kron.logdet(np.eye(2), _asym(3)), "S"),
    (lambda: kron.solve_factored(_asym(2), np.eye(3), np.ones((2, 3)), 0.1), "A"),
    (lambda: kron.factored_damping_pi(_asym(2), np.eye(3)), "A"),
    (lambda: kron.sample(np.zeros((2, 3)), _asym(2), np.eye(3), np.ones((2, 3))), "A_prec"),
    (lambda: kron.sample_cov(np.zeros((2, 3)), np.eye(2), _asym(3), np.ones((2, 3))), "S_cov"),
], ids=["DenseCov", "DensePrec", "p DensePrec", "KronPrec", "KronCov", "kron.solve",
        "kron.logdet", "kron.solve_factored", "kron.factored_damping_pi", "kron.sample",
        "kron.sample_cov"])
def test_non_symmetric_matrix_is_rejected(fn, name):
    """Every precision / covariance matrix (or Kronecker factor) a linalg routine takes must be
    symmetric by check_spd's rule: a Cholesky factor would read one triangle only."""
    with pytest.raises(ValueError, match=rf"(^|[^\w.]){re.escape(name)}: expected a symmetric matrix"):
        fn()


# ----------------------------------------------------------------------------- kron damping

@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")],
                         ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("fn, name", [
    (lambda v: kron.solve(np.eye(2), np.eye(3), np.ones((2, 3)), damping=v), "damping"),
    (lambda v: kron.logdet(np.eye(2), np.eye(3), damping=v), "damping"),
    (lambda v: kron.solve_factored(np.eye(2), np.eye(3), np.ones((2, 3)), v), "gamma"),
], ids=["solve", "logdet", "solve_factored"])
def test_non_finite_damping_is_rejected(fn, name, value):
    """damping / gamma >= 0 and finite: inf used to return 0 (solve), inf (logdet), or fail on
    'A + pi sqrt(gamma) I: expected finite values' (solve_factored)."""
    with pytest.raises(ValueError, match=rf"^{name}: expected a finite real number in \[0.0, inf\)"):
        fn(value)
