"""The UCI regression benchmark (Hernandez-Lobato & Adams 2015; Gal & Ghahramani 2016).

Protocol, per method, dataset and split (the standard splits: 20, 5 for protein; (uci.5)-(uci.7)
of derivations/uci.md):

1. Load the split (refbayes.datasets.load_uci); non-finite inputs or targets are an error.
2. Validation phase: the last 20% of the training rows are the validation part (Gal's
   ``int(0.8 n)`` cut, refbayes.datasets.validation_split); inputs and targets are standardized
   with the statistics of the remaining 80% only (refbayes.datasets.fit_standardizer: mean and
   population std; the official SLANG code uses the n - 1 std, Gal's the population one). Every
   point of the method's grid (refbayes.experiments.uci_methods) is trained on the 80% and
   scored by the mean validation log-likelihood in the original units; the best one wins (the
   first in grid order on a tie). A point whose training or prediction is not finite is recorded
   (``diverged``) and never chosen; if every point diverges the split fails, naming the run. A
   one-point grid skips this phase. The test rows are never read in this phase.
3. Final phase: the chosen hyperparameters are trained again on the whole training split,
   standardized with its own statistics, and scored on the test rows.

Network: one hidden layer of 50 ReLU units (100 for protein), one linear output,
``MLP([p, H, 1], "relu", "gaussian", noise_precision=tau)``, tau on the standardized scale.

Metrics (derivations/uci.md), from F (S, n): the network outputs at S posterior draws on
standardized inputs, and the target statistics (m_y, s_y) of the rows trained on:

  RMSE = sqrt( mean_i (y_i - (m_y + s_y mean_s F[s, i]))^2 )                             (uci.1)
  log p(y_i | x_i) = logsumexp_s log N(y_i | m_y + s_y F[s, i], s_y^2 / tau) - log S      (uci.2)
  LL   = mean_i log p(y_i | x_i)                                                         (uci.3)
  LL_joint = (1/n) [logsumexp_s sum_i log N(y_i | m_y + s_y F[s, i], s_y^2 / tau) - log S]   (uci.9)

with tau replaced by tau_s, draw s's own precision, for a learned noise (noise_gamma).

(uci.9), the log predictive density of the whole test set under the mixture, per point, is what
emtiyaz/vadam's ``predictive_avneg_loglik_gaussian`` computes (Khan et al. 2018, Table 1); it is
reported beside (uci.3) as ``ll_joint`` so that those figures are compared with their own metric.

(uci.2) is the standardized-scale mixture's log-likelihood minus log s_y, the Jacobian of
y = m_y + s_y y~ (uci.4); ``predictive_ll`` evaluates it with scipy.special.logsumexp.
Reported: mean +- standard error (std over sqrt(K)) over the K splits done (uci.8), the std with
ddof 1 (default) or 0 (``se_ddof``, --se-ddof; the SLANG repository's table used 0), stated in
the table's header.

Randomness: one numpy Generator per (dataset, split, phase, grid point), from
SeedSequence([seed, dataset index in UCI_NAMES, split, phase (0 validation, 1 final), point]),
spawned into a training and a prediction stream; so a split's numbers do not depend on which
other splits ran before it, and a resumed run gives the numbers of an uninterrupted one.

Output (``out``, default results/uci): ``<method>/<dataset>/split_<k>.json`` written atomically
when split k finishes (settings, chosen hyperparameters, every validation score, test RMSE and
LL, wall and CPU seconds, and provenance: the sha256 of the files load_uci read for split k, i.e. data.txt,
the column index files and the split's two row index files, the refbayes version and the git
commit); a finished split whose settings, data checksums and refbayes version match is loaded,
not recomputed; otherwise, or when the file is damaged, the run stops (ValueError naming the
file) unless ``fresh``. The commit is provenance only, not compared (see _runner). ``<method>/<dataset>/summary.{csv,json}`` (per
split and mean +- s.e.), ``summary.{csv,json}`` over everything under ``out``, and the figure
``<dataset>_splits.png`` (per-split test RMSE / LL beside the published mean +- spread). The
published numbers are package data: refbayes/experiments/published/uci.csv (with citations);
the table and the figure also show the other methods with results for the dataset under
``out`` (marked "(saved)" in the table, their s.e. recomputed at this invocation's ddof); a
published method with no results is listed in parentheses, e.g. "(bbvi)", and a figure the
source does not print (an empty cell) shows as "-".

Budgets: the full one is each method's ``defaults`` (SLANG: the official 120 epochs, M = 10,
S = 4 / 2, 20 test draws, a 3 x 3 grid; MAP: 120 epochs, M = 32, a 6 x 3 grid; Vadam: the
official 40 epochs, M = 32 / 128, S = 10 / 5, 100 test draws, a 5 x 3 grid; Noisy Adam and
Noisy K-FAC: 1000 epochs, M = 10 / 100, S = 10, 100 test draws, 7 noise precisions; K-FAC: the
same at the mean). ``quick``:
each method's ``quick`` overrides (SLANG 5 epochs, 10 test draws; MAP 20 epochs) and a 2-point
grid: a smoke test of a few seconds per split on the small sets, not comparable with papers.
The table's budget column states each row's budget (:func:`budget_text`: epochs, M, S, test
draws, grid points), as do the figure's legend entries; when a method with published figures
for the dataset ran below its full budget (--quick, or --epochs below the method's), a
``CAVEAT - quick run: ...; not comparable to the published figures`` line heads the table
(the published columns are kept). No convergence flag: the protocol is each source's fixed
budget (the published numbers are at those budgets too), and a split records no training curve
to judge one by.
"""
from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from scipy.special import logsumexp

from refbayes._files import format_table, write_json
from refbayes.datasets import data_identity, fit_standardizer, validation_split
from refbayes.datasets.uci import UCI_NAMES, load_uci, uci_n_splits, uci_split_files
from refbayes.experiments import _report, _runner, uci_methods
from refbayes.experiments._runner import (
    load_result,
    mean_se,
    positive_int,
    provenance,
    pyplot,
    save_figure,
    seed_arg,
    writable_error,
)
from refbayes.models import MLP

__all__ = [
    "DATASETS",
    "DESCRIPTION",
    "PROTOCOL",
    "ROWS",
    "VAL_FRAC",
    "add_arguments",
    "check_splits",
    "fits_per_split",
    "hidden_units",
    "load_published",
    "load_split",
    "parse_grid",
    "parse_splits",
    "phase_data",
    "predictive_ll",
    "rmse",
    "run",
    "run_method",
    "standardized_noise_precision",
]

