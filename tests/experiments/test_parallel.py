"""Independent jobs in local processes and on a real Dask cluster (distributed.LocalCluster, two
worker processes): the same results as the serial run, bit for bit; a killed worker's job rerun;
an interrupted run resumed from the files it wrote."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from refbayes.cli import main
from refbayes.experiments import _runner, uci

ROOT = Path(__file__).resolve().parents[2]
DATASET = "yacht"  # 308 rows: a quick split takes about a second


# Module-level job functions: workers import them by name.
def square_plus(x, seed):
    rng = np.random.default_rng([seed, x])  # randomness from the job's coordinates only
    return x * x + float(rng.standard_normal())


def die_once(marker, x):
    """Kill the worker process the first time (the marker file records it), then answer."""
    path = Path(marker)
    if not path.exists():
        path.write_text("died once")
        os._exit(1)
    return 10 * x


def fail(x):
    raise ValueError(f"job {x} failed")


def note_start(log, key, hold):
    """Append ``key`` to the file ``log`` as the job starts, then hold the worker ``hold`` s."""
    with open(log, "a") as f:
        f.write(key + "\n")
    time.sleep(hold)
    return key


def _jobs(n=5, seed=3):
    return [_runner.Job(f"j{x}", square_plus, (x, seed)) for x in range(n)]


def _collect(**kwargs):
    out = {}
    _runner.run_jobs(_jobs(), out.__setitem__, **kwargs)
    return out


def test_processes_and_dask_give_the_serial_results(cluster):
    serial = _collect()
    assert _collect(n_jobs=2) == serial
    assert _collect(scheduler=cluster.scheduler_address) == serial
    assert list(serial) == [f"j{x}" for x in range(5)]


def test_a_killed_worker_job_is_rerun(cluster, tmp_path):
    marker = tmp_path / "marker"
    out = {}
    _runner.run_jobs([_runner.Job("a", die_once, (str(marker), 4))], out.__setitem__,
                       scheduler=cluster.scheduler_address)
    assert marker.read_text() == "died once" and out == {"a": 40}


@pytest.mark.parametrize("where", ["processes", "dask"])
def test_a_failing_job_raises_its_error_and_keeps_the_finished(cluster, where):
    kwargs = {"n_jobs": 2} if where == "processes" else {"scheduler": cluster.scheduler_address}
    out = {}
    jobs = [_runner.Job("ok", square_plus, (1, 0)), _runner.Job("bad", fail, (7,))]
    with pytest.raises(ValueError, match="job 7 failed"):
        _runner.run_jobs(jobs, out.__setitem__, **kwargs)
    assert set(out) <= {"ok"}


@pytest.mark.parametrize("where", ["serial", "processes", "dask"])
def test_a_failing_job_is_named_on_its_error(cluster, where):
    """The error carries the key of the job that raised it (``job_key``): the experiment names
    what failed, and what finished, whether the job ran here or in a worker."""
    kwargs = {"serial": {}, "processes": {"n_jobs": 2},
              "dask": {"scheduler": cluster.scheduler_address}}[where]
    jobs = [_runner.Job("ok", square_plus, (1, 0)), _runner.Job("bad", fail, (7,))]
    with pytest.raises(ValueError, match="job 7 failed") as info:
        _runner.run_jobs(jobs, lambda k, r: None, **kwargs)
    assert info.value.job_key == "bad"


def progress_kind(x, progress):
    """What a job's PROGRESS argument became where it ran."""
    return x, type(progress).__name__


@pytest.mark.parametrize("n_jobs", [1, 2])
def test_execute_runs_the_same_jobs_serially_and_in_parallel(n_jobs):
    """Serially each section's heading, jobs and table in turn, the jobs given the run's
    progress; in parallel every job first (given QUIET in the workers), then each section's
    heading and table in order. The results are the same."""
    events, results = [], {}

    class Shown(_runner.Quiet):
        def echo(self, text="", file=None):
            events.append(text)

    progress = Shown()

    def done(key, result):
        results[key] = result
        events.append(f"job {key}")

    sections = [_runner.Section([_runner.Job(f"{s}{k}", progress_kind, (k, _runner.PROGRESS))
                                 for k in range(2)],
                                before=lambda s=s: progress.echo(f"head {s}"),
                                after=lambda s=s: progress.echo(f"table {s}"))
                for s in "ab"]
    _runner.execute(sections, done, progress, n_jobs=n_jobs)
    shown = [e for e in events if not e.startswith("job ")]
    assert shown == ["head a", "table a", "head b", "table b"]
    if n_jobs == 1:
        assert events == ["head a", "job a0", "job a1", "table a",
                          "head b", "job b0", "job b1", "table b"]
        assert results == {f"{s}{k}": (k, "Shown") for s in "ab" for k in range(2)}
    else:
        assert events[:4] != shown and all(e.startswith("job ") for e in events[:4])
        assert results == {f"{s}{k}": (k, "Quiet") for s in "ab" for k in range(2)}


