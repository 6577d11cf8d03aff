"""`refbayes reproduce calibration`: the --quick run end to end (digits, every method, both
tasks), its files checked against each other, resume and --fresh, divergence recorded, bad
options, the split, and the fit / predict contract of every registered method.

The quick run (eleven methods) took 19 s on the 2-core development machine with three other runs
loading it.
"""
import contextlib
import csv
import io
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from refbayes.cli import main
from refbayes.experiments import calibration as exp
from refbayes.experiments import calibration_methods as cm
from refbayes.methods import laplace, noisy_kfac
from refbayes.models import MLP, theta_layout

METHODS = tuple(cm.METHODS)


def _main(argv):
    o, e = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(o), contextlib.redirect_stderr(e):
        status = main(["reproduce", "calibration", *argv])
    return status, o.getvalue(), e.getvalue()


def _files(out):
    return sorted(Path(out).glob("digits/*/seed_*/*.json"))


def _mtimes(out):
    return {p: p.stat().st_mtime_ns for p in _files(out)}


@pytest.fixture(scope="module")
def quick(data_dir, tmp_path_factory):
    """One --quick run (digits, every method, both tasks, seed 0): (out, stdout, stderr, status)."""
    out = tmp_path_factory.mktemp("calibration") / "out"
    status, stdout, stderr = _main(["--quick", "--out", str(out), "--data-dir", str(data_dir)])
    return out, stdout, stderr, status


def _saved(out, task, method, seed=0):
    return json.loads((Path(out) / "digits" / task / f"seed_{seed}" / f"{method}.json").read_text())


# ----------------------------------------------------------------------------- end to end

def test_quick_run_writes_every_job_with_metrics_in_range(quick):
    out, stdout, stderr, status = quick
    assert status == 0, stderr
    n = 2 * len(METHODS)  # both tasks
    assert f"calibration: {n} run(s), 0 already done, {n} to compute" in stderr
    for task in exp.TASKS:
        for m in METHODS:
            r = _saved(out, task, m)
            assert r["status"] == "ok", (task, m, r["error"])
            s, x = r["settings"], r["metrics"]
            assert (s["method"], s["task"], s["dataset"], s["budget"]) == \
                (m, task, "digits", "quick")
            assert s["samples"] == (1 if cm.METHODS[m].point else 10)
            assert set(r["provenance"]) == {"data_sha256", "refbayes_version", "code_sha256",
                                             "git_commit"}
            assert list(r["provenance"]["data_sha256"]) == ["digits/digits.csv.gz"]
            chance = 1 / (10 if task == "main" else exp.IN_CLASSES)
            # every method learns: well above chance even on the smoke-test budget
            assert 0.8 <= x["accuracy"] <= 1 and x["accuracy"] > 3 * chance, (task, m, x)
            assert 0 < x["nll"] < math.log(10) and 0 <= x["brier"] <= 2
            assert 0 <= x["ece"] <= x["mce"] <= 1
            assert 0.5 < x["misclassification_auroc"] <= 1, (task, m, x)
            assert 0 < x["mean_confidence"] <= 1
            if task == "ood":
                assert 0.5 < x["ood_auroc"] <= 1, (m, x)
                # OOD rows are more uncertain on average than the in-distribution test rows
                assert x["ood_mean_entropy"] > x["mean_entropy"]
            else:
                assert "ood_auroc" not in x
            n = r["n"]
            assert (n["train"], n["test"]) == ((1438, 359) if task == "main" else (721, 180))
            assert n["ood"] == (0 if task == "main" else 179)


def test_reliability_curve_reproduces_the_saved_ece(quick):
    """The saved 15-bin curve and the saved ECE are the same binning:
    ECE = sum_b (n_b / n) |acc_b - conf_b| (metrics.reliability_curve vs metrics.ece)."""
    out = quick[0]
    for m in METHODS:
        r = _saved(out, "main", m)
        c = r["reliability"]
        count = np.asarray(c["count"])
        assert count.sum() == r["n"]["test"] and len(c["edges"]) == exp.N_BINS + 1
        full = count > 0
        acc = np.asarray([a for a, k in zip(c["accuracy"], count) if k], dtype=float)
        conf = np.asarray([a for a, k in zip(c["confidence"], count) if k], dtype=float)
        ece = np.sum(count[full] / count.sum() * np.abs(acc - conf))
        assert ece == pytest.approx(r["metrics"]["ece"], rel=1e-12, abs=1e-15)
        # mean confidence = count-weighted bin confidences
        assert np.sum(count[full] * conf) / count.sum() == \
            pytest.approx(r["metrics"]["mean_confidence"], rel=1e-12)