DESCRIPTION = "UCI regression: test RMSE and log-likelihood over the standard splits (Table 2)"
DATASETS = UCI_NAMES
VAL_FRAC = 0.2
PROTOCOL = 1  # bump when the protocol changes, so old result files are not mistaken for new ones
PHASES = ("validation", "final")
# Rows of each set (data.txt; a test checks them against the data). Only the order in which
# parallel jobs start uses them (``_split_steps``).
ROWS = {"boston": 506, "concrete": 1030, "energy": 768, "kin8nm": 8192, "naval": 11934,
        "power": 9568, "protein": 45730, "wine": 1599, "yacht": 308}


def hidden_units(dataset: str) -> int:
    """50 hidden units, 100 for protein (Hernandez-Lobato & Adams 2015)."""
    return 100 if dataset == "protein" else 50


# ----------------------------------------------------------------------------- arguments

def parse_splits(text: str) -> tuple[int, ...]:
    """'0,1,5' or '0-4' or a mix ('0-2,7') -> sorted distinct split indices (range not checked)."""
    out = set()
    for part in str(text).split(","):
        part = part.strip()
        lo, dash, hi = part.partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise ValueError(f"--splits: expected indices like '0,1,5' or '0-4', got {text!r}")
        a, b = int(lo), int(hi) if dash else int(lo)
        if b < a:
            raise ValueError(f"--splits: expected a range low-high with low <= high, got {part!r}")
        out.update(range(a, b + 1))
    return tuple(sorted(out))


def check_splits(splits, dataset: str) -> tuple[int, ...]:
    """``splits`` (None: all of them) checked against the dataset's number of splits."""
    n = uci_n_splits(dataset)
    if splits is None:
        return tuple(range(n))
    bad = [k for k in splits if not 0 <= k < n]
    if bad:
        raise ValueError(f"--splits: {dataset} has {n} splits (0-{n - 1}), got split index "
                         f"{', '.join(map(str, bad))}")
    return tuple(splits)


def parse_grid(text: str) -> tuple[str, tuple[float, ...]]:
    """'noise_precision=46.3' or 'prior_precision=0.1,1,10' -> (key, candidates)."""
    key, eq, values = str(text).partition("=")
    try:
        cands = tuple(float(v) for v in values.split(","))
    except ValueError:
        cands = ()
    if not eq or not key.strip() or not cands:
        raise ValueError(f"--grid: expected KEY=V1,V2,... (e.g. noise_precision=46.3), got {text!r}")
    return key.strip(), cands


