"""`refbayes reproduce uci`: one quick split per registered method on the staged data, resume,
settings checks, bad input, the metrics against hand formulas, and the published numbers."""
import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import norm

import refbayes
from refbayes.cli import main
from refbayes.datasets import TrainTest
from refbayes.experiments import _runner, uci, uci_methods
from refbayes.methods import noise_gamma, noisy_kfac
from tests.tolerances import EXACT_F64, assert_close

# yacht: the smallest set (308 rows), so a quick split takes about a second
DATASET = "yacht"


def _reproduce(*args):
    return main(["reproduce", "uci", *map(str, args)])


def _split_json(out, method, k):
    return json.loads((out / method / DATASET / f"split_{k}.json").read_text())


@pytest.mark.parametrize("method", sorted(uci_methods.METHODS))
def test_quick_split_end_to_end(method, data_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert _reproduce("--method", method, "--dataset", DATASET, "--splits", "0", "--quick",
                      "--out", out, "--data-dir", data_dir) == 0
    stdout = capsys.readouterr().out
    saved = _split_json(out, method, 0)
    budget = uci_methods.resolve(uci_methods.METHODS[method], DATASET, quick=True)
    points = uci_methods.grid_points(budget.grid)
    assert saved["hyper"] in points
    if len(points) == 1:  # nothing to choose: no validation phase
        assert saved["validation"] == []
    else:
        assert len(points) == 2 and [s["hyper"] for s in saved["validation"]] == points
        best = max(saved["validation"], key=lambda s: s["ll"])
        assert saved["hyper"] == best["hyper"]  # chosen on validation log-likelihood
    assert saved["n"] == {"train": 277, "fit": 221, "validation": 56, "test": 31}
    assert 0 < saved["seconds"]["cpu"] and 0 < saved["seconds"]["total"]
    assert np.isfinite(saved["test"]["rmse"]) and np.isfinite(saved["test"]["ll"])
    summary = json.loads((out / method / DATASET / "summary.json").read_text())["summary"]
    assert summary["splits_done"] == 1 and summary["n_splits"] == 20
    assert summary["rmse_mean"] == saved["test"]["rmse"]
    row = next(line for line in stdout.splitlines() if line.startswith(method + " "))
    assert "1/20" in row and "quick" in row and f"{saved['test']['rmse']:.3f}" in row
    assert "1.08 +- 0.06" in stdout and "-1.88 +- 0.01" in stdout  # published SLANG, yacht
    assert (out / f"{DATASET}_splits.png").stat().st_size > 0
    assert (out / "summary.csv").read_text().startswith("method,dataset,budget")


def test_summaries_of_an_interrupted_run_are_marked_incomplete(data_dir, tmp_path, monkeypatch,
                                                               capsys):
    """Ctrl-C after split 0 of 0,1: the summary files written after split 0 must not look final
    (JSON "complete": false, the CSVs under *.partial.csv); the resumed run completes them."""
    args = ["--method", "map", "--dataset", DATASET, "--quick", "--epochs", 3, "--splits", "0,1",
            "--data-dir", data_dir, "--out", tmp_path]
    real = _runner.Progress.advance

    def advance_then_stop(self, label):  # split 0 written, with its summaries: Ctrl-C
        real(self, label)
        raise KeyboardInterrupt

    monkeypatch.setattr(_runner.Progress, "advance", advance_then_stop)
    assert _reproduce(*args) == 130
    err = capsys.readouterr().err
    assert f"refbayes: interrupted; 1 of 2 result(s) saved under {tmp_path} (1 by this run)" in err
    assert "run the same command again" in err
    folder = tmp_path / "map" / DATASET
    saved = json.loads((folder / "summary.json").read_text())
    assert saved["complete"] is False and saved["summary"]["complete"] is False
    assert [s["complete"] for s in json.loads((tmp_path / "summary.json").read_text())] == [False]
    for f in (folder, tmp_path):
        assert not (f / "summary.csv").exists() and (f / "summary.partial.csv").exists()
    assert (tmp_path / "summary.partial.csv").read_text().splitlines()[1].endswith(",False")
    monkeypatch.setattr(_runner.Progress, "advance", real)
    assert _reproduce(*args) == 0
    assert json.loads((folder / "summary.json").read_text())["complete"] is True
    assert json.loads((tmp_path / "summary.json").read_text())[0]["complete"] is True
    for f in (folder, tmp_path):
        assert (f / "summary.csv").exists() and not (f / "summary.partial.csv").exists()


def test_a_committed_reproduction_without_a_code_digest_is_resumed(data_dir, tmp_path, capsys,
                                                                   monkeypatch):
    """The files under reproductions/ predate code_sha256: they are read and reused as they are
    (nothing recomputed, no note), and the run completes their summary."""
    src = Path(__file__).resolve().parents[2] / "reproductions" / "uci-yacht-low-tau"
    out = tmp_path / "out"
    shutil.copytree(src, out)
    split = out / "slang" / DATASET / "split_0.json"
    assert "code_sha256" not in json.loads(split.read_text())["provenance"]
    mtimes = {p: p.stat().st_mtime_ns for p in out.rglob("split_*.json")}
    monkeypatch.setattr(_runner, "_STALE_NOTED", set())
    assert _reproduce("--method", "slang", "--dataset", DATASET, "--grid", "noise_precision=46.3",
                      "--out", out, "--data-dir", data_dir) == 0
    captured = capsys.readouterr()
    assert "note:" not in captured.err
    assert {p: p.stat().st_mtime_ns for p in out.rglob("split_*.json")} == mtimes
    summary = json.loads((out / "slang" / DATASET / "summary.json").read_text())
    assert summary["complete"] is True and summary["summary"]["splits_done"] == 20


def test_resume_keeps_files_and_matches_an_uninterrupted_run(data_dir, tmp_path, capsys):
    common = ["--method", "map", "--dataset", DATASET, "--quick", "--epochs", 3,
              "--data-dir", data_dir]
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    assert _reproduce(*common, "--splits", "0,1", "--out", whole) == 0
    assert _reproduce(*common, "--splits", "1", "--out", parts) == 0   # "interrupted" after 1
    capsys.readouterr()
    first = (parts / "map" / DATASET / "split_1.json").stat().st_mtime_ns
    assert _reproduce(*common, "--splits", "0-1", "--out", parts) == 0  # resumes with split 0
    resumed_out = capsys.readouterr().out
    assert (parts / "map" / DATASET / "split_1.json").stat().st_mtime_ns == first
    for k in (0, 1):
        a, b = _split_json(whole, "map", k), _split_json(parts, "map", k)
        assert a["test"] == b["test"] and a["validation"][0]["ll"] == b["validation"][0]["ll"]
    mtimes = {p: p.stat().st_mtime_ns for p in parts.rglob("split_*.json")}
    assert _reproduce(*common, "--splits", "0-1", "--out", parts) == 0
    assert {p: p.stat().st_mtime_ns for p in parts.rglob("split_*.json")} == mtimes
    assert capsys.readouterr().out == resumed_out
    assert "2/20" in resumed_out


def test_settings_mismatch_exits_2_unless_fresh(data_dir, tmp_path, capsys):
    common = ["--method", "map", "--dataset", DATASET, "--splits", "0", "--quick",
              "--out", tmp_path, "--data-dir", data_dir]
    assert _reproduce(*common, "--epochs", 2) == 0
    before = _split_json(tmp_path, "map", 0)
    capsys.readouterr()
    assert _reproduce(*common, "--epochs", 3) == 2
    err = capsys.readouterr().err
    assert "holds a run with other settings (differs in settings)" in err and "--fresh" in err
    assert _split_json(tmp_path, "map", 0) == before
    assert _reproduce(*common, "--epochs", 3, "--fresh") == 0
    assert _split_json(tmp_path, "map", 0)["settings"]["settings"]["epochs"] == 3


@pytest.mark.parametrize("args, match", [
    (["--dataset", "yacht", "--splits", "20"], "yacht has 20 splits (0-19), got split index 20"),
    (["--dataset", "protein", "--splits", "3-6"], "protein has 5 splits (0-4), got split index 5, 6"),
    (["--dataset", "yacht", "--splits", "1-x"], "expected indices like '0,1,5' or '0-4'"),
    (["--dataset", "yacht", "--epochs", "0"], "expected an integer >= 1"),
    (["--dataset", "mnist"], "invalid choice"),
])
def test_bad_arguments_exit_2(args, match, tmp_path, capsys):
    assert _reproduce("--method", "map", *args, "--out", tmp_path) == 2
    assert match in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing ran


def test_split_syntax():
    assert uci.parse_splits("0-2,7, 5") == (0, 1, 2, 5, 7)
    with pytest.raises(ValueError, match="low <= high"):
        uci.parse_splits("4-2")


def _poisoned_copy(data_dir, tmp_path):
    """A copy of the yacht folder whose target is NaN in one training row of split 0."""
    rel = "uci_regression/yacht/data"
    shutil.copytree(data_dir / rel, tmp_path / rel)
    folder = tmp_path / rel
    row = int(np.loadtxt(folder / "index_train_0.txt", dtype=int)[3])
    col = int(np.loadtxt(folder / "index_target.txt", dtype=int))
    lines = (folder / "data.txt").read_text().splitlines()
    cells = lines[row].split()
    cells[col] = "nan"
    lines[row] = " ".join(cells)
    (folder / "data.txt").write_text("\n".join(lines) + "\n")
    return tmp_path


def test_edited_data_is_refused_before_anything_runs(data_dir, tmp_path, capsys):
    """A data file that no longer matches its registered checksum (here: one target set to NaN)
    stops the run before computing, naming the file (datasets verify on load)."""
    poisoned = _poisoned_copy(data_dir, tmp_path / "data")
    assert _reproduce("--method", "map", "--dataset", DATASET, "--splits", "0", "--quick",
                      "--out", tmp_path / "out", "--data-dir", poisoned) == 2
    err = capsys.readouterr().err
    assert "uci_regression/yacht/data/data.txt does not match the registry" in err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


def test_non_finite_targets_are_caught_at_load(data_dir, monkeypatch):
    tt = uci.load_uci(DATASET, 0, data_dir)
    y = tt.y_train.copy()
    y[3] = np.nan
    monkeypatch.setattr(uci, "load_uci", lambda *a, **k: tt._replace(y_train=y))
    with pytest.raises(ValueError, match=re.escape(
            "yacht split 0: y_train has 1 non-finite value(s) (rows [3] of the split's training rows)")):
        uci.load_split(DATASET, 0, data_dir)


@pytest.mark.parametrize("method", ["map", "slang"])
def test_divergence_names_the_run_and_keeps_finished_splits(method, data_dir, tmp_path, monkeypatch):
    spec = uci_methods.METHODS[method]
    kw = {"quick": True, "out": tmp_path, "data_dir": data_dir, "epochs": 1, "progress": False}
    uci.run_method(method, DATASET, [0], **kw)
    split0 = tmp_path / method / DATASET / "split_0.json"
    mtime = split0.stat().st_mtime_ns

    def diverging_fit(model, X, y, hyper, rng, epochs, M, progress):
        # same settings, so split 0 is loaded from disk and only split 1 is fitted
        huge = model.__class__(list(model.sizes), "relu", "gaussian", noise_precision=1e300)
        return spec.fit(huge, X, y, hyper, rng, epochs, M, progress)

    monkeypatch.setitem(uci_methods.METHODS, method, spec._replace(fit=diverging_fit))
    with pytest.raises(uci_methods.TrainingError) as info:
        uci.run_method(method, DATASET, [0, 1], **kw)
    msg = str(info.value)
    assert f"{method} on yacht, split 1: every one of the 2 grid points diverged" in msg
    assert f"the first: {method} on yacht, split 1, validation fit 1/2 (noise_precision=" in msg
    assert "prior_precision=" in msg and "overflow" in msg
    assert msg.endswith(f"Finished splits kept in {tmp_path / method / DATASET}: 0")
    assert split0.stat().st_mtime_ns == mtime
    assert not (tmp_path / method / DATASET / "split_1.json").exists()
    summary = json.loads((tmp_path / method / DATASET / "summary.json").read_text())["summary"]
    assert summary["splits_done"] == 1


def test_a_diverging_grid_point_is_recorded_and_never_chosen(data_dir, tmp_path, monkeypatch):
    """(uci.7) over the points that trained: the first quick point diverges, the second wins."""
    spec = uci_methods.METHODS["map"]
    first = uci_methods.resolve(spec, DATASET, quick=True).grid["noise_precision"][0]

    def fit(model, X, y, hyper, rng, epochs, M, progress):
        if hyper["noise_precision"] == first:
            model = model.__class__(list(model.sizes), "relu", "gaussian", noise_precision=1e300)
        return spec.fit(model, X, y, hyper, rng, epochs, M, progress)

    monkeypatch.setitem(uci_methods.METHODS, "map", spec._replace(fit=fit))
    uci.run_method("map", DATASET, [0], quick=True, out=tmp_path, data_dir=data_dir, epochs=1,
            progress=False)
    saved = _split_json(tmp_path, "map", 0)
    bad, good = saved["validation"]
    assert bad["ll"] is None and "validation fit 1/2" in bad["diverged"] and "overflow" in bad["diverged"]
    assert np.isfinite(good["ll"]) and saved["hyper"] == good["hyper"] != bad["hyper"]


def test_one_point_grid_trains_once_on_the_whole_training_split(data_dir, tmp_path):
    """MC dropout runs Gal's fixed per-dataset settings: no validation phase, one fit, and the
    raw-unit noise precision is the scored one exactly (uci.4)."""
    budget = uci_methods.resolve(uci_methods.METHODS["mc_dropout"], DATASET, epochs=1)
    assert uci.fits_per_split(budget) == 1
    uci.run_method("mc_dropout", DATASET, [0], quick=True, out=tmp_path, data_dir=data_dir, epochs=1,
            progress=False)
    saved = _split_json(tmp_path, "mc_dropout", 0)
    assert saved["validation"] == [] and saved["hyper"] == {"noise_precision_raw": 0.541869562034,
                                                            "p": 0.01}
    assert_close(saved["test"]["noise_precision_original"], 0.541869562034, EXACT_F64, "tau raw")
    assert saved["seconds"]["validation"] < saved["seconds"]["final"]


def test_standard_error_ddof_is_selectable_and_stated(data_dir, tmp_path, capsys):
    """(uci.8): ddof 0 (the SLANG repository's tables) or 1, in the summary and the header;
    (uci.10): the medians beside the means, in the summary and the table."""
    args = ["--method", "map", "--dataset", DATASET, "--splits", "0-2", "--quick", "--epochs",
            "1", "--out", tmp_path, "--data-dir", data_dir]
    assert _reproduce(*args) == 0
    assert "s.e. = std with ddof 1 / sqrt(splits)" in capsys.readouterr().out
    one = json.loads((tmp_path / "map" / DATASET / "summary.json").read_text())["summary"]
    assert _reproduce(*args, "--se-ddof", "0") == 0
    assert "s.e. = std with ddof 0 / sqrt(splits)" in capsys.readouterr().out
    zero = json.loads((tmp_path / "map" / DATASET / "summary.json").read_text())["summary"]
    rmse = [_split_json(tmp_path, "map", k)["test"]["rmse"] for k in range(3)]
    assert (one["se_ddof"], zero["se_ddof"]) == (1, 0) and one["rmse_mean"] == zero["rmse_mean"]
    assert_close(one["rmse_se"], np.std(rmse, ddof=1) / np.sqrt(3), EXACT_F64, "ddof 1")
    assert_close(zero["rmse_se"], np.std(rmse, ddof=0) / np.sqrt(3), EXACT_F64, "ddof 0")
    ll = [_split_json(tmp_path, "map", k)["test"]["ll"] for k in range(3)]
    assert one["rmse_median"] == sorted(rmse)[1] and one["ll_median"] == sorted(ll)[1]
    table = uci._table(DATASET, [one], [])
    header, row = table.splitlines()[0], next(x for x in table.splitlines() if x.startswith("map"))
    assert "RMSE median" in header and "LL median (uci.10)" in header
    assert f"{sorted(rmse)[1]:.3f}" in row and f"{sorted(ll)[1]:.3f}" in row
    with pytest.raises(ValueError, match="se_ddof: expected 0 or 1, got 2"):
        uci.run_method("map", DATASET, [0], quick=True, out=tmp_path, data_dir=data_dir, se_ddof=2)


def test_table_shows_saved_results_of_other_methods(data_dir, tmp_path, capsys):
    """A method with results under --out that this invocation did not run is shown from its
    saved rows, marked "(saved)", its s.e. at this invocation's ddof; not "(method)" as if it had
    none. A published method with no results stays in parentheses."""
    common = ["--dataset", DATASET, "--quick", "--epochs", "1", "--out", tmp_path,
              "--data-dir", data_dir]
    assert _reproduce("--method", "map", "--splits", "0-2", *common) == 0
    capsys.readouterr()
    assert _reproduce("--method", "mc_dropout", "--splits", "0", "--se-ddof", "0", *common) == 0
    lines = capsys.readouterr().out.splitlines()
    row = next(x for x in lines if x.startswith("map (saved)"))
    rmse = [_split_json(tmp_path, "map", k)["test"]["rmse"] for k in range(3)]
    assert f"{np.mean(rmse):.3f} +- {np.std(rmse, ddof=0) / np.sqrt(3):.3f}" in row
    assert "3/20" in row and any(x.startswith("(saved): results an earlier") for x in lines)
    assert any(x.startswith("mc_dropout ") for x in lines)
    assert any(x.startswith("(slang)") for x in lines)  # published, nothing under --out
    # the run's own summary keeps its ddof; the saved one's file is not rewritten
    assert json.loads((tmp_path / "map" / DATASET / "summary.json").read_text())[
        "summary"]["se_ddof"] == 1


def test_grid_option_replaces_candidates(data_dir, tmp_path, capsys):
    assert uci.parse_grid("noise_precision=46.3") == ("noise_precision", (46.3,))
    assert uci.parse_grid(" prior_precision=0.1,1 ") == ("prior_precision", (0.1, 1.0))
    for bad in ("noise_precision", "=1", "noise_precision=a", "noise_precision="):
        with pytest.raises(ValueError, match="--grid: expected KEY=V1,V2"):
            uci.parse_grid(bad)
    spec = uci_methods.METHODS["slang"]
    budget = uci_methods.resolve(spec, DATASET, grid={"noise_precision": (46.3,)})
    assert budget.grid == {**uci_methods.resolve(spec, DATASET).grid, "noise_precision": (46.3,)}
    with pytest.raises(ValueError, match="slang grid: lr is not a hyperparameter of its grid"):
        uci_methods.resolve(spec, DATASET, grid={"lr": (0.1,)})
    with pytest.raises(ValueError, match=r"noise_precision: expected a value in \(0.0, inf\)"):
        uci_methods.resolve(spec, DATASET, grid={"noise_precision": (-1.0,)})
    assert _reproduce("--method", "map", "--dataset", DATASET, "--splits", "0", "--quick",
                      "--epochs", "1", "--grid", "noise_precision=3", "--out", tmp_path,
                      "--data-dir", data_dir) == 0
    saved = _split_json(tmp_path, "map", 0)
    assert saved["settings"]["grid"]["noise_precision"] == [3.0]
    assert all(v["hyper"]["noise_precision"] == 3.0 for v in saved["validation"])


def test_standardized_noise_precision():
    assert uci.standardized_noise_precision({"noise_precision": 3.0}, 2.0) == {"noise_precision": 3.0}
    assert uci.standardized_noise_precision({"noise_precision_raw": 0.5, "p": 0.1}, 2.0) == {
        "noise_precision_raw": 0.5, "p": 0.1, "noise_precision": 2.0}
    spec = uci_methods.METHODS["map"]
    both = spec._replace(grid={**spec.grid, "noise_precision_raw": (1.0,)})
    with pytest.raises(ValueError, match="exactly one of"):
        uci_methods.resolve(both, DATASET)


def test_mc_dropout_fit_trains_gal_s_per_dataset_objective():
    """(mc_dropout.9): the refbayes step under the runner's config has N tau~ / 2 times the
    gradient of Keras' minibatch objective mean (y~ - f)^2 + c ||W||^2, c = (1 - p) /
    (2 N l_G^2 tau), with inverted dropout and undecayed biases (<dataset>/net/net/net.py)."""
    import autograd
    import autograd.numpy as anp

    from refbayes.methods import driver, mc_dropout
    from refbayes.models import MLP
    from tests.reference.bbb_dense import masked_outputs

    N, P, p, tau_raw, l_G, s_y = 12, 3, 0.05, 0.16, 1e2, 9.2
    tau_s = tau_raw * s_y ** 2
    model = MLP([P, 6, 1], "relu", "gaussian", noise_precision=tau_s)
    rng = np.random.default_rng(4)
    X, y, theta = rng.standard_normal((N, P)), rng.standard_normal(N), model.init_theta(rng)
    hyper = {**uci_methods.MC_DROPOUT.defaults, "p": p, "noise_precision_raw": tau_raw,
             "noise_precision": tau_s, "code_lengthscale": l_G}
    post = uci_methods._dropout_fit(model, X, y, hyper, rng, 1, N, lambda k: None)
    cfg = post.cfg
    masks = driver.draw_masks(rng, model, N, p)
    _, info = mc_dropout.step(mc_dropout.init(theta), mc_dropout.Batch(X, y), masks, cfg, model)
    weights = model.flatten([(np.ones(W.shape), np.zeros(b.shape))
                             for W, b in model.unflatten(np.zeros(model.D))])
    c = (1 - p) / (2 * N * l_G ** 2 * tau_raw)

    def keras(th):
        f = masked_outputs(model, th, X, masks, 1 / (1 - p))
        return anp.mean((y - f[:, 0]) ** 2) + c * anp.sum(weights * th ** 2)

    assert_close(info.g, N * tau_s / 2 * autograd.grad(keras)(theta), EXACT_F64, "(mc_dropout.9)")
    assert cfg.eps_adam == N * tau_s / 2 * 1e-8 and not cfg.decay_biases and cfg.inverted


@pytest.mark.parametrize("key, value, match", [
    ("noise_precision", (-1.0,), r"noise_precision: expected a value in \(0.0, inf\), got -1"),
    ("prior_precision", (float("inf"),), r"prior_precision: expected a finite real number in \(0.0, inf\), got inf"),
    ("noise_precision", (), "expected a non-empty tuple"),
])
def test_hyperparameters_out_of_range(key, value, match):
    spec = uci_methods.METHODS["map"]
    bad = spec._replace(grid={**spec.grid, key: value})
    with pytest.raises(ValueError, match=match):
        uci_methods.resolve(bad, DATASET)
    with pytest.raises(ValueError, match=r"map hyperparameter lr: expected a value in \(0.0, 1.0\]"):
        uci_methods.resolve(spec._replace(defaults={**spec.defaults, "lr": 2.0}), DATASET)


def test_every_method_resolves_on_every_dataset():
    for spec in uci_methods.METHODS.values():
        for d in uci.DATASETS:
            full, quick = uci_methods.resolve(spec, d), uci_methods.resolve(spec, d, quick=True)
            n_full = len(uci_methods.grid_points(full.grid))
            # one-point grids: Gal's fixed per-dataset settings; a learned noise (no search)
            assert len(uci_methods.grid_points(quick.grid)) <= 2 < n_full or (
                n_full == 1 and (spec.name == "mc_dropout" or spec.name.endswith("_learned_noise")))
            assert quick.settings["epochs"] < full.settings["epochs"]
    assert uci_methods.resolve(uci_methods.METHODS["slang"], "wine").settings["beta"] == 0.01
    assert uci.hidden_units("protein") == 100 and uci.hidden_units("boston") == 50


def test_predictive_ll_and_rmse_by_hand():
    rng = np.random.default_rng(3)
    S, n, tau, m, s = 3, 4, 2.5, 7.0, 3.0
    F, y = rng.normal(size=(S, n)), m + s * rng.normal(size=n)
    dens = norm.pdf(y[None, :], loc=m + s * F, scale=s / np.sqrt(tau))  # (S, n)
    assert_close(uci.predictive_ll(y, F, tau, m, s), np.log(dens.mean(axis=0)), EXACT_F64,
                 "mixture log-likelihood vs scipy.stats.norm")
    # the Jacobian of y = m + s y~: standardized-scale log-likelihood minus log s
    y_std = (y - m) / s
    dens_std = norm.pdf(y_std[None, :], loc=F, scale=1 / np.sqrt(tau))
    assert_close(uci.predictive_ll(y, F, tau, m, s), np.log(dens_std.mean(axis=0)) - np.log(s),
                 EXACT_F64, "log-likelihood = standardized one - log s_y")
    y_hat = m + s * F.mean(axis=0)
    assert_close(uci.rmse(y, F, m, s), np.sqrt(np.mean((y - y_hat) ** 2)), EXACT_F64, "RMSE")


def test_predictive_ll_with_per_draw_precisions_by_hand():
    """(uci.2), (uci.9) with a learned noise: component s has its own tau_s."""
    rng = np.random.default_rng(13)
    S, n, m, s = 4, 3, 7.0, 3.0
    F, y, tau = rng.normal(size=(S, n)), m + s * rng.normal(size=n), rng.uniform(0.5, 5.0, S)
    dens = norm.pdf(y[None, :], loc=m + s * F, scale=s / np.sqrt(tau)[:, None])  # (S, n)
    assert_close(uci.predictive_ll(y, F, tau, m, s), np.log(dens.mean(axis=0)), EXACT_F64,
                 "mixture log-likelihood, per-draw precisions")
    assert uci.predictive_ll_joint(y, F, tau, m, s) == pytest.approx(
        np.log(dens.prod(axis=1).mean()) / n, rel=EXACT_F64)
    # one precision for every draw: the scalar path
    assert_close(uci.predictive_ll(y, F, np.full(S, 2.5), m, s), uci.predictive_ll(y, F, 2.5, m, s),
                 EXACT_F64, "constant per-draw precisions = the scalar")


def test_joint_ll_is_khan_et_al_s_metric_by_hand():
    """(uci.9): (1/n) log (1/S) sum_s prod_i N(y_i | m + s F[s, i], s^2 / tau), against
    scipy.stats.norm densities multiplied out (small n, so the product does not underflow), and
    the two-draw, two-point cases of derivations/uci.md on either side of (uci.3)."""
    rng = np.random.default_rng(4)
    S, n, tau, m, s = 4, 3, 2.5, 7.0, 3.0
    F, y = rng.normal(size=(S, n)), m + s * rng.normal(size=n)
    dens = norm.pdf(y[None, :], loc=m + s * F, scale=s / np.sqrt(tau))  # (S, n)
    assert uci.predictive_ll_joint(y, F, tau, m, s) == pytest.approx(
        np.log(dens.prod(axis=1).mean()) / n, rel=EXACT_F64)
    # one draw: the joint and the per-point metrics agree
    assert uci.predictive_ll_joint(y, F[:1], tau, m, s) == pytest.approx(
        float(np.mean(uci.predictive_ll(y, F[:1], tau, m, s))), rel=EXACT_F64)
    # two draws, each fitting one of two points (far off the other): LL_joint < LL; one draw
    # fitting both points and one fitting neither: LL_joint > LL
    tau, far = 1.0, 40.0
    for F2, joint_lower in (([[0.0, far], [far, 0.0]], True), ([[0.0, 0.0], [far, far]], False)):
        F2 = np.array(F2)
        joint = uci.predictive_ll_joint(np.zeros(2), F2, tau, 0.0, 1.0)
        per_point = float(np.mean(uci.predictive_ll(np.zeros(2), F2, tau, 0.0, 1.0)))
        assert (joint < per_point - 1.0) if joint_lower else (joint > per_point + 0.1)


def test_standardization_uses_training_rows_only():
    # checks (uci.5), (uci.6)
    rng = np.random.default_rng(0)
    X, y = rng.normal(3.0, 2.0, size=(50, 4)), rng.normal(-1.0, 5.0, size=50)
    Xt, yt = rng.normal(size=(10, 4)), rng.normal(size=10)
    tt = TrainTest(X, y, Xt, yt)
    X_fit, y_fit, _, y_val, stats = uci.phase_data(tt, "validation")
    assert X_fit.shape[0] == 40 and np.array_equal(y_val, y[40:])  # last 20%, raw targets
    assert_close(stats.x_mean, X[:40].mean(axis=0), EXACT_F64, "x mean of the fit rows")
    assert_close(stats.y_std, y[:40].std(), EXACT_F64, "y std of the fit rows")
    # changing validation and test rows leaves the fitted statistics and scaled fit rows alone
    tt2 = TrainTest(np.vstack([X[:40], 100 * X[40:]]), np.r_[y[:40], 100 * y[40:]], 9 * Xt, 9 * yt)
    X_fit2, y_fit2, _, _, stats2 = uci.phase_data(tt2, "validation")
    assert np.array_equal(X_fit2, X_fit) and np.array_equal(y_fit2, y_fit)
    assert all(np.array_equal(a, b) for a, b in zip(stats2, stats))
    X_tr, _, _, y_te, st = uci.phase_data(tt, "final")
    X_tr3, _, X_te3, _, st3 = uci.phase_data(TrainTest(X, y, 9 * Xt, 9 * yt), "final")
    assert np.array_equal(y_te, yt) and np.array_equal(X_tr3, X_tr)
    assert float(st.y_mean) == float(st3.y_mean) and float(st.y_std) == float(y.std())
    assert_close(X_te3, (9 * Xt - st.x_mean) / st.x_std, EXACT_F64, "test rows use train stats")


# The issue's table (Mishkin et al. 2018, Table 2): dataset -> method -> (RMSE, s.e., LL, s.e.)
ISSUE = {
    "boston": {"bbb": (3.43, 0.20, -2.66, 0.06), "mc_dropout": (2.97, 0.19, -2.46, 0.06),
               "slang": (3.21, 0.19, -2.58, 0.05)},
    "concrete": {"bbb": (6.16, 0.13, -3.25, 0.02), "mc_dropout": (5.23, 0.12, -3.04, 0.02),
                 "slang": (5.58, 0.19, -3.13, 0.03)},
    "energy": {"bbb": (0.97, 0.09, -1.45, 0.10), "mc_dropout": (1.66, 0.04, -1.99, 0.02),
               "slang": (0.64, 0.03, -1.12, 0.01)},
}


def test_published_numbers_match_the_issue():
    rows = uci.load_published()
    got = {(r["dataset"], r["method"]): r for r in rows}
    assert len(got) == len(rows)  # one row per (dataset, method)
    for d, methods in ISSUE.items():
        for m, numbers in methods.items():
            r = got[(d, m)]
            assert (r["rmse"], r["rmse_pm"], r["ll"], r["ll_pm"]) == numbers, (d, m)
            assert r["pm"] == "se" and r["source"] == "mishkin2018-table2"
    assert {r["dataset"] for r in rows} <= set(uci.DATASETS)
    assert {r["pm"] for r in rows} == {"se", "sd"}
    header = "\n".join(line for line in
                       uci.resources.files("refbayes.experiments").joinpath("published/uci.csv")
                       .read_text().splitlines() if line.startswith("#"))
    for source in {r["source"] for r in rows}:
        assert f"#   {source}:" in header  # every source is cited in the header


# ----------------------------------------------------------------------------- provenance, damage, progress, --out

def _quick(out, data_dir, *extra, method="map", splits="0"):
    return ["--method", method, "--dataset", DATASET, "--splits", splits, "--quick", "--epochs", 1,
            "--out", out, "--data-dir", data_dir, *extra]


def test_split_results_record_data_checksums_version_and_commit(data_dir, tmp_path, capsys):
    assert _reproduce(*_quick(tmp_path, data_dir, splits="3")) == 0
    prov = _split_json(tmp_path, "map", 3)["provenance"]
    base = "uci_regression/yacht/data/"
    files = [base + f for f in ("data.txt", "index_features.txt", "index_target.txt",
                                "index_train_3.txt", "index_test_3.txt")]
    assert prov["data_sha256"] == {f: hashlib.sha256((data_dir / f).read_bytes()).hexdigest()
                                   for f in files}
    assert prov["refbayes_version"] == refbayes.__version__
    assert prov["git_commit"] == _runner.git_commit()


def _edit(path, fn):
    saved = json.loads(path.read_text())
    fn(saved)
    path.write_text(json.dumps(saved))


@pytest.mark.parametrize("edit, message", [
    (lambda s: s["provenance"]["data_sha256"].update({"uci_regression/yacht/data/data.txt": "0" * 64}),
     "holds a run computed from other data (uci_regression/yacht/data/data.txt changed)"),
    (lambda s: s["provenance"].update(refbayes_version="0.0.1"), "holds a run written by refbayes 0.0.1"),
    (lambda s: s.pop("provenance"), "records no data checksums or refbayes version"),
])
def test_stale_split_results_are_refused_unless_fresh(data_dir, tmp_path, capsys, edit, message):
    args = _quick(tmp_path, data_dir)
    assert _reproduce(*args) == 0
    path = tmp_path / "map" / DATASET / "split_0.json"
    _edit(path, edit)
    capsys.readouterr()
    assert _reproduce(*args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"refbayes: error: --out: {path} {message}") and "--fresh" in err
    assert _reproduce(*args, "--fresh") == 0
    assert _split_json(tmp_path, "map", 0)["provenance"]["refbayes_version"] == refbayes.__version__
    # and a summary never counts a split computed from other data
    _edit(path, edit)
    assert uci.run_method("map", DATASET, [1], quick=True, out=tmp_path, data_dir=data_dir, epochs=1,
                   progress=False)["splits"] == [1]


def test_another_commit_is_reused(data_dir, tmp_path, capsys):
    args = _quick(tmp_path, data_dir)
    assert _reproduce(*args) == 0
    path = tmp_path / "map" / DATASET / "split_0.json"
    _edit(path, lambda s: s["provenance"].update(git_commit="f" * 40))
    mtime = path.stat().st_mtime_ns
    assert _reproduce(*args) == 0
    assert path.stat().st_mtime_ns == mtime


@pytest.mark.parametrize("damage, what", [
    (lambda text: text[: len(text) // 2], "not valid JSON ("),
    (lambda text: "{}", "missing 'settings'"),
    (lambda text: "[1, 2]", "expected a JSON object, got a JSON array"),
])
def test_damaged_split_file_is_named_and_fresh_recomputes_it(data_dir, tmp_path, capsys, damage, what):
    args = _quick(tmp_path, data_dir)
    assert _reproduce(*args) == 0
    path = tmp_path / "map" / DATASET / "split_0.json"
    good = path.read_text()
    path.write_text(damage(good))
    capsys.readouterr()
    assert _reproduce(*args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"refbayes: error: {path}: ") and what in err, err
    assert "--fresh" in err and err.count("\n") == 1
    assert _reproduce(*args, "--fresh") == 0
    assert _split_json(tmp_path, "map", 0)["test"] == json.loads(good)["test"]
    # a damaged split that was not asked for is left out of the summary, with a note
    path.write_text(damage(good))
    capsys.readouterr()
    assert _reproduce(*_quick(tmp_path, data_dir, splits="1")) == 0
    captured = capsys.readouterr()
    assert f"{path}: damaged result file" in captured.err or f"{path}: not valid JSON" in captured.err
    assert json.loads((tmp_path / "map" / DATASET / "summary.json").read_text())["summary"]["splits"] == [1]


def test_damaged_summary_of_another_method_is_skipped_with_a_note(data_dir, tmp_path, capsys):
    assert _reproduce(*_quick(tmp_path, data_dir, method="bbb")) == 0
    other = tmp_path / "bbb" / DATASET / "summary.json"
    other.write_text("{")
    capsys.readouterr()
    assert _reproduce(*_quick(tmp_path, data_dir)) == 0
    err = capsys.readouterr().err
    assert f"{other}: not valid JSON" in err
    assert [s["method"] for s in json.loads((tmp_path / "summary.json").read_text())] == ["map"]


def test_methods_run_separately_share_one_summary(data_dir, tmp_path, capsys):
    assert _reproduce(*_quick(tmp_path, data_dir, method="bbb")) == 0
    assert _reproduce(*_quick(tmp_path, data_dir)) == 0
    assert {s["method"] for s in json.loads((tmp_path / "summary.json").read_text())} == {"bbb", "map"}
    assert len((tmp_path / "summary.csv").read_text().splitlines()) == 3


def test_one_summary_covers_every_method_and_dataset(data_dir, tmp_path, capsys):
    # The top-level summary lists each (method, dataset) with results under --out: a method's
    # second dataset must not replace its first.
    assert _reproduce(*_quick(tmp_path, data_dir)) == 0
    assert _reproduce("--method", "map", "--dataset", "boston", "--splits", "0", "--quick",
                      "--epochs", 1, "--out", tmp_path, "--data-dir", data_dir) == 0
    assert _reproduce(*_quick(tmp_path, data_dir, method="bbb")) == 0
    pairs = {(s["method"], s["dataset"]) for s in json.loads((tmp_path / "summary.json").read_text())}
    assert pairs == {("map", "boston"), ("map", DATASET), ("bbb", DATASET)}
    assert len((tmp_path / "summary.csv").read_text().splitlines()) == 4


def test_one_split_prints_a_dash_for_the_spread(data_dir, tmp_path, capsys):
    assert _reproduce(*_quick(tmp_path, data_dir)) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("map "))
    assert row.count("+- —") == 3 and "nan" not in row  # RMSE, LL and LL joint (uci.9)


def test_progress_on_stderr_off_a_terminal(data_dir, tmp_path, capsys):
    assert _reproduce(*_quick(tmp_path, data_dir)) == 0  # map's split is resumed below
    capsys.readouterr()
    assert _reproduce(*_quick(tmp_path, data_dir, method="all")) == 0
    captured = capsys.readouterr()
    n = len(uci_methods.METHODS)
    assert f"uci: {n} run(s), 1 already done, {n - 1} to compute" in captured.err
    for j, m in enumerate([m for m in uci_methods.METHODS if m != "map"], 2):
        assert f"uci: run {j}/{n} done ({m} yacht split 0; elapsed " in captured.err
    assert "elapsed" not in captured.out and "run 2/" not in captured.out


def test_header_is_printed_before_the_first_result(data_dir, tmp_path):
    cmd = [sys.executable, "-m", "refbayes.cli", "reproduce", "uci",
           *map(str, _quick(tmp_path, data_dir, splits="0,1"))]
    res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=600, check=False)
    assert res.returncode == 0, res.stdout
    head = res.stdout.index("yacht: test RMSE and test log-likelihood")
    assert head < res.stdout.index("run 1/2 done") < res.stdout.index("run 2/2 done") \
        < res.stdout.index("test RMSE  ")


def _refuse_writes(monkeypatch):
    def probe(path):
        raise PermissionError(13, "Permission denied", str(path))
    monkeypatch.setattr(_runner, "_probe", probe)


def test_unwritable_out_is_an_error_before_computing(data_dir, tmp_path, capsys, monkeypatch):
    _refuse_writes(monkeypatch)
    monkeypatch.setattr(uci, "_run_split", lambda *a, **k: pytest.fail("computed before checking --out"))
    out = tmp_path / "out"
    assert _reproduce(*_quick(out, data_dir)) == 2
    assert capsys.readouterr().err.startswith(
        f"refbayes: error: --out: cannot write in {tmp_path} (Permission denied)")
    assert not out.exists()


def test_complete_read_only_results_still_print_their_table(data_dir, tmp_path, capsys, monkeypatch):
    assert _reproduce(*_quick(tmp_path, data_dir)) == 0
    first = capsys.readouterr().out
    mtimes = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()}
    _refuse_writes(monkeypatch)
    assert _reproduce(*_quick(tmp_path, data_dir)) == 0
    captured = capsys.readouterr()
    assert "figure:" in first and "figure:" not in captured.out
    assert captured.out.splitlines() == [line for line in first.splitlines()
                                         if not line.startswith("figure:")]
    assert f"{tmp_path} is not writable" in captured.err and "not updated" in captured.err
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()} == mtimes


