"""tools/cifar10_train_scores.py (issue 36 part 1, which train accuracy Table 1 reports): on a
--quick run's saved states, its scores equal the ones computed here from the state files with
the library's own forward passes (MC dropout: masked_forward with the masks of the tool's
stream), and its running column is the saved result's. Skips without the staged cifar10 data."""
from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pytest
from scipy.special import softmax

from refbayes.cli import main
from refbayes.experiments import _runner
from refbayes.experiments import cifar10_lenet as c10
from refbayes.methods import driver
from refbayes.models.conv import lenet5
from refbayes.models.dropout import masked_forward
from tests.tools import load_tool

ROWS = ("adam", "mc-dropout-official", "vogn")


tool = load_tool("cifar10_train_scores.py", "cifar10_train_scores")


@pytest.fixture(scope="module")
def quick_out(tmp_path_factory, cifar_dir):
    out = tmp_path_factory.mktemp("c10_train") / "out"
    e = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(e):
        status = main(["reproduce", "cifar10-lenet", "--quick", "--no-progress", "--methods",
                       ",".join(ROWS), "--data-dir", str(cifar_dir), "--out", str(out)])
    assert status == 0, e.getvalue()
    return out, cifar_dir


def _state(out, name):
    with np.load(out / "states" / f"{name}_seed_0.npz") as z:
        return {k: z[k] for k in z.files if k != "meta"}


def _acc_nll(P, y):
    return np.mean(np.argmax(P, axis=1) == y), -np.mean(np.log(P[np.arange(len(y)), y]))


@pytest.mark.slow
def test_scores_equal_the_forward_passes_of_the_saved_states(quick_out):
    out, data_dir = quick_out
    data = c10._load(data_dir, "float32", True, 256, 200)
    net = lenet5()
    rows = {name: tool.score_row(out, name, 0, 3, data_dir) for name in ROWS}
    for name, r in rows.items():
        saved = json.loads((out / name / "seed_0.json").read_text())["final"]
        assert (r["running_acc"], r["running_nll"]) == (saved["train_acc"], saved["train_nll"])
        assert r["val_acc"] == saved["acc"]
        mean = _state(out, name)["state.mu" if name == "vogn" else "state.theta"]
        point = softmax(net.forward(mean, data.X).astype(np.float64), axis=1)
        np.testing.assert_allclose((r["point_acc"], r["point_nll"]), _acc_nll(point, data.y),
                                   rtol=1e-12)
    # Adam's predictive is its point: one pass at theta
    assert rows["adam"]["draws"] == 1
    assert (rows["adam"]["predictive_acc"], rows["adam"]["predictive_nll"]) == (
        rows["adam"]["point_acc"], rows["adam"]["point_nll"])
    # MC dropout: the mean of 3 passes with masks at the official sites, from stream 7
    name = "mc-dropout-official"
    theta = _state(out, name)["state.theta"]
    rng = _runner.job_rng(0, c10.ROWS[name].rid, tool.STREAM)
    sites = tuple(c10.DROPOUT_SITES[name])
    P = np.zeros((256, 10))
    for _ in range(3):  # 256 rows: one chunk per pass
        masks = driver.draw_masks(rng, net, 256, 0.1, dtype=np.float32, sites=sites)
        P += softmax(masked_forward(net, theta, data.X, masks, 1 / 0.9, sites)
                     .astype(np.float64), axis=1)
    np.testing.assert_allclose((rows[name]["predictive_acc"], rows[name]["predictive_nll"]),
                               _acc_nll(P / 3, data.y), rtol=1e-12)
    assert rows[name]["paper_train_acc"] == 68.41


def test_a_missing_state_names_the_job(tmp_path):
    with pytest.raises(FileNotFoundError, match="run the vogn job first"):
        tool.score_row(tmp_path, "vogn", 0, 2, None)


def test_a_row_without_a_paper_train_column_is_refused(tmp_path):
    with pytest.raises(ValueError, match="--rows: expected rows of .*got 'kfac'"):
        tool.score_row(tmp_path, "kfac", 0, 2, None)