def _argtype(fn):
    def wrapped(text):
        try:
            return fn(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(
                str(err).removeprefix("--splits: ").removeprefix("--grid: ")) from err
    wrapped.__name__ = fn.__name__
    return wrapped


# ----------------------------------------------------------------------------- data

def load_split(dataset: str, split: int, data_dir=None):
    """``load_uci(dataset, split)`` with every input and target checked to be finite."""
    tt = load_uci(dataset, split, data_dir)
    for name, a in tt._asdict().items():
        bad = ~np.isfinite(a)
        if bad.any():
            rows = np.unique(np.nonzero(bad)[0])
            raise ValueError(f"{dataset} split {split}: {name} has {int(bad.sum())} non-finite "
                             f"value(s) (rows {rows[:5].tolist()} of the split's "
                             f"{'training' if name.endswith('train') else 'test'} rows); fix the "
                             "data file (`refbayes data verify` compares it with its checksum)")
    return tt


def phase_data(tt, phase: str, val_frac: float = VAL_FRAC):
    """(X_fit, y_fit, X_eval, y_eval_raw, stats) of a phase, standardized with fitted rows only.

    phase "validation": fit on the first part of the training rows, evaluate on the last
    ``val_frac`` (test rows unused); "final": fit on every training row, evaluate on the test
    rows. X_fit, y_fit and X_eval are standardized with ``stats`` (fit_standardizer of the fit
    rows); y_eval stays in the original units.
    """
    if phase == "validation":
        X_fit, y_fit, X_eval, y_eval = validation_split(tt.X_train, tt.y_train, val_frac)  # (uci.5)
    elif phase == "final":
        X_fit, y_fit, X_eval, y_eval = tt  # the split's own train / test rows (uci.5)
    else:
        raise ValueError(f"phase: expected one of {PHASES}, got {phase!r}")
    stats = fit_standardizer(X_fit, y_fit)  # the fit rows' statistics only (uci.6)
    return (stats.transform_X(X_fit), stats.transform_y(y_fit), stats.transform_X(X_eval),
            y_eval, stats)  # (uci.6)


# ----------------------------------------------------------------------------- metrics

def predictive_ll(y, F, tau, y_mean, y_std) -> np.ndarray:
    """Per-point log p(y_i | x_i) (n,) of the mixture (1/S) sum_s N(m_y + s_y F[s], s_y^2 / tau).  (uci.2)

    y (n,) original units; F (S, n) standardized-scale outputs; tau the standardized-scale
    noise precision, one float or (S,) per draw; y_mean, y_std the training target statistics.
    """
    F = np.atleast_2d(F)
    return logsumexp(_log_n(y, F, tau, y_mean, y_std), axis=0) - np.log(F.shape[0])  # (uci.2)


def _log_n(y, F, tau, y_mean, y_std) -> np.ndarray:
    """(S, n): log N(y_i | m_y + s_y F[s, i], s_y^2 / tau_s), F 2-d, tau a float or (S,)."""
    var = y_std ** 2 / np.reshape(tau, (-1, 1))
    return -0.5 * np.log(2.0 * np.pi * var) - (y[None, :] - (y_mean + y_std * F)) ** 2 / (2.0 * var)


def predictive_ll_joint(y, F, tau, y_mean, y_std) -> float:
    """(1/n) log (1/S) sum_s prod_i N(y_i | m_y + s_y F[s, i], s_y^2 / tau): the whole test set's
    log predictive density under the mixture, per point (Khan et al.'s test LL).  (uci.9)

    Arguments as for ``predictive_ll``.
    """
    F = np.atleast_2d(F)
    log_n = _log_n(y, F, tau, y_mean, y_std)
    return float((logsumexp(log_n.sum(axis=1)) - np.log(F.shape[0])) / F.shape[1])  # (uci.9)


def rmse(y, F, y_mean, y_std) -> float:
    """sqrt(mean_i (y_i - (m_y + s_y mean_s F[s, i]))^2) in the original units.  (uci.1)"""
    y_hat = y_mean + y_std * np.atleast_2d(F).mean(axis=0)
    return float(np.sqrt(np.mean((y - y_hat) ** 2)))  # (uci.1)


# ----------------------------------------------------------------------------- one split

def _seeds(seed: int, dataset: str, split: int, phase: str, point: int):
    seq = np.random.SeedSequence([seed, DATASETS.index(dataset), split, PHASES.index(phase), point])
    fit_seq, predict_seq = seq.spawn(2)
    return np.random.default_rng(fit_seq), np.random.default_rng(predict_seq)


def standardized_noise_precision(hyper: dict, y_std: float) -> dict:
    """``hyper`` with ``noise_precision`` on the standardized scale of the rows trained on.

    A grid that gives ``noise_precision_raw`` (a precision in the original target units, as Gal's
    per-dataset BO values are) gets noise_precision = noise_precision_raw * s_y^2, s_y the
    population std of those rows' targets (uci.4), so that the scored predictive has exactly the
    raw precision; a grid with ``noise_precision`` is returned unchanged.
    """
    if "noise_precision_raw" not in hyper:
        return hyper
    return {**hyper, "noise_precision": hyper["noise_precision_raw"] * y_std ** 2}  # (uci.4)


def _fit_predict(spec, data, hyper, settings, rngs, hidden, progress):
    """Train ``spec`` on the phase's fit rows with ``hyper``; return (F (S_test, n_eval), the
    predictive means per draw on the evaluation rows in standardized units, tau, the noise
    precision on that scale, fit seconds, predict seconds). TrainingError when F is not finite."""
    X_fit, y_fit, X_eval, _, stats = data
    hyper = standardized_noise_precision(hyper, float(stats.y_std))
    model = MLP([X_fit.shape[1], hidden, 1], "relu", "gaussian",
                noise_precision=hyper["noise_precision"])
    t0 = time.perf_counter()
    posterior = spec.fit(model, X_fit, y_fit, hyper, rngs[0], settings["epochs"],
                         min(settings["M"], X_fit.shape[0]), progress)
    t1 = time.perf_counter()
    try:
        with np.errstate(over="raise", invalid="raise"):
            F, tau = spec.predict(posterior, model, X_eval, rngs[1], settings["S_test"])
            F = np.asarray(F, dtype=np.float64)
    except FloatingPointError as err:
        raise uci_methods.TrainingError(f"prediction: {err}") from err
    if not np.all(np.isfinite(F)):
        raise uci_methods.TrainingError("prediction: non-finite predictions")
    return F, _precisions(tau, F.shape[0]), t1 - t0, time.perf_counter() - t1


def _precisions(tau, S: int):
    """A predict's tau as a float, or as an (S,) float64 array of per-draw precisions."""
    if np.ndim(tau) == 0:
        return float(tau)
    tau = np.asarray(tau, dtype=np.float64)
    if tau.shape != (S,) or not np.all(tau > 0) or not np.all(np.isfinite(tau)):
        raise uci_methods.TrainingError(f"prediction: expected one precision > 0 per draw "
                                        f"({S},), got shape {tau.shape}")
    return tau


def _scores(y, F, tau, stats) -> dict:
    """Test or validation scores of the predictions F: (uci.3), (uci.9), RMSE."""
    y_mean, y_std = float(stats.y_mean), float(stats.y_std)
    try:
        with np.errstate(over="raise", invalid="raise"):
            ll = predictive_ll(y, F, tau, y_mean, y_std)
            ll_joint = predictive_ll_joint(y, F, tau, y_mean, y_std)
    except FloatingPointError as err:
        raise uci_methods.TrainingError(f"prediction: {err}") from err
    return {"ll": float(np.mean(ll)),  # (uci.3)
            "ll_joint": ll_joint,  # (uci.9)
            "rmse": rmse(y, F, y_mean, y_std),
            # per-draw precisions (a learned noise): their mean
            "noise_precision": float(np.mean(tau)),
            "noise_precision_original": float(np.mean(tau)) / y_std ** 2,
            "S": int(F.shape[0])}


def _fit_and_score(spec, data, hyper, settings, rngs, hidden, progress):
    """Train ``spec`` on the phase's fit rows with ``hyper``; score on its evaluation rows."""
    F, tau, fit_s, predict_s = _fit_predict(spec, data, hyper, settings, rngs, hidden, progress)
    t1 = time.perf_counter()
    scores = _scores(data[3], F, tau, data[4])
    return {**scores, "fit_seconds": fit_s,
            "predict_seconds": predict_s + time.perf_counter() - t1}


def _has_validation(points) -> bool:
    """Whether a split's grid points are trained and scored on the validation rows first: a
    one-point grid has nothing to choose, and is only trained once, on the whole training split."""
    return len(points) > 1


def fits_per_split(budget) -> int:
    """Trainings per split: one per grid point and the final one; a one-point grid only the final."""
    points = uci_methods.grid_points(budget.grid)
    return len(points) + 1 if _has_validation(points) else 1


def _validate(spec, dataset, split, budget, points, seed, tt, hidden, bar) -> list:
    """Every grid point trained on the fit rows and scored on the validation rows (uci.7); a
    point whose training or prediction is not finite is recorded with ``diverged`` (the reason)
    and ``ll`` None instead. A one-point grid has nothing to choose: no validation fit, []."""
    if not _has_validation(points):
        return []
    val = phase_data(tt, "validation")
    scores = []
    for i, point in enumerate(points):
        phase = f"validation fit {i + 1}/{len(points)}"
        bar.set_postfix_str(phase)
        try:
            res = _fit_and_score(spec, val, {**budget.settings, **point}, budget.settings,
                                 _seeds(seed, dataset, split, "validation", i), hidden, bar.update)
        except uci_methods.TrainingError as err:
            res = {"ll": None,
                   "diverged": f"{_context(spec, dataset, split, phase, point)}: {err}"}
        scores.append({"hyper": point, **res})
    return scores


def _choose(spec, dataset, split, points, scores) -> dict:
    """j* = argmax of the validation LL over the points that did not diverge, the first in grid
    order on a tie (uci.7); the only point of a one-point grid. Every point diverged: a
    TrainingError naming the run and the first point's reason."""
    if not scores:
        return points[0]
    finite = [i for i, s in enumerate(scores) if s["ll"] is not None]
    if not finite:
        raise uci_methods.TrainingError(
            f"{spec.name} on {dataset}, split {split}: every one of the {len(points)} grid points "
            f"diverged in the validation phase; the first: {scores[0]['diverged']}")
    return points[max(finite, key=lambda i: (scores[i]["ll"], -i))]  # (uci.7)


def _settings(spec, dataset, split, budget, seed, quick):
    s = {"protocol": PROTOCOL, "method": spec.name, "dataset": dataset, "split": split,
         "seed": seed, "budget": "quick" if quick else "full", "hidden": hidden_units(dataset),
         "activation": "relu", "val_frac": VAL_FRAC, "grid": budget.grid,
         "settings": budget.settings}
    return _runner.as_saved(s)


def _context(spec, dataset, split, phase, hyper):
    shown = ", ".join(f"{k}={hyper[k]:g}" if isinstance(hyper[k], float) else f"{k}={hyper[k]}"
                      for k in sorted(hyper))
    return f"{spec.name} on {dataset}, split {split}, {phase} ({shown})"


def _run_split(spec, dataset, split, budget, settings, seed, data_dir, bar):
    tt = load_split(dataset, split, data_dir)
    hidden = hidden_units(dataset)
    points = uci_methods.grid_points(budget.grid)
    t0, cpu0 = time.perf_counter(), time.process_time()
    scores = _validate(spec, dataset, split, budget, points, seed, tt, hidden, bar)
    chosen = _choose(spec, dataset, split, points, scores)
    t1 = time.perf_counter()
    bar.set_postfix_str("final fit")
    final = phase_data(tt, "final")
    try:
        test = _fit_and_score(spec, final, {**budget.settings, **chosen}, budget.settings,
                              _seeds(seed, dataset, split, "final", 0), hidden, bar.update)
    except uci_methods.TrainingError as err:
        raise uci_methods.TrainingError(
            f"{_context(spec, dataset, split, 'final fit on the whole training split', chosen)}: {err}") from err
    stats = final[4]
    n_fit = validation_split(tt.X_train, tt.y_train, VAL_FRAC)[1].shape[0]
    return {"settings": settings, "hyper": chosen, "validation": scores,
            "test": {"rmse": test["rmse"], "ll": test["ll"], "ll_joint": test["ll_joint"],
                     "S": test["S"],
                     "noise_precision": test["noise_precision"],
                     "noise_precision_original": test["noise_precision_original"]},
            "n": {"train": int(tt.y_train.shape[0]), "fit": int(n_fit),
                  "validation": int(tt.y_train.shape[0] - n_fit), "test": int(tt.y_test.shape[0])},
            "y_mean": float(stats.y_mean), "y_std": float(stats.y_std),
            "seconds": {"validation": t1 - t0, "final": time.perf_counter() - t1,
                        "total": time.perf_counter() - t0,
                        # CPU time of this process (BLAS threads included), what a table costs
                        "cpu": time.process_time() - cpu0}}


# ----------------------------------------------------------------------------- predictions

def final_predictions(plan, split: int) -> dict:
    """Refit a finished split's final fit and return its test predictions, draw by draw.

    The fit is the one ``_run_split`` made: the chosen hyperparameters of the split's result
    file, the plan's settings, the final phase's generators of ``_seeds`` and the whole training
    split; on the machine and BLAS that wrote the file it repeats its test scores to the last
    digit (``rmse``, ``ll``, ``ll_joint`` here beside ``saved_rmse``, ``saved_ll``,
    ``saved_ll_joint``). Returns the arrays a user compares an implementation against:
    ``F`` (S_test, n_test), the network's outputs per test draw in standardized units; ``tau``,
    the noise precision on that scale (an (S_test,) array of per-draw precisions for a learned
    noise, draw s then using tau[s]); ``y_mean``, ``y_std``, the training targets' statistics
    ((uci.4); the predictive of draw s is N(y_mean + y_std F[s], y_std^2 / tau)); ``X_test``,
    the test inputs as the network saw them (standardized with the training rows); ``y_test`` in
    the original units; ``ll_point`` (n_test,), the per-point mixture log density (uci.2).
    FileNotFoundError when the split has no result file.
    """
    path = plan.folder / f"split_{split}.json"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no result for split {split}; run the split first")
    saved = load_result(path, SPLIT_SCHEMA)
    tt = load_split(plan.dataset, split, plan.data_dir)
    final = phase_data(tt, "final")
    F, tau, _, _ = _fit_predict(plan.spec, final, {**plan.budget.settings, **saved["hyper"]},
                                plan.budget.settings,
                                _seeds(plan.seed, plan.dataset, split, "final", 0),
                                hidden_units(plan.dataset), lambda n: None)
    stats = final[4]
    scores = _scores(final[3], F, tau, stats)
    return {"F": F, "tau": tau, "y_mean": float(stats.y_mean), "y_std": float(stats.y_std),
            "X_test": final[2], "y_test": final[3],
            "ll_point": predictive_ll(final[3], F, tau, float(stats.y_mean),
                                      float(stats.y_std)),  # (uci.2)
            "rmse": scores["rmse"], "ll": scores["ll"], "ll_joint": scores["ll_joint"],
            "saved_rmse": saved["test"]["rmse"], "saved_ll": saved["test"]["ll"],
            "saved_ll_joint": saved["test"].get("ll_joint", math.nan)}


def write_predictions(plan, split: int, folder: Path) -> str:
    """``final_predictions`` of the split saved as ``folder/<method>/<dataset>/split_<k>.npz``;
    returns a line naming the file and comparing the refit's scores with the saved ones."""
    pred = final_predictions(plan, split)
    path = Path(folder) / plan.spec.name / plan.dataset / f"split_{split}.npz"
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **{k: np.asarray(v) for k, v in pred.items()})
    if pred["rmse"] == pred["saved_rmse"] and pred["ll"] == pred["saved_ll"]:
        verdict = "identical to the saved scores"
    else:  # rounding differs between machines, BLAS kernels and code versions; SLANG's
        # UCI fits amplify it on some sets (derivations/uci_experiments.md, reproducibility)
        verdict = (f"saved RMSE {pred['saved_rmse']:.6g}, LL {pred['saved_ll']:.6g}: RMSE differs "
                   f"by {abs(pred['rmse'] / pred['saved_rmse'] - 1):.1e} (relative), LL by "
                   f"{abs(pred['ll'] - pred['saved_ll']):.1e} nats")
    return (f"{plan.spec.name} {plan.dataset} split {split}: refit RMSE {pred['rmse']:.6g}, "
            f"LL {pred['ll']:.6g}, {verdict}; {path}")