def test_summary_files_agree_with_the_job_files(quick):
    out, stdout, _, _ = quick
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert len(rows) == 2 * len(METHODS)
    for row in rows:
        r = _saved(out, row["task"], row["method"])
        for key in ("accuracy", "nll", "ece", "brier", "misclassification_auroc"):
            assert float(row[key]) == r["metrics"][key]
    table = (out / "table_digits.md").read_text()
    lines = [ln for ln in table.splitlines() if ln.startswith("| ")]
    assert lines[0].startswith("| method | accuracy | NLL | ECE (15 bins) | Brier |")
    assert [ln.split("|")[1].strip() for ln in lines[1:]] == list(METHODS)
    printed = _printed_rows(stdout)  # the printed table holds the saved one's cells
    assert list(printed) == list(METHODS)
    for ln in lines[1:]:
        cells = [c.strip() for c in ln.split("|")[1:-1]]
        assert printed[cells[0]] == cells
        main_r, ood_r = _saved(out, "main", cells[0]), _saved(out, "ood", cells[0])
        assert cells[1] == f"{main_r['metrics']['accuracy']:.4f}"
        assert cells[3] == f"{main_r['metrics']['ece']:.4f}"
        assert cells[7] == f"{ood_r['metrics']['ood_auroc']:.4f}"
    summary = json.loads((out / "summary.json").read_text())
    assert [r["method"] for r in summary["digits"]] == list(METHODS)


def _printed_rows(stdout) -> dict:
    """{method: cells} of the aligned-text table on stdout (columns split at 2+ spaces)."""
    lines = stdout.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("method  "))
    assert set(lines[head + 1].replace(" ", "")) == {"-"}  # format_table's rule line
    rows = {}
    for ln in lines[head + 2:]:
        if not ln.strip():
            break
        cells = re.split(r"\s{2,}", ln.strip())
        rows[cells[0]] = cells
    return rows


def test_stdout_is_aligned_text_and_titles_state_S_and_the_budget(quick):
    """Like every experiment: an aligned table (no Markdown pipes) whose title states the data,
    the budget (quick, epochs of the training runs) and S; the Markdown stays in the file."""
    out, stdout, _, _ = quick
    assert "| method |" not in stdout and "|---" not in stdout
    assert (out / "table_digits.md").read_text().count("| method |") == 1
    title = next(ln for ln in stdout.splitlines() if ln.startswith("digits ("))
    epochs = {cm.resolve(spec, True)["epochs"] for spec in cm.METHODS.values()}
    assert title.startswith("digits (1438 train / 359 test rows, main task): quick budget: "
                            "MLP 32-32 ReLU, ")
    assert all(f"{e} epochs" in title for e in epochs)
    point = [m for m, spec in cm.METHODS.items() if spec.point]
    assert f"S = 10 posterior draws per prediction ({', '.join(point)}: one network)" in title
    assert title.endswith("mean over 1 seed")
    assert stdout.splitlines()[stdout.splitlines().index(title) + 1].startswith("columns: ")


def test_reliability_figure_is_written(quick):
    pytest.importorskip("matplotlib")
    out, stdout, _, _ = quick
    png = out / "reliability_digits.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    assert f"figure: {png}" in stdout


def test_swa_family_shares_one_training_run(quick):
    """swa, swag-diag and swag read one SGD run: trained once (by swa), its seconds recorded by
    all three; their predictions differ (theta_SWA vs two samplers)."""
    out = quick[0]
    for task in exp.TASKS:
        r = {m: _saved(out, task, m) for m in ("swa", "swag-diag", "swag")}
        assert [r[m]["fit_reused"] for m in r] == [False, True, True]
        assert r["swa"]["seconds"]["fit"] == r["swag"]["seconds"]["fit"] == \
            r["swag-diag"]["seconds"]["fit"]
        assert r["swag"]["seconds"]["total"] == r["swag"]["seconds"]["predict"]
        assert r["swag"]["settings"]["constants"] == {"scale": 0.5, "low_rank": True}
        assert r["swag-diag"]["settings"]["constants"] == {"scale": 1.0, "low_rank": False}
        assert len({r[m]["metrics"]["nll"] for m in r}) == 3


