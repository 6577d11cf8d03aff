"""CuPy stand-in for CPU test runs (see ``cupy._standin`` for what it models and what it cannot).

Importable as ``cupy`` only when ``tests/standin`` is on ``sys.path``: ``tests/conftest.py`` puts
it there when ``REFBAYES_CUPY_STANDIN=1``. Its public names are exactly CuPy 14.2's (pinned list).
"""
import types as _types

import numpy as _np

from cupy import _standin
from cupy._standin import PINNED as _PINNED, lift as _lift, ndarray, not_modelled as _not_modelled

__version__ = _PINNED["cupy_version"] + "+standin"

# CuPy names that NumPy 2 removed or never had, mapped onto what they mean.
_ALIASES = {
    "alltrue": "all", "sometrue": "any", "product": "prod", "cumproduct": "cumprod",
    "round_": "round", "trapz": "trapezoid", "in1d": "isin", "asfarray": None,
    "Inf": _np.inf, "Infinity": _np.inf, "infty": _np.inf, "PINF": _np.inf, "NINF": -_np.inf,
    "NaN": _np.nan, "NAN": _np.nan, "PZERO": 0.0, "NZERO": -0.0,
    "float_": _np.float64, "complex_": _np.complex128, "cfloat": _np.complex128,
    "singlecomplex": _np.complex64,
    "AxisError": _np.exceptions.AxisError, "ComplexWarning": _np.exceptions.ComplexWarning,
    "VisibleDeprecationWarning": _np.exceptions.VisibleDeprecationWarning,
    "ModuleDeprecationWarning": _np.exceptions.ModuleDeprecationWarning,
    "RankWarning": _np.exceptions.RankWarning, "TooHardError": _np.exceptions.TooHardError,
}
# Functions whose CuPy result is a 0-d device array where NumPy's is a Python scalar.
_ZERO_D = {"allclose", "array_equal", "array_equiv", "count_nonzero"}
# Host -> device constructors: the only functions that take NumPy arrays.
_TO_DEVICE = {"asarray", "array", "asanyarray", "ascontiguousarray", "asfortranarray"}


def asnumpy(a, stream=None, order="C", out=None, blocking=True):
    """Device -> host copy (NumPy input passes through, as in CuPy)."""
    if isinstance(a, ndarray):
        return a.get(order=order, out=out)
    return _np.asarray(a, order=order)


def asarray(a, dtype=None, order=None, *, blocking=False):
    """Host -> device (NumPy input copied), or ``a`` itself when it is already a device array
    of that dtype, as CuPy returns it."""
    if isinstance(a, ndarray) and (dtype is None or _np.dtype(dtype) == a.dtype) and order is None:
        return a
    return _lift(_np.asarray, "asarray", accept_numpy=True)(a, dtype=dtype, order=order)


def get_array_module(*args):
    return _this if any(isinstance(a, ndarray) for a in args) else _np


def is_available():
    return True


def fuse(*args, **kwargs):
    """Eager stand-in for ``cupy.fuse``: the function unchanged (no kernel is compiled)."""
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return args[0]
    return lambda f: f


def _device_module(fullname):
    from cupy import cuda
    return cuda if fullname == "cupy.cuda" else None


def _stub_module(fullname):
    mod = _types.ModuleType(fullname, f"{fullname}: in CuPy 14, not modelled by the stand-in")

    def __getattr__(name):
        raise AttributeError(f"{fullname}.{name}: not modelled by the CuPy stand-in "
                             "(tests/standin)")
    mod.__getattr__ = __getattr__
    return mod


class _MemoryPool:
    def free_all_blocks(self):
        pass

    def used_bytes(self):
        return 0

    def total_bytes(self):
        return 0


_POOL, _PINNED_POOL = _MemoryPool(), _MemoryPool()


def _build(namespace):
    from cupy import _standin as core, cuda, linalg, random  # noqa: F401 (submodules)
    special = {
        "ndarray": core.ndarray, "ufunc": core.ufunc, "asnumpy": asnumpy, "asarray": asarray,
        "get_array_module": get_array_module, "is_available": is_available, "fuse": fuse,
        "cuda": cuda, "linalg": linalg, "random": random,
        "get_default_memory_pool": lambda: _POOL,
        "get_default_pinned_memory_pool": lambda: _PINNED_POOL,
        "asfarray": lambda a, dtype=_np.float64: _lift(_np.asarray, "asfarray")(a, dtype=dtype),
        "msort": lambda a: _lift(_np.sort, "msort")(a, axis=0),
    }
    for name in _PINNED["names"]["cupy"]:
        if name in special:
            obj = special[name]
        elif name in _PINNED["same_object_as_numpy"]:
            obj = getattr(_np, name)
        elif name in _ALIASES and not isinstance(_ALIASES[name], str):
            obj = _ALIASES[name]
        else:
            np_name = _ALIASES.get(name, name)
            np_obj = getattr(_np, np_name, None)
            if isinstance(np_obj, _np.ufunc):
                obj = core.ufunc(np_obj)
            elif isinstance(np_obj, _types.ModuleType):
                obj = _stub_module(f"cupy.{name}")
            elif callable(np_obj) and not isinstance(np_obj, type):
                obj = _lift(np_obj, name, zero_d=name in _ZERO_D,
                            accept_numpy=name in _TO_DEVICE)
            elif np_obj is not None and not callable(np_obj):
                obj = np_obj  # constants: pi, e, inf, newaxis, ...
            else:
                obj = _not_modelled(f"cupy.{name}")
        namespace[name] = obj


_this = __import__("sys").modules[__name__]
_build(globals())
del _build
