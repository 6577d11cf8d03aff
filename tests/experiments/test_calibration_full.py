"""`refbayes reproduce calibration --dataset mnist`: full MNIST on its official split, with
Fashion-MNIST's test images as the main task's out-of-distribution set, and --epochs.

The end-to-end run (3 epochs of MAP on 60,000 images, a 32-32 MLP) takes ~10 s on the 2-core
development machine, most of it reading and verifying the two data sets.
"""
import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest

from refbayes.cli import main
from refbayes.experiments import calibration as exp
from refbayes.experiments import calibration_methods as cm


def _main(argv):
    o, e = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(o), contextlib.redirect_stderr(e):
        status = main(["reproduce", "calibration", *argv])
    return status, o.getvalue(), e.getvalue()


def test_full_mnist_keeps_its_official_split_for_every_seed():
    y = np.tile(np.arange(10), 7000)  # 70,000 labels, as full MNIST
    for seed in (0, 1, 5):
        train, test = exp.split("mnist", y, seed)
        assert np.array_equal(train, np.arange(60_000))
        assert np.array_equal(test, np.arange(60_000, 70_000))
    # the other datasets still split per seed, as before
    y5k = np.repeat(np.arange(10), 500)
    a, b = exp.split("mnist-5k", y5k, 0), exp.split("mnist-5k", y5k, 1)
    assert np.array_equal(a[0], exp.stratified_split(y5k, exp.TEST_FRAC, exp._split_rng(0, "mnist-5k"))[0])
    assert not np.array_equal(a[0], b[0])


def test_datasets_keep_their_indices():
    """A dataset's index seeds its split and generators: mnist-5k and digits keep 0 and 1, so
    their saved results stay valid; full MNIST is appended and is not in the default run."""
    assert exp.DATASETS[:2] == ("mnist-5k", "digits") and exp.DATASETS[2] == "mnist"
    assert exp.DEFAULT_DATASETS == ("mnist-5k", "digits")
    assert exp.OOD_SETS == {"mnist": "fashion-mnist"}


def test_epochs_sets_every_method_and_keeps_swas_share():
    for spec in cm.METHODS.values():
        assert exp.method_settings(spec, False) == cm.resolve(spec, False)
        hyper = exp.method_settings(spec, False, 20)
        assert hyper["epochs"] == 20
        assert {k: v for k, v in hyper.items() if k not in ("epochs", "swa_epochs")} == \
            {k: v for k, v in cm.resolve(spec, False).items() if k not in ("epochs", "swa_epochs")}
    swag = cm.METHODS["swag"]
    assert cm.resolve(swag, False)["swa_epochs"] / cm.resolve(swag, False)["epochs"] == \
        exp.SWA_FRACTION  # the default run's share, 90 of 200
    assert exp.method_settings(swag, False, 20)["swa_epochs"] == 9
    assert exp.method_settings(swag, False, 3)["swa_epochs"] == 2  # at least 2 snapshots
    assert exp.method_settings(swag, False, 4)["swa_epochs"] == 2
    assert exp.method_settings(swag, False, 100)["swa_epochs"] == 45
    with pytest.raises(ValueError, match="--epochs: expected >= 3 with SWA"):
        exp.method_settings(swag, False, 2)
    assert exp.method_settings(cm.METHODS["map"], False, 1)["epochs"] == 1


def test_fashion_and_cifar_are_refused_with_the_reason(tmp_path):
    status, _, err = _main(["--dataset", "fashion-mnist", "--out", str(tmp_path)])
    assert status == 2 and "out-of-distribution set of --dataset mnist" in err
    status, _, err = _main(["--dataset", "mnist,cifar10", "--out", str(tmp_path)])
    assert status == 2 and "needs a convolutional network" in err
    status, _, err = _main(["--epochs", "0", "--out", str(tmp_path)])
    assert status == 2 and "expected an integer >= 1" in err
    assert not any(tmp_path.iterdir())
    with pytest.raises(ValueError, match="out-of-distribution set of --dataset mnist"):
        exp.load_data("fashion-mnist")


def test_load_data_identifies_both_sets(data_dir):
    X, y, identity = exp.load_data("mnist", data_dir)
    assert X.shape == (70_000, 784) and X.dtype == np.float64 and y.shape == (70_000,)
    assert list(y[:5]) == [5, 0, 4, 1, 9]  # the first training labels (SOURCES.md, section 8)
    assert any(k.startswith("mnist-full/") for k in identity)
    assert sum(k.startswith("fashion-mnist/") for k in identity) == 4
    X_ood = exp.load_ood("mnist", data_dir)
    assert X_ood.shape == (10_000, 784) and X_ood.dtype == np.float64
    assert 0.0 <= X_ood.min() and X_ood.max() <= 1.0
    assert exp.load_ood("mnist-5k", data_dir) is None


def test_full_mnist_run_scores_fashion_mnist_as_ood(data_dir, tmp_path):
    out = tmp_path / "out"
    status, stdout, stderr = _main(["--dataset", "mnist", "--quick", "--epochs", "3", "--method",
                                    "map", "--task", "main", "--out", str(out), "--data-dir",
                                    str(data_dir), "--no-progress"])
    assert status == 0, stderr
    saved = json.loads((out / "mnist" / "main" / "seed_0" / "map.json").read_text())
    assert saved["status"] == "ok"
    assert saved["n"] == {"train": 60_000, "test": 10_000, "ood": 10_000}
    assert saved["settings"]["settings"]["epochs"] == 3
    assert saved["settings"]["prior_precision"] == 60_000 * exp.WEIGHT_DECAY
    m = saved["metrics"]
    assert 0.9 < m["accuracy"] <= 1.0  # 3 epochs of SGD on full MNIST
    assert 0.0 <= m["ood_auroc"] <= 1.0 and m["ood_mean_entropy"] > m["mean_entropy"]
    assert "fashion-mnist's test images vs mnist's" in stdout
    rows = json.loads((out / "summary.json").read_text())["mnist"]
    assert rows[0]["method"] == "map" and rows[0]["ood_auroc"] == m["ood_auroc"]
    # the same command again loads the result instead of training
    status, _, stderr = _main(["--dataset", "mnist", "--quick", "--epochs", "3", "--method", "map",
                               "--task", "main", "--out", str(out), "--data-dir", str(data_dir),
                               "--no-progress"])
    assert status == 0 and Path(out / "mnist" / "main" / "seed_0" / "map.json").is_file()
