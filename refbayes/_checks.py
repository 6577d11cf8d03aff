"""Input validation shared by every public function.

Each check raises ``ValueError`` that names the argument, what was expected and what was given;
nothing is broadcast, clipped or cast silently.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import numbers
import warnings

import numpy as np

from refbayes.backend import cholesky, xp_of

__all__ = ["check_array", "check_float", "check_finite", "check_positive", "check_positive_vector",
           "check_int", "check_in_range", "check_same_dtype", "unchecked", "value_checks"]

# Whether the checks scan array VALUES (finite, positive, symmetric: O(size) each); the O(1)
# checks (types, shapes, dtypes, scalars) run always. A ContextVar, so a thread or task that
# turns the scans off does not turn them off for another.
_VALUE_CHECKS = contextvars.ContextVar("refbayes_value_checks", default=True)


def value_checks() -> bool:
    """Whether the checks scan array values here (False inside ``unchecked``)."""
    return _VALUE_CHECKS.get()


@contextlib.contextmanager
def unchecked():
    """Skip the value scans of every input check inside the block: the public switch.

    Every public function checks its inputs; a scan over an array's values (finite, > 0,
    symmetric, the low-rank factors' bounds) costs O(size) per array per call, which a driver
    taking thousands of steps on arrays it produced itself pays for nothing. The drivers
    (``refbayes.methods.driver.run``, ``vogn_mpi.run``) take their first step checked and the
    rest inside this block; the structural checks (types, shapes, dtypes, scalar ranges) still
    run, and the results are the same bit for bit (tested). A caller's own loop may do the same
    after validating its inputs once::

        with refbayes.unchecked():
            for batch, eps in ...:
                state, info = slang.step(state, batch, eps, cfg, model)
    """
    token = _VALUE_CHECKS.set(False)
    try:
        yield
    finally:
        _VALUE_CHECKS.reset(token)


def _as_float(x) -> float:
    """float(x) for a real scalar; an int too large for a float becomes +-inf."""
    try:
        return float(x)
    except OverflowError:
        return math.inf if x > 0 else -math.inf


def check_array(a, name: str, *, ndim=None, shape=None, finite: bool = True):
    """Validate an array's rank, exact shape (None entries are free) and finiteness; return it.

    ``ndim`` may be an int or a tuple of allowed ranks.
    """
    if not hasattr(a, "shape") or not hasattr(a, "dtype"):
        raise ValueError(f"{name}: expected an array, got {type(a).__name__}")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if a.ndim not in allowed:
            raise ValueError(f"{name}: expected {' or '.join(map(str, allowed))} dimensions, "
                             f"got shape {tuple(a.shape)}")
    if shape is not None:
        if len(shape) != a.ndim or any(s is not None and s != t for s, t in zip(shape, a.shape)):
            want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
            raise ValueError(f"{name}: expected shape {want}, got {tuple(a.shape)}")
    if a.dtype.kind not in "fiub":
        raise ValueError(f"{name}: expected a real numeric array, got dtype {a.dtype}")
    if finite:
        check_finite(a, name)
    return a


def check_float(a, name: str):
    """A float64 or float32 array (the two dtypes refbayes computes in); return it."""
    if a.dtype not in ("float64", "float32"):
        raise ValueError(f"{name}: expected a floating dtype (float64 or float32), got {a.dtype}")
    return a


def check_finite(a, name: str):
    if not _VALUE_CHECKS.get():
        return a
    xp = xp_of(a)
    if a.dtype.kind == "f" and not bool(xp.all(xp.isfinite(a))):
        raise ValueError(f"{name}: expected finite values, got NaN or inf")
    return a


def check_binary(a, name: str, expected: str = "binary values in {0, 1}"):
    """Every entry 0 or 1 (labels, dropout masks); the message reads "{name}: expected
    {expected}, got other values". A value scan: skipped inside ``unchecked``. Return a."""
    if _VALUE_CHECKS.get():
        xp = xp_of(a)
        if not bool(xp.all((a == 0) | (a == 1))):
            raise ValueError(f"{name}: expected {expected}, got other values")
    return a


def check_positive(a, name: str, *, strict: bool = True, finite: bool = True):
    """Every entry > 0 (or >= 0 when ``strict`` is False); scalars or arrays; return it.

    NaN never passes (a comparison with NaN is False, so ``not a > 0`` is tested, not ``a <= 0``);
    +-inf does not pass either unless ``finite`` is False.
    """
    what = "> 0" if strict else ">= 0"
    if hasattr(a, "shape"):
        if not _VALUE_CHECKS.get():
            return a
        xp = xp_of(a)
        if a.size == 0:
            return a
        if a.dtype.kind == "f" and bool(xp.any(xp.isnan(a))):
            raise ValueError(f"{name}: expected {what} everywhere, got NaN")
        low, high = float(a.min()), float(a.max())
    else:
        if isinstance(a, bool) or not isinstance(a, numbers.Real):
            raise ValueError(f"{name}: expected a real number or an array, got {a!r}")
        low = high = _as_float(a)
        if math.isnan(low):
            raise ValueError(f"{name}: expected {what} everywhere, got NaN")
    if finite and not (math.isfinite(low) and math.isfinite(high)):
        raise ValueError(f"{name}: expected finite values {what}, got "
                         f"{'min ' + repr(low) if not math.isfinite(low) else 'max ' + repr(high)}")
    if not (low > 0 if strict else low >= 0):
        raise ValueError(f"{name}: expected {what} everywhere, got min {low}")
    return a


