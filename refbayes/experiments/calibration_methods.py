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
  True, which ignores S and draws nothing). The Laplace methods average the softmax of the
  network linearized at the MAP, f_lin(X; theta_s) (laplace.7): their GLM predictive.
- ``train``: the name of the training run. Specs with the same ``train`` and the same resolved
  ``defaults`` share one fit: the runner seeds the training generator by ``train``, not by the
  method's name, so the fit is the same whichever of them runs it, and it trains once per
  (dataset, task, seed) for all of them in one invocation (SWA, SWAG-Diagonal and SWAG read one
  SGD run; map, laplace-kron and laplace-ll another). Specs that share a run share its ``fit``
  too (the first of them to run trains it for all): whatever differs is in ``predict`` and
  ``constants``.
- ``constants``: settings of the prediction that are fixed in code (SWAG's scale), recorded in
  the result files beside ``defaults``.
- ``report(posterior, model) -> dict``, optional: what the prediction found and the result
  files record under "found" (the evidence-tuned prior precision of the "-ev" Laplace methods).

Registered: "map", "swa", "swag-diag", "swag", "bbb", "mc_dropout", "vogn", "laplace-kron",
"laplace-ll", "laplace-kron-ev", "laplace-ll-ev", "ktied", "noisy-kfac". A new method is one more ``MethodSpec`` in ``METHODS``; the
registry tests (tests/experiments/test_calibration.py) are parametrized over it, and
``refbayes reproduce calibration --method all`` runs it.

The settings and the reasons for them are in derivations/calibration_experiment.md. In short:

- map: the SWAG paper's SGD baseline: momentum 0.9, the official piecewise-linear schedule
  (swag.12) from lr 0.05 down to 0.01 lr (alpha_swa = 0.0005 at swa_start = epochs), weight
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
- laplace-kron / laplace-ll: map's SGD run (train "map", map's settings), then the state of
  ``laplace.fit`` at its endpoint on all training rows (``laplace_state``: the curvature summed
  over chunks of CURVATURE_ROWS rows), GGN curvature, prior precision lam (no tuning), no
  stationarity check: K-FAC blocks over every layer ("kron", subset "all") or
  the dense last-layer block ("full", "last_layer"). Predictive: the GLM predictive by Monte
  Carlo over theta: S draws theta_s = laplace.sample(state, eps), eps (D_q, S) from rng, the
  BMA of softmax(f_lin(X; theta_s)) (``linearized_bma``); the state is fitted once per job
  (cached in the posterior), inside the predict time.
- laplace-kron-ev / laplace-ll-ev: the same states with one scalar prior precision tuned by the
  Laplace evidence (``laplace.optimize_prior_precision``, L-BFGS-B from lam to convergence; the
  curvature is kept, only the prior moves): Laplace Redux's post-hoc practice, recorded under
  "found" with log Z there.
- ktied: the k-tied Normal with k = 2 on every layer, trained exactly as bbb (Adam lr 1e-3,
  one draw per step, sigma_0 = 1e-3: U_l V_l^T = 1e-3, rho jittered by 0.1 xi (ktied.8)).
- noisy-kfac: Noisy K-FAC, the authors' classification config (gd-zhang/noisy-K-FAC
  kfac_plain.json): lr 1e-2 with plain momentum 0.9, factor EMA weight beta = 0.01, mean
  damping 1e-3 (gamma_in + gamma_ex), KL clipping 1e-3, one draw per step; the shared prior
  (eta = 1 / lam, kl_weight 1, not the config's tempered 0.5 / 0.1), GGN factors (the expected
  Fisher the official one-sampled-label estimator estimates), statistics every step and a
  refresh every 10 steps (the official 10 / 200 were sized for 58,500 CIFAR steps).
