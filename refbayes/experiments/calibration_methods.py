"""The methods of the calibration benchmark (``refbayes reproduce calibration``): a registry.

``METHODS`` maps a command-line name to a :class:`MethodSpec`. The runner
(refbayes.experiments.calibration) owns the data, the split, the network, the prior, the seeds
and the metrics; a spec only says how to train and how to predict:

- ``defaults``: the method's fixed settings: ``epochs``, ``M`` (minibatch size) and its own step
  sizes, initial scales, ... (a plain dict of JSON numbers).
- ``quick``: overrides of ``defaults`` under ``--quick``.
- ``fit(model, X, y, hyper, rng, progress) -> posterior``: X (N, n_in), y (N,) integer labels
  in {0, ..., C - 1}; ``model`` the runner's ``MLP([n_in, H, H, C], "relu", "categorical")``;
  ``hyper`` = the resolved defaults plus ``prior_precision`` (lam: the prior N(0, I / lam),
  the same for every method of a dataset and task, set by the runner); ``rng`` a numpy
  Generator owned by the runner (every random draw of training comes from it: the initial
  weights first, then the driver's minibatches and noise); ``progress(1)`` once per finished
  epoch. Raises ``refbayes.methods.driver.TrainingError`` when training produces non-finite
  values.
- ``predict(posterior, model, X, rng, S) -> probs``: the predictive class probabilities (n, C),
  the Bayesian model average (1/S') sum_s softmax(f(X; theta_s)) over S' posterior draws
  (S' = S for a sampled posterior, drawn from ``rng``; S' = 1 for a point estimate, ``point``
  True, which ignores S and draws nothing).
- ``train``: the name of the training run. Specs with the same ``train`` and the same resolved
  ``defaults`` share one fit: the runner seeds the training generator by ``train``, not by the
  method's name, so the fit is the same whichever of them runs it, and it trains once per
  (dataset, task, seed) for all of them in one invocation (SWA, SWAG-Diagonal and SWAG read one
  SGD run).
- ``constants``: settings of the prediction that are fixed in code (SWAG's scale), recorded in
  the result files beside ``defaults``.

Registered: "map", "swa", "swag-diag", "swag", "bbb", "mc_dropout", "vogn". A new method is one
more ``MethodSpec`` in ``METHODS``; the registry tests (tests/experiments/test_calibration.py)
are parametrized over it, and ``refbayes reproduce calibration --method all`` runs it.

The settings and the reasons for them are in derivations/calibration_experiment.md. In short:

- map: the SWAG paper's SGD baseline: momentum 0.9, the official piecewise-linear schedule
  (swag.10) from lr 0.05 down to 0.01 lr (alpha_swa = 0.0005 at swa_start = epochs), weight
  decay lam / N, minibatch 128; predictive softmax(f(x; theta)).
- swa / swag-diag / swag: ONE SGD run (train "sgd-swa"): the same SGD, schedule with
  swa_start = epochs - swa_epochs and the constant swa lr 0.01 (the official VGG-16 value,
  lr_init 0.05), one snapshot per epoch after swa_start (swag.1)-(swag.3), K = 20.
  swa predicts with theta_SWA; swag-diag samples N(theta_SWA, Sigma_diag) (scale 1, the
  paper's SWAG-Diagonal); swag samples N(theta_SWA, (Sigma_diag + D D^T / (K - 1)) / 2)
  (scale 1/2, the paper's SWAG) (swag.7).
- bbb: Bayes-by-Backprop, Adam lr 1e-3 (betas 0.9 / 0.999) on (mu, rho), one Monte Carlo draw
  per step, sigma_0 = 1e-3 (rho_0 = softplus^{-1}(1e-3)), mu_0 Glorot.
- mc_dropout: dropout p = 0.1 on the inputs and hidden units (inverted), Adam lr 1e-3; the
  length-scale is set so that the weight prior precision of (mc_dropout.4) equals the shared
  lam: l^2 = lam (1 - p) (biases then get l^2 = 0.9 lam).
- vogn: alpha 1e-3, raw momentum 0.9, beta2 0.01 (the UCI benchmark's VOGN), one draw per
  step, squared per-example gradients, s_0 = 100 / N (initial sd 1 / sqrt(100 + lam), about
  0.1), tau = rho = 1.
"""
from __future__ import annotations