def test_launch_order_is_longest_first_and_keeps_ties_in_order():
    jobs = [_runner.Job(k, square_plus, (0, 0), c) for k, c in
            [("a", 1.0), ("b", 5.0), ("c", 1.0), ("d", 9.0), ("e", 5.0)]]
    assert [j.key for j in _runner.launch_order(jobs)] == ["d", "b", "e", "a", "c"]
    assert _runner.Job("k", square_plus, ()).cost == 1.0


@pytest.mark.parametrize("where", ["processes", "dask"])
def test_parallel_runs_start_the_costliest_jobs_first(cluster, tmp_path, where):
    kwargs = {"n_jobs": 2} if where == "processes" else {"scheduler": cluster.scheduler_address}
    log = tmp_path / "starts"
    # the costly jobs hold their worker 3 s: a worker may take its first job seconds after the
    # other (each unpickles this module, importing refbayes, on a loaded machine), and a 0.5 s
    # hold once let the first worker finish d and log b before the second logged c
    jobs = [_runner.Job(k, note_start, (str(log), k, 3.0 if c > 2.0 else 0.0), c)
            for k, c in [("a", 1.0), ("b", 2.0), ("c", 5.0), ("d", 9.0)]]
    out = {}
    _runner.run_jobs(jobs, out.__setitem__, **kwargs)
    started = log.read_text().split()
    # two workers: the two costliest start first (in either order: they start together)
    assert set(started[:2]) == {"c", "d"} and set(started[2:]) == {"a", "b"}
    assert out == {k: k for k in "abcd"}


@pytest.mark.parametrize("kwargs, message", [
    ({"n_jobs": 0}, "jobs: expected an integer"),
    ({"threads": 0}, "threads: expected an integer"),
    ({"scheduler": "nohost"}, "dask_scheduler: expected an address such as tcp://"),
])
def test_run_jobs_refuses_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _runner.run_jobs(_jobs(), lambda k, r: None, **kwargs)


def test_an_unreachable_scheduler_is_a_clear_error(monkeypatch):
    pytest.importorskip("distributed")
    monkeypatch.setattr(_runner, "CONNECT_TIMEOUT", "1s")
    with pytest.raises(ValueError, match="dask_scheduler: cannot connect to tcp://127.0.0.1:9"):
        _runner.run_jobs(_jobs(1), lambda k, r: None, scheduler="tcp://127.0.0.1:9")


def test_thread_limit_sets_the_blas_pools():
    from threadpoolctl import threadpool_info
    with _runner.thread_limit(1):
        assert all(p["num_threads"] == 1 for p in threadpool_info())


def test_thread_limit_reaches_scipys_blas_in_a_fresh_process():
    """threadpoolctl limits only the pools already loaded: in a fresh interpreter, where SciPy's
    own OpenBLAS is not loaded yet, the limit must still reach it (SLANG's eigh runs there)."""
    code = ("from refbayes.experiments._runner import thread_limit\n"
            "from threadpoolctl import threadpool_info\n"
            "limit = thread_limit(1)\n"
            "import scipy.linalg, refbayes.methods.slang\n"
            "pools = threadpool_info()\n"
            "assert any('scipy' in p['filepath'] for p in pools), pools\n"
            "assert all(p['num_threads'] == 1 for p in pools), pools\n")
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}  # BLAS's default
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# ----------------------------------------------------------------------------- uci


def _strip(d):
    """A result without its timings and provenance (which differ run to run)."""
    if isinstance(d, dict):
        return {key: _strip(v) for key, v in d.items()
                if "seconds" not in key and key != "provenance"}
    if isinstance(d, list):
        return [_strip(v) for v in d]
    return d


