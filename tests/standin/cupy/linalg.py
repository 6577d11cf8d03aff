"""``cupy.linalg`` of the stand-in: NumPy's linalg behind the device boundary, cuSOLVER's silent
failures for cholesky, inv and solve, cuSOLVER's eigenvector signs for eigh
(``cupy._standin``)."""
import numpy as _np

from cupy._standin import PINNED as _PINNED, _silent_singular, cholesky, eigh, lift as _lift

LinAlgError = _np.linalg.LinAlgError  # CuPy re-exports NumPy's

_SPECIAL = {"LinAlgError": LinAlgError, "cholesky": cholesky, "eigh": eigh,
            "inv": _silent_singular(_np.linalg.inv, "inv"),
            "solve": _silent_singular(_np.linalg.solve, "solve")}
for _name in _PINNED["names"]["cupy.linalg"]:
    if _name not in _SPECIAL:
        globals()[_name] = _lift(getattr(_np.linalg, _name), _name, zero_d=_name == "matrix_rank")
globals().update(_SPECIAL)
del _name, _SPECIAL
