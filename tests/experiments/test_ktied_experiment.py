"""`refbayes reproduce ktied` end to end on a tiny budget (MNIST 5k subset, 784-8-8-10, 40
steps): files, tables, parameter counts, resume from a saved run and from a checkpoint (bit for
bit the uninterrupted run), the refusal of a run with other settings, and bad arguments.

The tiny run and the interrupted one take ~30 s together on an idle 2-core machine: slow."""
import contextlib
import io
import json

import numpy as np
import pytest

from refbayes.cli import main
from refbayes.experiments import ktied as exp
from refbayes.methods import ktied
from refbayes.models import MLP

TINY = ["--hidden", "8,8", "--steps", "40", "--n-train", "500", "--batch", "50",
        "--eval-every", "20", "--snr-steps", "20,40", "--snr-draws", "4", "--final-draws", "3",
        "--checkpoint-every", "15", "--no-progress"]


def _run(argv):
    o, e = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(o), contextlib.redirect_stderr(e):
        status = main(["reproduce", "ktied", *argv])
    return status, o.getvalue(), e.getvalue()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, data_dir):
    out = tmp_path_factory.mktemp("ktied") / "out"
    status, stdout, stderr = _run([*TINY, "--data-dir", str(data_dir), "--out", str(out)])
    return out, status, stdout, stderr


def _saved(out, name):
    return json.loads((out / f"run_{name}.json").read_text())


@pytest.mark.slow
def test_tiny_run_writes_runs_tables_and_figures(tiny):
    out, status, stdout, stderr = tiny
    assert status == 0, stderr
    model = MLP([784, 8, 8, 10], likelihood="categorical")
    for name, k in (("meanfield", None), ("k1", 1), ("k2", 2), ("k3", 3)):
        saved = _saved(out, name)
        assert saved["settings"]["run"] == name and saved["settings"]["steps"] == 40
        assert saved["n_params"] == ktied.n_variational_params(model, k)
        assert [c["step"] for c in saved["curve"]] == [0, 20, 40]
        assert sorted({r["step"] for r in saved["snr"]}) == [20, 40]
        assert {(r["layer"], r["kind"]) for r in saved["snr"]} == {
            (l, kind) for l in (1, 2, 3) for kind in ("scale", "mean")}
        assert 0 <= saved["final"]["accuracy"] <= 1 and saved["final"]["nll"] > 0
        assert not (out / f"{name}.ckpt.npz").exists()
        assert isinstance(saved["cpu_seconds"], float) and 0 < saved["cpu_seconds"]
        assert 0 < saved["seconds"]
    posthoc = json.loads((out / "posthoc.json").read_text())
    for sp in posthoc["spectra"]:
        assert abs(sum(sp["A"]) - 1) < 1e-12 and abs(sum(sp["M"]) - 1) < 1e-12
    assert [r["k"] for r in posthoc["truncation"]] == [1, 2, 3]
    for name in ("trained.csv", "curves.csv", "snr.csv", "truncation.csv"):
        assert (out / name).read_text().count("\n") >= 4
    for name in ("spectra.png", "heatmap_A.png", "elbo_vs_step.png", "snr.png"):
        assert (out / name).stat().st_size > 5_000
    assert "post-hoc rank-k truncation" in stdout and "paper (full MNIST): -ELBO" in stdout
    assert "0.501 / 0.133 / 96.8 / 957" in stdout  # the paper's row printed beside


@pytest.mark.slow
def test_saved_runs_are_reused_and_the_tables_reprinted(tiny, data_dir):
    out, _, stdout, _ = tiny
    status, again, stderr = _run([*TINY, "--data-dir", str(data_dir), "--out", str(out)])
    assert status == 0, stderr
    assert again.split("results:")[0] == stdout.split("results:")[0]


@pytest.mark.slow
def test_a_run_with_other_settings_is_refused_without_fresh(tiny, data_dir):
    out = tiny[0]
    argv = [*TINY, "--lr", "0.002", "--data-dir", str(data_dir), "--out", str(out)]
    status, _, stderr = _run(argv)
    assert status == 2
    assert "run_meanfield.json holds a run with other settings (differs in lr)" in stderr
    assert "--fresh" in stderr