def _numbers(out, k):
    """A split's result without its timings and provenance."""
    return _strip(json.loads((out / "slang" / DATASET / f"split_{k}.json").read_text()))


def _uci(out, data_dir, *extra):
    return main(["reproduce", "uci", "--method", "slang", "--dataset", DATASET, "--splits",
                 "0,1,2", "--quick", "--epochs", "2", "--out", str(out), "--data-dir",
                 str(data_dir), *map(str, extra)])


@pytest.fixture(scope="module")
def serial_uci(tmp_path_factory, data_dir):
    out = tmp_path_factory.mktemp("serial")
    assert _uci(out, data_dir) == 0
    return out


def test_uci_jobs_equal_the_serial_run_bit_for_bit(serial_uci, data_dir, tmp_path):
    assert _uci(tmp_path, data_dir, "--jobs", "2") == 0
    for k in range(3):
        assert _numbers(tmp_path, k) == _numbers(serial_uci, k)


def test_uci_on_a_dask_cluster_equals_the_serial_run(cluster, serial_uci, data_dir, tmp_path,
                                                    capsys):
    assert _uci(tmp_path, data_dir, "--dask-scheduler", cluster.scheduler_address) == 0
    for k in range(3):
        assert _numbers(tmp_path, k) == _numbers(serial_uci, k)
    summary = json.loads((tmp_path / "slang" / DATASET / "summary.json").read_text())
    assert summary["summary"]["splits_done"] == 3


