"""`refbayes reproduce cifar10-lenet` on --quick (256 train / 200 test CIFAR-10 images, LeNet-5):
every row runs one tiny epoch (the Laplace rows: a fit at adam's theta) and writes its files; a
run interrupted at a checkpoint resumes to the uninterrupted run's numbers bit for bit; bad
arguments; the scores on a hand example; the pass over the training set after training (and
--score-train, which adds it to jobs saved without it); the plan line's float32 figures against
the committed runs' CPU time (reproductions/cifar10-lenet). The rows of issue 36's second list
(swag's job, the Laplace rows, ktied): tests/experiments/test_cifar10_lenet_rows.py.

Skips without the staged cifar10 data (CI has it). About 40 s on the loaded 2-core VM."""
import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest

from refbayes.backend import cupy_available
from refbayes.cli import main
from refbayes.experiments import cifar10_lenet as exp
from refbayes.models.conv import lenet5

QUICK = ["--quick", "--no-progress"]


def _run(argv):
    o, e = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(o), contextlib.redirect_stderr(e):
        status = main(["reproduce", "cifar10-lenet", *argv])
    return status, o.getvalue(), e.getvalue()




@pytest.fixture(scope="module")
def quick_all(tmp_path_factory, cifar_dir):
    out = tmp_path_factory.mktemp("c10") / "out"
    return (out, cifar_dir,
            *_run([*QUICK, "--methods", "all", "--data-dir", str(cifar_dir), "--out", str(out)]))


@pytest.mark.slow
def test_every_row_runs_one_tiny_epoch_and_writes_its_files(quick_all):
    out, data, status, stdout, stderr = quick_all
    assert status == 0, stderr
    for name in exp._shown(exp.ROWS):  # swag's job adds swa and swag-diag
        rec = json.loads((out / name / "seed_0.json").read_text())
        posthoc, extra = name in exp.POSTHOC, name in exp.SWAG_EXTRA
        assert rec["settings"]["epochs"] == (0 if posthoc else 1)
        assert rec["settings"]["n_train"] == 256
        assert [c["epoch"] for c in rec["curve"]] == ([] if posthoc or extra else [1])
        f = rec["final"]
        assert 0 <= f["acc"] <= 1 and f["nll"] > 0 and 0 <= f["ece15"] <= 1
        assert 0 <= f["auroc_entropy"] <= 1
        assert f["train_acc"] is None if posthoc else 0 <= f["train_acc"] <= 1
        assert f.get("train_pass_acc") is None if posthoc else 0 <= f["train_pass_acc"] <= 1
        assert sum(rec["reliability"]["count"]) == 200
        assert (out / name / "seed_0.curve.csv").exists() == (not extra)  # swag's is the job's
        assert np.load(out / "predictions" / f"{name}_seed_0.npz")["probs"].shape == (200, 10)
        assert not (out / "checkpoints" / f"{name}_seed_0.ckpt.npz").exists()
        assert (out / "states" / f"{name}_seed_0.npz").exists() == (name in exp.ROWS
                                                                   and not posthoc)
        assert name in stdout
    assert "CAVEAT" in stdout and "71.98" in stdout
    assert (out / "summary.csv").exists() and not (out / "summary.partial.csv").exists()
    for png in ("reliability.png", "curves.png"):
        assert (out / png).stat().st_size > 0 and f"figure: {out / png}" in stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] is True
    for r in summary["rows"]:  # every job of this run recorded both clocks
        assert r["wall_hours"] > 0 and r["cpu_hours"] > 0, r["method"]
    assert "  wall h  CPU h  " in (out / "table.md").read_text()
    # a second call reuses every saved job: nothing is computed
    status, stdout2, stderr2 = _run([*QUICK, "--methods", "adam", "--out", str(out),
                                     "--data-dir", str(data)])
    assert status == 0, stderr2
    assert stdout2.count("adam") >= 1 and "vogn" not in stdout2


class _Stop(Exception):
    pass