# ----------------------------------------------------------------------------- method names, Vadam, Noisy Adam

def test_method_names_accept_hyphens_and_underscores(data_dir, tmp_path, capsys):
    for name in uci_methods.METHODS:
        assert uci_methods.canonical_name(name.replace("_", "-")) == name
        assert uci_methods.canonical_name(name) == name
    args = ["--dataset", DATASET, "--splits", "0", "--quick", "--epochs", 1, "--out", tmp_path,
            "--data-dir", data_dir]
    assert _reproduce("--method", "mc-dropout", *args) == 0
    assert capsys.readouterr().out.count("\nmc_dropout ") == 1  # the canonical name in the table
    path = tmp_path / "mc_dropout" / DATASET / "split_0.json"
    mtime = path.stat().st_mtime_ns
    assert _reproduce("--method", "mc_dropout", *args) == 0  # the same run: loaded, not redone
    assert path.stat().st_mtime_ns == mtime
    summary = uci.run_method("noisy-adam", DATASET, [0], quick=True, out=tmp_path, data_dir=data_dir,
                      epochs=1, progress=False)
    assert summary["method"] == "noisy_adam" and (tmp_path / "noisy_adam" / DATASET).is_dir()
    capsys.readouterr()
    assert _reproduce("--method", "not-a-method", *args) == 2
    assert "invalid choice: 'not_a_method'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="hyphens or underscores"):
        uci.run_method("not-a-method", DATASET, [0], out=tmp_path, data_dir=data_dir)