def test_shared_fit_is_the_same_when_run_alone(quick, data_dir, tmp_path):
    """swag run on its own (no swa before it in the invocation) trains the shared run itself
    and gets exactly the numbers of the full run: the training stream is seeded by the train
    name, not by the method or the order of the jobs."""
    status, _, err = _main(["--quick", "--method", "swag", "--task", "main", "--out",
                            str(tmp_path), "--data-dir", str(data_dir)])
    assert status == 0, err
    alone = json.loads((tmp_path / "digits/main/seed_0/swag.json").read_text())
    assert alone["fit_reused"] is False
    assert alone["metrics"] == _saved(quick[0], "main", "swag")["metrics"]


# ----------------------------------------------------------------------------- resume, --fresh

def test_second_run_reuses_every_file(quick, data_dir):
    out, stdout, _, _ = quick
    before = _mtimes(out)
    assert len(before) == 2 * len(METHODS)
    status, stdout2, stderr2 = _main(["--quick", "--out", str(out), "--data-dir", str(data_dir)])
    assert status == 0, stderr2
    n = 2 * len(METHODS)
    assert f"{n} run(s), {n} already done, 0 to compute" in stderr2
    assert _mtimes(out) == before  # nothing recomputed, nothing rewritten
    assert stdout2 == stdout


def test_fresh_recomputes_what_differs_and_gets_the_same_numbers(quick, data_dir):
    """--fresh recomputes a saved job whose settings differ (here: edited) and only that one;
    the recomputed numbers are the original ones (every draw comes from the job's seeds)."""
    out = quick[0]
    target = out / "digits/main/seed_0/map.json"
    old = json.loads(target.read_text())
    edited = json.loads(target.read_text())
    edited["settings"]["seed"] = 7
    target.write_text(json.dumps(edited))
    before = _mtimes(out)
    status, _, err = _main(["--quick", "--fresh", "--out", str(out), "--data-dir", str(data_dir)])
    assert status == 0, err
    n = 2 * len(METHODS)
    assert f"{n} run(s), {n - 1} already done, 1 to compute" in err
    after = _mtimes(out)
    assert after[target] != before[target]
    assert {p: t for p, t in after.items() if p != target} == \
        {p: t for p, t in before.items() if p != target}
    new = json.loads(target.read_text())
    assert new["metrics"] == old["metrics"] and new["settings"] == old["settings"]


def test_other_settings_stop_the_run_unless_fresh(data_dir, tmp_path):
    out = tmp_path / "o"
    argv = ["--quick", "--method", "map", "--task", "main", "--out", str(out), "--data-dir",
            str(data_dir)]
    assert _main(argv)[0] == 0
    path = out / "digits/main/seed_0/map.json"
    before = path.stat().st_mtime_ns
    # --samples does not enter a point estimate's settings: still reused
    status, _, err = _main([*argv, "--samples", "3"])
    assert status == 0 and "1 already done" in err and path.stat().st_mtime_ns == before
    # a saved run with another budget: refused, naming the file, what differs and the remedy
    saved = json.loads(path.read_text())
    saved["settings"]["settings"]["lr"] = 0.5
    path.write_text(json.dumps(saved))
    status, _, err = _main(argv)
    assert status == 2
    assert str(path) in err and "other settings (differs in settings)" in err and "--fresh" in err
    status, _, err = _main([*argv, "--fresh"])
    assert status == 0, err
    assert json.loads(path.read_text())["settings"]["settings"]["lr"] == \
        cm.resolve(cm.METHODS["map"], quick=True)["lr"]


def test_damaged_result_file_is_named(quick, data_dir, tmp_path):
    out = tmp_path / "o"
    argv = ["--quick", "--method", "map", "--task", "main", "--out", str(out), "--data-dir",
            str(data_dir)]
    assert _main(argv)[0] == 0
    path = out / "digits/main/seed_0/map.json"
    path.write_text('{"settings": ')
    status, _, err = _main(argv)
    assert status == 2 and str(path) in err and "not valid JSON" in err


# ----------------------------------------------------------------------------- divergence

def _blowup(spec, **over):
    return spec._replace(defaults={**spec.defaults, **over}, quick={**spec.quick, **over})