@pytest.mark.slow
def test_an_interrupted_run_resumes_from_its_checkpoint_bit_for_bit(tiny, data_dir, tmp_path,
                                                                    monkeypatch):
    """Stop the k2 run right after its first checkpoint (step 15, between two evaluations, so
    the minibatch -ELBOs since the last one must be saved too), rerun: the result equals the
    uninterrupted run's exactly (the draws depend on (seed, step) only)."""
    out = tmp_path / "out"
    original = exp._save_checkpoint

    def save_then_stop(*a, **kw):
        original(*a, **kw)
        raise KeyboardInterrupt

    monkeypatch.setattr(exp, "_save_checkpoint", save_then_stop)
    argv = [*TINY, "--runs", "2", "--data-dir", str(data_dir), "--out", str(out)]
    status, _, stderr = _run(argv)
    assert status == 130
    assert stderr.endswith(f"refbayes: interrupted; 0 of 1 result(s) saved under {out} (0 by this "
                           "run); k2 checkpointed at step 15; to resume, run the same command "
                           "again: saved results that match are reused (without --fresh)\n")
    assert (out / "k2.ckpt.npz").exists() and not (out / "run_k2.json").exists()
    monkeypatch.setattr(exp, "_save_checkpoint", original)
    status, _, stderr = _run([a for a in argv if a != "--no-progress"])
    assert status == 0, stderr
    assert "ktied: 1 run(s), resuming k2 from step 15\n" in stderr
    assert "0 already done" not in stderr
    resumed, whole = _saved(out, "k2"), _saved(tiny[0], "k2")
    for key in ("final", "curve", "snr", "settings"):
        assert resumed[key] == whole[key], key
    assert 0 < resumed["cpu_seconds"]  # carried across the resume, like the wall seconds
    with np.load(out / "posterior_k2.npz") as a, np.load(tiny[0] / "posterior_k2.npz") as b:
        assert np.array_equal(a["sigma"], b["sigma"]) and np.array_equal(a["mu"], b["mu"])


@pytest.mark.parametrize("argv, message", [
    (["--runs", "meanfield,x"], "expected meanfield, ranks k >= 1"),
    (["--runs", "1,1"], "expected each run once"),
    (["--hidden", "8,0"], "expected comma-separated integers >= 1"),
    (["--lr", "-1"], "expected a finite number > 0"),
])
def test_bad_arguments_are_named(argv, message, capsys):
    assert main(["reproduce", "ktied", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--snr-draws", "1"], "--snr-draws: expected >= 2"),
    (["--batch", "600", "--n-train", "500"], "--batch: expected <= --n-train = 500"),
    (["--n-train", "4995"], "--n-train: expected 10..4990"),
])
def test_inconsistent_budgets_are_named(argv, message, data_dir, tmp_path, capsys):
    status = main(["reproduce", "ktied", *argv, "--data-dir", str(data_dir),
                   "--out", str(tmp_path)])
    assert status == 2
    assert message in capsys.readouterr().err


def test_full_mnist_without_its_files_names_the_fetch(tmp_path, capsys):
    status = main(["reproduce", "ktied", "--mnist", "full", "--data-dir", str(tmp_path),
                   "--out", str(tmp_path / "out"), "--no-progress"])
    assert status == 2
    err = capsys.readouterr().err
    assert "mnist-full/" in err and "refbayes data fetch mnist" in err


def test_the_split_is_stratified_and_disjoint():
    y = np.repeat(np.arange(10), 500)
    tr, te = exp.split(y, 4000, np.random.default_rng(0))
    assert len(tr) == 4000 and len(te) == 1000 and not set(tr) & set(te)
    assert np.all(np.bincount(y[tr]) == 400)


def test_the_training_table_always_shows_the_final_step():
    # --quick evaluates every 100 of 600 steps: the table stopped at step 300 (issue 35, item 6)
    assert exp._curve_marks([0, 100, 200, 300, 400, 500, 600]) == [100, 200, 300, 600]
    assert exp._curve_marks([0, 1000, 5000, 9000, 10000]) == [1000, 5000, 9000, 10000]
    assert exp._curve_marks([0, 1000, 5000, 9000]) == [1000, 5000, 9000]
    assert exp._curve_marks([0, 20, 40]) == [20, 40]
    assert exp._curve_marks([]) == []


# ----------------------------------------------------------------------------- issue 35, item 6

def _record(name, budget, curve):
    final = {"neg_elbo": curve[-1][1], "neg_elbo_se": 0.01, "nll": 0.2, "nll_se": 0.02,
             "accuracy": 0.94, "accuracy_se": 0.01, "kl": 1.0}
    return {"settings": {"run": name, "seed": 0, **budget}, "final": final, "n_params": 957_000,
            "curve": [{"step": t, "neg_elbo": v, "nll": 0.2, "accuracy": 0.9,
                       "minibatch_neg_elbo": None} for t, v in curve],
            "snr": [], "seconds": 1.0}


