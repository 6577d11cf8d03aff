"""Verify-on-load: every loader checks the registered files it reads against the registry (sha256
and size; LIBSVM text also by parsed content), caches the verdict per (path, size, mtime), warns
for a user's own file, and names the file in parse errors."""
import gzip
import hashlib
import os
import shutil
import warnings

import numpy as np
import pytest

from refbayes.cli import main
from refbayes.datasets import (
    DataVerificationError,
    UnverifiedDataWarning,
    data_identity,
    digests,
    get_dataset,
    integrity,
    load_a1a,
    load_australian,
    load_breast_cancer,
    load_digits,
    load_libsvm,
    load_mnist_subset,
    load_uci,
    load_usps_3vs5,
    load_vadam_presplit,
    parse_libsvm,
    uci,
    uci_split_files,
)
from refbayes.datasets.registry import UCI_FOLDERS, UCI_N_SPLITS

AUS = "australian/australian_scale"
BOSTON = "uci_regression/bostonHousing/data"


def _copy(data_dir, dest, rel):
    """Copy file or folder ``rel`` of the staged data to ``dest / rel``: bytes only, no mode
    bits (the staged copy is read-only), so the test can damage the copy."""
    src, dst = data_dir / rel, dest / rel
    if src.is_dir():
        shutil.copytree(src, dst, copy_function=shutil.copyfile)
    else:
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
    return dst


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _spec(name, rel):
    return next(f for f in get_dataset(name).files if f.path == rel)


def _truncated_australian(data_dir, tmp_path, rows=291):
    path = _copy(data_dir, tmp_path, AUS)
    lines = path.read_text().splitlines(keepends=True)
    assert len(lines) == 690
    path.write_text("".join(lines[:rows]))
    return path


# ----------------------------------------------------------------------------- damaged files

def test_truncated_australian_is_rejected_with_file_checksums_and_fix(data_dir, tmp_path):
    path = _truncated_australian(data_dir, tmp_path)
    spec = _spec("australian", AUS)
    with pytest.raises(DataVerificationError) as info:
        load_australian(tmp_path)
    msg = str(info.value)
    assert isinstance(info.value, ValueError)
    assert str(path) in msg
    assert f"expected sha256 {spec.sha256}" in msg
    assert f"found sha256    {_sha(path)}" in msg
    assert f"expected size   {spec.size} bytes" in msg
    assert f"found size      {path.stat().st_size} bytes" in msg
    assert "291 rows" in msg  # the content check's verdict for a LIBSVM text file
    assert "refbayes data fetch australian" in msg


