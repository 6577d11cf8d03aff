"""The core of the CuPy stand-in: a device array that is a NumPy array behind CuPy's boundary.

This is test scaffolding, not a GPU emulator. It models what decides whether code written for
CuPy 14 runs on CuPy at all, on a machine without a GPU:

- ``cupy.ndarray`` is its own class: ``isinstance(a, numpy.ndarray)`` is False, and implicit
  conversion to NumPy raises ``TypeError`` as CuPy does (``__array__``, hence ``numpy.asarray``,
  SciPy, and any library that converts its inputs); numba's CPU kernels refuse it at typing
  (``numba.core.errors.TypingError``, "non-precise type pyobject"), as they refuse a CuPy array.
  ``.get()``, ``cupy.asnumpy`` and ``cupy.asarray`` are the explicit transfers.
- Functions of ``cupy`` reject NumPy arrays (CuPy: ``TypeError: Unsupported type``); NumPy
  functions called on stand-in arrays dispatch to the stand-in through ``__array_ufunc__`` and
  ``__array_function__`` (NEP 13/18, as CuPy does) and fail with ``TypeError`` where CuPy has no
  counterpart.
- Reductions return 0-d device arrays, never Python or NumPy scalars; ``allclose``,
  ``array_equal`` and ``count_nonzero`` too.
- Every implicit device synchronisation (``__bool__``, ``__float__``, ``__int__``, ``__index__``,
  ``__complex__``, ``__format__``, ``.item()``, ``.tolist()``) is counted, with the line of the
  caller that caused it, and raises ``cupyx.DeviceSynchronized`` inside
  ``cupyx.allow_synchronize(False)``. Explicit transfers (``.get()``, ``asnumpy``) are counted
  apart.
- cuSOLVER's silent failures: ``cupy.linalg.cholesky`` of a matrix that is not positive definite
  returns a partial factor (finite values, no NaN: the factored leading columns and the
  unfactored Schur complement), and ``inv`` / ``solve`` of a singular matrix return NaN, without
  an error, unless inside ``cupyx.errstate(linalg="raise")`` (then ``numpy.linalg.LinAlgError``,
  which is CuPy's ``cupy.linalg.LinAlgError``). Under "raise" each such call reads cuSOLVER's
  status back from the device: one counted synchronisation, as in CuPy.
- Two differences from LAPACK seen on a device: ``cupy.linalg.eigh`` returns eigenvectors of
  other signs (here every other column flipped against NumPy's), and
  ``cupyx.scipy.linalg.solve_triangular`` refuses an n = 0 system (cuBLAS's
  ``CUBLAS_STATUS_INVALID_VALUE``; here ``cupy._standin.CUBLASError``).
- The public names of ``cupy``, ``cupy.linalg``, ``cupy.random``, ``cupyx``, ``cupyx.scipy``,
  ``cupyx.scipy.linalg``, ``cupyx.scipy.special`` and the attributes of ``cupy.ndarray`` are
  exactly CuPy 14.2's (pinned in ``cupy14_names.json`` beside this package, with where they were
  read): a name CuPy lacks is an ``AttributeError`` here. A name CuPy has that the stand-in does
  not model raises ``NotImplementedError`` naming it when called.

What it cannot model:

- GPU rounding: results are NumPy's bit for bit (cuBLAS / cuSOLVER reductions and matrix
  products round differently; a device run needs tolerances where this one is exact).
- Kernel compilation, launch and memory: ``ElementwiseKernel``, ``RawKernel``, ``fuse`` with
  kernel semantics, streams, pools; timings mean nothing here.
- Duplicate-index scatter: ``a[idx] = v`` and ``a[idx] += v`` with repeated indices are NumPy's
  (last write wins; no accumulation), where CuPy's order is undefined.
- CuPy's acceptance of NumPy inputs in some functions and in indices: indices and the right-hand
  side of ``a[...] = v`` may be NumPy arrays (CuPy copies them to the device); every other
  function rejects them, which is stricter than CuPy in a few places.
- Random streams: ``cupy.random`` draws NumPy's streams, not cuRAND's.
- ``__cuda_array_interface__`` and DLPack; numba's ``cuda.jit``.
"""
from __future__ import annotations

import collections
import contextlib
import json
import sys
import traceback
from pathlib import Path

import numpy as _np

NAMES_FILE = Path(__file__).resolve().parent.parent / "cupy14_names.json"
PINNED = json.loads(NAMES_FILE.read_text())

_CONVERSION_ERROR = ("Implicit conversion to a NumPy array is not allowed. "
                     "Please use `.get()` to construct a NumPy array explicitly.")