def test_diverging_runs_are_recorded_not_raised(data_dir, tmp_path, monkeypatch):
    """SGD with a huge step overflows: map, and the shared SWA run behind swa and swag, are
    saved as "diverged" with the driver's message (the shared failure is not retried), shown
    so in the table, and the run exits 0."""
    huge = {"map": _blowup(cm.METHODS["map"], lr=1e8), "swa": _blowup(cm.METHODS["swa"], lr=1e8),
            "swag": _blowup(cm.METHODS["swag"], lr=1e8), "bbb": cm.METHODS["bbb"]}
    monkeypatch.setattr(cm, "METHODS", huge)
    status, stdout, err = _main(["--quick", "--task", "main", "--out", str(tmp_path),
                                 "--data-dir", str(data_dir)])
    assert status == 0, err
    for m in ("map", "swa", "swag"):
        r = json.loads((tmp_path / f"digits/main/seed_0/{m}.json").read_text())
        assert r["status"] == "diverged" and r["metrics"] == {}
        assert r["error"].startswith("training: step ") and "epoch 1" in r["error"]
        assert f"note: {m} digits main seed 0 diverged" in err
    assert json.loads((tmp_path / "digits/main/seed_0/swag.json").read_text())["fit_reused"]
    assert json.loads((tmp_path / "digits/main/seed_0/bbb.json").read_text())["status"] == "ok"
    rows = {m: " ".join(cells) for m, cells in _printed_rows(stdout).items()}
    assert "diverged" in rows["map"] and "diverged" in rows["swag"]
    assert "diverged" not in rows["bbb"]
    # a recorded divergence is a result: resumed, not retried
    before = _mtimes(tmp_path)
    assert _main(["--quick", "--task", "main", "--out", str(tmp_path), "--data-dir",
                  str(data_dir)])[0] == 0
    assert _mtimes(tmp_path) == before


# ----------------------------------------------------------------------------- bad options

@pytest.mark.parametrize("argv, message", [
    (["--method", "nosuch"], "unknown method 'nosuch'; expected one of map, swa"),
    (["--method", "map,sgd"], "unknown method 'sgd'"),
    (["--dataset", "cifar"], "unknown dataset 'cifar'; expected one of mnist-5k, digits"),
    # names of `refbayes data` that are not benchmarks here: refused with the reason
    (["--dataset", "fashion-mnist"], "'fashion-mnist' is the out-of-distribution set of "
                                     "--dataset mnist"),
    (["--dataset", "digits,cifar10"], "'cifar10' needs a convolutional network"),
    (["--task", "main,other"], "unknown task 'other'"),
    (["--seeds", "0"], "expected an integer >= 1, got '0'"),
    (["--samples", "-3"], "expected an integer >= 1"),
])
def test_bad_options_are_refused_with_the_reason(argv, message, tmp_path):
    status, _, err = _main([*argv, "--out", str(tmp_path)])
    assert status == 2
    assert message in err
    assert not any(tmp_path.iterdir())  # nothing computed or written


def test_missing_data_is_a_clear_error(no_data_env, tmp_path):
    status, _, err = _main(["--quick", "--out", str(tmp_path / "o"), "--data-dir",
                            str(tmp_path / "nodata")])
    assert status == 2 and "digits" in err and "refbayes data fetch" in err
    assert not (tmp_path / "o").exists()


def test_list_arguments_are_parsed_in_registry_order():
    parse = exp._names("method", METHODS)
    assert parse("vogn,map") == ("map", "vogn")
    assert parse("all") == METHODS
    assert exp._names("dataset", exp.DATASETS)("digits,mnist-5k,digits") == ("mnist-5k", "digits")


# ----------------------------------------------------------------------------- split and tasks

def test_split_is_stratified_disjoint_and_seeded():
    y = np.repeat(np.arange(10), np.arange(20, 30))  # 20..29 rows per class, sorted like MNIST
    tr, te = exp.stratified_split(y, 0.2, exp._split_rng(0, "mnist-5k"))
    assert np.intersect1d(tr, te).size == 0
    assert np.array_equal(np.sort(np.concatenate([tr, te])), np.arange(y.size))
    assert np.all(np.diff(tr) > 0) and np.all(np.diff(te) > 0)
    for c in range(10):
        n_c = np.sum(y == c)
        assert np.sum(y[te] == c) == round(0.2 * n_c)
    again = exp.stratified_split(y, 0.2, exp._split_rng(0, "mnist-5k"))
    assert np.array_equal(again[0], tr) and np.array_equal(again[1], te)
    other = exp.stratified_split(y, 0.2, exp._split_rng(1, "mnist-5k"))
    assert not np.array_equal(other[1], te)
    other = exp.stratified_split(y, 0.2, exp._split_rng(0, "digits"))
    assert not np.array_equal(other[1], te)