"""
from __future__ import annotations

import functools
import math
from types import MappingProxyType
from typing import Any, NamedTuple

import numpy as np
from scipy.special import softmax

from refbayes.experiments._fits import (
    Gaussian,
    MethodSpec,
    adam_config,
    bbb_fit,
    dropout_fit,
    train,
    vogn_fit,
)
from refbayes.methods import driver, ktied, laplace, mc_dropout, noisy_kfac, swag

__all__ = ["CURVATURE_ROWS", "METHODS", "MethodSpec", "TrainingError", "bma_probs",
           "kfac_config", "laplace_state", "linearized_bma", "resolve"]

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
    """Momentum SGD (swag.10)-(swag.11) under the official schedule (swag.12), one driver call per
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


class _MAPFit(NamedTuple):
    """The SGD endpoint theta, and what a Laplace approximation at it reads: the training rows
    (X, y) and the prior precision lam. ``laplace`` holds the Laplace states fitted at theta so
    far, keyed by their LaplaceConfig (filled by ``_laplace_state``: a job's test and OOD
    predictions fit once; a fit draws nothing, so the cache does not change any number)."""
    theta: np.ndarray
    X: np.ndarray
    y: np.ndarray
    lam: float
    laplace: dict


def _map_fit(model, X, y, hyper, rng, progress):
    """The SGD baseline: the schedule with swa_start = epochs, decaying to lr_ratio * lr; the
    posterior of map, laplace-kron and laplace-ll (one training run, train "map")."""
    N = X.shape[0]
    theta = _sgd(model, X, y, hyper, rng, progress, swa_start=hyper["epochs"],
                 alpha_swa=hyper["lr_ratio"] * hyper["lr"] / N).theta
    return _MAPFit(theta, X, y, float(hyper["prior_precision"]), {})


def _point_predict(post, model, X, rng, S):
    """softmax(f(X; theta)) of the SGD endpoint (S is not used, nothing is drawn)."""
    return bma_probs(model, post.theta[:, None], X)


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


# ----------------------------------------------------------------------------- Laplace

CURVATURE_ROWS = 1000  # rows per laplace.curvature call: bounds its (rows, C, D_q) Jacobians


def laplace_state(model, theta, X, y, cfg, rows: int = CURVATURE_ROWS):
    """The state of ``laplace.fit(model, theta, X, y, cfg, check_stationary=False)`` (structure
    "full" or "kron"), its curvature taken over ``rows`` rows at a time (``laplace.curvature``):
    the GGN is a sum over rows (laplace.2), so the chunks' H add, and a K-FAC block's B_l adds
    while its A_l is a mean over rows, so the chunks' A_l are averaged with weights n_c / N
    (laplace.18); then Sigma_inv = H + lam I, symmetrized (laplace.3), or the blocks with delta_l
    = lam. Equal to laplace.fit's state up to rounding, without its (N, C, D_q) Jacobians (9.6 GB
    for the last-layer GGN of full MNIST). No stationarity check: SGD's endpoint is not an exact
    minimum, and the approximation is taken there all the same (laplace-torch's post-hoc use)."""
    if cfg.structure not in ("full", "kron"):
        raise ValueError(f"cfg.structure: expected 'full' or 'kron', got {cfg.structure!r}")
    N = X.shape[0]
    parts = [(min(rows, N - i), laplace.curvature(model, theta, X[i:i + rows], y[i:i + rows], cfg))
             for i in range(0, N, rows)]
    if cfg.structure == "kron":
        blocks = tuple(laplace.KronBlock(sum(n * p[l].A for n, p in parts) / N,
                                         sum(p[l].B for _, p in parts))
                       for l in range(len(parts[0][1])))
        Dq = sum(b.A.shape[0] * b.B.shape[0] for b in blocks)
        return laplace.LaplaceState(theta, None, None, np.full(Dq, float(cfg.prior_precision)),
                                    blocks, model.D - Dq)
    H = sum(p for _, p in parts)
    delta = np.full(H.shape[0], float(cfg.prior_precision))
    Sigma_inv = H + np.diag(delta)
    return laplace.LaplaceState(theta, 0.5 * (Sigma_inv + Sigma_inv.T), None, delta, None,
                                model.D - H.shape[0])


