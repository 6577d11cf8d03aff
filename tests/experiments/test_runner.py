"""The experiments' runner (refbayes.experiments._runner): damaged result files named, provenance,
resume, progress, writability, mean_se, CSV; and the public writers of refbayes._files."""
import argparse
import io
import json
import re

import numpy as np
import pytest

import refbayes
from refbayes import _files
from refbayes.experiments import _runner


def test_damaged_json_names_the_file(tmp_path):
    path = tmp_path / "run.json"
    text = json.dumps({"settings": {"a": 1, "b": [1, 2, 3]}, "nll": 0.5}, indent=2)
    path.write_text(text[: len(text) // 2])
    with pytest.raises(ValueError) as info:
        _runner.read_json(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: ") and "not valid JSON" in msg and "line " in msg
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ValueError, match=re.escape(str(path))):
        _runner.read_json(path)
    assert _runner.read_json(tmp_path / "absent.json") is None


@pytest.mark.parametrize("obj, what", [
    ({}, "missing 'settings'"),
    ([1, 2], "expected a JSON object, got a JSON array"),
    ({"settings": {}, "nll": "0.3"}, "nll: expected a number, got a JSON string"),
    ({"settings": {}, "nll": 0.3, "test": {"ll": 1}}, "missing 'test.rmse'"),
    ({"settings": {}, "nll": True, "test": {"ll": 1, "rmse": 2}}, "nll: expected a number, got a JSON boolean"),
])
def test_result_schema_names_what_is_wrong(tmp_path, obj, what):
    schema = {"settings": dict, "nll": float, "test": {"ll": float, "rmse": float}}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(obj))
    with pytest.raises(ValueError) as info:
        _runner.load_result(path, schema)
    msg = str(info.value)
    assert msg.startswith(f"{path}: damaged result file: ") and what in msg and "--fresh" in msg
    assert _runner.load_result(path, schema, fresh=True) is None  # --fresh: recompute it
    good = {"settings": {}, "nll": 1, "test": {"ll": 1.0, "rmse": 2.0}, "extra": None}
    path.write_text(json.dumps(good))
    assert _runner.load_result(path, schema) == good


def test_provenance_records_data_version_and_commit():
    prov = _runner.provenance({"b/x": "2" * 64, "a/y": "1" * 64})
    assert prov["data_sha256"] == {"a/y": "1" * 64, "b/x": "2" * 64}
    assert prov["refbayes_version"] == refbayes.__version__
    assert prov["git_commit"] == _runner.git_commit()
    commit = _runner.git_commit()
    assert commit is None or re.fullmatch(r"[0-9a-f]{40,64}", commit)


def test_provenance_records_a_digest_of_the_installed_source(tmp_path, monkeypatch):
    """code_sha256 identifies the code where git_commit is None (a wheel, `pip install .`): the
    sha256 of the package's *.py files sorted by relative path, computed once per process.
    (Checked on a copy: the package may be edited while the tests run.)"""
    import hashlib
    from pathlib import Path
    root = Path(refbayes.__file__).resolve().parent
    copy = tmp_path / "refbayes"
    for p in root.rglob("*.py"):
        (copy / p.relative_to(root)).parent.mkdir(parents=True, exist_ok=True)
        (copy / p.relative_to(root)).write_bytes(p.read_bytes())
    h = hashlib.sha256()
    for rel, p in sorted((p.relative_to(copy).as_posix(), p) for p in copy.rglob("*.py")):
        h.update(f"{rel}\0{p.stat().st_size}\0".encode() + p.read_bytes())
    assert _runner._package_digest(copy) == h.hexdigest()
    (copy / "notes.txt").write_text("x")  # files other than *.py (caches, data) do not count
    assert _runner._package_digest(copy) == h.hexdigest()
    with open(copy / "metrics.py", "a") as f:  # an edit does
        f.write("# an edit\n")
    assert _runner._package_digest(copy) != h.hexdigest()
    # the digest of the package in use, cached: recorded in every provenance
    hits = _runner.code_sha256.cache_info().hits
    assert _runner.provenance({})["code_sha256"] == _runner.code_sha256()
    assert _runner.code_sha256.cache_info().hits >= hits + 1
    assert re.fullmatch(r"[0-9a-f]{64}", _runner.code_sha256())
    roots = []
    monkeypatch.setattr(_runner, "_package_digest", lambda r: roots.append(Path(r)) or "d" * 64)
    assert _runner.code_sha256.__wrapped__() == "d" * 64 and roots == [root]


def test_a_result_from_other_code_is_reused_with_a_note_naming_both_digests(tmp_path, capsys,
                                                                           monkeypatch):
    monkeypatch.setattr(_runner, "_STALE_NOTED", set())
    path = tmp_path / "r.json"
    current = _runner.provenance({"d/data.txt": "a" * 64})
    assert _runner.reusable(path, _saved(code_sha256="c" * 64), {"epochs": 2}, current, fresh=False)
    err = capsys.readouterr().err
    assert err.startswith(f"note: {path} ") and "c" * 64 in err and current["code_sha256"] in err
    assert "delete it or choose another --out" in err
    # once per pair of digests (not once per file of a 20-split table); the same code: silent
    assert _runner.reusable(tmp_path / "s.json", _saved(code_sha256="c" * 64), {"epochs": 2},
                            current, fresh=True)
    assert _runner.reusable(path, _saved(), {"epochs": 2}, current, fresh=False)
    assert capsys.readouterr().err == ""
    # a file written before the digest was recorded (reproductions/): reused, silently
    old = _saved()
    del old["provenance"]["code_sha256"]
    assert _runner.reusable(path, old, {"epochs": 2}, current, fresh=False)
    assert capsys.readouterr().err == ""


def test_git_commit_is_none_outside_a_checkout_or_without_git(tmp_path, monkeypatch):
    assert _runner._git_head(tmp_path) is None  # not a checkout
    (tmp_path / ".git").mkdir()             # looks like one, but git cannot read it
    assert _runner._git_head(tmp_path) is None
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no git executable at all
    assert _runner._git_head(_runner._source_root()) is None


def _saved(**prov):
    base = _runner.provenance({"d/data.txt": "a" * 64})
    return {"settings": {"epochs": 2}, "provenance": {**base, **prov}}


def test_reuse_needs_same_settings_data_and_version(tmp_path):
    path = tmp_path / "r.json"
    current = _runner.provenance({"d/data.txt": "a" * 64})
    assert _runner.reusable(path, _saved(), {"epochs": 2}, current, fresh=False)
    # the commit is provenance only: another commit of the same version is reused
    assert _runner.reusable(path, _saved(git_commit="f" * 40), {"epochs": 2}, current, fresh=False)
    cases = [
        (_saved(), {"epochs": 3}, "holds a run with other settings (differs in epochs)"),
        (_saved(data_sha256={"d/data.txt": "b" * 64}), {"epochs": 2},
         "holds a run computed from other data (d/data.txt changed)"),
        (_saved(data_sha256={}), {"epochs": 2},
         "holds a run computed from other data (d/data.txt added)"),
        (_saved(refbayes_version="0.0.1"), {"epochs": 2},
         f"holds a run written by refbayes 0.0.1 (this is refbayes {refbayes.__version__})"),
        ({"settings": {"epochs": 2}}, {"epochs": 2}, "records no data checksums or refbayes version"),
    ]
    for saved, settings, what in cases:
        with pytest.raises(ValueError) as info:
            _runner.reusable(path, saved, settings, current, fresh=False)
        msg = str(info.value)
        assert msg.startswith(f"--out: {path} {what}"), msg
        assert msg.endswith("use --fresh to recompute it or another --out")
        assert not _runner.reusable(path, saved, settings, current, fresh=True)


def test_progress_names_the_runs_resumed_from_a_checkpoint():
    stream = io.StringIO()
    _runner.Progress(total=1, done=0, desc="ktied", file=stream, resuming={"k1": 300})
    assert stream.getvalue() == "ktied: 1 run(s), resuming k1 from step 300\n"
    stream = io.StringIO()
    _runner.Progress(total=4, done=1, desc="ktied", file=stream, resuming={"k1": 300})
    assert stream.getvalue() == "ktied: 4 run(s), 1 already done, resuming k1 from step 300, 2 to compute\n"


def test_a_summary_written_before_the_run_is_complete_is_named_partial(tmp_path):
    path = tmp_path / "summary.csv"
    rows = [{"split": 0, "rmse": 1.0}]
    assert _runner.write_summary_csv(path, rows, complete=False) == tmp_path / "summary.partial.csv"
    assert not path.exists()
    assert (tmp_path / "summary.partial.csv").read_text().splitlines() == ["split,rmse", "0,1.0"]
    assert _runner.write_summary_csv(path, rows * 2) == path  # complete: the final name only
    assert not (tmp_path / "summary.partial.csv").exists() and path.read_text().count("\n") == 3
    _runner.write_summary_csv(path, rows, complete=False)  # a later, incomplete run
    assert not path.exists()  # no final-looking file beside the newer partial one


def test_interrupted_note_of_a_run_that_does_not_resume(tmp_path):
    _runner.start(tmp_path, True, 5, 0, "selfcheck", enabled=False, resumable=False,
                  partial=lambda: ["k2 checkpointed at step 15"])
    assert _runner.interrupted_note() == (
        f"0 of 5 result(s) saved under {tmp_path} (0 by this run); k2 checkpointed at step 15; "
        "this command does not resume: run it again to start over")
    _runner.forget_run()
    assert _runner.interrupted_note() is None


def test_progress_prints_plain_lines_off_a_terminal():
    stream = io.StringIO()
    with _runner.Progress(total=3, done=1, desc="demo", file=stream) as progress:
        with progress.run_bar(10, "inner") as bar:
            bar.update(10)  # no line of a run shorter than RUN_LOG_SECONDS
        progress.advance("first")
        progress.advance("second")
    lines = stream.getvalue().splitlines()
    assert lines[0] == "demo: 3 run(s), 1 already done, 2 to compute"
    assert re.fullmatch(r"demo: run 2/3 done \(first; elapsed \d\d:\d\d, remaining ~\d\d:\d\d\)", lines[1])
    assert re.fullmatch(r"demo: run 3/3 done \(second; elapsed \d\d:\d\d, remaining ~00:00\)", lines[2])
    assert len(lines) == 3
    quiet = io.StringIO()
    with _runner.Progress(total=2, desc="demo", file=quiet, enabled=False) as progress:
        progress.advance("x")
    assert quiet.getvalue() == ""


def test_a_long_run_prints_a_line_every_run_log_seconds_off_a_terminal(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(_runner.time, "monotonic", lambda: clock[0])
    stream = io.StringIO()
    with _runner.Progress(total=1, desc="demo", file=stream) as progress:
        with progress.run_bar(100, "vogn seed 0", unit="epoch") as bar:
            bar.update(40)  # a resumed run's jump to its checkpoint: not in the rate
            for t in (100.0, 200.0, 299.0):  # 3 epochs within RUN_LOG_SECONDS: no line
                clock[0] = 1000.0 + t
                bar.update(1)
            clock[0] = 1000.0 + 300.0
            bar.update(1)  # 4 epochs in 300 s since the jump: 56 left at 75 s each
            clock[0] = 1000.0 + 600.0
            bar.update(56)  # the last step: no line, the run's own "done" line follows
    lines = stream.getvalue().splitlines()[1:]
    assert lines == ["demo: vogn seed 0 44/100 epochs (elapsed 05:00, remaining ~1:10:00)"]


def test_writable_error(tmp_path, monkeypatch):
    assert _runner.writable_error(tmp_path) is None
    assert _runner.writable_error(tmp_path / "new" / "deeper") is None  # would be created
    (tmp_path / "f").write_text("x")
    assert "is not a folder" in _runner.writable_error(tmp_path / "f" / "sub")

    def refuse(folder):
        raise PermissionError(13, "Permission denied", str(folder))

    monkeypatch.setattr(_runner, "_probe", refuse)
    msg = _runner.writable_error(tmp_path / "new")
    assert msg == f"cannot write in {tmp_path} (Permission denied)"


# ----------------------------------------------------------------------------- summaries

def test_mean_se_is_the_sample_standard_error_and_skips_missing_values():
    mean, se = _runner.mean_se([1.0, 2.0, None, 4.0])
    assert mean == pytest.approx(7 / 3, rel=1e-12)
    var = ((1 - 7 / 3) ** 2 + (2 - 7 / 3) ** 2 + (4 - 7 / 3) ** 2) / 2  # ddof 1
    assert se == pytest.approx((var / 3) ** 0.5, rel=1e-12)
    assert _runner.mean_se([1.0, 3.0], ddof=0)[1] == pytest.approx(1 / 2 ** 0.5, rel=1e-12)
    assert _runner.mean_se([5.0]) == (5.0, None)  # one run: no error (JSON null)
    assert _runner.mean_se([None]) == (None, None) == _runner.mean_se([])


def test_write_csv_columns_from_dicts_or_a_header(tmp_path):
    rows = [{"a": 1, "b": 0.5}, {"a": 2, "c": "x"}]
    path = _runner.write_csv(tmp_path / "sub" / "t.csv", rows)
    assert path.read_bytes() == b"a,b,c\r\n1,0.5,\r\n2,,x\r\n"  # every key, first-seen order
    _runner.write_csv(path, rows[:1], header=("b", "a"))
    assert path.read_text() == "b,a\n0.5,1\n"
    _runner.write_csv(path, [[1, "y"]], header=["n", "s"])
    assert path.read_text() == "n,s\n1,y\n"
    assert _runner.write_csv(tmp_path / "none.csv", []) is None
    assert not (tmp_path / "none.csv").exists()
    _runner.write_csv(tmp_path / "empty.csv", [], header=["n"])
    assert (tmp_path / "empty.csv").read_text() == "n\n"
    with pytest.raises(ValueError):  # a key outside the header is an error, not a lost column
        _runner.write_csv(path, rows[1:], header=("a",))


def test_resume_reuses_only_a_matching_result(tmp_path):
    schema = {"settings": dict, "value": float}
    path = tmp_path / "r.json"
    prov = _runner.provenance({"d/x": "a" * 64})
    assert _runner.resume(path, schema, {"n": 1}, prov, fresh=False) is None  # not computed yet
    saved = {"settings": {"n": 1}, "value": 2.5, "provenance": prov}
    _files.write_json(path, saved)
    assert _runner.resume(path, schema, {"n": 1}, prov, fresh=False) == saved
    with pytest.raises(ValueError, match=r"other settings \(differs in n\); use --fresh"):
        _runner.resume(path, schema, {"n": 2}, prov, fresh=False)
    assert _runner.resume(path, schema, {"n": 2}, prov, fresh=True) is None  # recompute it
    other = _runner.provenance({"d/x": "b" * 64})
    with pytest.raises(ValueError, match="other data"):
        _runner.resume(path, schema, {"n": 1}, other, fresh=False)
    path.write_text('{"settings": {"n": 1}}')  # damaged: the value is missing
    with pytest.raises(_runner.ResultFileError, match="missing 'value'"):
        _runner.resume(path, schema, {"n": 1}, prov, fresh=False)
    assert _runner.resume(path, schema, {"n": 1}, prov, fresh=True) is None


def test_files_writers_are_public_and_atomic(tmp_path):
    path = _files.write_json(tmp_path / "a" / "x.json", {"b": 1, "a": [1.5]})
    assert path.read_text() == '{\n  "a": [\n    1.5\n  ],\n  "b": 1\n}\n'
    assert [p.name for p in path.parent.iterdir()] == ["x.json"]  # no temporary left
    assert _files.format_table(["k", "value"], [["a", 1], ["bb", 22]]) == \
        "k   value\n--  -----\na   1\nbb  22"


def test_save_figure_writes_atomically_and_closes(tmp_path):
    plt = pytest.importorskip("matplotlib.pyplot")
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    path = _runner.save_figure(fig, tmp_path / "figs" / "f.png", dpi=50, bbox_inches="tight")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in path.parent.iterdir()] == ["f.png"]  # no temporary left
    assert not plt.fignum_exists(fig.number)


def test_job_rng_is_the_seed_sequence_of_the_coordinates():
    a = _runner.job_rng(3, 1, 4).standard_normal(3)
    b = np.random.default_rng(np.random.SeedSequence([3, 1, 4])).standard_normal(3)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, _runner.job_rng(3, 1, 5).standard_normal(3))


