"""tools/noisy_kfac_epoch1_ablation.py: its torchsso variant is the runner's noisy-kfac row step
for step, the variants differ, its CSV is written as documented, and bad input is refused."""
from __future__ import annotations

import csv

import numpy as np
import pytest

from refbayes.experiments import cifar10_lenet as c10
from refbayes.experiments._runner import job_rng
from refbayes.methods import driver
from refbayes.methods._estimates import Batch
from tests.tools import load_tool

tool = load_tool("noisy_kfac_epoch1_ablation.py")


def _row_norms(data, steps):
    """||mu||_2 after each step of the runner's own noisy-kfac method (NOISY_KFAC_TORCHSSO),
    with the runner's streams."""
    net, row = c10.lenet5(), c10.ROWS["noisy-kfac"]
    N = data.X.shape[0]
    theta0 = net.init_theta(job_rng(0, 0), dtype=np.dtype("float32"), scheme="pytorch")
    m = c10.make_method("noisy-kfac", net, theta0, N, init_rng=job_rng(0, row.rid, 3))
    rng = job_rng(0, row.rid, 0)
    batches = driver.epoch_batches(job_rng(0, row.rid, 1, 0), N, m.M)
    state, out = m.state, []
    for j in range(steps):
        state, _ = m.step(state, Batch(data.X[batches[j]], data.y[batches[j]]), rng, j, 0)
        out.append(float(np.linalg.norm(state.mu.astype(np.float64))))
    return out


@pytest.mark.slow
def test_the_torchsso_variant_is_the_runners_row_and_the_csv_is_written(cifar_dir, tmp_path):
    data = c10._load(cifar_dir, "float32", False, 256, 1)
    rows = list(tool.run_variant((0.1, "full", "before"), data, 0, 3, 1))
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["mu_norm"] for r in rows] == _row_norms(data, 3)
    other = list(tool.run_variant((0.0, "intrinsic", "after"), data, 0, 3, 1))
    assert abs(other[-1]["mu_norm"] - rows[-1]["mu_norm"]) > 1e-3 * rows[-1]["mu_norm"]
    out = tmp_path / "a.csv"
    assert tool.main(["--out", str(out), "--variants", "0.1,full,before;0,full,after",
                      "--steps", "4", "--every", "2", "--n-train", "256",
                      "--data-dir", str(cifar_dir)]) == 0
    with open(out) as f:
        got = list(csv.DictReader(f))
    assert list(got[0]) == list(tool.COLUMNS)
    assert [(r["weight_decay"], r["refresh_order"], r["step"]) for r in got] == [
        ("0.1", "before", "2"), ("0.1", "before", "4"), ("0.0", "after", "2"), ("0.0", "after", "4")]
    assert all(0.0 <= float(r["running_acc"]) <= 1.0 and r["failed"] == "" for r in got)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="--variants"):
        tool.parse_variants("0.1,full")
    with pytest.raises(ValueError, match="noisy_kfac_options"):
        c10.make_method("adam", c10.lenet5(), np.zeros(c10.lenet5().D, np.float32), 10,
                        noisy_kfac_options={"weight_decay": 0.1})
    with pytest.raises(ValueError, match="noisy_kfac_options"):
        c10.make_method("noisy-kfac", c10.lenet5(), np.zeros(c10.lenet5().D, np.float32), 10,
                        noisy_kfac_options={"lr": 0.1})
    with pytest.raises(ValueError, match="--steps"):
        tool.main(["--out", "x.csv", "--steps", "0"])