class DeviceSynchronized(RuntimeError):
    """Raised when a synchronisation happens inside ``cupyx.allow_synchronize(False)``."""


# ---------------------------------------------------------------- synchronisation accounting

class SyncLog:
    """Counts implicit synchronisations (by kind and by caller line) and explicit transfers."""

    def __init__(self):
        self.implicit = 0
        self.explicit = 0
        self.by_kind = collections.Counter()
        self.by_site = collections.Counter()

    def __repr__(self):
        return f"SyncLog(implicit={self.implicit}, explicit={self.explicit})"


_logs: list[SyncLog] = []
_state = {"allow_synchronize": True, "linalg": "ignore", "total_implicit": 0}


def _caller_site() -> str:
    """'path:line' of the first frame outside this stand-in (the line that caused the sync)."""
    here = str(Path(__file__).resolve().parent)
    for frame in reversed(traceback.extract_stack()[:-2]):
        if not frame.filename.startswith(here):
            return f"{frame.filename}:{frame.lineno}"
    return "?"


def _sync(kind: str, explicit: bool = False) -> None:
    if not _state["allow_synchronize"]:
        raise DeviceSynchronized(f"device synchronisation ({kind}) detected inside "
                                 "cupyx.allow_synchronize(False)")
    if not explicit:
        _state["total_implicit"] += 1
    site = _caller_site() if _logs else None
    for log in _logs:
        if explicit:
            log.explicit += 1
        else:
            log.implicit += 1
            log.by_kind[kind] += 1
            log.by_site[site] += 1


@contextlib.contextmanager
def count_syncs():
    """``with count_syncs() as log:`` counts the synchronisations of the block in ``log``."""
    log = SyncLog()
    _logs.append(log)
    try:
        yield log
    finally:
        _logs.remove(log)


def total_implicit_syncs() -> int:
    """Implicit synchronisations since import (all threads of this process)."""
    return _state["total_implicit"]


# ---------------------------------------------------------------- wrapping at the boundary

def _from_numpy(a) -> "ndarray":
    out = ndarray.__new__(ndarray)
    out._a = a
    return out


def _unwrap(x, *, accept_numpy: bool = False):
    """The NumPy array behind a stand-in array; NumPy arrays are refused as CuPy refuses them."""
    if isinstance(x, ndarray):
        return x._a
    if isinstance(x, _np.ndarray):
        if accept_numpy:
            return x
        raise TypeError(f"Unsupported type {type(x)}")
    if isinstance(x, list):
        return [_unwrap(v, accept_numpy=accept_numpy) for v in x]
    if isinstance(x, tuple) and not hasattr(x, "_fields"):
        return tuple(_unwrap(v, accept_numpy=accept_numpy) for v in x)
    return x


def _wrap(r):
    """Device arrays for every array result; NumPy scalars become 0-d device arrays."""
    if isinstance(r, _np.ndarray):
        return _from_numpy(r)
    if isinstance(r, _np.generic):
        return _from_numpy(_np.asarray(r))
    if isinstance(r, tuple):
        return tuple(_wrap(v) for v in r)  # CuPy returns plain tuples (no EighResult, ...)
    if isinstance(r, list):
        return [_wrap(v) for v in r]
    return r


def lift(fn, name: str, *, zero_d: bool = False, accept_numpy: bool = False):
    """``fn`` (a NumPy/SciPy function) as a stand-in function: unwrap, call, wrap."""
    def f(*args, **kwargs):
        args = _unwrap(args, accept_numpy=accept_numpy)
        kwargs = {k: _unwrap(v, accept_numpy=accept_numpy) for k, v in kwargs.items()}
        r = fn(*args, **kwargs)
        if zero_d and isinstance(r, (bool, int, float)):
            r = _np.asarray(r)
        return _wrap(r)
    f.__name__ = f.__qualname__ = name
    f.__doc__ = (f"Stand-in for cupy's {name}: {getattr(fn, '__module__', '')}.{name} behind the "
                 "device boundary.")
    f._standin_of = fn
    return f


def not_modelled(qualname: str):
    """A callable for a name CuPy has that the stand-in does not model."""
    def f(*args, **kwargs):
        raise NotImplementedError(f"{qualname} exists in CuPy 14 but the CuPy stand-in does not "
                                  "model it (tests/standin)")
    f.__name__ = qualname.rsplit(".", 1)[-1]
    return f


