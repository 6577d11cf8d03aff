"""Full MNIST (optional dataset ``mnist``): the IDX reader on small synthetic files, load_mnist,
the registry entry, and `data list` / `data verify` / `data fetch` with the files absent.

No test downloads: the real files are read only where the data directory already holds them.
"""
import gzip
import io
import struct
import urllib.error

import numpy as np
import pytest

from refbayes.cli import main
from refbayes.datasets import (DATASETS, ChecksumMismatchError, DataVerificationError,
                               DownloadError, dataset_names, fetch, get_dataset, load_mnist,
                               verify)
from refbayes.datasets import loaders
from refbayes.datasets.idx import read_idx_images, read_idx_labels
from refbayes.datasets.registry import load_checksums

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
                             r"idx3-ubyte.gz.*data_dir argument.*REFBAYES_DATA.*user cache"
                             r".*refbayes data fetch mnist"):
        load_mnist(tmp_path / "nowhere")


def test_load_mnist_bad_dtype(tmp_path):
    with pytest.raises(ValueError, match="dtype: expected float64 or float32"):
        load_mnist(tmp_path, dtype=np.int64)


def test_load_mnist_real_files(data_dir):
    """Runs where the data directory holds full MNIST (`refbayes data fetch mnist`); the staged
    folder does not. Counts and first labels measured on a copy whose decompressed files match
    the widely published sha256 of LeCun's IDX files."""
    if not all((data_dir / "mnist-full" / f).is_file() for f in FILES):
        pytest.skip(f"{data_dir / 'mnist-full'} does not hold full MNIST (optional dataset; "
                    "`refbayes data fetch mnist` downloads it)")
    d = load_mnist(data_dir)
    assert d.X_train.shape == (60000, 784) and d.X_test.shape == (10000, 784)
    assert d.X_train.min() == 0.0 and d.X_train.max() == 1.0
    assert np.bincount(d.y_train).tolist() == [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265,
                                               5851, 5949]
    assert np.bincount(d.y_test).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    assert d.y_train[:10].tolist() == [5, 0, 4, 1, 9, 2, 1, 3, 1, 4]
    assert d.y_test[:10].tolist() == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]


# ----------------------------------------------------------------------------- registry, CLI

def test_registry_entry():
    spec = get_dataset("mnist")
    assert spec.optional and spec.folder == "mnist-full"
    assert [f.path for f in spec.files] == sorted(f"mnist-full/{f}" for f in FILES)
    for f in spec.files:
        name = f.path.split("/")[1]
        assert (f.size, f.sha256) == RECORDED[name]
        assert f.source == f"https://storage.googleapis.com/cvdf-datasets/mnist/{name}"
        assert f.content is None
    assert sum(f.size for f in spec.files) == 11594722
    # Apart from the staged 5000-image subset, and not in the staged checksum table.
    assert get_dataset("mnist-5k").folder == "mnist"
    assert not any(p.startswith("mnist-full/") for p in load_checksums())
    assert "mnist" not in dataset_names() and "mnist" in dataset_names(include_optional=True)
    assert [n for n, s in DATASETS.items() if s.optional] == ["mnist"]


def test_verify_reports_missing_then_mismatch(tmp_path):
    assert [s.status for s in verify("mnist", tmp_path)] == ["missing"] * 4
    _write(tmp_path / "mnist-full" / "t10k-labels-idx1-ubyte.gz", _label_bytes([1]))
    statuses = {s.path: s.status for s in verify("mnist", tmp_path)}
    assert statuses.pop("mnist-full/t10k-labels-idx1-ubyte.gz") == "mismatch"
    assert list(statuses.values()) == ["missing"] * 3


def test_data_list_shows_mnist(data_dir, capsys):
    assert main(["data", "list", "--data-dir", str(data_dir)]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[3:]}
    present = sum((data_dir / "mnist-full" / f).is_file() for f in FILES)  # 0 in the staged folder
    assert rows["mnist"][1:4] == [f"{present}/4", "11.59", "MB"]
    assert rows["mnist-5k"][1] == "1/1"


def test_data_verify_without_names_passes_without_full_mnist(data_dir, tmp_path, capsys):
    """The staged folder has no full MNIST; `data verify` (no names) notes the absent optional
    dataset without failing; naming mnist checks it and reports the files missing; a partly
    present optional dataset fails even without names."""
    assert main(["data", "verify", "--data-dir", str(data_dir)]) == 0
    out = capsys.readouterr().out
    assert "mnist-5k: 1/1 ok" in out
    assert "\nmnist: not present (optional; `refbayes data fetch mnist`)" in out
    assert main(["data", "verify", "mnist", "--data-dir", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert "mnist: 0/4 ok; 4 missing" in captured.out
    assert f"missing   every file under {tmp_path / 'mnist-full'}" in captured.out
    (tmp_path / "mnist-full").mkdir()
    (tmp_path / "mnist-full" / "t10k-labels-idx1-ubyte.gz").write_bytes(b"not mnist")
    assert main(["data", "verify", "--data-dir", str(tmp_path)]) == 1
    assert "mnist: 0/4 ok; 3 missing, 1 mismatch" in capsys.readouterr().out


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
