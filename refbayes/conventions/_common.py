"""Argument checks shared by the conversions of :mod:`refbayes.conventions`.

Private to the package: each function validates one public hyperparameter (or config field) and
raises ``ValueError`` naming it, what was expected and what was given.
"""
from __future__ import annotations

import math
import numbers

from refbayes._checks import check_array, check_float, check_in_range, check_int, check_positive

INF = math.inf


def _pos(x, name: str) -> float:
    """A finite real > 0."""
    return check_in_range(x, name, 0.0, INF, low_open=True, high_open=True)


def _nonneg(x, name: str) -> float:
    """A finite real >= 0."""
    return check_in_range(x, name, 0.0, INF, high_open=True)


def _count(n, name: str) -> int:
    """An integer >= 1; an integer-valued float (torchsso types dataset_size as float) too."""
    if isinstance(n, float) and math.isfinite(n) and n.is_integer():
        n = int(n)
    return check_int(n, name, low=1)


def _fixed(value, name: str, allowed, why: str):
    """Refuse a public hyperparameter that refbayes cannot represent unless it is a no-op."""
    def same(a):
        if value is a or (type(value) is type(a) and value == a):
            return True
        return (isinstance(a, float) and isinstance(value, numbers.Real)
                and not isinstance(value, bool) and float(value) == a)
    ok = any(same(a) for a in allowed)
    if not ok:
        want = " or ".join(repr(a) for a in allowed)
        raise ValueError(f"{name}: expected {want} ({why}), got {value!r}")
    return value


def _config(cfg, cls, name: str = "cfg"):
    if not isinstance(cfg, cls):
        raise ValueError(f"{name}: expected a {cls.__name__}, got {type(cfg).__name__}")
    return cfg


def _scalar_prec(x, name: str, what: str) -> float:
    """A scalar precision > 0; an array is refused (the public code takes one number)."""
    if hasattr(x, "shape"):
        raise ValueError(f"{name}: expected a scalar > 0 ({what} takes one number), "
                         f"got an array of shape {tuple(x.shape)}")
    return _pos(x, name)


def _prec_or_array(x, name: str):
    """A scalar > 0 or a finite float 1-d array > 0 (returned as given)."""
    if hasattr(x, "shape"):
        check_array(x, name, ndim=1)
        check_float(x, name)
        check_positive(x, name)
        return x
    return _pos(x, name)


def _betas(betas, name: str = "betas") -> tuple[float, float]:
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"{name}: expected a pair (beta1, beta2), got {betas!r}")
    b1 = check_in_range(betas[0], f"{name}[0]", 0.0, 1.0, high_open=True)
    b2 = check_in_range(betas[1], f"{name}[1]", 0.0, 1.0, high_open=True)
    return b1, b2


def _s_like(x, name: str):
    if hasattr(x, "shape"):
        check_array(x, name, ndim=1)
        check_float(x, name)
        return x
    return check_in_range(x, name, -INF, INF, low_open=True, high_open=True)

