"""Osawa et al. (2019), "Practical Deep Learning with Bayesian Principles", Table 1: CIFAR-10,
LeNet-5, no data augmentation (issue 36 part 1).

Protocol (derivations/cifar10_lenet.md gives every setting with its source in the official code,
team-approx-bayes/dl-with-bayes, and what is refbayes' own choice):

- data: ``load_cifar10`` (pixels / 255), 50,000 train / 10,000 test (the paper's "validation"),
  the official normalization (x - m_c) / s_c (:data:`MEAN`, :data:`STD`; Noisy K-FAC's config
  does not normalize), no augmentation; minibatches: a fresh permutation per epoch, the last
  batch shorter (``driver.epoch_batches``);
- model: ``lenet5()`` (D = 62006), torch's default initialization (``init_theta(...,
  scheme="pytorch")``), one start per seed shared by every row;
- rows (:data:`ROWS`): Table 1's ``adam`` (210 epochs), ``vogn`` (210, S = 6, KL warm-up over the
  first 30 epochs, an OGN first step), ``bbb`` (800, S = 1) and ``mc-dropout`` (210, p = 0.1), and
  our ``kfac`` (50 epochs, ExponentialLR 0.9) and ``noisy-kfac`` (15 epochs, M = 64, S = 4,
  ExponentialLR 0.9, torchsso's step: :data:`NOISY_KFAC_TORCHSSO`), with the settings of the note
  (:func:`make_method` builds each); issue 36's second list: ``ktied`` (k = 2 on every layer,
  trained as bbb, 800 epochs), ``swag`` (ONE job, one momentum-SGD run under the SWAG paper's CIFAR
  schedule (swag.12) scaled to 210 epochs, a snapshot per epoch after swa_start = 210 x 161 / 300;
  three table rows from its moments: ``swa`` at theta_SWA, ``swag-diag`` scale 1, ``swag`` scale 1/2
  with the low-rank term) and ``mc-dropout-official`` (the mc-dropout row with the masks where the
  official LeNet5MCDropout puts them, :data:`DROPOUT_SITES`, compared with the same Table 1 row) and
  the post-hoc ``laplace-kron`` / ``laplace-ll`` (no training: the GGN Laplace approximation, K-FAC
  on all layers / full on the last layer, at the ``adam`` job's final theta of the seed, prior
  precision lam = N x 1e-2, in float64; the GLM predictive by Monte Carlo; the evidence-tuned prior
  precision recorded under "found");
- measured: every --eval-every epochs and after the last, the test accuracy, NLL, ECE (top label,
  equal-width bins: 10, 15 and 20) and the misclassification AUROC (correct = positive; scores -H
  and max_k P) of the predictive (the BMA of --test-draws draws, or the point for adam and
  kfac); in those epochs also the running train accuracy / NLL of the predictions made during
  training at each step's draws, before its update (as the official code reports it); after the
  last, the same predictive over the training set (the table's "train acc % pass": which of the
  two Table 1's train column is, the paper does not say; derivations/cifar10_lenet.md, "The
  train column");
- at the end: the table beside Table 1 (mean +- standard error over seeds), a reliability
  diagram per row (15 bins, pooled over seeds), the validation curves, the wall seconds of each
  job and its process's CPU seconds (``time.process_time``; not recorded by runs before
  2026-11-28).

Explicit randomness: each (seed, row) job draws from ``job_rng(seed, row id, purpose, ...)`` only:
the permutation of epoch e from (.., 1, e), the training noise (eps, dropout masks) from one
stream (.., 0) whose state the checkpoints carry, the evaluation draws after epoch e from
(.., 2, e) (swag's further rows: (.., 2, E - 1, k), k = 1 swa, 2 swag-diag; the Laplace rows:
(.., 2, 0)), ktied's start jitter from (.., 3), the pass over the training set from (.., 4, k)
(k = 0 the job's row, 1 swa, 2 swag-diag). So a job's numbers depend on its coordinates
only (serial = ``--jobs`` = Dask), and a resumed job repeats an uninterrupted one bit for bit.

Output (--out, default results/cifar10-lenet): ``<row>/seed_<s>.json`` per job as it finishes
(settings, provenance, per-epoch curve, final scores, reliability bins, seconds and
cpu_seconds, the final
state's sha256; a post-hoc row: the sha256 of the adam state it read) and
``<row>/seed_<s>.curve.csv``; while a job runs ``checkpoints/<row>_seed_<s>.ckpt.npz`` (every
--checkpoint-steps steps and every epoch, written atomically: the state, the epoch and step, the
noise generator's state, the record so far) and the curve CSV; at the end
``predictions/<row>_seed_<s>.npz`` (the final test probabilities), ``states/<row>_seed_<s>.npz``
(a trained job's final state, ``_pack``'s arrays and its settings, written atomically: the
Laplace rows read ``states/adam_seed_<s>.npz``; they run after the trained jobs in a serial run
and refuse, naming the adam job, when that state is missing or is not the final state of the
saved adam result), ``summary.csv`` (or ``summary.partial.csv``), ``summary.json``,
``table.md``, ``reliability.png`` and ``curves.png`` (the validation curves of the trained
rows, every seed and their mean, Table 1's figures marked). Checkpoints and
predictions and states are for resuming and re-analysis, not for committing (``.gitignore``
there). ``--saved-only`` trains nothing and writes the summary files of the jobs already saved,
each row over the seeds it has (a table over rows with different numbers of seeds), naming the
jobs not saved; with ``--score-train`` it first adds the pass over the training set to the saved
jobs trained before the runner made it, from their final states (:func:`score_train`).

Cost: :data:`SECONDS_PER_EPOCH` (float32: the finished full runs' CPU time per epoch,
:func:`measured_seconds_per_epoch`; float64: tools/cifar10_epoch_timing.py, the note's table)
and :data:`POSTHOC_SECONDS` / :data:`POSTHOC_SECONDS_PER_DRAW` for the Laplace rows (their
finished runs' CPU time, :func:`measured_posthoc_seconds`) give the plan line's estimate; a
float32 seed of the four Table 1 rows is about 11.7 CPU-hours, of every row about 21.0.
``--backend cupy`` keeps the data, the states and the steps on the GPU (the draws still come
from the host generators and are copied over; the scores are computed on the host from the
predictive probabilities): the numbers differ from NumPy's in the last bits, so it is a setting
of the result (recorded as ``backend`` only when it is not numpy).
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import sys
import time
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from scipy.special import softmax

from refbayes import conventions, metrics
from refbayes._files import (
    atomic_write_npz,
    atomic_write_text,
    format_table,
    write_json,
)
from refbayes.backend import get_xp, is_cupy_array, to_numpy
from refbayes.datasets import data_identity, load_cifar10
from refbayes.experiments import _runner
from refbayes.experiments._runner import (
    job_rng,
    positive_int,
    provenance,
    reusable,
    write_csv,
)
from refbayes.experiments.calibration_methods import laplace_state, linearized_bma
from refbayes.methods import (
    Batch,
    adam,
    bbb,
    driver,
    ktied,
    laplace,
    mc_dropout,
    noisy_kfac,
    swag,
    vogn,
)
from refbayes.models.conv import lenet5
from refbayes.models.dropout import output_sites

__all__ = ["DESCRIPTION", "MEAN", "PAPER", "ROWS", "SECONDS_PER_EPOCH", "STD", "add_arguments",
           "evidence_tuned", "make_method", "measured_posthoc_seconds",
           "measured_seconds_per_epoch", "normalize", "official_vogn_config", "run", "score_train"]

DESCRIPTION = ("Osawa et al. (2019) Table 1: Adam, VOGN, BBB, MC dropout (and K-FAC, Noisy "
               "K-FAC) on CIFAR-10 with LeNet-5, no augmentation")
CITATION = ("Osawa et al. (2019), Practical Deep Learning with Bayesian Principles, NeurIPS "
            "2019, arXiv:1906.02506, Table 1")

N_TRAIN, N_TEST, N_CLASSES = 50000, 10000, 10
MEAN = np.array([0.4914, 0.4822, 0.4465])   # distributed/classification/main.py l.193-195
STD = np.array([0.2023, 0.1994, 0.2010])    # (the official constants, not CIFAR-10's stds)
WEIGHT_DECAY = 1e-2     # lenet_adam.json l.16: torch weight_decay on the mean loss
ADAM_EPS = 1e-8         # torch's default, on the mean loss
WARMUP_EPOCHS = 30      # lenet_vogn_bs128_4gpu.json l.27-28: tau 0.1 -> 1 over 30 epochs


class Row(NamedTuple):
    """One row: its id (seeds the job's generators: append, never reorder), the paper's epochs,
    minibatch M, training draws S, whether the predictive draws (else the point), whether the
    inputs are normalized, and the LR decay per epoch (ExponentialLR gamma; 1: constant)."""
    rid: int
    epochs: int
    M: int
    S: int
    bayes: bool
    normalized: bool = True
    decay: float = 1.0


ROWS = {"adam": Row(0, 210, 128, 0, False),
        "vogn": Row(1, 210, 128, 6, True),
        "bbb": Row(2, 800, 128, 1, True),
        "mc-dropout": Row(3, 210, 128, 1, True),
        "kfac": Row(4, 50, 128, 0, False, decay=0.9),
        "noisy-kfac": Row(5, 15, 64, 4, True, normalized=False, decay=0.9),
        "ktied": Row(6, 800, 128, 1, True),
        "laplace-kron": Row(7, 0, 128, 0, True),
        "laplace-ll": Row(8, 0, 128, 0, True),
        "swag": Row(9, 210, 128, 0, True),
        "mc-dropout-official": Row(10, 210, 128, 1, True)}
# post-hoc rows: no training, a Laplace approximation at the adam job's final theta of the seed
# (structure, subset of laplace.LaplaceConfig); they read states/adam_seed_<s>.npz
POSTHOC = {"laplace-kron": ("kron", "all"), "laplace-ll": ("full", "last_layer")}
# lenet_noisykfac.json ran on torchsso's VIOptimizer, whose step differs from gd-zhang's in three
# ways (derivations/noisy_kfac.md, "Conventions of torchsso"): its weight_decay 0.1 added after
# the solve, the sampler damped like the solve, and a refresh before the solve. With the first
# two but not the third the row diverges in its first epoch, as it does with none of the three
# (derivations/cifar10_lenet.md, tools/noisy_kfac_epoch1_ablation.py).
NOISY_KFAC_TORCHSSO = {"weight_decay": 0.1, "sampler_damping": "full", "refresh_order": "before"}
KTIED_K, KTIED_JITTER = 2, 0.1  # k on every layer; the start's jitter of the calibration row
# the swag job: one SGD run, three table rows (its own, and these from the same moments)
SWAG_EXTRA = ("swa", "swag-diag")
# wjmaddox/swa_gaussian experiments/train/README.md l.79 (VGG16, CIFAR): 300 epochs,
# lr_init 0.05, swa_lr 0.01, swa_start 161; run_swag.py: max_num_models 20 (K)
SWAG_LR_INIT, SWAG_LR, SWAG_K, SWAG_MOMENTUM = 0.05, 0.01, 20, 0.9
SWAG_START_FRACTION = 161 / 300  # swa_start = epochs x 161 / 300 (112.7 of 210)
TABLE1 = ("adam", "bbb", "mc-dropout", "vogn")
# MC dropout rows whose masks sit elsewhere than on the parameter layers' inputs: the official
# LeNet5MCDropout's dropout(layer(x)) after conv1, conv2, fc1, fc2 and fc3 (mc_dropout.10):
# output_sites(lenet5()) = [1, 4, 8, 10, 12] (a list: it is recorded in the settings)
DROPOUT_SITES = {"mc-dropout-official": list(output_sites(lenet5()))}

# Table 1 as the issue transcribes it: train acc %, val acc %, val NLL, epochs, ECE, AUROC.
PAPER = {"adam": (71.98, 67.67, 0.937, 210, 0.021, 0.794),
         "bbb": (66.84, 64.61, 1.018, 800, 0.045, 0.784),
         "mc-dropout": (68.41, 67.65, 0.99, 210, 0.087, 0.797),
         "mc-dropout-official": (68.41, 67.65, 0.99, 210, 0.087, 0.797),  # the same Table 1 row
         "vogn": (70.79, 67.32, 0.938, 210, 0.046, 0.8)}

# CPU s / epoch of training, one BLAS thread, the plan line's estimate. float32: the finished
# full runs' own, measured_seconds_per_epoch of each saved job with CPU time (mean over seeds 1-2;
# ktied seeds 0-2), so the plan of a default job is the mean CPU time those runs took
# (derivations/cifar10_lenet.md, "Results: the cost of the finished runs", then "Results: BBB
# and k-tied seed 2, every row at three seeds"). float64 (no full runs): measured by
# tools/cifar10_epoch_timing.py under load 5-6 ("Seconds per epoch"; the float32 runs took
# RUNS_OVER_TOOL of that tool's float32 figures); ktied: bbb's, swag: the SGD line's (its step
# is swag.sgd_step), mc-dropout-official: mc-dropout's, vogn: 0.65 x the measured 555.3 (the step
# after its gradient and squared-gradient sums came from one backward pass, (conv.23)).
SECONDS_PER_EPOCH = {"float32": {"adam": 18.3, "vogn": 82.2, "bbb": 15.8, "mc-dropout": 18.4,
                                 "kfac": 78.1, "noisy-kfac": 301.7, "ktied": 15.3, "swag": 15.3,
                                 "mc-dropout-official": 19.3},
                     "float64": {"adam": 55.5, "vogn": 361.0, "bbb": 56.8, "mc-dropout": 53.9,
                                 "kfac": 508.2, "noisy-kfac": 1107.7, "ktied": 56.8,
                                 "swag": 52.8, "mc-dropout-official": 53.9}}
# the least and most, over the committed float32 jobs with CPU time, of measured_seconds_per_epoch
# over tools/cifar10_epoch_timing.py's float32 s / epoch for the row ("Results: the cost of the
# finished runs", its "timing tool" column): ktied seed 2 and mc-dropout-official seed 1
RUNS_OVER_TOOL = (0.43, 0.68)
EVAL_SECONDS_PER_DRAW = {"float32": 3.1, "float64": 6.5}  # one pass over the 10,000 test images
# the post-hoc Laplace rows (float64 whatever --dtype), per row the mean over the finished runs
# with CPU time (seeds 1-2) of measured_posthoc_seconds: the fit's CPU s on the 50,000 rows, and
# the rest of the job (the evidence tuning and the two GLM predictives) per predictive draw over
# the 10,000 test images (derivations/cifar10_lenet.md, "Results: the Laplace rows' plan from
# their runs"; the timing tool's 470 / 100 s and 18 s per draw were about 2x those runs)
POSTHOC_SECONDS = {"laplace-kron": 198.1, "laplace-ll": 59.3}
POSTHOC_SECONDS_PER_DRAW = {"laplace-kron": 8.9, "laplace-ll": 9.1}

DEFAULTS = {"eval_every": 10, "test_draws": 10, "checkpoint_steps": 100, "n_train": N_TRAIN,
            "n_test": N_TEST}
QUICK = {**DEFAULTS, "epochs": 1, "eval_every": 1, "test_draws": 2, "checkpoint_steps": 1,
         "n_train": 256, "n_test": 200}
ECE_BINS = (10, 15, 20)
RELIABILITY_BINS = 15
FIGURE_COLUMNS = 5  # reliability.png: panels per row
EVAL_ROWS = 500  # test rows per forward pass (bounds the im2col buffers)
TRAIN_PASS = 4  # job_rng stream of the predictive pass over the training set (_train_passes)


# ----------------------------------------------------------------------------- the rows

def normalize(X):
    """Return (x - mean_c) / std_c per channel, the official ``transforms.Normalize``.

    Parameters
    ----------
    X : array of shape (n, 3, 32, 32)
        Pixels / 255, NCHW.

    Returns
    -------
    array of shape (n, 3, 32, 32)
        The normalized images, in X's dtype.
    """
    m = MEAN.astype(X.dtype)[None, :, None, None]
    s = STD.astype(X.dtype)[None, :, None, None]
    return (X - m) / s


def official_vogn_config(N: int = N_TRAIN, tau: float = 1.0):
    """Return the VOGNConfig of lenet_vogn_bs128_4gpu.json at KL weight ``tau``.

    Parameters
    ----------
    N : int, default 50000
        Training-set size.
    tau : float, default 1.0
        The KL weight (the warm-up's value at the step; 1 after it).

    Returns
    -------
    VOGNConfig
        lr 1e-4, raw momentum 0.9, ema_decay 0.999, damping 1e-3, prior variance 1e-2.
    """
    return conventions.from_pytorch_sso_vogn(
        dataset_size=N, lr=1e-4, momentum=0.9, momentum_type="raw",
        curv_kwargs={"ema_decay": 0.999, "damping": 1e-3}, num_mc_samples=6, kl_weighting=1.0,
        prior_variance=1e-2)._replace(tau=tau)


class Method(NamedTuple):
    """A row's pieces: ``state`` the initial state; ``step(state, batch, rng, t, epoch) ->
    (state, info)`` one training step drawing its noise from ``rng``; ``train_probs(state,
    info, X)`` the class probabilities of that step's predictions (at its draws, before the
    update); ``predict(state, X, rng, S)`` the test predictive; ``M`` the minibatch size."""
    name: str
    state: Any
    step: Callable
    train_probs: Callable
    predict: Callable
    M: int
    extra: dict | None = None  # further table rows of the same job: {row: predict}


def _bma(net, thetas, X):
    """(1/S) sum_s softmax(f(X; theta_s)), thetas (D, S), in EVAL_ROWS chunks; float64 (n, C) on
    the host (the logits of each chunk are copied there, explicitly, for CuPy arrays)."""
    xp = get_xp("cupy") if is_cupy_array(X) else np
    P = np.zeros((X.shape[0], N_CLASSES))
    for s in range(thetas.shape[1]):
        th = xp.ascontiguousarray(thetas[:, s])
        for i in range(0, X.shape[0], EVAL_ROWS):
            F = to_numpy(net.forward(th, X[i:i + EVAL_ROWS])).astype(np.float64)
            P[i:i + EVAL_ROWS] += softmax(F, axis=1)
    return P / thetas.shape[1]


def make_method(name: str, net, theta0, N: int, backend: str = "numpy",
                init_rng=None, epochs: int | None = None,
                noisy_kfac_options: dict | None = None) -> Method:
    """Build one row's initial state, step and predictive with the note's settings.

    Parameters
    ----------
    name : str
        A key of :data:`ROWS`.
    net : CNN
        ``lenet5()``.
    theta0 : array of shape (D,)
        The start (the mean of the Gaussian rows), float32 or float64.
    N : int
        Training-set size.
    backend : {"numpy", "cupy"}, default "numpy"
        Where the state and the steps' draws live: the draws come from the host generator and
        are copied to the device (``cupy.asarray``) for "cupy"; theta0 is copied there too.
    init_rng : numpy.random.Generator, optional
        The start's own draws (required for "ktied": xi (P,) of the jitter, ktied.init); the
        runner passes ``job_rng(seed, row id, 3)``.
    epochs : int, optional
        The job's epochs (default the row's): "swag" scales its schedule to them.
    noisy_kfac_options : dict, optional
        "noisy-kfac" only: weight_decay, sampler_damping and refresh_order of the step in
        place of :data:`NOISY_KFAC_TORCHSSO`'s (the runner never passes it; for
        tools/noisy_kfac_epoch1_ablation.py).

    Returns
    -------
    Method
        The row's pieces.

    Raises
    ------
    ValueError
        If name is not a trained row (the post-hoc Laplace rows have no step), backend is not
        numpy / cupy (or CuPy is missing), init_rng is missing for "ktied", or
        noisy_kfac_options is given for another row or holds other keys.
    """
    if name in POSTHOC:
        raise ValueError(f"method: {name!r} is post-hoc (a Laplace fit at the adam row's theta), "
                         "not a trained row")
    if name not in ROWS:
        raise ValueError(f"method: expected one of {sorted(ROWS)}, got {name!r}")
    row = ROWS[name]
    if noisy_kfac_options is not None and (name != "noisy-kfac" or
                                           set(noisy_kfac_options) - set(NOISY_KFAC_TORCHSSO)):
        raise ValueError(f"noisy_kfac_options: expected keys among {sorted(NOISY_KFAC_TORCHSSO)} "
                         f"for 'noisy-kfac', got {sorted(noisy_kfac_options)} for {name!r}")
    xp = get_xp(backend)
    dt = theta0.dtype
    D = net.D
    theta0 = xp.asarray(theta0)

    def normal(rng, shape):  # host draws, copied to the backend
        return xp.asarray(rng.standard_normal(shape).astype(dt))

    def masks_of(rng, n, sites=None):
        return [xp.asarray(z) for z in driver.draw_masks(rng, net, n, p, dtype=dt, sites=sites)]
    lam = N * WEIGHT_DECAY  # lenet_adam.json's weight decay in summed units

    def point_probs(state, info, X):
        return _bma(net, state[0][:, None], X)

    if name == "adam":  # lenet_adam.json: lr 1e-3, betas (0.9, 0.999), weight_decay 1e-2
        cfg = adam.AdamConfig(alpha=1e-3, beta1=0.9, beta2=0.999, eps_adam=N * ADAM_EPS)

        def step(state, batch, rng, t, epoch):
            return adam.step(state, batch, cfg, net, N, lam)
        return Method(name, adam.init(theta0.copy()), step, point_probs,
                      lambda s, X, rng, S: _bma(net, s.theta[:, None], X), row.M)

    if name == "vogn":  # lenet_vogn_bs128_4gpu.json; one step on 128 rows with S = 6
        warm = math.ceil(WARMUP_EPOCHS * N / row.M)

        def step(state, batch, rng, t, epoch):
            cfg = official_vogn_config(N, 0.1 + 0.9 * min(t / warm, 1.0))
            if t == 0:  # no init_precision: an OGN step at the mean, the curvature replaced
                return vogn.step(state, batch, None, cfg._replace(beta2=1.0), net)
            return vogn.step(state, batch, normal(rng, (D, row.S)), cfg, net)

        def predict(state, X, rng, S):
            return _bma(net, vogn.sample(state, normal(rng, (D, S)), official_vogn_config(N)), X)
        return Method(name, vogn.init(theta0.copy(), xp.zeros(D, dtype=dt)), step,
                      lambda s, info, X: _bma(net, info.theta, X), predict, row.M)

    if name == "bbb":  # refbayes' choice (note): Adam 1e-3 on (mu, rho), VOGN's prior, S = 1
        cfg = bbb.BBBConfig(N, 100.0, alpha=1e-3, eps_adam=N * ADAM_EPS)

        def step(state, batch, rng, t, epoch):
            return bbb.step(state, batch, normal(rng, (D, row.S)), cfg, net)

        def predict(state, X, rng, S):
            return _bma(net, bbb.sample(state, normal(rng, (D, S))), X)
        return Method(name, bbb.init(theta0.copy(), sigma0=1e-3), step,
                      lambda s, info, X: _bma(net, info.theta, X), predict, row.M)

    if name == "ktied":  # refbayes' choice: bbb's settings, k = 2 on every layer (conv: ktied.16)
        if init_rng is None:
            raise ValueError("init_rng: expected a numpy Generator for 'ktied' (the start's "
                             "jitter)")
        cfg = ktied.KTiedConfig(N, 100.0, alpha=1e-3, eps_adam=N * ADAM_EPS)
        xi = xp.asarray(init_rng.standard_normal(ktied.layout(net, KTIED_K).P).astype(dt))
        state0 = ktied.init(theta0.copy(), net, KTIED_K, 1e-3, xi, KTIED_JITTER)

        def step(state, batch, rng, t, epoch):
            return ktied.step(state, batch, normal(rng, (D, row.S)), cfg, net)

        def predict(state, X, rng, S):
            return _bma(net, ktied.sample(state, normal(rng, (D, S)), net), X)
        return Method(name, state0, step, lambda s, info, X: _bma(net, info.theta, X), predict,
                      row.M)

    if name == "swag":  # SGD + the SWA schedule (swag.12) scaled to the epochs; lam = adam's
        E = row.epochs if epochs is None else epochs
        a0, a_swa, swa_start = SWAG_LR_INIT / N, SWAG_LR / N, E * SWAG_START_FRACTION
        cfg = swag.SGDConfig(N=N, lam=lam, alpha=a0, momentum=SWAG_MOMENTUM)
        scfg = swag.SWAGConfig(K=SWAG_K)
        K_steps = math.ceil(N / row.M)

        def step(state, batch, rng, t, epoch):
            a = swag.swa_learning_rate(epoch, alpha_init=a0, alpha_swa=a_swa, swa_start=swa_start)
            sgd, moments = state
            sgd, info = swag.sgd_step(sgd, batch, None, cfg._replace(alpha=a), net)
            if (t + 1) % K_steps == 0 and epoch + 1 > swa_start:  # an epoch's end (collect_model)
                moments, _ = swag.collect(moments, sgd.theta, scfg)
            return (sgd, moments), info

        def swag_predict(which):
            def predict(state, X, rng, S):
                sgd, moments = state
                if moments.n == 0:  # before swa_start: the SGD iterate
                    return _bma(net, sgd.theta[:, None], X)
                if which == "swa":  # theta_SWA, nothing drawn
                    return _bma(net, moments.theta_bar[:, None], X)
                low = which == "swag" and swag.rank(moments) >= 2  # (swag.5) needs K' >= 2
                z1 = normal(rng, (D, S))
                z2 = normal(rng, (swag.rank(moments), S)) if low else None
                c = swag.SWAGConfig(K=SWAG_K, scale=0.5 if which == "swag" else 1.0)
                return _bma(net, swag.sample(moments, z1, z2, c), X)  # (swag.7)
            return predict
        return Method(name, (swag.sgd_init(theta0.copy()), swag.init(theta0, scfg)), step,
                      lambda s, info, X: _bma(net, s[0].theta[:, None], X), swag_predict("swag"),
                      row.M, {k: swag_predict(k) for k in SWAG_EXTRA})

    p = 0.1  # LeNet5MCDropout's dropout_ratio
    if name in ("mc-dropout", "mc-dropout-official"):  # p = 0.1, the Adam row's optimizer, lam
        sites = DROPOUT_SITES.get(name)  # None: every parameter layer's input (mc_dropout.1)
        cfg = mc_dropout.MCDropoutConfig(N, p=p, lengthscale=math.sqrt(lam * (1 - p)),
                                         alpha=1e-3, eps_adam=N * ADAM_EPS,
                                         sites=None if sites is None else tuple(sites))

        def step(state, batch, rng, t, epoch):
            return mc_dropout.step(state, batch, masks_of(rng, batch.X.shape[0], cfg.sites), cfg,
                                   net)

        def predict(state, X, rng, S):
            P = np.zeros((X.shape[0], N_CLASSES))
            for _ in range(S):  # per pass, per chunk: masks drawn in that order
                for i in range(0, X.shape[0], EVAL_ROWS):
                    Xi = X[i:i + EVAL_ROWS]
                    F = mc_dropout.predict_samples(state, Xi, [masks_of(rng, Xi.shape[0],
                                                                        cfg.sites)], cfg, net)[0]
                    P[i:i + EVAL_ROWS] += softmax(to_numpy(F).astype(np.float64), axis=1)
            return P / S
        return Method(name, mc_dropout.init(theta0.copy()), step,
                      lambda s, info, X: softmax(to_numpy(info.f).astype(np.float64), axis=1),
                      predict, row.M)

    if name == "kfac":  # lenet_kfac.json: lr 1e-3, momentum 0.9, l2 1e-3, damping 1e-3
        cfg0 = noisy_kfac.NoisyKFACConfig(N, eta=1.0 / (N * 1e-3), kl_weight=1.0, alpha=1e-3,
                                          beta=0.999, momentum=0.9, gamma_ex=1e-3, T_stats=1,
                                          T_inv=1, curvature="ggn")

        def step(state, batch, rng, t, epoch):
            cfg = cfg0._replace(alpha=cfg0.alpha * row.decay ** epoch)
            return noisy_kfac.step(state, batch, None, cfg, net)
        return Method(name, noisy_kfac.init(theta0.copy(), net), step, point_probs,
                      lambda s, X, rng, S: _bma(net, s.mu[:, None], X), row.M)

    # noisy-kfac: lenet_noisykfac.json: batch 64, 4 draws, lr 4e-3, momentum 0.9, kl 0.2,
    # prior variance 1, damping 1e-4, ema_decay 0.333, and torchsso's step (NOISY_KFAC_TORCHSSO)
    cfg0 = noisy_kfac.NoisyKFACConfig(N, eta=1.0, kl_weight=0.2, alpha=4e-3, beta=0.333,
                                      momentum=0.9, gamma_ex=1e-4, T_stats=1, T_inv=1,
                                      curvature="ggn",
                                      **{**NOISY_KFAC_TORCHSSO, **(noisy_kfac_options or {})})

    def step(state, batch, rng, t, epoch):
        cfg = cfg0._replace(alpha=cfg0.alpha * row.decay ** epoch)
        return noisy_kfac.step(state, batch, normal(rng, (D, row.S)), cfg, net)

    def predict(state, X, rng, S):
        return _bma(net, noisy_kfac.sample(state, normal(rng, (D, S)), cfg0, net), X)
    return Method(name, noisy_kfac.init(theta0.copy(), net), step,
                  lambda s, info, X: _bma(net, info.w, X), predict, row.M)


# ----------------------------------------------------------------------------- arguments

def _methods(text: str) -> tuple:
    if text == "all":
        return tuple(ROWS)
    if text == "table1":
        return TABLE1
    out = [p.strip().replace("_", "-") for p in text.split(",")]
    bad = [p for p in out if p not in ROWS]
    if bad or not out:
        hint = ("; swa and swag-diag are rows of the swag job" if set(bad) & set(SWAG_EXTRA)
                else "")
        raise argparse.ArgumentTypeError(
            f"expected rows of {', '.join(ROWS)} (comma-separated), table1 or all; got "
            f"{text!r}{hint}")
    if len(set(out)) != len(out):
        raise argparse.ArgumentTypeError(f"expected each row once, got {text!r}")
    return tuple(out)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = DEFAULTS
    parser.add_argument("--methods", type=_methods, default=TABLE1,
                        help=f"rows, comma-separated, of {', '.join(ROWS)}; table1 (default: "
                             f"{','.join(TABLE1)}) or all")
    parser.add_argument("--seeds", type=positive_int, default=1,
                        help="seeds 0..K-1 (default 1): the start, minibatches and draws")
    parser.add_argument("--epochs", type=positive_int, default=None,
                        help="epochs of every row (default: each row's paper budget, "
                             + ", ".join(f"{k} {r.epochs}" for k, r in ROWS.items()) + ")")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                        help="float dtype of data and parameters (default float32, the note's "
                             "plan)")
    parser.add_argument("--eval-every", type=positive_int, default=None,
                        help="validate every K epochs, and after the last (default "
                             f"{d['eval_every']})")
    parser.add_argument("--test-draws", type=positive_int, default=None,
                        help=f"posterior draws of the predictive (default {d['test_draws']}, "
                             "the official val_num_mc_samples)")
    parser.add_argument("--checkpoint-steps", type=positive_int, default=None,
                        help=f"steps between checkpoints, besides one per epoch (default "
                             f"{d['checkpoint_steps']})")
    parser.add_argument("--backend", choices=("numpy", "cupy"), default="numpy",
                        help="numpy (default) or cupy: the data, states and steps on the GPU; "
                             "draws from the same host generators, copied to the device")
    parser.add_argument("--saved-only", action="store_true",
                        help="train nothing: the table, CSV, JSON and figure of the jobs of "
                             "--methods and seeds 0..K-1 already saved under --out, each row over "
                             "the seeds it has, the jobs not saved named")
    parser.add_argument("--score-train", action="store_true",
                        help="with --saved-only: score the saved jobs that lack it on the "
                             "training set (the row's predictive after training, the table's "
                             "'train acc %% pass') from their final states under --out/states, "
                             "and add it to their results")
    parser.add_argument("--quick", action="store_true",
                        help=f"smoke test: {QUICK['n_train']} train / {QUICK['n_test']} test "
                             f"images, 1 epoch, {QUICK['test_draws']} draws (seconds)")
    _runner.add_output_arguments(parser, "cifar10-lenet", "job")
    _runner.add_arguments(parser)
    _runner.add_data_dir(parser)
    parser.add_argument("--no-progress", action="store_true", help="no progress output")


def _budget(args) -> dict:
    b = _runner.overridden(QUICK if args.quick else DEFAULTS, args,
                           ("epochs", "eval_every", "test_draws", "checkpoint_steps"))
    if b.get("epochs") is not None and b["epochs"] < 1:
        raise ValueError(f"--epochs: expected an integer >= 1, got {b['epochs']}")
    b["dtype"] = args.dtype
    b["backend"] = args.backend
    if args.backend == "cupy":
        get_xp("cupy")  # ValueError naming the gpu extra when CuPy is missing
    return b


def _epochs_of(name, budget) -> int:
    if name in POSTHOC:  # nothing trained: --epochs is the adam job's
        return 0
    return budget.get("epochs") or ROWS[name].epochs


# the adam job's settings a post-hoc row's state must have been trained with
MAP_KEYS = ("method", "seed", "epochs", "M", "dtype", "n_train", "normalized", "init")


def _settings(name, seed, budget) -> dict:
    row = ROWS[name]
    s = {"method": name, "seed": seed, "epochs": _epochs_of(name, budget),
         "paper_epochs": row.epochs, "M": row.M, "S_train": row.S,
         "test_draws": budget["test_draws"] if row.bayes else 1, "normalized": row.normalized,
         "lr_decay": row.decay, "eval_every": budget["eval_every"], "dtype": budget["dtype"],
         "n_train": budget["n_train"], "n_test": budget["n_test"], "init": "pytorch",
         "checkpoint_steps": budget["checkpoint_steps"]}
    if budget["backend"] != "numpy":  # recorded only then: NumPy results keep their settings
        s["backend"] = budget["backend"]
    if name in DROPOUT_SITES:
        s["dropout_sites"] = DROPOUT_SITES[name]
    if name == "noisy-kfac":
        s.update(NOISY_KFAC_TORCHSSO)
    if name == "swag":
        s.update(lr_init=SWAG_LR_INIT, swa_lr=SWAG_LR, K=SWAG_K, momentum=SWAG_MOMENTUM,
                 swa_start=s["epochs"] * SWAG_START_FRACTION,
                 prior_precision=budget["n_train"] * WEIGHT_DECAY, rows=["swa", "swag-diag",
                                                                         "swag"])
    if name in POSTHOC:
        structure, subset = POSTHOC[name]
        adam_s = _settings("adam", seed, budget)
        s.pop("backend", None)  # the fit and predictive run on the host
        s.update(S_train=0, checkpoint_steps=None,
                 map={k: adam_s[k] for k in MAP_KEYS if k in adam_s},
                 prior_precision=budget["n_train"] * WEIGHT_DECAY, structure=structure,
                 subset=subset, curvature="ggn", predictive="glm, Monte Carlo over theta",
                 laplace_dtype="float64", prior_tuning="evidence, scalar, L-BFGS-B (found only)")
        if adam_s.get("backend"):
            s["map"]["backend"] = adam_s["backend"]
    return _runner.as_saved(s)


# ----------------------------------------------------------------------------- data

class _Data(NamedTuple):
    X: np.ndarray       # (n_train, 3072)
    y: np.ndarray
    X_test: np.ndarray  # (n_test, 3072)
    y_test: np.ndarray


@lru_cache(maxsize=2)
def _load(data_dir, dtype: str, normalized: bool, n_train: int, n_test: int) -> _Data:
    """The first n_train / n_test images (normalized or not) as (n, 3072) rows of dtype; cached
    for the jobs of one process."""
    tt = load_cifar10(data_dir, dtype=np.float32)
    prep = normalize if normalized else (lambda X: X)
    X = prep(tt.X_train[:n_train]).reshape(n_train, -1).astype(dtype)
    Xt = prep(tt.X_test[:n_test]).reshape(n_test, -1).astype(dtype)
    return _Data(np.ascontiguousarray(X), tt.y_train[:n_train].copy(),
                 np.ascontiguousarray(Xt), tt.y_test[:n_test].copy())


def _identity(data_dir) -> dict:
    return data_identity("cifar10", data_dir)


# ----------------------------------------------------------------------------- checkpoints

def _pack(obj, prefix, arrays) -> None:
    """Flatten a state (NamedTuples, tuples, arrays, ints, None) into ``arrays``."""
    if obj is None:
        return
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        if isinstance(obj, noisy_kfac.NoisyKFACInverses):  # a cache the step recomputes
            return
        for f in obj._fields:
            _pack(getattr(obj, f), f"{prefix}{f}.", arrays)
    elif isinstance(obj, (tuple, list)):
        for i, x in enumerate(obj):
            _pack(x, f"{prefix}{i}.", arrays)
    else:
        arrays[prefix.rstrip(".")] = to_numpy(obj)  # a device array copied to the host


def _unpack(template, prefix, arrays):
    """The state of ``template``'s structure with the arrays of ``_pack`` (on the template's
    backend)."""
    if template is None:
        return None
    if isinstance(template, tuple) and hasattr(template, "_fields"):
        if isinstance(template, noisy_kfac.NoisyKFACInverses):
            return None
        return type(template)(*(_unpack(getattr(template, f), f"{prefix}{f}.", arrays)
                                for f in template._fields))
    if isinstance(template, (tuple, list)):
        return type(template)(_unpack(x, f"{prefix}{i}.", arrays) for i, x in enumerate(template))
    a = arrays[prefix.rstrip(".")]
    if isinstance(template, (bool, np.bool_)):
        return bool(a)
    if isinstance(template, (int, np.integer)):
        return int(a)
    if isinstance(template, float):
        return float(a)
    return get_xp("cupy").asarray(a) if is_cupy_array(template) else a


def _ckpt_path(out, name, seed) -> Path:
    return Path(out) / "checkpoints" / f"{name}_seed_{seed}.ckpt.npz"


def _save_checkpoint(path, state, meta) -> None:
    """The state's arrays and ``meta`` (JSON: record, epoch, step, generator state), atomically."""
    arrays = {}
    _pack(state, "state.", arrays)
    atomic_write_npz(path, meta=np.array(json.dumps(meta)), **arrays)