class ufunc:
    """A CuPy ufunc: call, plus reduce / accumulate / outer / at, all behind the boundary."""

    def __init__(self, np_ufunc):
        self._u = np_ufunc
        self.__name__ = np_ufunc.__name__
        self.nin, self.nout, self.nargs = np_ufunc.nin, np_ufunc.nout, np_ufunc.nargs

    def __call__(self, *args, **kwargs):
        return lift(self._u, self.__name__)(*args, **kwargs)

    def reduce(self, *args, **kwargs):
        return lift(self._u.reduce, self.__name__ + ".reduce")(*args, **kwargs)

    def accumulate(self, *args, **kwargs):
        return lift(self._u.accumulate, self.__name__ + ".accumulate")(*args, **kwargs)

    def outer(self, *args, **kwargs):
        return lift(self._u.outer, self.__name__ + ".outer")(*args, **kwargs)

    def at(self, a, indices, b=None):
        if not isinstance(a, ndarray):
            raise TypeError(f"Unsupported type {type(a)}")
        args = (_unwrap(indices, accept_numpy=True),) + (() if b is None else (_unwrap(b),))
        self._u.at(a._a, *args)

    def __repr__(self):
        return f"<ufunc '{self.__name__}' (CuPy stand-in)>"


# ---------------------------------------------------------------- the device array

def _binary(np_ufunc):
    def op(self, other):
        return _wrap(np_ufunc(self._a, _unwrap(other)))

    def rop(self, other):
        return _wrap(np_ufunc(_unwrap(other), self._a))

    def iop(self, other):
        np_ufunc(self._a, _unwrap(other), out=self._a)
        return self
    return op, rop, iop


def _component(part: str) -> property:
    """The ``real`` / ``imag`` property: a device view, assignable from a device array."""
    return property(lambda self: _from_numpy(getattr(self._a, part)),
                    lambda self, value: setattr(self._a, part, _unwrap(value)))


class ndarray:
    """``cupy.ndarray`` of the stand-in: a NumPy array that never leaves the device implicitly."""

    __slots__ = ("_a", "__weakref__")
    __hash__ = None

    def __init__(self, shape, dtype=float, memptr=None, strides=None, order="C"):
        if memptr is not None or strides is not None:
            raise NotImplementedError("cupy.ndarray(memptr=, strides=) is not modelled by the "
                                      "stand-in")
        self._a = _np.empty(shape, dtype=dtype, order=order)

    # --- the boundary
    def __array__(self, dtype=None, copy=None):
        raise TypeError(_CONVERSION_ERROR)

    def __array_ufunc__(self, np_ufunc, method, *inputs, **kwargs):
        for x in inputs + tuple(kwargs.get("out", ()) or ()):
            if isinstance(x, _np.ndarray) and not isinstance(x, ndarray):
                raise TypeError(f"Unsupported type {type(x)}")
        inputs = _unwrap(inputs)
        if "out" in kwargs:
            kwargs["out"] = tuple(_unwrap(o) for o in kwargs["out"])
        return _wrap(getattr(np_ufunc, method)(*inputs, **kwargs))

    def __array_function__(self, func, types, args, kwargs):
        import cupy  # the stand-in package
        module = {"numpy.linalg": cupy.linalg,
                  "numpy.random": cupy.random}.get(func.__module__, cupy)
        name = func.__name__
        if name not in PINNED["names"][module.__name__]:
            return NotImplemented  # NumPy then raises TypeError, as with CuPy
        return getattr(module, name)(*args, **kwargs)

    def get(self, stream=None, order="C", out=None):
        _sync("get", explicit=True)
        if out is not None:
            out[...] = self._a
            return out
        return _np.array(self._a, order=order, copy=True)

    def set(self, arr, stream=None):
        if not isinstance(arr, _np.ndarray):
            raise TypeError(f"Only numpy.ndarray can be set to cupy.ndarray, got {type(arr)}")
        if arr.shape != self._a.shape:
            raise ValueError(f"Shape mismatch. Old shape: {self._a.shape}, new shape: {arr.shape}")
        self._a[...] = arr

    # --- implicit synchronisations
    def __bool__(self):
        _sync("__bool__")
        return bool(self._a)

    def __float__(self):
        _sync("__float__")
        return float(self._a)

    def __int__(self):
        _sync("__int__")
        return int(self._a)

    def __index__(self):
        _sync("__index__")
        return self._a.__index__()

    def __complex__(self):
        _sync("__complex__")
        return complex(self._a)

    def __format__(self, spec):
        _sync("__format__")
        return format(self._a.item() if self._a.ndim == 0 else self._a, spec)

    def item(self, *args):
        _sync("item")
        return self._a.item(*args)

    def tolist(self):
        _sync("tolist")
        return self._a.tolist()

    def __repr__(self):
        return repr(self._a).replace("array(", "array(", 1)

    def __str__(self):
        return str(self._a)

    # --- container protocol
    def __len__(self):
        return len(self._a)

    def __iter__(self):
        if self._a.ndim == 0:
            raise TypeError("iteration over a 0-d array")
        return (_from_numpy(row) for row in self._a)

    def __getitem__(self, key):
        return _wrap(self._a[_unwrap(key, accept_numpy=True)])

    def __setitem__(self, key, value):
        self._a[_unwrap(key, accept_numpy=True)] = _unwrap(value, accept_numpy=True)

    def __copy__(self):
        return _from_numpy(self._a.copy())

    def __deepcopy__(self, memo):
        return _from_numpy(self._a.copy())

    def __reduce__(self):  # CuPy arrays pickle (through the host)
        return (_from_numpy, (self._a.copy(),))

    # --- attributes
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    itemsize = property(lambda self: self._a.itemsize)
    nbytes = property(lambda self: self._a.nbytes)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: self._a.flags)
    base = property(lambda self: None if self._a.base is None else _from_numpy(self._a.base))
    T = property(lambda self: _from_numpy(self._a.T))
    mT = property(lambda self: _from_numpy(self._a.mT))
    flat = property(lambda self: _from_numpy(self._a.reshape(-1)))
    device = property(lambda self: sys.modules["cupy"].cuda.Device(0))

    real = _component("real")
    imag = _component("imag")

    def fill(self, value):
        self._a.fill(_unwrap(value))

    def scatter_add(self, slices, value):
        _np.add.at(self._a, _unwrap(slices, accept_numpy=True), _unwrap(value))

    def scatter_max(self, slices, value):
        _np.maximum.at(self._a, _unwrap(slices, accept_numpy=True), _unwrap(value))

    def scatter_min(self, slices, value):
        _np.minimum.at(self._a, _unwrap(slices, accept_numpy=True), _unwrap(value))

    def __getattr__(self, name):
        # NumPy's method of the same name, for the names cupy.ndarray has (pinned list).
        if name in PINNED["names"]["cupy.ndarray"] and hasattr(_np.ndarray, name):
            return lift(getattr(self._a, name), f"ndarray.{name}")
        if name in PINNED["names"]["cupy.ndarray"]:
            return not_modelled(f"cupy.ndarray.{name}")
        raise AttributeError(f"'cupy.ndarray' object has no attribute {name!r} (CuPy 14 stand-in)")


