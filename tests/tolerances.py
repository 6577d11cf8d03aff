"""Every tolerance used by the test suite (defined, with its reason, in refbayes/_tolerances.py).
No test defines its own.

Relative errors are measured as ``max|a - b| / max(max|b|, tiny)`` (see ``assert_close``), so a
tolerance is a fraction of the reference's scale, not of each entry.
"""

from refbayes._tolerances import CONVERGED, EVIDENCE_OPTIMUM, EVIDENCE_STATIONARY, EXACT_F32, EXACT_F64, MC_SIGMAS, ODE_F64, QUADRATURE, QUADRATURE_WIDE, exact, kl_zero, rel_err  # noqa: F401  (reasons there)


def assert_close(a, b, tol, what=""):
    err = rel_err(a, b)
    assert err <= tol, f"{what}: relative error {err:.3e} > tolerance {tol:.1e}"