def _read_npz(path) -> tuple:
    """(meta, arrays) of a checkpoint or final state: the JSON "meta" entry and the other
    arrays by name."""
    with np.load(path, allow_pickle=False) as z:
        return (json.loads(str(z["meta"])),
                {k: z[k] for k in z.files if k != "meta"})


def _read_checkpoint(path, settings, prov, fresh):
    """(meta, arrays) of a matching checkpoint, or None (none; or, with fresh, not matching)."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        meta, arrays = _read_npz(path)
    except (OSError, ValueError, KeyError) as err:
        if fresh:
            return None
        raise ValueError(f"--out: {path} is not a readable checkpoint ({err}); use --fresh to "
                         "start the job again") from err
    if not reusable(path, meta["record"], settings, prov, fresh):
        return None
    return meta, arrays


# ----------------------------------------------------------------------------- one job

def _scores(P, y) -> dict:
    """Accuracy, NLL, ECE at ECE_BINS, misclassification AUROC (-H and max-probability)."""
    out = {"acc": metrics.accuracy(P, y), "nll": metrics.nll(P, y)}
    for b in ECE_BINS:
        out[f"ece{b}"] = metrics.ece(P, y, b)
    correct = (np.argmax(P, axis=1) == y).astype(int)
    out["auroc_entropy"] = metrics.misclassification_auroc(P, y)
    out["auroc_maxprob"] = metrics.auroc(P.max(axis=1), correct)
    return {k: float(v) for k, v in out.items()}


CURVE_COLUMNS = ("epoch", "step", "seconds", "train_acc", "train_nll", "val_acc", "val_nll",
                 *(f"val_ece{b}" for b in ECE_BINS), "val_auroc_entropy", "val_auroc_maxprob")


def _write_curve(path, curve) -> None:
    write_csv(path, [{k: r.get(k) for k in CURVE_COLUMNS} for r in curve], list(CURVE_COLUMNS))


def _fit(name, seed, budget, settings, prov, data, progress, ckpt_dir, fresh):
    """(record, final test probabilities) of one (row, seed) job; it resumes from and writes
    checkpoints (and its curve CSV) under ``ckpt_dir`` (None: neither)."""
    row = ROWS[name]
    net = lenet5()
    N = data.X.shape[0]
    theta0 = net.init_theta(job_rng(seed, 0), dtype=np.dtype(budget["dtype"]), scheme="pytorch")
    backend = settings.get("backend", "numpy")
    xp = get_xp(backend)
    m = make_method(name, net, theta0, N, backend, init_rng=job_rng(seed, row.rid, 3),
                    epochs=settings["epochs"])
    X, y, X_test = xp.asarray(data.X), xp.asarray(data.y), xp.asarray(data.X_test)
    E = settings["epochs"]
    K = math.ceil(N / m.M)
    rng = job_rng(seed, row.rid, 0)
    ckpt = None if ckpt_dir is None else _ckpt_path(ckpt_dir, name, seed)
    curve_csv = None if ckpt_dir is None else Path(ckpt_dir) / name / f"seed_{seed}.curve.csv"
    read = None if ckpt is None else _read_checkpoint(ckpt, settings, prov, fresh)
    if read is None:
        state, epoch0, j0, run = m.state, 0, 0, [0, 0.0, 0]
        record = {"settings": settings, "provenance": prov, "curve": [], "seconds": 0.0,
                  "cpu_seconds": 0.0}
    else:
        meta, arrays = read
        state = _unpack(m.state, "state.", arrays)
        record, epoch0, j0, run = meta["record"], meta["epoch"], meta["step"], meta["running"]
        rng.bit_generator.state = meta["rng"]
    clocks = _runner.job_clocks(record)  # wall and CPU seconds, carried across resumes

    def save(epoch, j):
        clocks()
        _save_checkpoint(ckpt, state, {"record": record, "epoch": epoch, "step": j,
                                       "running": run, "rng": rng.bit_generator.state})

    with progress.run_bar(E * K, f"{name} seed {seed}") as bar:
        bar.update(epoch0 * K + j0)
        for epoch in range(epoch0, E):
            batches = driver.epoch_batches(job_rng(seed, row.rid, 1, epoch), N, m.M)
            measured = (epoch + 1) % settings["eval_every"] == 0 or epoch + 1 == E
            for j in range(j0 if epoch == epoch0 else 0, K):
                rows = batches[j]
                dev_rows = xp.asarray(rows)
                batch = Batch(X[dev_rows], y[dev_rows])
                before = state
                state, info = m.step(state, batch, rng, epoch * K + j, epoch)
                if measured:  # the running train scores, at the step's draws before its update
                    P = m.train_probs(before, info, batch.X)
                    yb = data.y[rows]
                    run[0] += int(np.sum(np.argmax(P, axis=1) == yb))
                    run[1] += float(-np.sum(np.log(P[np.arange(len(rows)), yb])))
                    run[2] += len(rows)
                bar.update(1)
                if ckpt is not None and (j + 1) % settings["checkpoint_steps"] == 0 and j + 1 < K:
                    save(epoch, j + 1)
            entry = {"epoch": epoch + 1, "step": (epoch + 1) * K}
            if measured:
                entry.update(train_acc=run[0] / run[2], train_nll=run[1] / run[2])
                if epoch + 1 < E:  # the last epoch's scores come from the final evaluation
                    P = m.predict(state, X_test, job_rng(seed, row.rid, 2, epoch),
                                  settings["test_draws"])
                    entry.update({f"val_{k}": v for k, v in _scores(P, data.y_test).items()})
                run = [0, 0.0, 0]
            clocks()
            entry["seconds"] = record["seconds"]
            record["curve"].append(entry)
            if ckpt is not None:
                save(epoch + 1, 0)
                _write_curve(curve_csv, record["curve"])
            if progress.enabled and not progress.tty and "val_acc" in entry:
                progress.echo(f"cifar10-lenet: {name} seed {seed} epoch {epoch + 1}/{E}: val acc "
                              f"{entry['val_acc']:.4f}, NLL {entry['val_nll']:.4f}, "
                              f"{entry['seconds']:.0f} s", file=progress.file)
    # the final evaluation (repeated identically after a resume from the last checkpoint)
    P = m.predict(state, X_test, job_rng(seed, row.rid, 2, E - 1), settings["test_draws"])
    final = _scores(P, data.y_test)
    last = record["curve"][-1]
    last.update({f"val_{k}": v for k, v in final.items()})
    final.update(train_acc=last.get("train_acc"), train_nll=last.get("train_nll"))
    passes = _train_passes(m, state, X, data.y, seed, row.rid, settings["test_draws"])
    final.update(passes[name])
    record["final"] = final
    record["reliability"] = _reliability(P, data.y_test)
    extras = {}
    for k, (sub, predict) in enumerate((m.extra or {}).items()):  # the same state's other rows
        extras[sub] = predict(state, X_test, job_rng(seed, row.rid, 2, E - 1, k + 1),
                              settings["test_draws"])
        sub_final = _scores(extras[sub], data.y_test)
        sub_final.update(train_acc=final["train_acc"], train_nll=final["train_nll"])
        sub_final.update(passes[sub])
        record.setdefault("rows", {})[sub] = {"final": sub_final,
                                              "reliability": _reliability(extras[sub],
                                                                          data.y_test)}
    if name == "swag":  # how many snapshots the moments hold; the low-rank term needs K' >= 2
        moments = state[1]
        record["found"] = {"snapshots": int(moments.n), "rank": int(swag.rank(moments)),
                           "low_rank": bool(swag.rank(moments) >= 2)}
    clocks()
    record["citation"] = CITATION
    arrays = {}
    _pack(state, "state.", arrays)  # the final state, saved as states/<row>_seed_<s>.npz
    record["final_state_sha256"] = _state_digest(arrays)
    return record, P, arrays, extras


def _train_passes(m, state, X, y, seed, rid, S) -> dict:
    """{row: its pass} for the job's row (m.name) and each further row of m.extra: the row's
    predictive (the validation columns' ``predict``, S draws from job_rng(seed, rid, TRAIN_PASS,
    k); k = 0 the job's row, k the k-th further row) over the training images after training,
    its accuracy and NLL as "train_pass_acc" and "train_pass_nll"."""
    out = {}
    for k, (row, predict) in enumerate({m.name: m.predict, **(m.extra or {})}.items()):
        P = predict(state, X, job_rng(seed, rid, TRAIN_PASS, k), S)
        out[row] = {"train_pass_acc": float(metrics.accuracy(P, y)),
                    "train_pass_nll": float(metrics.nll(P, y))}
    return out


def score_train(out, name: str, seed: int, record: dict, data_dir) -> dict | None:
    """Add the pass over the training set (:func:`_train_passes`) to a saved job trained before
    the runner scored it, from its final state ``<out>/states/<row>_seed_<s>.npz``.

    The job's rows (swag's: swa, swag-diag and swag) get "train_pass_acc" / "train_pass_nll" in
    their "final", exactly as a job trained now records them (the same stream, draws and
    predictive; on NumPy whatever backend trained it), and the record gets
    "train_pass_provenance" (the code that scored them).

    Parameters
    ----------
    out : path
        The runner's --out.
    name, seed : str, int
        The job (a trained row of :data:`ROWS`).
    record : dict
        Its saved result (``<row>/seed_<s>.json``), updated in place.
    data_dir : path or None
        As --data-dir.

    Returns
    -------
    dict or None
        The job's record, updated; None when its final state is not saved (nothing scored).

    Raises
    ------
    ValueError
        The state is not the final state of the saved result (its sha256 differs from the
        result's "final_state_sha256", or the result records none).
    """
    path = _state_path(out, name, seed)
    if not path.exists():
        return None
    arrays = _read_npz(path)[1]
    digest, want = _state_digest(arrays), record.get("final_state_sha256")
    if digest != want:
        raise ValueError(f"--score-train: the state {path} (sha256 {digest[:12]}...) is not the "
                         f"final state of the saved result {_path(out, name, seed)} "
                         f"({'records none' if want is None else want[:12] + '...'}); "
                         f"move it away or rerun the job with --fresh")
    s = record["settings"]
    data = _load(data_dir, s["dtype"], ROWS[name].normalized, s["n_train"], s["n_test"])
    net = lenet5()
    rid = ROWS[name].rid
    theta0 = net.init_theta(job_rng(seed, 0), dtype=np.dtype(s["dtype"]), scheme="pytorch")
    m = make_method(name, net, theta0, data.X.shape[0], init_rng=job_rng(seed, rid, 3),
                    epochs=s["epochs"])  # the template of the state's arrays
    state = _unpack(m.state, "state.", arrays)
    passes = _train_passes(m, state, data.X, data.y, seed, rid, s["test_draws"])
    record["final"].update(passes.pop(name))
    for sub, scored in passes.items():
        record["rows"][sub]["final"].update(scored)
    record["train_pass_provenance"] = provenance(_identity(data_dir))
    return record


def _reliability(P, y) -> dict:
    rel = metrics.reliability_curve(P, y, RELIABILITY_BINS)
    return {"count": rel["count"].tolist(),
            "correct": np.nan_to_num(rel["accuracy"] * rel["count"]).tolist(),
            "confidence_sum": np.nan_to_num(rel["confidence"] * rel["count"]).tolist()}


def _state_path(out, name, seed) -> Path:
    return Path(out) / "states" / f"{name}_seed_{seed}.npz"


def _state_digest(arrays) -> str:
    """sha256 of a final state's arrays as saved (name, dtype, shape and bytes of each, in name
    order): links a post-hoc row to the adam job whose state it read."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(to_numpy(arrays[name]))
        h.update(f"{name}:{a.dtype.str}:{a.shape};".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _read_map(states_dir, name, seed, settings):
    """(theta, the state's sha256): the adam job's final theta (host, as saved) for post-hoc row
    ``name``; ValueError naming the adam job when its state is missing, was trained with other
    settings, or is not the final state of the adam result saved beside it."""
    path = _state_path(states_dir, "adam", seed)
    run_first = (f"run the adam job first (`--methods adam` with the same --out, --seeds, "
                 f"--dtype and --epochs; or `--methods adam,{name}` without --jobs)")
    if not path.exists():
        raise ValueError(f"{name} seed {seed}: no final state of the adam job of seed {seed} "
                         f"({path}): {run_first}")
    meta, arrays = _read_npz(path)
    theta = arrays["state.theta"]
    got = {k: meta["settings"].get(k) for k in settings["map"]}
    if got != settings["map"]:
        raise ValueError(f"{name} seed {seed}: the adam state {path} was trained with {got}, "
                         f"expected {settings['map']}: {run_first}")
    digest = _state_digest(arrays)
    result = _path(states_dir, "adam", seed)
    if result.exists():  # a state left by an older adam run than the saved result is refused
        want = json.loads(result.read_text()).get("final_state_sha256")
        if want is not None and want != digest:
            raise ValueError(f"{name} seed {seed}: the adam state {path} (sha256 "
                             f"{digest[:12]}...) is not the final state of the saved adam result "
                             f"{result} ({want[:12]}...): {run_first}")
    return theta, digest


def _chunked(fn, X):
    """fn(X chunk) over EVAL_ROWS-row chunks of X, stacked (bounds the im2col buffers)."""
    return np.concatenate([fn(X[i:i + EVAL_ROWS]) for i in range(0, X.shape[0], EVAL_ROWS)])


def evidence_tuned(net, state, X, y, cfg):
    """Tune one scalar prior precision of a classification Laplace state by its evidence.

    ``laplace.optimize_prior_precision`` (L-BFGS-B from cfg.prior_precision, mu and the
    curvature held fixed; (laplace.6), (laplace.17)) on ONE training row: for a categorical
    likelihood the rows enter the evidence only through log p(D | mu), a constant in the prior
    precision, so the optimum is the same, and the log evidence is corrected by the summed loss
    of all rows taken in EVAL_ROWS chunks (laplace.26) (the optimizer's own pass over 50,000
    rows would need 23 GB of im2col buffers per evaluation in float64).

    Parameters
    ----------
    net : CNN
        The network of the state.
    state : laplace.LaplaceState
        The Laplace state at mu (``calibration_methods.laplace_state``).
    X : array of shape (N, 3072)
        The training rows of the fit, in mu's dtype.
    y : array of shape (N,)
        Their labels.
    cfg : laplace.LaplaceConfig
        The fit's config (its prior_precision is the start).

    Returns
    -------
    state : laplace.LaplaceState
        The state at the tuned prior precision.
    found : dict
        prior_precision, log_marglik (of all N rows), converged, evaluations.

    Raises
    ------
    ValueError
        As ``laplace.optimize_prior_precision``.
    """
    tuned, info = laplace.optimize_prior_precision(net, state, X[:1], y[:1], cfg, method="lbfgs",
                                                   prior_structure="scalar",
                                                   init_prior_prec=cfg.prior_precision)
    loss = sum(float(net.loss(state.mu, X[i:i + EVAL_ROWS], y[i:i + EVAL_ROWS]))
               for i in range(0, X.shape[0], EVAL_ROWS))
    # (laplace.26): log Z = log Z_B + l_B(mu) - sum_i l_i(mu), B the one row
    log_marglik = float(info.log_marglik) + float(net.loss(state.mu, X[:1], y[:1])) - loss
    return tuned, {"prior_precision": float(info.prior_precision), "log_marglik": log_marglik,
                   "converged": bool(info.converged),
                   "evaluations": int(info.trace_log_marglik.shape[0])}


def _fit_laplace(name, seed, budget, settings, prov, data, states_dir):
    """(record, final test probabilities, None) of a post-hoc Laplace job: the GGN Laplace
    approximation (``calibration_methods.laplace_state``; structure and subset of
    :data:`POSTHOC`) at the adam job's final theta on the n_train training rows, prior precision
    lam = n_train x WEIGHT_DECAY (the MAP objective's own), in float64; the GLM predictive by
    Monte Carlo (``linearized_bma``, (laplace.7)) over test_draws draws theta_s =
    laplace.sample(state, eps), eps from job_rng(seed, row id, 2, 0). The evidence-tuned scalar
    prior precision (``laplace.optimize_prior_precision``, L-BFGS-B from lam) and the scores of
    the GLM predictive at it (the same eps) go to record["found"] (:func:`evidence_tuned`); the
    row's scores use lam."""
    t0, c0 = time.perf_counter(), time.process_time()
    row = ROWS[name]
    net = lenet5()
    theta32, digest = _read_map(states_dir, name, seed, settings)
    theta = np.asarray(theta32, dtype=np.float64)
    X, y = data.X.astype(np.float64), data.y
    X_test = data.X_test.astype(np.float64)
    lam = float(settings["prior_precision"])
    cfg = laplace.LaplaceConfig(prior_precision=lam, structure=settings["structure"],
                                curvature="ggn", subset=settings["subset"])
    state = laplace_state(net, theta, X, y, cfg)
    t_fit, c_fit = time.perf_counter() - t0, time.process_time() - c0
    tuned, found = evidence_tuned(net, state, X, y, cfg)
    eps = job_rng(seed, row.rid, 2, 0).standard_normal((net.D - state.n_fixed,
                                                        settings["test_draws"]))
    P = _chunked(lambda Xc: linearized_bma(net, theta, laplace.sample(state, eps), Xc), X_test)
    P_ev = _chunked(lambda Xc: linearized_bma(net, theta, laplace.sample(tuned, eps), Xc),
                    X_test)
    final = _scores(P, data.y_test)
    final.update(train_acc=None, train_nll=None)
    record = {"settings": settings, "provenance": prov, "curve": [], "final": final,
              "reliability": _reliability(P, data.y_test),
              "found": {**found, "scores": _scores(P_ev, data.y_test)},
              "fit_seconds": t_fit, "fit_cpu_seconds": c_fit,
              "seconds": time.perf_counter() - t0, "cpu_seconds": time.process_time() - c0,
              "citation": CITATION, "map_state_sha256": digest}
    return record, P, None, {}


def _run_job(name, seed, budget, settings, prov, data_dir, ckpt_dir, fresh,
             progress=_runner.QUIET, states_dir=None):
    """One (row, seed) job of ``_runner.execute``: (record, probabilities, final state arrays
    or None, {further row: its probabilities}). It (re)loads the data, checks it is what the
    main process read, and resumes from / writes checkpoints under ``ckpt_dir`` (None:
    neither); a post-hoc row reads the adam state under ``states_dir``."""
    _runner.check_worker_data(f"cifar10-lenet job {name} seed {seed}", _identity(data_dir), prov)
    data = _load(data_dir, budget["dtype"], ROWS[name].normalized, budget["n_train"],
                 budget["n_test"])
    if name in POSTHOC:
        with progress.run_bar(1, f"{name} seed {seed}") as bar:
            result = _fit_laplace(name, seed, budget, settings, prov, data, states_dir)
            bar.update(1)
        return result
    return _fit(name, seed, budget, settings, prov, data, progress, ckpt_dir, fresh)


# ----------------------------------------------------------------------------- summaries

SCHEMA = {"settings": dict, "provenance": dict, "curve": list, "final": dict, "reliability": dict,
          "seconds": float, "cpu_seconds": _runner.MayLack(float)}
SUMMARY_KEYS = ("train_acc", "train_pass_acc", "train_pass_nll", "acc", "nll",
                *(f"ece{b}" for b in ECE_BINS), "auroc_entropy", "auroc_maxprob")


def _path(out, name, seed) -> Path:
    return Path(out) / name / f"seed_{seed}.json"


def _sub_record(record, sub) -> dict:
    """The record of row ``sub`` of a job with several rows (swag: swa, swag-diag): the job's
    settings (method = sub), provenance and seconds, the row's final scores and reliability;
    the curve is the job's own row's (swag), so it is left out."""
    return {**{k: v for k, v in record.items() if k != "rows"}, **record["rows"][sub],
            "settings": {**record["settings"], "method": sub, "job": record["settings"]["method"]},
            "curve": []}


def _expanded(saved) -> dict:
    """saved with the further rows of each several-row job added under their own names."""
    out = dict(saved)
    for (name, seed), r in saved.items():
        for sub in r.get("rows", {}):
            out[sub, seed] = _sub_record(r, sub)
    return out


def _shown(methods) -> tuple:
    """The table rows of the jobs ``methods``: swag's job gives swa, swag-diag and swag."""
    return tuple(m for name in methods
                 for m in ((*SWAG_EXTRA, name) if name == "swag" else (name,)))


def _pm(v, se, scale=1.0, digits=3) -> str:
    if v is None:
        return "-"
    return f"{scale * v:.{digits}f}" + ("" if se is None else f" +- {scale * se:.{digits}f}")


def _summary(saved, methods) -> list:
    rows = []
    for name in methods:
        recs = [r for (n, _), r in sorted(saved.items()) if n == name]
        if not recs:
            continue
        s = recs[0]["settings"]
        timed = [r for r in recs if "cpu_seconds" in r]
        row = {"method": name, "seeds": len(recs), "epochs": s["epochs"],
               "paper_epochs": s["paper_epochs"], "test_draws": s["test_draws"],
               "dtype": s["dtype"], "n_train": s["n_train"], "n_test": s["n_test"],
               "wall_hours": sum(r["seconds"] for r in recs) / 3600,
               # over the seeds whose job recorded its CPU seconds (runs before 2026-11-28
               # did not): None when none did, cpu_seeds says how many did
               "cpu_hours": (sum(r["cpu_seconds"] for r in timed) / 3600 if timed else None),
               "cpu_seeds": len(timed),
               # the seeds whose job scored the training set after training (not every saved
               # job did: _train_passes, --score-train)
               "train_pass_seeds": sum(r["final"].get("train_pass_acc") is not None
                                       for r in recs)}
        for k in SUMMARY_KEYS:
            row[k], row[f"{k}_se"] = _runner.mean_se([r["final"].get(k) for r in recs])
        rows.append(row)
    return rows


def _cpu_cell(r) -> str:
    """The CPU hours of a row, naming the seeds they cover when some seeds' jobs lack them."""
    if r["cpu_hours"] is None:
        return "-"
    cell = f"{r['cpu_hours']:.2f}"
    if r["cpu_seeds"] == r["seeds"]:
        return cell
    return f"{cell} ({r['cpu_seeds']} of {r['seeds']} seeds)"


def _pass_cell(r) -> str:
    """The train-pass accuracy of a row, naming the seeds it covers when some seeds lack it."""
    cell = _pm(r["train_pass_acc"], r["train_pass_acc_se"], 100, 2)
    if r["train_pass_seeds"] in (0, r["seeds"]):
        return cell
    return f"{cell} ({r['train_pass_seeds']} of {r['seeds']} seeds)"


def _not_saved(missing) -> str:
    """The jobs a --saved-only table lacks, per row: "vogn seeds 1, 2; bbb seed 2"."""
    seeds = {}
    for name, seed in missing:
        seeds.setdefault(name, []).append(str(seed))
    return "; ".join(f"{name} seed{'s' * (len(s) > 1)} {', '.join(s)}"
                     for name, s in seeds.items())


def _table(rows, complete, missing=()) -> str:
    """The table beside Table 1; ``missing`` (row, seed) names the jobs a --saved-only table
    leaves out (its rows are over the seeds they have, the "seeds" column)."""
    head = ["method", "seeds", "epochs", "train acc % running", "train acc % pass", "val acc %",
            "val NLL", "ECE (10 bins)", "ECE (15 / 20)", "AUROC -H", "AUROC max p", "wall h",
            "CPU h",
            "paper: train / val % | NLL | epochs | ECE | AUROC"]
    body, reduced = [], []
    for r in rows:
        p = PAPER.get(r["method"])
        body.append([r["method"], r["seeds"], r["epochs"],
                     _pm(r["train_acc"], r["train_acc_se"], 100, 2), _pass_cell(r),
                     _pm(r["acc"], r["acc_se"], 100, 2), _pm(r["nll"], r["nll_se"]),
                     _pm(r["ece10"], r["ece10_se"]),
                     f"{_pm(r['ece15'], None)} / {_pm(r['ece20'], None)}",
                     _pm(r["auroc_entropy"], r["auroc_entropy_se"]),
                     _pm(r["auroc_maxprob"], r["auroc_maxprob_se"]), f"{r['wall_hours']:.2f}",
                     _cpu_cell(r),
                     "-" if p is None else f"{p[0]} / {p[1]} | {p[2]} | {p[3]} | {p[4]} | {p[5]}"])
        if r["method"] in POSTHOC:
            if r["n_train"] < N_TRAIN or r["n_test"] < N_TEST:
                reduced.append(f"{r['method']}: at adam's theta, {r['n_train']} / "
                               f"{r['n_test']} images")
        elif r["epochs"] < r["paper_epochs"] or r["n_train"] < N_TRAIN or r["n_test"] < N_TEST:
            reduced.append(f"{r['method']}: {r['epochs']} of {r['paper_epochs']} epochs, "
                           f"{r['n_train']} / {r['n_test']} images")
    lines = [(f"CIFAR-10, LeNet-5, no augmentation, {rows[0]['dtype'] if rows else ''}: mean "
              "+- standard error over seeds; train acc: running (each step's predictions at its "
              "draws, the last epoch) and pass (the predictive over the training set after "
              "training); ECE top-label, equal-width bins; AUROC of misclassification detection "
              "(correct = positive); wall h and CPU h: totals over the row's seeds ("
              f"{', '.join((*SWAG_EXTRA, 'swag'))} each show their one shared job's)")]
    if reduced:
        lines.append("CAVEAT - a reduced budget, not comparable to Table 1: " + "; ".join(reduced))
    if missing:
        lines.append("SAVED JOBS ONLY - each row over the seeds saved; not saved: "
                     + _not_saved(missing))
    elif not complete:
        lines.append("PARTIAL - some jobs are not done yet")
    lines += [format_table(head, body), f"paper: {CITATION} (as transcribed in issue 36)", ""]
    return "\n".join(lines)


def _figure(out, saved, methods):
    plt = _runner.pyplot()
    names = [n for n in methods if any(k[0] == n for k in saved)]
    if plt is None or not names:
        return None
    fig, axes = _runner.panel_grid(plt, len(names), FIGURE_COLUMNS)
    edges = np.linspace(0, 1, RELIABILITY_BINS + 1)
    mids = (edges[:-1] + edges[1:]) / 2
    for ax, name in zip(axes.flat, names):
        recs = [r for (n, _), r in saved.items() if n == name]
        cnt = np.sum([r["reliability"]["count"] for r in recs], axis=0)
        cor = np.sum([r["reliability"]["correct"] for r in recs], axis=0)
        full = cnt > 0
        ax.bar(mids[full], cor[full] / cnt[full], width=1 / RELIABILITY_BINS, edgecolor="k",
               alpha=0.7)
        ax.plot([0, 1], [0, 1], "k--", lw=1)
        ece = np.mean([r["final"]["ece15"] for r in recs])
        budget = ("post-hoc at adam's theta" if name in POSTHOC
                  else f"{recs[0]['settings']['epochs']} epochs")
        ax.set_title(f"{name} ({len(recs)} seed(s))\nECE15 {ece:.3f}, {budget}", fontsize=8)
        ax.set_xlabel("confidence")
    for ax in axes[:, 0]:
        ax.set_ylabel("accuracy")
    fig.suptitle("CIFAR-10 LeNet-5 reliability (15 bins, pooled over seeds)", fontsize=9)
    fig.tight_layout()
    return _runner.save_figure(fig, Path(out) / "reliability.png", dpi=90)


def _curves_figure(out, saved, methods):
    """curves.png: the validation accuracy and NLL of every trained row against its epochs (log
    scale): each saved seed's curve thin, their mean over the epochs every seed evaluated thick,
    and Table 1's final figure (a star at its epochs) in the row's colour."""
    plt = _runner.pyplot()
    names = [n for n in methods
             if any(k[0] == n and r["curve"] for k, r in saved.items())]
    if plt is None or not names:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
    colours = plt.get_cmap("tab20")(np.linspace(0, 1, 20))
    for c, name in enumerate(names):
        recs = [r for (n, _), r in sorted(saved.items()) if n == name and r["curve"]]
        curves = [{e["epoch"]: e for e in r["curve"] if "val_acc" in e} for r in recs]
        common = sorted(set.intersection(*(set(cv) for cv in curves)))
        colour = colours[(2 * c) % 20 + (2 * c) // 20]  # tab20's dark shades, then its light
        for ax, key, scale, at in ((axes[0], "val_acc", 100, 1), (axes[1], "val_nll", 1, 2)):
            for cv in curves:
                ax.plot(sorted(cv), [scale * cv[e][key] for e in sorted(cv)], color=colour,
                        lw=0.6, alpha=0.4)
            ax.plot(common, [scale * np.mean([cv[e][key] for cv in curves]) for e in common],
                    color=colour, lw=1.8, label=f"{name} ({len(recs)} seed(s))")
            if name in PAPER:
                ax.plot(PAPER[name][3], PAPER[name][at], "*", color=colour, ms=11, mec="k",
                        mew=0.5)
    for ax, label in zip(axes, ("validation accuracy %", "validation NLL")):
        ax.set_xscale("log")
        ax.set_xlabel("epoch")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.suptitle("CIFAR-10 LeNet-5: validation curves (thin: seeds; thick: their mean; star: "
                 "Osawa et al. Table 1)", fontsize=9)
    fig.tight_layout()
    return _runner.save_figure(fig, Path(out) / "curves.png", dpi=90)


# ----------------------------------------------------------------------------- the command

def _eval_seconds(s) -> float:
    """The modelled CPU seconds of a trained job's evaluation (:data:`EVAL_SECONDS_PER_DRAW`
    per draw and 10,000 images): the validation passes every eval_every epochs and at the end,
    and the pass over the training set of each of the job's rows (_train_passes)."""
    evals = math.ceil(s["epochs"] / s["eval_every"]) + 1
    passes = evals * s["n_test"] / N_TEST + len(_shown((s["method"],))) * s["n_train"] / N_TEST
    return passes * s["test_draws"] * EVAL_SECONDS_PER_DRAW[s["dtype"]]


def _posthoc_draws(s) -> float:
    """A post-hoc job's GLM predictive draws in units of one draw over the 10,000 test images:
    two predictives (at lam and at the evidence's precision) of test_draws draws each."""
    return 2 * s["test_draws"] * s["n_test"] / N_TEST


def _job_seconds(s, budget) -> float:
    """The estimate of one job's CPU seconds: its epochs at :data:`SECONDS_PER_EPOCH` (scaled by
    the training rows) plus :func:`_eval_seconds`; a post-hoc row's fit and predictives from
    :data:`POSTHOC_SECONDS` and :data:`POSTHOC_SECONDS_PER_DRAW`."""
    frac = budget["n_train"] / N_TRAIN
    if s["method"] in POSTHOC:  # float64 whatever --dtype: the fit, the evidence, 2 predictives
        return (POSTHOC_SECONDS[s["method"]] * frac
                + _posthoc_draws(s) * POSTHOC_SECONDS_PER_DRAW[s["method"]])
    return s["epochs"] * SECONDS_PER_EPOCH[budget["dtype"]][s["method"]] * frac + _eval_seconds(s)


def measured_seconds_per_epoch(record) -> float:
    """A finished trained job's CPU seconds per epoch of training, :func:`_job_seconds` inverted.

    (cpu_seconds - :func:`_eval_seconds`) / (epochs x n_train / 50,000): the figure that makes
    the plan of a job at the record's settings equal the CPU time it took; the source of
    :data:`SECONDS_PER_EPOCH`'s float32 figures.

    Parameters
    ----------
    record : dict
        A saved job's result (``<row>/seed_<s>.json``).

    Returns
    -------
    float
        CPU seconds per epoch.

    Raises
    ------
    ValueError
        If the record is a post-hoc row's (nothing trained) or has no "cpu_seconds" (runs
        before 2026-11-28 recorded none).
    """
    s = record["settings"]
    if s["method"] in POSTHOC:
        raise ValueError(f"record: {s['method']!r} is post-hoc, it trains no epochs")
    if record.get("cpu_seconds") is None:
        raise ValueError(f"record: {s['method']} seed {s['seed']} has no cpu_seconds (runs "
                         "before 2026-11-28 recorded none)")
    return (record["cpu_seconds"] - _eval_seconds(s)) / (s["epochs"] * s["n_train"] / N_TRAIN)


def measured_posthoc_seconds(record) -> tuple[float, float]:
    """A finished post-hoc Laplace job's (fit CPU seconds, CPU seconds per predictive draw), the
    two terms of :func:`_job_seconds` at the record's settings, the source of
    :data:`POSTHOC_SECONDS` and :data:`POSTHOC_SECONDS_PER_DRAW`.

    The fit's CPU time is the record's "fit_cpu_seconds"; records without it (written before
    2026-11-29) time the fit on the wall clock only, so it is cpu_seconds x fit_seconds /
    seconds, the fit's share of the wall time applied to the CPU time. The rest of the CPU time
    (the evidence tuning and the two GLM predictives) is divided by 2 x test_draws x n_test /
    10,000 (:func:`_posthoc_draws`), and the fit is scaled to 50,000 training rows.

    Parameters
    ----------
    record : dict
        A saved post-hoc job's result (``laplace-kron/seed_<s>.json`` or ``laplace-ll/...``).

    Returns
    -------
    tuple of float
        (fit CPU seconds on 50,000 rows, CPU seconds per draw over 10,000 test images).

    Raises
    ------
    ValueError
        If the record is a trained row's, or has no "cpu_seconds" (runs before 2026-11-28
        recorded none).
    """
    s = record["settings"]
    if s["method"] not in POSTHOC:
        raise ValueError(f"record: {s['method']!r} is a trained row, not a post-hoc one")
    if record.get("cpu_seconds") is None:
        raise ValueError(f"record: {s['method']} seed {s['seed']} has no cpu_seconds (runs "
                         "before 2026-11-28 recorded none)")
    fit = record.get("fit_cpu_seconds")
    if fit is None:
        fit = record["cpu_seconds"] * record["fit_seconds"] / record["seconds"]
    return fit * N_TRAIN / s["n_train"], (record["cpu_seconds"] - fit) / _posthoc_draws(s)


def _plan_line(todo, budget, resuming) -> str:
    """The plan: jobs and CPU-hours left; a resumed job counts its remaining steps only."""
    seconds = 0.0
    for u in todo:
        s = u.settings
        done = resuming.get(f"{u.key[0]} seed {u.key[1]}", 0)
        total = s["epochs"] * math.ceil(s["n_train"] / s["M"]) if s["epochs"] else 0
        seconds += _job_seconds(s, budget) * (1.0 - done / total if total else 1.0)
    source = ("the finished full runs' CPU time per epoch (float32, one BLAS thread, one job "
              "per core on a 2-core VM; one row's wall time per epoch has differed by up to 2x "
              "between seeds)" if budget["dtype"] == "float32" else
              f"the s/epoch measured under load ({budget['dtype']}, one BLAS thread, a 2-core "
              f"VM at load 5-6; the float32 runs took {RUNS_OVER_TOOL[0]:.2f}-"
              f"{RUNS_OVER_TOOL[1]:.2f}x of that tool's float32 figures)")
    if any(u.settings["method"] in POSTHOC for u in todo):
        source += "; the Laplace rows' from their finished runs' fit and predictive CPU time"
    return (f"{len(todo)} job(s) to compute, about {seconds / 3600:.2f} CPU-hours from {source}"
            + (f"; {len(resuming)} resumed, their remaining steps only" if resuming else ""))


def _score_saved(out, saved, data_dir, quiet) -> None:
    """--score-train: :func:`score_train` on every saved trained job without the pass,
    rewriting its result (and its further rows') as it goes; the jobs whose final state is not
    saved are named, unscored."""
    unscored = []
    for (name, seed), record in sorted(saved.items()):
        if name in POSTHOC or record["final"].get("train_pass_acc") is not None:
            continue
        t0 = time.perf_counter()
        if score_train(out, name, seed, record, data_dir) is None:
            unscored.append(f"{name} seed {seed}")
            continue
        write_json(_path(out, name, seed), record)
        for sub in record.get("rows", {}):
            write_json(_path(out, sub, seed), _sub_record(record, sub))
        if not quiet:
            f, S = record["final"], record["settings"]["test_draws"]
            print(f"cifar10-lenet: {name} seed {seed}: train pass {100 * f['train_pass_acc']:.2f} "
                  f"% (NLL {f['train_pass_nll']:.3f}, {S} draw{'s' * (S != 1)}, "
                  f"{time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    if unscored and not quiet:
        print(f"cifar10-lenet: no final state under {Path(out) / 'states'}, so no train pass: "
              + ", ".join(unscored), file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    """The ``refbayes reproduce cifar10-lenet`` handler.

    Every saved job and checkpoint under --out is checked first; each missing (row, seed) job
    is trained (resuming from its checkpoint), saved as it finishes, and the table, CSV, JSON
    and reliability figure written at the end (a ``.partial`` summary while jobs are missing).
    With --saved-only nothing is trained: the summary covers the saved jobs and names the rest.
    """
    budget = _budget(args)
    out = Path(args.out)
    data_dir = _runner.worker_path(args.data_dir)
    prov = provenance(_identity(data_dir))
    units = [_runner.Unit((name, seed), _path(out, name, seed), SCHEMA,
                          _settings(name, seed, budget), prov)
             for name in args.methods for seed in range(args.seeds)]
    saved, todo = _runner.plan(units, args.fresh)
    missing = ()
    if args.saved_only:
        if args.fresh:
            raise ValueError("--fresh: --saved-only trains nothing, so it recomputes nothing; "
                             "expected one of the two")
        if not saved:
            seeds = f"seeds 0..{args.seeds - 1}" if args.seeds > 1 else "seed 0"
            raise FileNotFoundError(
                f"--out: expected saved jobs of --methods {','.join(args.methods)} ({seeds}, "
                f"these settings) under {out}, found none")
        missing, todo = tuple(u.key for u in todo), []
    if args.score_train:
        if not args.saved_only:
            raise ValueError("--score-train: expected with --saved-only (it scores the saved "
                             "jobs' final states on the training set and trains nothing)")
        _score_saved(out, saved, data_dir, quiet=args.no_progress)
    serial = args.jobs == 1 and args.dask_scheduler is None
    keys = {u.key for u in todo}
    for name, seed in sorted(keys):  # a post-hoc row needs the adam job's final state first
        if name in POSTHOC and not (("adam", seed) in keys and serial) and not \
                _state_path(out, "adam", seed).exists():
            raise ValueError(
                f"--methods: {name} seed {seed} reads the final state of the adam job of seed "
                f"{seed} ({_state_path(out, 'adam', seed)}), which is not there: run "
                f"`--methods adam` first with the same --out, --seeds, --dtype and --epochs"
                + (" (it is scheduled in this run, but --jobs / --dask-scheduler run the jobs at "
                   "once)" if ("adam", seed) in keys else ""))
    resuming = {}
    for u in todo:
        read = _read_checkpoint(_ckpt_path(out, *u.key), u.settings, prov, args.fresh)
        if read is not None and args.dask_scheduler is None:
            K = math.ceil(u.settings["n_train"] / u.settings["M"])
            resuming[f"{u.key[0]} seed {u.key[1]}"] = read[0]["epoch"] * K + read[0]["step"]

    def checkpointed():
        found = []
        for u in todo:
            with contextlib.suppress(OSError, ValueError, KeyError), \
                    np.load(_ckpt_path(out, *u.key), allow_pickle=False) as z:
                meta = json.loads(str(z["meta"]))
                found.append(f"{u.key[0]} seed {u.key[1]} checkpointed at epoch {meta['epoch']} "
                             f"step {meta['step']}")
        return found

    if todo and not args.no_progress:
        print(f"cifar10-lenet: plan: {_plan_line(todo, budget, resuming)}", file=sys.stderr,
              flush=True)
    shown_total = len(saved) if args.saved_only else len(units)
    write, progress = _runner.start(out, bool(todo), shown_total, len(saved), "cifar10-lenet",
                                    enabled=not args.no_progress, resuming=resuming,
                                    partial=checkpointed)
    if write and todo:
        atomic_write_text(out / ".gitignore", "checkpoints/\npredictions/\nstates/\n")
    ckpt_dir = out.resolve() if args.dask_scheduler is None else None
    states_dir = out.resolve()
    jobs = [_runner.Job(f"cifar10-lenet/{u.key[0]}/{u.key[1]}", _run_job,
                        (u.key[0], u.key[1], budget, u.settings, prov, data_dir, ckpt_dir,
                         args.fresh, _runner.PROGRESS, states_dir),
                        cost=_job_seconds(u.settings, budget | {"dtype": "float32"}))
            for u in todo]

    def done(key, result):
        _, name, seed = key.split("/")
        seed = int(seed)
        record, P, arrays, extras = result
        for sub, P_sub in extras.items():  # the job's further rows, as their own files
            atomic_write_npz(out / "predictions" / f"{sub}_seed_{seed}.npz",
                             probs=P_sub.astype(np.float32))
            write_json(_path(out, sub, seed), _sub_record(record, sub))
        if arrays is not None:  # the final state (post-hoc rows read the adam row's)
            atomic_write_npz(_state_path(out, name, seed),
                             meta=np.array(json.dumps({"settings": record["settings"]})),
                             **arrays)
        atomic_write_npz(out / "predictions" / f"{name}_seed_{seed}.npz",
                         probs=P.astype(np.float32))
        saved[name, seed] = record
        write_json(_path(out, name, seed), record)
        _write_curve(out / name / f"seed_{seed}.curve.csv", record["curve"])
        _ckpt_path(out, name, seed).unlink(missing_ok=True)
        progress.advance(f"{name} seed {seed}")

    with progress:
        sections = [_runner.Section([j for j in jobs if j.key.split("/")[1] not in POSTHOC]),
                    _runner.Section([j for j in jobs if j.key.split("/")[1] in POSTHOC])]
        _runner.execute(sections, done, progress, **_runner.job_options(args))
        complete = len(saved) == len(units)
        shown = _shown(args.methods)
        rows = _summary(_expanded(saved), shown)
        table = _table(rows, complete, missing)
        progress.echo(table)
        lines = [f"results: {out}/"]
        if write and rows:
            # a --saved-only table is the one asked for: summary.csv, its JSON names the rest
            final = complete or args.saved_only
            csv_path = _runner.write_summary_csv(out / "summary.csv", rows, complete=final)
            lines.append(f"table: {csv_path}")
            write_json(out / "summary.json", {"complete": complete, "rows": rows,
                                              "not_saved": [list(k) for k in missing],
                                              "paper": PAPER, "citation": CITATION})
            atomic_write_text(out / "table.md", table)
            for fig in (_figure(out, _expanded(saved), shown), _curves_figure(out, saved, shown)):
                if fig is not None:
                    lines.append(f"figure: {fig}")
        progress.echo("\n".join(lines))
    return 0