@pytest.mark.parametrize("bad, message", [(0.0, "test_frac"), (1.0, "test_frac")])
def test_split_rejects_bad_fractions(bad, message):
    with pytest.raises(ValueError, match=message):
        exp.stratified_split(np.arange(10) % 2, bad, np.random.default_rng(0))


def test_split_of_the_staged_sets(data_dir):
    for d, n_test in (("mnist-5k", 1000), ("digits", 359)):
        X, y, identity = exp.load_data(d, data_dir)
        tr, te = exp.stratified_split(y, exp.TEST_FRAC, exp._split_rng(0, d))
        assert te.size == n_test and tr.size + te.size == y.size
        assert np.array_equal(np.bincount(y[te]), np.round(0.2 * np.bincount(y)))  # stratified
        assert X.dtype == np.float64 and y.dtype == np.int64 and 0 <= X.min() and X.max() <= 1
        assert len(identity) == 1


def test_ood_task_holds_out_the_upper_digits():
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(10), 10)
    X = rng.standard_normal((100, 3))
    tr, te = exp.stratified_split(y, 0.2, rng)
    td = exp.task_data(X, y, tr, te, "ood")
    assert td.n_classes == 5
    assert set(td.y_train) == set(range(5)) and set(td.y_test) == set(range(5))
    assert td.X_train.shape == (40, 3) and td.X_test.shape == (10, 3) and td.X_ood.shape == (10, 3)
    assert np.array_equal(td.X_ood, X[te[y[te] >= 5]])
    main_td = exp.task_data(X, y, tr, te, "main")
    assert main_td.X_ood is None and main_td.n_classes == 10 and main_td.X_train.shape == (80, 3)
    with pytest.raises(ValueError, match="task: expected one of main, ood"):
        exp.task_data(X, y, tr, te, "other")


# ----------------------------------------------------------------------------- the registry

def _blobs(n=90, C=3, p=4, seed=0):
    rng = np.random.default_rng(seed)
    y = np.arange(n) % C
    X = 0.3 * rng.standard_normal((n, p)) + 2.0 * np.eye(C, p)[y]
    return X, y.astype(np.int64)


@pytest.mark.parametrize("name", METHODS)
def test_registered_method_fit_predict_contract(name):
    """fit draws only from its rng and reports every epoch; predict returns (n, C) rows of
    probabilities, a deterministic function of its rng; a point estimate ignores S and rng, a
    sampled one does not."""
    spec = cm.METHODS[name]
    X, y = _blobs()
    model = MLP([4, 8, 8, 3], "relu", "categorical")
    hyper = {**cm.resolve(spec, quick=True), "epochs": 6, "M": 32, "prior_precision": 0.05}
    if "swa_epochs" in hyper:
        hyper["swa_epochs"] = 3
    calls = []
    post = spec.fit(model, X, y, hyper, np.random.default_rng(3), calls.append)
    assert calls == [1] * hyper["epochs"]
    again = spec.fit(model, X, y, hyper, np.random.default_rng(3), lambda k: None)

    def probs(post, seed, S=4):
        return spec.predict(post, model, X, np.random.default_rng(seed), S)

    P = probs(post, 0)
    assert P.shape == (90, 3) and np.all(np.isfinite(P)) and np.all(P >= 0)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(P, probs(again, 0))  # training is a function of its rng
    np.testing.assert_array_equal(P, probs(post, 0))
    if spec.point:
        np.testing.assert_array_equal(P, probs(post, 1, S=1))
    else:
        assert not np.array_equal(P, probs(post, 1))
        assert not np.array_equal(P, probs(post, 0, S=1))
    assert spec.description and spec.name == name
    assert set(spec.quick) <= set(spec.defaults)


def test_bma_probs_averages_softmax_outputs():
    model = MLP([2, 3, 2], "relu", "categorical")
    rng = np.random.default_rng(0)
    thetas = rng.standard_normal((model.D, 3))
    X = rng.standard_normal((5, 2))
    want = np.mean([model.predict(thetas[:, s].copy(), X) for s in range(3)], axis=0)
    np.testing.assert_allclose(cm.bma_probs(model, thetas, X), want, rtol=1e-14, atol=0)


def test_resolve_checks_the_budget():
    spec = cm.METHODS["map"]
    assert cm.resolve(spec)["epochs"] == spec.defaults["epochs"]
    assert cm.resolve(spec, quick=True)["epochs"] == spec.quick["epochs"]
    with pytest.raises(ValueError, match="map: epochs must be an integer >= 1, got 0"):
        cm.resolve(spec._replace(quick={"epochs": 0}), quick=True)


