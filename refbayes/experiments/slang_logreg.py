"""The SLANG paper's Bayesian logistic-regression experiments (Mishkin et al. 2018, Table 1).

Protocol (per dataset): a random 50/50 train/test split per restart (a1a: its own test file);
an intercept column (last) with prior precision 1e-5; prior precision 1e-5 (australian),
1 (breast-cancer), 2.8072 (a1a), 25 (usps-3vs5) on the features; mu_0 = 0, Sigma_0 = I;
alpha = beta = 0.05, decay 0.51 (ngvi.12); momentum 0.9 on SLANG's likelihood gradient (ngvi.13)
and none on the other methods, as in the MATLAB code behind the paper's tables (slang.m);
S = 12 Monte Carlo draws; minibatch 32, 32, 128, 64;
methods mean-field EF / Hess / Exact, SLANG L in {1, 2, 5, 10}, full Gaussian EF / Hess / Exact
(natural-gradient steps of refbayes.methods.ngvi / slang, driven by refbayes.methods.driver).
Metrics: test NLL (mean -log p(y | x) in nats, predictive E_q[sigmoid] by Gauss-Hermite,
(exact_vi.11)) and the symmetric KL (KL(exact || q) + KL(q || exact)) / 2 to the exact
full-Gaussian VI optimum of the same split (exact_vi.fit_full), mean +- standard error over
restarts. Two reference rows: exact-vi (the ground truth itself: KL 0, its test NLL) and
exact-mf-vi (the exact mean-field optimum, exact_vi.fit_meanfield: the paper's "Exact" mean-field
row is this optimum found by L-BFGS, not a natural-gradient run). The paper trains 10,000 epochs with 20 restarts (a1a 1); ``--quick`` and the synthetic
default use smaller budgets, stated in the table header.

The staged USPS file is Roweis' usps_all.mat, not the GPML usps_resampled set the paper used; the
3-vs-5 task is built from it (2200 images, not 1540), so its numbers are not the paper's.

Output (``--out``): ``<dataset>/restart_<r>/<method>.json`` as each run finishes (its mu,
Sigma, KL curve and the exact fit's scalars), ``exact-vi.json`` once per restart (the exact VI
fit's mu and Sigma, which every run of the restart is measured against), each with its
provenance (the sha256 of the data files the loader read, DATA_FILES, or of the generated
arrays for synthetic; the refbayes version; the git commit). Resumable: a finished file whose
settings, data checksums and refbayes version match is loaded, not recomputed; otherwise, or
when the file is damaged, the run stops naming the file, unless --fresh (the commit is recorded,
not compared: see refbayes/experiments/_runner.py). ``<dataset>_summary.csv`` and
``<dataset>_summary.json`` are rewritten as results arrive and cover every method with matching
results in --out (not only this invocation's), as do the figures ``<dataset>_covariances.png``
and ``<dataset>_convergence.png``; the table shows the methods asked for. A run whose symmetric
KL moved more than 1% + 0.01 nats over the last 10% of its epochs is flagged "not converged"
(``convergence`` in its JSON, ``converged`` in the summary, the table's converged column, the
figure legend); a run below the paper's budget beside the paper's Table 1 gets a caveat line
(derivations/slang-findings.md, "budget, caveat and convergence").
"""
from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np

from refbayes._files import format_table, write_json
from refbayes.datasets import (
    data_identity,
    load_a1a,
    load_australian,
    load_breast_cancer,
    load_usps_3vs5,
    make_logistic_regression,
    random_split,
)
from refbayes.experiments import _report, _runner
from refbayes.experiments._runner import (
    MayLack,
    job_rng,
    mean_se,
    positive_int,
    provenance,
    pyplot,
    read_saved,
    resume,
    save_figure,
    seed_arg,
    sha256_arrays,
    write_csv,
)
from refbayes.linalg import gaussian
from refbayes.methods import driver, exact_vi, ngvi, slang
from refbayes.models import LogisticRegression, add_intercept

__all__ = ["DESCRIPTION", "METHODS", "DATASETS", "add_arguments", "run", "PAPER_TABLE1"]

DESCRIPTION = "SLANG vs mean-field and full-Gaussian natural-gradient VI on logistic regression (Table 1)"

METHODS = ("mf-ef", "mf-hess", "mf-exact", "slang-1", "slang-2", "slang-5", "slang-10",
           "full-ef", "full-hess", "full-exact")
INTERCEPT_PRECISION = 1e-5
ALPHA = BETA = 0.05
DECAY = 0.51
# The paper's tables come from the MATLAB code: its slang.m averages the likelihood gradient with
# momentum 0.9 (bias-corrected, (ngvi.13)); its EF / Hessian / mean-field baselines use none.
SLANG_MOMENTUM = 0.9
SAMPLES = 12