_BINARY = {
    "add": _np.add, "sub": _np.subtract, "mul": _np.multiply, "truediv": _np.true_divide,
    "floordiv": _np.floor_divide, "mod": _np.remainder, "pow": _np.power, "matmul": _np.matmul,
    "and": _np.bitwise_and, "or": _np.bitwise_or, "xor": _np.bitwise_xor,
    "lshift": _np.left_shift, "rshift": _np.right_shift,
}
for _name, _uf in _BINARY.items():
    _op, _rop, _iop = _binary(_uf)
    setattr(ndarray, f"__{_name}__", _op)
    setattr(ndarray, f"__r{_name}__", _rop)
    setattr(ndarray, f"__i{_name}__", _iop)
for _name, _uf in {"lt": _np.less, "le": _np.less_equal, "gt": _np.greater, "ge": _np.greater_equal,
                   "eq": _np.equal, "ne": _np.not_equal}.items():
    setattr(ndarray, f"__{_name}__", _binary(_uf)[0])
ndarray.__neg__ = lambda self: _from_numpy(-self._a)
ndarray.__pos__ = lambda self: _from_numpy(+self._a)
ndarray.__abs__ = lambda self: _from_numpy(abs(self._a))
ndarray.__invert__ = lambda self: _from_numpy(~self._a)
ndarray.__module__ = "cupy"
ufunc.__module__ = "cupy"


# ---------------------------------------------------------------- cuSOLVER's silent failures

def linalg_error_mode() -> str:
    return _state["linalg"]


