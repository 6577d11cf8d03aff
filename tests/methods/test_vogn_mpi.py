"""Data-parallel VOGN under a real mpiexec (2 ranks, and 3 with unequal shards): the parameters
after K steps equal the one-process driver.run's to rounding."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from refbayes.datasets import make_logistic_regression
from refbayes.methods import driver, vogn, vogn_mpi
from refbayes.models import MLP
from tests.tolerances import EXACT_F64, assert_close

ROOT = Path(__file__).resolve().parents[2]
SEED, EPOCHS, N = 5, 3, 60


def problem():
    """A small MLP classifier, a drawn start with s > 0 and m != 0 after the first step."""
    X, y, _ = make_logistic_regression(N, 4, 0)
    model = MLP([4, 6, 2], activation="tanh", likelihood="categorical")
    rng = np.random.default_rng(0)
    mu = 0.3 * rng.standard_normal(model.D)
    state = vogn.init(mu, rng.uniform(0.5, 1.5, model.D))
    cfg = vogn.VOGNConfig(N, delta=1.0, alpha=0.05, beta1=0.9, gamma=1e-3)
    return model, X, y, state, cfg


def _mpiexec():
    pytest.importorskip("mpi4py")
    found = Path(sys.executable).parent / "mpiexec"
    path = str(found) if found.exists() else shutil.which("mpiexec")
    if path is None:
        pytest.skip("no mpiexec (install the extra: pip install \"refbayes[mpi]\")")
    return path


@pytest.mark.parametrize("ranks, M, S", [(2, 8, 2), (3, 8, 2), (3, 10, 0)],
                         ids=["2-ranks", "3-ranks-unequal-shards", "3-ranks-ogn"])
def test_mpi_run_equals_the_one_process_run(tmp_path, ranks, M, S):
    mpiexec = _mpiexec()
    out = tmp_path / "final.npz"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    cmd = [mpiexec, "-n", str(ranks), sys.executable, str(ROOT / "tests/methods/mpi_vogn_script.py"),
           str(out), str(S), str(M)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = np.load(out)
    assert int(got["size"]) == ranks and bool(got["same"])
    assert M % ranks != 0 or ranks == 2  # the 3-rank cases have unequal shards
    model, X, y, state, cfg = problem()
    ref = driver.run(state, cfg, model, X, y, rng=np.random.default_rng(SEED), epochs=EPOCHS,
                     M=M, S=S)
    assert int(got["t"]) == ref.t == EPOCHS * -(-N // M)
    for field in ("mu", "s", "m"):
        assert_close(got[field], getattr(ref, field), EXACT_F64, field)


def test_shard_splits_rows_and_refuses_too_few():
    idx = np.arange(8)
    parts = [vogn_mpi.shard(idx, r, 3) for r in range(3)]
    assert [len(p) for p in parts] == [3, 3, 2]
    np.testing.assert_array_equal(np.concatenate(parts), idx)
    with pytest.raises(ValueError, match="M: expected at least one row per rank .3., got a "
                                         "minibatch of 2"):
        vogn_mpi.shard(idx[:2], 0, 3)
    with pytest.raises(ValueError, match="rank"):
        vogn_mpi.shard(idx, 3, 3)


def test_one_rank_in_process_equals_the_driver():
    """Without mpiexec, COMM_WORLD has one rank: the same trajectory as driver.run."""
    pytest.importorskip("mpi4py")
    model, X, y, state, cfg = problem()
    got = vogn_mpi.run(state, cfg, model, X, y, rng=np.random.default_rng(SEED), epochs=2, M=8,
                       S=1)
    ref = driver.run(state, cfg, model, X, y, rng=np.random.default_rng(SEED), epochs=2, M=8,
                     S=1)
    for field in ("mu", "s", "m"):
        assert_close(getattr(got, field), getattr(ref, field), EXACT_F64, field)