# name: (prior precision, minibatch M, paper restarts)
DATASETS = {
    "synthetic": (1.0, 32, 3),
    "australian": (1e-5, 32, 20),
    "breast-cancer": (1.0, 32, 20),
    "a1a": (2.8072, 128, 1),
    "usps-3vs5": (25.0, 64, 20),
}
PAPER_EPOCHS = 10_000
# The paper's "Exact" rows are the ELBO optima by L-BFGS (see slang.md, conventions); ours are
# exact_vi.fit_full and exact_vi.fit_meanfield, printed beside them. mf-exact and full-exact here
# are natural-gradient runs with quadrature curvature, which have no rows of their own in the paper.
PAPER_ROW = {"exact-vi": "full-exact", "exact-mf-vi": "mf-exact", "mf-exact": None, "full-exact": None}
# (epochs, restarts) of --quick
QUICK = (500, 5)
# Wall-clock seconds measured on a fresh clone (2026-11-25, a 2-core AMD EPYC virtual machine,
# OpenBLAS with its default threads, nothing else running): the default synthetic run and
# australian with --quick. The help texts and the README quote these; remeasure when the budgets
# or the methods change.
MEASURED_SECONDS = {"synthetic": 94, "australian --quick": 538}
MEASURED_ON = "2 cores"


def _about(seconds: float) -> str:
    """'about N minutes', N rounded to the nearest half minute (>= 1)."""
    half = max(2, round(seconds / 30))
    return f"about {half // 2}{'.5' if half % 2 else ''} minute{'' if half == 2 else 's'}"
SYNTHETIC = dict(n=400, p=20, seed=0, epochs=200)

# The paper's Table 1 (Table 7 of its appendix): per dataset and column, test NLL and symmetric KL
# to its exact VI fit, (nll, nll s.e., kl, kl s.e.), as the official repository's table file
# code/matlab/tables/table_1_7.csv holds them: raw KL (the paper prints australian's KL / 1e4),
# NLL in nats, s.e. over the 20 restarts (a1a has one split: None). The paper's "Exact" columns are
# L-BFGS optima, not natural-gradient runs, and are its KL reference (KL 0): they stand beside our
# exact-vi and exact-mf-vi (PAPER_ROW). Its USPS 3-vs-5 row is left out: our usps-3vs5 is another
# data set (see the module docstring; the row is quoted in slang.md).
PAPER_TABLE1 = {
    "australian": {
        "mf-ef": (0.347964, 0.006861, 22397.808881, 3458.653042),
        "mf-hess": (0.347229, 0.006834, 20301.319220, 3145.559712),
        "mf-exact": (0.341253, 0.007187, 1945.985213, 214.194424),
        "slang-1": (0.341511, 0.006545, 331.828775, 68.344474),
        "slang-2": (0.341574, 0.006539, 313.387025, 66.611334),
        "slang-5": (0.339198, 0.006458, 83.930764, 19.875832),
        "slang-10": (0.338220, 0.006591, 17.261078, 3.178606),
        "full-ef": (0.339621, 0.007205, 0.761768, 0.037490),
        "full-hess": (0.338642, 0.007152, 0.011263, 0.001308),
        "full-exact": (0.338651, 0.007107, 0.0, 0.0),
    },
    "breast-cancer": {
        "mf-ef": (0.095019, 0.002415, 8.018760, 0.254002),
        "mf-hess": (0.094269, 0.002347, 9.070557, 0.175016),
        "mf-exact": (0.093674, 0.002434, 7.771284, 0.117336),
        "slang-1": (0.092090, 0.002297, 0.911170, 0.017685),
        "slang-2": (0.091834, 0.002313, 0.756021, 0.029007),
        "slang-5": (0.091947, 0.002282, 0.841779, 0.023960),
        "slang-10": (0.092048, 0.002296, 0.637638, 0.022201),
        "full-ef": (0.092048, 0.002296, 0.637320, 0.022114),
        "full-hess": (0.091211, 0.002320, 0.001715, 0.000289),
        "full-exact": (0.091240, 0.002323, 0.0, 0.0),
    },
    "a1a": {
        "mf-ef": (0.339044, None, 258.956527, None),
        "mf-hess": (0.338921, None, 220.822661, None),
        "mf-exact": (0.338525, None, 129.464044, None),
        "slang-1": (0.338552, None, 30.505413, None),
        "slang-2": (0.338543, None, 24.900999, None),
        "slang-5": (0.338563, None, 17.306504, None),
        "slang-10": (0.338579, None, 11.790013, None),
        "full-ef": (0.338604, None, 1.407138, None),
        "full-hess": (0.338542, None, 0.014694, None),
        "full-exact": (0.338522, None, 0.0, None),
    },
}


# ----------------------------------------------------------------------------- arguments

def _methods(text: str) -> tuple:
    names = tuple(m.strip() for m in text.split(",") if m.strip())
    bad = [m for m in names if m not in METHODS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"expected a comma-separated subset of {', '.join(METHODS)}, "
                                         f"got {text!r}")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", default="synthetic", choices=(*DATASETS, "all"),
                        help="default: synthetic data shipped in the package "
                             f"({_about(MEASURED_SECONDS['synthetic'])} on {MEASURED_ON})")
    _runner.add_data_dir(parser)
    parser.add_argument("--epochs", type=positive_int, default=None,
                        help=f"epochs per run (default: {PAPER_EPOCHS}, the paper's; synthetic "
                             f"{SYNTHETIC['epochs']}; --quick {QUICK[0]})")
    parser.add_argument("--restarts", type=positive_int, default=None,
                        help="random splits (default: the paper's 20, a1a 1; synthetic 3; --quick 5)")
    parser.add_argument("--methods", type=_methods, default=METHODS,
                        help=f"comma-separated subset of {','.join(METHODS)}")
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK[0]} epochs, {QUICK[1]} restarts: australian in "
                             f"{_about(MEASURED_SECONDS['australian --quick'])} on {MEASURED_ON}")
    parser.add_argument("--seed", type=seed_arg, default=0, help="master seed (default 0)")
    _runner.add_output_arguments(parser, "slang-logreg", "run")
    _runner.add_arguments(parser)