def _laplace_state(post: _MAPFit, cfg, model):
    """``laplace_state`` of ``cfg`` at the SGD endpoint post.theta on the training rows, cached
    in post.laplace."""
    if cfg not in post.laplace:
        post.laplace[cfg] = laplace_state(model, post.theta, post.X, post.y, cfg)
    return post.laplace[cfg]


def linearized_bma(model, theta_map, thetas, X) -> np.ndarray:
    """(1/S) sum_s softmax(f_lin(X; theta_s)) over the columns of thetas (D, S), with the
    network linearized at theta_map: f_lin(x; theta) = f(x; theta_map) + J(x)(theta -
    theta_map) (laplace.7), J(x)(theta_s - theta_map) by one Jacobian-vector product per draw
    (``model.jvp``, (peg.22)). Equal to the softmax of ``laplace.linearized_outputs`` without
    its (n, C, D) Jacobian; (n, C)."""
    thetas = np.asarray(thetas)
    f0 = model.forward(theta_map, X)
    P = np.zeros(f0.shape)
    for s in range(thetas.shape[1]):
        v = np.ascontiguousarray(thetas[:, s] - theta_map)
        P += softmax(f0 + model.jvp(theta_map, v, X), axis=1)
    return P / thetas.shape[1]


def _evidence_tuned(post: _MAPFit, cfg, model):
    """(state, info) of ``laplace.optimize_prior_precision`` on ``_laplace_state(post, cfg)``:
    one scalar prior precision maximising the Laplace evidence (laplace.6), (laplace.17) by
    L-BFGS-B from lam, mu and the curvature held fixed (Laplace Redux's post-hoc "marglik"
    tuning, run to convergence); cached in post.laplace under ("evidence", cfg)."""
    key = ("evidence", cfg)
    if key not in post.laplace:
        post.laplace[key] = laplace.optimize_prior_precision(
            model, _laplace_state(post, cfg, model), post.X, post.y, cfg, method="lbfgs",
            prior_structure="scalar", init_prior_prec=post.lam)
    return post.laplace[key]


def _laplace_cfg(post: _MAPFit, structure: str, subset: str):
    return laplace.LaplaceConfig(prior_precision=post.lam, structure=structure, curvature="ggn",
                                 subset=subset)


def _glm_sampler(structure: str, subset: str, tuned: bool = False):
    def predict(post, model, X, rng, S):
        cfg = _laplace_cfg(post, structure, subset)
        state = (_evidence_tuned(post, cfg, model)[0] if tuned
                 else _laplace_state(post, cfg, model))
        eps = rng.standard_normal((model.D - state.n_fixed, S))
        return linearized_bma(model, post.theta, laplace.sample(state, eps), X)  # (laplace.4)
    prior = ("the scalar prior precision that maximises the evidence (``_evidence_tuned``)"
             if tuned else "prior precision lam")
    predict.__doc__ = (f"The GLM predictive of the {structure} GGN Laplace approximation "
                       f"(subset {subset!r}, {prior}) at the SGD endpoint, by Monte "
                       "Carlo: eps (D_q, S) from rng, theta_s = laplace.sample(state, eps), the "
                       "BMA of the softmax of the network linearized at theta (laplace.7).")
    return predict


def _evidence_report(structure: str, subset: str):
    def report(post, model):
        cfg = _laplace_cfg(post, structure, subset)
        info = _evidence_tuned(post, cfg, model)[1]
        g = laplace.log_marginal_likelihood_grad(model, _laplace_state(post, cfg, model), post.X,
                                                 post.y, cfg, prior_precision=info.prior_precision)
        return {"prior_precision": float(info.prior_precision),
                "log_marglik": float(info.log_marglik), "converged": bool(info.converged),
                "evaluations": int(info.trace_log_marglik.shape[0]),
                "dlogZ_dlog_prior_precision": float(np.sum(g.grad_log_prior_prec))}
    report.__doc__ = ("The evidence-tuned prior precision of the predictive, log Z there, "
                      "L-BFGS-B's convergence flag, its number of evidence evaluations, and "
                      "d log Z / d log delta at the result (laplace.11), summed over the entries "
                      "(zero at the maximum).")
    return report