@pytest.mark.slow
def test_an_interrupted_run_resumes_to_the_same_numbers(tmp_path, cifar_dir, monkeypatch):
    argv = [*QUICK, "--methods", "vogn,mc-dropout,noisy-kfac", "--epochs", "2",
            "--eval-every", "1", "--data-dir", str(cifar_dir)]
    status, _, err = _run([*argv, "--out", str(tmp_path / "a")])
    assert status == 0, err
    save = exp._save_checkpoint
    calls = []

    def stopping(path, state, meta):  # save, then stop the run after the third checkpoint
        save(path, state, meta)
        calls.append(path)
        if len(calls) == 3:
            raise _Stop

    monkeypatch.setattr(exp, "_save_checkpoint", stopping)
    with pytest.raises(_Stop):
        _run([*argv, "--out", str(tmp_path / "b")])
    monkeypatch.setattr(exp, "_save_checkpoint", save)
    meta = json.loads(str(np.load(calls[-1])["meta"]))
    assert (meta["epoch"], meta["step"]) == (1, 1)  # vogn mid-epoch 2 (2 steps, ckpt every 1)
    status, _, err = _run([*argv, "--out", str(tmp_path / "b")])
    assert status == 0, err
    for name in ("vogn", "mc-dropout", "noisy-kfac"):
        a, b = (json.loads((tmp_path / d / name / "seed_0.json").read_text()) for d in "ab")
        strip = lambda c: [{k: v for k, v in r.items() if k != "seconds"} for r in c]
        assert strip(a["curve"]) == strip(b["curve"])
        assert a["final"] == b["final"]
        # both clocks are recorded, by the resumed run too (carried across the resume)
        for r in (a, b):
            assert r["cpu_seconds"] > 0 and r["seconds"] > 0
        pa, pb = (np.load(tmp_path / d / "predictions" / f"{name}_seed_0.npz")["probs"]
                  for d in "ab")
        np.testing.assert_array_equal(pa, pb)


@pytest.mark.parametrize("argv, words", [
    (["--methods", "sgd"], "expected rows of"),
    (["--methods", "swa"], "rows of the swag job"),
    (["--methods", "laplace"], "expected rows of"),
    (["--methods", "adam,adam"], "each row once"),
    (["--epochs", "0"], "expected an integer >= 1"),
    (["--eval-every", "-1"], "expected an integer >= 1"),
])
def test_bad_arguments_name_what_was_expected(argv, words, capsys):
    assert main(["reproduce", "cifar10-lenet", *argv]) == 2
    assert words in capsys.readouterr().err


def test_make_method_refuses_an_unknown_row():
    with pytest.raises(ValueError, match="method: expected one of"):
        exp.make_method("sgd", lenet5(), np.zeros(lenet5().D), 10)


def test_scores_on_a_hand_example():
    # 4 test points: confidences 0.9 (right), 0.6 (wrong), 0.8 (right), 0.55 (wrong)
    P = np.array([[0.9, 0.1], [0.6, 0.4], [0.2, 0.8], [0.45, 0.55]])
    y = np.array([0, 1, 1, 0])
    s = exp._scores(P, y)
    assert s["acc"] == 0.5
    assert s["nll"] == pytest.approx(-np.mean(np.log([0.9, 0.4, 0.8, 0.45])), abs=1e-15)
    # 10 bins: 0.9 -> bin 9, 0.6 -> 6, 0.8 -> 8, 0.55 -> 5, one point each: |acc - conf| / 4
    assert s["ece10"] == pytest.approx((0.1 + 0.6 + 0.2 + 0.55) / 4, abs=1e-15)
    # max-probability AUROC: correct scores {0.9, 0.8} above both wrong {0.6, 0.55}: 1
    assert s["auroc_maxprob"] == 1.0
    H = [-(p * np.log(p) + (1 - p) * np.log(1 - p)) for p in (0.9, 0.6, 0.8, 0.55)]
    assert min(-H[0], -H[2]) > max(-H[1], -H[3]) and s["auroc_entropy"] == 1.0


