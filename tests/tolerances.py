"""Every tolerance used by the test suite, each with its reason. No test defines its own.

Relative errors are measured as ``max|a - b| / max(max|b|, tiny)`` (see ``assert_close``), so a
tolerance is a fraction of the reference's scale, not of each entry.
"""
import numpy as np

# Exact identities evaluated two ways in float64 (Woodbury vs a dense inverse, a closed-form
# gradient vs autograd): both sides round at ~1e-16 per operation; the condition numbers of the
# hypothesis-generated inputs are bounded (SPD matrices built as A A^T + delta I with delta >= 0.1),
# which keeps the accumulated error below 1e-12, so 1e-10 leaves two orders of headroom.
EXACT_F64 = 1e-10

# The same identities in float32: unit roundoff 6e-8, amplified by the same bounded condition
# numbers and by O(D) summations; 1e-3 relative is the stated float32 contract.
EXACT_F32 = 1e-3

# Gauss-Hermite expectations of smooth functions vs adaptive quadrature (scipy.integrate.quad,
# epsabs=epsrel=1e-13): the accuracy target for the quadrature.
QUADRATURE = 1e-12


def exact(dtype) -> float:
    """The exact-identity tolerance for ``dtype``."""
    return EXACT_F32 if np.dtype(dtype) == np.float32 else EXACT_F64


def rel_err(a, b) -> float:
    """max|a - b| / max|b| (max|b| floored at 1e-300 so an all-zero reference is an absolute test)."""
    from refbayes.backend import to_numpy
    a, b = np.asarray(to_numpy(a), dtype=np.float64), np.asarray(to_numpy(b), dtype=np.float64)
    assert a.shape == b.shape, f"shapes differ: {a.shape} vs {b.shape}"
    return float(np.max(np.abs(a - b), initial=0.0) / max(np.max(np.abs(b), initial=0.0), 1e-300))


def assert_close(a, b, tol, what=""):
    err = rel_err(a, b)
    assert err <= tol, f"{what}: relative error {err:.3e} > tolerance {tol:.1e}"