# ----------------------------------------------------------------------------- data

def _load(name, data_dir, restart, seed):
    """(X_train, y_train, X_test, y_test) for one restart; splits from (seed, restart) only."""
    rng = job_rng(seed, restart)
    if name == "synthetic":
        s = make_logistic_regression(SYNTHETIC["n"], SYNTHETIC["p"], SYNTHETIC["seed"])
        X, y = s.X, s.y
    elif name == "a1a":
        return tuple(load_a1a(data_dir))
    else:
        loader = {"australian": load_australian, "breast-cancer": load_breast_cancer,
                  "usps-3vs5": load_usps_3vs5}[name]
        X, y = loader(data_dir)
    tr, te = random_split(X.shape[0], rng)
    return X[tr], y[tr], X[te], y[te]


# dataset -> (registered dataset, the files its loader reads): their checksums are the data
# identity a result records (refbayes.datasets.data_identity).
DATA_FILES = {
    "australian": ("australian", ("australian/australian_scale",)),
    "breast-cancer": ("breast-cancer", ("breast-cancer/breast-cancer_scale",)),
    "a1a": ("a1a", ("a1a/a1a", "a1a/a1a.t")),
    "usps-3vs5": ("usps", ("usps/usps_all.mat",)),
}


def _data_identity(name, data_dir) -> dict:
    """{file: sha256} of the data a run of ``name`` reads; synthetic: of the generated arrays."""
    if name == "synthetic":
        s = make_logistic_regression(SYNTHETIC["n"], SYNTHETIC["p"], SYNTHETIC["seed"])
        return {"synthetic": sha256_arrays(s.X, s.y)}
    dataset, files = DATA_FILES[name]
    return data_identity(dataset, data_dir, files)


def _prior(D, precision):
    lam = np.full(D, precision)
    lam[-1] = INTERCEPT_PRECISION
    return lam


# ----------------------------------------------------------------------------- one run

def _q(state):
    """The run's Gaussian in the parameterization gaussian.py takes."""
    if isinstance(state, slang.SLANGState):
        return gaussian.LowRankPrec(state.mu, state.U, state.d)
    if isinstance(state, ngvi.FullState):
        return gaussian.DensePrec(state.mu, state.Sigma_inv)
    return gaussian.DiagPrec(state.mu, state.prec_diag)


def _covariance(state):
    if isinstance(state, slang.SLANGState):
        return slang.dense_covariance(state)
    if isinstance(state, ngvi.FullState):
        return ngvi.dense_covariance(state)
    return ngvi.dense_covariance_meanfield(state)


def _test_nll(mu, Sigma, Xd_te, y_te):
    """Mean over test rows of -log E_q[sigmoid(s a)], a ~ N(x~^T mu, x~^T Sigma x~).  (exact_vi.11)"""
    m = Xd_te @ mu
    v = ((Xd_te @ Sigma) * Xd_te).sum(axis=1)  # x~_i^T Sigma x~_i: one GEMM, not a 3-operand einsum
    return float(np.mean(exact_vi.logistic_predictive_nll(m, v, y_te)))  # (exact_vi.11)


def _init(method, D, N, lam):
    family, _, rest = method.partition("-")
    if family == "slang":
        L = min(int(rest), D)
        return slang.init(np.zeros(D), np.zeros((D, L)), np.ones(D)), \
            slang.SLANGConfig(N, lam, L=L, alpha=ALPHA, beta=BETA, decay=DECAY,
                              momentum=SLANG_MOMENTUM)
    cfg = ngvi.NGVIConfig(N, lam, alpha=ALPHA, beta=BETA, decay=DECAY, curvature=rest)
    if family == "full":
        return ngvi.init_full(np.zeros(D), np.eye(D)), cfg
    return ngvi.init_meanfield(np.zeros(D), np.ones(D)), cfg


def _checkpoints(epochs):
    """About 20 log-spaced epochs in [1, epochs], always including the last and the one at 90%
    of the budget (where the convergence window starts, ``_convergence``)."""
    pts = {int(round(x)) for x in np.geomspace(1, epochs, 20)}
    return sorted(pts | {epochs, max(1, int((1 - _report.WINDOW) * epochs))})


# Convergence of a run (refbayes.experiments._report.plateau): its symmetric KL to the exact VI
# fit changed by at most CONVERGED_RTOL of its final value plus CONVERGED_ATOL nats over the last
# 10% of the epochs. 1%: the committed runs at the paper's 10,000 epochs that have levelled off
# (SLANG and full-EF on breast-cancer, a1a and usps-3vs5) move 0.0-0.7% from epoch 6158 to 10000,
# while the australian SLANG runs, still falling, move 6-49% (reproductions/, restart 0). The
# 0.01 nats: full-Gaussian runs end at the Monte Carlo noise floor (KL 1e-5 to 2e-3) where the
# relative change of a near-zero KL is noise (50-250%), and a KL of 0.01 nats is indistinguishable
# from the exact posterior for any predictive purpose.
CONVERGED_RTOL, CONVERGED_ATOL = 0.01, 0.01