@pytest.mark.gpu
@pytest.mark.slow
def test_the_cupy_backend_runs_every_row_and_matches_numpy(tmp_path, cifar_dir):
    """--backend cupy (the stand-in in CI, a GPU in tools/device_check.py): every row end to end,
    the same draws as NumPy, so the same predictions up to float32 rounding."""
    if not cupy_available():
        pytest.skip("CuPy with a CUDA device is not available")
    outs = {}
    for backend in ("numpy", "cupy"):
        outs[backend] = tmp_path / backend
        status, _, err = _run([*QUICK, "--methods", "all", "--backend", backend, "--data-dir",
                               str(cifar_dir), "--out", str(outs[backend])])
        assert status == 0, err
    for name in exp._shown(exp.ROWS):
        rec = json.loads((outs["cupy"] / name / "seed_0.json").read_text())
        assert rec["settings"].get("backend") == (None if name in exp.POSTHOC else "cupy")
        pn, pc = (np.load(outs[b] / "predictions" / f"{name}_seed_0.npz")["probs"]
                  for b in ("numpy", "cupy"))
        np.testing.assert_allclose(pc, pn, rtol=0, atol=2e-3)


def test_the_plan_counts_a_resumed_jobs_remaining_steps_only():
    budget = {"dtype": "float32", "n_train": 50000, "n_test": 10000, "test_draws": 10,
              "eval_every": 10, "backend": "numpy", "checkpoint_steps": 100, "epochs": None}
    unit = exp._runner.Unit(("vogn", 0), None, exp.SCHEMA, exp._settings("vogn", 0, budget), {})
    full = exp._job_seconds(unit.settings, budget) / 3600
    assert f"about {full:.2f} CPU-hours" in exp._plan_line([unit], budget, {})
    K = 391  # ceil(50,000 / 128) steps per epoch
    line = exp._plan_line([unit], budget, {"vogn seed 0": 105 * K})  # half of 210 epochs done
    assert f"about {full / 2:.2f} CPU-hours" in line and "1 resumed" in line


def test_a_float64_plan_states_how_the_float32_runs_compared_with_the_timing_tool():
    budget = {"dtype": "float64", "n_train": 50000, "n_test": 10000, "test_draws": 10,
              "eval_every": 10, "backend": "numpy", "checkpoint_steps": 100, "epochs": None}
    unit = exp._runner.Unit(("adam", 0), None, exp.SCHEMA, exp._settings("adam", 0, budget), {})
    assert exp.RUNS_OVER_TOOL[0] < exp.RUNS_OVER_TOOL[1]
    lo, hi = exp.RUNS_OVER_TOOL
    assert f"took {lo:.2f}-{hi:.2f}x of that tool's" in exp._plan_line([unit], budget, {})


COMMITTED = Path(__file__).resolve().parents[2] / "reproductions" / "cifar10-lenet"


def test_the_float32_plan_is_the_committed_runs_cpu_time_per_epoch():
    """SECONDS_PER_EPOCH["float32"] is, per trained row, the mean of measured_seconds_per_epoch
    over its committed jobs that recorded CPU time, to the 0.1 s it is written in. A newly
    committed job moves its row's mean: update the figure with it."""
    measured = {}
    for path in sorted(COMMITTED.glob("*/seed_*.json")):
        rec = json.loads(path.read_text())
        s = rec["settings"]
        if s["method"] not in exp.SECONDS_PER_EPOCH["float32"] or rec.get("cpu_seconds") is None:
            continue  # a further row of the swag job (its CPU time is swag's), a Laplace row,
            # or a job from before the CPU clock
        measured.setdefault(s["method"], []).append(exp.measured_seconds_per_epoch(rec))
    assert set(measured) == set(exp.SECONDS_PER_EPOCH["float32"])
    for name, values in measured.items():
        assert exp.SECONDS_PER_EPOCH["float32"][name] == round(sum(values) / len(values), 1), name