def _partial_cholesky(a):
    """cuSOLVER potrf on a matrix that is not positive definite, without an error: the state of
    a right-looking Cholesky at its failing pivot k (columns < k factored, the trailing block
    holding the Schur complement A22 - L21 L21^T), lower triangle. Finite garbage, as cuSOLVER's
    partly overwritten input is (its blocked algorithm leaves other, equally meaningless values)."""
    out = _np.array(a, copy=True)
    for idx in _np.ndindex(a.shape[:-2]):
        A = out[idx]
        for j in range(A.shape[0]):
            if not A[j, j] > 0:  # also NaN
                break
            A[j, j] = _np.sqrt(A[j, j])
            A[j + 1:, j] /= A[j, j]
            A[j + 1:, j + 1:] -= _np.outer(A[j + 1:, j], A[j + 1:, j])
        out[idx] = _np.tril(A)
    return out


def _checks_dev_info() -> bool:
    """CuPy reads cuSOLVER's devInfo back (a synchronisation) only under errstate(linalg="raise")
    and only where synchronisation is allowed
    (``_check_cusolver_dev_info_if_synchronization_allowed``)."""
    if _state["linalg"] == "raise" and _state["allow_synchronize"]:
        _sync("cusolver devInfo")
        return True
    return False


def cholesky(a):
    if not isinstance(a, ndarray):
        raise TypeError(f"Unsupported type {type(a)}")
    check = _checks_dev_info()
    try:
        return _from_numpy(_np.linalg.cholesky(a._a))
    except _np.linalg.LinAlgError:
        if check:
            raise _np.linalg.LinAlgError(
                "Error reported by potrf in cuSOLVER. devInfo = 1. Please refer to the cuSOLVER "
                "documentation.") from None
        return _from_numpy(_partial_cholesky(a._a))


def _silent_singular(np_fn, name):
    lifted = lift(np_fn, name)

    def f(a, *args, **kwargs):
        check = _checks_dev_info()
        try:
            return lifted(a, *args, **kwargs)
        except _np.linalg.LinAlgError:
            if check:
                raise
            if name == "inv":
                return _from_numpy(_np.full(a.shape, _np.nan, dtype=a.dtype))
            b = args[0] if args else kwargs["b"]
            return _from_numpy(_np.full(b.shape, _np.nan, dtype=_np.result_type(a.dtype, b.dtype)))
    f.__name__ = name
    return f


def eigh(a, UPLO="L"):
    """NumPy's eigh with the sign of every other eigenvector (columns 0, 2, ...) flipped.

    cuSOLVER's syevd and LAPACK's return eigenvectors of other signs (and other bases of a
    repeated eigenvalue): code whose result depends on the basis differs on a device, as the
    Laplace K-FAC sampler did on an H100 before it took the symmetric square root. Flipping half
    the columns makes such code fail here too; an all-column flip would cancel in Q_A X Q_B^T."""
    if not isinstance(a, ndarray):
        raise TypeError(f"Unsupported type {type(a)}")
    lam, Q = _np.linalg.eigh(a._a, UPLO=UPLO)
    Q = Q.copy()
    Q[..., :, ::2] *= -1
    return _from_numpy(lam), _from_numpy(Q)


class CUBLASError(RuntimeError):
    """cupy_backends.cuda.libs.cublas.CUBLASError, as the stand-in raises it."""


def solve_triangular(a, b, *args, **kwargs):
    """SciPy's solve_triangular, refusing an n = 0 system as CuPy 14.2 does: it passes n as
    cuBLAS trsm's leading dimensions, which must be >= 1 (CUBLAS_STATUS_INVALID_VALUE; seen on
    an H100), where SciPy returns the empty solution."""
    import scipy.linalg
    if isinstance(a, ndarray) and a.ndim == 2 and a.shape[0] == 0:
        raise CUBLASError("CUBLAS_STATUS_INVALID_VALUE")
    return lift(scipy.linalg.solve_triangular, "solve_triangular")(a, b, *args, **kwargs)


@contextlib.contextmanager
def errstate(*, linalg=None):
    if linalg not in (None, "ignore", "raise"):
        raise ValueError(f"linalg must be 'ignore' or 'raise', got {linalg!r}")
    old = _state["linalg"]
    if linalg is not None:
        _state["linalg"] = linalg
    try:
        yield
    finally:
        _state["linalg"] = old


def seterr(*, linalg=None):
    old = {"linalg": _state["linalg"]}
    if linalg is not None:
        if linalg not in ("ignore", "raise"):
            raise ValueError(f"linalg must be 'ignore' or 'raise', got {linalg!r}")
        _state["linalg"] = linalg
    return old


def geterr():
    return {"linalg": _state["linalg"]}


@contextlib.contextmanager
def allow_synchronize(allow: bool):
    old = _state["allow_synchronize"]
    _state["allow_synchronize"] = bool(allow)
    try:
        yield
    finally:
        _state["allow_synchronize"] = old