# The issue's table (Khan et al. 2018 for BBVI and Vadam, Zhang et al. 2018 for Noisy Adam and
# Noisy K-FAC): test log-likelihood, mean +- s.e.; dataset -> method -> (LL, s.e.)
ISSUE_LL = {
    "boston": {"bbvi": (-2.73, 0.05), "vadam": (-2.85, 0.07), "noisy_adam": (-2.558, 0.032),
               "noisy_kfac": (-2.417, 0.029)},
    "concrete": {"bbvi": (-3.24, 0.02), "vadam": (-3.39, 0.02), "noisy_adam": (-3.145, 0.023),
                 "noisy_kfac": (-3.039, 0.025)},
    "energy": {"bbvi": (-2.47, 0.02), "vadam": (-2.15, 0.07), "noisy_adam": (-1.629, 0.020),
               "noisy_kfac": (-1.421, 0.005)},
    "power": {"bbvi": (-2.88, 0.01), "vadam": (-2.88, 0.01), "noisy_adam": (-2.803, 0.010),
              "noisy_kfac": (-2.776, 0.011)},
}
SOURCE = {"bbvi": "khan2018-table1", "vadam": "khan2018-table1",
          "noisy_adam": "zhang2018-table2", "noisy_kfac": "zhang2018-table2"}


