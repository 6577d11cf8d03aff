"""``cupyx.scipy.linalg`` of the stand-in: SciPy's functions of the same names (CuPy 14.2 has
only these 21: no cholesky, cho_factor, cho_solve, eigh, solve, inv); solve_triangular refuses
an n = 0 system as cuBLAS does."""
import scipy.linalg as _sla

from cupy._standin import PINNED as _PINNED, lift as _lift, not_modelled as _not_modelled
from cupy._standin import solve_triangular as _solve_triangular

for _name in _PINNED["names"]["cupyx.scipy.linalg"]:
    _f = getattr(_sla, _name, None)
    globals()[_name] = (_lift(_f, _name) if _f is not None
                        else _not_modelled(f"cupyx.scipy.linalg.{_name}"))
solve_triangular = _solve_triangular  # refuses n = 0 as cuBLAS does (cupy._standin)
del _name, _f
