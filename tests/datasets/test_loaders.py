"""Classification readers on the staged data: shapes, label codes and counts, first rows."""
import gzip

import numpy as np
import pytest
import scipy.io

from refbayes.datasets import (get_dataset, libsvm_content_digest, load_a1a, load_australian, load_breast_cancer, load_digits,
                               load_mnist_subset, load_usps_3vs5, load_vadam_presplit)
from refbayes.datasets.loaders import map_labels
from tests.reference.libsvm_text import first_line
from tests.tolerances import EXACT_F32, assert_close


def _first_csv_line(path):
    with gzip.open(path, "rt") as fh:
        return [int(t) for t in fh.readline().split(",")]


def _counts(y):
    values, counts = np.unique(y, return_counts=True)
    return dict(zip(values.tolist(), counts.tolist()))


@pytest.mark.parametrize("loader, rel, p, label_map, counts", [
    (load_australian, "australian/australian_scale", 14, {"-1": 0.0, "+1": 1.0}, {0.0: 383, 1.0: 307}),
    (load_breast_cancer, "breast-cancer/breast-cancer_scale", 10, {"2": 0.0, "4": 1.0},
     {0.0: 444, 1.0: 239}),
])
def test_binary_libsvm_readers(data_dir, loader, rel, p, label_map, counts):
    X, y = loader(data_dir)
    assert X.shape == (sum(counts.values()), p) and X.dtype == np.float64 and y.dtype == np.float64
    assert _counts(y) == counts
    label, row = first_line(data_dir / rel, p)
    np.testing.assert_array_equal(X[0], row)
    assert y[0] == label_map[label]
    assert X.min() >= -1 and X.max() <= 1


def test_breast_cancer_first_line_is_the_published_one(data_dir):
    X, y = load_breast_cancer(data_dir)
    # The upstream first line quoted in SOURCES.md: label 2 (benign) -> 0.
    expected = [-0.860107, -0.111111, -1, -1, -1, -0.777778, -1, -0.555556, -1, -1]
    np.testing.assert_array_equal(X[0], expected)
    assert y[0] == 0.0


@pytest.fixture(scope="module")
def a1a(data_dir):
    return load_a1a(data_dir)


def test_a1a_train_and_test(a1a, data_dir):
    assert a1a.X_train.shape == (1605, 123) and a1a.X_test.shape == (30956, 123)
    assert _counts(a1a.y_train) == {0.0: 1210, 1.0: 395}
    assert _counts(a1a.y_test) == {0.0: 23510, 1.0: 7446}
    # Features 120-123 (columns 119-122) never occur in the training file.
    assert not a1a.X_train[:, 119:].any() and a1a.X_test[:, 119:].any()
    assert set(np.unique(a1a.X_train).tolist()) == {0.0, 1.0}
    for X, y, rel in ((a1a.X_train, a1a.y_train, "a1a/a1a"), (a1a.X_test, a1a.y_test, "a1a/a1a.t")):
        label, row = first_line(data_dir / rel, 123)
        np.testing.assert_array_equal(X[0], row)
        assert y[0] == {"-1": 0.0, "+1": 1.0}[label]
    # The recorded content digest of a1a.t (labels as written, -1/+1) matches this parse.
    check = next(f.content for f in get_dataset("a1a").files if f.path == "a1a/a1a.t")
    assert libsvm_content_digest(a1a.X_test, 2.0 * a1a.y_test - 1.0) == check.digest


def test_usps_3vs5(data_dir):
    X, y = load_usps_3vs5(data_dir)
    assert X.shape == (2200, 256) and y.shape == (2200,)
    assert _counts(y) == {0.0: 1100, 1.0: 1100}
    assert X.min() >= 0 and X.max() <= 1
    raw = scipy.io.loadmat(data_dir / "usps" / "usps_all.mat")["data"]
    # Slice k - 1 holds digit k; columns are column-major 16 x 16 images, so the upright image
    # is the transpose of a C-order reshape.
    np.testing.assert_array_equal(X[0], (raw[:, 0, 2].reshape(16, 16).T / 255.0).ravel())
    np.testing.assert_array_equal(X[1100 + 7], (raw[:, 7, 4].reshape(16, 16).T / 255.0).ravel())


@pytest.mark.parametrize("loader, rel, shape, scale", [
    (load_mnist_subset, "mnist/mnist_5k.csv.gz", (5000, 784), 255.0),
    (load_digits, "digits/digits.csv.gz", (1797, 64), 16.0),
])
def test_image_csv_readers(data_dir, loader, rel, shape, scale):
    X, y = loader(data_dir)
    assert X.shape == shape and X.dtype == np.float64 and y.dtype == np.int64
    assert X.min() >= 0 and X.max() == 1.0
    first = _first_csv_line(data_dir / rel)
    np.testing.assert_array_equal(X[0] * scale, first[:-1])
    assert y[0] == first[-1]


def test_mnist_is_sorted_with_500_per_digit(data_dir):
    _, y = load_mnist_subset(data_dir)
    assert _counts(y) == {d: 500 for d in range(10)}
    assert np.all(np.diff(y) >= 0)


def test_digits_class_counts(data_dir):
    _, y = load_digits(data_dir)
    counts = np.bincount(y, minlength=10)
    assert counts.sum() == 1797 and counts.min() == 174 and counts.max() == 183


@pytest.mark.parametrize("name, p, n_train, n_test", [("australian", 14, 345, 345),
                                                       ("breast-cancer", 10, 341, 342)])