def test_measured_seconds_per_epoch_inverts_the_plan_and_refuses_what_it_cannot_read():
    budget = {"dtype": "float32", "n_train": 25000, "n_test": 10000, "test_draws": 10,
              "eval_every": 10, "backend": "numpy", "checkpoint_steps": 100, "epochs": 20}
    s = exp._settings("mc-dropout", 0, budget)
    rec = {"settings": s, "cpu_seconds": exp._job_seconds(s, budget)}
    per_epoch = exp.measured_seconds_per_epoch(rec)
    assert abs(per_epoch - exp.SECONDS_PER_EPOCH["float32"]["mc-dropout"]) < 1e-9
    with pytest.raises(ValueError, match="no cpu_seconds"):
        exp.measured_seconds_per_epoch({"settings": s})
    with pytest.raises(ValueError, match="post-hoc"):
        exp.measured_seconds_per_epoch({"settings": exp._settings("laplace-ll", 0, budget),
                                        "cpu_seconds": 1.0})


def test_the_posthoc_plan_is_the_committed_runs_cpu_time():
    """POSTHOC_SECONDS and POSTHOC_SECONDS_PER_DRAW are, per Laplace row, the means of
    measured_posthoc_seconds over its committed jobs that recorded CPU time, to the 0.1 s they
    are written in."""
    measured = {}
    for name in exp.POSTHOC:
        for path in sorted((COMMITTED / name).glob("seed_*.json")):
            rec = json.loads(path.read_text())
            if rec.get("cpu_seconds") is not None:
                measured.setdefault(name, []).append(exp.measured_posthoc_seconds(rec))
    assert set(measured) == set(exp.POSTHOC_SECONDS) == set(exp.POSTHOC_SECONDS_PER_DRAW)
    for name, pairs in measured.items():
        fit, per_draw = (sum(v) / len(v) for v in zip(*pairs))
        assert exp.POSTHOC_SECONDS[name] == round(fit, 1), name
        assert exp.POSTHOC_SECONDS_PER_DRAW[name] == round(per_draw, 1), name


@pytest.mark.parametrize("fit_cpu", [True, False])
def test_measured_posthoc_seconds_inverts_the_plan_and_refuses_what_it_cannot_read(fit_cpu):
    """At half the rows and a fifth of the test set, the plan's CPU seconds of a Laplace job,
    split as the plan splits them, come back as the constants; without fit_cpu_seconds the
    fit's share of the wall clock (here the same as of the CPU clock) stands in for it."""
    budget = {"dtype": "float32", "n_train": 25000, "n_test": 2000, "test_draws": 4,
              "eval_every": 10, "backend": "numpy", "checkpoint_steps": 100, "epochs": None}
    s = exp._settings("laplace-kron", 0, budget)
    cpu = exp._job_seconds(s, budget)
    fit = exp.POSTHOC_SECONDS["laplace-kron"] / 2
    rec = {"settings": s, "cpu_seconds": cpu, "fit_seconds": 3 * fit, "seconds": 3 * cpu}
    if fit_cpu:
        rec = rec | {"fit_cpu_seconds": fit, "fit_seconds": 1.0}  # the wall share unused
    got_fit, got_draw = exp.measured_posthoc_seconds(rec)
    assert abs(got_fit - exp.POSTHOC_SECONDS["laplace-kron"]) < 1e-9
    assert abs(got_draw - exp.POSTHOC_SECONDS_PER_DRAW["laplace-kron"]) < 1e-9
    with pytest.raises(ValueError, match="no cpu_seconds"):
        exp.measured_posthoc_seconds({"settings": s})
    with pytest.raises(ValueError, match="trained row"):
        exp.measured_posthoc_seconds({"settings": exp._settings("adam", 0, budget),
                                      "cpu_seconds": 1.0})


def _job_record(seed, acc, seconds, cpu_seconds=None):
    settings = {"epochs": 210, "paper_epochs": 210, "test_draws": 10, "dtype": "float32",
                "n_train": 50000, "n_test": 10000}
    final = {k: 0.5 for k in exp.SUMMARY_KEYS} | {"acc": acc}
    rec = {"settings": settings, "final": final, "seconds": seconds}
    return rec if cpu_seconds is None else rec | {"cpu_seconds": cpu_seconds}


