"""One classification benchmark for every method: accuracy, NLL, calibration and OOD detection.

Protocol (derivations/calibration_experiment.md gives the reasons and the measured tables):

- Data: ``mnist-5k``, the staged MNIST subset (``load_mnist_subset``: 5000 images of 784 pixels
  / 255, 500 per digit), and ``digits``, the UCI optdigits set (``load_digits``: 1797 images of 64
  counts / 16), the default run; and ``mnist``, full MNIST (``load_mnist``: 60,000 + 10,000
  images), run when asked for by name (``--dataset mnist``). The names are ``refbayes data``'s.
- Split, per dataset and seed: stratified 80 / 20: in each class (in label order), the rows
  permuted by ``default_rng(SeedSequence([seed, dataset index, 0]))``, the first
  round(0.2 n_c) to the test split, the rest to the training split (both then sorted by row).
  mnist-5k 4000 / 1000, digits 1438 / 359 (class sizes 174-183). Full MNIST keeps its official
  split, 60,000 / 10,000, for every seed (``FIXED_TRAIN``; the seed still draws the weights).
- Tasks: "main" trains on the training split (10 classes) and scores the test split; "ood"
  trains on the training rows of digits 0-4 only (a network with 5 outputs), scores the test
  rows of digits 0-4 (in-distribution) and separates them from the test rows of digits 5-9
  (out-of-distribution) by predictive entropy. On full MNIST the main task is also scored
  against Fashion-MNIST's 10,000 test images (``OOD_SETS``; OOD AUROC by predictive entropy),
  which is the table's OOD column there.
- Network: ``MLP([n_in, 200, 200, C], "relu", "categorical")`` for every method (32 hidden
  units under --quick); theta_0 Glorot (``model.init_theta``), drawn first from the training
  generator.
- Prior: N(0, I / lam) with lam = N_train * 5e-4, the SWAG paper's weight decay 5e-4 on the
  mean loss, the same for every method of a dataset and task (mnist-5k 2.0, digits 0.7185; the
  OOD task's N_train is about half).
- Methods: the registry refbayes.experiments.calibration_methods; each trains on the task's
  training rows with its own optimizer and budget (``--epochs`` sets every method's epochs,
  SWA keeping the last 45% of the SGD run), and predicts the Bayesian model average of the softmax outputs over S = 30
  posterior draws (--samples; one network for the point estimates map and swa).
- Metrics (refbayes.metrics, on the task's test rows): accuracy, NLL (nats), ECE with 15
  equal-width bins (top-label, L1: ``metrics.ece(probs, y, 15)``), multi-class Brier score,
  misclassification AUROC (``metrics.misclassification_auroc``: -entropy separating correct
  from wrong predictions), the mean confidence max_k p_ik, and on the "ood" task
  ``metrics.ood_auroc`` (entropy, OOD positive). The reliability curve
  (``metrics.reliability_curve``, the same 15 bins) is saved with each result.

Randomness: per (dataset, task, seed, method), the split generator above, a training generator
``SeedSequence([seed, dataset, task, 1, crc32(train name)])`` (a train name is shared: one SGD
run serves map and the two Laplace methods, another SWA, SWAG-Diagonal and SWAG) and a
prediction generator
``SeedSequence([seed, dataset, task, 2, crc32(method)])``. So a job's numbers do not depend on
which other jobs ran, in this invocation or before it.

Parallel runs (``--jobs N`` local processes or ``--dask-scheduler ADDRESS``,
``refbayes.experiments._runner``): one job is one training run of one (dataset, task, seed)
with the methods it serves (map; swa, swag-diag and swag together; bbb; mc_dropout; vogn), so a
shared fit still trains once; the worker reloads the data from --data-dir (and refuses data
whose checksums differ from the main process's). The results equal the serial run's bit for bit.

Output (``--out``, default results/calibration), written as the jobs finish:
``<dataset>/<task>/seed_<k>/<method>.json`` (atomic; settings, provenance, status "ok" or
"diverged" with the error, metrics, reliability curve, seconds), then ``results.csv`` (one row
per job found under --out whose settings match, for every dataset whose data is at hand),
``summary.json`` (the tables' numbers), ``table_<dataset>.md`` (the table printed on stdout, as
Markdown for the docs; stdout shows it as aligned text, like every experiment) and, with
matplotlib (the ``plot`` extra), ``reliability_<dataset>.png`` (one panel per
method: per-bin accuracy against confidence, the diagonal, ECE in the title; main task, counts
pooled over seeds). A job whose
saved settings, data checksums and refbayes version match is loaded, not recomputed; otherwise
the run stops naming the file, unless --fresh. A diverging run (``TrainingError``: non-finite
values in training or prediction) is recorded as "diverged", not raised.

Run times (``MEASURED_SECONDS``, 2-core VM, one BLAS thread): the default run 547 s (9 min) with
the seven methods of 2026-11-25 (the four added since, not yet measured end to end, make it
longer), --quick 19 s with all eleven on a loaded machine; ``--seeds K`` multiplies the default
by K. Full MNIST (``--dataset mnist --task main --epochs 20``, one seed, eleven methods): see
derivations/calibration_experiment.md.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import zlib
from pathlib import Path
from typing import NamedTuple

import numpy as np

from refbayes import metrics
from refbayes._files import atomic_write_text, format_table, write_json
from refbayes.datasets import (data_identity, load_digits, load_fashion_mnist, load_mnist,
                               load_mnist_subset)
from refbayes.experiments import _runner, calibration_methods
from refbayes.experiments._runner import (
    job_rng,
    mean_se,
    positive_int,
    provenance,
    pyplot,
    save_figure,
    write_csv,
)
from refbayes.models import MLP

__all__ = ["DATASETS", "DEFAULT_DATASETS", "DESCRIPTION", "FIXED_TRAIN", "MEASURED_SECONDS",
           "OOD_SETS", "TASKS", "add_arguments", "load_data", "load_ood", "method_settings", "run",
           "split", "stratified_split", "task_data"]

DESCRIPTION = ("Calibration benchmark: every method on one MLP, mnist-5k (the 5000-image MNIST "
               "subset), digits and full MNIST (Fashion-MNIST out of distribution): accuracy, "
               "NLL, ECE, Brier, misclassification and OOD AUROC, reliability diagrams")

PROTOCOL = 1  # bump when the protocol changes, so old result files are not mistaken for new ones
# refbayes data's names; a dataset's index seeds its split and generators: append, never reorder
DATASETS = ("mnist-5k", "digits", "mnist")
DEFAULT_DATASETS = ("mnist-5k", "digits")  # the default run; full MNIST is asked for by name
# Full MNIST keeps its official split (the first 60,000 rows train, the last 10,000 test), the
# one every published MNIST figure uses, whatever the seed (the seed still draws the weights).
FIXED_TRAIN = {"mnist": 60_000}
# The main task of these datasets is also scored against another set's test images (OOD AUROC
# by predictive entropy, the OOD set positive): Fashion-MNIST against MNIST.
OOD_SETS = {"mnist": "fashion-mnist"}
# names that mean other data in `refbayes data`: refused with the reason, never run on a stand-in
OTHER_DATA = {"fashion-mnist": "'fashion-mnist' is the out-of-distribution set of --dataset mnist "
                               "(its test images), not a benchmark of its own",
              "cifar10": "'cifar10' needs a convolutional network; this benchmark runs MLPs"}
TASKS = ("main", "ood")
TEST_FRAC = 0.2
WEIGHT_DECAY = 5e-4   # lam = N_train * WEIGHT_DECAY (the SWAG paper's weight decay)
N_BINS = 15
IN_CLASSES = 5        # the "ood" task trains on digits 0..IN_CLASSES-1
BUDGETS = {"full": {"hidden": 200, "samples": 30}, "quick": {"hidden": 32, "samples": 10}}
# (registered dataset, files its loader reads): their checksums are the result's data identity
_DATA = {"mnist-5k": (load_mnist_subset, "mnist-5k", ("mnist/mnist_5k.csv.gz",)),
         "digits": (load_digits, "digits", ("digits/digits.csv.gz",)),
         "mnist": (lambda data_dir: _stacked(load_mnist(data_dir)), "mnist", None)}
_OOD_LOADERS = {"fashion-mnist": load_fashion_mnist}  # OOD_SETS' values -> train/test loaders
SWA_FRACTION = 90 / 200  # --epochs keeps SWA's share of the SGD run (swa_epochs / epochs)

# Wall-clock seconds on the 2-core development VM (AMD EPYC) with OMP/OPENBLAS/MKL_NUM_THREADS=1.
# default: the default run with the seven methods of 2026-11-25 (both datasets, both tasks, one
# seed; mnist-5k 490 s of it, bbb the largest share: 176 s on its main task), other jobs keeping
# the load at ~1-2, peak memory 0.6 GB; the four methods added on 2026-11-27 (laplace-kron,
# laplace-ll, ktied, noisy-kfac) are not in it: their training runs (ktied ~ bbb's, noisy-kfac
# ~1.7x bbb's per epoch) add to it, not yet measured end to end. quick: --quick (digits) with all
# eleven methods, 2026-11-27, with three other runs loading the two cores (peak memory 0.26 GB).
# Remeasure when the budgets change.
MEASURED_SECONDS = {"default": 547, "quick": 19}
MEASURED_ON = "2 cores, one BLAS thread"


# ----------------------------------------------------------------------------- data

def _stacked(tt):
    """(X, y) of a train/test set, the training rows first (FIXED_TRAIN splits them again)."""
    return np.concatenate([tt[0], tt[2]]), np.concatenate([tt[1], tt[3]])


def load_data(dataset: str, data_dir=None):
    """(X (n, p) float64, y (n,) int64, data identity {file: sha256}) of ``dataset``; the
    identity covers its OOD set's files too (OOD_SETS)."""
    if dataset not in _DATA:
        hint = f" ({OTHER_DATA[dataset]})" if dataset in OTHER_DATA else ""
        raise ValueError(f"dataset: expected one of {', '.join(DATASETS)}, got {dataset!r}{hint}")
    loader, name, files = _DATA[dataset]
    X, y = loader(data_dir)
    identity = data_identity(name, data_dir, files)
    if dataset in OOD_SETS:
        identity = {**identity, **data_identity(OOD_SETS[dataset], data_dir)}
    return np.asarray(X, dtype=np.float64), np.asarray(y).astype(np.int64), identity


