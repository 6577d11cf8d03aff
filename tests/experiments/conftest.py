"""Fixtures of the experiment tests: a real Dask cluster for the --dask-scheduler tests."""
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def cluster():
    """A distributed.LocalCluster of two single-threaded worker processes (skipped without the
    ``dask`` extra); the workers can import the tests package."""
    distributed = pytest.importorskip("distributed")
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), old]))  # workers import tests
    try:
        with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                      dashboard_address=None, host="127.0.0.1") as c:
            yield c
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


@pytest.fixture(scope="module")
def cifar_dir(data_dir):
    """The data folder, skipping the test when it holds no cifar10/."""
    if not (data_dir / "cifar10").is_dir():
        pytest.skip(f"no cifar10 under {data_dir}")
    return data_dir
