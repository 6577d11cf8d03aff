"""Array backends: NumPy on the CPU, CuPy on the GPU.

Every numeric function starts with ``xp = xp_of(*arrays)`` and uses only that namespace, plus
``linalg_of(xp)`` for triangular solves and Cholesky. CuPy is never imported here unless the
caller already imported it or asks for it by name (``get_xp("cupy")``), so refbayes runs where
CuPy is not installed. Nothing in refbayes copies between host and device behind the caller's
back: mixing a NumPy and a CuPy array in one call is an error.
"""
from __future__ import annotations

import sys
from types import ModuleType

import numpy as np

__all__ = ["xp_of", "linalg_of", "get_xp", "to_numpy", "is_cupy_array", "cupy_available", "cholesky"]


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
    """``scipy.linalg`` for NumPy, ``cupyx.scipy.linalg`` for CuPy (solve_triangular, cholesky, ...)."""
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


def cholesky(M):
    """Lower Cholesky factor L (L L^T = M) that raises numpy.linalg.LinAlgError on failure on
    both backends: CuPy only raises under ``cupyx.errstate(linalg="raise")`` and otherwise
    returns a partial factor silently."""
    xp = xp_of(M)
    if xp is np:
        return np.linalg.cholesky(M)
    import cupyx
    with cupyx.errstate(linalg="raise"):
        return xp.linalg.cholesky(M)