def test_cpu_hours_cover_the_seeds_that_recorded_them_and_say_so():
    """A row whose seed-0 job predates the CPU clock: wall h sums every seed, CPU h the two that
    recorded it, and the cell names them; a row with none shows '-', one with all a bare figure."""
    saved = {("adam", 0): _job_record(0, 0.66, 3600.0),
             ("adam", 1): _job_record(1, 0.67, 3600.0, 1800.0),
             ("adam", 2): _job_record(2, 0.68, 7200.0, 3600.0),
             ("bbb", 0): _job_record(0, 0.68, 3600.0),
             ("vogn", 0): _job_record(0, 0.66, 3600.0, 2700.0)}
    rows = {r["method"]: r for r in exp._summary(saved, ("adam", "bbb", "vogn"))}
    assert rows["adam"]["wall_hours"] == 4.0
    assert rows["adam"]["cpu_hours"] == 1.5 and rows["adam"]["cpu_seeds"] == 2
    assert rows["bbb"]["cpu_hours"] is None and rows["bbb"]["cpu_seeds"] == 0
    assert abs(rows["adam"]["acc"] - 0.67) < 1e-15
    assert abs(rows["adam"]["acc_se"] - 0.01 / 3 ** 0.5) < 1e-15
    cells = {r: exp._cpu_cell(rows[r]) for r in rows}
    assert cells == {"adam": "1.50 (2 of 3 seeds)", "bbb": "-", "vogn": "0.75"}
    lines = exp._table(list(rows.values()), True).splitlines()
    line = next(l for l in lines if l.startswith("adam "))
    assert line.split()[1] == "3" and "  4.00  " in line and "  1.50 (2 of 3 seeds)  " in line


@pytest.mark.slow
def test_a_saved_job_whose_cpu_seconds_is_not_a_number_is_refused(quick_all, tmp_path):
    import shutil
    out, data = tmp_path / "out", quick_all[1]
    shutil.copytree(quick_all[0], out)
    path = out / "adam" / "seed_0.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | {"cpu_seconds": "1 s"}))
    status, _, stderr = _run([*QUICK, "--methods", "adam", "--out", str(out),
                              "--data-dir", str(data)])
    assert status == 2 and "cpu_seconds: expected a number, got a JSON string" in stderr


def test_a_saved_only_table_names_the_jobs_it_lacks_per_row():
    rows = exp._summary({("adam", 0): _job_record(0, 0.66, 3600.0),
                         ("adam", 1): _job_record(1, 0.68, 3600.0)}, ("adam",))
    missing = (("adam", 2), ("vogn", 0), ("vogn", 2))
    head = exp._table(rows, False, missing).splitlines()[1]
    assert head == ("SAVED JOBS ONLY - each row over the seeds saved; "
                    "not saved: adam seed 2; vogn seeds 0, 2")
    assert "PARTIAL" not in exp._table(rows, False, missing)
    assert "PARTIAL" in exp._table(rows, False) and "SAVED" not in exp._table(rows, True)


@pytest.mark.slow
def test_saved_only_trains_nothing_and_tables_the_seeds_saved(quick_all, tmp_path):
    import shutil
    out, data = tmp_path / "out", quick_all[1]
    shutil.copytree(quick_all[0], out)
    before = sorted(p.relative_to(out) for p in out.rglob("seed_*"))
    status, stdout, stderr = _run([*QUICK, "--methods", "adam,vogn", "--seeds", "2", "--saved-only",
                                   "--out", str(out), "--data-dir", str(data)])
    assert status == 0, stderr
    assert sorted(p.relative_to(out) for p in out.rglob("seed_*")) == before  # nothing trained
    assert not (out / "checkpoints").exists() or not any((out / "checkpoints").iterdir())
    assert "not saved: adam seed 1; vogn seed 1" in stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] is False and summary["not_saved"] == [["adam", 1], ["vogn", 1]]
    assert [(r["method"], r["seeds"]) for r in summary["rows"]] == [("adam", 1), ("vogn", 1)]
    assert (out / "summary.csv").exists() and not (out / "summary.partial.csv").exists()