def test_plan_reuses_what_stands_and_lists_the_rest_in_order(tmp_path):
    """A plan: the units whose file stands for the run are reused, the others (absent, or with
    --fresh other settings) are to compute, in order; without --fresh a differing file stops it."""
    current = _runner.provenance({"d/data.txt": "a" * 64})
    settings = {"epochs": 2}
    _files.write_json(tmp_path / "a.json", {"settings": settings, "provenance": current})
    _files.write_json(tmp_path / "b.json", {"settings": {"epochs": 3}, "provenance": current})
    units = [_runner.Unit(k, tmp_path / f"{k}.json", {"settings": dict}, settings, current)
             for k in "abc"]
    saved, todo = _runner.plan(units, fresh=True)
    assert list(saved) == ["a"] and [u.key for u in todo] == ["b", "c"]
    with pytest.raises(ValueError, match="b.json holds a run with other settings"):
        _runner.plan(units, fresh=False)


def test_read_saved_leaves_out_damaged_and_differing_files_noting_each_once(tmp_path, capsys):
    current = _runner.provenance({})
    (tmp_path / "bad.json").write_text("{")
    _files.write_json(tmp_path / "other.json", {"settings": {"x": 2}, "provenance": current})
    noted = set()
    for _ in range(2):
        assert _runner.read_saved(tmp_path / "bad.json", {}, noted=noted) is None
    assert capsys.readouterr().err.count("bad.json: not valid JSON") == 1
    assert _runner.read_saved(tmp_path / "none.json", {}) is None
    assert _runner.read_saved(tmp_path / "other.json", {}, {"x": 1}, lambda: current) is None
    assert _runner.read_saved(tmp_path / "other.json", {}, {"x": 2}, lambda: current)["settings"] == {"x": 2}


def test_overridden_replaces_what_the_command_line_sets():
    args = argparse.Namespace(samples=7, grid=None)
    defaults = {"samples": 1, "grid": 80}
    assert _runner.overridden(defaults, args, ("samples", "grid", "absent")) == {"samples": 7, "grid": 80}
    assert defaults == {"samples": 1, "grid": 80}


def test_job_clocks_count_on_from_the_record_and_add_no_cpu_seconds_to_an_older_one():
    resumed = {"seconds": 10.0, "cpu_seconds": 5.0}
    clocks = _runner.job_clocks(resumed)
    sum(i * i for i in range(200_000))  # some CPU time for both clocks to see
    clocks()
    assert resumed["seconds"] > 10.0 and resumed["cpu_seconds"] > 5.0
    assert resumed["seconds"] - 10.0 < 60.0 and resumed["cpu_seconds"] - 5.0 < 60.0
    older = {"seconds": 3.0}  # a checkpoint written before CPU seconds were recorded
    _runner.job_clocks(older)()
    assert older["seconds"] >= 3.0 and "cpu_seconds" not in older