# ----------------------------------------------------------------------------- driver

SUMMARY_FIELDS = ("method", "dataset", "budget", "splits_done", "n_splits", "splits", "epochs",
                  "se_ddof",
                  "rmse_mean", "rmse_se", "rmse_median", "ll_mean", "ll_se", "ll_median",
                  "ll_joint_mean", "ll_joint_se", "seconds_per_split", "complete")


# What a split's result file must hold to be read back (the rest is informative).
SPLIT_SCHEMA = {"settings": dict, "hyper": dict, "test": {"rmse": float, "ll": float},
                "seconds": {"total": float}}


SE_DDOF = (0, 1)  # the standard error's std: ddof 1 (sample std, default) or 0 (SLANG's table)


class _Plan(NamedTuple):
    """One (method, dataset): its settings, the data identity, and the splits to compute."""
    spec: Any
    dataset: str
    budget: Any
    out: Path
    folder: Path
    splits: tuple
    todo: list         # [_runner.Unit] of the splits to compute (key: the split), in order
    identity: dict     # relative path -> sha256, filled as splits' files are verified
    seed: int
    quick: bool
    data_dir: Any
    noted: set         # damaged files already reported (one note each)
    se_ddof: int = 1   # the standard error's ddof (SE_DDOF)


def _split_provenance(plan, k) -> dict:
    """The provenance of split k: the sha256 of the files load_uci reads for it (data.txt, the
    column and row index files; verified against the registry, each file hashed once), the
    refbayes version and the git commit."""
    files = uci_split_files(plan.dataset, k)
    missing = [f for f in files if f not in plan.identity]
    if missing:
        plan.identity.update(data_identity(plan.dataset, plan.data_dir, missing))
    return provenance({f: plan.identity[f] for f in files})