@pytest.mark.parametrize("extra, words", [
    (["--fresh"], "--fresh: --saved-only trains nothing"),
    ([], "--out: expected saved jobs of --methods adam (seed 0, these settings)"),
])
def test_saved_only_refuses_fresh_and_an_out_without_saved_jobs(extra, words, tmp_path, cifar_dir):
    status, _, stderr = _run([*QUICK, "--methods", "adam", "--saved-only", *extra,
                              "--out", str(tmp_path / "none"), "--data-dir", str(cifar_dir)])
    assert status == 2 and words in stderr


@pytest.mark.slow
def test_the_train_pass_is_the_final_predictive_on_the_training_images(quick_all):
    out, data = quick_all[0], quick_all[1]
    d = exp._load(data, "float32", True, 256, 200)
    net = lenet5()
    with np.load(out / "states" / "adam_seed_0.npz") as z:  # adam's predictive: softmax at theta
        theta = z["state.theta"]
    F = net.forward(theta, d.X).astype(np.float64)
    P = np.exp(F - F.max(axis=1, keepdims=True))
    P /= P.sum(axis=1, keepdims=True)
    f = json.loads((out / "adam" / "seed_0.json").read_text())["final"]
    assert f["train_pass_acc"] == np.mean(np.argmax(P, axis=1) == d.y)
    np.testing.assert_allclose(f["train_pass_nll"], -np.mean(np.log(P[np.arange(256), d.y])),
                               rtol=1e-5)
    assert "train acc % pass" in (out / "table.md").read_text()


def _strip_pass(path):
    """Remove the train pass from a saved job's result, as a job saved before it was made."""
    rec = json.loads(path.read_text())
    for final in (rec["final"], *(sub["final"] for sub in rec.get("rows", {}).values())):
        del final["train_pass_acc"], final["train_pass_nll"]
    path.write_text(json.dumps(rec))


@pytest.mark.slow
def test_score_train_adds_the_pass_a_job_trained_now_records(quick_all, tmp_path):
    import shutil
    out, data = tmp_path / "out", quick_all[1]
    shutil.copytree(quick_all[0], out)
    want = {n: json.loads((out / n / "seed_0.json").read_text())["final"]
            for n in ("vogn", "swa", "swag-diag", "swag")}
    for n in ("vogn", "swag", "mc-dropout"):
        _strip_pass(out / n / "seed_0.json")
    (out / "states" / "mc-dropout_seed_0.npz").unlink()  # its pass cannot be computed
    argv = [*QUICK[:1], "--methods", "vogn,swag,mc-dropout", "--saved-only", "--out", str(out),
            "--data-dir", str(data)]
    status, stdout, stderr = _run([*argv, "--score-train"])
    assert status == 0, stderr
    for n in ("vogn", "swa", "swag-diag", "swag"):  # the same stream, draws and predictive
        rec = json.loads((out / n / "seed_0.json").read_text())
        assert rec["final"] == want[n], n
        assert rec["train_pass_provenance"]["code_sha256"]
    assert "vogn seed 0: train pass" in stderr and "so no train pass: mc-dropout seed 0" in stderr
    rec = json.loads((out / "mc-dropout" / "seed_0.json").read_text())
    assert "train_pass_acc" not in rec["final"] and "train_pass_provenance" not in rec
    line = next(l for l in stdout.splitlines() if l.startswith("mc-dropout "))
    assert line.split()[4] == "-"  # the pass column of the unscored row
    # a state that is not the saved result's final state is refused, naming both
    _strip_pass(out / "vogn" / "seed_0.json")
    shutil.copy(out / "states" / "swag_seed_0.npz", out / "states" / "vogn_seed_0.npz")
    status, _, stderr = _run([*argv, "--score-train"])
    assert status == 2 and "is not the final state of the saved result" in stderr
    assert "vogn_seed_0.npz" in stderr


def test_score_train_needs_saved_only(tmp_path, cifar_dir):
    status, _, stderr = _run([*QUICK, "--methods", "adam", "--score-train", "--out",
                              str(tmp_path / "o"), "--data-dir", str(cifar_dir)])
    assert status == 2 and "--score-train: expected with --saved-only" in stderr