def _convergence(curve, epochs) -> dict:
    """A run's convergence record from its KL curve [[epoch, KL], ...] (``_report.plateau``)."""
    return _report.plateau(curve, epochs, "sym KL to exact VI", CONVERGED_RTOL, CONVERGED_ATOL,
                           unit="epochs")


def _run_one(method, data, lam, M, epochs, rng, exact, progress):
    X_tr, y_tr, Xd_te, y_te = data
    D = lam.shape[0]
    model = LogisticRegression(X_tr.shape[1])
    state, cfg = _init(method, D, X_tr.shape[0], lam)
    ex_q = gaussian.DenseCov(exact.mu, exact.Sigma)
    marks, curve = set(_checkpoints(epochs)), []

    def record(epoch, st):
        if epoch in marks:
            curve.append([epoch, float(gaussian.symmetric_kl(ex_q, _q(st)))])

    t0, cpu0 = time.perf_counter(), time.process_time()
    state = driver.run(state, cfg, model, X_tr, y_tr, rng=rng, epochs=epochs, M=M, S=SAMPLES,
                       callback=record, progress=progress)
    Sigma = _covariance(state)
    return {"kl": float(gaussian.symmetric_kl(ex_q, _q(state))),
            "nll": _test_nll(state.mu, Sigma, Xd_te, y_te),
            "seconds": time.perf_counter() - t0, "cpu_seconds": time.process_time() - cpu0,
            "curve": curve, "convergence": _convergence(curve, epochs),
            "mu": state.mu.tolist(), "Sigma": Sigma.tolist()}


# ----------------------------------------------------------------------------- driver

def _settings(name, method, restart, epochs, seed, M, prior):
    return {"dataset": name, "method": method, "restart": restart, "epochs": epochs, "seed": seed,
            "M": M, "S": SAMPLES, "alpha": ALPHA, "beta": BETA, "decay": DECAY,
            "momentum": SLANG_MOMENTUM if method.startswith("slang-") else 0.0,
            "prior_precision": prior, "intercept_precision": INTERCEPT_PRECISION,
            "data": {k: v for k, v in SYNTHETIC.items() if k != "epochs"} if name == "synthetic"
            else name}


def _budget(args, name):
    prior, M, paper_restarts = DATASETS[name]
    if args.quick:
        epochs, restarts = QUICK
    elif name == "synthetic":
        epochs, restarts = SYNTHETIC["epochs"], paper_restarts
    else:
        epochs, restarts = PAPER_EPOCHS, paper_restarts
    if name == "a1a":
        restarts = 1  # one fixed train/test split
    return args.epochs or epochs, args.restarts if args.restarts and name != "a1a" else restarts


# Result files: what a run's and an exact mean-field optimum's JSON must hold to be read back.
EXACT_SCALARS = ("nll", "grad_norm", "n_iter")  # of the exact VI fit
# A run's file holds the exact VI fit's scalars; its mu and Sigma are in the restart's one
# exact-vi.json (files written before it existed also hold them, and still load).
RUN_SCHEMA = {"settings": dict, "kl": float, "nll": float, "seconds": float,
              "cpu_seconds": MayLack(float), "curve": list, "mu": list, "Sigma": list,
              "exact_vi": {k: float for k in EXACT_SCALARS}}
EXACT_SCHEMA = {"settings": dict, **{k: float for k in EXACT_SCALARS}, "mu": list,
                "Sigma": list}
MF_SCHEMA = {"settings": dict, "kl": float, "nll": float, "seconds": float,
             "cpu_seconds": MayLack(float), "grad_norm": float, "mu": list, "var": list}
REFERENCE_ROWS = ("exact-vi", "exact-mf-vi")


class _Plan(NamedTuple):
    """One dataset's work: what is on disk (``rows``, ``curves``, ``states``) and what is not."""
    name: str
    epochs: int
    restarts: int
    provenance: dict
    todo: list      # [(restart, method)] to compute, in order
    mf_todo: list   # restarts whose exact mean-field optimum is to compute
    rows: dict      # (restart, method) -> summary row, every method with a reusable result
    curves: dict    # (restart, method) -> convergence curve
    states: dict    # method -> its restart-0 result (for the covariance figure)
    exact: dict     # restart -> its exact VI fit as saved (exact-vi.json), when reusable


def _path(out, name, restart, method) -> Path:
    return Path(out) / name / f"restart_{restart}" / f"{method}.json"


def _row(name, restart, method, epochs, saved) -> dict:
    """A summary row; cpu_seconds is None for files written before it was recorded; converged
    is the run's ``_convergence`` (recomputed from the curve of a file written before it was
    recorded; None for the references, which have no curve, and where not assessable)."""
    conv = (_convergence(saved["curve"], epochs)["converged"]
            if epochs and saved.get("curve") else None)
    return {"dataset": name, "restart": restart, "method": method, "epochs": epochs,
            "nll": saved["nll"], "kl": saved["kl"], "converged": conv,
            "seconds": saved["seconds"], "cpu_seconds": saved.get("cpu_seconds")}


