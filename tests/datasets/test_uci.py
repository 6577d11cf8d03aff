"""UCI regression splits on the staged data, and Gal's standardization on naval."""
import math

import numpy as np
import pytest

from refbayes.datasets import UCI_NAMES, load_uci, standardize, uci_n_splits
from refbayes.datasets.registry import UCI_FOLDERS
from tests.tolerances import EXACT_F32, EXACT_F64, assert_close

# From SOURCES.md: data.txt rows, number of features, target column, train/test sizes, splits.
TABLE = {
    "boston": (506, 13, 13, 455, 51, 20),
    "concrete": (1030, 8, 8, 927, 103, 20),
    "energy": (768, 8, 8, 691, 77, 20),
    "kin8nm": (8192, 8, 8, 7373, 819, 20),
    "naval": (11934, 16, 16, 10741, 1193, 20),
    "power": (9568, 4, 4, 8611, 957, 20),
    "protein": (45730, 9, 9, 41157, 4573, 5),
    "wine": (1599, 11, 11, 1439, 160, 20),
    "yacht": (308, 6, 6, 277, 31, 20),
}


def _raw_row(path, row):
    """Line ``row`` (0-based) of a whitespace-separated text file, parsed independently."""
    with open(path) as fh:
        for i, line in enumerate(fh):
            if i == row:
                return [float(t) for t in line.split()]
    raise AssertionError(f"{path} has no row {row}")


def _first_index(path):
    with open(path) as fh:
        return int(fh.readline())


def test_names_cover_the_table():
    assert set(UCI_NAMES) == set(TABLE)
    assert {n: uci_n_splits(n) for n in UCI_NAMES} == {n: t[5] for n, t in TABLE.items()}


@pytest.mark.parametrize("name", sorted(TABLE))
def test_split_shapes_and_first_rows(data_dir, name):
    n, p, target, n_train, n_test, n_splits = TABLE[name]
    folder = data_dir / "uci_regression" / UCI_FOLDERS[name] / "data"
    for split in (0, n_splits - 1):
        s = load_uci(name, split, data_dir)
        assert s.X_train.shape == (n_train, p) and s.y_train.shape == (n_train,)
        assert s.X_test.shape == (n_test, p) and s.y_test.shape == (n_test,)
        assert all(a.dtype == np.float64 for a in s)
        for X, y, part in ((s.X_train, s.y_train, "train"), (s.X_test, s.y_test, "test")):
            row = _raw_row(folder / "data.txt", _first_index(folder / f"index_{part}_{split}.txt"))
            np.testing.assert_array_equal(X[0], row[:p])
            assert y[0] == row[target]
    # Train and test partition the rows: the targets are the same multiset as data.txt's.
    all_y = np.loadtxt(folder / "data.txt")[:, target]
    np.testing.assert_array_equal(np.sort(np.concatenate([s.y_train, s.y_test])), np.sort(all_y))


def test_float32(data_dir):
    s64 = load_uci("yacht", 3, data_dir)
    s32 = load_uci("yacht", 3, data_dir, dtype=np.float32)
    for a, b in zip(s32, s64):
        assert a.dtype == np.float32
        assert_close(a, b, EXACT_F32, "yacht float32")


@pytest.mark.parametrize("name, split, match", [
    ("yacht", 20, r"split: expected an integer in \[0, 19\] \(yacht has 20 splits\), got 20"),
    ("protein", 5, r"split: expected an integer in \[0, 4\] \(protein has 5 splits\), got 5"),
    ("yacht", -1, r"split: expected an integer in \[0, 19\]"),
    ("yacht", 1.0, r"split: expected an integer, got 1.0"),
    ("bostonHousing", 0, r"name: expected one of boston, concrete"),
])
def test_bad_split_or_name(tmp_path, name, split, match):
    with pytest.raises(ValueError, match=match):
        load_uci(name, split, tmp_path)


def test_missing_uci_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"(?s)dataset 'wine'.*wine-quality-red/data/data\.txt"):
        load_uci("wine", 0, tmp_path)


def _fake_uci(tmp_path, train, test):
    folder = tmp_path / "uci_regression" / "yacht" / "data"
    folder.mkdir(parents=True)
    np.savetxt(folder / "data.txt", np.arange(12.0).reshape(4, 3))
    (folder / "index_features.txt").write_text("0\n1\n")
    (folder / "index_target.txt").write_text("2\n")
    (folder / "index_train_0.txt").write_text(train)
    (folder / "index_test_0.txt").write_text(test)
    return folder


def test_corrupt_index_files(tmp_path, skip_data_verification):
    _fake_uci(tmp_path, "0\n1\n2\n", "2\n3\n")
    with pytest.raises(ValueError, match="expected disjoint train and test"):
        load_uci("yacht", 0, tmp_path)


def test_out_of_range_index(tmp_path, skip_data_verification):
    _fake_uci(tmp_path, "0\n1\n4\n", "3\n")
    with pytest.raises(ValueError, match=r"index_train_0\.txt: expected distinct 0-based indices in \[0, 3\]"):
        load_uci("yacht", 0, tmp_path)


def test_small_fake_split(tmp_path, skip_data_verification):
    _fake_uci(tmp_path, "3\n0\n", "1\n2\n")
    s = load_uci("yacht", 0, tmp_path)
    np.testing.assert_array_equal(s.X_train, [[9, 10], [0, 1]])
    np.testing.assert_array_equal(s.y_test, [5, 8])


def test_naval_constant_columns_standardize_to_zero(data_dir):
    s = load_uci("naval", 0, data_dir)
    assert np.ptp(s.X_train[:, 8]) == 0 and np.ptp(s.X_train[:, 11]) == 0
    scaled, stats = standardize(*s)
    assert not np.isnan(scaled.X_train).any()
    np.testing.assert_array_equal(stats.x_std[[8, 11]], [1.0, 1.0])
    np.testing.assert_array_equal(scaled.X_train[:, [8, 11]], 0.0)
    np.testing.assert_array_equal(scaled.X_test[:, [8, 11]], 0.0)
    varying = [j for j in range(16) if j not in (8, 11)]
    n = s.X_train.shape[0]
    fsum_means = [math.fsum(s.X_train[:, j]) / n for j in varying]  # correctly rounded sums
    assert_close(stats.x_mean[varying], fsum_means, EXACT_F64, "training means")
    assert_close(scaled.X_train[:, varying].std(axis=0), np.ones(14), EXACT_F64, "train stds")
    assert_close(scaled.X_test * stats.x_std + stats.x_mean, s.X_test, EXACT_F64, "X_test round trip")
    assert_close(stats.inverse_y(scaled.y_test), s.y_test, EXACT_F64, "targets mapped back")