def test_truncated_australian_fails_the_reproduce_command(data_dir, tmp_path, capsys):
    # The report: this exited 0 with a wrong result on 291 of 690 rows.
    _truncated_australian(data_dir, tmp_path / "data")
    code = main(["reproduce", "slang-logreg", "--dataset", "australian", "--epochs", "1",
                 "--restarts", "1", "--methods", "slang-1", "--data-dir", str(tmp_path / "data"),
                 "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2
    assert "does not match the registry" in err and "refbayes data fetch australian" in err
    assert "Traceback" not in err


def test_one_changed_digit_in_boston_is_rejected(data_dir, tmp_path):
    folder = _copy(data_dir, tmp_path, BOSTON)
    path = folder / "data.txt"
    text = path.read_text()
    i = next(k for k, c in enumerate(text) if c in "123456789")
    damaged = text[:i] + ("2" if text[i] != "2" else "3") + text[i + 1:]
    path.write_text(damaged)
    assert len(damaged) == len(text)  # same size: only the sha256 can tell
    spec = _spec("boston", f"{BOSTON}/data.txt")
    for load in (lambda: load_uci("boston", 0, tmp_path),
                 lambda: data_identity("boston", tmp_path, [f"{BOSTON}/data.txt"])):
        with pytest.raises(DataVerificationError) as info:
            load()
        msg = str(info.value)
        assert str(path) in msg and spec.sha256 in msg and _sha(path) in msg
        assert "size" not in msg.split("Fix:")[0]  # sizes agree, so they are not listed
        assert "refbayes data fetch boston" in msg


@pytest.mark.parametrize("name, load, rel", [
    ("australian", load_australian, AUS),
    ("breast-cancer", load_breast_cancer, "breast-cancer/breast-cancer_scale"),
    ("a1a", load_a1a, "a1a/a1a"),
    ("a1a", load_a1a, "a1a/a1a.t"),
    ("usps", load_usps_3vs5, "usps/usps_all.mat"),
    ("mnist-5k", load_mnist_subset, "mnist/mnist_5k.csv.gz"),
    ("digits", load_digits, "digits/digits.csv.gz"),
    *[("australian", lambda d: load_vadam_presplit("australian", d),
       f"australian/vadam_presplit/australian_scale_{p}.csv") for p in ("X_tr", "y_tr", "X_te", "y_te")],
    *[("breast-cancer", lambda d: load_vadam_presplit("breast-cancer", d),
       f"breast-cancer/vadam_presplit/breast_cancer_scale_{p}.csv")
      for p in ("X_tr", "y_tr", "X_te", "y_te")],
    *[("boston", lambda d: load_uci("boston", 7, d), rel) for rel in uci_split_files("boston", 7)],
], ids=lambda v: v if isinstance(v, str) else "")
def test_every_file_a_loader_reads_is_verified(data_dir, tmp_path, name, load, rel):
    """Two more bytes at the end of any one file the loader reads, the rest intact: it raises.
    ("0\n" is one more all-zero example in LIBSVM text, so the content check fails too.)"""
    folder = get_dataset(name).folder
    _copy(data_dir, tmp_path, folder)
    load(tmp_path)  # the intact copy loads
    with open(tmp_path / rel, "ab") as fh:
        fh.write(b"0\n")
    with pytest.raises(DataVerificationError, match=f"(?s){rel}.*refbayes data fetch {name}"):
        load(tmp_path)


def test_registered_path_given_to_load_libsvm_is_verified(data_dir, tmp_path):
    path = _truncated_australian(data_dir, tmp_path)
    with pytest.raises(DataVerificationError, match="refbayes data fetch australian"):
        load_libsvm(path, 14)
    X, _ = parse_libsvm(path, 14)  # the bare parser does not verify
    assert X.shape == (291, 14)


def test_libsvm_text_with_other_bytes_but_the_same_content_is_accepted(data_dir, tmp_path):
    path = _copy(data_dir, tmp_path, AUS)
    text = path.read_text()
    assert "+1 " in text
    path.write_text(text.replace("+1 ", "1 "))  # LIBSVM's upstream spelling may differ so
    assert _sha(path) != _spec("australian", AUS).sha256
    d = load_australian(tmp_path)
    assert d.X.shape == (690, 14)
    assert data_identity("australian", tmp_path, [AUS]) == {AUS: _sha(path)}


def test_fake_files_under_registered_names_are_rejected(tmp_path):
    """The fake files that some reader tests write (with ``skip_data_verification``) do not get
    past the check when it is on."""
    (tmp_path / "digits").mkdir()
    with gzip.open(tmp_path / "digits" / "digits.csv.gz", "wt") as fh:
        fh.write("1,2,3\n")
    with pytest.raises(DataVerificationError, match="refbayes data fetch digits"):
        load_digits(tmp_path)


# ----------------------------------------------------------------------------- verdict cache

def test_repeat_load_does_not_rehash_until_the_file_changes(data_dir, tmp_path, monkeypatch):
    path = _copy(data_dir, tmp_path, AUS)
    calls = []
    real = digests.sha256_file

    def counting(p):
        calls.append(os.path.basename(p))
        return real(p)

    monkeypatch.setattr(digests, "sha256_file", counting)
    first = load_australian(tmp_path)
    assert calls == ["australian_scale"]
    second = load_australian(tmp_path)
    assert calls == ["australian_scale"]  # cached: (path, size, mtime_ns) unchanged
    np.testing.assert_array_equal(first.X, second.X)
    data_identity("australian", tmp_path, [AUS])
    assert len(calls) == 1  # the same cache
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # touch
    load_australian(tmp_path)
    assert calls == ["australian_scale"] * 2


def test_a_failed_verdict_is_cached_too_and_repair_is_seen(data_dir, tmp_path, monkeypatch):
    path = _truncated_australian(data_dir, tmp_path)
    calls = []
    real = digests.sha256_file
    monkeypatch.setattr(digests, "sha256_file", lambda p: calls.append(p) or real(p))
    for _ in range(2):
        with pytest.raises(DataVerificationError):
            load_australian(tmp_path)
    assert len(calls) == 1
    shutil.copyfile(data_dir / AUS, path)  # repaired: new size and mtime
    assert load_australian(tmp_path).X.shape == (690, 14)
    assert len(calls) == 2


def test_clear_cache_forces_a_rehash(data_dir, tmp_path, monkeypatch):
    _copy(data_dir, tmp_path, AUS)
    calls = []
    real = digests.sha256_file
    monkeypatch.setattr(digests, "sha256_file", lambda p: calls.append(p) or real(p))
    load_australian(tmp_path)
    integrity.clear_cache()
    load_australian(tmp_path)
    assert len(calls) == 2


# ----------------------------------------------------------------------------- user's own files

def test_unregistered_file_loads_with_a_warning_naming_it(tmp_path):
    path = tmp_path / "my_own.svm"
    path.write_text("+1 1:0.5\n-1 2:1\n")
    with pytest.warns(UnverifiedDataWarning, match=r"my_own\.svm.*unverified") as record:
        X, y = load_libsvm(path)
    assert issubclass(record[0].category, UserWarning)
    np.testing.assert_array_equal(X, [[0.5, 0], [0, 1]])
    np.testing.assert_array_equal(y, [1, -1])


def test_registered_file_loads_without_a_warning(data_dir):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_libsvm(data_dir / AUS, 14)
        load_australian(data_dir)
        load_uci("boston", 0, data_dir)


# ----------------------------------------------------------------------------- data_identity

def test_data_identity_of_the_staged_copy_is_the_registry(data_dir):
    spec = get_dataset("australian")
    assert data_identity("australian", data_dir) == {f.path: f.sha256 for f in spec.files}
    rels = uci_split_files("boston", 3)
    got = data_identity("boston", data_dir, rels)
    assert list(got) == sorted(rels)
    assert got == {r: _spec("boston", r).sha256 for r in rels}


def test_data_identity_covers_the_files_present(data_dir, tmp_path):
    _copy(data_dir, tmp_path, AUS)
    assert data_identity("australian", tmp_path) == {AUS: _spec("australian", AUS).sha256}


def test_data_identity_resolves_the_data_dir_like_the_loaders(data_dir, monkeypatch, no_data_env):
    monkeypatch.setenv("REFBAYES_DATA", str(data_dir))
    assert data_identity("australian", relpaths=[AUS]) == {AUS: _spec("australian", AUS).sha256}


def test_data_identity_bad_input(data_dir, tmp_path):
    with pytest.raises(ValueError, match="dataset: expected one of"):
        data_identity("cifar100", data_dir)
    with pytest.raises(ValueError, match=r"relpaths: 'a1a/a1a' is not a registered file of dataset 'australian'"):
        data_identity("australian", data_dir, ["a1a/a1a"])
    with pytest.raises(ValueError, match="relpaths: expected a list"):
        data_identity("australian", data_dir, AUS)
    with pytest.raises(FileNotFoundError, match="refbayes data fetch australian"):
        data_identity("australian", tmp_path)
    with pytest.raises(FileNotFoundError, match="australian_scale"):
        data_identity("australian", tmp_path, [AUS])


# ----------------------------------------------------------------------------- uci_split_files

@pytest.mark.parametrize("name", sorted(UCI_FOLDERS))
def test_uci_split_files_are_registered_files_of_the_dataset(name):
    registered = {f.path for f in get_dataset(name).files}
    for split in range(UCI_N_SPLITS[name]):
        rels = uci_split_files(name, split)
        assert len(rels) == 5 and set(rels) <= registered


def test_load_uci_reads_exactly_uci_split_files(data_dir, monkeypatch):
    seen = []
    real = uci.verified_file
    monkeypatch.setattr(uci, "verified_file", lambda n, rel, d=None: seen.append(rel) or real(n, rel, d))
    load_uci("yacht", 4, data_dir)
    assert sorted(seen) == sorted(uci_split_files("yacht", 4))


def test_uci_split_files_bad_input():
    with pytest.raises(ValueError, match=r"split: expected an integer in \[0, 4\]"):
        uci_split_files("protein", 5)
    with pytest.raises(ValueError, match="name: expected one of"):
        uci_split_files("bostonHousing", 0)


# ----------------------------------------------------------------------------- parse errors name the file

def _boston_with_bad_cell(data_dir, tmp_path):
    path = _copy(data_dir, tmp_path, f"{BOSTON}/data.txt")
    lines = path.read_text().splitlines()
    cells = lines[2].split()
    cells[4] = "0.5x8"
    lines[2] = " ".join(cells)
    path.write_text("\n".join(lines) + "\n")
    return path


def test_uci_data_parse_error_names_the_file(data_dir, tmp_path):
    path = _boston_with_bad_cell(data_dir, tmp_path)
    with pytest.raises(ValueError, match=rf"^{path}: could not parse as numeric text: .*0\.5x8"):
        uci._read_table(path)


def test_uci_load_parse_error_names_the_file(data_dir, tmp_path, skip_data_verification):
    # With the registry check off (it would reject the file first), the loader's own message.
    path = _boston_with_bad_cell(data_dir, tmp_path)
    for rel in uci_split_files("boston", 0)[1:]:
        _copy(data_dir, tmp_path, rel)
    with pytest.raises(ValueError, match=rf"^{path}: could not parse as numeric text"):
        load_uci("boston", 0, tmp_path)


def test_uci_index_parse_error_names_the_file(tmp_path):
    path = tmp_path / "index_train_0.txt"
    path.write_text("1\n2\nthree\n")
    with pytest.raises(ValueError, match=rf"^{path}: could not parse as numeric text"):
        uci._read_index_file(path, 10)


def test_csv_gz_and_presplit_parse_errors_name_the_file(tmp_path, skip_data_verification):
    (tmp_path / "digits").mkdir()
    (tmp_path / "digits" / "digits.csv.gz").write_bytes(b"not gzip")
    with pytest.raises(ValueError, match=r"digits\.csv\.gz: could not parse as numeric text"):
        load_digits(tmp_path)
    folder = tmp_path / "australian" / "vadam_presplit"
    folder.mkdir(parents=True)
    for part in ("X_tr", "y_tr", "X_te", "y_te"):
        (folder / f"australian_scale_{part}.csv").write_text("1 2\n3 oops\n")
    with pytest.raises(ValueError, match=r"australian_scale_X_tr\.csv: could not parse as numeric text"):
        load_vadam_presplit("australian", tmp_path)


def test_damaged_mat_file_error_names_the_file(tmp_path, skip_data_verification):
    (tmp_path / "usps").mkdir()
    (tmp_path / "usps" / "usps_all.mat").write_bytes(b"\x00" * 200)
    with pytest.raises(ValueError, match=r"usps_all\.mat: could not read as a MATLAB \.mat file"):
        load_usps_3vs5(tmp_path)


def test_libsvm_non_ascii_byte_names_file_and_line(tmp_path):
    path = tmp_path / "d.svm"
    path.write_bytes(b"1 1:0.5\n-1 2:1\xe9\n")
    with pytest.raises(ValueError, match=r"d\.svm:2: expected ASCII text, got byte b'\\xe9' at column 7"):
        parse_libsvm(path)
