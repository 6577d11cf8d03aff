"""Every tolerance used by the test suite (defined, with its reason, in refbayes/_tolerances.py).
No test defines its own.

Relative errors are measured as ``max|a - b| / max(max|b|, tiny)`` (see ``assert_close``), so a
tolerance is a fraction of the reference's scale, not of each entry.
"""
import numpy as np

from refbayes._tolerances import EXACT_F32, EXACT_F64, QUADRATURE, exact, kl_zero  # noqa: F401  (reasons there)


def rel_err(a, b) -> float:
    """max|a - b| / max|b| (max|b| floored at 1e-300 so an all-zero reference is an absolute test)."""
    from refbayes.backend import to_numpy
    a, b = np.asarray(to_numpy(a), dtype=np.float64), np.asarray(to_numpy(b), dtype=np.float64)
    assert a.shape == b.shape, f"shapes differ: {a.shape} vs {b.shape}"
    return float(np.max(np.abs(a - b), initial=0.0) / max(np.max(np.abs(b), initial=0.0), 1e-300))


def assert_close(a, b, tol, what=""):
    err = rel_err(a, b)
    assert err <= tol, f"{what}: relative error {err:.3e} > tolerance {tol:.1e}"