def test_published_log_likelihoods_of_vadam_noisy_adam_and_noisy_kfac():
    rows = uci.load_published()
    got = {(r["dataset"], r["method"]): r for r in rows}
    for d, methods in ISSUE_LL.items():
        for m, (ll, se) in methods.items():
            r = got[(d, m)]
            assert (r["ll"], r["ll_pm"], r["pm"], r["source"]) == (ll, se, "se", SOURCE[m]), (d, m)
            assert r["rmse"] is None and r["rmse_pm"] is None  # not transcribed, not guessed
    assert {m for (_, m) in got if m in SOURCE} == set(SOURCE)
    assert {d for (d, m) in got if m in SOURCE} == set(ISSUE_LL)
    # printed with the source's decimals; a published-only method in parentheses, RMSE "-"
    table = uci._table("boston", [], rows)
    line = next(x for x in table.splitlines() if x.startswith("(noisy_kfac)"))
    assert "-2.417 +- 0.029" in line and "zhang2018-table2" in line and "nan" not in line
    header = table.splitlines()[0]
    assert line[header.index("published RMSE"):].split()[0] == "-"  # not transcribed
    assert "-2.85 +- 0.07" in next(x for x in table.splitlines() if x.startswith("(vadam)"))
    assert "-2.46 +- 0.06" in table  # the older rows keep their two decimals


