"""The method record and the fits that the UCI and calibration benchmarks share.

Both registries (``uci_methods.METHODS``, ``calibration_methods.METHODS``) hold
:class:`MethodSpec` entries; each benchmark reads the fields its protocol uses (see the
registry modules' docstrings for the contracts of ``fit`` and ``predict`` there). The fits here
take their hyperparameters from a plain ``hyper`` dict and the prior precision ``lam`` (a
scalar, or a vector in theta's layout) from the caller, draw every random number from ``rng``
(the initial weights first, then the driver's minibatches and noise, as ``driver.run`` draws
them), call ``progress(1)`` once per finished epoch, and return a posterior the registry's
``predict`` reads: :class:`Gaussian` (a sampler) or :class:`Dropout` (the trained weights and the
configuration their masks need). They raise ``refbayes.methods.driver.TrainingError`` when
training produces non-finite values.

The MAP baselines are not shared: UCI's is Adam on the MAP objective (the SLANG repository's
baseline), calibration's is momentum SGD under the SWAG paper's schedule; both train through
:func:`train`.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

import numpy as np

from refbayes.methods import adam, bbb, driver, mc_dropout, vogn

__all__ = ["Dropout", "Gaussian", "MethodSpec", "adam_config", "bbb_fit", "dropout_fit", "train",
           "vogn_fit"]


class MethodSpec(NamedTuple):
    """One method of a benchmark's registry.

    Every benchmark: ``name``, ``description``, ``defaults`` (epochs, M and the method's fixed
    settings), ``quick`` (--quick overrides of defaults), ``fit`` and ``predict`` (signatures per
    benchmark). UCI only: ``grid`` (hyperparameter -> candidates), ``per_dataset`` (dataset ->
    {"grid": ..., "defaults": ...}), ``ranges`` (extra hyperparameter ranges),
    ``published_as`` (the method name of the published rows it reproduces). Calibration only:
    ``point`` (a point estimate: one network, S not used), ``train`` (the training run's name
    shared by specs that read one fit; "" means the method's own), ``constants`` (prediction
    settings fixed in code), ``report`` (report(posterior, model) -> dict: what the prediction
    found, recorded under "found"; None records nothing).
    """
    name: str
    description: str
    defaults: dict
    quick: dict
    fit: Callable[..., Any]
    predict: Callable[..., Any]
    grid: Mapping = MappingProxyType({})
    per_dataset: Mapping = MappingProxyType({})
    ranges: Mapping = MappingProxyType({})
    published_as: str | None = None
    point: bool = False
    train: str = ""
    constants: Mapping = MappingProxyType({})
    report: Callable[..., dict] | None = None


class Gaussian(NamedTuple):
    """A trained Gaussian posterior and how to draw from it: sample(eps (D, S)) -> (D, S)."""
    sample: Callable


class Dropout(NamedTuple):
    """A network trained with dropout: the driver's state and the MCDropoutConfig of its masks."""
    state: Any
    cfg: Any


def train(state, cfg, model, X, y, rng, epochs: int, M: int, progress, S: int = 1):
    """``driver.run`` for ``epochs`` epochs of minibatches of ``M`` rows and ``S`` draws per
    step, ``progress(1)`` after each epoch; returns the final state."""
    return driver.run(state, cfg, model, X, y, rng=rng, epochs=epochs, M=M, S=S,
                      callback=lambda epoch, st: progress(1))


def adam_config(hyper: dict, N: int) -> adam.AdamConfig:
    """AdamConfig of the per-example-scaled objective F / N, run on the summed F: Adam's step is
    invariant to a constant scale of the objective except through eps, so eps_adam = N eps
    (``lr``, ``adam_beta1``, ``adam_beta2``, ``adam_eps`` from ``hyper``)."""
    return adam.AdamConfig(alpha=hyper["lr"], beta1=hyper["adam_beta1"],
                           beta2=hyper["adam_beta2"], eps_adam=N * hyper["adam_eps"])


def bbb_fit(model, X, y, lam, hyper, rng, epochs, M, progress, **init) -> Gaussian:
    """Bayes-by-Backprop (refbayes.methods.bbb): Adam (:func:`adam_config`) on (mu, rho) of the
    negative ELBO with prior precision ``lam``, ``hyper["S_train"]`` draws per step; mu_0 from
    ``model.init_theta(rng)``, the initial scale from ``init`` (``sigma0=`` or ``rho0=`` of
    ``bbb.init``)."""
    N = X.shape[0]
    a = adam_config(hyper, N)
    cfg = bbb.BBBConfig(N, lam, alpha=a.alpha, beta1=a.beta1, beta2=a.beta2, eps_adam=a.eps_adam)
    state = bbb.init(model.init_theta(rng), **init)
    state = train(state, cfg, model, X, y, rng, epochs, M, progress, S=hyper["S_train"])
    return Gaussian(lambda eps: bbb.sample(state, eps))


def vogn_fit(model, X, y, lam, hyper, rng, epochs, M, progress, *, beta2: float,
             s0: float) -> Gaussian:
    """VOGN (refbayes.methods.vogn, Osawa et al. Algorithm 1 at tau = rho = 1, gamma = 0) with
    squared per-example gradients (curvature "ef"), prior precision ``lam``, step
    ``hyper["lr"]``, momentum ``hyper["momentum"]``, ``beta2``, ``hyper["S_train"]`` draws per
    step; s_0 = ``s0`` everywhere, mu_0 from ``model.init_theta(rng)``."""
    N = X.shape[0]
    cfg = vogn.VOGNConfig(N, lam, alpha=hyper["lr"], beta1=hyper["momentum"], beta2=beta2,
                          curvature="ef")
    state = vogn.init(model.init_theta(rng), np.full(model.D, s0))
    state = train(state, cfg, model, X, y, rng, epochs, M, progress, S=hyper["S_train"])
    return Gaussian(lambda eps: vogn.sample(state, eps, cfg))


def dropout_fit(model, X, y, cfg, rng, epochs, M, progress) -> Dropout:
    """MC dropout (refbayes.methods.mc_dropout) under ``cfg`` (an MCDropoutConfig: its Adam,
    drop probability and prior), masks drawn by the driver; theta_0 from
    ``model.init_theta(rng)``."""
    state = train(mc_dropout.init(model.init_theta(rng)), cfg, model, X, y, rng, epochs, M,
                  progress)
    return Dropout(state, cfg)