def _summary(plan):
    """The splits under the plan's folder whose settings and provenance match, and their mean +- s.e."""
    spec, dataset, budget = plan.spec, plan.dataset, plan.budget
    n_splits = uci_n_splits(dataset)
    rows = []
    for k in range(n_splits):
        saved = _runner.read_saved(plan.folder / f"split_{k}.json", SPLIT_SCHEMA,
                                   _settings(spec, dataset, k, budget, plan.seed, plan.quick),
                                   lambda k=k: _split_provenance(plan, k), plan.noted)
        if saved is not None:
            rows.append({"split": k, "rmse": saved["test"]["rmse"], "ll": saved["test"]["ll"],
                         # (uci.9); None in files written before it was recorded
                         "ll_joint": saved["test"].get("ll_joint"),
                         "seconds": saved["seconds"]["total"],
                         **{f"hyper.{h}": v for h, v in sorted(saved["hyper"].items())}})
    summary = {"method": spec.name, "dataset": dataset, "budget": "quick" if plan.quick else "full",
               "budget_text": budget_text(budget, plan.quick),
               "epochs": budget.settings["epochs"], "splits_done": len(rows),
               "n_splits": n_splits, "splits": [r["split"] for r in rows],
               # false while splits this invocation asked for are missing (running, or the run
               # was interrupted or stopped): such a summary is not the final one
               "complete": not plan.todo}
    if rows:
        summary.update(_stats(rows, plan.se_ddof))
    return summary, rows


def budget_text(budget, quick: bool) -> str:
    """A fit's budget in words, e.g. 'full: 120 epochs, M = 10, S = 4, 20 test draws, 9-point
    grid': what the table's budget column and the figure's legend state."""
    st = budget.settings
    S = budget.grid.get("S_train", (st["S_train"],) if "S_train" in st else None)
    points = math.prod(len(v) for v in budget.grid.values())
    return (f"{'quick' if quick else 'full'}: {st['epochs']} epochs, M = {st['M']}, "
            + (f"S = {'/'.join(map(str, S))}, " if S else "")
            + f"{st['S_test']} test draws, {points}-point grid")


def _caveat(dataset, summaries, published) -> str:
    """The line above the table when a method with published figures for ``dataset`` ran below
    its full budget (--quick, or --epochs below the method's default): not comparable."""
    pub = {r["method"] for r in published if r["dataset"] == dataset}
    reduced = []
    for s in summaries:
        spec = uci_methods.METHODS.get(s["method"])
        if spec is None or ((spec.published_as or s["method"]) not in pub):
            continue
        full = uci_methods.resolve(spec, dataset).settings["epochs"]
        if s.get("budget") == "quick" or (s.get("epochs") or full) < full:
            reduced.append(f"{s['method']}: {s.get('budget_text', s.get('budget'))}, the full "
                           f"budget is {full} epochs")
    if not reduced:
        return ""
    quick = all(s.get("budget") == "quick" for s in summaries)
    return _report.caveat("see the budget column", "the published figures", reduced,
                          "quick" if quick else "")


def _stats(rows, ddof):
    """Over split rows: mean +- s.e. (uci.8) and median (uci.10) of test RMSE and LL, the joint
    LL's mean +- s.e. (uci.9) where every row has it, and the mean seconds per split."""
    stats = {"se_ddof": ddof}
    for key in ("rmse", "ll"):
        values = [r[key] for r in rows]
        stats[f"{key}_mean"], stats[f"{key}_se"] = mean_se(values, ddof)  # (uci.8)
        # (uci.10): one wild split moves the mean, not the median (SLANG on yacht, uci.md)
        stats[f"{key}_median"] = float(np.median(values))
    if all(r["ll_joint"] is not None for r in rows):
        stats["ll_joint_mean"], stats["ll_joint_se"] = mean_se([r["ll_joint"] for r in rows], ddof)
    stats["seconds_per_split"] = float(np.mean([r["seconds"] for r in rows]))
    return stats


def _with_saved(plan, summaries):
    """[(summary, its split rows)]: this invocation's summaries of ``plan.dataset``, then every
    other method's with results for it under out, written by earlier invocations and not checked
    by this one (marked ``saved``; mean +- s.e. recomputed from their split rows at this
    invocation's ddof, so that one table has one convention)."""
    saved = {m: v for (m, _), v in _saved_summaries(plan, f"*/{plan.dataset}/summary.json").items()}
    pairs = [(s, saved[s["method"]]["splits"] if s["method"] in saved else []) for s in summaries]
    run = {s["method"] for s in summaries}
    for m, v in saved.items():
        if m not in run and v["splits"]:
            pairs.append(({**v["summary"], **_stats(v["splits"], plan.se_ddof), "saved": True},
                          v["splits"]))
    return pairs