def test_published_rows_need_a_metric_and_its_spread(monkeypatch):
    header = "dataset,method,rmse,rmse_pm,ll,ll_pm,pm,source\n"

    class _Files:
        def __init__(self, text):
            self.text = text

        def joinpath(self, _):
            return self

        def read_text(self, _):
            return self.text

    for body, match in [("boston,x,,,-2.5,,se,s\n", "ll and ll_pm must be both given"),
                        ("boston,x,,,,,se,s\n", "no figure")]:
        monkeypatch.setattr(uci.resources, "files", lambda _, b=body: _Files(header + b))
        with pytest.raises(ValueError, match=match):
            uci.load_published()


def test_bbb_and_slang_settings_follow_the_official_small_and_large_parameters():
    """The SLANG repository's uci_default_parameters: UCI_SMALL_* minibatch 10 and 4 training
    draws; UCI_LARGE_BBB minibatch 100 and 2 draws, UCI_LARGE_SLANG minibatch 10 and 2 draws
    (kin8nm, naval, power; protein, with no official setting, takes the large ones)."""
    large = ("kin8nm", "naval", "power", "protein")
    for d in uci.DATASETS:
        bbb, slang = (uci_methods.resolve(uci_methods.METHODS[m], d).settings
                      for m in ("bbb", "slang"))
        assert (bbb["M"], bbb["S_train"]) == ((100, 2) if d in large else (10, 4)), d
        assert (slang["M"], slang["S_train"]) == ((10, 2) if d in large else (10, 4)), d
        assert (bbb["epochs"], bbb["lr"], slang["epochs"]) == (120, 0.01, 120), d