# ----------------------------------------------------------------------------- k-tied Normal

def _ktied_fit(model, X, y, hyper, rng, progress):
    """The k-tied Normal (refbayes.methods.ktied), trained as ``_bbb_fit``: Adam
    (``_fits.adam_config``) on (mu, rho) of the negative ELBO with prior precision lam,
    S_train draws per step. Draws: mu_0 = model.init_theta(rng), then xi (P,) for the start's
    jitter (ktied.8): U_l V_l^T = sigma_init everywhere, rho perturbed by jitter * xi; then the
    driver's minibatches and eps."""
    N = X.shape[0]
    a = adam_config(hyper, N)
    cfg = ktied.KTiedConfig(N, hyper["prior_precision"], alpha=a.alpha, beta1=a.beta1,
                            beta2=a.beta2, eps_adam=a.eps_adam)
    mu0 = model.init_theta(rng)
    xi = rng.standard_normal(ktied.layout(model, hyper["k"]).P)
    state = ktied.init(mu0, model, hyper["k"], hyper["sigma_init"], xi, hyper["jitter"])
    state = train(state, cfg, model, X, y, rng, hyper["epochs"], min(hyper["M"], N), progress,
                  S=hyper["S_train"])
    return Gaussian(lambda eps: ktied.sample(state, eps, model))


# ----------------------------------------------------------------------------- Noisy K-FAC

def kfac_config(hyper, N: int) -> noisy_kfac.NoisyKFACConfig:
    """The NoisyKFACConfig of ``hyper`` for N training rows: the shared prior N(0, I / lam) as
    the prior variance eta = 1 / lam, kl_weight, step alpha = lr (plain momentum, no bias
    correction: the classification code's), beta, momentum, T_stats, T_inv, kl_clip, factored
    damping, GGN output factors; gamma_ex = max(0, damping - gamma_in), gamma_in =
    kl_weight lam / N, so the mean's preconditioner is damped by the official ``damping``
    (noisy_kfac.md, C3)."""
    lam, kl = float(hyper["prior_precision"]), float(hyper["kl_weight"])
    return noisy_kfac.NoisyKFACConfig(
        N, eta=1.0 / lam, kl_weight=kl, alpha=hyper["lr"], beta=hyper["beta"],
        momentum=hyper["momentum"], gamma_ex=max(0.0, hyper["damping"] - kl * lam / N),
        T_stats=hyper["T_stats"], T_inv=hyper["T_inv"], damping="factored", curvature="ggn",
        kl_clip=hyper["kl_clip"])


def _noisy_kfac_fit(model, X, y, hyper, rng, progress):
    """Noisy K-FAC (refbayes.methods.noisy_kfac, Zhang et al. Algorithm 2) under
    ``kfac_config``, factors starting at I. Draws, as ``driver.run`` orders them: mu_0 =
    model.init_theta(rng); per epoch rng.permutation(N) cut into minibatches of M
    (``driver.epoch_batches``); per step eps = rng.standard_normal((D, S_train)). The data are
    checked once, the first step checks its inputs, the rest run unchecked; returns the
    layerwise matrix-variate normal of the last refresh (noisy_kfac.6)."""
    N = driver.check_data(model, X, y, X.dtype)
    M, S = min(hyper["M"], N), hyper["S_train"]
    cfg = kfac_config(hyper, N)
    state = noisy_kfac.init(model.init_theta(rng), model)
    for epoch in range(1, hyper["epochs"] + 1):
        for idx in driver.epoch_batches(rng, N, M):
            batch = noisy_kfac.Batch(X[idx], y[idx])
            eps = rng.standard_normal((model.D, S))
            t = state.t + 1
            step = functools.partial(noisy_kfac.step, state, batch, eps, cfg, model)
            state, _ = driver.guarded_step(t, epoch, step, checked=t == 1)
            driver.check_finite_state(state, t, epoch)
        progress(1)
    return Gaussian(lambda eps: noisy_kfac.sample(state, eps, cfg, model))


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

