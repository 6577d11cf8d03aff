"""``cupyx`` of the stand-in: errstate / seterr / geterr for cuSOLVER errors, allow_synchronize,
scatter_add / scatter_max / scatter_min, rsqrt; names pinned to CuPy 14.2 (``cupy._standin``)."""
import numpy as _np

from cupy._standin import (PINNED as _PINNED, DeviceSynchronized, _from_numpy, _unwrap,
                           allow_synchronize, errstate, geterr, seterr)
from cupy._standin import not_modelled as _not_modelled
from cupy import _stub_module
from cupyx import scipy


def scatter_add(a, slices, value):
    a.scatter_add(slices, value)


def scatter_max(a, slices, value):
    a.scatter_max(slices, value)


def scatter_min(a, slices, value):
    a.scatter_min(slices, value)


def rsqrt(x):
    return _from_numpy(1.0 / _np.sqrt(_unwrap(x)))


_SPECIAL = {"DeviceSynchronized": DeviceSynchronized, "allow_synchronize": allow_synchronize,
            "errstate": errstate, "seterr": seterr, "geterr": geterr, "scipy": scipy,
            "scatter_add": scatter_add, "scatter_max": scatter_max, "scatter_min": scatter_min,
            "rsqrt": rsqrt}
for _name in _PINNED["names"]["cupyx"]:
    if _name in _SPECIAL:
        globals()[_name] = _SPECIAL[_name]
    elif _name in ("linalg", "profiler", "time", "optimizing"):
        globals()[_name] = _stub_module(f"cupyx.{_name}")
    else:
        globals()[_name] = _not_modelled(f"cupyx.{_name}")
del _name, _SPECIAL
