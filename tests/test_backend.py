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


def test_every_cholesky_reachable_with_cupy_goes_through_backend_cholesky():
    """``xp.linalg.cholesky`` on CuPy returns a partial factor silently (no LinAlgError outside
    ``cupyx.errstate(linalg="raise")``); ``backend.cholesky`` raises on both backends."""
    import re
    from pathlib import Path
    root = Path(__file__).resolve().parents[1] / "refbayes"
    calls = [f"{p.relative_to(root.parent)}:{i}"
             for p in sorted(root.rglob("*.py")) if p.name != "backend.py"
             for i, line in enumerate(p.read_text().splitlines(), 1)
             if re.search(r"\bxp\.linalg\.cholesky\(", line)]
    assert calls == [], f"use refbayes.backend.cholesky at {calls}"


def test_cholesky_raises_and_cho_solve_solves_on_each_backend(xp):
    from refbayes.backend import cho_solve, cholesky
    from tests.tolerances import EXACT_F64, assert_close
    A = np.random.default_rng(0).standard_normal((5, 5))
    P = A @ A.T + 5 * np.eye(5)
    B = np.random.default_rng(1).standard_normal((5, 2))
    L = cholesky(xp.asarray(P))
    assert xp_of(L) is xp
    assert_close(to_numpy(L), np.linalg.cholesky(P), EXACT_F64, "cholesky")
    assert_close(to_numpy(cho_solve(L, xp.asarray(B))), np.linalg.solve(P, B), EXACT_F64,
                 "cho_solve")
    indefinite = xp.asarray(np.diag([1.0, -1.0, 2.0]))
    with pytest.raises(np.linalg.LinAlgError):
        cholesky(indefinite)
    if xp is not np:  # what backend.cholesky guards against: CuPy's own call does not raise
        assert xp_of(xp.linalg.cholesky(indefinite)) is xp


def test_gpu_extras_name_one_cupy_per_cuda_major_and_gpu_is_cuda12():
    """A CUDA 13 image ships cupy-cuda13x: an extra that always installed cupy-cuda12x added a
    second, conflicting CuPy there."""
    import tomllib
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert [r.split(">")[0] for r in extras["gpu-cuda12"]] == ["cupy-cuda12x"]
    assert [r.split(">")[0] for r in extras["gpu-cuda13"]] == ["cupy-cuda13x"]
    assert extras["gpu"] == ["refbayes[gpu-cuda12]"]
    gpu_page = (root / "docs" / "gpu.md").read_text()  # the README's GPU section moved there
    assert '".[gpu-cuda13]"' in gpu_page and '".[gpu-cuda12]"' in gpu_page
    assert "nvidia-smi" in gpu_page