LAPLACE_KRON = MethodSpec(
    name="laplace-kron",
    description="K-FAC Laplace (Ritter et al. 2018; Daxberger et al. 2021) at map's SGD "
                "endpoint: GGN, all layers, GLM predictive",
    defaults=MAP.defaults, quick=MAP.quick, fit=_map_fit,
    predict=_glm_sampler("kron", "all"), train="map",
    constants=MappingProxyType({"structure": "kron", "curvature": "ggn", "subset": "all",
                                "predictive": "glm, Monte Carlo over theta"}),
)

LAPLACE_LL = MethodSpec(
    name="laplace-ll",
    description="Last-layer Laplace (Daxberger et al. 2021) at map's SGD endpoint: full GGN of "
                "the last layer, GLM predictive",
    defaults=MAP.defaults, quick=MAP.quick, fit=_map_fit,
    predict=_glm_sampler("full", "last_layer"), train="map",
    constants=MappingProxyType({"structure": "full", "curvature": "ggn",
                                "subset": "last_layer",
                                "predictive": "glm, Monte Carlo over theta"}),
)

_TUNED = {"prior_tuning": "evidence (laplace.6), scalar, L-BFGS-B from lam"}

LAPLACE_KRON_EV = MethodSpec(
    name="laplace-kron-ev",
    description="laplace-kron with its prior precision tuned by the Laplace evidence",
    defaults=MAP.defaults, quick=MAP.quick, fit=_map_fit,
    predict=_glm_sampler("kron", "all", tuned=True), train="map",
    constants=MappingProxyType({**LAPLACE_KRON.constants, **_TUNED}),
    report=_evidence_report("kron", "all"),
)

LAPLACE_LL_EV = MethodSpec(
    name="laplace-ll-ev",
    description="laplace-ll with its prior precision tuned by the Laplace evidence",
    defaults=MAP.defaults, quick=MAP.quick, fit=_map_fit,
    predict=_glm_sampler("full", "last_layer", tuned=True), train="map",
    constants=MappingProxyType({**LAPLACE_LL.constants, **_TUNED}),
    report=_evidence_report("full", "last_layer"),
)

KTIED = MethodSpec(
    name="ktied",
    description="k-tied Normal (Swiatkowski et al. 2020), k = 2: mean field with rank-2 tied "
                "standard deviations, trained as bbb",
    defaults={**BBB.defaults, "k": 2, "jitter": 0.1},
    quick=BBB.quick,
    fit=_ktied_fit,
    predict=_gaussian_predict,
)

NOISY_KFAC = MethodSpec(
    name="noisy-kfac",
    description="Noisy K-FAC (Zhang et al. 2018): matrix-variate Gaussian per layer, the "
                "authors' classification settings",
    defaults={"epochs": 200, "M": 128, "lr": 1e-2, "momentum": 0.9, "beta": 1e-2,
              "damping": 1e-3, "kl_clip": 1e-3, "kl_weight": 1.0, "T_stats": 1, "T_inv": 10,
              "S_train": 1},
    quick=_QUICK,
    fit=_noisy_kfac_fit,
    predict=_gaussian_predict,
)

METHODS: dict[str, MethodSpec] = {s.name: s for s in (MAP, SWA, SWAG_DIAG, SWAG, BBB, MC_DROPOUT,
                                                      VOGN, LAPLACE_KRON, LAPLACE_LL,
                                                      LAPLACE_KRON_EV, LAPLACE_LL_EV, KTIED,
                                                      NOISY_KFAC)}
