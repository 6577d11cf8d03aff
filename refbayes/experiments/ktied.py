"""The MNIST MLP experiment of the k-tied Normal paper (Swiatkowski et al. 2020, ICML,
arXiv:2002.02655), on the 5000-image MNIST subset the data folder holds.

Protocol (derivations/ktied_experiments.md gives every decision and why):

- data: ``load_mnist_subset`` (pixels / 255), split per class by ``default_rng(SeedSequence(
  [seed, 0]))``: --n-train images (default 4000, 400 per digit) to train, the rest (1000) to test;
  or, with ``--mnist full``, full MNIST's official 60,000 / 10,000 (``load_mnist``, dataset
  ``mnist``: the paper's data; derivations/ktied_experiments.md, "Full MNIST", has the measured run);
- model: MLP 784-400-400-10 (--hidden), ReLU, categorical likelihood; prior N(0, I) (lam = 1);
- runs: Gaussian mean-field VI (``methods.bbb``, the paper's GMFVI) and the k-tied Normal
  (``methods.ktied``) for k = 1, 2, 3 (--runs). All start from the same Glorot mean, the
  mean-field scale rho ~ N(-3, 0.1^2) and the k-tied U = V = sqrt(softplus(-3) / k) with the same
  jitter 0.1 in rho (ktied.8), so every run starts at the same q up to that jitter;
- training: --steps Adam steps (default 10,000; alpha 1e-3, Kingma and Ba's betas), minibatch 128
  in epochs of a fresh permutation, S = 1 draw, the full ELBO (kl_weight = 1). Minibatches and
  eps are common to all runs (the same draws at the same step), from generators seeded by
  (seed, step) only, so a resumed run takes exactly the same steps;
- measured as the run goes: every --eval-every steps the -ELBO per training example on the whole
  training set and the test NLL / accuracy (``ktied.evaluate``, 2 draws); at the --snr-steps
  (default 1000, 5000, 9000) the gradient SNR (ktied.15) of every layer's scale and mean
  parameters from --snr-draws (default 50) fresh (minibatch, eps) pairs at the current state;
- at the end: ``ktied.evaluate`` with --final-draws (default 100) draws, standard errors over
  examples (the paper's error bars); for the mean-field run the post-hoc analysis: the
  explained-variance spectra of each layer's A (standard deviations) and M (means) (ktied.12),
  and the rank-1..3 truncation of A substituted back (ktied.13), evaluated with the same draws.

Output (--out, default results/ktied): ``run_<name>.json`` per run as it finishes (settings,
provenance, curves, SNR, final scores, wall seconds and the process's CPU seconds
(``time.process_time``; not recorded by runs before 2026-11-28)), ``<name>.ckpt.npz`` every
--checkpoint-every steps while it runs (the run resumes from it), ``posterior_<name>.npz``
(mu, sigma), ``posthoc.json``, the CSV files ``trained.csv``, ``truncation.csv``, ``curves.csv``,
``snr.csv``, and with matplotlib the figures ``spectra.png``, ``heatmap_A.png``,
``elbo_vs_step.png``, ``snr.png``. A saved run or checkpoint is reused only when its settings,
data checksum and refbayes version match; otherwise the run stops naming the file, unless --fresh.
The table header and figure titles state the data, steps, M and S; a run below the paper's
setting prints a caveat above the rows beside the paper's (``_report.caveat``); a run whose
-ELBO / N still moved more than 1% over the last 10% of its steps is flagged "not converged"
(``convergence`` in its JSON, the table, the figure legends; derivations/ktied_experiments.md).

Parallel runs: the runs are independent jobs (``--jobs N`` local processes or
``--dask-scheduler ADDRESS``, ``refbayes.experiments._runner``): every draw comes from a
generator seeded by (seed, purpose, step), none shared between runs, so the results equal the
serial run's bit for bit. A worker rebuilds the data from --data-dir and refuses other data than
the main process read. Local processes checkpoint and resume under --out as the serial run
does; Dask workers (which may not see --out) neither read nor write checkpoints, so an
interrupted run restarts from step 0 there (same numbers). Files are written by the main process
as the runs come back.

Run times (MEASURED_SECONDS, 2-core AMD EPYC VM, one BLAS thread, under load): the default
run about 69 minutes of compute (two processes side by side, ``--runs meanfield`` and
``--runs 1,2,3`` into one --out, then one more call for the combined tables: about 40 minutes),
--quick about 3 minutes.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
from pathlib import Path
from typing import Any, Callable, NamedTuple

import numpy as np

from refbayes._files import (
    atomic_write_npz,
    format_table,
    write_json,
)
from refbayes.datasets import data_identity, load_mnist, load_mnist_subset
from refbayes.experiments import _report, _runner
from refbayes.experiments._runner import (
    MayLack,
    job_rng,
    positive_int,
    provenance,
    pyplot,
    reusable,
    save_figure,
    seed_arg,
    write_csv,
)
from refbayes.methods import bbb, ktied
from refbayes.models import MLP

__all__ = ["DESCRIPTION", "MEASURED_SECONDS", "PAPER", "add_arguments", "run", "split"]

DESCRIPTION = ("The k-tied Normal vs mean-field VI on an MNIST MLP (Swiatkowski et al. 2020): "
               "training, SVD spectra, rank-k truncation, gradient SNR")
CITATION = ("Swiatkowski et al. (2020), The k-tied Normal Distribution: A Compact "
            "Parameterization of Gaussian Mean Field Posteriors in Bayesian Neural Networks, "
            "ICML 2020, arXiv:2002.02655")

# The paper's MNIST MLP rows (full MNIST, its budget), as transcribed in the issue: -ELBO, its
# error, NLL, its error, accuracy %, its error, #params (thousands).
PAPER = {"meanfield": (0.501, 0.0061, 0.133, 0.0040, 96.8, 0.18, 957),
         "k1": (0.539, 0.0063, 0.155, 0.0043, 96.1, 0.19, 482),
         "k2": (0.520, 0.0063, 0.129, 0.0039, 96.8, 0.18, 484),
         "k3": (0.497, 0.0060, 0.120, 0.0038, 96.9, 0.18, 486)}

RHO0, RHO0_SD = -3.0, 0.1  # TensorFlow Probability's default mean-field start (ktied.8)
LAM = 1.0                  # prior N(0, I)
TRUNCATION_RANKS = (1, 2, 3)
MNIST_FILE = "mnist/mnist_5k.csv.gz"
MNIST_FULL_FILES = tuple(f"mnist-full/{p}-{k}.gz" for p in ("train", "t10k")
                         for k in ("images-idx3-ubyte", "labels-idx1-ubyte"))

DEFAULTS = dict(steps=10_000, batch=128, lr=1e-3, hidden=(400, 400), n_train=4000,
                eval_every=250, eval_draws=2, snr_steps=(1000, 5000, 9000), snr_draws=50,
                final_draws=100, checkpoint_every=1000)
QUICK = dict(DEFAULTS, steps=600, eval_every=100, snr_steps=(200, 400), snr_draws=10,
             final_draws=10, checkpoint_every=200)

# Seconds on the 2-core development VM (AMD EPYC), one BLAS thread per process, other jobs
# keeping the load at 3-5: the default run is the sum of its four runs' recorded seconds
# (mean field 2162, k = 1, 2, 3: 895, 506, 519; the mean-field run still with the BBB step before
# its 1.6x speed-up, derivations/ktied_experiments.md, Performance) plus 60 s of post-hoc analysis, run as
# two processes side by side; --quick is one process, wall clock. Remeasure when budgets change.
MEASURED_SECONDS = {"default": 4140, "quick": 181}
# Convergence (refbayes.experiments._report.plateau): the whole-training-set -ELBO / N of the
# curve changed by at most CONVERGED_RTOL of its final value over the last 10% of the steps.
# 1%: a -ELBO / N near the paper's 0.5 that still moves by 0.005 per 10% of the budget is still
# falling, and a --quick run, still shrinking its KL, moves 4-11% there (seed 0: mean field 249
# -> 239 from step 500 to 600). The Monte Carlo noise of the 2-draw evaluation at convergence was
# not measured; were it above 1%, a converged run would be flagged: the safe side.
CONVERGED_RTOL = 0.01
MEASURED_ON = "2 cores, one BLAS thread, under load"


# ----------------------------------------------------------------------------- arguments

def _runs(text: str) -> tuple:
    if text == "all":
        return ("meanfield", "k1", "k2", "k3")
    out = []
    for part in (p.strip() for p in text.split(",")):
        if part == "meanfield":
            out.append(part)
        elif part.isdigit() and int(part) >= 1:
            out.append(f"k{int(part)}")
        else:
            raise argparse.ArgumentTypeError(
                f"expected meanfield, ranks k >= 1, a comma-separated list of them, or all; "
                f"got {text!r}")
    if len(set(out)) != len(out):
        raise argparse.ArgumentTypeError(f"expected each run once, got {text!r}")
    return tuple(out)


def _ints(text: str) -> tuple:
    parts = [p.strip() for p in text.split(",")]
    if not parts or any(not p.isdigit() or int(p) < 1 for p in parts):
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 1, got {text!r}")
    return tuple(int(p) for p in parts)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = DEFAULTS
    parser.add_argument("--runs", type=_runs, default=_runs("all"),
                        help="meanfield and/or ranks k, comma-separated, or all (default: "
                             "meanfield,1,2,3)")
    parser.add_argument("--steps", type=positive_int, default=None,
                        help=f"Adam steps per run (default {d['steps']}; --quick {QUICK['steps']})")
    parser.add_argument("--batch", type=positive_int, default=d["batch"],
                        help=f"minibatch size M (default {d['batch']})")
    parser.add_argument("--lr", type=_positive_float, default=d["lr"],
                        help=f"Adam step size (default {d['lr']})")
    parser.add_argument("--hidden", type=_ints, default=d["hidden"],
                        help="hidden widths, comma-separated (default 400,400)")
    parser.add_argument("--mnist", choices=("subset", "full"), default="subset",
                        help="subset: the staged 5000 images, split by --n-train (default); "
                             "full: the 60,000 / 10,000 images of full MNIST (the paper's data; "
                             "in the staged data, or `refbayes data fetch mnist`)")
    parser.add_argument("--n-train", type=positive_int, default=d["n_train"],
                        help=f"training images of the 5000 of the subset, the rest test "
                             f"(default {d['n_train']}; not used with --mnist full)")
    parser.add_argument("--eval-every", type=positive_int, default=None,
                        help=f"steps between whole-set evaluations (default {d['eval_every']})")
    parser.add_argument("--snr-steps", type=_ints, default=None,
                        help="steps at which the gradient SNR is measured (default 1000,5000,9000)")
    parser.add_argument("--snr-draws", type=positive_int, default=None,
                        help=f"gradients per SNR estimate, >= 2 (default {d['snr_draws']})")
    parser.add_argument("--final-draws", type=positive_int, default=None,
                        help=f"posterior draws of the final evaluation (default {d['final_draws']})")
    parser.add_argument("--checkpoint-every", type=positive_int, default=None,
                        help=f"steps between checkpoints (default {d['checkpoint_every']})")
    parser.add_argument("--seed", type=seed_arg, default=0, help="master seed (default 0)")
    parser.add_argument("--quick", action="store_true",
                        help=f"smoke test: {QUICK['steps']} steps, SNR at "
                             f"{','.join(map(str, QUICK['snr_steps']))} from {QUICK['snr_draws']} "
                             f"gradients, 10 final draws (about {MEASURED_SECONDS['quick']} s on "
                             f"{MEASURED_ON}; the default run about "
                             f"{round(MEASURED_SECONDS['default'] / 60)} minutes)")
    _runner.add_output_arguments(parser, "ktied", "run")
    _runner.add_arguments(parser)
    _runner.add_data_dir(parser)
    parser.add_argument("--no-progress", action="store_true", help="no progress output")


def _budget(args) -> dict:
    b = _runner.overridden(QUICK if args.quick else DEFAULTS, args,
                           ("batch", "lr", "n_train", "steps", "eval_every", "snr_steps",
                            "snr_draws", "final_draws", "checkpoint_every"))
    b["hidden"] = tuple(args.hidden)
    if args.mnist == "full":  # recorded only when full: a subset run's settings have no "mnist"
        b.update(mnist="full", n_train=60_000)
    if b["snr_draws"] < 2:
        raise ValueError(f"--snr-draws: expected >= 2 (a variance), got {b['snr_draws']}")
    if args.mnist == "subset" and not 10 <= b["n_train"] <= 4990:
        raise ValueError(f"--n-train: expected 10..4990 of the 5000 images, got {b['n_train']}")
    if b["batch"] > b["n_train"]:
        raise ValueError(f"--batch: expected <= --n-train = {b['n_train']}, got {b['batch']}")
    b["snr_steps"] = tuple(s for s in b["snr_steps"] if s <= b["steps"])
    return b


# ----------------------------------------------------------------------------- data

def split(y, n_train: int, rng: np.random.Generator):
    """(train, test) sorted row indices: per digit, round(n_train / 10) rows to train (the first
    of a permutation by ``rng``), the rest of that digit to test (the subset has 500 per digit)."""
    per = int(round(n_train / 10))
    train, test = [], []
    for c in range(10):
        rows = rng.permutation(np.flatnonzero(y == c))
        train.append(rows[:per])
        test.append(rows[per:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


class _Data(NamedTuple):
    train: ktied.Batch
    test: ktied.Batch
    identity: dict


def _load(args, budget) -> _Data:
    if budget.get("mnist") == "full":
        tt = load_mnist(args.data_dir)
        return _Data(ktied.Batch(tt.X_train, tt.y_train), ktied.Batch(tt.X_test, tt.y_test),
                     data_identity("mnist", args.data_dir, MNIST_FULL_FILES))
    X, y = load_mnist_subset(args.data_dir)
    tr, te = split(y, budget["n_train"], job_rng(args.seed, 0))
    return _Data(ktied.Batch(X[tr], y[tr]), ktied.Batch(X[te], y[te]),
                 data_identity("mnist-5k", args.data_dir, (MNIST_FILE,)))


# ----------------------------------------------------------------------------- the methods

class _Method(NamedTuple):
    name: str
    state: Any          # the initial state
    step: Callable      # (state, batch, eps) -> (state, info)
    sigma: Callable     # state -> sigma (D,)
    scale_slices: list  # per layer: the entries of info.grad_rho that scale W_l
    mean_slices: list   # per layer: the entries of info.grad_mu of W_l
    n_params: int       # variational parameters (ktied.10)


def _model(hidden) -> MLP:
    return MLP([784, *hidden, 10], activation="relu", likelihood="categorical")


def _make(name, model, mu0, seed, N, lr) -> _Method:
    """The run ``name`` ("meanfield" or "k<rank>"): its initial state and step (ktied.8)."""
    cfg = bbb.BBBConfig(N, LAM, alpha=lr)
    sizes = model.sizes
    theta_lay = ktied.layout(model, 1)
    w_slices = [slice(theta_lay.w_theta[l], theta_lay.w_theta[l] + sizes[l] * sizes[l + 1])
                for l in range(len(sizes) - 1)]
    if name == "meanfield":
        rho0 = RHO0 + RHO0_SD * job_rng(seed, 1).standard_normal(model.D)
        return _Method(name, bbb.init(mu0, rho0=rho0),
                       lambda s, b, e: bbb.step(s, b, e, cfg, model),
                       lambda s: bbb.softplus(s.rho), w_slices, w_slices,
                       ktied.n_variational_params(model))
    k = int(name[1:])
    lay = ktied.layout(model, k)
    xi = job_rng(seed, 1, k).standard_normal(lay.P)
    sigma0 = float(bbb.softplus(np.array(RHO0)))
    tied = [slice(lay.u_off[l], lay.u_off[l] + (sizes[l] + sizes[l + 1]) * k)
            for l in range(len(sizes) - 1)]
    return _Method(name, ktied.init(mu0, model, k, sigma0, xi, RHO0_SD),
                   lambda s, b, e: ktied.step(s, b, e, cfg, model),
                   lambda s: ktied.std(s, model), tied, w_slices,
                   ktied.n_variational_params(model, k))


def _batch_rows(seed, t, N, M):
    """Rows of step t: block t mod E of epoch t // E's permutation (E = N // M blocks)."""
    E = N // M
    perm = job_rng(seed, 2, t // E).permutation(N)
    j = t % E
    return perm[j * M:(j + 1) * M]


def _evaluate(method, state, model, data, eps) -> dict:
    ev = ktied.evaluate(state.mu, method.sigma(state), model, data.train, data.test, eps, LAM)
    return {k: float(v) for k, v in ev._asdict().items()}


def _snr(method, state, data, seed, t, R, M) -> list:
    """SNR (ktied.15) of each layer's scale and mean parameters at ``state``, from R fresh
    (minibatch, eps) pairs: the same pairs for every run."""
    X, y = data.train
    N, D = X.shape[0], state.mu.shape[0]
    rng = job_rng(seed, 5, t)
    G_rho, G_mu = [], []
    for _ in range(R):
        rows = rng.choice(N, size=M, replace=False)
        info = method.step(state, ktied.Batch(X[rows], y[rows]), rng.standard_normal((D, 1)))[1]
        G_rho.append(info.grad_rho)
        G_mu.append(info.grad_mu)
    G_rho, G_mu = np.stack(G_rho), np.stack(G_mu)
    out = []
    for l, (s_sl, m_sl) in enumerate(zip(method.scale_slices, method.mean_slices)):
        for kind, G in (("scale", G_rho[:, s_sl]), ("mean", G_mu[:, m_sl])):
            snr = ktied.snr(G)
            finite = snr[np.isfinite(snr)]
            none = finite.size == 0  # every gradient deterministic: no SNR to summarise
            out.append({"step": t, "layer": l + 1, "kind": kind, "n": int(G.shape[1]),
                        "n_finite": int(finite.size),
                        "mean": None if none else float(np.mean(finite)),
                        "median": None if none else float(np.median(finite))})
    return out


# ----------------------------------------------------------------------------- checkpoints

def _ckpt_path(out, name) -> Path:
    return Path(out) / f"{name}.ckpt.npz"


def _save_checkpoint(out, name, state, record):
    atomic_write_npz(_ckpt_path(out, name), mu=state.mu, rho=state.rho, m=state.adam.m, v=state.adam.v,
              t=np.array(state.t), record=np.array(json.dumps(record)))


def _read_checkpoint(out, name, settings, prov, fresh, keys=("mu", "rho", "m", "v", "t")):
    """(record, {key: array}) of a matching checkpoint, or None (none there, or, with fresh,
    one that does not match); ValueError naming the file for an unreadable or differing one."""
    path = _ckpt_path(out, name)
    if not path.exists():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            record = json.loads(str(z["record"]))
            arrays = {k: z[k] for k in keys}
    except (OSError, ValueError, KeyError) as err:
        if fresh:
            return None
        raise ValueError(f"--out: {path} is not a readable checkpoint ({err}); use --fresh "
                         "to start the run again") from err
    if not reusable(path, record, settings, prov, fresh):
        return None
    return record, arrays


def _load_checkpoint(out, name, method, settings, prov, fresh):
    """(state, record) from a matching checkpoint, or None."""
    read = _read_checkpoint(out, name, settings, prov, fresh)
    if read is None:
        return None
    record, arrays = read
    s0 = method.state
    t = int(arrays["t"])
    adam = s0.adam._replace(m=arrays["m"], v=arrays["v"], t=t)
    return s0._replace(mu=arrays["mu"], rho=arrays["rho"], adam=adam, t=t), record


# ----------------------------------------------------------------------------- one run

def _settings(name, args, budget) -> dict:
    s = {"run": name, "seed": args.seed, "prior_precision": LAM, "rho0": RHO0,
         "rho0_sd": RHO0_SD, "kl_weight": 1.0, "draws_per_step": 1, **budget}
    return _runner.as_saved(s)


def _fit(name, args, budget, data, settings, prov, progress, ckpt_dir):
    """(record, mu, sigma) of the run ``name``; it resumes from and writes checkpoints in
    ``ckpt_dir`` (None: neither)."""
    model = _model(budget["hidden"])
    X, y = data.train
    N, M, T = X.shape[0], budget["batch"], budget["steps"]
    mu0 = model.init_theta(job_rng(args.seed, 6))
    method = _make(name, model, mu0, args.seed, N, budget["lr"])
    resumed = None if ckpt_dir is None else \
        _load_checkpoint(ckpt_dir, name, method, settings, prov, args.fresh)
    if resumed is None:
        state = method.state
        record = {"settings": settings, "provenance": prov, "curve": [], "snr": [],
                  "seconds": 0.0, "cpu_seconds": 0.0, "n_params": method.n_params}
    else:
        state, record = resumed
    eval_eps = lambda t: job_rng(args.seed, 4, t).standard_normal((model.D, budget["eval_draws"]))  # noqa: E731
    clocks = _runner.job_clocks(record)  # wall and CPU seconds, carried across resumes
    window = record.pop("window", [])  # the minibatch -ELBOs since the last evaluation
    t_start = state.t
    with progress.run_bar(T, name) as bar:
        bar.update(state.t)
        while True:
            t = state.t
            if t % budget["eval_every"] == 0 or t == T:
                if not any(c["step"] == t for c in record["curve"]):
                    row = {"step": t, **_evaluate(method, state, model, data, eval_eps(t)),
                           "minibatch_neg_elbo": float(np.mean(window)) / N if window else None}
                    record["curve"].append(row)
                window = []
            if t in budget["snr_steps"] and not any(r["step"] == t for r in record["snr"]):
                record["snr"] += _snr(method, state, data, args.seed, t, budget["snr_draws"], M)
            if t == T:
                break
            if ckpt_dir is not None and t % budget["checkpoint_every"] == 0 and t != t_start:
                clocks()
                _save_checkpoint(ckpt_dir, name, state, {**record, "window": window})
                if progress.enabled and not progress.tty:  # a log file gets a line per checkpoint
                    last = record["curve"][-1]
                    progress.echo(f"ktied: {name} step {t}/{T}, -ELBO / N {last['neg_elbo']:.4f} "
                                  f"at step {last['step']}, {record['seconds']:.0f} s",
                                  file=progress.file)
            rows = _batch_rows(args.seed, t, N, M)
            eps = job_rng(args.seed, 3, t).standard_normal((model.D, 1))
            state, info = method.step(state, ktied.Batch(X[rows], y[rows]), eps)
            window.append(-float(info.elbo))
            bar.update(1)
    final_eps = job_rng(args.seed, 7).standard_normal((model.D, budget["final_draws"]))
    record["final"] = _evaluate(method, state, model, data, final_eps)
    record["convergence"] = _convergence(record, T)
    clocks()
    record["citation"] = CITATION
    return record, state.mu, method.sigma(state)


def _convergence(record, steps) -> dict:
    """The run's convergence record: its -ELBO / N curve by ``_report.plateau`` (CONVERGED_RTOL)."""
    return _report.plateau([(c["step"], c["neg_elbo"]) for c in record["curve"]], steps,
                           "-ELBO / N (whole training set)", CONVERGED_RTOL)


def _run_job(name, seed, data_dir, budget, settings, prov, ckpt_dir, fresh,
             progress=_runner.QUIET):
    """One run, as a job of ``_runner.execute``: (record, mu, sigma). It (re)loads the data and
    checks that it is what the main process read (its checksums); it resumes from and writes
    checkpoints in ``ckpt_dir`` (None: neither)."""
    args = argparse.Namespace(seed=seed, data_dir=data_dir, out=ckpt_dir, fresh=fresh)
    data = _load(args, budget)
    _runner.check_worker_data(f"ktied run {name}", data.identity, prov)
    return _fit(name, args, budget, data, settings, prov, progress, ckpt_dir)


# ----------------------------------------------------------------------------- post-hoc

def _posthoc(args, budget, data, mf_record) -> dict:
    """Spectra (ktied.12) and rank-k truncations (ktied.13) of the trained mean-field run."""
    model = _model(budget["hidden"])
    with np.load(Path(args.out) / "posterior_meanfield.npz", allow_pickle=False) as z:
        mu, sigma = z["mu"], z["sigma"]
    spectra = []
    for l, (W_mu, _), (A, _) in zip(range(model.n_layers), model.unflatten(mu),
                                    model.unflatten(sigma)):
        spectra.append({"layer": l + 1, "shape": list(A.shape),
                        "A": ktied.explained_variance(A).tolist(),
                        "M": ktied.explained_variance(W_mu).tolist()})
    final_eps = job_rng(args.seed, 7).standard_normal((model.D, budget["final_draws"]))
    trunc = []
    for k in TRUNCATION_RANKS:
        if k > min(min(a["shape"]) for a in spectra):
            continue
        s_k = ktied.truncate_sigma(sigma, model, k)
        ev = ktied.evaluate(mu, s_k, model, data.train, data.test, final_eps, LAM)
        trunc.append({"k": k, **{n: float(v) for n, v in ev._asdict().items()},
                      "n_params": ktied.n_variational_params(model, k)})
    return {"settings": mf_record["settings"], "provenance": mf_record["provenance"],
            "spectra": spectra, "truncation": trunc, "mean_field": mf_record["final"]}


# ----------------------------------------------------------------------------- tables

def _pm(value, se, scale=1.0, digits=3):
    return f"{scale * value:.{digits}f} +- {scale * se:.{digits}f}"


def _order(names):
    return sorted(names, key=lambda n: (n != "meanfield", int(n[1:]) if n != "meanfield" else 0))


def _label(name):
    return "full (mean field)" if name == "meanfield" else f"k-tied, k = {name[1:]}"


def _data_text(s) -> str:
    return (f"the MNIST 5k subset ({s['n_train']} train / {5000 - s['n_train']} test)"
            if s.get("mnist", "subset") == "subset" else "full MNIST (60000 train / 10000 test)")


def _budget_text(s) -> str:
    """The run's budget in words: steps, M, S and the evaluation draws."""
    return (f"{s['steps']} steps of Adam ({s['lr']:g}, M = {s['batch']}), S = 1 draw per step; "
            f"evaluated with {s['eval_draws']} draws every {s['eval_every']} steps and "
            f"{s['final_draws']} draws at the end")


def _reduced(s) -> list:
    """What of ``s`` is below the paper's setting (full MNIST, trained to its budget) or our
    default budget (the paper's step count is not stated; DEFAULTS is ours)."""
    d = DEFAULTS
    out = []
    if s.get("mnist", "subset") == "subset":
        out.append(f"the 5k subset ({s['n_train']} train images), not full MNIST (60000)")
    if s["steps"] < d["steps"]:
        out.append(f"{s['steps']} of our default {d['steps']} steps")
    if tuple(s["hidden"]) != d["hidden"]:
        out.append(f"hidden {','.join(map(str, s['hidden']))}, not 400,400")
    if s["final_draws"] < d["final_draws"]:
        out.append(f"{s['final_draws']} of {d['final_draws']} final draws")
    return out


def _convergence_of(record) -> dict:
    """A saved run's convergence record (computed from its curve for files written before it)."""
    return record.get("convergence") or _convergence(record, record["settings"]["steps"])


def _tables(saved, posthoc, budget, quick=False) -> str:
    names = _order(saved)
    s = budget
    head = (f"k-tied Normal on {_data_text(s)}, MLP 784-{'-'.join(map(str, s['hidden']))}-10, "
            f"{_budget_text(s)}; +- one standard error over examples")
    caveat = _report.caveat(f"S = 1, {s['steps']} steps, {_data_text(s)}",
                            "the paper's figures, on full MNIST at its budget", _reduced(s),
                            "quick" if quick else "")
    conv = {n: _convergence_of(saved[n]) for n in names}
    rows = []
    for n in names:
        f = saved[n]["final"]
        p = PAPER.get(n)
        rows.append([_report.legend(_label(n), conv[n]), _pm(f["neg_elbo"], f["neg_elbo_se"]),
                     _pm(f["nll"], f["nll_se"]),
                     _pm(f["accuracy"], f["accuracy_se"], 100, 1),
                     f"{saved[n]['n_params'] / 1000:.0f}",
                     "-" if p is None else f"{p[0]:.3f} / {p[2]:.3f} / {p[4]:.1f} / {p[6]}"])
    parts = [head, *([caveat] if caveat else []),
             format_table(["posterior (trained)", "-ELBO / N", "test NLL", "accuracy %",
                           "#params (k)", "paper (full MNIST): -ELBO / NLL / acc % / #params (k)"],
                          rows)]
    parts += [line for n in names for line in [_report.not_converged(conv[n], _label(n))] if line]
    if posthoc is not None:
        trows = [["none (mean field)", _pm(posthoc["mean_field"]["neg_elbo"],
                                           posthoc["mean_field"]["neg_elbo_se"]),
                  _pm(posthoc["mean_field"]["nll"], posthoc["mean_field"]["nll_se"]),
                  _pm(posthoc["mean_field"]["accuracy"], posthoc["mean_field"]["accuracy_se"], 100, 1),
                  " ".join("1.000" for _ in posthoc["spectra"])]]
        for r in posthoc["truncation"]:
            cum = " ".join(f"{sum(sp['A'][:r['k']]):.3f}" for sp in posthoc["spectra"])
            trows.append([f"rank {r['k']}", _pm(r["neg_elbo"], r["neg_elbo_se"]),
                          _pm(r["nll"], r["nll_se"]), _pm(r["accuracy"], r["accuracy_se"], 100, 1),
                          cum])
        parts += ["", "post-hoc rank-k truncation of the trained mean-field A (ktied.13):",
                  format_table(["truncation", "-ELBO / N", "test NLL", "accuracy %",
                                "variance explained by top k, per layer"], trows)]
    steps = sorted({c["step"] for n in names for c in saved[n]["curve"]})
    marks = _curve_marks(steps)
    crow = [[_label(n)] + [next((f"{c['neg_elbo']:.3f}" for c in saved[n]["curve"]
                                 if c["step"] == t), "-") for t in marks] for n in names]
    parts += ["", f"-ELBO / N on the whole training set ({s['eval_draws']} draws) during training:",
              format_table(["posterior"] + [f"step {t}" for t in marks], crow)]
    snr_steps = sorted({r["step"] for n in names for r in saved[n]["snr"]})
    if snr_steps:
        srow = []
        for n in names:
            cells = []
            for t in snr_steps:
                r = next((r for r in saved[n]["snr"] if r["step"] == t and r["layer"] == 2
                          and r["kind"] == "scale"), None)
                cells.append("-" if r is None or r["median"] is None
                             else f"{r['median']:.3g} ({r['mean']:.3g})")
            srow.append([_label(n)] + cells)
        parts += ["", "gradient SNR E[g]^2 / Var[g] (ktied.15) of the scale parameters of the "
                      "second dense layer: median (mean) over its parameters with a random gradient",
                  format_table(["posterior"] + [f"step {t}" for t in snr_steps], srow)]
    parts += [f"paper ({CITATION}): full MNIST, its budget", ""]
    return "\n".join(parts)


def _curve_marks(steps: list) -> list:
    """The evaluation steps the training table shows: the paper's 1000, 5000 and 9000 where the
    run has them (else the first three after 0), and always the final step."""
    marks = [t for t in (1000, 5000, 9000) if t in steps] or steps[1:4]
    if steps and steps[-1] not in marks:
        marks.append(steps[-1])
    return marks


def _write_csvs(out, saved, posthoc) -> list:
    out = Path(out)
    paths = []

    def table(name, header, rows):
        paths.append(write_csv(out / name, rows, header))

    names = _order(saved)
    keys = ("neg_elbo", "neg_elbo_se", "nll", "nll_se", "accuracy", "accuracy_se", "kl")
    table("trained.csv", ["run", *keys, "n_params", "seconds", "cpu_seconds"],
          [[n, *(saved[n]["final"][k] for k in keys), saved[n]["n_params"], saved[n]["seconds"],
            saved[n].get("cpu_seconds")]  # an empty cell: a run from before it was recorded
           for n in names])
    table("curves.csv", ["run", "step", "neg_elbo", "nll", "accuracy", "minibatch_neg_elbo"],
          [[n, c["step"], c["neg_elbo"], c["nll"], c["accuracy"], c["minibatch_neg_elbo"]]
           for n in names for c in saved[n]["curve"]])
    table("snr.csv", ["run", "step", "layer", "kind", "n", "n_finite", "mean", "median"],
          [[n, r["step"], r["layer"], r["kind"], r["n"], r["n_finite"], r["mean"], r["median"]]
           for n in names for r in saved[n]["snr"]])
    if posthoc is not None:
        table("truncation.csv", ["k", *keys, "n_params"],
              [[r["k"], *(r[k] for k in keys), r["n_params"]] for r in posthoc["truncation"]])
    return paths


def _figures(out, saved, posthoc) -> list:
    plt = pyplot()
    if plt is None:
        return []
    out = Path(out)
    paths = []
    names = _order(saved)
    s0 = saved[names[0]]["settings"]
    budget = f"{_data_text(s0)}; {_budget_text(s0)}"  # every figure's title states it
    if posthoc is not None:
        sp = posthoc["spectra"]
        fig, axes = plt.subplots(2, len(sp), figsize=(4 * len(sp), 6), squeeze=False)
        for j, layer in enumerate(sp):
            for i, key in enumerate(("A", "M")):
                frac = np.asarray(layer[key])[:10]
                ax = axes[i, j]
                ax.bar(np.arange(1, frac.size + 1), frac, color="tab:blue" if key == "A" else "tab:gray")
                ax.set_yscale("log")
                ax.set_title(f"layer {layer['layer']} {tuple(layer['shape'])}: {key} "
                             f"(top 3: {sum(layer[key][:3]):.3f})", fontsize=9)
                ax.set_xlabel("singular value i")
        axes[0, 0].set_ylabel("explained variance, A (std)")
        axes[1, 0].set_ylabel("explained variance, M (mean)")
        fig.suptitle("trained mean-field posterior: gamma_i^2 / sum_j gamma_j^2 (ktied.12)"
                     + ("" if _convergence_of(saved["meanfield"])["converged"] is not False
                        else " - NOT CONVERGED") + f"\n{budget}", fontsize=9)
        fig.tight_layout()
        paths.append(out / "spectra.png")
        save_figure(fig, paths[-1], dpi=110)
        with np.load(out / "posterior_meanfield.npz", allow_pickle=False) as z:
            sigma = z["sigma"]
        model = _model(saved["meanfield"]["settings"]["hidden"])
        blocks = [A for A, _ in model.unflatten(sigma)]
        fig, axes = plt.subplots(1, len(blocks), figsize=(4.5 * len(blocks), 4), squeeze=False)
        for ax, (l, A) in zip(axes[0], enumerate(blocks)):
            im = ax.imshow(A, aspect="auto", cmap="viridis", interpolation="nearest")
            ax.set_title(f"A of layer {l + 1} {A.shape}", fontsize=9)
            ax.set_xlabel("output unit j")
            ax.set_ylabel("input unit i")
            fig.colorbar(im, ax=ax)
        fig.suptitle("trained mean-field standard deviations A_ij"
                     + ("" if _convergence_of(saved["meanfield"])["converged"] is not False
                        else " - NOT CONVERGED") + f"\n{budget}", fontsize=9)
        fig.tight_layout()
        paths.append(out / "heatmap_A.png")
        save_figure(fig, paths[-1], dpi=110)
    fig, ax = plt.subplots(figsize=(6, 4))
    for n in names:
        c = saved[n]["curve"]
        ax.plot([r["step"] for r in c], [r["neg_elbo"] for r in c],
                label=_report.legend(_label(n), _convergence_of(saved[n])))
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("-ELBO / N (whole training set)")
    ax.set_title(f"{budget}\n(not converged: -ELBO / N moved > {CONVERGED_RTOL:.0%} over the last "
                 f"{_report.WINDOW:.0%} of the steps)", fontsize=7)
    ax.legend()
    paths.append(out / "elbo_vs_step.png")
    save_figure(fig, paths[-1], dpi=110, bbox_inches="tight")
    fig, ax = plt.subplots(figsize=(6, 4))
    for n in names:
        rows = [r for r in saved[n]["snr"] if r["layer"] == 2 and r["kind"] == "scale"
                and r["median"] is not None]
        if rows:
            ax.plot([r["step"] for r in rows], [r["median"] for r in rows], "o-",
                    label=_report.legend(_label(n), _convergence_of(saved[n])))
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("median SNR, scale parameters of layer 2")
    ax.set_title(f"{budget}\nSNR from {s0['snr_draws']} gradients (S = 1, M = {s0['batch']}) each",
                 fontsize=7)
    if ax.get_legend_handles_labels()[0]:  # no SNR measured (every snr step after the budget)
        ax.legend()
    paths.append(out / "snr.png")
    save_figure(fig, paths[-1], dpi=110, bbox_inches="tight")
    return paths


# ----------------------------------------------------------------------------- the command

SCHEMA = {"settings": dict, "provenance": dict, "curve": list, "snr": list, "final": dict,
          "seconds": float, "cpu_seconds": MayLack(float), "n_params": int}


def _path(out, name) -> Path:
    return Path(out) / f"run_{name}.json"


def run(args: argparse.Namespace) -> int:
    """The ``refbayes reproduce ktied`` handler.

    Saved runs under --out are read and checked first; each missing run is trained (resuming
    from its checkpoint), saved, and the tables printed; the post-hoc analysis needs the
    mean-field run. Progress (one line over the runs, a bar over each run's steps) on stderr.
    With --jobs > 1 or --dask-scheduler the missing runs are trained first as independent jobs
    (each saved as it comes back), then the same post-hoc analysis, tables and figures.
    """
    budget = _budget(args)
    out = Path(args.out)
    data = _load(args, budget)
    prov = provenance(data.identity)
    saved, todo = _runner.plan((_runner.Unit(name, _path(out, name), SCHEMA,
                                             _settings(name, args, budget), prov)
                                for name in args.runs), args.fresh)
    resuming = {}  # run -> the step its checkpoint holds (Dask workers read no checkpoints)
    for unit in todo:  # every checkpoint checked too, before any run is trained
        read = _read_checkpoint(out, unit.key, unit.settings, prov, args.fresh, keys=("t",))
        if read is not None and args.dask_scheduler is None:
            resuming[unit.key] = int(read[1]["t"])

    def checkpointed():  # after an interrupt: the checkpoints the next run goes on from
        found = []
        for unit in todo:
            with contextlib.suppress(OSError, ValueError, KeyError), \
                    np.load(_ckpt_path(out, unit.key), allow_pickle=False) as z:
                found.append(f"{unit.key} checkpointed at step {int(z['t'])}")
        return found

    write, progress = _runner.start(out, bool(todo), len(args.runs), len(saved), "ktied",
                                    enabled=not args.no_progress, resuming=resuming,
                                    partial=checkpointed)
    # this process and local workers share this file system: checkpoints there; Dask: none
    ckpt_dir = out.resolve() if args.dask_scheduler is None else None
    jobs = [_runner.Job(f"ktied/{u.key}", _run_job, (u.key, args.seed,
                                                      _runner.worker_path(args.data_dir), budget,
                                                      u.settings, prov, ckpt_dir, args.fresh,
                                                      _runner.PROGRESS)) for u in todo]

    def done(key, result):  # each run's posterior and result written, its checkpoint removed
        name = key.split("/", 1)[1]
        record, mu, sigma = result
        atomic_write_npz(out / f"posterior_{name}.npz", mu=mu, sigma=sigma)
        saved[name] = record
        write_json(_path(out, name), record)
        _ckpt_path(out, name).unlink(missing_ok=True)
        progress.advance(name)

    with progress:
        _runner.execute([_runner.Section(jobs)], done, progress, **_runner.job_options(args))
        posthoc = None
        if "meanfield" in saved and (out / "posterior_meanfield.npz").exists():
            posthoc = _posthoc(args, budget, data, saved["meanfield"])
            if write:
                write_json(out / "posthoc.json", posthoc)
        progress.echo(_tables(saved, posthoc, budget, args.quick))
        lines = [f"results: {out}/"]
        if write:
            lines += [f"table: {p}" for p in _write_csvs(out, saved, posthoc)]
            lines += [f"figure: {p}" for p in _figures(out, saved, posthoc)]
        progress.echo("\n".join(lines))
    return 0
