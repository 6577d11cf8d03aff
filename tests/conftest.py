"""Shared fixtures: hypothesis profiles, the backend parametrization, the data directory.

With ``REFBAYES_CUPY_STANDIN=1`` the CuPy stand-in of ``tests/standin`` is imported as ``cupy``
(before anything else can import a real CuPy), so the gpu-marked tests run on the CPU; see
``tests/standin/cupy/_standin.py`` for what it models.
"""
import os
import sys
from pathlib import Path

STANDIN = os.environ.get("REFBAYES_CUPY_STANDIN", "") == "1"
if STANDIN:
    sys.path.insert(0, str(Path(__file__).resolve().parent / "standin"))
    import cupy
    if not hasattr(cupy, "_standin"):
        raise RuntimeError(f"REFBAYES_CUPY_STANDIN=1 but 'cupy' resolved to {cupy.__file__}, "
                           "not the stand-in")

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

from refbayes.backend import cupy_available

settings.register_profile("ci", derandomize=True, database=None, deadline=None, max_examples=40,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None, max_examples=60,
                          suppress_health_check=[HealthCheck.too_slow])
# The gpu run (stand-in in CI, a real device in tools/device_check.py): fewer examples, same rules.
settings.register_profile("gpu", derandomize=True, database=None, deadline=None, max_examples=8,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("REFBAYES_HYPOTHESIS_PROFILE")
                      or ("ci" if os.environ.get("CI", "").lower() == "true" else "dev"))

_BACKENDS = [
    "numpy",
    pytest.param("cupy", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not cupy_available(), reason="CuPy with a CUDA device is not available")]),
]


@pytest.fixture(params=_BACKENDS)
def xp(request):
    """The array namespace under test: NumPy always, CuPy where a GPU is present."""
    if request.param == "numpy":
        return np
    import cupy
    return cupy


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The staged benchmark data (``REFBAYES_DATA``); data tests skip with a reason without it."""
    root = os.environ.get("REFBAYES_DATA")
    if not root:
        pytest.skip("REFBAYES_DATA is not set: point it at the staged data folder (CI uses ../shared/data)")
    path = Path(root)
    if not path.is_dir():
        pytest.fail(f"REFBAYES_DATA={root!r} is set but is not a directory")
    return path


@pytest.fixture
def no_data_env(monkeypatch, tmp_path) -> Path:
    """No REFBAYES_DATA and a private user cache under tmp_path, so path resolution is isolated."""
    monkeypatch.delenv("REFBAYES_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path


@pytest.fixture(scope="session")
def staged_data_dir(data_dir) -> Path:
    """``data_dir`` when it is the staged copy (with its SHA256SUMS): the tests that compare
    files byte for byte need it; a folder filled by `refbayes data fetch` may hold other bytes
    with the same content (e.g. '1' for '+1' in LIBSVM text) and skips them."""
    if not (data_dir / "SHA256SUMS").is_file():
        pytest.skip(f"{data_dir} has no SHA256SUMS: not the staged copy, byte-level checks skipped")
    return data_dir