def _exact_row(name, restart, exact_vi) -> dict:
    """The exact-vi summary row (KL 0 by definition; its fit is not timed as a run) from the
    fit's scalars: exact-vi.json's, or the copy in a run's file."""
    return _row(name, restart, "exact-vi", 0, {"nll": exact_vi["nll"], "kl": 0.0, "seconds": 0.0,
                                                "cpu_seconds": 0.0})


def _keep(plan, restart, method, saved) -> None:
    """Record a reusable or new result in the plan's rows (and curve, and restart-0 state)."""
    name = plan.name
    if method == "exact-vi":
        plan.exact[restart] = saved
        plan.rows[restart, method] = _exact_row(name, restart, saved)
        return
    if method == "exact-mf-vi":
        plan.rows[restart, method] = _row(name, restart, method, 0, saved)
        return
    plan.rows[restart, method] = _row(name, restart, method, plan.epochs, saved)
    plan.rows.setdefault((restart, "exact-vi"), _exact_row(name, restart, saved["exact_vi"]))
    plan.curves[restart, method] = saved["curve"]
    if restart == 0:
        plan.states[method] = saved


def _plan(args, name) -> _Plan:
    """Read every result file of ``name`` under --out before anything is computed.

    The requested runs (and each restart's exact mean-field optimum) are reused when their
    settings, data checksums and refbayes version match, recomputed when absent; a mismatch or
    a damaged file stops the run naming the file (with --fresh: recomputed). The other methods'
    results are only read, for the summary and the figures (skipped with a note when damaged).
    """
    prior, M, _ = DATASETS[name]
    epochs, restarts = _budget(args, name)
    prov = provenance(_data_identity(name, args.data_dir))
    plan = _Plan(name, epochs, restarts, prov, [], [], {}, {}, {}, {})
    for r in range(restarts):
        _plan_exact(args, plan, r, M, prior)
        for method in (*METHODS, "exact-mf-vi"):
            asked = method in args.methods or method == "exact-mf-vi"
            path = _path(args.out, name, r, method)
            schema = MF_SCHEMA if method == "exact-mf-vi" else RUN_SCHEMA
            settings = _settings(name, method, r, 0 if method == "exact-mf-vi" else epochs,
                                 args.seed, M, prior)
            if asked:
                saved = resume(path, schema, settings, prov, args.fresh)
            else:
                saved = read_saved(path, schema, settings, prov,
                                   what="the summary and figures")
            if saved is not None:
                _keep(plan, r, method, saved)
            elif method == "exact-mf-vi":
                plan.mf_todo.append(r)
            elif asked:
                plan.todo.append((r, method))
    return plan


def _plan_exact(args, plan, r, M, prior) -> None:
    """Keep restart r's exact-vi.json when it is reusable. Every run of the restart refits it
    (deterministic, under a second) and the first to finish writes it; a restart with no run
    to compute gets a job of its own (``_run_jobs``)."""
    path = _path(args.out, plan.name, r, "exact-vi")
    settings = _settings(plan.name, "exact-vi", r, 0, args.seed, M, prior)
    saved = resume(path, EXACT_SCHEMA, settings, plan.provenance, args.fresh)
    if saved is not None:
        _keep(plan, r, "exact-vi", saved)


def _restart_data(name, r, seed, data_dir):
    """Restart r's split (with intercepts), prior precisions, exact VI fit and its saved form
    (the scalars a run's file keeps, then mu and Sigma for exact-vi.json)."""
    prior, _, _ = DATASETS[name]
    X_tr, y_tr, X_te, y_te = _load(name, data_dir, r, seed)
    Xd_tr, Xd_te = add_intercept(X_tr), add_intercept(X_te)
    lam = _prior(Xd_tr.shape[1], prior)
    exact = exact_vi.fit_full(Xd_tr, y_tr, lam)
    exact_saved = {"nll": _test_nll(exact.mu, exact.Sigma, Xd_te, y_te),
                   "grad_norm": exact.grad_norm, "n_iter": exact.n_iter,
                   "mu": exact.mu.tolist(), "Sigma": exact.Sigma.tolist()}
    return (X_tr, y_tr, Xd_tr, Xd_te, y_te), lam, exact, exact_saved


