"""Benchmark datasets: data-directory resolution, readers, protocol splits, synthetic data,
download and verification.

Real data resolves from ``data_dir`` (``--data-dir``), then ``$REFBAYES_DATA``, then the user
cache (:func:`resolve_data_dir`); ``refbayes data fetch NAME`` fills the cache. The registry
(:data:`DATASETS`) records every file's sha256, size, source, citation and caveats; every
loader verifies the files it reads against it (:mod:`refbayes.datasets.integrity`), and
:func:`data_identity` gives the verified digests for result provenance.
"""
from refbayes.datasets._containers import Data, TrainTest
from refbayes.datasets.cifar import CIFAR10_CLASSES, load_cifar10
from refbayes.datasets.digests import FileStatus, libsvm_content_digest
from refbayes.datasets.download import ChecksumMismatchError, DownloadError, fetch, verify
from refbayes.datasets.integrity import DataVerificationError, UnverifiedDataWarning, data_identity
from refbayes.datasets.libsvm import parse_libsvm
from refbayes.datasets.loaders import (load_a1a, load_australian, load_breast_cancer, load_digits,
                                       load_fashion_mnist, load_libsvm, load_mnist,
                                       load_mnist_subset, load_usps_3vs5, load_vadam_presplit)
from refbayes.datasets.paths import resolve_data_dir, user_cache_dir
from refbayes.datasets.preprocess import (Standardizer, TrainValidation, fit_standardizer,
                                          random_split, standardize, validation_split)
from refbayes.datasets.registry import DATASETS, DatasetSpec, FileSpec, dataset_names, get_dataset
from refbayes.datasets.synthetic import Synthetic, make_linear_regression, make_logistic_regression
from refbayes.datasets.uci import UCI_NAMES, load_uci, uci_n_splits, uci_split_files

__all__ = [
    "Data", "TrainTest", "resolve_data_dir", "user_cache_dir",
    "DATASETS", "DatasetSpec", "FileSpec", "dataset_names", "get_dataset",
    "data_identity", "DataVerificationError", "UnverifiedDataWarning",
    "load_libsvm", "parse_libsvm", "load_australian", "load_breast_cancer", "load_a1a", "load_usps_3vs5",
    "load_mnist_subset", "load_mnist", "load_fashion_mnist", "load_cifar10", "CIFAR10_CLASSES",
    "load_digits", "load_vadam_presplit",
    "UCI_NAMES", "load_uci", "uci_n_splits", "uci_split_files",
    "Standardizer", "fit_standardizer", "standardize", "TrainValidation", "validation_split",
    "random_split",
    "Synthetic", "make_linear_regression", "make_logistic_regression",
    "FileStatus", "DownloadError", "ChecksumMismatchError", "libsvm_content_digest", "fetch", "verify",
]