def _saved_summaries(plan, pattern):
    """{(method, dataset) folder names: its summary.json} for the files under out matching
    ``pattern``; a damaged one is left out with a note."""
    saved = {}
    for p in sorted(Path(plan.out).glob(pattern)):
        summary = _runner.read_saved(p, {"summary": dict, "splits": list}, noted=plan.noted)
        if summary is not None:
            saved[p.parent.parent.name, p.parent.name] = summary
    return saved


def _write_summaries(plan, summary, rows):
    """The plan's summary files and the ones over every (method, dataset) under out. Written
    after every split, so a run that stops (Ctrl-C, a TrainingError) leaves them behind: while
    a split asked for is missing, the JSON says ``"complete": false`` (in the plan's file at the
    top and in its summary; in out/summary.json in each (method, dataset)'s entry, which stays a
    list) and the CSV is ``summary.partial.csv`` (``_runner.write_summary_csv``: readers of
    summary.csv keep working and see only complete summaries). A summary written before
    "complete" existed counts as complete."""
    out, folder = Path(plan.out), plan.folder
    complete = summary["complete"]
    write_json(folder / "summary.json", {"summary": summary, "splits": rows, "complete": complete})
    _runner.write_summary_csv(folder / "summary.csv", rows, complete=complete)
    everything = [v["summary"] for v in _saved_summaries(plan, "*/*/summary.json").values()]
    flat = [{k: (" ".join(map(str, s[k])) if isinstance(s.get(k), list) else s.get(k, True)
                 if k == "complete" else s.get(k))
             for k in SUMMARY_FIELDS} for s in everything]
    write_json(out / "summary.json", everything)
    _runner.write_summary_csv(out / "summary.csv", flat,
                              complete=all(s.get("complete", True) for s in everything))


def _plan(method, dataset, splits=None, quick=False, out=Path("results/uci"), fresh=False,
          data_dir=None, seed=0, epochs=None, se_ddof=1, grid=None) -> _Plan:
    """Check the arguments and every saved file of the requested splits; nothing is computed.

    A saved split is reused when its settings, data checksums and refbayes version match;
    otherwise (or when it is damaged) ValueError naming the file, unless ``fresh``.
    """
    method = uci_methods.canonical_name(method)  # 'noisy-adam' and 'noisy_adam' alike
    if method not in uci_methods.METHODS:
        raise ValueError(f"method: expected one of {', '.join(uci_methods.METHODS)} (hyphens or "
                         f"underscores), got {method!r}")
    if dataset not in DATASETS:
        raise ValueError(f"dataset: expected one of {', '.join(DATASETS)}, got {dataset!r}")
    if se_ddof not in SE_DDOF:
        raise ValueError(f"se_ddof: expected 0 or 1, got {se_ddof!r}")
    spec = uci_methods.METHODS[method]
    splits = check_splits(splits, dataset)
    budget = uci_methods.resolve(spec, dataset, quick, epochs, grid)
    plan = _Plan(spec, dataset, budget, Path(out), Path(out) / method / dataset, splits, [],
                 {}, seed, quick, data_dir, set(), se_ddof)
    # check the data and every saved file before computing anything
    plan.todo.extend(_runner.plan((_runner.Unit(k, plan.folder / f"split_{k}.json", SPLIT_SCHEMA,
                                                _settings(spec, dataset, k, budget, seed, quick),
                                                _split_provenance(plan, k)) for k in splits),
                                  fresh)[1])
    return plan


def _finish(plan, write=True) -> dict:
    """The plan's summary over the splits under its folder (summary files written, with
    ``write``, when there is a split)."""
    summary, rows = _summary(plan)
    if rows and write:
        _write_summaries(plan, summary, rows)
    return summary


def _split_steps(plan) -> int:
    """Optimizer steps of one split, counted as if every training passed over all the set's rows
    at minibatch M: the cost by which parallel splits start longest first. Over the committed
    runs under reproductions/uci this count spans 4,000 (MC dropout, yacht) to 984,000 (SLANG,
    kin8nm) while their time per counted step stays within 0.36-2.4 ms (median split per method
    and set; CPU time, wall time in the files that predate it)."""
    settings = plan.budget.settings
    minibatches = math.ceil(ROWS[plan.dataset] / settings["M"])
    return fits_per_split(plan.budget) * settings["epochs"] * minibatches


def _split_job(method: str, dataset: str, split: int, budget, settings: dict, seed: int,
               data_dir, progress=_runner.QUIET):
    """One split of one method on one dataset, as a job of ``_runner.execute``."""
    spec = uci_methods.METHODS[method]
    n_epochs = budget.settings["epochs"] * fits_per_split(budget)
    with progress.run_bar(n_epochs, f"{spec.name} {dataset} split {split}", unit="epoch") as bar:
        return _run_split(spec, dataset, split, budget, settings, seed, data_dir, bar)


def _split_jobs(plans, owner) -> list:
    """The missing splits of ``plans`` as jobs of ``_runner.execute``, in order; ``owner`` maps
    each job's key to (plan, unit)."""
    jobs = []
    for plan in plans:
        for unit in plan.todo:
            key = f"{plan.spec.name}/{plan.dataset}/split_{unit.key}"
            owner[key] = (plan, unit)
            jobs.append(_runner.Job(key, _split_job, (plan.spec.name, plan.dataset, unit.key,
                                                        plan.budget, unit.settings, plan.seed,
                                                        _runner.worker_path(plan.data_dir),
                                                        _runner.PROGRESS),
                                    _split_steps(plan)))
    return jobs


def _execute(sections, owner, progress, **options) -> None:
    """Run the sections' splits (``_runner.execute``), each split written, with its plan's
    summary files, as it finishes. A TrainingError stops the run naming the finished splits of
    its (method, dataset), which stay on disk and in the summary files."""
    def done(key, result):
        plan, unit = owner[key]
        write_json(unit.path, {**result, "provenance": _split_provenance(plan, unit.key)})
        plan.todo.remove(unit)
        summary, rows = _summary(plan)
        _write_summaries(plan, summary, rows)
        progress.advance(f"{plan.spec.name} {plan.dataset} split {unit.key}")

    try:
        _runner.execute(sections, done, progress, **options)
    except uci_methods.TrainingError as err:
        if getattr(err, "job_key", None) not in owner:
            raise
        plan = owner[err.job_key][0]
        summary, rows = _summary(plan)
        if rows:
            _write_summaries(plan, summary, rows)
        kept = ", ".join(str(r["split"]) for r in rows) or "none"
        raise uci_methods.TrainingError(
            f"{err}. Finished splits kept in {plan.folder}: {kept}") from err