def _run_job(name, r, method, epochs, seed, data_dir, prov, progress) -> dict:
    """One run: ``method`` (or the exact mean-field optimum, "exact-mf-vi") on restart r of
    ``name``, after the restart's exact VI fit (deterministic, so every job of a restart fits
    the same one); returns {method: result to save}. Its randomness is (seed, r, method) only,
    so it runs anywhere (``_runner.run_jobs``), and a restart's methods run side by side.
    ``progress.run_bar(steps, label)`` gives the run's progress bar context."""
    prior, M, _ = DATASETS[name]
    (X_tr, y_tr, Xd_tr, Xd_te, y_te), lam, exact, exact_saved = _restart_data(name, r, seed,
                                                                              data_dir)
    exact_file = {"exact-vi": {"settings": _settings(name, "exact-vi", r, 0, seed, M, prior),
                               **exact_saved, "provenance": prov}}
    if method == "exact-vi":
        return exact_file
    if method == "exact-mf-vi":
        saved = _meanfield_optimum(_settings(name, method, r, 0, seed, M, prior),
                                   (Xd_tr, y_tr, Xd_te, y_te), lam, exact)
        return {method: {**saved, "provenance": prov}, **exact_file}
    steps = epochs * math.ceil(X_tr.shape[0] / M)
    with progress.run_bar(steps, f"{name} r{r} {method}") as b:
        try:
            result = _run_one(method, (X_tr, y_tr, Xd_te, y_te), lam, M, epochs,
                              job_rng(seed, r, METHODS.index(method)), exact, b.update)
        except driver.TrainingError as err:
            raise ValueError(f"{name}, restart {r}, {method}: {err}") from err
    scalars = {k: exact_saved[k] for k in EXACT_SCALARS}
    return {method: {"settings": _settings(name, method, r, epochs, seed, M, prior),
                     **result, "exact_vi": scalars, "provenance": prov}, **exact_file}


# Seconds per 1,000 epochs of one run, read off the committed runs (reproductions/slang-logreg-*,
# two significant digits; synthetic measured the same way at 1,000 epochs): the relative cost by
# which parallel runs start longest first (``_job_cost``). They come from two 2-core VMs whose
# speeds differ up to 3.5x, so they order the jobs; they do not predict a run's time.
RUN_SECONDS_PER_1000_EPOCHS = {
    "synthetic": {"mf-ef": 0.68, "mf-hess": 0.89, "mf-exact": 1.2, "slang-1": 1.6,
                  "slang-2": 1.8, "slang-5": 1.7, "slang-10": 1.7, "full-ef": 1.0,
                  "full-hess": 1.2, "full-exact": 1.7},
    "australian": {"mf-ef": 11, "mf-hess": 35, "mf-exact": 19, "slang-1": 27, "slang-2": 29,
                   "slang-5": 29, "slang-10": 30, "full-ef": 16, "full-hess": 36,
                   "full-exact": 21},
    "breast-cancer": {"mf-ef": 11, "mf-hess": 53, "mf-exact": 30, "slang-1": 30, "slang-2": 33,
                      "slang-5": 36, "slang-10": 37, "full-ef": 21, "full-hess": 44,
                      "full-exact": 26},
    "a1a": {"mf-ef": 14, "mf-hess": 15, "mf-exact": 18, "slang-1": 56, "slang-2": 49,
            "slang-5": 48, "slang-10": 58, "full-ef": 64, "full-hess": 100, "full-exact": 64},
    "usps-3vs5": {"mf-ef": 22, "mf-hess": 24, "mf-exact": 16, "slang-1": 120, "slang-2": 130,
                  "slang-5": 140, "slang-10": 140, "full-ef": 78, "full-hess": 53,
                  "full-exact": 53},
}
# An exact VI fit or exact mean-field optimum, any epochs: 0.04-1.8 s measured.
REFERENCE_SECONDS = 2.0


def _job_cost(name: str, method: str, epochs: int) -> float:
    """A run's relative cost: RUN_SECONDS_PER_1000_EPOCHS scaled to its epochs."""
    if method in REFERENCE_ROWS:
        return REFERENCE_SECONDS
    return RUN_SECONDS_PER_1000_EPOCHS[name][method] * epochs / 1000


def _run_jobs(plan, write=True) -> list:
    """The plan's runs to compute, as (r, method): each restart's methods in the paper's order,
    then its exact mean-field optimum; "exact-vi" alone for a restart whose exact-vi.json is
    missing and which has nothing else to compute (not in a read-only --out, where the runs'
    own copy of its scalars serves: ``_keep``)."""
    jobs = []
    for r in range(plan.restarts):
        todo = ([m for rr, m in plan.todo if rr == r]
                + (["exact-mf-vi"] if r in plan.mf_todo else []))
        if not todo and r not in plan.exact and write:
            todo = ["exact-vi"]
        jobs += [(r, m) for m in todo]
    return jobs


def _save_run(args, plan, r, results, progress) -> None:
    """Write a job's files: its run, and the restart's exact-vi.json unless already kept."""
    for method, saved in results.items():
        if method == "exact-vi" and r in plan.exact:
            continue
        write_json(_path(args.out, plan.name, r, method), saved)
        _keep(plan, r, method, saved)
        if method not in REFERENCE_ROWS:
            progress.advance(f"{plan.name} r{r} {method}")


def _jobs(args, plan, write, owner) -> list:
    """The plan's runs to compute as jobs of ``_runner.execute`` (``_run_jobs``'s order);
    ``owner`` maps each job's key to (plan, restart)."""
    jobs = []
    for r, method in _run_jobs(plan, write):
        key = f"{plan.name}/restart_{r}/{method}"
        owner[key] = (plan, r)
        jobs.append(_runner.Job(key, _run_job, (plan.name, r, method, plan.epochs, args.seed,
                                                  _runner.worker_path(args.data_dir),
                                                  plan.provenance,
                                                  _runner.PROGRESS),
                                _job_cost(plan.name, method, plan.epochs)))
    return jobs


