"""`refbayes reproduce slang-logreg` end to end at tiny budgets."""
import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import refbayes
from refbayes.cli import main
from refbayes.experiments import _runner, slang_logreg

ORDERED = ("mf-exact", "slang-1", "slang-10", "full-exact")


def _reproduce(*args, env=None):
    return subprocess.run([sys.executable, "-m", "refbayes.cli", "reproduce", "slang-logreg", *args],
                          capture_output=True, text=True, env=env, timeout=600)


def _env(data_dir=None):
    env = dict(os.environ)
    if data_dir is not None:
        env["REFBAYES_DATA"] = str(data_dir)
    return env


def test_australian_kl_ordering_and_resume(data_dir, tmp_path):
    """The paper's ordering of the symmetric KL to exact VI, mean-field > SLANG L=1 > SLANG L=10 >
    full Gaussian, on the staged australian data. At 20 epochs (2 restarts) the gaps are an order
    of magnitude or more except SLANG-10 vs full-exact (a factor ~2, measured 7.0e2 vs 3.7e2):
    the ordering comes from the covariance structure, not from convergence."""
    out = tmp_path / "out"
    args = ["--dataset", "australian", "--epochs", "20", "--restarts", "2",
            "--methods", ",".join(ORDERED), "--out", str(out)]
    first = _reproduce(*args, env=_env(data_dir))
    assert first.returncode == 0, first.stderr
    rows = json.loads((out / "australian_summary.json").read_text())
    kl = {m: np.mean([r["kl"] for r in rows if r["method"] == m]) for m in ORDERED}
    assert kl["mf-exact"] > kl["slang-1"] > kl["slang-10"] > kl["full-exact"] > 0, kl
    for r in range(2):
        for m in ORDERED:
            saved = json.loads((out / "australian" / f"restart_{r}" / f"{m}.json").read_text())
            assert saved["exact_vi"]["grad_norm"] <= 1e-10
            assert saved["curve"][-1][0] == 20
    assert (out / "australian_covariances.png").stat().st_size > 0
    assert (out / "australian_convergence.png").stat().st_size > 0
    assert "1.946e+03 +- 2.1e+02" in first.stdout  # the paper's mean-field "Exact" row
    mtimes = {p: p.stat().st_mtime_ns for p in (out / "australian").rglob("*.json")}
    second = _reproduce(*args, env=_env(data_dir))
    assert second.returncode == 0, second.stderr
    assert {p: p.stat().st_mtime_ns for p in (out / "australian").rglob("*.json")} == mtimes
    assert second.stdout == first.stdout
    changed = _reproduce(*[a if a != "20" else "21" for a in args], env=_env(data_dir))
    assert changed.returncode == 2 and "holds a run with other settings" in changed.stderr


def test_table_sets_the_papers_rows_beside_ours():
    """PAPER_TABLE1 beside each row: the paper's L-BFGS "Exact" optima beside exact-vi and
    exact-mf-vi, nothing beside our natural-gradient mf-exact and full-exact runs, a1a's single
    split without a spread, and no paper column for a dataset it does not hold."""
    rows = [{"method": m, "nll": 0.3 + r / 100, "kl": 10.0 * (r + 1)}
            for m in (*slang_logreg.METHODS, *slang_logreg.REFERENCE_ROWS) for r in range(2)]
    cells = lambda table: {line.split()[0]: line.split() for line in table.splitlines()[2:]}  # noqa: E731
    bc = cells(slang_logreg._table("breast-cancer", rows, slang_logreg.METHODS))
    assert bc["exact-mf-vi"][-6:] == ["0.0937", "+-", "0.0024", "7.771e+00", "+-", "1.2e-01"]
    assert bc["exact-vi"][-6:] == ["0.0912", "+-", "0.0023", "0.000e+00", "+-", "0.0e+00"]
    assert bc["slang-5"][-6:] == ["0.0919", "+-", "0.0023", "8.418e-01", "+-", "2.4e-02"]
    assert bc["mf-exact"][-2:] == bc["full-exact"][-2:] == ["-", "-"]
    assert bc["slang-5"][1:7] == ["0.3050", "+-", "0.0050", "1.500e+01", "+-", "5.0e+00"]
    a1a = cells(slang_logreg._table("a1a", rows, slang_logreg.METHODS))
    assert a1a["slang-10"][-6:] == ["0.3386", "+-", "—", "1.179e+01", "+-", "—"]
    usps = cells(slang_logreg._table("usps-3vs5", rows, slang_logreg.METHODS))
    assert all(line[-2:] == ["-", "-"] for line in usps.values())