import math
from types import MappingProxyType
from typing import Any, NamedTuple

import numpy as np
from scipy.special import softmax

from refbayes.experiments._fits import MethodSpec, bbb_fit, dropout_fit, vogn_fit
from refbayes.methods import driver, mc_dropout, swag

__all__ = ["METHODS", "MethodSpec", "TrainingError", "bma_probs", "resolve"]

TrainingError = driver.TrainingError


def resolve(spec: MethodSpec, quick: bool = False) -> dict:
    """The settings of ``spec``: its defaults, then --quick's overrides; epochs and M checked."""
    settings = {**spec.defaults, **(spec.quick if quick else {})}
    for key in ("epochs", "M"):
        value = settings.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{spec.name}: {key} must be an integer >= 1, got {value!r}")
    return settings


def bma_probs(model, thetas, X) -> np.ndarray:
    """(1/S) sum_s softmax(f(X; theta_s)): the Bayesian model average of the class
    probabilities over the columns of thetas (D, S); (n, C)."""
    thetas = np.asarray(thetas)
    P = np.zeros((X.shape[0], model.sizes[-1]))
    for s in range(thetas.shape[1]):
        P += softmax(model.forward(np.ascontiguousarray(thetas[:, s]), X), axis=1)
    return P / thetas.shape[1]


def _epochs(hyper, progress, fn):
    """Call fn(epoch) for epoch = 0..epochs-1, then progress(1)."""
    for epoch in range(hyper["epochs"]):
        fn(epoch)
        progress(1)


# ----------------------------------------------------------------------------- SGD, SWA, SWAG

def _sgd(model, X, y, hyper, rng, progress, swa_start, alpha_swa, snapshot=None):
    """Momentum SGD (swag.8)-(swag.9) under the official schedule (swag.10), one driver call per
    epoch at that epoch's step size; ``snapshot(theta)`` after each epoch e with e + 1 > swa_start
    (the official ``collect_model`` condition). Returns the last SGDState."""
    N = X.shape[0]
    alpha_init = hyper["lr"] / N  # torch lr acts on the mean loss
    cfg = swag.SGDConfig(N=N, lam=hyper["prior_precision"], alpha=alpha_init,
                         momentum=hyper["momentum"])
    state = [swag.sgd_init(model.init_theta(rng))]

    def epoch_fn(epoch):
        a = swag.swa_learning_rate(epoch, alpha_init=alpha_init, alpha_swa=alpha_swa,
                                   swa_start=swa_start)
        state[0] = driver.run(state[0], cfg._replace(alpha=a), model, X, y, rng=rng, epochs=1,
                              M=min(hyper["M"], N))
        if snapshot is not None and epoch + 1 > swa_start:
            snapshot(state[0].theta)

    _epochs(hyper, progress, epoch_fn)
    return state[0]


def _map_fit(model, X, y, hyper, rng, progress):
    """The SGD baseline: the schedule with swa_start = epochs, decaying to lr_ratio * lr."""
    N = X.shape[0]
    return _sgd(model, X, y, hyper, rng, progress, swa_start=hyper["epochs"],
                alpha_swa=hyper["lr_ratio"] * hyper["lr"] / N).theta


def _point_predict(theta, model, X, rng, S):
    """softmax(f(X; theta)) of the point estimate (S is not used, nothing is drawn)."""
    return bma_probs(model, theta[:, None], X)


class _SWAG(NamedTuple):
    state: Any   # swag.SWAGState after the last snapshot
    K: int


