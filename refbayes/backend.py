"""Array backends: NumPy on the CPU, CuPy on the GPU.

Every numeric function starts with ``xp = xp_of(*arrays)`` and uses only that namespace, plus
``linalg_of(xp)`` for triangular solves, and this module's ``cholesky`` and ``cho_solve`` for
Cholesky factors and solves with them (the same contract on both backends). CuPy is never
imported here unless the caller already imported it or asks for it by name
(``get_xp("cupy")``), so refbayes runs where CuPy is not installed. Nothing in refbayes copies
between host and device behind the caller's back: mixing a NumPy and a CuPy array in one call is
an error.
"""
from __future__ import annotations

import sys
from types import ModuleType

import numpy as np

__all__ = ["xp_of", "linalg_of", "get_xp", "to_numpy", "is_cupy_array", "cupy_available", "cholesky",
           "cho_solve"]


def is_cupy_array(a) -> bool:
    """True for a ``cupy.ndarray``; never imports CuPy (an array of it implies it is loaded)."""
    cp = sys.modules.get("cupy")
    return cp is not None and isinstance(a, cp.ndarray)


def xp_of(*arrays) -> ModuleType:
    """The array namespace (``numpy`` or ``cupy``) of ``arrays``; Python scalars and None are neutral.

    Raises ValueError when NumPy and CuPy arrays are mixed, since that would need a silent copy.
    """
    kinds = {"cupy" if is_cupy_array(a) else "numpy"
             for a in arrays if a is not None and not isinstance(a, (int, float, complex, bool))}
    if len(kinds) > 1:
        raise ValueError("arrays: expected all on one backend (all NumPy or all CuPy), got a mix; "
                         "move them explicitly with cupy.asarray / refbayes.backend.to_numpy")
    if kinds == {"cupy"}:
        return sys.modules["cupy"]
    return np


def linalg_of(xp: ModuleType) -> ModuleType:
    """``scipy.linalg`` for NumPy, ``cupyx.scipy.linalg`` for CuPy.

    What both provide, and so all that code reachable with CuPy arrays may call on the result:
    ``solve_triangular``, ``lu``, ``lu_factor``, ``lu_solve``, ``expm``, ``khatri_rao``,
    ``bandwidth``, ``kron``, ``block_diag`` and the special matrices (``toeplitz``, ``hankel``,
    ``circulant``, ...). CuPy 14 has no ``cholesky``, ``cho_factor``, ``cho_solve``, ``eigh``,
    ``solve`` or ``inv`` here: use this module's ``cholesky`` / ``cho_solve`` and
    ``xp.linalg.eigh`` / ``solve`` / ``inv``. ``tests/test_cupy_names.py`` checks every use in
    refbayes against CuPy 14's names.
    """
    if xp is np:
        import scipy.linalg
        return scipy.linalg
    import cupyx.scipy.linalg
    return cupyx.scipy.linalg


def cupy_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # ImportError, or a CUDA runtime error when no driver/device is present
        return False


def get_xp(name: str) -> ModuleType:
    """The namespace called ``name`` ("numpy" or "cupy"); importing CuPy only when asked for."""
    if name == "numpy":
        return np
    if name == "cupy":
        try:
            import cupy
        except ImportError as err:
            raise ValueError("backend: 'cupy' was asked for but CuPy is not installed; "
                             "install refbayes[gpu]") from err
        return cupy
    raise ValueError(f"backend: expected 'numpy' or 'cupy', got {name!r}")


def to_numpy(a) -> np.ndarray:
    """A NumPy copy of ``a`` (explicit device-to-host transfer for CuPy arrays)."""
    if is_cupy_array(a):
        return a.get()
    return np.asarray(a)


def cholesky(M, check: bool = True):
    """Lower Cholesky factor L (L L^T = M) that raises numpy.linalg.LinAlgError on failure on
    both backends: CuPy only raises under ``cupyx.errstate(linalg="raise")`` and otherwise
    returns a partial factor silently. On CuPy the check reads cuSOLVER's status back from the
    device: one synchronisation per call, the price of the error.

    ``check=False`` skips that read-back on CuPy (NumPy always raises): only for a matrix that
    is positive definite by construction (I + a Gram matrix) or already verified (a state's
    precision inside ``refbayes.unchecked()``), where a failure can only come from non-finite
    inputs, which the drivers' finite-state check reports.
    """
    xp = xp_of(M)
    if xp is np:
        return np.linalg.cholesky(M)
    if not check:
        return xp.linalg.cholesky(M)
    import cupyx
    with cupyx.errstate(linalg="raise"):
        return xp.linalg.cholesky(M)


def solve_triangular(A, B, *, lower=False, trans="N", **kwargs):
    """A^{-1} B (trans "N") or A^{-T} B (trans "T") for a triangular A (n, n) and B (n,) or (n, k).

    ``scipy.linalg.solve_triangular`` on NumPy, ``cupyx.scipy.linalg.solve_triangular`` on CuPy
    (``kwargs``, e.g. ``check_finite``, passed on; each library keeps its own defaults), with one
    difference made up for: an n = 0 system. SciPy returns the empty solution; CuPy 14.2 passes
    n as cuBLAS trsm's leading dimensions, which must be >= 1, so cuBLAS refuses it
    (CUBLAS_STATUS_INVALID_VALUE, seen on an H100: a rank L = 0 low-rank factor reaches here).
    """
    xp = xp_of(A, B)
    if xp is not np and A.shape[0] == 0:
        return xp.empty(B.shape, dtype=A.dtype)
    return linalg_of(xp).solve_triangular(A, B, lower=lower, trans=trans, **kwargs)


def cho_solve(L, B):
    """(L L^T)^{-1} B for a lower Cholesky factor L: the triangular solves L Y = B, L^T Z = Y.

    NumPy: ``scipy.linalg.cho_solve`` (LAPACK potrs, the same two solves in one call). CuPy:
    ``cupyx.scipy.linalg`` has no ``cho_solve``, so the two ``solve_triangular`` calls.
    """
    xp = xp_of(L, B)
    if xp is np:
        return linalg_of(xp).cho_solve((L, True), B)
    return solve_triangular(L, solve_triangular(L, B, lower=True), lower=True, trans="T")
