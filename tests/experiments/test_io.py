"""The experiments' shared result files: damaged files named, provenance, progress, writability."""
import io
import json
import re

import pytest

import refbayes
from refbayes.experiments import _io


def test_damaged_json_names_the_file(tmp_path):
    path = tmp_path / "run.json"
    text = json.dumps({"settings": {"a": 1, "b": [1, 2, 3]}, "nll": 0.5}, indent=2)
    path.write_text(text[: len(text) // 2])
    with pytest.raises(ValueError) as info:
        _io.read_json(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: ") and "not valid JSON" in msg and "line " in msg
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ValueError, match=re.escape(str(path))):
        _io.read_json(path)
    assert _io.read_json(tmp_path / "absent.json") is None


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
        _io.load_result(path, schema)
    msg = str(info.value)
    assert msg.startswith(f"{path}: damaged result file: ") and what in msg and "--fresh" in msg
    assert _io.load_result(path, schema, fresh=True) is None  # --fresh: recompute it
    good = {"settings": {}, "nll": 1, "test": {"ll": 1.0, "rmse": 2.0}, "extra": None}
    path.write_text(json.dumps(good))
    assert _io.load_result(path, schema) == good


def test_provenance_records_data_version_and_commit():
    prov = _io.provenance({"b/x": "2" * 64, "a/y": "1" * 64})
    assert prov["data_sha256"] == {"a/y": "1" * 64, "b/x": "2" * 64}
    assert prov["refbayes_version"] == refbayes.__version__
    assert prov["git_commit"] == _io.git_commit()
    commit = _io.git_commit()
    assert commit is None or re.fullmatch(r"[0-9a-f]{40,64}", commit)


def test_git_commit_is_none_outside_a_checkout_or_without_git(tmp_path, monkeypatch):
    assert _io._git_head(tmp_path) is None  # not a checkout
    (tmp_path / ".git").mkdir()             # looks like one, but git cannot read it
    assert _io._git_head(tmp_path) is None
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no git executable at all
    assert _io._git_head(_io._source_root()) is None


def _saved(**prov):
    base = _io.provenance({"d/data.txt": "a" * 64})
    return {"settings": {"epochs": 2}, "provenance": {**base, **prov}}


def test_reuse_needs_same_settings_data_and_version(tmp_path):
    path = tmp_path / "r.json"
    current = _io.provenance({"d/data.txt": "a" * 64})
    assert _io.reusable(path, _saved(), {"epochs": 2}, current, fresh=False)
    # the commit is provenance only: another commit of the same version is reused
    assert _io.reusable(path, _saved(git_commit="f" * 40), {"epochs": 2}, current, fresh=False)
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
            _io.reusable(path, saved, settings, current, fresh=False)
        msg = str(info.value)
        assert msg.startswith(f"--out: {path} {what}"), msg
        assert msg.endswith("use --fresh to recompute it or another --out")
        assert not _io.reusable(path, saved, settings, current, fresh=True)


def test_progress_prints_plain_lines_off_a_terminal():
    stream = io.StringIO()
    with _io.Progress(total=3, done=1, desc="demo", file=stream) as progress:
        with progress.run_bar(10, "inner") as bar:
            bar.update(10)  # no per-epoch output off a terminal
        progress.advance("first")
        progress.advance("second")
    lines = stream.getvalue().splitlines()
    assert lines[0] == "demo: 3 run(s), 1 already done, 2 to compute"
    assert re.fullmatch(r"demo: run 2/3 done \(first; elapsed \d\d:\d\d, remaining ~\d\d:\d\d\)", lines[1])
    assert re.fullmatch(r"demo: run 3/3 done \(second; elapsed \d\d:\d\d, remaining ~00:00\)", lines[2])
    assert len(lines) == 3
    quiet = io.StringIO()
    with _io.Progress(total=2, desc="demo", file=quiet, enabled=False) as progress:
        progress.advance("x")
    assert quiet.getvalue() == ""


def test_writable_error(tmp_path, monkeypatch):
    assert _io.writable_error(tmp_path) is None
    assert _io.writable_error(tmp_path / "new" / "deeper") is None  # would be created
    (tmp_path / "f").write_text("x")
    assert "is not a folder" in _io.writable_error(tmp_path / "f" / "sub")

    def refuse(folder):
        raise PermissionError(13, "Permission denied", str(folder))

    monkeypatch.setattr(_io, "_probe", refuse)
    msg = _io.writable_error(tmp_path / "new")
    assert msg == f"cannot write in {tmp_path} (Permission denied)"