def test_vadam_presplit(data_dir, name, p, n_train, n_test):
    s = load_vadam_presplit(name, data_dir)
    assert s.X_train.shape == (n_train, p) and s.X_test.shape == (n_test, p)
    assert set(np.unique(np.concatenate([s.y_train, s.y_test])).tolist()) == {0.0, 1.0}
    # The presplit partitions the LIBSVM set: same multiset of rows and labels.
    full = (load_australian if name == "australian" else load_breast_cancer)(data_dir)
    both = np.column_stack([np.vstack([s.X_train, s.X_test]), np.concatenate([s.y_train, s.y_test])])
    ref = np.column_stack([full.X, full.y])
    # lexsorted rows, not np.unique: breast-cancer has 16 duplicate rows, and a multiset must count them
    np.testing.assert_array_equal(_sorted_rows(both), _sorted_rows(ref))


def _sorted_rows(A):
    return A[np.lexsort(A.T[::-1])]


@pytest.mark.parametrize("loader, mat, to01", [
    (load_australian, "australian/australian_scale.mat", lambda y: (y + 1) / 2),
    (load_breast_cancer, "breast-cancer/breast_cancer_scale.mat", lambda y: (y - 2) / 2),
])
def test_libsvm_loaders_equal_the_mat_copies(data_dir, loader, mat, to01):
    """Every value, against the independent .mat copy read by scipy.io (SOURCES.md: same data)."""
    ref = scipy.io.loadmat(data_dir / mat)
    X, y = loader(data_dir)
    np.testing.assert_array_equal(X, ref["X"].toarray())
    np.testing.assert_array_equal(y, to01(ref["y"].ravel().astype(np.float64)))


def test_a1a_equals_the_mat_copy(data_dir):
    """a1a's .mat has 119 training columns (MATLAB sizes to the largest index): pad to 123."""
    ref = scipy.io.loadmat(data_dir / "a1a/a1a.mat")
    a1a = load_a1a(data_dir)
    X_ref = np.hstack([ref["X"].toarray(), np.zeros((ref["X"].shape[0], 4))])
    np.testing.assert_array_equal(a1a.X_train, X_ref)
    np.testing.assert_array_equal(a1a.X_test, ref["X_te"].toarray())
    np.testing.assert_array_equal(a1a.y_train, (ref["y"].ravel() + 1) / 2)
    np.testing.assert_array_equal(a1a.y_test, (ref["y_te"].ravel() + 1) / 2)


def test_float32_readers(data_dir):
    X64, y64 = load_australian(data_dir)
    X32, y32 = load_australian(data_dir, dtype=np.float32)
    assert X32.dtype == np.float32 and y32.dtype == np.float32
    assert_close(X32, X64, EXACT_F32, "australian float32")
    D32 = load_digits(data_dir, dtype="float32")
    assert D32.X.dtype == np.float32 and D32.y.dtype == np.int64


@pytest.mark.parametrize("loader", [load_australian, load_breast_cancer, load_a1a, load_usps_3vs5,
                                    load_mnist_subset, load_digits])
def test_bad_dtype(loader, tmp_path):
    with pytest.raises(ValueError, match="dtype: expected float64 or float32"):
        loader(tmp_path, dtype=np.float16)


@pytest.mark.parametrize("loader, name", [(load_australian, "australian"), (load_a1a, "a1a"),
                                          (load_usps_3vs5, "usps"), (load_mnist_subset, "mnist-5k"),
                                          (load_digits, "digits"),
                                          (load_breast_cancer, "breast-cancer")])
def test_missing_files(loader, name, tmp_path):
    with pytest.raises(FileNotFoundError, match=f"(?s)dataset '{name}'.*refbayes data fetch {name}"):
        loader(tmp_path)


def test_vadam_presplit_bad_name(tmp_path):
    with pytest.raises(ValueError, match="name: expected one of"):
        load_vadam_presplit("a1a", tmp_path)


def test_unexpected_labels_are_rejected(tmp_path, skip_data_verification):
    (tmp_path / "breast-cancer").mkdir()
    (tmp_path / "breast-cancer" / "breast-cancer_scale").write_text("2 1:0.5\n3 1:0.1\n")
    with pytest.raises(ValueError, match=r"labels of .*: expected labels in \[2.0, 4.0\], got \[3.0\]"):
        load_breast_cancer(tmp_path)


def test_map_labels():
    np.testing.assert_array_equal(map_labels(np.array([4.0, 2.0, 4.0]), {2.0: 0.0, 4.0: 1.0}, "y"),
                                  [1.0, 0.0, 1.0])
    with pytest.raises(ValueError, match=r"y: expected labels in \[-1, 1\], got \[0\]"):
        map_labels(np.array([1, 0, -1]), {-1: 0, 1: 1}, "y")


def test_wrong_csv_width(tmp_path, skip_data_verification):
    (tmp_path / "digits").mkdir()
    with gzip.open(tmp_path / "digits" / "digits.csv.gz", "wt") as fh:
        fh.write("1,2,3\n")
    with pytest.raises(ValueError, match="expected 65 comma-separated columns, got 3"):
        load_digits(tmp_path)


def test_wrong_usps_variable(tmp_path, skip_data_verification):
    (tmp_path / "usps").mkdir()
    scipy.io.savemat(tmp_path / "usps" / "usps_all.mat", {"data": np.zeros((256, 10, 10), np.uint8)})
    with pytest.raises(ValueError, match=r"expected variable 'data' of shape \(256, 1100, 10\)"):
        load_usps_3vs5(tmp_path)
