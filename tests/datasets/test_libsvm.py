"""LIBSVM text reader: format edge cases on tmp files, and the staged files' first rows."""
import numpy as np
import pytest

from refbayes.datasets import load_libsvm
from tests.reference.libsvm_text import first_line
from tests.tolerances import EXACT_F32, assert_close

# The parser tests read the user's own tmp files, which load_libsvm reads with an
# UnverifiedDataWarning; that warning is tested in test_verify_on_load.py.
pytestmark = pytest.mark.filterwarnings("ignore::refbayes.datasets.UnverifiedDataWarning")


def _write(tmp_path, text, name="d.svm"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_basic_layout_and_label_spellings(tmp_path):
    path = _write(tmp_path, "+1 1:0.5 3:-2 \n\n-1 2:1e-3\n1 3:4   # comment\n   \n")
    X, y = load_libsvm(path)
    np.testing.assert_array_equal(y, [1.0, -1.0, 1.0])
    np.testing.assert_array_equal(X, [[0.5, 0, -2], [0, 1e-3, 0], [0, 0, 4]])
    assert X.dtype == np.float64 and y.dtype == np.float64


def test_n_features_pads_absent_columns(tmp_path):
    X, _ = load_libsvm(_write(tmp_path, "1 1:1\n-1 2:1\n"), n_features=5)
    assert X.shape == (2, 5)
    assert not X[:, 2:].any()


def test_label_only_line_is_an_all_zero_row(tmp_path):
    X, y = load_libsvm(_write(tmp_path, "1 2:3\n-1\n"))
    np.testing.assert_array_equal(X, [[0, 3], [0, 0]])
    np.testing.assert_array_equal(y, [1, -1])


def test_float32(tmp_path):
    path = _write(tmp_path, "1 1:0.1 2:0.7\n-1 2:1.3\n")
    X64, y64 = load_libsvm(path)
    X32, y32 = load_libsvm(path, dtype=np.float32)
    assert X32.dtype == np.float32 and y32.dtype == np.float32
    assert_close(X32, X64, EXACT_F32, "float32 X")
    assert_close(y32, y64, EXACT_F32, "float32 y")


@pytest.mark.parametrize("text, match", [
    ("1 1:0.5\n1 a:2\n", r"d\.svm:2: expected 'index:value'"),
    ("1 1:0.5\n1 0:2\n", r"d\.svm:2: expected index >= 1"),
    ("1 1:0.5\n1 -1:2\n", r"d\.svm:2: expected 'index:value'"),
    ("1 1:0.5\n\n1 2\n", r"d\.svm:3: expected 'index:value'"),
    ("1 1:x\n", r"d\.svm:1: expected a number after ':'"),
    ("1 1:nan\n", r"d\.svm:1: expected index >= 1 and a finite value"),
    ("yes 1:1\n", r"d\.svm:1: expected a numeric label"),
    ("inf 1:1\n", r"d\.svm:1: expected a finite label"),
    ("1 2:1 2:3\n", r"d\.svm:1: index 2 appears twice"),
    ("1 qid:3 1:1\n", r"d\.svm:1: expected 'index:value'"),
    ("\n  \n# only a comment\n", r"expected at least one"),
])
def test_malformed_lines_name_file_and_line(tmp_path, text, match):
    with pytest.raises(ValueError, match=match):
        load_libsvm(_write(tmp_path, text))


def test_index_beyond_n_features(tmp_path):
    with pytest.raises(ValueError, match=r"d\.svm:2: expected indices in \[1, 3\].*got index 4"):
        load_libsvm(_write(tmp_path, "1 3:1\n-1 4:1\n"), n_features=3)


@pytest.mark.parametrize("bad, match", [(0, "n_features: expected an integer in"),
                                        (2.5, "n_features: expected an integer"),
                                        ("3", "n_features: expected an integer")])
def test_bad_n_features(tmp_path, bad, match):
    with pytest.raises(ValueError, match=match):
        load_libsvm(_write(tmp_path, "1 1:1\n"), n_features=bad)


def test_bad_dtype_and_path(tmp_path):
    path = _write(tmp_path, "1 1:1\n")
    with pytest.raises(ValueError, match="dtype: expected float64 or float32, got int64"):
        load_libsvm(path, dtype=np.int64)
    with pytest.raises(ValueError, match="path: expected a file path, got int"):
        load_libsvm(3)


@pytest.mark.parametrize("rel, p, n", [("australian/australian_scale", 14, 690),
                                       ("breast-cancer/breast-cancer_scale", 10, 683),
                                       ("a1a/a1a", 123, 1605)])
def test_staged_first_row_matches_raw_text(data_dir, rel, p, n):
    X, y = load_libsvm(data_dir / rel, n_features=p)
    label, row = first_line(data_dir / rel, p)
    assert X.shape == (n, p) and y.shape == (n,)
    np.testing.assert_array_equal(X[0], row)
    assert y[0] == float(label)