def load_ood(dataset: str, data_dir=None):
    """The out-of-distribution test images of ``dataset``'s main task (float64), or None: the
    test split of OOD_SETS[dataset] (Fashion-MNIST's 10,000 for mnist)."""
    if dataset not in OOD_SETS:
        return None
    return np.asarray(_OOD_LOADERS[OOD_SETS[dataset]](data_dir).X_test, dtype=np.float64)


def split(dataset: str, y, seed: int):
    """(train, test) row indices of ``dataset`` for ``seed``: the official split of a
    FIXED_TRAIN dataset (the same for every seed), else ``stratified_split`` by the seed."""
    if dataset in FIXED_TRAIN:
        n = FIXED_TRAIN[dataset]
        return np.arange(n), np.arange(n, np.asarray(y).shape[0])
    return stratified_split(y, TEST_FRAC, _split_rng(seed, dataset))


def stratified_split(y, test_frac: float, rng: np.random.Generator):
    """(train, test) row indices, both sorted: in each class (label order) the class's rows
    permuted by ``rng``, the first round(test_frac n_c) to test, the rest to train."""
    y = np.asarray(y)
    if y.ndim != 1 or y.shape[0] < 2:
        raise ValueError(f"y: expected a 1-d array of at least 2 labels, got shape {y.shape}")
    if not 0.0 < test_frac < 1.0:
        raise ValueError(f"test_frac: expected a number in (0, 1), got {test_frac!r}")
    train, test = [], []
    for c in np.unique(y):
        rows = rng.permutation(np.flatnonzero(y == c))
        k = int(round(test_frac * rows.shape[0]))
        test.append(rows[:k])
        train.append(rows[k:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


class TaskData(NamedTuple):
    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray     # in-distribution test rows
    y_test: np.ndarray
    X_ood: np.ndarray | None  # out-of-distribution test rows ("ood" task), else None
    n_classes: int


def task_data(X, y, train, test, task: str, X_ood_main=None) -> TaskData:
    """The rows of ``task``: "main" all classes (with ``X_ood_main``, another set's images, as
    its out-of-distribution inputs, or none); "ood" trains and tests on the labels below
    IN_CLASSES and keeps the test rows of the other labels as out-of-distribution inputs."""
    if task == "main":
        return TaskData(X[train], y[train], X[test], y[test], X_ood_main, int(y.max()) + 1)
    if task != "ood":
        raise ValueError(f"task: expected one of {', '.join(TASKS)}, got {task!r}")
    tr, te = train[y[train] < IN_CLASSES], test[y[test] < IN_CLASSES]
    out = test[y[test] >= IN_CLASSES]
    return TaskData(X[tr], y[tr], X[te], y[te], X[out], IN_CLASSES)


# ----------------------------------------------------------------------------- arguments

def _names(kind: str, choices, hints=None):
    def parse(text: str) -> tuple:
        if text == "all":
            return tuple(choices)
        names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
        bad = [n for n in names if n not in choices]
        if bad or not names:
            why = "; ".join((hints or {})[n] for n in bad if n in (hints or {}))
            raise argparse.ArgumentTypeError(
                f"unknown {kind} {', '.join(map(repr, bad)) or repr(text)}; expected one of "
                f"{', '.join(choices)}, a comma-separated list of them, or all"
                + (f" ({why})" if why else ""))
        return tuple(n for n in choices if n in names)
    parse.__name__ = kind
    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    methods = tuple(calibration_methods.METHODS)
    parser.add_argument("--dataset", type=_names("dataset", DATASETS, OTHER_DATA), default=None,
                        help="mnist-5k (the 5000-image MNIST subset), digits, mnist (full MNIST, "
                             "its official 60,000 / 10,000 split, Fashion-MNIST's test images as "
                             "the main task's OOD set), a comma-separated list, or all (default: "
                             "mnist-5k,digits; --quick: digits)")
    parser.add_argument("--method", type=_names("method", methods), default=methods,
                        help=f"{', '.join(methods)}, a comma-separated list, or all (default)")
    parser.add_argument("--task", type=_names("task", TASKS), default=TASKS,
                        help="main (10 classes), ood (train on 0-4, score 5-9 by entropy), or "
                             "all (default)")
    parser.add_argument("--seeds", type=positive_int, default=1,
                        help="number of seeds (splits and initializations) 0..K-1 (default 1)")
    parser.add_argument("--epochs", type=positive_int, default=None,
                        help="every method's training epochs (default: each method's own, 200; "
                             "--quick 20); SWA keeps its share of the SGD run, the last "
                             f"{SWA_FRACTION * 100:.0f}%% of the epochs (at least 2)")
    parser.add_argument("--samples", type=positive_int, default=None,
                        help="posterior draws S of the sampled predictives (default 30; "
                             "--quick 10)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: 32 hidden units, 20 epochs, 10 draws, digits only "
                             "unless --dataset says otherwise (about "
                             f"{MEASURED_SECONDS['quick']} s on {MEASURED_ON}; the default run "
                             f"about {round(MEASURED_SECONDS['default'] / 60)} minutes with the "
                             "first seven methods; the four added since make it longer)")
    _runner.add_output_arguments(parser, "calibration", "job")
    _runner.add_data_dir(parser)
    parser.add_argument("--no-progress", action="store_true", help="no progress output")
    _runner.add_arguments(parser)


# ----------------------------------------------------------------------------- jobs

def _crc(text: str) -> int:
    return zlib.crc32(text.encode("utf-8"))


def _split_rng(seed, dataset):
    return job_rng(seed, DATASETS.index(dataset), 0)


def _rng(seed, dataset, task, stream, name):
    return job_rng(seed, DATASETS.index(dataset), TASKS.index(task), stream, _crc(name))


class _Job(NamedTuple):
    dataset: str
    task: str
    seed: int
    spec: calibration_methods.MethodSpec
    path: Path
    settings: dict
    provenance: dict


def _budget(quick: bool) -> str:
    return "quick" if quick else "full"


def _train_name(spec) -> str:
    return spec.train or spec.name


def method_settings(spec, quick: bool, epochs=None) -> dict:
    """The resolved settings of ``spec`` (``calibration_methods.resolve``), with every epoch
    count set to ``epochs`` when given: "epochs", and "swa_epochs" (SWA's share of the SGD run,
    SWA_FRACTION of the epochs, at least 2 snapshots and fewer than the epochs)."""
    hyper = calibration_methods.resolve(spec, quick)
    if epochs is None:
        return hyper
    hyper = {**hyper, "epochs": int(epochs)}
    if "swa_epochs" in hyper:
        if epochs < 3:
            raise ValueError(f"--epochs: expected >= 3 with SWA (2 snapshots and 1 epoch before "
                             f"them), got {epochs}")
        hyper["swa_epochs"] = min(epochs - 1, max(2, round(SWA_FRACTION * epochs)))
    return hyper


def _settings(spec, dataset, task, seed, quick, samples, n_train, epochs=None) -> dict:
    b = BUDGETS[_budget(quick)]
    s = {"protocol": PROTOCOL, "method": spec.name, "dataset": dataset, "task": task,
         "seed": seed, "budget": _budget(quick), "hidden": b["hidden"], "activation": "relu",
         "test_frac": TEST_FRAC, "weight_decay": WEIGHT_DECAY, "n_train": n_train,
         "prior_precision": n_train * WEIGHT_DECAY, "n_bins": N_BINS,
         "samples": 1 if spec.point else samples, "train": _train_name(spec),
         "settings": method_settings(spec, quick, epochs), "constants": dict(spec.constants)}
    return _runner.as_saved(s)


SCHEMA = {"settings": dict, "status": str, "metrics": dict, "seconds": {"total": float}}


def _job_path(out, dataset, task, seed, method) -> Path:
    return Path(out) / dataset / task / f"seed_{seed}" / f"{method}.json"


class _Data(NamedTuple):
    X: np.ndarray
    y: np.ndarray
    identity: dict


def _jobs(datasets, tasks, seeds, methods, quick, samples, out, data, epochs=None) -> list:
    jobs = []
    for d in datasets:
        prov = provenance(data[d].identity)
        for task in tasks:
            for seed in range(seeds):
                train, _ = split(d, data[d].y, seed)
                n_train = int(np.sum(data[d].y[train] < IN_CLASSES)) if task == "ood" \
                    else int(train.shape[0])
                for m in methods:
                    spec = calibration_methods.METHODS[m]
                    jobs.append(_Job(d, task, seed, spec, _job_path(out, d, task, seed, m),
                                     _settings(spec, d, task, seed, quick, samples, n_train,
                                               epochs), prov))
    return jobs


# ----------------------------------------------------------------------------- one job

def _metrics(probs, y, probs_ood) -> tuple[dict, dict]:
    m = {"accuracy": metrics.accuracy(probs, y), "nll": metrics.nll(probs, y),
         "ece": metrics.ece(probs, y, N_BINS), "brier": metrics.brier(probs, y),
         "mce": metrics.mce(probs, y, N_BINS),
         "mean_confidence": float(np.mean(probs.max(axis=1))),
         "mean_entropy": float(np.mean(metrics.predictive_entropy(probs)))}
    try:
        m["misclassification_auroc"] = metrics.misclassification_auroc(probs, y)
    except ValueError:  # every prediction right (or wrong): undefined
        m["misclassification_auroc"] = None
    if probs_ood is not None:
        m["ood_auroc"] = metrics.ood_auroc(probs, probs_ood)
        m["ood_mean_entropy"] = float(np.mean(metrics.predictive_entropy(probs_ood)))
    rc = metrics.reliability_curve(probs, y, N_BINS)
    curve = {k: [None if not np.isfinite(v) else float(v) for v in rc[k]]
             for k in ("confidence", "accuracy")}
    curve["count"] = [int(c) for c in rc["count"]]
    curve["edges"] = [float(e) for e in rc["edges"]]
    return m, curve


def _predict(spec, post, model, X, rng, S):
    with np.errstate(over="raise", invalid="raise"):
        try:
            P = np.asarray(spec.predict(post, model, X, rng, S), dtype=np.float64)
        except FloatingPointError as err:
            raise calibration_methods.TrainingError(f"prediction: {err}") from err
    if P.shape != (X.shape[0], model.sizes[-1]) or not np.all(np.isfinite(P)):
        raise calibration_methods.TrainingError(
            f"prediction: expected finite probabilities of shape {(X.shape[0], model.sizes[-1])}, "
            f"got shape {P.shape}")
    return P


def _run_job(job, td, cache, bar) -> dict:
    """Train (or reuse this invocation's shared fit) and score one job; a TrainingError is
    recorded as status "diverged"."""
    s = job.settings
    spec = job.spec
    model = MLP([td.X_train.shape[1], s["hidden"], s["hidden"], td.n_classes], "relu",
                "categorical")
    hyper = {**s["settings"], "prior_precision": s["prior_precision"]}
    key = (_train_name(spec), job.dataset, job.task, job.seed, json.dumps(hyper, sort_keys=True))
    t0 = time.perf_counter()
    reused = key in cache
    if not reused:
        rng = _rng(job.seed, job.dataset, job.task, 1, _train_name(spec))
        try:
            cache[key] = ("ok", spec.fit(model, td.X_train, td.y_train, hyper, rng, bar.update),
                          time.perf_counter() - t0)
        except calibration_methods.TrainingError as err:
            cache[key] = ("diverged", f"training: {err}", time.perf_counter() - t0)
    status, post, fit_seconds = cache[key]
    result = {"settings": s, "provenance": job.provenance, "status": status, "error": None,
              "metrics": {}, "reliability": None,
              "n": {"train": int(td.y_train.shape[0]), "test": int(td.y_test.shape[0]),
                    "ood": 0 if td.X_ood is None else int(td.X_ood.shape[0])},
              "fit_reused": reused}
    t1 = time.perf_counter()
    if status == "ok":
        rng = _rng(job.seed, job.dataset, job.task, 2, spec.name)
        try:
            P = _predict(spec, post, model, td.X_test, rng, s["samples"])
            P_ood = None if td.X_ood is None else _predict(spec, post, model, td.X_ood, rng,
                                                           s["samples"])
            result["metrics"], result["reliability"] = _metrics(P, td.y_test, P_ood)
            if spec.report is not None:
                result["found"] = spec.report(post, model)
        except calibration_methods.TrainingError as err:
            result["status"], result["error"] = "diverged", str(err)
    else:
        result["error"] = post
    predict_seconds = time.perf_counter() - t1
    # fit: the training run's seconds (measured by the job that ran it); total: this job's own
    result["seconds"] = {"fit": fit_seconds, "predict": predict_seconds,
                         "total": (0.0 if reused else fit_seconds) + predict_seconds}
    return result


def _train_job(dataset, task, seed, methods, settings, prov, data_dir,
               progress=_runner.QUIET) -> dict:
    """One training run of (dataset, task, seed) with the methods it serves, in order, as a job
    of ``_runner.execute``: {method: result}. The data are (re)loaded here (from ``data_dir``)
    and checked against the main process's checksums (``prov``)."""
    X, y, identity = load_data(dataset, data_dir)
    _runner.check_worker_data(f"calibration {dataset}", identity, prov)
    train, test = split(dataset, y, seed)
    td = task_data(X, y, train, test, task, load_ood(dataset, data_dir) if task == "main" else None)
    cache, out = {}, {}
    for method, s in zip(methods, settings):
        job = _Job(dataset, task, seed, calibration_methods.METHODS[method], None, s, prov)
        label = f"{method} {dataset} {task} seed {seed}"
        with progress.run_bar(s["settings"]["epochs"], label, unit="epoch") as bar:
            out[method] = _run_job(job, td, cache, bar)
    return out


def _train_jobs(todo, data_dir) -> tuple[list, dict]:
    """The missing jobs grouped by training run (dataset, task, seed, train name), in order,
    one ``_runner`` job each: (jobs, {job key: {method: its _Job}})."""
    groups = {}
    for job in todo:  # todo is in (dataset, task, seed, method) order: kept within a group
        groups.setdefault((job.dataset, job.task, job.seed, _train_name(job.spec)), []).append(job)
    data_dir = _runner.worker_path(data_dir)
    jobs, owner = [], {}
    for (d, task, seed, train), members in groups.items():
        key = f"{d}/{task}/seed_{seed}/{train}"
        owner[key] = {j.spec.name: j for j in members}
        jobs.append(_runner.Job(key, _train_job, (
            d, task, seed, tuple(j.spec.name for j in members),
            [j.settings for j in members], members[0].provenance, data_dir, _runner.PROGRESS)))
    return jobs, owner


# ----------------------------------------------------------------------------- summaries

ROW_FIELDS = ("dataset", "task", "seed", "method", "status", "budget", "accuracy", "nll", "ece",
              "brier", "mce", "misclassification_auroc", "ood_auroc", "mean_confidence",
              "mean_entropy", "n_train", "n_test", "samples", "fit_seconds", "predict_seconds",
              "error")


def _row(saved) -> dict:
    s, m = saved["settings"], saved["metrics"]
    return {"dataset": s["dataset"], "task": s["task"], "seed": s["seed"], "method": s["method"],
            "status": saved["status"], "budget": s["budget"],
            **{k: m.get(k) for k in ROW_FIELDS[6:15]},
            "n_train": saved.get("n", {}).get("train"), "n_test": saved.get("n", {}).get("test"),
            "samples": s["samples"], "fit_seconds": saved["seconds"].get("fit"),
            "predict_seconds": saved["seconds"].get("predict"), "error": saved.get("error")}


def _collect(out, quick, samples, seeds, data, data_dir, noted, epochs=None) -> list:
    """Every saved job under ``out`` for every dataset (those of ``data``, and the others
    whose data can be read), every registered method, both tasks and seeds 0..seeds-1 whose
    settings and provenance match the current ones (damaged or differing files are left out,
    damaged ones with a note)."""
    data = dict(data)
    for d in DATASETS:
        if d not in data and (Path(out) / d).is_dir():
            try:
                data[d] = _Data(*load_data(d, data_dir))
            except (OSError, ValueError):  # its data is not here: its results cannot be checked
                continue
    jobs = _jobs([d for d in DATASETS if d in data], TASKS, seeds,
                 list(calibration_methods.METHODS), quick, samples, out, data, epochs)
    found = (_runner.read_saved(job.path, SCHEMA, job.settings, job.provenance, noted)
             for job in jobs)
    return [saved for saved in found if saved is not None]


# metric key, column head, digits
COLUMNS = (("accuracy", "accuracy", 4), ("nll", "NLL", 4), ("ece", "ECE (15 bins)", 4),
           ("brier", "Brier", 4), ("misclassification_auroc", "misclass. AUROC", 4),
           ("mean_confidence", "mean conf.", 4))


def _summary(found, dataset) -> list[dict]:
    """Per method (registry order) of ``dataset``: mean (and s.e. over seeds) of each column on
    the main task, the OOD AUROC of the ood task, seeds done, divergences, fit seconds."""
    rows = []
    for name in calibration_methods.METHODS:
        main = [f for f in found if f["settings"]["dataset"] == dataset
                and f["settings"]["method"] == name and f["settings"]["task"] == "main"]
        ood = [f for f in found if f["settings"]["dataset"] == dataset
               and f["settings"]["method"] == name and f["settings"]["task"] == "ood"]
        if not main and not ood:
            continue
        ok = [f for f in main if f["status"] == "ok"]
        ok_ood = [f for f in ood if f["status"] == "ok"]
        r = {"method": name, "seeds_main": len(main), "seeds_ood": len(ood),
             "diverged_main": len(main) - len(ok), "diverged_ood": len(ood) - len(ok_ood)}
        for key, _, _ in COLUMNS:
            r[key], r[key + "_se"] = mean_se([f["metrics"].get(key) for f in ok])
        # the OOD column: the ood task's (digits 5-9), or the main task's against OOD_SETS
        r["ood_auroc"], r["ood_auroc_se"] = mean_se(
            [f["metrics"]["ood_auroc"] for f in (ok if dataset in OOD_SETS else ok_ood)])
        if dataset in OOD_SETS:
            r["seeds_ood"], r["diverged_ood"] = r["seeds_main"], r["diverged_main"]
        r["fit_seconds"], _ = mean_se([f["seconds"].get("fit") for f in main])
        rows.append(r)
    return rows


def _cell(r, key, digits, n, diverged):
    if n == 0:
        return "-"
    if r.get(key) is None:
        return "diverged" if diverged == n else "-"
    text = f"{r[key]:.{digits}f}"
    if r.get(key + "_se") is not None:
        text += f" ± {r[key + '_se']:.{digits}f}"
    if diverged:
        text += f" ({diverged}/{n} diverged)"
    return text


HEAD = ("method", *(c[1] for c in COLUMNS), "OOD AUROC", "fit s")


def _table_rows(rows) -> list[list[str]]:
    """The cells of a dataset's table, one row per method (``HEAD``'s columns)."""
    out = []
    for r in rows:
        cells = [r["method"]]
        cells += [_cell(r, key, digits, r["seeds_main"], r["diverged_main"])
                  for key, _, digits in COLUMNS]
        cells.append(_cell(r, "ood_auroc", 4, r["seeds_ood"], r["diverged_ood"]))
        cells.append("-" if r["fit_seconds"] is None else f"{r['fit_seconds']:.3g}")
        out.append(cells)
    return out


def _markdown(rows) -> str:
    """The table as Markdown: table_<dataset>.md, which the docs include."""
    lines = ["| " + " | ".join(HEAD) + " |", "|" + "|".join("---" for _ in HEAD) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in _table_rows(rows)]
    return "\n".join(lines)


def _text(rows) -> str:
    """The table as aligned text (``_files.format_table``), as every experiment prints it."""
    return format_table(list(HEAD), _table_rows(rows))


def _heading(dataset, found, seeds) -> str:
    """Two lines: what was run (data, network, the budget: epochs of each method's training run,
    S posterior draws per prediction, seeds), then what the columns are."""
    runs = [f for f in found if f["settings"]["dataset"] == dataset]
    if not runs:
        return f"{dataset}: no results"
    s = runs[0]["settings"]
    main = [f for f in runs if f["settings"]["task"] == "main" and f.get("n")]
    sizes = (f"{main[0]['n']['train']} train / {main[0]['n']['test']} test rows, "
             if main else "")
    epochs, point, draws = {}, [], set()
    for name in calibration_methods.METHODS:
        mine = [f["settings"] for f in runs if f["settings"]["method"] == name]
        if mine:
            epochs[name] = mine[0]["settings"]["epochs"]
            if calibration_methods.METHODS[name].point:  # one network, no draws
                point.append(name)
            else:
                draws.update(m["samples"] for m in mine)
    by_epochs = {}
    for name, e in epochs.items():
        by_epochs.setdefault(e, []).append(name)
    budget = ", ".join(f"{e} epochs ({', '.join(names)})" if len(by_epochs) > 1 else f"{e} epochs"
                       for e, names in by_epochs.items())
    S = "/".join(str(k) for k in sorted(draws)) or "-"
    return (f"{dataset} ({sizes}main task): {s['budget']} budget: MLP {s['hidden']}-{s['hidden']} "
            f"ReLU, {budget}, S = {S} posterior draws per prediction"
            + (f" ({', '.join(point)}: one network)" if point else "")
            + f", mean{' ± s.e.' if seeds > 1 else ''} over {seeds} seed{'s' if seeds > 1 else ''}"
            f"\ncolumns: test metrics of the main task (10 classes); "
            + (f"OOD AUROC: the main task's network, entropy of {OOD_SETS[dataset]}'s test images "
               f"vs {dataset}'s" if dataset in OOD_SETS else
               f"OOD AUROC of the ood task (train 0-{IN_CLASSES - 1}, entropy of 5-9 vs 0-4)")
            + "; fit s: seconds of the main task's training run (one SGD run serves map and "
            "the Laplace methods, another swa, swag-diag and swag)")


def _figure(out, dataset, found):
    """reliability_<dataset>.png: one panel per method with results on the main task."""
    plt = pyplot()
    if plt is None:
        return None
    panels = []
    for name in calibration_methods.METHODS:
        runs = [f for f in found if f["settings"]["dataset"] == dataset and f["settings"]["task"]
                == "main" and f["settings"]["method"] == name]
        if runs:
            panels.append((name, runs))
    if not panels:
        return None
    fig, axes = _runner.panel_grid(plt, len(panels), 4)
    for ax, (name, runs) in zip(axes.ravel(), panels):
        ok = [f for f in runs if f["status"] == "ok"]
        ax.plot([0, 1], [0, 1], "k--", lw=0.8)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_aspect("equal")
        if not ok:
            ax.set_title(f"{name}: diverged", fontsize=9)
            continue
        edges = np.asarray(ok[0]["reliability"]["edges"])
        count = np.sum([f["reliability"]["count"] for f in ok], axis=0)
        acc = np.zeros(len(count))
        conf = np.zeros(len(count))
        for f in ok:  # pool the bins over seeds, weighted by their counts
            c = np.asarray(f["reliability"]["count"], dtype=float)
            acc += c * np.nan_to_num(np.asarray(f["reliability"]["accuracy"], dtype=float))
            conf += c * np.nan_to_num(np.asarray(f["reliability"]["confidence"], dtype=float))
        full = count > 0
        acc[full] /= count[full]
        conf[full] /= count[full]
        width = np.diff(edges)
        ax.bar(edges[:-1][full], acc[full], width=width[full], align="edge", color="tab:blue",
               edgecolor="k", lw=0.4, label="accuracy")
        ax.bar(edges[:-1][full], (conf - acc)[full], bottom=acc[full], width=width[full],
               align="edge", fill=False, hatch="///", edgecolor="tab:red", lw=0.4,
               label="gap to mean confidence")
        mean = {k: np.mean([f["metrics"][k] for f in ok])
                for k in ("ece", "accuracy", "mean_confidence")}
        ax.set_title(f"{name}: ECE {100 * mean['ece']:.2f}%", fontsize=9)
        ax.text(0.03, 0.97, f"accuracy {mean['accuracy']:.3f}\nmean conf. "
                f"{mean['mean_confidence']:.3f}\n{100 * count[-1] / count.sum():.0f}% of points "
                f"in the last bin", transform=ax.transAxes, va="top", fontsize=6.5)
        ax.set_xlabel("confidence", fontsize=8)
        ax.set_ylabel("accuracy", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in axes.ravel():  # the legend on the first panel with bars
        if ax.patches:
            ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(0.0, 0.8))
            break
    s = panels[0][1][0]["settings"]
    fig.suptitle(f"{dataset}: reliability ({N_BINS} bins, test split, {s['budget']} budget, "
                 f"{len(panels[0][1])} seed(s) pooled)", fontsize=10)
    fig.tight_layout()
    path = Path(out) / f"reliability_{dataset}.png"
    save_figure(fig, path, dpi=110)
    return path


# ----------------------------------------------------------------------------- driver

def run(args: argparse.Namespace) -> int:
    """The ``refbayes reproduce calibration`` handler.

    Loads the data and checks every saved job (and that --out is writable when something is to
    be computed) before training anything; then runs the missing jobs in (dataset, task, seed,
    method) order, each written when it finishes, and ends with results.csv, summary.json, a
    table per dataset (aligned text on stdout, Markdown in table_<dataset>.md) and the
    reliability diagrams.
    With --jobs > 1 or --dask-scheduler the missing jobs run as independent jobs of
    ``_runner`` (one per training run, ``_train_jobs``), then the same summaries are written.
    """
    quick = bool(args.quick)
    datasets = args.dataset if args.dataset is not None else (("digits",) if quick
                                                              else DEFAULT_DATASETS)
    epochs = getattr(args, "epochs", None)
    samples = _runner.overridden(BUDGETS[_budget(quick)], args, ("samples",))["samples"]
    out = Path(args.out)
    data = {}
    for d in datasets:
        X, y, identity = load_data(d, args.data_dir)
        data[d] = _Data(X, y, identity)
    jobs = _jobs(datasets, args.task, args.seeds, args.method, quick, samples, out, data, epochs)
    _, todo = _runner.plan((_runner.Unit(k, j.path, SCHEMA, j.settings, j.provenance)
                            for k, j in enumerate(jobs)), args.fresh)
    todo = [jobs[unit.key] for unit in todo]
    write, progress = _runner.start(out, bool(todo), len(jobs), len(jobs) - len(todo),
                                    "calibration", enabled=not args.no_progress)
    train_jobs, owner = _train_jobs(todo, args.data_dir)

    def done(key, results):  # each method's file written as its training run comes back
        for method, result in results.items():
            job = owner[key][method]
            write_json(job.path, result)
            label = f"{method} {job.dataset} {job.task} seed {job.seed}"
            if result["status"] != "ok":
                progress.echo(f"note: {label} diverged: {result['error']}", file=sys.stderr)
            progress.advance(label)

    with progress:
        _runner.execute([_runner.Section(train_jobs)], done, progress,
                        **_runner.job_options(args))
        noted = set()
        found = _collect(out, quick, samples, args.seeds, data, args.data_dir, noted, epochs)
        lines = []
        summary = {}
        for d in datasets:
            rows = _summary(found, d)
            summary[d] = rows
            heading = _heading(d, found, args.seeds)
            lines += [heading, _text(rows), ""]
            if write:
                atomic_write_text(out / f"table_{d}.md", f"{heading}\n\n{_markdown(rows)}\n")
        if write:
            csv_path = write_csv(out / "results.csv", [_row(f) for f in found], ROW_FIELDS)
            write_json(out / "summary.json", summary)
            lines.append(f"results: {out}/<dataset>/<task>/seed_<k>/<method>.json, {csv_path}, "
                         f"{out / 'summary.json'}")
            for d in datasets:
                path = _figure(out, d, found)
                if path is not None:
                    lines.append(f"figure: {path}")
        progress.echo("\n".join(lines))
    return 0