def test_an_interrupted_dask_run_resumes_from_its_files(cluster, serial_uci, data_dir, tmp_path,
                                                        monkeypatch):
    written = []
    real = uci.write_json

    def write_then_interrupt(path, obj):
        real(path, obj)
        if Path(path).name.startswith("split_"):
            written.append(Path(path))
            if len(written) == 1:
                raise KeyboardInterrupt  # the user's Ctrl-C after the first split came back

    monkeypatch.setattr(uci, "write_json", write_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        uci.run_method("slang", DATASET, (0, 1, 2), quick=True, out=tmp_path, data_dir=data_dir,
                epochs=2, progress=False, dask_scheduler=cluster.scheduler_address)
    monkeypatch.setattr(uci, "write_json", real)
    first = written[0]
    stamp = first.stat().st_mtime_ns
    assert len(list((tmp_path / "slang" / DATASET).glob("split_*.json"))) == 1
    uci.run_method("slang", DATASET, (0, 1, 2), quick=True, out=tmp_path, data_dir=data_dir, epochs=2,
            progress=False, dask_scheduler=cluster.scheduler_address)
    assert first.stat().st_mtime_ns == stamp  # reused, not recomputed
    for k in range(3):
        assert _numbers(tmp_path, k) == _numbers(serial_uci, k)


# ----------------------------------------------------------------------------- slang-logreg


def _json_numbers(folder: Path) -> dict:
    return {str(p.relative_to(folder)): _strip(json.loads(p.read_text()))
            for p in sorted(folder.rglob("*.json"))}


def _slang_logreg(out, *extra):
    return main(["reproduce", "slang-logreg", "--epochs", "3", "--restarts", "3", "--methods",
                 "mf-ef,slang-2,full-ef", "--out", str(out), *map(str, extra)])


def test_slang_logreg_restarts_in_processes_and_on_dask_equal_the_serial_run(cluster, tmp_path):
    assert _slang_logreg(tmp_path / "serial") == 0
    assert _slang_logreg(tmp_path / "jobs", "--jobs", "2") == 0
    assert _slang_logreg(tmp_path / "dask", "--dask-scheduler", cluster.scheduler_address) == 0
    serial = _json_numbers(tmp_path / "serial")
    # runs, exact mean-field optima, exact VI fits (one file per restart), the summary
    assert len(serial) == 3 * 3 + 3 + 3 + 1
    assert _json_numbers(tmp_path / "jobs") == serial
    assert _json_numbers(tmp_path / "dask") == serial


# ----------------------------------------------------------------------------- the other experiments


def _quiet_main(argv, monkeypatch=None, module=None):
    """``main(argv)`` with stdout captured (figures off when ``module`` is given: they are not
    results, and matplotlib costs seconds); (status, stdout)."""
    import contextlib
    import io
    if module is not None:
        monkeypatch.setattr(module, "pyplot", lambda: None)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        status = main(argv)
    return status, out.getvalue()


def _three_ways(tmp_path, cluster, argv, monkeypatch=None, module=None):
    """Run ``argv`` serially, with --jobs 2 and on the Dask cluster into three folders; the
    folders and the stdout of each (with its folder's name replaced by OUT)."""
    runs = {}
    for where, extra in (("serial", []), ("jobs", ["--jobs", "2"]),
                         ("dask", ["--dask-scheduler", cluster.scheduler_address])):
        out = tmp_path / where
        status, stdout = _quiet_main([*argv, "--out", str(out), *extra], monkeypatch, module)
        assert status == 0, (where, stdout)
        runs[where] = (out, stdout.replace(str(out), "OUT"))
    return runs


def _npz_equal(a: Path, b: Path) -> bool:
    with np.load(a, allow_pickle=False) as x, np.load(b, allow_pickle=False) as y:
        return sorted(x.files) == sorted(y.files) and all(
            x[k].dtype == y[k].dtype and np.array_equal(x[k], y[k]) for k in x.files)


def test_calibration_training_runs_in_processes_and_on_dask_equal_the_serial_run(
        cluster, data_dir, tmp_path, monkeypatch):
    """One job per training run: map alone, swa and swag on one shared SGD run (``fit_reused``
    as in the serial run)."""
    from refbayes.experiments import calibration
    argv = ["reproduce", "calibration", "--quick", "--task", "main", "--method", "map,swa,swag",
            "--data-dir", str(data_dir), "--no-progress"]
    runs = _three_ways(tmp_path, cluster, argv, monkeypatch, calibration)
    serial = _json_numbers(runs["serial"][0])
    assert len(serial) == 3 + 1  # one file per method, the summary
    assert serial["digits/main/seed_0/swag.json"]["fit_reused"] is True
    for where in ("jobs", "dask"):
        assert _json_numbers(runs[where][0]) == serial, where
        assert (runs[where][0] / "results.csv").is_file()


def test_ktied_runs_in_processes_and_on_dask_equal_the_serial_run(cluster, data_dir, tmp_path,
                                                                  monkeypatch):
    """One job per run; the result files, posteriors (exactly), post-hoc analysis and printed
    tables are the serial run's; no checkpoint is left behind."""
    from refbayes.experiments import ktied
    argv = ["reproduce", "ktied", "--runs", "meanfield,1", "--hidden", "4,4", "--steps", "6",
            "--n-train", "100", "--batch", "50", "--eval-every", "3", "--snr-steps", "3",
            "--snr-draws", "2", "--final-draws", "2", "--checkpoint-every", "4",
            "--no-progress", "--data-dir", str(data_dir)]
    runs = _three_ways(tmp_path, cluster, argv, monkeypatch, ktied)
    out, stdout = runs["serial"]
    serial = _json_numbers(out)
    assert sorted(serial) == ["posthoc.json", "run_k1.json", "run_meanfield.json"]
    for where in ("jobs", "dask"):
        other, other_stdout = runs[where]
        assert _json_numbers(other) == serial, where
        for name in ("meanfield", "k1"):
            assert _npz_equal(other / f"posterior_{name}.npz", out / f"posterior_{name}.npz")
        assert not list(other.glob("*.ckpt.npz"))
        assert other_stdout == stdout, where


def test_riemannian_laplace_parts_in_processes_and_on_dask_equal_the_serial_run(
        cluster, tmp_path, monkeypatch):
    """The CLI with one part (--jobs runs a single job in this process, Dask on a worker), and
    two parts' jobs in two spawned processes against the same jobs run here."""
    from refbayes.experiments import riemannian_laplace as rl
    argv = ["reproduce", "riemannian-laplace", "--part", "a", "--quick", "--samples", "5"]
    runs = _three_ways(tmp_path, cluster, argv, monkeypatch, rl)
    serial = _json_numbers(runs["serial"][0])
    assert list(serial) == ["part_a.json"]
    for where in ("jobs", "dask"):
        assert _json_numbers(runs[where][0]) == serial, where

    budget = {"samples": 3, "grid": 20}
    jobs = [_runner.Job(f"a{seed}", rl._part_job, ("a", seed, budget)) for seed in (0, 1)]
    here, there = {}, {}
    _runner.run_jobs(jobs, lambda k, r: here.__setitem__(k, r[0]))
    _runner.run_jobs(jobs, lambda k, r: there.__setitem__(k, r[0]), n_jobs=2)
    strip = lambda r: {**r, "geodesics": {m: g["mean_nfev"] for m, g in r["geodesics"].items()}}  # noqa: E731
    assert {k: strip(r) for k, r in there.items()} == {k: strip(r) for k, r in here.items()}
    assert here["a0"]["la_samples"] != here["a1"]["la_samples"]  # the seed reaches the job


def test_selfcheck_groups_in_processes_and_on_dask_equal_the_serial_run(cluster, tmp_path,
                                                                       monkeypatch):
    """The four groups of checks as jobs: the same errors, rows and timing names, in order."""
    from refbayes.experiments import selfcheck
    runs = _three_ways(tmp_path, cluster, ["reproduce", "selfcheck", "--quick"], monkeypatch,
                       selfcheck)

    def numbers(out):
        saved = json.loads((out / "selfcheck.json").read_text())
        return saved["problem"], saved["checks"], list(saved["timings_s"])

    serial = numbers(runs["serial"][0])
    assert len(serial[1]) == 4 + 4 + 2 + 5 and len(serial[2]) == 6
    for where in ("jobs", "dask"):
        assert numbers(runs[where][0]) == serial, where


# ----------------------------------------------------------------------------- freed memory

_FAULTS = """
import resource, sys
import numpy as np
from refbayes.experiments import _runner
from refbayes.models import MLP
applied = _runner.retain_freed_memory() if sys.argv[1] == "retain" else None
net = MLP([8, 50, 1], "relu", "gaussian", noise_precision=1.0)
rng = np.random.default_rng(0)
thetas = net.init_theta(rng) + 0.01 * rng.standard_normal((10, net.D))
X, y = rng.standard_normal((128, 8)), rng.standard_normal(128)
net.sample_moments(thetas, X, y, "ef")
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    net.sample_moments(thetas, X, y, "ef")
print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_retained_freed_memory_stops_the_page_faults_of_a_monte_carlo_step():
    # VOGN's batched moments at M = 128, S = 10 allocate (10, 128, 50) temporaries of 500 kB:
    # with glibc's defaults each call faults their pages in again; with the experiments'
    # setting (every job and the CLI) the steady state faults none. Fresh processes, since
    # mallopt is process-wide.
    import subprocess
    import sys

    def faults(mode):
        res = subprocess.run([sys.executable, "-c", _FAULTS, mode], capture_output=True,
                             text=True, check=True, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
        applied, n = res.stdout.split()
        return applied, int(n)

    assert faults("retain") == ("True", 0)
    default = faults("default")
    assert default[0] == "None" and default[1] >= 50, default  # at least one fault per call


def test_a_missing_distributed_package_is_a_clear_error_naming_the_extra(monkeypatch, tmp_path,
                                                                          capsys):
    """`reproduce EXP --dask-scheduler ...` without the `distributed` package: one line naming
    --dask-scheduler and the `dask` extra, exit 2, no traceback (issue 35, item 1)."""
    monkeypatch.setitem(sys.modules, "distributed", None)  # `import distributed` fails
    with pytest.raises(ValueError, match=r"--dask-scheduler needs the 'distributed' package .*"
                                         r'pip install "refbayes\[dask\]"'):
        _runner.run_jobs(_jobs(2), lambda k, r: None, scheduler="tcp://x:1")
    status = main(["reproduce", "slang-logreg", "--epochs", "1", "--restarts", "1", "--methods",
                   "mf-ef", "--out", str(tmp_path), "--dask-scheduler", "tcp://x:1"])
    err = capsys.readouterr().err  # the plan's line, then the error's
    assert status == 2 and "Traceback" not in err
    last = err.splitlines()[-1]
    assert last.startswith("refbayes: error: --dask-scheduler needs the 'distributed' package")
    assert last.endswith('install it with: pip install "refbayes[dask]"')