def run_method(method: str, dataset: str, splits=None, quick: bool = False, out=Path("results/uci"),
               fresh: bool = False, data_dir=None, seed: int = 0, epochs: int | None = None,
               progress: bool = True, jobs: int = 1, dask_scheduler: str | None = None,
               threads: int = 1, se_ddof: int = 1, grid: dict | None = None) -> dict:
    """Run (or resume) ``method`` on ``dataset`` over ``splits`` (None: all); returns the summary
    (mean +- standard error over the splits done, std with ``se_ddof``, (uci.8)). ``grid``
    (hyperparameter -> candidates) replaces those candidates of the method's grid.

    A split whose result file exists with the same settings, data checksums and refbayes
    version is loaded; otherwise (or when the file is damaged) it is an error naming the file
    unless ``fresh`` (then it is recomputed). Every saved file is checked, and ``out`` checked
    to be writable, before anything is computed; with nothing to compute a read-only ``out``
    only skips the summary files (note on stderr). A diverging validation grid point is
    recorded and skipped (uci.7); a TrainingError (non-finite values) of every grid point or of
    the final fit stops the run with a message naming method, dataset, split, phase and
    hyperparameters; the splits
    finished before it stay on disk and in the summary files. ``jobs`` > 1 runs the splits in
    that many local processes, ``dask_scheduler`` on a Dask cluster (``_runner.run_jobs``),
    each with ``threads`` BLAS threads; the results equal the serial run's (each split's draws
    come from its coordinates, ``_seeds``).
    """
    plan = _plan(method, dataset, splits, quick, out, fresh, data_dir, seed, epochs, se_ddof, grid)
    n = len(plan.splits)
    write, bar = _runner.start(plan.out, bool(plan.todo), n, n - len(plan.todo),
                               f"uci {method} {dataset}", enabled=progress)
    owner = {}
    with bar:
        _execute([_runner.Section(_split_jobs([plan], owner))], owner, bar, n_jobs=jobs,
                 scheduler=dask_scheduler, threads=threads)
        return _finish(plan, write)


# ----------------------------------------------------------------------------- published

_NUMBERS = ("rmse", "rmse_pm", "ll", "ll_pm")


def load_published() -> list[dict]:
    """The rows of refbayes/experiments/published/uci.csv (comment lines '#' skipped).

    Each row: dataset, method, pm, source, the numbers rmse, rmse_pm, ll, ll_pm as floats (None
    where the source prints no figure: an empty cell, a metric and its spread together), and
    ``digits``: the decimals each number is printed with in the file (the table shows them so).
    """
    text = resources.files("refbayes.experiments").joinpath("published/uci.csv").read_text("utf-8")
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    rows = []
    for r in csv.DictReader(lines):
        cells = {k: r[k].strip() for k in _NUMBERS}
        where = f"published/uci.csv row {r['dataset']},{r['method']}"
        for key in ("rmse", "ll"):
            if (cells[key] == "") != (cells[key + "_pm"] == ""):
                raise ValueError(f"{where}: {key} and {key}_pm must be both given or both empty")
        if cells["ll"] == "" and cells["rmse"] == "":
            raise ValueError(f"{where}: no figure (rmse and ll both empty)")
        rows.append({"dataset": r["dataset"], "method": r["method"], "pm": r["pm"],
                     "source": r["source"],
                     **{k: (None if v == "" else float(v)) for k, v in cells.items()},
                     "digits": {k: len(v.partition(".")[2]) for k, v in cells.items()}})
    return rows


def _fmt(mean, se, digits=3):
    if mean is None:
        return "-"
    return f"{mean:.{digits}f} +- " + ("—" if se is None else f"{se:.{digits}f}")  # —: one split


def _fmt_median(value, digits=3):
    return "-" if value is None else f"{value:.{digits}f}"  # None: a summary written before it


def _fmt_pub(row, key):
    """The published figure as printed in its source (same decimals); '-' where it has none."""
    if row[key] is None:
        return "-"
    d, d_pm = row["digits"][key], row["digits"][key + "_pm"]
    return (f"{row[key]:.{d}f} +- {row[key + '_pm']:.{d_pm}f}"
            + (" (sd)" if row["pm"] == "sd" else ""))


def _head(dataset, ddof=1) -> str:
    return (f"{dataset}: test RMSE and test log-likelihood per point (original units), "
            f"mean +- s.e. over splits (s.e. = std with ddof {ddof} / sqrt(splits); published: "
            "as printed, (sd) marks a standard deviation)")


def _table(dataset, summaries, published) -> str:
    """The table under :func:`_head`: one row per summary ("(saved)" after the name of one
    :func:`_with_saved` added), then the published methods with no results, in parentheses."""
    pub = {r["method"]: r for r in published if r["dataset"] == dataset}
    lines, shown = [], set()
    for s in summaries:
        spec = uci_methods.METHODS.get(s["method"])
        key = (spec.published_as if spec else None) or s["method"]  # the rows it reproduces
        shown.add(key)
        p = pub.get(key)
        name = s["method"] + (" (saved)" if s.get("saved") else "")
        lines.append([name, f"{s['splits_done']}/{s['n_splits']}", s.get("budget_text", s["budget"]),
                      _fmt(s.get("rmse_mean"), s.get("rmse_se")), _fmt_median(s.get("rmse_median")),
                      _fmt(s.get("ll_mean"), s.get("ll_se")), _fmt_median(s.get("ll_median")),
                      _fmt(s.get("ll_joint_mean"), s.get("ll_joint_se")),
                      _fmt_pub(p, "rmse") if p else "-", _fmt_pub(p, "ll") if p else "-",
                      p["source"] if p else "-"])
    for m, p in pub.items():
        if m not in shown:
            lines.append([f"({m})", "-", "-", "-", "-", "-", "-", "-", _fmt_pub(p, "rmse"),
                          _fmt_pub(p, "ll"), p["source"]])
    return format_table(
        ["method", "splits", "budget", "test RMSE", "RMSE median", "test LL", "LL median (uci.10)",
         "test LL joint (uci.9)",
         "published RMSE", "published LL", "source"], lines)