def test_vadam_and_noisy_adam_settings():
    vadam_spec, noisy = uci_methods.METHODS["vadam"], uci_methods.METHODS["noisy_adam"]
    small = uci_methods.resolve(vadam_spec, "boston")
    assert {k: small.settings[k] for k in ("epochs", "M", "S_train", "S_test", "lr", "adam_beta1",
                                           "adam_beta2", "squares")} == {
        "epochs": 40, "M": 32, "S_train": 10, "S_test": 100, "lr": 0.01, "adam_beta1": 0.9,
        "adam_beta2": 0.99, "squares": "minibatch"}
    for d in ("kin8nm", "naval", "power", "wine"):
        large = uci_methods.resolve(vadam_spec, d).settings
        assert (large["M"], large["S_train"]) == (128, 5), d
    # the official BO boxes, log-spaced: log tau in (0, 5) ((1, 5)), log lam in (-4, 4) ((-3, 4))
    assert np.allclose(np.log(small.grid["noise_precision"]), np.linspace(0, 5, 5), atol=5e-3)
    assert np.allclose(np.log(small.grid["prior_precision"]), [-4, 0, 4], atol=5e-3)
    naval = uci_methods.resolve(vadam_spec, "naval").grid
    assert np.allclose(np.log(naval["noise_precision"]), np.linspace(1, 5, 5), atol=5e-3)
    assert np.allclose(np.log(naval["prior_precision"]), [-3, 0.5, 4], atol=5e-3)
    full = uci_methods.resolve(noisy, "boston").settings
    assert (full["epochs"], full["M"], full["lr"], full["beta2"], full["lr_decay_every"]) == \
        (1000, 10, 0.01, 0.999, 500)
    for d in uci.DATASETS:
        M = uci_methods.resolve(noisy, d).settings["M"]
        assert M == (100 if d in ("kin8nm", "naval", "power", "protein") else 10), d
    with pytest.raises(ValueError, match="squares: expected one of"):
        bad = noisy._replace(defaults={**noisy.defaults, "squares": "both"})
        uci_methods.resolve(bad, "boston")


def _toy(seed=0):
    from refbayes.models import MLP
    rng = np.random.default_rng(seed)
    X, y = rng.standard_normal((40, 3)), rng.standard_normal(40)
    return MLP([3, 5, 1], "relu", "gaussian", noise_precision=4.0), X, y


def _toy_unit(seed=0):
    """_toy's data with the unit-precision model a learned noise needs."""
    from refbayes.models import MLP
    _, X, y = _toy(seed)
    return MLP([3, 5, 1], "relu", "gaussian", noise_precision=1.0), X, y


def test_vadam_fit_is_the_official_optimizer_configuration():
    from refbayes.methods import driver, vadam
    spec = uci_methods.METHODS["vadam"]
    model, X, y = _toy()
    hyper = {**spec.defaults, "prior_precision": 3.0, "noise_precision": 4.0}
    post = spec.fit(model, X, y, hyper, np.random.default_rng(1), 3, 8, lambda n: None)
    rng = np.random.default_rng(1)
    # Vadam(lr 0.01, betas (0.9, 0.99), prior_prec 3 on every parameter, prec_init = prior_prec)
    cfg = vadam.VadamConfig(40, 3.0, alpha=0.01, beta1=0.9, beta2=0.99)
    state = driver.run(vadam.init(model.init_theta(rng)), cfg, model, X, y, rng=rng, epochs=3,
                       M=8, S=10)
    eps = np.random.default_rng(2).standard_normal((model.D, 4))
    assert_close(post.sample(eps), vadam.sample(state, eps, cfg), EXACT_F64, "Vadam draws")


def test_slang_official_code_trains_and_predicts_at_mean_plus_draw():
    """slang_official_code (slang.9): the driver's SLANG run from the "pytorch" initialization
    with forward="mean+draw" (the official settings otherwise), and the predictive's draws
    w_s = mu + theta_s, theta_s the draws of q; its table row carries the published SLANG figure."""
    from refbayes.methods import driver, slang
    spec = uci_methods.METHODS["slang_official_code"]
    extra = {"init": "pytorch", "forward": "mean+draw"}
    assert spec.defaults == {**uci_methods.METHODS["slang"].defaults, **extra}
    model, X, y = _toy()
    hyper = {**spec.defaults, "prior_precision": 3.0, "noise_precision": 4.0}
    post = spec.fit(model, X, y, hyper, np.random.default_rng(1), 3, 8, lambda n: None)
    rng = np.random.default_rng(1)
    lam = uci_methods.prior_vector(model, 3.0, 1e-6)
    cfg = slang.SLANGConfig(40, lam, L=1, alpha=0.01, beta=0.01, decay=0.0, momentum=0.9,
                            forward="mean+draw")
    theta0 = model.init_theta(rng, scheme="pytorch")
    state = slang.init(theta0, np.zeros((model.D, 1)), np.ones(model.D))
    state = driver.run(state, cfg, model, X, y, rng=rng, epochs=3, M=8, S=4)
    eps = np.random.default_rng(2).standard_normal((model.D, 4))
    assert_close(post.sample(eps), state.mu[:, None] + slang.sample(state, eps), EXACT_F64,
                 "official-code draws")
    F, tau = spec.predict(post, model, X, np.random.default_rng(2), 4)
    assert tau == 4.0
    assert_close(F, np.stack([model.forward(w, X)[:, 0] for w in post.sample(eps).T]),
                 EXACT_F64, "predictive at mu + theta_s")
    summary = {"method": "slang_official_code", "splits_done": 1, "n_splits": 20,
               "budget": "full", "rmse_mean": 1.0, "rmse_se": None, "ll_mean": -1.0,
               "ll_se": None, "ll_joint_mean": -1.0, "ll_joint_se": None}
    table = uci._table("energy", [summary], uci.load_published())
    row = next(line for line in table.splitlines() if line.startswith("slang_official_code"))
    assert "-1.12 +- 0.01" in row and "(slang)" not in table


def test_noisy_adam_fit_decays_alpha_and_the_curvature_weight():
    from refbayes.methods import driver, noisy_adam
    spec = uci_methods.METHODS["noisy_adam"]
    model, X, y = _toy()
    hyper = {**spec.defaults, "noise_precision": 4.0, "lr_decay_every": 2}
    post = spec.fit(model, X, y, hyper, np.random.default_rng(1), 3, 8, lambda n: None)
    rng = np.random.default_rng(1)
    cfg = noisy_adam.NoisyAdamConfig(40, 1.0, alpha=0.01, beta1=0.9, beta2=0.999,
                                     squares="per_example")
    state = noisy_adam.init(model.init_theta(rng), 1.0)
    state = driver.run(state, cfg, model, X, y, rng=rng, epochs=2, M=8, S=10)
    decayed = cfg._replace(alpha=0.001, beta2=1 - 1e-4)  # x 0.1 after 2 epochs
    state = driver.run(state, decayed, model, X, y, rng=rng, epochs=1, M=8, S=10)
    eps = np.random.default_rng(2).standard_normal((model.D, 4))
    assert_close(post.sample(eps), noisy_adam.sample(state, eps, cfg), EXACT_F64,
                 "Noisy Adam draws after the decay")
    undecayed = spec.fit(model, X, y, {**hyper, "lr_decay_ratio": 1.0}, np.random.default_rng(1),
                         3, 8, lambda n: None)
    assert not np.allclose(undecayed.sample(eps), post.sample(eps))  # the decay is visible


# ----------------------------------------------------------------------------- Noisy K-FAC, K-FAC