def test_swa_needs_epochs_before_collecting():
    spec = cm.METHODS["swa"]
    X, y = _blobs()
    model = MLP([4, 8, 8, 3], "relu", "categorical")
    hyper = {**cm.resolve(spec, quick=True), "epochs": 3, "swa_epochs": 3, "prior_precision": 1.0}
    with pytest.raises(ValueError, match="swa_epochs: expected fewer than epochs"):
        spec.fit(model, X, y, hyper, np.random.default_rng(0), lambda k: None)


def test_dataset_names_are_refbayes_data_names_and_keep_their_seeds(data_dir):
    """mnist-5k and digits are `refbayes data`'s names for the files each loads; the rename from
    'mnist' kept the dataset's index, which seeds its split (results stay bit-identical); full
    MNIST ('mnist') is appended (tests/experiments/test_calibration_full.py)."""
    from refbayes.datasets import get_dataset
    assert exp.DATASETS[:2] == ("mnist-5k", "digits")
    for d in exp.DEFAULT_DATASETS:
        _, _, identity = exp.load_data(d, data_dir)
        assert set(identity) == {f.path for f in get_dataset(d).files}
    assert exp._split_rng(0, "mnist-5k").integers(1 << 62) == \
        exp.job_rng(0, 0, 0).integers(1 << 62)
    with pytest.raises(ValueError, match="'fashion-mnist' is the out-of-distribution set"):
        exp.load_data("fashion-mnist", data_dir)


# ----------------------------------------------------------------------------- issue 36: Laplace,
# k-tied Normal, Noisy K-FAC

NEW = ("laplace-kron", "laplace-ll", "ktied", "noisy-kfac")
LAPLACE = {"laplace-kron": ("kron", "all"), "laplace-ll": ("full", "last_layer")}


def _tiny_fit(name, lam=0.05, seed=3):
    """(spec, model, X, y, hyper, posterior): ``name`` fitted on _blobs for 6 epochs of M = 32."""
    spec = cm.METHODS[name]
    X, y = _blobs()
    model = MLP([4, 8, 8, 3], "relu", "categorical")
    hyper = {**cm.resolve(spec, quick=True), "epochs": 6, "M": 32, "prior_precision": lam}
    return spec, model, X, y, hyper, spec.fit(model, X, y, hyper, np.random.default_rng(seed),
                                              lambda k: None)


@pytest.mark.parametrize("name", NEW)
def test_new_method_predicts_probabilities_deterministically(name):
    """predict: (n, C) rows of probabilities summing to 1; the same rng gives the same numbers,
    bit for bit, and another rng other numbers (a sampled predictive over S draws)."""
    spec, model, X, y, _, post = _tiny_fit(name)
    P = spec.predict(post, model, X, np.random.default_rng(7), 5)
    assert P.shape == (X.shape[0], 3) and np.all(P >= 0) and not spec.point
    np.testing.assert_allclose(P.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(P, spec.predict(post, model, X, np.random.default_rng(7), 5))
    assert not np.array_equal(P, spec.predict(post, model, X, np.random.default_rng(8), 5))
    assert np.mean(P.argmax(axis=1) == y) > 0.6  # it learned something in 6 epochs


@pytest.mark.parametrize("name", sorted(LAPLACE))
def test_laplace_methods_share_the_map_training_run(name):
    """One SGD run serves map and both Laplace methods: the same train name, settings and fit,
    so the runner's cache key and training generator are map's."""
    spec, m = cm.METHODS[name], cm.METHODS["map"]
    assert spec.train == "map" and (m.train or m.name) == "map"
    assert spec.fit is m.fit
    for quick in (False, True):
        assert cm.resolve(spec, quick) == cm.resolve(m, quick)
    structure, subset = LAPLACE[name]
    assert dict(spec.constants)["structure"] == structure
    assert dict(spec.constants)["subset"] == subset and dict(spec.constants)["curvature"] == "ggn"


@pytest.mark.parametrize("name", sorted(LAPLACE))
def test_laplace_predictive_is_the_glm_predictive_at_the_map(name):
    """The posterior is map's SGD endpoint (same rng: same theta, and map predicts with it);
    predict is the GLM predictive of laplace.fit at that theta (GGN, lam, the spec's structure
    and subset): with the same eps, the BMA of laplace.linearized_outputs at
    laplace.sample's draws (to rounding), and, with many draws, laplace.glm_class_predictive's
    Monte Carlo link (to Monte Carlo error)."""
    spec, model, X, y, _, post = _tiny_fit(name)
    _, _, _, _, _, mpost = _tiny_fit("map")
    np.testing.assert_array_equal(post.theta, mpost.theta)
    np.testing.assert_array_equal(cm.METHODS["map"].predict(mpost, model, X, None, 1),
                                  cm.bma_probs(model, post.theta[:, None], X))
    structure, subset = LAPLACE[name]
    cfg = laplace.LaplaceConfig(prior_precision=0.05, structure=structure, curvature="ggn",
                                subset=subset)
    state = laplace.fit(model, post.theta, X, y, cfg, check_stationary=False)
    S = 7
    eps = np.random.default_rng(11).standard_normal((model.D - state.n_fixed, S))
    F = laplace.linearized_outputs(model, post.theta, laplace.sample(state, eps), X)
    want = np.mean(np.exp(F - np.log(np.sum(np.exp(F), axis=2, keepdims=True))), axis=0)
    got = spec.predict(post, model, X, np.random.default_rng(11), S)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-13)
    assert (subset == "last_layer") == (state.n_fixed > 0)
    # the Monte Carlo GLM predictive in logit space, independent draws: the same expectation
    many = spec.predict(post, model, X, np.random.default_rng(12), 4000)
    glm = laplace.glm_class_predictive(model, state, X, link="mc",
                                       eps=np.random.default_rng(13).standard_normal((3, 20000)))
    np.testing.assert_allclose(many, glm.probs, rtol=0, atol=0.03)