def _rows(plan, methods=METHODS) -> list:
    """The summary rows: per restart, ``methods`` with results, then exact VI, exact mean-field VI."""
    order = (*methods, *REFERENCE_ROWS)
    return [plan.rows[r, m] for r in range(plan.restarts) for m in order if (r, m) in plan.rows]


def _meanfield_optimum(settings, data, lam, exact):
    """The exact mean-field optimum (exact_vi.fit_meanfield), which is what the paper's
    "mf-exact" row is (a batch optimizer, not a natural-gradient run); cached like the runs."""
    Xd_tr, y_tr, Xd_te, y_te = data
    t0, cpu0 = time.perf_counter(), time.process_time()
    mf = exact_vi.fit_meanfield(Xd_tr, y_tr, lam, max_iter=5000)
    ex_q = gaussian.DenseCov(exact.mu, exact.Sigma)
    return {"settings": settings, "seconds": time.perf_counter() - t0,
            "cpu_seconds": time.process_time() - cpu0,
            "kl": float(gaussian.symmetric_kl(ex_q, gaussian.DiagCov(mf.mu, mf.var))),
            "nll": _test_nll(mf.mu, np.diag(mf.var), Xd_te, y_te), "grad_norm": mf.grad_norm,
            "mu": mf.mu.tolist(), "var": mf.var.tolist()}


def _write_summary(out, name, rows):
    write_csv(out / f"{name}_summary.csv", rows)
    write_json(out / f"{name}_summary.json", rows)


def _spread(se, spec) -> str:
    return "—" if se is None else format(se, spec)  # one run: no spread to show


def _head(name, epochs, restarts) -> str:
    data = (f"; data: n = {SYNTHETIC['n']}, p = {SYNTHETIC['p']}, a 50/50 split per restart"
            if name == "synthetic" else "")
    return (f"{name}: {epochs} epochs, {restarts} restart(s), M = {DATASETS[name][1]}, S = {SAMPLES}, "
            f"alpha = beta = {ALPHA}, decay {DECAY}{data}")


def _paper(name, method):
    """The paper's Table 1 entries beside ``method`` as two cells (NLL, KL), or dashes."""
    row = PAPER_TABLE1.get(name, {}).get(PAPER_ROW.get(method, method))
    if row is None:
        return ["-", "-"]
    nll, nll_se, kl, kl_se = row
    return [f"{nll:.4f} +- {_spread(nll_se, '.4f')}", f"{kl:.3e} +- {_spread(kl_se, '.1e')}"]


def _caveat(name, epochs, restarts, quick=False) -> str:
    """The table's caveat line for a run below the paper's budget (10,000 epochs, its restarts)
    on a dataset whose Table 1 row is printed beside ours; '' otherwise."""
    if name not in PAPER_TABLE1:
        return ""
    paper_restarts = DATASETS[name][2]
    reduced = ([f"{epochs} of the paper's {PAPER_EPOCHS} epochs"] if epochs < PAPER_EPOCHS else [])
    reduced += ([f"{restarts} of its {paper_restarts} restarts"] if restarts < paper_restarts
                else [])
    return _report.caveat(f"S = {SAMPLES}, {epochs} epochs, {restarts} restart(s)",
                          "the paper's Table 1", reduced, "quick" if quick else "")


def _converged_cell(sel) -> str:
    """'k/n': of the n runs with a convergence verdict, k converged; '-' for none (references)."""
    known = [r.get("converged") for r in sel if r.get("converged") is not None]
    return f"{sum(known)}/{len(known)}" if known else "-"


def _table(name, rows, methods, caveat=""):
    """The table under :func:`_head`: ``methods`` and the two references, mean +- s.e., how many
    restarts converged (``_convergence``), beside the paper's Table 1 where it has the dataset
    (PAPER_TABLE1); ``caveat`` (:func:`_caveat`) above the rows, a 'not converged' line per
    method below them."""
    lines, flags = [], []
    for method in (*methods, *REFERENCE_ROWS):  # the summary's order
        sel = [r for r in rows if r["method"] == method]
        nll, nll_se = mean_se([r["nll"] for r in sel])
        kl, kl_se = mean_se([r["kl"] for r in sel])
        lines.append([method, f"{nll:.4f} +- {_spread(nll_se, '.4f')}",
                      f"{kl:.3e} +- {_spread(kl_se, '.1e')}", _converged_cell(sel),
                      *_paper(name, method)])
        bad = [r["restart"] for r in sel if r.get("converged") is False]
        if bad:
            flags.append(f"not converged: {method}: restart(s) {', '.join(map(str, bad))} of "
                         f"{len(sel)} (sym KL moved > {CONVERGED_RTOL:.0%} + {CONVERGED_ATOL:g} "
                         f"nats over the last {_report.WINDOW:.0%} of the epochs)")
    table = format_table(["method", "test NLL (nats)", "sym KL to exact VI", "converged",
                          "paper test NLL", "paper sym KL"], lines)
    return "\n".join([*([caveat] if caveat else []), table, *flags])


def _exact_Sigma(plan):
    """Restart 0's exact VI covariance: from exact-vi.json, or embedded in a run's file written
    before exact-vi.json existed."""
    if 0 in plan.exact:
        return plan.exact[0]["Sigma"]
    return next((s["exact_vi"]["Sigma"] for s in plan.states.values() if "Sigma" in s["exact_vi"]),
                None)