def test_noisy_kfac_and_kfac_settings():
    """The official regression settings (pomonam/NoisyNaturalGradient config/regression/kfac_*.json)
    and their NoisyKFACConfig (derivations/noisy_kfac.md, "UCI protocol")."""
    noisy, kfac = uci_methods.METHODS["noisy_kfac"], uci_methods.METHODS["kfac"]
    full = uci_methods.resolve(noisy, "boston").settings
    assert full == {"epochs": 1000, "M": 10, "S_test": 100, "S_train": 10, "lr": 0.01,
                    "momentum": 0.9, "bias_correction": True, "beta": 1e-3, "kl_weight": 1.0,
                    "eta": 1.0, "damping": 0.0, "T_stats": 1, "T_inv": 1, "factor_init": "tau",
                    "lr_decay_every": 500, "lr_decay_ratio": 0.1}
    point = uci_methods.resolve(kfac, "boston").settings
    # K-FAC: the same, at the mean, with the authors' K-FAC damping and KL clipping
    assert point == {**{k: v for k, v in full.items() if k != "S_train"}, "S_test": 1,
                     "damping": 1e-3, "kl_clip": 1e-3}
    assert uci_methods.kfac_config(point, 455) == uci_methods.kfac_config(full, 455)._replace(
        gamma_ex=1e-3, kl_clip=1e-3)
    for d in uci.DATASETS:
        M = uci_methods.resolve(noisy, d).settings["M"]
        assert M == (100 if d in ("kin8nm", "naval", "power", "protein") else 10), d
        # the noise precision is grid-searched as for Noisy Adam (not learned)
        grid = uci_methods.resolve(noisy, d).grid
        assert grid == uci_methods.resolve(uci_methods.METHODS["noisy_adam"], d).grid
        assert grid == uci_methods.resolve(kfac, d).grid and list(grid) == ["noise_precision"]
    cfg = uci_methods.kfac_config(full, 455)
    assert cfg == noisy_kfac.NoisyKFACConfig(
        455, eta=1.0, kl_weight=1.0, alpha=0.01 * (1 - 0.9), beta=1e-3, momentum=0.9,
        gamma_ex=0.0, T_stats=1, T_inv=1, damping="factored", curvature="mc", kl_clip=None)
    assert noisy_kfac.gamma_in(cfg) == 1.0 / 455  # the official coeff = kl / (N eta)
    # bias correction: alpha_t = lr (1 - 0.9) / (1 - 0.9^t): lr at t = 1, lr (1 - 0.9) at large t
    assert uci_methods.kfac_step_size(full, 1, 0.01) == pytest.approx(0.01, rel=1e-15)
    assert uci_methods.kfac_step_size(full, 10**6, 0.01) == pytest.approx(1e-3, rel=1e-15)
    no_bc = {**full, "bias_correction": False}
    assert uci_methods.kfac_step_size(no_bc, 1, 0.01) == pytest.approx(1e-3, rel=1e-15)
    with pytest.raises(ValueError, match="factor_init: expected one of"):
        uci_methods.resolve(noisy._replace(defaults={**noisy.defaults, "factor_init": "I"}),
                            "boston")
    with pytest.raises(ValueError, match="bias_correction: expected one of"):
        uci_methods.resolve(noisy._replace(defaults={**noisy.defaults, "bias_correction": "yes"}),
                            "boston")
    with pytest.raises(ValueError, match=re.escape("T_inv: expected an integer in [1, inf), got 0")):
        uci_methods.resolve(noisy._replace(defaults={**noisy.defaults, "T_inv": 0}), "boston")


def _replay_kfac(model, X, y, hyper, rng, epochs, M, noisy, learned=False):
    """kfac_train's documented order, written out: per epoch the permutation; per step eps
    (Noisy K-FAC), tau ~ q (learned noise), z, y_tilde = f(X_B; w_s) + z / sqrt(tau_s),
    alpha_t bias-corrected, then q's Adam step at the draws' residual; and lr, beta x
    lr_decay_ratio after every lr_decay_every epochs. Returns (state, q)."""
    N, tau = X.shape[0], model.likelihood.noise_precision
    q = noise_gamma.init(6.0, 6.0)
    q_cfg = noise_gamma.NoiseGammaConfig(N, 6.0, 6.0, kl_weight=1.0, lr=1e-3)
    state = noisy_kfac.init(model.init_theta(rng), model)
    S0 = tuple(tau * np.eye(F.shape[0]) for F in state.S)  # factor_init "tau"
    state = state._replace(S=S0, S_ref=S0)
    lr, beta, t = hyper["lr"], hyper["beta"], 0
    for epoch in range(1, epochs + 1):
        perm = rng.permutation(N)
        for i in range(0, N, M):
            idx = perm[i:i + M]
            t += 1
            alpha = lr * 0.1 / (1 - 0.9 ** t)
            cfg = noisy_kfac.NoisyKFACConfig(N, eta=1.0, kl_weight=1.0, alpha=alpha, beta=beta,
                                             momentum=0.9, gamma_ex=hyper["damping"],
                                             curvature="mc", kl_clip=hyper.get("kl_clip"))
            eps = rng.standard_normal((model.D, hyper["S_train"])) if noisy else None
            S = eps.shape[1] if noisy else 1
            a, b = np.exp(q.phi)
            tau_s = rng.gamma(a, 1.0 / b, size=S) if learned else np.full(S, tau)
            z = rng.standard_normal((S, len(idx)))
            W = noisy_kfac.sample(state, eps, cfg, model) if noisy else state.mu[:, None]
            F = np.stack([model.forward(W[:, s].copy(), X[idx])[:, 0] for s in range(W.shape[1])])
            state, _ = noisy_kfac.step(state, (X[idx], y[idx]), eps, cfg, model,
                                       y_tilde=F + z / np.sqrt(tau_s)[:, None],
                                       noise_precisions=tau_s if learned else None)
            if learned:
                q, _ = noise_gamma.step(q, np.mean((y[idx][None, :] - F) ** 2), q_cfg)
        if epoch % hyper["lr_decay_every"] == 0:
            lr, beta = lr * 0.1, beta * 0.1
    return state, q


@pytest.mark.parametrize("method", ["noisy_kfac", "kfac"])
def test_kfac_fits_follow_the_documented_draws_and_schedule(method):
    spec = uci_methods.METHODS[method]
    model, X, y = _toy()
    hyper = {**spec.defaults, "S_train": 3, "noise_precision": 4.0, "lr_decay_every": 2}
    post = spec.fit(model, X, y, hyper, np.random.default_rng(1), 3, 8, lambda n: None)
    state, _ = _replay_kfac(model, X, y, hyper, np.random.default_rng(1), 3, 8,
                            noisy=method == "noisy_kfac")
    assert state.t == 15
    if method == "kfac":  # the point estimate is the mean
        assert_close(post, state.mu, EXACT_F64, "K-FAC mean")
        return
    cfg = noisy_kfac.NoisyKFACConfig(40, eta=1.0, kl_weight=1.0)
    eps = np.random.default_rng(2).standard_normal((model.D, 4))
    assert_close(post.sample(eps), noisy_kfac.sample(state, eps, cfg, model), EXACT_F64,
                 "Noisy K-FAC draws after the schedule")
    undecayed = spec.fit(model, X, y, {**hyper, "lr_decay_ratio": 1.0}, np.random.default_rng(1),
                         3, 8, lambda n: None)
    assert not np.allclose(undecayed.sample(eps), post.sample(eps))  # the decay is visible


def test_learned_noise_kfac_fit_follows_the_documented_draws_and_schedule():
    """noisy_kfac_learned_noise: kfac_train(learned=True) is the replay with tau_s ~ q drawn
    after eps, the step's per-draw precisions, and q's update at the step's residual."""
    spec = uci_methods.METHODS["noisy_kfac_learned_noise"]
    model, X, y = _toy_unit()
    hyper = {**spec.defaults, "S_train": 3, "noise_precision": 1.0, "lr_decay_every": 2}
    post = spec.fit(model, X, y, hyper, np.random.default_rng(1), 3, 8, lambda n: None)
    state, q = _replay_kfac(model, X, y, hyper, np.random.default_rng(1), 3, 8, noisy=True,
                            learned=True)
    assert state.t == 15 and q.adam.t == 15
    cfg = noisy_kfac.NoisyKFACConfig(40, eta=1.0, kl_weight=1.0)
    eps = np.random.default_rng(2).standard_normal((model.D, 4))
    assert_close(post.sample(eps), noisy_kfac.sample(state, eps, cfg, model), EXACT_F64,
                 "Noisy K-FAC draws, learned noise")
    assert_close(post.q.phi, q.phi, EXACT_F64, "q(tau) after the run")
    assert not np.allclose(q.phi, np.log([6.0, 6.0]))  # q moved


def test_learned_noise_noisy_adam_fit_follows_the_documented_draws_and_schedule():
    """noisy_adam_learned_noise: per epoch the permutation; per step eps, then tau ~ q; the step
    with tau; q's update at the residual of the step's draws; the decay of alpha and 1 - beta2
    after every lr_decay_every epochs."""
    from refbayes.methods import noisy_adam
    spec = uci_methods.METHODS["noisy_adam_learned_noise"]
    model, X, y = _toy_unit()
    hyper = {**spec.defaults, "noise_precision": 1.0, "lr_decay_every": 2, "S_train": 3}
    post = spec.fit(model, X, y, hyper, np.random.default_rng(1), 3, 8, lambda n: None)
    rng, N = np.random.default_rng(1), 40
    cfg = noisy_adam.NoisyAdamConfig(N, 1.0, alpha=0.01, beta1=0.9, beta2=0.999,
                                     squares="per_example")
    state = noisy_adam.init(model.init_theta(rng), 1.0)
    q, q_cfg = noise_gamma.init(), noise_gamma.NoiseGammaConfig(N)
    step_cfg = cfg
    for epoch in range(1, 4):
        perm = rng.permutation(N)
        for i in range(0, N, 8):
            idx = perm[i:i + 8]
            eps = rng.standard_normal((model.D, 3))
            a, b = np.exp(q.phi)
            tau = rng.gamma(a, 1.0 / b, size=3)
            state, info = noisy_adam.step(state, (X[idx], y[idx]), eps, step_cfg, model,
                                          noise_precisions=tau)
            F = np.stack([model.forward(info.w[:, s].copy(), X[idx])[:, 0] for s in range(3)])
            q, _ = noise_gamma.step(q, np.mean((y[idx][None, :] - F) ** 2), q_cfg)
        if epoch % 2 == 0:
            step_cfg = step_cfg._replace(alpha=step_cfg.alpha * 0.1,
                                         beta2=1.0 - (1.0 - step_cfg.beta2) * 0.1)
    eps = np.random.default_rng(2).standard_normal((model.D, 4))
    assert_close(post.sample(eps), noisy_adam.sample(state, eps, cfg), EXACT_F64,
                 "Noisy Adam draws, learned noise")
    assert_close(post.q.phi, q.phi, EXACT_F64, "q(tau) after the run")


