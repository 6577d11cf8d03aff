"""The CuPy stand-in itself (tests/standin): it must fail where CuPy 14 fails, or it proves nothing.

Runs only in the stand-in pass (``REFBAYES_CUPY_STANDIN=1``; CI's second pytest invocation).
"""
import importlib
import json
from pathlib import Path

import numpy as np
import pytest
import scipy.linalg

from tests.conftest import STANDIN

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not STANDIN, reason="the CuPy stand-in is not active "
                                 "(REFBAYES_CUPY_STANDIN=1)")]

PINNED = json.loads((Path(__file__).parent / "standin" / "cupy14_names.json").read_text())


@pytest.fixture
def cp():
    import cupy
    return cupy


@pytest.mark.parametrize("module", sorted(set(PINNED["names"]) - {"cupy.ndarray"}))
def test_public_names_are_exactly_cupy_14s(module):
    mod = importlib.import_module(module)
    public = {n for n in vars(mod) if not n.startswith("_")} - {"annotations"}
    assert public == set(PINNED["names"][module])


def test_the_pinned_list_says_where_it_was_read():
    assert PINNED["cupy_version"] == "14.2.0" and "cupy-cuda13x" in PINNED["read_from"]
    # the names whose absence mattered: cupyx.scipy.linalg has no Cholesky solves
    for name in ("cho_solve", "cho_factor", "cholesky", "eigh", "solve", "inv"):
        assert name not in PINNED["names"]["cupyx.scipy.linalg"]


def test_a_name_cupy_lacks_is_an_attribute_error(cp):
    import cupyx.scipy.linalg
    with pytest.raises(AttributeError):
        cupyx.scipy.linalg.cho_solve  # noqa: B018
    with pytest.raises(AttributeError):
        cp.float128  # noqa: B018
    with pytest.raises(AttributeError):
        cp.asarray(np.ones(2)).tobytes_typo  # noqa: B018


def test_implicit_conversion_to_numpy_raises_as_cupys_does(cp):
    a = cp.asarray(np.arange(4.0))
    def to_scipy(x):
        return scipy.linalg.solve_triangular(x.reshape(2, 2), x[:2])
    for convert in (np.asarray, np.array, to_scipy):
        with pytest.raises(TypeError, match="Implicit conversion to a NumPy array is not allowed"):
            convert(a)
    for mixed in (lambda: a + np.ones(4), lambda: np.ones(4) * a, lambda: cp.exp(np.ones(4)),
                  lambda: cp.concatenate([a, np.ones(4)])):
        with pytest.raises(TypeError, match="Unsupported type"):
            mixed()
    assert isinstance(a.get(), np.ndarray) and isinstance(cp.asnumpy(a), np.ndarray)
    assert np.array_equal(a.get(), np.arange(4.0))
    assert cp.asarray(a) is a


def test_numba_kernels_refuse_device_arrays(cp):
    import numba
    from numba.core.errors import TypingError

    @numba.njit
    def total(a):
        return a.sum()
    with pytest.raises(TypingError, match="non-precise type pyobject"):
        total(cp.asarray(np.ones(3)))


def test_numpy_functions_dispatch_to_the_device_or_refuse(cp):
    a = cp.asarray(np.arange(4.0))
    assert isinstance(np.exp(a), cp.ndarray)       # __array_ufunc__
    assert isinstance(np.sum(a), cp.ndarray)       # __array_function__, cupy.sum
    with pytest.raises(TypeError):
        np.busday_count(a, a)                      # no cupy counterpart


def test_reductions_give_0d_device_arrays(cp):
    a = cp.asarray(np.arange(6.0).reshape(2, 3))
    for r in (a.sum(), cp.max(a), cp.linalg.norm(a), cp.allclose(a, a), cp.count_nonzero(a)):
        assert isinstance(r, cp.ndarray) and r.ndim == 0


def test_every_implicit_synchronisation_is_counted_with_its_line(cp):
    import cupyx
    a = cp.asarray(np.arange(3.0))
    with cp._standin.count_syncs() as log:
        bool(a.sum() > 0)
        float(a[0])
        int(a[1])
        a.sum().item()
        a.tolist()
        f"{a.max():.1f}"
        a.get()
    assert log.implicit == 6 and log.explicit == 1
    assert set(log.by_kind) == {"__bool__", "__float__", "__int__", "item", "tolist", "__format__"}
    assert all(site.startswith(__file__) for site in log.by_site)
    with cupyx.allow_synchronize(False):
        with pytest.raises(cupyx.DeviceSynchronized):
            float(a[0])


def test_cholesky_fails_silently_unless_errstate_raise(cp):
    import cupyx
    indefinite = cp.asarray(np.array([[4.0, 2.0], [2.0, -1.0]]))
    L = cp.linalg.cholesky(indefinite)               # no error, as cuSOLVER without the check
    assert isinstance(L, cp.ndarray) and bool(cp.all(cp.isfinite(L)))
    assert float(L[0, 0]) == 2.0                     # the leading factor is right, the rest not
    with cupyx.errstate(linalg="raise"):
        with pytest.raises(np.linalg.LinAlgError):
            cp.linalg.cholesky(indefinite)
    singular = cp.asarray(np.zeros((2, 2)))
    assert bool(cp.all(cp.isnan(cp.linalg.inv(singular))))
    with cupyx.errstate(linalg="raise"):
        with pytest.raises(np.linalg.LinAlgError):
            cp.linalg.inv(singular)