def test_ktied_posterior_has_rank_k_tied_standard_deviations():
    """The k-tied posterior: each layer's weight standard deviations form a matrix of rank
    <= k = 2 (ktied.1); the predictive is the BMA over draws of that Gaussian."""
    spec, model, X, _, hyper, post = _tiny_fit("ktied")
    assert hyper["k"] == 2 and hyper["sigma_init"] == cm.resolve(cm.METHODS["bbb"], True)[
        "sigma_init"]
    mu = post.sample(np.zeros((model.D, 1)))[:, 0]
    sigma = post.sample(np.ones((model.D, 1)))[:, 0] - mu
    assert np.all(sigma > 0)
    lay = theta_layout(model.sizes, model.bias)
    for l, (m, n) in enumerate(zip(model.sizes[:-1], model.sizes[1:])):
        A = sigma[lay.w_off[l]:lay.w_off[l] + m * n].reshape(m, n)
        s = np.linalg.svd(A, compute_uv=False)
        assert s[2] < 1e-10 * s[0]  # rank <= 2
        assert s[1] > 1e-8 * s[0]   # the jittered start broke the symmetry: rank 2, not 1
    eps = np.random.default_rng(4).standard_normal((model.D, 6))
    np.testing.assert_array_equal(spec.predict(post, model, X, np.random.default_rng(4), 6),
                                  cm.bma_probs(model, post.sample(eps), X))


def test_noisy_kfac_config_maps_the_shared_prior_and_the_official_damping():
    """eta is the prior VARIANCE 1 / lam of the shared prior; the mean's preconditioner is damped
    by gamma_in + gamma_ex = the official damping 1e-3; kl_clip, beta, momentum as set."""
    hyper = {**cm.resolve(cm.METHODS["noisy-kfac"]), "prior_precision": 0.7185}
    cfg = cm.kfac_config(hyper, 1437)
    assert cfg.eta == pytest.approx(1 / 0.7185) and cfg.kl_weight == 1.0
    assert noisy_kfac.gamma_in(cfg) == pytest.approx(0.7185 / 1437)
    assert noisy_kfac.gamma_in(cfg) + cfg.gamma_ex == pytest.approx(1e-3)
    assert (cfg.alpha, cfg.beta, cfg.momentum, cfg.kl_clip) == (1e-2, 1e-2, 0.9, 1e-3)
    assert (cfg.damping, cfg.curvature, cfg.T_stats, cfg.T_inv) == ("factored", "ggn", 1, 10)
    # a prior stronger than the damping: no extrinsic damping, never negative
    assert cm.kfac_config({**hyper, "prior_precision": 10.0}, 1000).gamma_ex == 0.0