def check_invertible_positive(a, name: str):
    """A floating array with every entry > 0, finite, and at least the smallest normal number of
    its dtype (``finfo(dtype).tiny``), so that 1 / a is finite (the reciprocal of a subnormal
    overflows; that of tiny, ~4.5e307 in float64, does not); return it."""
    check_positive(a, name)
    if a.size == 0 or not _VALUE_CHECKS.get():
        return a
    tiny = float(xp_of(a).finfo(a.dtype).tiny)
    low = float(a.min())
    if low < tiny:
        raise ValueError(f"{name}: expected entries >= {tiny:.4g} (the smallest normal "
                         f"{a.dtype}) so that 1/{name.rsplit('.', 1)[-1]} is finite, got min {low:.4g}")
    return a


def int_range(low=None, high=None) -> str:
    """The interval [low, high] as a message prints it; an unbounded end (None) is -inf or inf
    and open: [1, inf), (-inf, 5], [1, 6]."""
    return (("(-inf" if low is None else f"[{low}") + ", "
            + ("inf)" if high is None else f"{high}]"))


def check_int(n, name: str, *, low=None, high=None) -> int:
    """An integer in [low, high] (None: unbounded; the message prints [low, inf))."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise ValueError(f"{name}: expected an integer, got {n!r}")
    if (low is not None and n < low) or (high is not None and n > high):
        raise ValueError(f"{name}: expected an integer in {int_range(low, high)}, got {n}")
    return int(n)


def check_in_range(x, name: str, low, high, *, low_open=False, high_open=False) -> float:
    """A real scalar in the interval given; the brackets say which ends are open.

    NaN is always rejected. +-inf passes only where the interval explicitly contains it: a
    closed bracket at an infinite bound (``high=math.inf`` with ``high_open=False``); with
    ``high_open=True`` (or any finite bound) it is rejected like every other value outside.
    """
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise ValueError(f"{name}: expected a real number, got {x!r}")
    xf = _as_float(x)
    lb, hb = "(" if low_open else "[", ")" if high_open else "]"
    interval = f"{lb}{low}, {high}{hb}"
    too_low = xf <= low if low_open else xf < low
    too_high = xf >= high if high_open else xf > high
    if math.isnan(xf) or (math.isinf(xf) and (too_low or too_high)):
        raise ValueError(f"{name}: expected a finite real number in {interval}, got {x}")
    if too_low or too_high:
        raise ValueError(f"{name}: expected a value in {interval}, got {x}")
    return xf


def check_positive_vector(a, name: str, n: int, dtype, what: str):
    """A finite (n,) array > 0 of ``dtype``, one entry per ``what``; return it."""
    check_positive(check_array(a, name, ndim=1), name)
    if a.shape[0] != n or a.dtype != dtype:
        raise ValueError(f"{name}: expected a ({n},) array of dtype {dtype} (one per {what}), "
                         f"got shape {tuple(a.shape)}, dtype {a.dtype}")
    return a


def check_same_dtype(name_to_array: dict):
    """All arrays share one floating dtype (no silent float32/float64 promotion)."""
    dtypes = {k: v.dtype for k, v in name_to_array.items() if v is not None}
    if len(set(dtypes.values())) > 1:
        listing = ", ".join(f"{k}: {v}" for k, v in dtypes.items())
        raise ValueError(f"{', '.join(dtypes)}: expected one dtype for all, got {listing}")


def check_symmetric(M, name: str):
    """M is a finite, square, floating matrix, symmetric to 100 units of roundoff of max|M|:
    max|M - M^T| <= 100 eps max|M| (the rule of ``check_spd``); return it."""
    xp = xp_of(M)
    check_array(M, name, ndim=2)
    if M.shape[0] != M.shape[1]:
        raise ValueError(f"{name}: expected a square matrix, got shape {tuple(M.shape)}")
    if M.dtype.kind != "f":
        raise ValueError(f"{name}: expected a floating dtype (float64 or float32), got {M.dtype}")
    if M.shape[0] == 0 or not _VALUE_CHECKS.get():
        return M
    asym = float(xp.max(xp.abs(M - M.T)))
    bound = 100 * float(xp.finfo(M.dtype).eps) * float(xp.max(xp.abs(M)))
    if asym > bound:
        raise ValueError(f"{name}: expected a symmetric matrix, got max|M - M^T| = {asym:.3e} "
                         f"> {bound:.3e}")
    return M


def check_spd(M, name: str, *, symmetric_checked: bool = False):
    """M is a square floating matrix, symmetric to rounding, with a Cholesky factor; return it.

    Returns the lower factor L (L L^T = M).  Symmetry is required to 100 units of roundoff of
    max|M| because a Cholesky routine reads only one triangle and would otherwise factor a
    different matrix silently.  A failed factorization means M is not positive definite to
    working precision: NumPy raises LinAlgError; CuPy only does so under
    ``cupyx.errstate(linalg="raise")`` (by default it returns a partial factor), hence that
    context and the check of a finite, positive diagonal.  ``symmetric_checked=True`` skips the
    symmetry check for a caller that has made it already (a checked factor plus a multiple of I).
    """
    xp = xp_of(M)
    if not symmetric_checked:
        check_symmetric(M, name)
    if M.shape[0] == 0:
        return M
    try:
        L = cholesky(M)
    except np.linalg.LinAlgError:
        L = None
    # one read-back for both (a synchronisation on CuPy, beside the factor's own status)
    if L is None or not bool(xp.all(xp.isfinite(L)) & xp.all(xp.diagonal(L) > 0)):
        raise ValueError(f"{name}: expected a symmetric positive definite matrix, got one whose "
                         "Cholesky factorization fails")
    return L


__all__ += ["check_spd", "check_symmetric", "check_invertible_positive", "check_binary",
            "int_range"]


def check_at_construction(cls, check) -> None:
    """Make ``cls(...)`` of the NamedTuple config ``cls`` run ``check(cfg)`` on the new instance.

    typing.NamedTuple forbids a ``__new__`` in the class body and a validating subclass would
    move the field comments (``field_tags`` reads them off the class source) away from the class
    the methods name, so the check is attached after the class, as one line beside the module's
    config check: ``check_at_construction(SWAGConfig, _check_config)``. The class itself is
    unchanged (same source, docstring, fields, ``isinstance``); the call and unpickling (which
    calls ``cls.__new__``) run the check and raise its ValueError. ``_make`` and ``_replace``
    build the tuple directly and are NOT re-validated, which is why the consumers keep checking
    every cfg they are given.
    """
    new = cls.__new__

    @functools.wraps(new)
    def __new__(_cls, *args, **kwargs):
        self = new(_cls, *args, **kwargs)
        check(self)
        return self

    cls.__new__ = staticmethod(__new__)


__all__ += ["check_at_construction"]

def rename_at_construction(cls, old: str, new: str, why: str) -> None:
    """Keep the NamedTuple config field ``new``'s former name ``old`` for one release.

    ``cls(..., old=value)`` builds ``cls(..., new=value)`` and a read of ``cfg.old`` returns
    ``cfg.new``, each with a DeprecationWarning that says ``why``; giving both names is a
    ValueError. ``_replace`` and ``_make`` know only the new name. Call it after
    ``check_at_construction`` so that the check sees the renamed call.
    """
    if new not in cls._fields or old in cls._fields:
        raise ValueError(f"rename_at_construction: {cls.__name__} has no field {new!r} or still "
                         f"has {old!r}")
    message = (f"{cls.__name__}.{old} is renamed {cls.__name__}.{new} (the value means the "
               f"same); {why} The old name goes in the next release.")
    made = cls.__new__

    @functools.wraps(made)
    def __new__(_cls, *args, **kwargs):
        if old in kwargs:
            if new in kwargs:
                raise ValueError(f"{cls.__name__}: give {new}= only ({old}= is its former name), "
                                 "not both")
            warnings.warn(message, DeprecationWarning, stacklevel=2)
            kwargs[new] = kwargs.pop(old)
        return made(_cls, *args, **kwargs)

    def read(self):
        warnings.warn(message, DeprecationWarning, stacklevel=2)
        return getattr(self, new)

    cls.__new__ = staticmethod(__new__)
    setattr(cls, old, property(read, doc=f"Deprecated: {cls.__name__}.{new}."))


__all__ += ["rename_at_construction"]

def renamed_keyword(value, old_value, new: str, old: str, where: str):
    """The argument ``new`` of ``where``, taking its former name ``old`` for one release.

    Returns ``value``, or ``old_value`` (with a DeprecationWarning) when only the old name was
    given; giving both is a ValueError naming both.
    """
    if old_value is None:
        return value
    if value is not None:
        raise ValueError(f"{where}: give {new}= only ({old}= is its former name), not both")
    warnings.warn(f"{where}({old}=) is renamed {new}= (the value means the same); the old name "
                  "goes in the next release.", DeprecationWarning, stacklevel=3)
    return old_value


__all__ += ["renamed_keyword"]