def _figures(out, name, states, exact_Sigma, curves_by_run, methods, budget=""):
    """The covariance and convergence figures; ``budget`` (:func:`_head`) heads their titles, and
    a method with a restart that did not converge (``_convergence``) is marked in the legend."""
    plt = pyplot()
    if plt is None:
        return []
    paths = []
    panels = [] if exact_Sigma is None else [("exact VI", np.asarray(exact_Sigma))]
    panels += [(m, np.asarray(states[m]["Sigma"])) for m in
               ("slang-1", "slang-5", "slang-10", "mf-exact", "full-ef") if m in states]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 3.4), squeeze=False)
    for ax, (title, S) in zip(axes[0], panels):
        sd = np.sqrt(np.diag(S))
        im = ax.imshow(S / np.outer(sd, sd), vmin=-1, vmax=1, cmap="RdBu_r")
        ax.set_title(title)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label="correlation")
    fig.suptitle(f"{name}, restart 0: posterior correlation matrices\n{budget}", fontsize=9)
    paths.append(out / f"{name}_covariances.png")
    save_figure(fig, paths[-1], dpi=110)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for method in methods:
        curves = [np.asarray(c) for (r, m), c in sorted(curves_by_run.items()) if m == method]
        curves = [c for c in curves if len(c)]
        if curves:
            bad = sum(_convergence(c.tolist(), int(c[-1, 0]))["converged"] is False
                      for c in curves)
            ax.loglog(curves[0][:, 0], np.mean([c[:, 1] for c in curves], axis=0),
                      label=method + (f" (not converged: {bad}/{len(curves)})" if bad else ""),
                      marker=".")
    ax.set_xlabel("epoch")
    ax.set_ylabel("symmetric KL to exact VI (mean over restarts)")
    ax.set_title(f"{name}: convergence\n{budget}\n(not converged k/n: k of n restarts' KL moved > "
                 f"{CONVERGED_RTOL:.0%} + {CONVERGED_ATOL:g} nats over the last "
                 f"{_report.WINDOW:.0%} of the epochs)", fontsize=8)
    ax.legend(fontsize=8, ncol=2)
    paths.append(out / f"{name}_convergence.png")
    save_figure(fig, paths[-1], dpi=110, bbox_inches="tight")
    return paths


def run(args: argparse.Namespace) -> int:
    """The ``refbayes reproduce slang-logreg`` handler.

    Every result file under --out is read and checked before anything is computed, and --out
    is checked to be writable when something is to be written; a complete set of results in a
    read-only --out still prints its tables (summary files and figures are then not updated).
    Per dataset the table's header line is printed before computing, the table when done;
    progress (one line over every run of every dataset) goes to stderr.
    """
    names = [n for n in DATASETS if n != "synthetic"] if args.dataset == "all" else [args.dataset]
    out = Path(args.out)
    plans = [_plan(args, name) for name in names]
    todo = sum(len(p.todo) + len(p.mf_todo) for p in plans)
    total = sum(p.restarts for p in plans) * len(args.methods)
    write, progress = _runner.start(out, todo > 0, total,
                                    total - sum(len(p.todo) for p in plans), "slang-logreg")
    owner = {}

    def done(key, results):  # each run's file (and the summary) written as it comes
        plan, r = owner[key]
        _save_run(args, plan, r, results, progress)
        if write:
            _write_summary(out, plan.name, _rows(plan))

    def show(plan):
        name = plan.name
        shown = tuple(m for m in METHODS if m in args.methods)  # the summary's order, not --methods's
        progress.echo(_table(name, _rows(plan, shown), shown,
                             _caveat(name, plan.epochs, plan.restarts, args.quick)))
        present = [m for m in METHODS if any((r, m) in plan.rows for r in range(plan.restarts))]
        lines = [f"\nresults: {out / name}/, {out / (name + '_summary.csv')}"]
        if set(present) != set(args.methods):
            lines.append(f"summary and figures: every method with results there ({', '.join(present)})")
        if write:
            _write_summary(out, name, _rows(plan))
            if plan.states:
                lines += [f"figure: {path}" for path in
                          _figures(out, name, plan.states, _exact_Sigma(plan), plan.curves,
                                   present, _head(name, plan.epochs, plan.restarts))]
        if name in PAPER_TABLE1:
            lines.append("\nThe paper's numbers (its repository's table file) come from 10,000 "
                         "epochs and 'exact' references computed with a piecewise bound on "
                         "E[log sigmoid]; ours are exact (quadrature to 1e-11).")
        if name == "usps-3vs5":
            lines.append("\nusps-3vs5 is built from Roweis' usps_all.mat (2200 images), not the "
                         "GPML set the paper used (1540): not comparable with the paper's numbers.")
        progress.echo("\n".join(lines) + "\n")

    sections = [_runner.Section(
        _jobs(args, plan, write, owner),
        before=lambda plan=plan: progress.echo(_head(plan.name, plan.epochs, plan.restarts)),
        after=lambda plan=plan: show(plan)) for plan in plans]
    with progress:  # per dataset: its heading, its runs, its table
        _runner.execute(sections, done, progress, **_runner.job_options(args))
    return 0