def _swag_fit(model, X, y, hyper, rng, progress):
    """One SGD run with swa_start = epochs - swa_epochs; a SWAG snapshot after each of the last
    swa_epochs epochs (constant step swa_lr / N there)."""
    N = X.shape[0]
    swa_start = hyper["epochs"] - hyper["swa_epochs"]
    if swa_start < 1:
        raise ValueError(f"swa_epochs: expected fewer than epochs ({hyper['epochs']}), got "
                         f"{hyper['swa_epochs']}")
    scfg = swag.SWAGConfig(K=hyper["K"])
    moments = [None]

    def snapshot(theta):
        if moments[0] is None:
            moments[0] = swag.init(theta, scfg)
        moments[0], _ = swag.collect(moments[0], theta, scfg, inplace=True)

    _sgd(model, X, y, hyper, rng, progress, swa_start=swa_start,
         alpha_swa=hyper["swa_lr"] / N, snapshot=snapshot)
    return _SWAG(moments[0], hyper["K"])


def _swa_predict(post, model, X, rng, S):
    """softmax(f(X; theta_SWA)) (S is not used, nothing is drawn)."""
    return bma_probs(model, post.state.theta_bar[:, None], X)


def _swag_sampler(scale: float, low_rank: bool):
    def predict(post, model, X, rng, S):
        cfg = swag.SWAGConfig(K=post.K, scale=scale)
        z1 = rng.standard_normal((model.D, S))
        z2 = rng.standard_normal((swag.rank(post.state), S)) if low_rank else None
        return bma_probs(model, swag.sample(post.state, z1, z2, cfg), X)   # (swag.7)
    draws = "z1 (D, S), then z2 (K', S)" if low_rank else "z1 (D, S)"
    predict.__doc__ = (f"S draws of the SWAG{'' if low_rank else '-Diagonal'} Gaussian, scale "
                       f"{scale:g} (swag.7): {draws} from rng; the BMA of their softmax outputs.")
    return predict


# ----------------------------------------------------------------------------- BBB

def _gaussian_predict(post, model, X, rng, S):
    """S draws theta_s of q, eps (D, S) from rng; the BMA of their softmax outputs."""
    return bma_probs(model, post.sample(rng.standard_normal((model.D, S))), X)


def _bbb_fit(model, X, y, hyper, rng, progress):
    """Bayes-by-Backprop (``_fits.bbb_fit``): Adam on (mu, rho) of the negative ELBO with
    S_train draws per step; mu_0 Glorot, sigma_0 = hyper["sigma_init"]. The Adam eps of the
    per-example objective F / N is N * adam_eps on refbayes' summed F."""
    return bbb_fit(model, X, y, hyper["prior_precision"], hyper, rng, hyper["epochs"],
                   min(hyper["M"], X.shape[0]), progress, sigma0=hyper["sigma_init"])


# ----------------------------------------------------------------------------- VOGN

def _vogn_fit(model, X, y, hyper, rng, progress):
    """VOGN (refbayes.methods.vogn) with squared per-example gradients, tau = rho = 1,
    gamma = 0; s_0 = hyper["s_init_N"] / N."""
    N = X.shape[0]
    return vogn_fit(model, X, y, hyper["prior_precision"], hyper, rng, hyper["epochs"],
                    min(hyper["M"], N), progress, beta2=hyper["beta2"], s0=hyper["s_init_N"] / N)


# ----------------------------------------------------------------------------- MC dropout

def _dropout_fit(model, X, y, hyper, rng, progress):
    """MC dropout (refbayes.methods.mc_dropout), inverted dropout with drop probability p on
    every layer input, Adam on the summed objective; l^2 = lam (1 - p), so the weights' prior
    precision l^2 / (1 - p) of (mc_dropout.4) is the shared lam."""
    N = X.shape[0]
    p = hyper["p"]
    lengthscale = math.sqrt(hyper["prior_precision"] * (1 - p))
    cfg = mc_dropout.MCDropoutConfig(N, p=p, lengthscale=lengthscale,
                                     alpha=hyper["lr"], beta1=hyper["adam_beta1"],
                                     beta2=hyper["adam_beta2"], eps_adam=N * hyper["adam_eps"])
    return dropout_fit(model, X, y, cfg, rng, hyper["epochs"], min(hyper["M"], N), progress)


