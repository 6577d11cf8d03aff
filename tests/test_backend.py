import sys

import numpy as np
import pytest
import scipy.linalg

from refbayes.backend import get_xp, linalg_of, to_numpy, xp_of


def test_xp_of_numpy_and_scalars():
    assert xp_of(np.ones(3), 2.0, None) is np
    assert xp_of() is np


def test_linalg_of_numpy_is_scipy():
    assert linalg_of(np) is scipy.linalg


def test_to_numpy_returns_ndarray():
    out = to_numpy([1.0, 2.0])
    assert isinstance(out, np.ndarray) and out.tolist() == [1.0, 2.0]


def test_get_xp_rejects_unknown_backend():
    with pytest.raises(ValueError, match="backend: expected 'numpy' or 'cupy'"):
        get_xp("torch")


def test_importing_refbayes_does_not_import_cupy():
    import subprocess
    code = ("import sys, refbayes, refbayes.backend, refbayes.linalg, refbayes.models; "
            "print('cupy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.gpu
def test_xp_of_cupy_and_mix(xp):
    if xp is np:
        pytest.skip("CuPy-only check")
    a = xp.ones(3)
    assert xp_of(a) is xp
    with pytest.raises(ValueError, match="all on one backend"):
        xp_of(a, np.ones(3))
    assert isinstance(to_numpy(a), np.ndarray)