def test_noisy_kfac_fit_follows_the_documented_draws():
    """The fit's draws, replayed by hand: mu_0, then per epoch the permutation and per step eps
    (D, 1); the posterior samples noisy_kfac's matrix-variate normal of the final state."""
    _, model, X, y, hyper, post = _tiny_fit("noisy-kfac")
    rng = np.random.default_rng(3)
    cfg = cm.kfac_config(hyper, X.shape[0])
    state = noisy_kfac.init(model.init_theta(rng), model)
    for _ in range(hyper["epochs"]):
        perm = rng.permutation(X.shape[0])
        for k in range(0, X.shape[0], hyper["M"]):
            idx = perm[k:k + hyper["M"]]
            eps = rng.standard_normal((model.D, 1))
            state, _ = noisy_kfac.step(state, noisy_kfac.Batch(X[idx], y[idx]), eps, cfg, model)
    E = np.random.default_rng(5).standard_normal((model.D, 3))
    np.testing.assert_allclose(post.sample(E), noisy_kfac.sample(state, E, cfg, model),
                               rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("structure, subset", [("kron", "all"), ("full", "last_layer")])
def test_laplace_state_over_row_chunks_is_laplace_fit(structure, subset):
    """laplace_state sums the curvature over chunks of rows (here 16 of 90, the last one short):
    the state of laplace.fit on all rows, to rounding."""
    _, model, X, y, _, post = _tiny_fit("map")
    cfg = laplace.LaplaceConfig(prior_precision=0.05, structure=structure, curvature="ggn",
                                subset=subset)
    want = laplace.fit(model, post.theta, X, y, cfg, check_stationary=False)
    got = cm.laplace_state(model, post.theta, X, y, cfg, rows=16)
    assert got.n_fixed == want.n_fixed
    np.testing.assert_array_equal(got.mu, want.mu)
    np.testing.assert_array_equal(got.prior_prec, want.prior_prec)
    if structure == "kron":
        for g, w in zip(got.kron, want.kron, strict=True):
            np.testing.assert_allclose(g.A, w.A, rtol=1e-12, atol=1e-14)
            np.testing.assert_allclose(g.B, w.B, rtol=1e-12, atol=1e-14)
    else:
        np.testing.assert_allclose(got.Sigma_inv, want.Sigma_inv, rtol=1e-12, atol=1e-14)
    eps = np.random.default_rng(2).standard_normal((model.D - want.n_fixed, 3))
    np.testing.assert_allclose(laplace.sample(got, eps), laplace.sample(want, eps), rtol=1e-10,
                               atol=1e-12)


# ----------------------------------------------------------------------------- issue 36: the
# evidence-tuned Laplace methods

TUNED = {"laplace-kron-ev": "laplace-kron", "laplace-ll-ev": "laplace-ll"}


@pytest.mark.parametrize("name", sorted(TUNED))
def test_evidence_tuned_laplace_maximises_the_evidence_over_the_prior(name):
    """laplace-*-ev: map's training run, the same curvature as its untuned twin, and the scalar
    prior precision delta* at which the Laplace evidence (laplace.6) of that curvature is
    largest: log Z at delta* beats a grid of 41 values over 1e-4..1e4 (to 1e-6 relative); its
    predictive is the untuned one refitted at delta* (same eps); report() records delta*."""
    spec, model, X, y, _, post = _tiny_fit(name)
    twin = cm.METHODS[TUNED[name]]
    assert spec.train == "map" and spec.fit is twin.fit
    assert cm.resolve(spec, False) == cm.resolve(twin, False)
    structure, subset = LAPLACE[TUNED[name]]
    found = spec.report(post, model)
    delta = found["prior_precision"]
    assert found["converged"] and delta > 0 and delta != 0.05
    assert abs(found["dlogZ_dlog_prior_precision"]) < 1e-6 * model.D  # stationary (laplace.11)

    def lml(d):
        cfg = laplace.LaplaceConfig(prior_precision=d, structure=structure, curvature="ggn",
                                    subset=subset)
        st = cm.laplace_state(model, post.theta, X, y, cfg)
        return laplace.log_marginal_likelihood(model, st, X, y, cfg)

    best = max(lml(d) for d in 10.0 ** np.linspace(-4, 4, 41))
    assert found["log_marglik"] >= best - 1e-6 * abs(best)
    np.testing.assert_allclose(found["log_marglik"], lml(delta), rtol=1e-10)
    # the predictive is the twin's at delta*: same draws of eps, to rounding
    S = 5
    got = spec.predict(post, model, X, np.random.default_rng(4), S)
    tuned_post = post._replace(lam=delta, laplace={})
    want = twin.predict(tuned_post, model, X, np.random.default_rng(4), S)
    np.testing.assert_allclose(got, want, rtol=1e-8, atol=1e-12)
    assert not np.allclose(got, twin.predict(post, model, X, np.random.default_rng(4), S))