def _dropout_predict(post, model, X, rng, S):
    """S stochastic forward passes with fresh masks (mc_dropout.7), drawn as the driver does
    (per pass, one mask per layer input, in layer order); the BMA of their softmax outputs."""
    masks = [driver.draw_masks(rng, model, X.shape[0], post.cfg.p) for _ in range(S)]
    F = mc_dropout.predict_samples(post.state, X, masks, post.cfg, model)
    return softmax(F, axis=2).mean(axis=0)


# ----------------------------------------------------------------------------- the registry

_ADAM = {"adam_beta1": 0.9, "adam_beta2": 0.999, "adam_eps": 1e-8}
_QUICK = {"epochs": 20}
_SGD = {"epochs": 200, "M": 128, "lr": 0.05, "momentum": 0.9}
_SWA = {**_SGD, "swa_epochs": 90, "swa_lr": 0.01, "K": 20}
_SWA_QUICK = {"epochs": 20, "swa_epochs": 8}

MAP = MethodSpec(
    name="map",
    description="SGD (momentum 0.9, the SWAG paper's schedule, no SWA): the MAP point estimate",
    defaults={**_SGD, "lr_ratio": 0.01},
    quick=_QUICK,
    fit=_map_fit,
    predict=_point_predict,
    point=True,
)

SWA = MethodSpec(
    name="swa",
    description="SWA (Izmailov et al. 2018): the mean of the SGD iterates at the constant swa lr",
    defaults=_SWA, quick=_SWA_QUICK, fit=_swag_fit, predict=_swa_predict, point=True,
    train="sgd-swa",
)

SWAG_DIAG = MethodSpec(
    name="swag-diag",
    description="SWAG-Diagonal (Maddox et al. 2019): N(theta_SWA, Sigma_diag), scale 1",
    defaults=_SWA, quick=_SWA_QUICK, fit=_swag_fit, predict=_swag_sampler(1.0, low_rank=False),
    train="sgd-swa", constants=MappingProxyType({"scale": 1.0, "low_rank": False}),
)

SWAG = MethodSpec(
    name="swag",
    description="SWAG (Maddox et al. 2019): N(theta_SWA, (Sigma_diag + D D^T / (K - 1)) / 2)",
    defaults=_SWA, quick=_SWA_QUICK, fit=_swag_fit, predict=_swag_sampler(0.5, low_rank=True),
    train="sgd-swa", constants=MappingProxyType({"scale": 0.5, "low_rank": True}),
)

BBB = MethodSpec(
    name="bbb",
    description="Bayes-by-Backprop (Blundell et al. 2015): mean-field Gaussian, Adam on (mu, rho)",
    defaults={"epochs": 200, "M": 128, "lr": 1e-3, **_ADAM, "S_train": 1, "sigma_init": 1e-3},
    quick={"epochs": 20, "lr": 3e-3},
    fit=_bbb_fit,
    predict=_gaussian_predict,
)

MC_DROPOUT = MethodSpec(
    name="mc_dropout",
    description="MC dropout (Gal and Ghahramani 2016): p = 0.1 on inputs and hidden units",
    defaults={"epochs": 200, "M": 128, "lr": 1e-3, **_ADAM, "p": 0.1},
    quick={"epochs": 20, "lr": 3e-3},
    fit=_dropout_fit,
    predict=_dropout_predict,
)

VOGN = MethodSpec(
    name="vogn",
    description="VOGN (Khan et al. 2018; Osawa et al. 2019): mean-field natural-gradient VI",
    defaults={"epochs": 200, "M": 128, "lr": 1e-3, "momentum": 0.9, "beta2": 0.01,
              "S_train": 1, "s_init_N": 100.0},
    quick={"epochs": 20, "lr": 3e-3},
    fit=_vogn_fit,
    predict=_gaussian_predict,
)

METHODS: dict[str, MethodSpec] = {s.name: s for s in (MAP, SWA, SWAG_DIAG, SWAG, BBB, MC_DROPOUT,
                                                      VOGN)}
