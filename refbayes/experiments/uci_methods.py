"""The methods of the UCI regression benchmark (``refbayes reproduce uci``): a registry.

``METHODS`` maps a command-line name to a :class:`MethodSpec`. The runner
(refbayes.experiments.uci) owns the data, the standardization, the seeds, the grid search and
the metrics; a spec only says how to train on standardized data and how to draw predictions:

- ``grid``: hyperparameter -> tuple of candidates. The runner tries every point of the product
  (keys in sorted order, values in the order given) and keeps the best validation
  log-likelihood; a point whose training diverges is recorded and never chosen, and a one-point
  grid is trained once, on the whole training split, without a validation phase. Every grid has
  either ``noise_precision`` (tau on the STANDARDIZED target scale: the runner builds
  ``MLP([p, H, 1], "relu", "gaussian", noise_precision=tau)``; tau_orig = tau / sd_y^2 in the
  original units) or ``noise_precision_raw`` (tau_orig; the runner passes the fit both, with
  noise_precision = tau_orig sd_y^2 from the rows trained on).
- ``defaults``: everything fixed: ``epochs``, ``M`` (minibatch size), ``S_test`` (Monte Carlo
  draws of the predictive), and the method's own settings (step sizes, S_train, ...).
- ``quick``: overrides of ``defaults`` under ``--quick``, and optionally a ``"grid"`` entry; without
  one the quick grid has 2 points: the first and last noise precision, every other
  hyperparameter at its middle candidate.
- ``per_dataset``: dataset -> {"grid": {...}, "defaults": {...}} overriding the two above (the
  paper's per-dataset settings).
- ``fit(model, X, y, hyper, rng, epochs, M, progress) -> posterior``: X (N, p), y (N,)
  standardized; ``hyper`` = resolved defaults merged with the grid point (a plain dict);
  ``rng`` a numpy Generator owned by the runner (every random draw comes from it);
  ``progress(1)`` once per finished epoch. Raise ``refbayes.methods.driver.TrainingError``
  when the run produces non-finite values.
- ``predict(posterior, model, X, rng, S) -> (F, tau)``: F (S', n) network outputs on the
  standardized scale, one row per posterior draw (S' = S for a sampled posterior, 1 for a point
  estimate), and the noise precision tau (standardized scale) of the predictive
  p(y | x) = (1/S') sum_s N(y | F[s], 1 / tau_s): one float, or an (S',) array of per-draw
  precisions (a learned noise, drawn from its posterior).
- ``ranges``: hyperparameter -> (low, high, low_open, high_open), checked for every candidate
  and setting before anything runs (COMMON_RANGES covers the shared names).
- ``published_as``: the method name of the published rows the spec reproduces, when it is not
  its own (the learned-noise variants print the rows of the method they vary).

Registered: "slang", "bbb", "vogn", "mc_dropout", "vadam", "noisy_adam", "noisy_kfac", the
latter two with the official learned noise precision ("noisy_adam_learned_noise",
"noisy_kfac_learned_noise"; derivations/noise_gamma.md), and the point-estimate baselines "map"
and "kfac". A new method is one more ``MethodSpec`` entry in ``METHODS`` (the end-to-end test
is parametrized over it). Names are written with underscores; ``canonical_name`` maps the hyphen
spelling ("noisy-adam", "mc-dropout") to them, and the command line accepts both.

Where each method's settings come from (the public code, paper and commit each was read in,
and where refbayes departs from it): derivations/uci-hyperparameters.md.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from refbayes._checks import check_in_range, check_int
from refbayes.experiments._fits import (
    Gaussian,
    MethodSpec,
    adam_config,
    bbb_fit,
    dropout_fit,
    train,
    vogn_fit,
)
from refbayes.methods import (
    Batch,
    adam,
    driver,
    mc_dropout,
    noise_gamma,
    noisy_adam,
    noisy_kfac,
    slang,
    vadam,
)

__all__ = [
    "COMMON_RANGES",
    "METHODS",
    "Budget",
    "MethodSpec",
    "TrainingError",
    "canonical_name",
    "gamma_config",
    "grid_points",
    "kfac_config",
    "kfac_step_size",
    "kfac_train",
    "noisy_adam_config",
    "prior_vector",
    "residual_r2",
    "resolve",
]

TrainingError = driver.TrainingError


# name: (low, high, low_open, high_open); integers are the names in _INTEGER
COMMON_RANGES = {
    "noise_precision": (0.0, math.inf, True, True),
    "noise_precision_raw": (0.0, math.inf, True, True),
    "prior_precision": (0.0, math.inf, True, True),
    "bias_prior_precision": (0.0, math.inf, True, True),
    "lr": (0.0, 1.0, True, False),
    "beta": (0.0, 1.0, True, False),
    "momentum": (0.0, 1.0, False, True),
    "decay": (0.0, math.inf, False, True),
    "s_init": (0.0, math.inf, True, True),
    "adam_beta1": (0.0, 1.0, False, True),
    "adam_beta2": (0.0, 1.0, False, True),
    "adam_eps": (0.0, math.inf, True, True),
}
_NOISE_KEYS = ("noise_precision", "noise_precision_raw")  # standardized / original units
_INTEGER = ("epochs", "M", "S_test", "S_train", "L", "lr_decay_every", "T_stats", "T_inv")
_CHOICES = {"squares": vadam.SQUARES,  # name: the allowed values
            "bias_correction": (True, False), "factor_init": ("tau", "identity")}
_OPTIONAL = ("kl_clip",)  # names whose value may be None (off)


class Budget(NamedTuple):
    grid: dict      # hyperparameter -> tuple of candidates, after per-dataset and quick overrides
    settings: dict  # defaults after per-dataset and quick overrides (and the caller's epochs)


def canonical_name(name: str) -> str:
    """The registry spelling of a method name: hyphens become underscores ('noisy-adam' ->
    'noisy_adam', 'mc-dropout' -> 'mc_dropout'); whether it is registered is not checked."""
    return str(name).strip().replace("-", "_")


def grid_points(grid: dict) -> list[dict]:
    """Every point of the product of ``grid``, keys sorted, values in the order given."""
    keys = sorted(grid)
    return [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]


def _check_value(spec: MethodSpec, key: str, value):
    name = f"{spec.name} hyperparameter {key}"
    if key in _INTEGER:
        return check_int(value, name, low=1)
    if key in _CHOICES:
        if value not in _CHOICES[key]:
            raise ValueError(f"{name}: expected one of {_CHOICES[key]}, got {value!r}")
        return value
    ranges = {**COMMON_RANGES, **spec.ranges}
    if key in _OPTIONAL and value is None:
        return None
    if key in ranges:
        low, high, low_open, high_open = ranges[key]
        value = check_in_range(value, name, low, high, low_open=low_open, high_open=high_open)
        if not math.isfinite(value):
            raise ValueError(f"{name}: expected a finite value, got {value}")
    return value


def resolve(spec: MethodSpec, dataset: str, quick: bool = False, epochs: int | None = None,
            grid: dict | None = None) -> Budget:
    """The grid and fixed settings of ``spec`` on ``dataset``: defaults, then the dataset's
    overrides, then --quick's, then ``epochs`` and the candidates of ``grid`` (hyperparameter
    -> tuple, replacing that key's candidates; the key must be in the method's grid); every
    value checked against its range."""
    override = dict(grid or {})
    over = spec.per_dataset.get(dataset, {})
    grid = {**spec.grid, **over.get("grid", {})}
    settings = {**spec.defaults, **over.get("defaults", {})}
    if quick:
        settings.update({k: v for k, v in spec.quick.items() if k != "grid"})
        if "grid" in spec.quick:
            grid = {**grid, **spec.quick["grid"]}
        else:  # 2 points: the extreme noise precisions, every other key at its middle candidate
            grid = {k: tuple(dict.fromkeys((v[0], v[-1]))) if k in _NOISE_KEYS
                    else (v[len(v) // 2],) for k, v in grid.items()}
    if epochs is not None:
        settings["epochs"] = epochs
    unknown = sorted(set(override) - set(grid))
    if unknown:
        raise ValueError(f"{spec.name} grid: {', '.join(unknown)} is not a hyperparameter of its "
                         f"grid; expected one of {sorted(grid)}")
    grid = {**grid, **override}
    if sum(k in grid for k in _NOISE_KEYS) != 1:
        raise ValueError(f"{spec.name}: the grid must list candidates of exactly one of "
                         f"{_NOISE_KEYS}, got keys {sorted(grid)}")
    for key in ("epochs", "M", "S_test"):
        if key not in settings:
            raise ValueError(f"{spec.name}: defaults must set {key}, got keys {sorted(settings)}")
    for key, values in grid.items():
        if not isinstance(values, (tuple, list)) or not values:
            raise ValueError(f"{spec.name} grid {key}: expected a non-empty tuple of candidates, "
                             f"got {values!r}")
        grid[key] = tuple(_check_value(spec, key, v) for v in values)
    settings = {k: _check_value(spec, k, v) for k, v in settings.items()}
    return Budget(grid, settings)


def prior_vector(model, weight_precision: float, bias_precision: float) -> np.ndarray:
    """lam (D,) in theta's layout: ``weight_precision`` on every W_l entry, ``bias_precision``
    on every b_l entry (the official SLANG code's prior: weights tuned, biases 1e-6)."""
    params = model.unflatten(np.zeros(model.D))
    return model.flatten([(np.full(W.shape, float(weight_precision)),
                           None if b is None else np.full(b.shape, float(bias_precision)))
                          for W, b in params])


_FORWARD_CHUNK = 16  # draws per batched pass: S_test = 100 on protein's 4.6k test rows and 100
# hidden units would hold a 370 MB activation at once, 16 draws 60 MB


def _forward_rows(model, thetas, X) -> np.ndarray:
    """F (S, n): the scalar network output at each column of thetas (D, S), in batched passes
    of at most _FORWARD_CHUNK draws."""
    T = np.ascontiguousarray(thetas.T)
    return np.concatenate([model.forward_batched(T[i:i + _FORWARD_CHUNK], X)[:, :, 0]
                           for i in range(0, T.shape[0], _FORWARD_CHUNK)])


# ----------------------------------------------------------------------------- SLANG

def _slang_fit(model, X, y, hyper, rng, epochs, M, progress):
    """SLANG (refbayes.methods.slang, Algorithm 1) driven by refbayes.methods.driver.run:
    N = rows of X, minibatches of M, S = hyper["S_train"] draws per step."""
    D = model.D
    lam = prior_vector(model, hyper["prior_precision"], hyper["bias_prior_precision"])
    L = min(hyper["L"], D)
    # "init" and "forward" are in slang_official_code's settings only (SLANG's saved settings
    # predate them): the official PyTorch code's initialization and forward (slang.9)
    theta0 = model.init_theta(rng, scheme=hyper.get("init", "glorot"))
    state = slang.init(theta0, np.zeros((D, L)), np.full(D, hyper["s_init"]))
    cfg = slang.SLANGConfig(X.shape[0], lam, L=L, alpha=hyper["lr"], beta=hyper["beta"],
                            decay=hyper["decay"], momentum=hyper["momentum"],
                            forward=hyper.get("forward", "draw"))
    return driver.run(state, cfg, model, X, y, rng=rng, epochs=epochs, M=M, S=hyper["S_train"],
                      callback=lambda epoch, st: progress(1))


def _slang_predict(state, model, X, rng, S):
    """S draws theta_s = mu + S_P eps_s of q (slang.7), eps (D, S) from rng; F[s] = f(X; theta_s)."""
    eps = rng.standard_normal((model.D, S))
    return _forward_rows(model, slang.sample(state, eps), X), model.likelihood.noise_precision


def _slang_dataset(tau, lam, lr, beta=None, S_train=4):
    return {"grid": {"noise_precision": tau, "prior_precision": lam},
            "defaults": {"lr": lr, "beta": lr if beta is None else beta, "S_train": S_train}}


_WIDE = (0.135, 1.0, 7.39)  # exp(-2), exp(0), exp(2)
SLANG = MethodSpec(
    name="slang",
    description="SLANG, L = 1 (Mishkin et al. 2018), the official UCI settings",
    grid={"noise_precision": (1.0, 3.0, 10.0), "prior_precision": _WIDE},
    defaults={"epochs": 120, "M": 10, "S_test": 20, "S_train": 4, "L": 1, "lr": 0.01,
              "beta": 0.01, "decay": 0.0, "momentum": 0.9, "s_init": 1.0,
              "bias_prior_precision": 1e-6},
    quick={"epochs": 5, "S_test": 10},
    fit=_slang_fit,
    predict=_slang_predict,
    per_dataset={
        "boston": _slang_dataset((6.27, 7.66, 9.35), _WIDE, 0.01),
        "concrete": _slang_dataset((6.89, 11.4, 18.7), _WIDE, 0.005),
        "energy": _slang_dataset((75.3, 92.0, 112.0), (0.0183, 0.135, 1.0), 0.01),
        "kin8nm": _slang_dataset((8.44, 10.8, 13.9), _WIDE, 0.01, S_train=2),
        "naval": _slang_dataset((11.7, 15.1, 19.4), (0.0183, 0.135, 1.0), 0.01, S_train=2),
        "power": _slang_dataset((13.1, 17.7, 23.9), _WIDE, 0.005, S_train=2),
        "protein": _slang_dataset((1.0, 2.0, 4.0), _WIDE, 0.005, S_train=2),
        "wine": _slang_dataset((1.45, 1.69, 1.96), (1.0, 7.39, 54.6), 0.005, beta=0.01),
        "yacht": _slang_dataset((46.3, 76.3, 126.0), _WIDE, 0.08),
    },
)


# ----------------------------------------------------------------------------- MAP

def _map_fit(model, X, y, hyper, rng, epochs, M, progress):
    """Adam (refbayes.methods.adam, MAP) on (N/M) sum_{i in B} l_i + (1/2) theta^T diag(lam)
    theta, through the driver; returns theta."""
    N = X.shape[0]
    lam = prior_vector(model, hyper["prior_precision"], hyper["bias_prior_precision"])
    cfg = adam.MAPConfig(N, lam, adam_config(hyper, N))
    return train(adam.init(model.init_theta(rng)), cfg, model, X, y, rng, epochs, M,
                 progress).theta


def _map_predict(theta, model, X, rng, S):
    """The point estimate: one row f(X; theta) (S is not used)."""
    return model.forward(theta, X)[:, 0][None, :], model.likelihood.noise_precision


MAP = MethodSpec(
    name="map",
    description="MAP point estimate by Adam, noise precision chosen on validation (baseline)",
    grid={"noise_precision": (1.0, 3.0, 10.0, 30.0, 100.0, 300.0),
          "prior_precision": (0.1, 1.0, 10.0)},
    defaults={"epochs": 120, "M": 32, "S_test": 1, "lr": 0.01, "adam_beta1": 0.9,
              "adam_beta2": 0.999, "adam_eps": 1e-8, "bias_prior_precision": 1e-6},
    quick={"epochs": 20},
    fit=_map_fit,
    predict=_map_predict,
)


# ----------------------------------------------------------------------------- mean-field Gaussians

def _gaussian_predict(post, model, X, rng, S):
    """S draws theta_s of q, eps (D, S) from rng; F[s] = f(X; theta_s)."""
    eps = rng.standard_normal((model.D, S))
    return _forward_rows(model, post.sample(eps), X), model.likelihood.noise_precision


def _slang_official_code_fit(model, X, y, hyper, rng, epochs, M, progress):
    """``_slang_fit`` with the official PyTorch code's initialization and forward in its settings
    (init="pytorch", forward="mean+draw", slang.9): every step's gradients at w_s = mu + theta_s,
    theta_s = mu + S_P eps_s a draw of q, and the predictive's draws are w_s too: the weights
    that code's network trains and predicts with."""
    state = _slang_fit(model, X, y, hyper, rng, epochs, M, progress)
    return Gaussian(lambda eps: state.mu[:, None] + slang.sample(state, eps))  # (slang.9)


SLANG_OFFICIAL_CODE = SLANG._replace(
    name="slang_official_code",
    description="SLANG as the official PyTorch code runs it: PyTorch's initialization, the "
                "network at mu + a draw of q",
    defaults={**SLANG.defaults, "init": "pytorch", "forward": "mean+draw"},
    fit=_slang_official_code_fit, predict=_gaussian_predict, published_as="slang")


def _bbb_fit(model, X, y, hyper, rng, epochs, M, progress):
    """Bayes-by-Backprop (refbayes.methods.bbb): Adam on (mu, rho) of the negative ELBO, S_train
    draws per step; mu from Glorot, rho_0 = rho_init (the SLANG repository's BBB baseline: -1)."""
    lam = prior_vector(model, hyper["prior_precision"], hyper["bias_prior_precision"])
    return bbb_fit(model, X, y, lam, hyper, rng, epochs, M, progress, rho0=hyper["rho_init"])


def _vogn_fit(model, X, y, hyper, rng, epochs, M, progress):
    """VOGN (refbayes.methods.vogn, Osawa et al. Algorithm 1 at tau = rho = 1, gamma = 0) with the
    per-example squared gradients; s_0 = 1 / N (initial precision N s_0 + delta = 1 + delta)."""
    lam = prior_vector(model, hyper["prior_precision"], hyper["bias_prior_precision"])
    return vogn_fit(model, X, y, lam, hyper, rng, epochs, M, progress, beta2=hyper["beta"],
                    s0=1.0 / X.shape[0])


# UCI_LARGE_BBB_PARAMETERS of the SLANG repository: minibatch 100 (and 2 training draws, which
# the SLANG rows above already give these sets); protein, which has no official setting, with them
_BBB_LARGE = ("kin8nm", "naval", "power", "protein")
BBB = MethodSpec(
    name="bbb",
    description="Bayes-by-Backprop (Blundell et al. 2015), the SLANG repository's UCI baseline",
    grid=SLANG.grid,
    defaults={"epochs": 120, "M": 10, "S_test": 20, "S_train": 4, "lr": 0.01,
              "adam_beta1": 0.9, "adam_beta2": 0.99, "adam_eps": 1e-8, "rho_init": -1.0,
              "bias_prior_precision": 1e-6},
    quick={"epochs": 5, "S_test": 10},
    fit=_bbb_fit,
    predict=_gaussian_predict,
    per_dataset={d: {"grid": o["grid"],
                     "defaults": {"S_train": o["defaults"]["S_train"],
                                  **({"M": 100} if d in _BBB_LARGE else {})}}
                 for d, o in SLANG.per_dataset.items()},
    ranges={"rho_init": (-math.inf, math.inf, True, True)},
)

VOGN = MethodSpec(
    name="vogn",
    description="VOGN (Khan et al. 2018; Osawa et al. 2019), per-example squared gradients",
    grid=SLANG.grid,
    defaults={"epochs": 120, "M": 10, "S_test": 20, "S_train": 4, "lr": 1e-3, "momentum": 0.9,
              "beta": 0.01, "bias_prior_precision": 1e-6},
    quick={"epochs": 5, "S_test": 10},
    fit=_vogn_fit,
    predict=_gaussian_predict,
    per_dataset={d: {"grid": o["grid"], "defaults": {"S_train": o["defaults"]["S_train"]}}
                 for d, o in SLANG.per_dataset.items()},
)


# ----------------------------------------------------------------------------- MC dropout

def _gal_code_lengthscale(p: float, code_lengthscale: float, tau_raw: float, tau_s: float) -> float:
    """The refbayes length-scale l whose inverted-dropout prior precision l^2 / (1 - p)
    (mc_dropout.4) is the weight decay of Gal's per-dataset code in the summed objective:
    lam_W = tau_s (1 - p) / (2 l_G^2 tau_raw)  (mc_dropout.9), so l = sqrt(lam_W (1 - p))."""
    lam_W = tau_s * (1.0 - p) / (2.0 * code_lengthscale ** 2 * tau_raw)  # (mc_dropout.9)
    return math.sqrt(lam_W * (1.0 - p))


def _dropout_fit(model, X, y, hyper, rng, epochs, M, progress):
    """MC dropout (refbayes.methods.mc_dropout) as Gal's per-dataset code trains it: Adam on the
    summed objective N tau_s / 2 times Keras' (mean squared error + reg ||W||^2), i.e. the prior
    precision (mc_dropout.9) on the weights, none on the biases, and eps_adam = (N tau_s / 2)
    eps (Adam is invariant to the objective's scale but for eps); masks from the driver."""
    N, p = X.shape[0], hyper["p"]
    tau_s = hyper["noise_precision"]
    ls = _gal_code_lengthscale(p, hyper["code_lengthscale"], hyper["noise_precision_raw"], tau_s)
    cfg = mc_dropout.MCDropoutConfig(N, p=p, lengthscale=ls, noise_precision=tau_s,
                                     alpha=hyper["lr"], beta1=hyper["adam_beta1"],
                                     beta2=hyper["adam_beta2"],
                                     eps_adam=N * tau_s / 2 * hyper["adam_eps"],
                                     inverted=True, decay_biases=False)
    return dropout_fit(model, X, y, cfg, rng, epochs, M, progress)


def _dropout_predict(post, model, X, rng, S):
    """S stochastic forward passes with fresh masks (mc_dropout.7), drawn as the driver does, in
    chunks of _FORWARD_CHUNK * 64 passes (10,000 passes at once would hold every mask)."""
    chunk = _FORWARD_CHUNK * 64
    F = [mc_dropout.predict_samples(
            post.state, X, [driver.draw_masks(rng, model, X.shape[0], post.cfg.p)
                            for _ in range(min(chunk, S - s0))], post.cfg, model)[:, :, 0]
         for s0 in range(0, S, chunk)]
    return np.concatenate(F), model.likelihood.noise_precision


# Gal's per-dataset (p, tau in raw units, l_G): <dataset>/net/net/net.py, "obtained from BO"
_GAL = {"boston": (0.05, 0.159707652696, 1e2), "concrete": (0.01, 0.0557319157756, 1e2),
        "energy": (0.05, 0.427114830213, 1e2), "kin8nm": (0.05, 192.482910156, 1e2),
        "naval": (0.05, 42173.5152106, 1e0), "power": (0.005, 0.0871109017617, 1e2),
        "protein": (0.005, 0.0644419184588, 1e2), "wine": (0.05, 2.95833720839, 1e2),
        "yacht": (0.01, 0.541869562034, 1e1)}

MC_DROPOUT = MethodSpec(
    name="mc_dropout",
    description="MC dropout (Gal and Ghahramani 2016): dropout on inputs and hidden units, "
                "the authors' per-dataset settings",
    grid={"noise_precision_raw": (_GAL["boston"][1],), "p": (_GAL["boston"][0],)},
    defaults={"epochs": 400, "M": 32, "S_test": 10_000, "lr": 1e-3, "adam_beta1": 0.9,
              "adam_beta2": 0.999, "adam_eps": 1e-8, "code_lengthscale": _GAL["boston"][2]},
    quick={"epochs": 5, "S_test": 10},
    fit=_dropout_fit,
    predict=_dropout_predict,
    per_dataset={d: {"grid": {"noise_precision_raw": (tau,), "p": (p,)},
                     "defaults": {"code_lengthscale": l_G, **({"epochs": 200} if d == "protein" else {})}}
                 for d, (p, tau, l_G) in _GAL.items()},
    ranges={"p": (0.0, 1.0, False, True), "code_lengthscale": (0.0, math.inf, True, True)},
)


# ----------------------------------------------------------------------------- Vadam

def _vadam_fit(model, X, y, hyper, rng, epochs, M, progress):
    """Vadam (refbayes.methods.vadam, Khan et al. Fig. 1) through the driver, as the official
    ``Vadam(lr, betas, prior_prec, prec_init=prior_prec, num_samples)``: one prior precision on
    every parameter, s_0 = 0, minibatch-mean squares, the square root, bias correction."""
    cfg = vadam.VadamConfig(X.shape[0], float(hyper["prior_precision"]), alpha=hyper["lr"],
                            beta1=hyper["adam_beta1"], beta2=hyper["adam_beta2"],
                            squares=hyper["squares"])
    state = vadam.init(model.init_theta(rng))  # s_0 = 0: prec_init = prior_prec
    state = train(state, cfg, model, X, y, rng, epochs, M, progress, S=hyper["S_train"])
    return Gaussian(lambda eps: vadam.sample(state, eps, cfg))


def _exp_grid(*logs):
    return tuple(float(f"{math.exp(v):.3g}") for v in logs)


_VADAM_NOISE = _exp_grid(0, 1.25, 2.5, 3.75, 5)      # official box log tau in (0, 5)
_VADAM_PRIOR = _exp_grid(-4, 0, 4)                   # official box log lam in (-4, 4)
_VADAM_LARGE = {"M": 128, "S_train": 5}              # kin8nm, naval, powerplant, wine
_VADAM_BOX_1_5 = {"noise_precision": _exp_grid(1, 2, 3, 4, 5),  # naval, powerplant
                  "prior_precision": _exp_grid(-3, 0.5, 4)}
VADAM = MethodSpec(
    name="vadam",
    description="Vadam (Khan et al. 2018), the official UCI settings (emtiyaz/vadam)",
    grid={"noise_precision": _VADAM_NOISE, "prior_precision": _VADAM_PRIOR},
    defaults={"epochs": 40, "M": 32, "S_test": 100, "S_train": 10, "lr": 0.01,
              "adam_beta1": 0.9, "adam_beta2": 0.99, "squares": "minibatch"},
    quick={"epochs": 5, "S_test": 10},
    fit=_vadam_fit,
    predict=_gaussian_predict,
    per_dataset={
        "kin8nm": {"defaults": _VADAM_LARGE},
        "naval": {"grid": _VADAM_BOX_1_5, "defaults": _VADAM_LARGE},
        "power": {"grid": _VADAM_BOX_1_5, "defaults": _VADAM_LARGE},
        "protein": {"defaults": _VADAM_LARGE},
        "wine": {"defaults": _VADAM_LARGE},
    },
)


# ----------------------------------------------------------------------------- Noisy Adam

def _noisy_adam_fit(model, X, y, hyper, rng, epochs, M, progress):
    """Noisy Adam (refbayes.methods.noisy_adam, Zhang et al. Algorithm 1) through the driver, in
    runs of ``lr_decay_every`` epochs; after each run alpha and the curvature weight 1 - beta2
    are multiplied by ``lr_decay_ratio``. The runs continue one stream of draws (the driver draws
    epoch by epoch), so the schedule changes no random number."""
    cfg = noisy_adam_config(hyper, X.shape[0])
    state = noisy_adam.init(model.init_theta(rng), float(hyper["f_init"]))
    step_cfg, done = cfg, 0
    while done < epochs:
        n = min(hyper["lr_decay_every"], epochs - done)
        state = train(state, step_cfg, model, X, y, rng, n, M, progress, S=hyper["S_train"])
        done += n
        step_cfg = _noisy_adam_decayed(step_cfg, hyper["lr_decay_ratio"])
    return Gaussian(lambda eps: noisy_adam.sample(state, eps, cfg))


def noisy_adam_config(hyper, N) -> noisy_adam.NoisyAdamConfig:
    """The NoisyAdamConfig of ``hyper`` (the spec's settings) for N training rows, before the
    schedule."""
    return noisy_adam.NoisyAdamConfig(
        N, float(hyper["prior_precision"]), alpha=hyper["lr"], beta1=hyper["momentum"],
        beta2=hyper["beta2"], kl_weight=hyper["kl_weight"], gamma_ex=hyper["damping"],
        squares=hyper["squares"])


def _noisy_adam_decayed(cfg, ratio):
    """The schedule's decay: alpha and the curvature weight 1 - beta2 times ``ratio``."""
    return cfg._replace(alpha=cfg.alpha * ratio, beta2=1.0 - (1.0 - cfg.beta2) * ratio)


# ----------------------------------------------------------------------------- learned noise

def gamma_config(hyper, N) -> noise_gamma.NoiseGammaConfig:
    """The NoiseGammaConfig of ``hyper``: prior Gamma(noise_a0, noise_b0), Adam step size
    noise_lr, KL weight kl_weight, N training rows."""
    return noise_gamma.NoiseGammaConfig(N, a0=hyper["noise_a0"], b0=hyper["noise_b0"],
                                        kl_weight=hyper["kl_weight"], lr=hyper["noise_lr"])


def residual_r2(F, y) -> float:
    """r2 = (1 / (S M)) sum_s sum_i (y_i - F[s, i])^2, F (S, M) the outputs at the step's draws.
    (noise_gamma.3)"""
    return float(np.mean((y[None, :] - F) ** 2))  # (noise_gamma.3)


class _Learned(NamedTuple):
    """A trained posterior with a learned noise: sample(eps (D, S)) -> (D, S) and q(tau)."""
    sample: Callable
    q: noise_gamma.NoiseGammaState


def _learned_predict(post, model, X, rng, S):
    """S draws theta_s of q(w), eps (D, S) from rng, then tau = noise_gamma.draw(q, rng, S):
    F[s] = f(X; theta_s) with its own precision tau_s (one per draw, as the official test)."""
    eps = rng.standard_normal((model.D, S))
    F = _forward_rows(model, post.sample(eps), X)
    return F, noise_gamma.draw(post.q, rng, S)


def _noisy_adam_learned_fit(model, X, y, hyper, rng, epochs, M, progress):
    """Noisy Adam with the learned noise precision q(tau) (refbayes.methods.noise_gamma): the
    settings and schedule of ``_noisy_adam_fit``, with the draws in this order: the mean
    (model.init_theta(rng)); per epoch rng.permutation(N) (driver.epoch_batches); per step
    eps = rng.standard_normal((D, S)), then tau = noise_gamma.draw(q, rng, S). The step takes
    the draws' precisions, then q one noise_gamma.step at the residual of the step's draws
    w (its info.w). The model's noise precision must be 1. Checks as ``kfac_train``."""
    N, S = driver.check_data(model, X, y, X.dtype), hyper["S_train"]
    cfg = noisy_adam_config(hyper, N)
    state = noisy_adam.init(model.init_theta(rng), float(hyper["f_init"]))
    q, q_cfg = noise_gamma.init(), gamma_config(hyper, N)
    step_cfg = cfg
    for epoch in range(1, epochs + 1):
        for idx in driver.epoch_batches(rng, N, M):
            batch = Batch(X[idx], y[idx])
            eps = rng.standard_normal((model.D, S))
            tau = noise_gamma.draw(q, rng, S)
            state, info = driver.guarded_step(state.t + 1, epoch, lambda: noisy_adam.step(
                state, batch, eps, step_cfg, model, noise_precisions=tau), checked=state.t == 0)
            q, _ = noise_gamma.step(q, residual_r2(_forward_rows(model, info.w, batch.X),
                                                   batch.y), q_cfg)
            driver.check_finite_state(state, state.t, epoch)
        progress(1)
        if epoch % hyper["lr_decay_every"] == 0:
            step_cfg = _noisy_adam_decayed(step_cfg, hyper["lr_decay_ratio"])
    return _Learned(lambda eps: noisy_adam.sample(state, eps, cfg), q)


def _widened(candidates, steps=2):
    """``candidates`` (log-spaced, low to high) and ``steps`` more of their log step each side."""
    lo, hi = candidates[0], candidates[-1]
    r = (hi / lo) ** (1.0 / (len(candidates) - 1))
    return (tuple(float(f"{lo * r ** -k:.3g}") for k in range(steps, 0, -1)) + tuple(candidates)
            + tuple(float(f"{hi * r ** k:.3g}") for k in range(1, steps + 1)))


NOISY_ADAM = MethodSpec(
    name="noisy_adam",
    description="Noisy Adam (Zhang et al. 2018), the regression settings of the authors' code",
    grid={"noise_precision": _widened(SLANG.grid["noise_precision"])},
    defaults={"epochs": 1000, "M": 10, "S_test": 100, "S_train": 10, "lr": 0.01,
              "momentum": 0.9, "beta2": 0.999, "kl_weight": 1.0, "prior_precision": 1.0,
              "damping": 0.0, "f_init": 1.0, "squares": "per_example", "lr_decay_every": 500,
              "lr_decay_ratio": 0.1},
    quick={"epochs": 5, "S_test": 10},
    fit=_noisy_adam_fit,
    predict=_gaussian_predict,
    per_dataset={d: {"grid": {"noise_precision": _widened(o["grid"]["noise_precision"])},
                     "defaults": {"M": 100} if d in ("kin8nm", "naval", "power", "protein") else {}}
                 for d, o in SLANG.per_dataset.items()},
    ranges={"beta2": (0.0, 1.0, False, True), "kl_weight": (0.0, math.inf, True, True),
            "damping": (0.0, math.inf, False, True), "f_init": (0.0, math.inf, False, True),
            "lr_decay_ratio": (0.0, 1.0, True, False)},
)


# ----------------------------------------------------------------------------- Noisy K-FAC, K-FAC

def kfac_config(hyper, N) -> noisy_kfac.NoisyKFACConfig:
    """The NoisyKFACConfig of ``hyper`` (the spec's settings) for N training rows, before the
    schedule: alpha = lr (1 - momentum) (the bias-corrected step of ``kfac_train`` at large t),
    gamma_ex = damping, factored damping, sampled-label ("mc") curvature, kl_clip as given
    (None, no clipping, when hyper has no kl_clip)."""
    return noisy_kfac.NoisyKFACConfig(
        N, eta=float(hyper["eta"]), kl_weight=float(hyper["kl_weight"]),
        alpha=hyper["lr"] * (1.0 - hyper["momentum"]), beta=hyper["beta"],
        momentum=hyper["momentum"], gamma_ex=float(hyper["damping"]), T_stats=hyper["T_stats"],
        T_inv=hyper["T_inv"], damping="factored", curvature="mc", kl_clip=hyper.get("kl_clip"))


def kfac_step_size(hyper, t, lr):
    """The step size alpha_t of step t (1-based) for the official step size ``lr``.

    lr (1 - mu_m) / (1 - mu_m^t) with ``hyper["bias_correction"]``, lr (1 - mu_m) without
    (mu_m = ``hyper["momentum"]``). With it, refbayes' heavy-ball momentum m_t = mu_m m_{t-1}
    + P_t, mu_t = mu_{t-1} - alpha_t m_t is the official bias-corrected average
    mu_t = mu_{t-1} - lr P (v_t / c_t), v_t = mu_m v_{t-1} + (1 - mu_m) V_t,
    c_t = 1 - mu_m^t, whenever the preconditioner P is the same over the steps averaged."""
    mom = hyper["momentum"]
    if hyper["bias_correction"] and mom > 0:
        return lr * (1.0 - mom) / (1.0 - mom ** t)
    return lr * (1.0 - mom)


def kfac_train(model, X, y, hyper, rng, epochs, M, progress, noisy=True, learned=False):
    """Noisy K-FAC (``noisy=True``) or K-FAC (``noisy=False``: eps = None, the step at the mean)
    on (X, y) for ``epochs`` epochs; returns (state, cfg, q), q the learned noise precision's
    NoiseGammaState (``learned=True``) or None.

    Every random number comes from ``rng``, in this order:
      per epoch: perm = rng.permutation(N), batches perm[0:M], perm[M:2M], ...
                 (driver.epoch_batches; the last one may be shorter);
      per step:  eps = rng.standard_normal((D, S)) (Noisy K-FAC only, S = S_train), then
                 with ``learned`` tau = noise_gamma.draw(q, rng, S) (else tau_s = the model's
                 noise precision), then z = rng.standard_normal((S, M_b)) (S = 1 for K-FAC);
                 w = noisy_kfac.sample(state, eps, cfg, model) (the step's own draws; w = mu
                 for K-FAC), y_tilde[s] = f(X_B; w_s) + z[s] / sqrt(tau_s): labels from the
                 model's predictive N(f(x; w_s), 1 / tau_s), for curvature "mc".
    The mean starts at model.init_theta(rng) (drawn first), the factors A_l at I and S_l at
    tau I (``factor_init="tau"``) or I (``"identity"``). The step size of step t is
    ``kfac_step_size`` (bias-corrected momentum); after every ``lr_decay_every`` epochs, lr and
    beta are multiplied by ``lr_decay_ratio``. With ``learned`` (the model's noise precision
    must be 1) the step takes the draws' precisions (``tau``), and q then takes one
    ``noise_gamma.step`` at the mean squared residual of that step's draws (noise_gamma.3).
    As in ``driver.run``, X and y are checked whole once, the first step checks its inputs and
    the rest run inside ``refbayes.unchecked()``.
    """
    N = driver.check_data(model, X, y, X.dtype)
    cfg0 = kfac_config(hyper, N)
    tau = float(model.likelihood.noise_precision)
    q, q_cfg = (noise_gamma.init(), gamma_config(hyper, N)) if learned else (None, None)
    state = noisy_kfac.init(model.init_theta(rng), model)
    if hyper["factor_init"] == "tau":  # S_l = tau I: the official I at its initial tau ~ 1
        S0 = tuple(tau * F for F in state.S)
        state = state._replace(S=S0, S_ref=S0)
    S = hyper["S_train"] if noisy else 1
    lr, beta, ratio = hyper["lr"], hyper["beta"], hyper["lr_decay_ratio"]
    for epoch in range(1, epochs + 1):
        cfg = cfg0._replace(beta=beta)
        for idx in driver.epoch_batches(rng, N, M):
            batch = Batch(X[idx], y[idx])
            t = state.t + 1
            cfg = cfg._replace(alpha=kfac_step_size(hyper, t, lr))
            eps = rng.standard_normal((model.D, S)) if noisy else None
            tau_s = noise_gamma.draw(q, rng, S) if learned else np.full(S, tau)
            z = rng.standard_normal((S, len(idx)))

            def take_step():
                W = noisy_kfac.sample(state, eps, cfg, model) if noisy else state.mu[:, None]
                F = _forward_rows(model, W, batch.X)
                y_tilde = F + z / np.sqrt(tau_s)[:, None]
                new, _ = noisy_kfac.step(state, batch, eps, cfg, model, y_tilde=y_tilde,
                                         noise_precisions=tau_s if learned else None)
                return new, F
            state, F = driver.guarded_step(t, epoch, take_step, checked=t == 1)
            if learned:
                q, _ = noise_gamma.step(q, residual_r2(F, batch.y), q_cfg)
            driver.check_finite_state(state, t, epoch)
        progress(1)
        if epoch % hyper["lr_decay_every"] == 0:
            lr, beta = lr * ratio, beta * ratio
    return state, cfg0, q


def _noisy_kfac_fit(model, X, y, hyper, rng, epochs, M, progress):
    """Noisy K-FAC (refbayes.methods.noisy_kfac, Zhang et al. Algorithm 2) by ``kfac_train``;
    the posterior samples the layerwise matrix-variate normal of the final factors."""
    state, cfg, _ = kfac_train(model, X, y, hyper, rng, epochs, M, progress, noisy=True)
    return Gaussian(lambda eps: noisy_kfac.sample(state, eps, cfg, model))


def _kfac_fit(model, X, y, hyper, rng, epochs, M, progress):
    """K-FAC (the Noisy K-FAC step at the mean, eps = None) by ``kfac_train``; returns the
    mean: the MAP estimate under the prior N(0, eta I), whose weight decay is gamma_in."""
    return kfac_train(model, X, y, hyper, rng, epochs, M, progress, noisy=False)[0].mu


_NNG_LARGE = ("kin8nm", "naval", "power", "protein")  # minibatch 100 in the official configs
_KFAC_RANGES = {"eta": (0.0, math.inf, True, True), "kl_weight": (0.0, math.inf, True, True),
                "damping": (0.0, math.inf, False, True), "kl_clip": (0.0, math.inf, True, True),
                "lr_decay_ratio": (0.0, 1.0, True, False)}
NOISY_KFAC = MethodSpec(
    name="noisy_kfac",
    description="Noisy K-FAC (Zhang et al. 2018), the regression settings of the authors' code",
    grid=NOISY_ADAM.grid,
    defaults={"epochs": 1000, "M": 10, "S_test": 100, "S_train": 10, "lr": 0.01,
              "momentum": 0.9, "bias_correction": True, "beta": 1e-3, "kl_weight": 1.0,
              "eta": 1.0, "damping": 0.0, "T_stats": 1, "T_inv": 1, "factor_init": "tau",
              "lr_decay_every": 500, "lr_decay_ratio": 0.1},  # no kl_clip: no clipping
    quick={"epochs": 5, "S_test": 10},
    fit=_noisy_kfac_fit,
    predict=_gaussian_predict,
    per_dataset={d: {"grid": o["grid"], "defaults": {"M": 100} if d in _NNG_LARGE else {}}
                 for d, o in NOISY_ADAM.per_dataset.items()},
    ranges=_KFAC_RANGES,
)

# The learned noise precision (noise_gamma): the official regression code's protocol. One
# training run per split (a one-point grid: the model's unit precision, which the draws of q
# replace), no validation phase; the official q settings.
_LEARNED_NOISE = {"noise_lr": 1e-3, "noise_a0": 6.0, "noise_b0": 6.0}
_LEARNED_RANGES = {k: (0.0, math.inf, True, True) for k in _LEARNED_NOISE}


def _learned_noise(spec: MethodSpec, fit, description: str) -> MethodSpec:
    """``spec`` with the learned noise precision: its settings, per-dataset minibatches and
    ranges, the grid (1.0,) and the given fit."""
    return spec._replace(
        name=f"{spec.name}_learned_noise", description=description,
        grid={"noise_precision": (1.0,)}, defaults={**spec.defaults, **_LEARNED_NOISE},
        fit=fit, predict=_learned_predict,
        per_dataset={d: {"defaults": o["defaults"]} for d, o in spec.per_dataset.items()
                     if o.get("defaults")},
        ranges={**spec.ranges, **_LEARNED_RANGES}, published_as=spec.name)


def _noisy_kfac_learned_fit(model, X, y, hyper, rng, epochs, M, progress):
    """Noisy K-FAC with the learned noise precision q(tau) (refbayes.methods.noise_gamma), by
    ``kfac_train(learned=True)``; the model's noise precision must be 1."""
    state, cfg, q = kfac_train(model, X, y, hyper, rng, epochs, M, progress, noisy=True,
                               learned=True)
    return _Learned(lambda eps: noisy_kfac.sample(state, eps, cfg, model), q)


NOISY_ADAM_LEARNED_NOISE = _learned_noise(
    NOISY_ADAM, _noisy_adam_learned_fit,
    "Noisy Adam (Zhang et al. 2018) with the learned Gamma noise precision of the authors' code")
NOISY_KFAC_LEARNED_NOISE = _learned_noise(
    NOISY_KFAC, _noisy_kfac_learned_fit,
    "Noisy K-FAC (Zhang et al. 2018) with the learned Gamma noise precision of the authors' code")

KFAC = MethodSpec(
    name="kfac",
    description="K-FAC (Martens and Grosse 2015) to the MAP estimate, Noisy K-FAC's settings",
    grid=NOISY_KFAC.grid,
    defaults={k: v for k, v in NOISY_KFAC.defaults.items() if k != "S_train"}
    | {"S_test": 1, "damping": 1e-3, "kl_clip": 1e-3},  # the authors' K-FAC safeguards
    quick={"epochs": 5},
    fit=_kfac_fit,
    predict=_map_predict,
    per_dataset=NOISY_KFAC.per_dataset,
    ranges=_KFAC_RANGES,
)


METHODS: dict[str, MethodSpec] = {"slang": SLANG, "slang_official_code": SLANG_OFFICIAL_CODE,
                                  "map": MAP, "bbb": BBB, "vogn": VOGN,
                                  "mc_dropout": MC_DROPOUT, "vadam": VADAM,
                                  "noisy_adam": NOISY_ADAM, "noisy_kfac": NOISY_KFAC,
                                  "noisy_adam_learned_noise": NOISY_ADAM_LEARNED_NOISE,
                                  "noisy_kfac_learned_noise": NOISY_KFAC_LEARNED_NOISE,
                                  "kfac": KFAC}