def test_synthetic_default_runs_on_shipped_data(tmp_path):
    out = tmp_path / "syn"
    res = _reproduce("--epochs", "3", "--restarts", "2", "--methods", "mf-ef,slang-2,full-hess",
                     "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert "synthetic: 3 epochs, 2 restart(s)" in res.stdout
    lines = (out / "synthetic_summary.csv").read_text().splitlines()
    assert lines[0].startswith("dataset,restart,method")
    assert len(lines) == 1 + 2 * 5  # 3 methods + exact VI + exact mean-field VI per restart


@pytest.mark.parametrize("args, match", [
    (["--methods", "slang-3"], "expected a comma-separated subset"),
    (["--epochs", "0"], "expected an integer >= 1"),
    (["--dataset", "mnist"], "invalid choice"),
])
def test_bad_arguments_exit_2(args, match, tmp_path):
    res = _reproduce(*args, "--out", str(tmp_path))
    assert res.returncode == 2
    assert match in res.stderr


def test_missing_data_is_a_clear_error(no_data_env):
    res = _reproduce("--dataset", "breast-cancer", "--epochs", "1", "--out",
                     str(no_data_env / "o"), env=dict(os.environ))
    assert res.returncode == 2
    assert res.stderr.startswith("refbayes: error: dataset 'breast-cancer': file not found")
    assert "Traceback" not in res.stderr


def test_budget_follows_the_protocol():
    ns = lambda **kw: type("A", (), dict(quick=False, epochs=None, restarts=None) | kw)  # noqa: E731
    assert slang_logreg._budget(ns(), "australian") == (10_000, 20)
    assert slang_logreg._budget(ns(), "a1a") == (10_000, 1)
    assert slang_logreg._budget(ns(quick=True), "australian") == slang_logreg.QUICK
    assert slang_logreg._budget(ns(restarts=7), "a1a")[1] == 1


def test_job_costs_cover_every_run_and_start_the_longest_first():
    """Every dataset x method has a measured cost; at the paper's budget the launch order of all
    four datasets' runs starts with usps-3vs5's SLANG runs and ends with the exact mean-field
    optima; a cost scales with the epochs."""
    for name in slang_logreg.DATASETS:
        assert set(slang_logreg.RUN_SECONDS_PER_1000_EPOCHS[name]) == set(slang_logreg.METHODS)
    names = ("australian", "breast-cancer", "a1a", "usps-3vs5")
    jobs = [_runner.Job(f"{n}/{m}", None, (), slang_logreg._job_cost(n, m, 10_000))
            for n in names for m in (*slang_logreg.METHODS, "exact-mf-vi")]
    order = [job.key for job in _runner.launch_order(jobs)]
    assert order[:4] == ["usps-3vs5/slang-5", "usps-3vs5/slang-10", "usps-3vs5/slang-2",
                         "usps-3vs5/slang-1"]
    assert set(order[-4:]) == {f"{n}/exact-mf-vi" for n in names}
    assert slang_logreg._job_cost("a1a", "mf-ef", 1000) * 10 == slang_logreg._job_cost(
        "a1a", "mf-ef", 10_000)


def test_parallel_runs_carry_their_costs(no_figures, tmp_path, monkeypatch):
    """The jobs handed to the parallel runner carry _job_cost of their dataset, method and epochs."""
    seen = {}

    class Captured(Exception):
        pass

    def capture(jobs, done, **kwargs):
        seen.update({job.key: job.cost for job in jobs})
        raise Captured  # nothing is run

    monkeypatch.setattr(_runner, "run_jobs", capture)
    with pytest.raises(Captured):
        main(_syn(tmp_path / "out", "--jobs", "2", methods="mf-ef,slang-1"))
    assert seen == {f"synthetic/restart_0/{m}": slang_logreg._job_cost("synthetic", m, 2)
                    for m in ("mf-ef", "slang-1", "exact-mf-vi")}


def test_exact_vi_fit_is_stored_once_per_restart(no_figures, tmp_path, capsys):
    """A restart's exact VI mu and Sigma go to its exact-vi.json (the exact_vi.fit_full
    optimum of its data), not into every run's file, which keeps the scalars."""
    out = tmp_path / "out"
    assert main(_syn(out, methods="mf-ef,full-ef", restarts="2")) == 0
    for r in range(2):
        folder = out / "synthetic" / f"restart_{r}"
        exact = json.loads((folder / "exact-vi.json").read_text())
        with _runner.thread_limit(1):  # the command's BLAS threads (--threads 1)
            fit = slang_logreg._restart_data("synthetic", r, 0, None)[2]
        np.testing.assert_array_equal(exact["Sigma"], fit.Sigma)
        np.testing.assert_array_equal(exact["mu"], fit.mu)
        assert exact["settings"]["method"] == "exact-vi"
        for m in ("mf-ef", "full-ef"):
            run = json.loads((folder / f"{m}.json").read_text())
            assert run["exact_vi"] == {k: exact[k] for k in ("nll", "grad_norm", "n_iter")}


def test_runs_written_with_the_exact_fit_inside_still_load(tmp_path, capsys):
    """Files of the earlier layout (exact mu and Sigma inside every run's file, no
    exact-vi.json) are reused as they are: the same table, no run recomputed; the missing
    exact-vi.json is refitted and written, equal to the copies inside the runs."""
    out = tmp_path / "out"
    assert main(_syn(out, methods="mf-ef,full-ef")) == 0
    table = capsys.readouterr().out
    folder = out / "synthetic" / "restart_0"
    exact_file = folder / "exact-vi.json"
    exact = json.loads(exact_file.read_text())
    for m in ("mf-ef", "full-ef"):
        path = folder / f"{m}.json"
        run = json.loads(path.read_text())
        run["exact_vi"].update(mu=exact["mu"], Sigma=exact["Sigma"])
        path.write_text(json.dumps(run))
    exact_file.unlink()
    stamps = {p: p.stat().st_mtime_ns for p in folder.glob("*.json")}
    assert main(_syn(out, methods="mf-ef,full-ef")) == 0
    assert capsys.readouterr().out == table
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps  # every run reused
    assert json.loads(exact_file.read_text()) == exact


def test_a_restart_with_only_its_exact_fit_missing_refits_it(no_figures, tmp_path, capsys):
    """Every run reusable, exact-vi.json deleted: one exact fit is computed, the runs are not."""
    out = tmp_path / "out"
    assert main(_syn(out)) == 0
    exact_file = out / "synthetic" / "restart_0" / "exact-vi.json"
    exact = exact_file.read_text()
    exact_file.unlink()
    assert main(_syn(out)) == 0
    assert exact_file.read_text() == exact
    assert "0 to compute" in capsys.readouterr().err


# ----------------------------------------------------------------------------- provenance, damage, progress, --out

@pytest.fixture
def no_figures(monkeypatch):
    """Skip drawing the figures (about a second per run) where a test is not about them."""
    monkeypatch.setattr(slang_logreg, "_figures", lambda *args: [])


def _syn(out, *extra, methods="mf-ef", restarts="1", epochs="2"):
    return ["reproduce", "slang-logreg", "--epochs", epochs, "--restarts", restarts,
            "--methods", methods, "--out", str(out), *extra]


def test_table_lists_methods_in_the_summarys_order_whatever_the_methods_order(no_figures, tmp_path,
                                                                             capsys):
    # --methods may list the methods in any order; the printed table lists the rows in the
    # summary files' order: METHODS, then exact VI, then exact mean-field VI.
    out = tmp_path / "out"
    assert main(_syn(out, methods="full-hess,slang-2,mf-ef")) == 0
    table = [line.split()[0] for line in capsys.readouterr().out.splitlines()
             if line.split() and line.split()[0] in (*slang_logreg.METHODS, "exact-mf-vi", "exact-vi")]
    assert table == ["mf-ef", "slang-2", "full-hess", "exact-vi", "exact-mf-vi"]
    rows = json.loads((out / "synthetic_summary.json").read_text())
    assert [r["method"] for r in rows] == table


def test_results_record_data_checksums_version_and_commit(no_figures, data_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["reproduce", "slang-logreg", "--dataset", "australian", "--epochs", "1",
                 "--restarts", "1", "--methods", "mf-ef", "--out", str(out),
                 "--data-dir", str(data_dir)]) == 0
    for name in ("mf-ef.json", "exact-mf-vi.json"):
        prov = json.loads((out / "australian" / "restart_0" / name).read_text())["provenance"]
        rel = "australian/australian_scale"
        assert prov["data_sha256"] == {rel: hashlib.sha256((data_dir / rel).read_bytes()).hexdigest()}
        assert prov["refbayes_version"] == refbayes.__version__
        assert prov["git_commit"] == _runner.git_commit()


@pytest.mark.parametrize("dataset", ["australian", "breast-cancer", "a1a", "usps-3vs5"])
def test_recorded_files_are_the_files_the_loader_reads(dataset, data_dir, monkeypatch):
    from refbayes.datasets import loaders
    read = []
    real = loaders.verified_file

    def spy(name, rel, data_dir=None):
        read.append(rel)
        return real(name, rel, data_dir)

    monkeypatch.setattr(loaders, "verified_file", spy)
    slang_logreg._load(dataset, data_dir, 0, 0)
    assert sorted(read) == sorted(slang_logreg.DATA_FILES[dataset][1])


def _edit(path, fn):
    saved = json.loads(path.read_text())
    fn(saved)
    path.write_text(json.dumps(saved))


@pytest.mark.parametrize("edit, message", [
    (lambda s: s["provenance"]["data_sha256"].update(synthetic="0" * 64),
     "holds a run computed from other data (synthetic changed)"),
    (lambda s: s["provenance"].update(refbayes_version="0.0.1"), "holds a run written by refbayes 0.0.1"),
    (lambda s: s.pop("provenance"), "records no data checksums or refbayes version"),
])
def test_stale_results_are_refused_unless_fresh(no_figures, tmp_path, capsys, edit, message):
    out = tmp_path / "out"
    assert main(_syn(out)) == 0
    path = out / "synthetic" / "restart_0" / "mf-ef.json"
    _edit(path, edit)
    capsys.readouterr()
    assert main(_syn(out)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"refbayes: error: --out: {path} {message}") and "--fresh" in err
    assert main(_syn(out, "--fresh")) == 0
    assert "provenance" in json.loads(path.read_text())


def test_another_commit_is_reused(no_figures, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(_syn(out)) == 0
    first = capsys.readouterr().out
    path = out / "synthetic" / "restart_0" / "mf-ef.json"
    _edit(path, lambda s: s["provenance"].update(git_commit="f" * 40))
    mtime = path.stat().st_mtime_ns
    assert main(_syn(out)) == 0
    assert path.stat().st_mtime_ns == mtime and capsys.readouterr().out == first


def test_files_and_rows_record_cpu_seconds_and_older_files_still_load(no_figures, tmp_path,
                                                                      capsys):
    out = tmp_path / "out"
    assert main(_syn(out)) == 0
    restart = out / "synthetic" / "restart_0"
    for name in ("mf-ef.json", "exact-mf-vi.json"):
        saved = json.loads((restart / name).read_text())
        assert 0 < saved["cpu_seconds"] and isinstance(saved["cpu_seconds"], float)
    rows = {r["method"]: r for r in json.loads((out / "synthetic_summary.json").read_text())}
    assert rows["mf-ef"]["cpu_seconds"] == json.loads((restart / "mf-ef.json").read_text())["cpu_seconds"]
    assert rows["exact-vi"]["cpu_seconds"] == 0.0
    # a file written before CPU time was recorded is reused, its row's CPU time left empty
    _edit(restart / "mf-ef.json", lambda s: s.pop("cpu_seconds"))
    mtime = (restart / "mf-ef.json").stat().st_mtime_ns
    assert main(_syn(out)) == 0
    assert (restart / "mf-ef.json").stat().st_mtime_ns == mtime
    rows = {r["method"]: r for r in json.loads((out / "synthetic_summary.json").read_text())}
    assert rows["mf-ef"]["cpu_seconds"] is None
    header, mf_ef = (out / "synthetic_summary.csv").read_text().splitlines()[:2]
    assert header.endswith(",seconds,cpu_seconds") and mf_ef.endswith(",")
    # present but not a number: a damaged file, named
    _edit(restart / "mf-ef.json", lambda s: s.update(cpu_seconds="1 s"))
    capsys.readouterr()
    assert main(_syn(out)) == 2
    assert "cpu_seconds: expected a number, got a JSON string" in capsys.readouterr().err


@pytest.mark.parametrize("name, damage, what", [
    ("mf-ef.json", lambda text: text[: len(text) // 2], "not valid JSON ("),
    ("exact-mf-vi.json", lambda text: text[: len(text) // 2], "not valid JSON ("),
    ("mf-ef.json", lambda text: "{}", "missing 'settings'"),
    ("mf-ef.json", lambda text: "[1, 2]", "expected a JSON object, got a JSON array"),
    ("exact-mf-vi.json", lambda text: '{"settings": {}}', "missing 'kl'"),
    ("exact-vi.json", lambda text: text[: len(text) // 2], "not valid JSON ("),
], ids=["truncated", "truncated-mf", "empty-object", "array", "mf-missing-keys",
        "truncated-exact"])
def test_damaged_result_file_is_named_and_fresh_recomputes_it(no_figures, tmp_path, capsys, name,
                                                              damage, what):
    out = tmp_path / "out"
    assert main(_syn(out)) == 0
    first = capsys.readouterr().out
    path = out / "synthetic" / "restart_0" / name
    path.write_text(damage(path.read_text()))
    assert main(_syn(out)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"refbayes: error: {path}: ") and what in err, err
    assert "--fresh" in err and err.count("\n") == 1 and "Traceback" not in err
    assert main(_syn(out, "--fresh")) == 0
    assert capsys.readouterr().out == first
    assert json.loads(path.read_text())["settings"]["restart"] == 0


def test_each_run_is_written_as_it_finishes_and_an_interrupted_restart_resumes(
        no_figures, tmp_path, monkeypatch, capsys):
    # A restart's methods are separate jobs: the one that finished before an interruption is on
    # disk, and the next invocation computes only the one that did not.
    out = tmp_path / "out"
    real, calls = slang_logreg._run_one, []

    def interrupted(method, *args):
        calls.append(method)
        if method == "full-hess":
            raise KeyboardInterrupt
        return real(method, *args)

    monkeypatch.setattr(slang_logreg, "_run_one", interrupted)
    assert main(_syn(out, methods="mf-ef,full-hess")) == 130  # Ctrl-C: "refbayes: interrupted"
    restart = out / "synthetic" / "restart_0"
    assert sorted(p.name for p in restart.iterdir()) == ["exact-vi.json", "mf-ef.json"]
    calls.clear()
    monkeypatch.setattr(slang_logreg, "_run_one",
                        lambda method, *args: calls.append(method) or real(method, *args))
    capsys.readouterr()
    assert main(_syn(out, methods="mf-ef,full-hess")) == 0
    assert calls == ["full-hess"]
    assert sorted(p.name for p in restart.iterdir()) == ["exact-mf-vi.json", "exact-vi.json",
                                                         "full-hess.json", "mf-ef.json"]


def test_one_restart_prints_a_dash_not_nan(no_figures, tmp_path, capsys):
    assert main(_syn(tmp_path / "out", restarts="1")) == 0
    out = capsys.readouterr().out
    assert "nan" not in out
    row = next(line for line in out.splitlines() if line.startswith("mf-ef "))
    assert row.count("+- —") == 2


def test_a_subset_of_methods_merges_with_the_results_on_disk(no_figures, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(_syn(out, methods="mf-ef")) == 0
    assert main(_syn(out, methods="slang-1")) == 0
    rows = json.loads((out / "synthetic_summary.json").read_text())
    pairs = [(r["restart"], r["method"]) for r in rows]
    assert len(pairs) == len(set(pairs)) == 4
    assert {m for _, m in pairs} == {"mf-ef", "slang-1", "exact-vi", "exact-mf-vi"}
    csv_lines = (out / "synthetic_summary.csv").read_text().splitlines()
    assert len(csv_lines) == 1 + 4
    # results with other settings (3 epochs, not 2) are not merged
    assert main(_syn(out, methods="slang-2", epochs="3")) == 0
    rows = json.loads((out / "synthetic_summary.json").read_text())
    assert {r["method"] for r in rows} == {"slang-2", "exact-vi", "exact-mf-vi"}
    table = capsys.readouterr().out.split("synthetic: 3 epochs")[1]
    assert "slang-2" in table and "mf-ef" not in table


def test_progress_on_stderr_off_a_terminal(no_figures, tmp_path, capsys):
    assert main(_syn(tmp_path / "out")) == 0
    first = capsys.readouterr()
    assert "slang-logreg: 1 run(s), 0 already done, 1 to compute" in first.err
    assert "slang-logreg: run 1/1 done (synthetic r0 mf-ef; elapsed " in first.err
    assert main(_syn(tmp_path / "out", restarts="2")) == 0  # restart 0 is resumed
    captured = capsys.readouterr()
    assert "slang-logreg: 2 run(s), 1 already done, 1 to compute" in captured.err
    assert "slang-logreg: run 2/2 done (synthetic r1 mf-ef; elapsed " in captured.err
    assert "run 1/2" not in captured.err
    assert "run " not in captured.out and "elapsed" not in captured.out


def test_header_is_printed_before_the_first_result(tmp_path):
    res = subprocess.run([sys.executable, "-m", "refbayes.cli", *_syn(tmp_path / "out")],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600,
                         check=False)
    assert res.returncode == 0, res.stdout
    head = res.stdout.index("synthetic: 2 epochs, 1 restart(s)")
    assert head < res.stdout.index("run 1/1 done") < res.stdout.index("test NLL (nats)")


def _refuse_writes(monkeypatch, folder):
    def probe(path):
        raise PermissionError(13, "Permission denied", str(path))
    monkeypatch.setattr(_runner, "_probe", probe)


def test_unwritable_out_is_an_error_before_computing(no_figures, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    _refuse_writes(monkeypatch, out)

    def never(*a, **k):
        raise AssertionError("computed before checking --out")

    monkeypatch.setattr(slang_logreg, "_run_one", never)
    assert main(_syn(out)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"refbayes: error: --out: cannot write in {tmp_path} (Permission denied)")
    assert not out.exists()


def test_complete_read_only_results_still_print_their_table(tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    assert main(_syn(out)) == 0
    first = capsys.readouterr().out
    mtimes = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    _refuse_writes(monkeypatch, out)
    assert main(_syn(out)) == 0
    captured = capsys.readouterr()
    # the same table and results lines; no figures written, so no figure lines
    assert "figure:" in first and "figure:" not in captured.out
    assert captured.out.splitlines() == [line for line in first.splitlines()
                                         if not line.startswith("figure:")]
    assert f"{out} is not writable" in captured.err and "not updated" in captured.err
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == mtimes


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0,
                    reason="root writes into read-only folders: the permission bits cannot be tested")
def test_complete_read_only_results_with_real_permissions(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(_syn(out)) == 0
    capsys.readouterr()
    folders = [out, *[p for p in out.rglob("*") if p.is_dir()]]
    for p in folders:
        p.chmod(0o555)
    try:
        assert main(_syn(out)) == 0
        assert "is not writable" in capsys.readouterr().err
        assert main(_syn(out, restarts="2")) == 2
        assert f"--out: cannot write in {out}" in capsys.readouterr().err
    finally:
        for p in folders:
            p.chmod(0o755)


def test_slang_runs_with_the_matlab_code_s_momentum_and_the_baselines_without(no_figures, tmp_path,
                                                                           capsys, monkeypatch):
    """The paper's tables come from slang.m: momentum 0.9 on SLANG's gradient (ngvi.13), none on
    the mean-field and full-Gaussian baselines; recorded in each run's settings."""
    from refbayes.experiments import slang_logreg
    from refbayes.methods import ngvi, slang

    seen = {}
    real = slang_logreg._init

    def spy(method, D, N, lam):
        state, cfg = real(method, D, N, lam)
        seen[method] = cfg.momentum
        return state, cfg

    monkeypatch.setattr(slang_logreg, "_init", spy)
    out = tmp_path / "out"
    assert main(_syn(out, methods="slang-1,mf-ef,full-hess")) == 0
    assert seen == {"slang-1": 0.9, "mf-ef": 0.0, "full-hess": 0.0}
    assert isinstance(real("slang-2", 4, 10, np.ones(4))[1], slang.SLANGConfig)
    assert isinstance(real("full-ef", 4, 10, np.ones(4))[1], ngvi.NGVIConfig)
    for method, momentum in seen.items():
        saved = json.loads((out / "synthetic" / "restart_0" / f"{method}.json").read_text())
        assert saved["settings"]["momentum"] == momentum


# ----------------------------------------------------------------------------- issue 35, item 6

def test_checkpoints_hold_the_start_of_the_convergence_window():
    assert {180, 200} <= set(slang_logreg._checkpoints(200))
    assert {9000, 10_000} <= set(slang_logreg._checkpoints(10_000))


def test_convergence_flag_unset_on_a_levelled_kl_and_set_on_a_falling_one():
    levelled = [[e, 0.64 + 30.0 * np.exp(-e / 10.0)] for e in slang_logreg._checkpoints(200)]
    falling = [[e, 30.0 / np.sqrt(e)] for e in slang_logreg._checkpoints(200)]  # 200 epochs: not yet
    assert slang_logreg._convergence(levelled, 200)["converged"] is True
    assert slang_logreg._convergence(falling, 200)["converged"] is False
    # the full-Gaussian runs' noise floor: 100% relative, under the 0.01 nats
    floor = [[1, 5.0], [180, 2.4e-3], [200, 1.2e-3]]
    assert slang_logreg._convergence(floor, 200)["converged"] is True
    rows = [{"method": "slang-1", "restart": r, "nll": 0.3, "kl": 4.7, "converged": r == 0}
            for r in range(3)]
    rows += [{"method": "full-hess", "restart": r, "nll": 0.3, "kl": 0.03, "converged": True}
             for r in range(3)]
    rows += [{"method": m, "restart": r, "nll": 0.3, "kl": 0.0, "converged": None}
             for m in slang_logreg.REFERENCE_ROWS for r in range(3)]
    table = slang_logreg._table("synthetic", rows, ("slang-1", "full-hess"))
    cells = {line.split()[0]: line.split() for line in table.splitlines()[2:6]}
    assert (cells["slang-1"][7], cells["full-hess"][7], cells["exact-vi"][7]) == ("1/3", "3/3", "-")
    assert "not converged: slang-1: restart(s) 1, 2 of 3" in table
    assert "not converged: full-hess" not in table


def test_a_run_below_the_papers_budget_prints_the_caveat_in_its_table():
    caveat = slang_logreg._caveat("australian", 500, 5, quick=True)
    assert caveat == ("CAVEAT - quick run: S = 12, 500 epochs, 5 restart(s); not comparable to the "
                      "paper's Table 1 (500 of the paper's 10000 epochs; 5 of its 20 restarts)")
    assert slang_logreg._caveat("australian", 10_000, 20) == ""
    assert slang_logreg._caveat("a1a", 10_000, 1) == ""
    assert slang_logreg._caveat("synthetic", 200, 3) == ""  # no paper row printed beside it
    rows = [{"method": m, "nll": 0.3, "kl": 1.0} for m in (*slang_logreg.METHODS,
                                                           *slang_logreg.REFERENCE_ROWS)]
    table = slang_logreg._table("australian", rows, slang_logreg.METHODS, caveat)
    assert table.splitlines()[0] == caveat and "2.240e+04" in table  # the paper's column kept


def test_the_convergence_figure_states_the_budget_and_marks_unconverged_methods(tmp_path,
                                                                                monkeypatch):
    pytest.importorskip("matplotlib")
    figs = []
    monkeypatch.setattr(slang_logreg, "save_figure", lambda fig, path, **kw: figs.append(fig))
    ep = slang_logreg._checkpoints(200)
    curves = {(0, "slang-1"): [[e, 30.0 / np.sqrt(e)] for e in ep],
              (0, "full-hess"): [[e, 0.03 + 30.0 * np.exp(-e / 10.0)] for e in ep]}
    head = slang_logreg._head("synthetic", 200, 1)
    slang_logreg._figures(tmp_path, "synthetic", {}, np.eye(3), curves, ("slang-1", "full-hess"),
                          head)
    assert head in figs[0]._suptitle.get_text()
    ax = figs[1].axes[0]
    assert head in ax.get_title() and "S = 12" in ax.get_title()
    assert [t.get_text() for t in ax.get_legend().get_texts()] == \
        ["slang-1 (not converged: 1/1)", "full-hess"]