def _figure(plan, pairs, published):
    """Per-split test RMSE and LL of every (summary, split rows) of :func:`_with_saved`."""
    plt = pyplot()
    if plt is None:
        return None
    out, dataset = plan.out, plan.dataset
    pub = [r for r in published if r["dataset"] == dataset]
    summaries = [s for s, _ in pairs]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, key, label in zip(axes, ("rmse", "ll"), ("test RMSE", "test log-likelihood")):
        for j, r in enumerate(pub):
            if r[key] is None:  # the source prints no figure for this metric
                continue
            c = colors[(j + len(summaries)) % len(colors)]
            ax.axhline(r[key], color=c, lw=1, ls="--",
                       label=f"published {r['method']} ({r['source']})")
            ax.axhspan(r[key] - r[key + "_pm"], r[key] + r[key + "_pm"], color=c, alpha=0.15)
        for j, (s, rows) in enumerate(pairs):
            ax.plot([r["split"] for r in rows], [r[key] for r in rows], "o", color=colors[j % len(colors)],
                    label=f"{s['method']} ({s.get('budget_text', s['budget'])}, "
                          f"{s['splits_done']}/{s['n_splits']} splits)")
        ax.set_xlim(-0.5, uci_n_splits(dataset) - 0.5)
        ax.set_xticks(range(uci_n_splits(dataset)))
        ax.set_xlabel("split")
        ax.set_ylabel(label)
    axes[1].legend(fontsize=7, loc="best")
    fig.suptitle(f"{dataset}: per-split test metrics; published mean (dashed) +- spread (band)")
    path = Path(out) / f"{dataset}_splits.png"
    save_figure(fig, path, dpi=110, bbox_inches="tight")
    return path


# ----------------------------------------------------------------------------- command line

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--method", required=True, choices=(*uci_methods.METHODS, "all"),
                        type=uci_methods.canonical_name,
                        help="method of the registry refbayes.experiments.uci_methods, or all "
                             "(hyphens or underscores: noisy-adam = noisy_adam)")
    parser.add_argument("--dataset", required=True, choices=(*DATASETS, "all"),
                        help="UCI dataset, or all (nine)")
    parser.add_argument("--splits", type=_argtype(parse_splits), default=None,
                        help="split indices, e.g. 0,1,5 or 0-4 (default: every split: 20, protein "
                             "5; with --dataset all, indices a dataset lacks are skipped for it)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke-test budget: few epochs, a 2-point grid, few test draws")
    parser.add_argument("--epochs", type=positive_int, default=None,
                        help="epochs per fit (default: the method's; --quick: its quick value)")
    _runner.add_output_arguments(parser, "uci", "split")
    parser.add_argument("--seed", type=seed_arg, default=0, help="master seed (default 0)")
    parser.add_argument("--grid", type=_argtype(parse_grid), action="append", default=[],
                        metavar="KEY=V1,V2,...",
                        help="replace the candidates of one hyperparameter of the method's grid "
                             "(repeatable; e.g. --grid noise_precision=46.3); the grid is part of "
                             "the saved settings, so use another --out")
    parser.add_argument("--se-ddof", type=int, choices=SE_DDOF, default=1,
                        help="standard error over the splits: std with this ddof / sqrt(splits); "
                             "1 (default, the sample std) or 0 (the SLANG repository's table)")
    parser.add_argument("--predictions", type=Path, default=None, metavar="FOLDER",
                        help="after the table, refit each requested split's final fit (its saved "
                             "hyperparameters and draws: one more training per split) and write "
                             "its per-draw test predictions to FOLDER/<method>/<dataset>/"
                             "split_<k>.npz")
    _runner.add_arguments(parser)
    _runner.add_data_dir(parser)


def run(args: argparse.Namespace) -> int:
    """``refbayes reproduce uci``: every (method, dataset) asked for, a table per dataset."""
    methods = list(uci_methods.METHODS) if args.method == "all" else [args.method]
    datasets = list(DATASETS) if args.dataset == "all" else [args.dataset]
    plan = []
    for d in datasets:  # every split index is checked before anything runs
        if args.splits is not None and args.dataset == "all":
            splits = tuple(k for k in args.splits if k < uci_n_splits(d))
            if len(splits) < len(args.splits):
                print(f"{d} has {uci_n_splits(d)} splits: skipping split index "
                      f"{', '.join(str(k) for k in args.splits if k not in splits)} there",
                      file=sys.stderr)
            if not splits:
                continue
        else:
            splits = check_splits(args.splits, d)
        plan.append((d, splits))
    if not plan:
        raise ValueError(f"--splits: no dataset has split {', '.join(map(str, args.splits))}")
    # every saved file of every (method, dataset) is checked before anything is computed
    plans = [(d, [_plan(m, d, splits, quick=args.quick, out=args.out, fresh=args.fresh,
                        data_dir=args.data_dir, seed=args.seed, epochs=args.epochs,
                        se_ddof=args.se_ddof, grid=dict(args.grid))
                  for m in methods]) for d, splits in plan]
    every = [p for _, ps in plans for p in ps]
    total = sum(len(p.splits) for p in every)
    if args.predictions is not None and (reason := writable_error(args.predictions)):
        raise ValueError(f"--predictions: {reason}; nothing was computed")
    write, progress = _runner.start(Path(args.out), any(p.todo for p in every), total,
                                    total - sum(len(p.todo) for p in every), "uci")
    published = load_published()
    sources = set()

    def show(d, ps):
        pairs = _with_saved(ps[0], [_finish(p, write) for p in ps])
        caveat = _caveat(d, [s for s, _ in pairs], published)
        lines = [*([caveat] if caveat else []), _table(d, [s for s, _ in pairs], published)]
        if any(s.get("saved") for s, _ in pairs):
            lines.append("(saved): results an earlier invocation wrote under --out, shown as "
                         "saved (not checked against this one's settings)")
        sources.update(r["source"] for r in published if r["dataset"] == d)
        lines.append(f"results: {Path(args.out)}/<method>/{d}/, {Path(args.out) / 'summary.csv'}")
        path = _figure(ps[0], pairs, published) if write else None
        if path is not None:
            lines.append(f"figure: {path}")
        progress.echo("\n".join(lines) + "\n")
        if args.predictions is not None:
            for p in ps:
                for k in p.splits:
                    progress.echo(write_predictions(p, k, args.predictions))

    owner = {}
    sections = [_runner.Section(_split_jobs(ps, owner),
                                before=lambda d=d: progress.echo(_head(d, args.se_ddof)),
                                after=lambda d=d, ps=ps: show(d, ps)) for d, ps in plans]
    with progress:  # per dataset: its heading, its splits, its table
        _execute(sections, owner, progress, **_runner.job_options(args))
    if sources:
        print("published numbers: refbayes/experiments/published/uci.csv, sources "
              f"{', '.join(sorted(sources))} (citations in that file's header)")
    return 0