QUICK_CURVE = [(0, 300.0), (100, 292.3), (200, 281.7), (300, 271.0), (400, 260.0), (500, 249.5),
               (600, 239.0)]  # a --quick run's mean-field -ELBO / N (seed 0): still falling


def test_quick_table_states_s_and_budget_and_the_caveat_and_flags_the_falling_curve():
    budget = dict(exp.QUICK, hidden=(400, 400))
    saved = {"meanfield": _record("meanfield", budget, QUICK_CURVE)}
    table = exp._tables(saved, None, budget, quick=True)
    head, caveat = table.splitlines()[:2]
    assert "600 steps of Adam (0.001, M = 128), S = 1 draw per step" in head
    assert "2 draws every 100 steps and 10 draws at the end" in head
    assert caveat.startswith("CAVEAT - quick run: S = 1, 600 steps, the MNIST 5k subset")
    assert "not comparable to the paper's figures" in caveat and "600 of our default 10000" in caveat
    assert "full (mean field) (not converged)" in table and "0.501 / 0.133" in table
    assert "not converged: full (mean field): -ELBO / N (whole training set) went 249.5 -> 239" in table


def test_a_levelled_run_at_the_full_budget_on_full_mnist_has_neither_caveat_nor_flag():
    budget = dict(exp.DEFAULTS, mnist="full", n_train=60_000)
    curve = [(t, 0.5 + 50.0 * np.exp(-t / 500.0)) for t in range(0, 10_001, 250)]
    saved = {"meanfield": _record("meanfield", budget, curve)}
    table = exp._tables(saved, None, budget)
    assert "CAVEAT" not in table and "not converged" not in table
    assert exp._convergence(saved["meanfield"], 10_000)["converged"] is True
    # the same, on the 5k subset: the default run is still not the paper's data
    budget = dict(exp.DEFAULTS)
    table = exp._tables({"meanfield": _record("meanfield", budget, curve)}, None, budget)
    assert table.splitlines()[1].startswith("CAVEAT - reduced-budget run:")


def test_figures_state_the_budget_and_mark_an_unconverged_curve(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    figs = []
    monkeypatch.setattr(exp, "save_figure", lambda fig, path, **kw: figs.append(fig))
    budget = dict(exp.QUICK, hidden=(400, 400))
    level = [(t, 0.5 + 10.0 * np.exp(-t / 30.0)) for t, _ in QUICK_CURVE]
    saved = {"meanfield": _record("meanfield", budget, QUICK_CURVE),
             "k1": _record("k1", budget, level)}
    exp._figures(tmp_path, saved, None)
    elbo = figs[0].axes[0]
    assert "600 steps of Adam (0.001, M = 128), S = 1 draw per step" in elbo.get_title()
    labels = [t.get_text() for t in elbo.get_legend().get_texts()]
    assert labels == ["full (mean field) (not converged)", "k-tied, k = 1"]


# ----------------------------------------------------------------------------- CPU seconds

@pytest.mark.slow
def test_trained_csv_has_cpu_seconds_and_older_runs_still_load(tiny, data_dir, tmp_path):
    """A run saved before cpu_seconds was recorded is reused and gets an empty cell; a
    cpu_seconds that is not a number is refused, naming the key."""
    import shutil
    out = tmp_path / "out"
    shutil.copytree(tiny[0], out)
    header, *rows = (out / "trained.csv").read_text().splitlines()
    assert header.endswith(",n_params,seconds,cpu_seconds")
    cells = {r.split(",")[0]: r.split(",")[-1] for r in rows}
    assert float(cells["k2"]) == _saved(out, "k2")["cpu_seconds"]

    def edit(change):
        path = out / "run_k2.json"
        saved = json.loads(path.read_text())
        change(saved)
        path.write_text(json.dumps(saved))

    edit(lambda s: s.pop("cpu_seconds"))
    status, _, stderr = _run([*TINY, "--data-dir", str(data_dir), "--out", str(out)])
    assert status == 0, stderr
    rows = (out / "trained.csv").read_text().splitlines()[1:]
    assert [r for r in rows if r.startswith("k2,")][0].endswith(",")
    edit(lambda s: s.update(cpu_seconds="1 s"))
    status, _, stderr = _run([*TINY, "--data-dir", str(data_dir), "--out", str(out)])
    assert status == 2 and "cpu_seconds: expected a number, got a JSON string" in stderr