def test_learned_noise_refuses_a_model_with_another_precision():
    spec = uci_methods.METHODS["noisy_adam_learned_noise"]
    model, X, y = _toy()  # noise_precision 4
    hyper = {**spec.defaults, "noise_precision": 4.0}
    with pytest.raises(ValueError, match="noise_precision 1"):
        spec.fit(model, X, y, hyper, np.random.default_rng(1), 1, 8, lambda n: None)


def test_learned_noise_prints_the_published_row_of_its_method():
    """published_as: the learned variant's row carries the published noisy_kfac figure, which is
    then not listed again as a method not run."""
    summary = {"method": "noisy_kfac_learned_noise", "splits_done": 1, "n_splits": 20,
               "budget": "full", "rmse_mean": 1.0, "rmse_se": None, "ll_mean": -1.0,
               "ll_se": None, "ll_joint_mean": -1.0, "ll_joint_se": None}
    table = uci._table("energy", [summary], uci.load_published())
    row = next(line for line in table.splitlines() if line.startswith("noisy_kfac_learned_noise"))
    assert "-1.421 +- 0.005" in row
    assert "(noisy_kfac)" not in table and "(noisy_adam)" in table


def test_bias_corrected_step_is_the_official_momentum_for_a_fixed_preconditioner():
    """kfac_step_size: with the factors frozen (T_inv beyond the run), refbayes' heavy-ball
    momentum with alpha_t = lr (1 - 0.9) / (1 - 0.9^t) is the official update
    mu <- mu - lr P(v_t / c_t), v_t = 0.9 v + 0.1 V_t, c_t = 0.9 c + 0.1 (mvg_optimizer.py)."""
    from refbayes.linalg import kron
    spec = uci_methods.METHODS["noisy_kfac"]  # no clipping, gamma_ex = 0
    model, X, y = _toy()
    hyper = {**spec.defaults, "T_inv": 10**6}
    cfg = uci_methods.kfac_config(hyper, 40)
    gamma = noisy_kfac.gamma_in(cfg)
    rng = np.random.default_rng(5)
    state = noisy_kfac.init(model.init_theta(rng), model)
    mu, v, c = state.mu.copy(), np.zeros(model.D), 0.0
    for t in range(1, 31):
        idx = rng.choice(40, 8, replace=False)
        y_tilde = rng.standard_normal((1, 8))
        step_cfg = cfg._replace(alpha=uci_methods.kfac_step_size(hyper, t, 0.01))
        state, _ = noisy_kfac.step(state, (X[idx], y[idx]), None, step_cfg, model,
                                   y_tilde=y_tilde)
        V = model.grad(mu, X[idx], y[idx]) / 8 + gamma * mu  # the official -gradient
        v, c = 0.9 * v + 0.1 * V, 0.9 * c + 0.1
        P = np.concatenate([kron.solve_factored(A, S, (v / c)[a:b].reshape(n, k), gamma).ravel()
                            for (a, b, n, k), A, S in zip(noisy_kfac.layer_slices(model),
                                                          state.A_ref, state.S_ref)])
        mu = mu - 0.01 * P
        assert_close(state.mu, mu, EXACT_F64, f"mean after step {t}")


def test_rows_match_the_data(data_dir):
    for name in uci.DATASETS:
        tt = uci.load_uci(name, 0, data_dir)
        assert len(tt.y_train) + len(tt.y_test) == uci.ROWS[name], name


def test_split_steps_is_fits_times_epochs_times_minibatches(data_dir):
    """The job cost: fits x epochs x ceil(rows / M); SLANG kin8nm (10 fits, 120 epochs, M = 10:
    984,000) starts before BBB kin8nm (M = 100: 98,400) and MC dropout yacht (one fit, 400 epochs,
    M = 32: 4,000)."""
    plans = {(m, d): uci._plan(m, d, splits=(0,), out=Path("unused"), data_dir=data_dir)
             for m, d in [("mc_dropout", "yacht"), ("bbb", "kin8nm"), ("slang", "kin8nm")]}
    assert {k: uci._split_steps(p) for k, p in plans.items()} == {
        ("mc_dropout", "yacht"): 4000, ("bbb", "kin8nm"): 98400, ("slang", "kin8nm"): 984000}


# ----------------------------------------------------------------------------- --predictions

def test_predictions_refit_repeats_the_saved_scores_draw_by_draw(data_dir, tmp_path, capsys):
    """--predictions refits each split's final fit from its file (its hyperparameters and the
    final phase's draws) and writes the per-draw test outputs; in the process that wrote the
    file the refit repeats its RMSE and LL exactly, and the arrays give them by (uci.1)-(uci.3)."""
    pred = tmp_path / "pred"
    assert _reproduce(*_quick(tmp_path / "out", data_dir, "--predictions", pred, method="bbb",
                              splits="0,1")) == 0
    stdout = capsys.readouterr().out
    S_test = uci_methods.resolve(uci_methods.BBB, DATASET, quick=True).settings["S_test"]
    for k in (0, 1):
        saved = _split_json(tmp_path / "out", "bbb", k)
        path = pred / "bbb" / DATASET / f"split_{k}.npz"
        assert f"bbb {DATASET} split {k}: refit" in stdout and "identical to the saved" in stdout
        with np.load(path, allow_pickle=False) as z:
            F, tau, m, s, y = z["F"], float(z["tau"]), float(z["y_mean"]), float(z["y_std"]), z["y_test"]
            assert F.shape == (S_test, 31) and z["X_test"].shape == (31, 6)
            assert float(z["rmse"]) == saved["test"]["rmse"] and float(z["ll"]) == saved["test"]["ll"]
            assert float(z["ll_joint"]) == saved["test"]["ll_joint"]
            assert np.mean(z["ll_point"]) == saved["test"]["ll"]
        assert tau == saved["test"]["noise_precision"] and s == saved["y_std"] and m == saved["y_mean"]
        assert_close(np.sqrt(np.mean((y - (m + s * F.mean(axis=0))) ** 2)), saved["test"]["rmse"],
                     EXACT_F64, "rmse")  # (uci.1)
        dens = norm.pdf(y[None, :], m + s * F, s / np.sqrt(tau)).mean(axis=0)  # (uci.2)
        assert_close(np.mean(np.log(dens)), saved["test"]["ll"], EXACT_F64, "ll")  # (uci.3)
    draws = [np.load(pred / "bbb" / DATASET / f"split_{k}.npz", allow_pickle=False)["F"]
             for k in (0, 1)]
    assert not np.array_equal(draws[0][:, :5], draws[1][:, :5])  # each split its own fit


def test_predictions_folder_is_checked_before_anything_runs(data_dir, tmp_path, capsys, monkeypatch):
    def never(*a, **k):
        raise AssertionError("computed before checking --predictions")

    monkeypatch.setattr(uci, "_run_split", never)
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert _reproduce(*_quick(tmp_path / "out", data_dir, "--predictions", blocker)) == 2
    assert f"--predictions: {blocker} is not a folder; nothing was computed" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_predictions_of_a_split_not_run_is_an_error(data_dir, tmp_path):
    plan = uci._plan("map", DATASET, [4], quick=True, out=tmp_path, data_dir=data_dir, epochs=1)
    with pytest.raises(FileNotFoundError, match="split_4.json: no result for split 4; run the split"):
        uci.final_predictions(plan, 4)


# ----------------------------------------------------------------------------- issue 35, item 6

def test_the_budget_column_states_epochs_m_and_s_and_a_quick_run_gets_the_caveat():
    spec = uci_methods.METHODS["slang"]
    quick = uci_methods.resolve(spec, "boston", quick=True)
    full = uci_methods.resolve(spec, "boston")
    assert uci.budget_text(quick, True).startswith(
        f"quick: 5 epochs, M = {quick.settings['M']}, S = ")
    assert "10 test draws" in uci.budget_text(quick, True)
    assert uci.budget_text(full, False).startswith("full: 120 epochs")
    published = uci.load_published()
    summary = {"method": "slang", "splits_done": 1, "n_splits": 20, "budget": "quick",
               "budget_text": uci.budget_text(quick, True), "epochs": 5, "rmse_mean": 1.0,
               "rmse_se": None, "ll_mean": -1.0, "ll_se": None}
    caveat = uci._caveat("boston", [summary], published)
    assert caveat.startswith("CAVEAT - quick run:") and "not comparable to the published" in caveat
    assert "slang: quick: 5 epochs" in caveat and "the full budget is 120 epochs" in caveat
    row = next(x for x in uci._table("boston", [summary], published).splitlines()
               if x.startswith("slang"))
    assert uci.budget_text(quick, True) in row
    # --epochs below the method's own is reduced too; the full budget is not
    assert uci._caveat("boston", [{**summary, "budget": "full", "epochs": 60}], published)
    assert uci._caveat("boston", [{**summary, "budget": "full", "epochs": 120}], published) == ""
    # nothing published beside the method: nothing to compare, no caveat
    assert uci._caveat("boston", [{**summary, "method": "kfac"}], []) == ""
