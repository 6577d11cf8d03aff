"""MC dropout (Gal and Ghahramani 2016, "Dropout as a Bayesian Approximation"): dropout on the
inputs and on every hidden layer's input, trained with Adam on the summed-loss form of the
dropout objective, and the Monte Carlo predictive.

Implements (mc_dropout.3)-(mc_dropout.8) of derivations/mc_dropout.md, on the masked network of
refbayes.models.dropout ((mc_dropout.1)-(mc_dropout.2)) and Adam (adam.1)-(adam.4).
Symbols: theta (D,) the weights M_k and biases b_k of an MLP or a CNN (refbayes flat layout; on
a CNN the masks multiply the input of every Conv2d and Dense, or sit at ``cfg.sites``,
refbayes.models.dropout); p the dropout (DROP) probability, 1 - p the keep probability; l the
prior length-scale, prior N(0, l^{-2} I) on every weight and bias; tau = ``noise_precision``,
Gal's "model precision" (the Gaussian likelihood's noise precision; 1 for classification); masks
z_k (M, n_k) drawn Bernoulli(1 - p) by the caller, one per example and layer input;
s = 1 / (1 - p) with inverted dropout, 1 without.

Objective (summed-loss convention, minimized; derivations/mc_dropout.md)::

    F(theta) = (N / M) sum_{i in B} l_i(theta; z_i) + (1/2) sum_j lam_j theta_j^2   (mc_dropout.3)

with lam_j the prior precision of (mc_dropout.4): l^2 (1 - p) on weights without inverted
dropout, l^2 / (1 - p) with it, l^2 on biases (0 with ``decay_biases=False``, Gal's code).
N / M scales the minibatch sum (one mask draw per row, S = 1 per step); tau enters only
through the likelihood inside l_i; no tempering, no data augmentation. Dividing F by N tau gives
Gal's averaged objective with weight decay l^2 (1 - p) / (2 N tau) (``gal_weight_decay``).

Examples
--------
One MC dropout step on a small MLP and 20 synthetic regression points; the caller draws the
minibatch and the dropout masks (a step draws nothing), then predicts with 10 mask draws:

>>> import numpy as np
>>> from refbayes.datasets import make_linear_regression
>>> from refbayes.methods import driver, mc_dropout
>>> from refbayes.models import MLP
>>> data = make_linear_regression(20, 2, 0, 4.0)  # N = 20 rows, 2 features, seed 0, tau = 4
>>> model = MLP([2, 4, 1], "tanh", "gaussian", noise_precision=4.0)   # D = 17
>>> rng = np.random.default_rng(0)
>>> state = mc_dropout.init(0.5 * rng.standard_normal(model.D))
>>> cfg = mc_dropout.MCDropoutConfig(N=20, p=0.1, noise_precision=4.0, alpha=0.01)
>>> idx = rng.choice(20, size=8, replace=False)   # minibatch, M = 8
>>> masks = driver.draw_masks(rng, model, 8, cfg.p)  # one mask per layer input
>>> batch = mc_dropout.Batch(data.X[idx], data.y[idx])
>>> state, info = mc_dropout.step(state, batch, masks, cfg, model)
>>> [z.shape for z in masks], state.theta.shape
([(8, 2), (8, 4)], (17,))
>>> test_masks = [driver.draw_masks(rng, model, 5, cfg.p) for _ in range(10)]
>>> mc_dropout.predict_samples(state, data.X[:5], test_masks, cfg, model).shape
(10, 5, 1)
"""
from __future__ import annotations

import math
import numbers
from typing import Any, NamedTuple

import numpy as np

from refbayes._checks import check_array, check_at_construction, check_float, check_in_range
from refbayes.backend import xp_of
from refbayes.methods._estimates import (
    Batch,
    check_batch,
    check_model,
    check_N,
)
from refbayes.methods.adam import (
    AdamState,
    _adam,
    adam_init,
    check_adam_hyper,
    check_theta_state,
)
from refbayes.models import CNN, theta_layout
from refbayes.models.dropout import check_sites, masked_forward, masked_output_and_grad
from refbayes.models.likelihoods import Gaussian

__all__ = [
    "Batch",
    "MCDropoutConfig",
    "MCDropoutInfo",
    "MCDropoutState",
    "gal_weight_decay",
    "init",
    "predict_samples",
    "predictive_log_likelihood",
    "prior_precision",
    "scale",
    "step",
]

Array = Any


class MCDropoutConfig(NamedTuple):
    """MC dropout hyperparameters; defaults are those of Gal's UCI code except eps_adam.

    Gal's net/net.py: dropout 0.05, lengthscale 1e-2, Keras Adam lr 1e-3
    (derivations/mc_dropout.md).

    Each field is documented by its trailing comment. The functions that take a cfg check it
    and raise ValueError unless: N is an integer >= 1; p is in [0, 1); lengthscale,
    noise_precision, alpha and eps_adam are finite reals > 0; beta1 and beta2 are in [0, 1);
    inverted and decay_biases are bools; and sites is None or a non-empty tuple of ints.
    ``step`` also requires noise_precision to be the model's Gaussian noise precision (1 for
    classification), and sites to be valid for the model (a CNN's distinct increasing layer
    indices, refbayes.models.dropout.mask_shapes).

    ``sites`` moves a CNN's masks (mc_dropout.10)-(mc_dropout.11); ``prior_precision`` does not
    change with it: lam_W on every weight and lam_b on every bias is then a choice, since Gal's
    KL argument (mc_dropout.4) is for row masks on the weights' inputs.

    Construction (``MCDropoutConfig(...)``, and unpickling) checks these rules too; ``_replace``
    and ``_make`` do not, so the functions check every cfg again.
    """
    N: int                       # training-set size >= 1, minibatch sums scaled by N / M (mc_dropout.3)
    p: float = 0.05              # dropout (drop) probability, in [0, 1) (mc_dropout.1), (mc_dropout.4)
    lengthscale: float = 1e-2    # prior length-scale l > 0, prior precision l^2 (mc_dropout.4)
    noise_precision: float = 1.0  # Gal's tau: the Gaussian likelihood's precision, 1 otherwise (mc_dropout.5)
    alpha: float = 1e-3          # Adam step size > 0 (adam.4)
    beta1: float = 0.9           # Adam first-moment decay in [0, 1) (adam.1)
    beta2: float = 0.999         # Adam second-moment decay in [0, 1) (adam.2)
    eps_adam: float = 1e-8       # Adam constant > 0 added to sqrt(v_hat) (adam.4)
    inverted: bool = True        # scale kept units by 1 / (1 - p) (Keras, PyTorch) (mc_dropout.1)
    decay_biases: bool = True    # biases get prior precision l^2 (derivation); False = Gal's code (mc_dropout.4)
    sites: tuple | None = None   # a CNN's mask sites (layer inputs; len(layers): f); None: every parameter layer's input (mc_dropout.10)


class MCDropoutState(NamedTuple):
    """MC dropout training state after t steps.

    Each field is documented by its trailing comment. Every function that takes a state checks
    it and raises ValueError unless: theta is a finite float (float64 or float32) (D,) array; t
    is an integer >= 0; and adam is an AdamState whose m, v are finite (D,) arrays of theta's
    dtype with v >= 0 and whose t is an integer >= 0 (checked, though not read).
    """
    theta: Array      # theta_t, (D,), (mc_dropout.6)
    adam: AdamState   # Adam moments of theta, (D,) each, (adam.1), (adam.2); adam.t is not read
    t: int            # steps taken; drives the bias correction (adam.3)


class MCDropoutInfo(NamedTuple):
    """The named intermediates of one MC dropout step, by equation.

    Each field is documented by its trailing comment (the equation tag last).
    """
    f: Array        # masked outputs f_i(theta_t; z_i), (M, n_out)  (mc_dropout.1)
    g_data: Array   # (N / M) sum_{i in B} grad l_i(theta_t; z_i), data gradient, (D,)  (mc_dropout.2), (mc_dropout.5)
    g: Array        # objective gradient g_data + lam * theta_t, (D,)  (mc_dropout.5)
    delta: Array    # Adam step, (D,)  (adam.4)
    theta: Array    # weights theta_{t+1} = theta_t + delta, (D,)  (mc_dropout.6)


# ----------------------------------------------------------------------------- checks

def _check_cfg(cfg):
    if not isinstance(cfg, MCDropoutConfig):
        raise ValueError(f"cfg: expected an MCDropoutConfig, got {type(cfg).__name__}")
    N = check_N(cfg.N)
    # every float finite (check_in_range rejects NaN, and inf at an open bound)
    p = check_in_range(cfg.p, "cfg.p", 0.0, 1.0, high_open=True)
    ls = check_in_range(cfg.lengthscale, "cfg.lengthscale", 0.0, math.inf, low_open=True,
                        high_open=True)
    tau = check_in_range(cfg.noise_precision, "cfg.noise_precision", 0.0, math.inf,
                         low_open=True, high_open=True)
    hyper = check_adam_hyper(cfg.alpha, cfg.beta1, cfg.beta2, cfg.eps_adam)
    for name in ("inverted", "decay_biases"):
        if not isinstance(getattr(cfg, name), bool):
            raise ValueError(f"{name}: expected True or False, got {getattr(cfg, name)!r}")
    sites = cfg.sites
    if sites is not None and (not isinstance(sites, tuple) or len(sites) < 1 or any(
            isinstance(k, bool) or not isinstance(k, numbers.Integral) for k in sites)):
        raise ValueError(f"cfg.sites: expected None or a non-empty tuple of layer indices, got "
                         f"{sites!r}")
    return N, p, ls, tau, hyper


check_at_construction(MCDropoutConfig, _check_cfg)


def _check_tau(model, tau):
    """cfg.noise_precision must be the model's: tau enters the objective only through l_i."""
    lik = model.likelihood
    want = float(lik.noise_precision) if isinstance(lik, Gaussian) else 1.0
    if tau != want:
        where = ("the model's Gaussian noise_precision" if isinstance(lik, Gaussian)
                 else f"1 for the {lik.name} likelihood (no model precision)")
        raise ValueError(f"cfg.noise_precision: expected {want} ({where}), got {tau}")


def _check_sites(model, cfg):
    """cfg.sites must be valid for the model (refbayes.models.dropout.check_sites); the message
    names cfg.sites."""
    try:
        check_sites(model, cfg.sites)
    except ValueError as err:
        raise ValueError(f"cfg.{err}") from None


def _check_state(state) -> int:
    return check_theta_state(state, MCDropoutState)


# ----------------------------------------------------------------------------- the objective

def scale(cfg: MCDropoutConfig) -> float:
    """Return the dropout scale s: 1 / (1 - p) with inverted dropout, 1 without.

    (mc_dropout.1)

    Parameters
    ----------
    cfg : MCDropoutConfig
        Hyperparameters.

    Returns
    -------
    float
        The scale s.

    Raises
    ------
    ValueError
        If cfg is invalid (see MCDropoutConfig).
    """
    _, p, *_ = _check_cfg(cfg)
    return 1.0 / (1.0 - p) if cfg.inverted else 1.0


def prior_precision(cfg: MCDropoutConfig, model, dtype=np.float64):
    """Build the prior precision lam of (mc_dropout.4) in theta's layout, as a NumPy array.

    Weights get l^2 (1 - p) (non-inverted) or l^2 / (1 - p) (inverted), biases l^2 (or 0 with
    decay_biases=False).  Move the result to the GPU explicitly if needed.  (mc_dropout.4)

    Parameters
    ----------
    cfg : MCDropoutConfig
        Hyperparameters.
    model : FlatModel or CNN
        The network whose layout lam follows (a CNN: every conv kernel and dense weight is a
        weight, every conv and dense bias a bias).
    dtype : numpy dtype, default numpy.float64
        Dtype of the result.

    Returns
    -------
    numpy.ndarray of shape (D,)
        The prior precision lam.

    Raises
    ------
    ValueError
        If cfg is invalid (see MCDropoutConfig), or model has no ``sizes`` and ``bias``.
    """
    _, p, ls, _, _ = _check_cfg(cfg)
    cnn = isinstance(model, CNN)
    if not cnn and (not hasattr(model, "sizes") or not hasattr(model, "bias")):
        raise ValueError(f"model: expected a refbayes.models model, got {type(model).__name__}")
    lam_W = ls * ls / (1.0 - p) if cfg.inverted else ls * ls * (1.0 - p)   # (mc_dropout.4)
    lam_b = ls * ls if cfg.decay_biases else 0.0                            # (mc_dropout.4)
    if cnn:  # the biases' positions in theta, read off the model's own unflatten
        lam = np.full(model.D, lam_W, dtype=dtype)
        for _, b in model.unflatten(np.arange(model.D, dtype=np.float64)):
            if b is not None:
                lam[b.astype(np.int64)] = lam_b
        return lam
    lay = theta_layout(model.sizes, model.bias)
    lam = np.full(lay.D, lam_W, dtype=dtype)
    if model.bias:
        for k, b0 in enumerate(lay.b_off):
            lam[b0:b0 + model.sizes[k + 1]] = lam_b
    return lam


def gal_weight_decay(cfg: MCDropoutConfig) -> float:
    """Return Gal's weight-decay coefficient lambda of the AVERAGED objective.

    The objective is (1/N) sum_n E_n + lambda ||W||^2 with lambda = l^2 (1 - p) / (2 N tau)
    (the ``reg`` of net/net.py), i.e. lam_W / (2 N tau) for the non-inverted lam_W of
    (mc_dropout.4).

    Parameters
    ----------
    cfg : MCDropoutConfig
        Hyperparameters.

    Returns
    -------
    float
        The coefficient lambda.

    Raises
    ------
    ValueError
        If cfg is invalid (see MCDropoutConfig).
    """
    N, p, ls, tau, _ = _check_cfg(cfg)
    return ls * ls * (1.0 - p) / (2.0 * N * tau)


# ----------------------------------------------------------------------------- state and step

def init(theta) -> MCDropoutState:
    """Create the initial MCDropoutState at theta, with zero Adam moments and t = 0.

    Parameters
    ----------
    theta : array of shape (D,)
        Initial weights, e.g. ``model.init_theta(rng)``.

    Returns
    -------
    MCDropoutState
        The state (theta, adam_init(theta), 0).

    Raises
    ------
    ValueError
        If theta is not a finite float 1-d array.
    """
    check_array(theta, "theta", ndim=1)
    check_float(theta, "theta")
    return MCDropoutState(theta, adam_init(theta), 0)


def step(state: MCDropoutState, batch, masks, cfg: MCDropoutConfig,
         model) -> tuple[MCDropoutState, MCDropoutInfo]:
    """Take one Adam step on the dropout objective (mc_dropout.3) with the caller's masks.

    (mc_dropout.1)-(mc_dropout.6).  Deterministic given its inputs.

    Parameters
    ----------
    state : MCDropoutState
        Current state.
    batch : Batch
        The minibatch rows Batch(X_B (M, n_in), y_B), 1 <= M <= N.
    masks : list of array
        One mask in {0, 1} per site (cfg.sites; None: per layer with parameters), of shape
        (M,) + shape_k (``refbayes.models.dropout.mask_shapes(model, cfg.sites)``; an MLP:
        [z_0 (M, n_0), ..., z_{L-1} (M, n_{L-1})]), as ``refbayes.methods.driver.draw_masks``
        draws them.
    cfg : MCDropoutConfig
        Hyperparameters.
    model : FlatModel or CNN
        An MLP, a CNN (or any refbayes.models model) with D parameters whose likelihood
        precision equals cfg.noise_precision.

    Returns
    -------
    state : MCDropoutState
        The state after the step, t + 1.
    info : MCDropoutInfo
        The step's intermediates, by equation.

    Raises
    ------
    ValueError
        If state or cfg is invalid (see MCDropoutState, MCDropoutConfig); if model is not a
        FlatModel with D parameters, or cfg.noise_precision is not its Gaussian noise precision (1
        for classification); if batch does not fit it (see Batch); if cfg.sites is invalid for
        it; if masks is not a list of binary arrays of those shapes; or if the arrays mix NumPy
        and CuPy.
    """
    D = _check_state(state)
    dtype = state.theta.dtype
    N, _, _, tau, (alpha, beta1, beta2, eps_adam) = _check_cfg(cfg)
    check_model(model, D, cnn=True)
    _check_sites(model, cfg)
    _check_tau(model, tau)
    X, y, M = check_batch(batch, model, N, dtype)
    theta = state.theta
    xp = xp_of(theta, X)
    f, g_sum = masked_output_and_grad(model, theta, X, y, masks, scale(cfg),
                                      cfg.sites)                                  # (mc_dropout.1)-(mc_dropout.2), (mc_dropout.10)-(mc_dropout.11)
    lam = xp.asarray(prior_precision(cfg, model, dtype))                          # (mc_dropout.4)
    g_data = (N / M) * g_sum                                                      # (mc_dropout.5)
    g = g_data + lam * theta                                                      # (mc_dropout.5)
    delta, adam = _adam(xp, g, state.adam, alpha, beta1, beta2, eps_adam, state.t)  # (adam.1)-(adam.4)
    theta_new = theta + delta                                                     # (mc_dropout.6)
    info = MCDropoutInfo(f, g_data, g, delta, theta_new)
    return MCDropoutState(theta_new, adam, state.t + 1), info


# ----------------------------------------------------------------------------- MC predictive

def predict_samples(state: MCDropoutState, X, masks_list, cfg: MCDropoutConfig, model):
    """Run the S stochastic forward passes of the MC predictive.

    F[s] = masked_forward(theta, X, masks_list[s]), with masks drawn Bernoulli(1 - p) by the
    caller, one list per pass.  (mc_dropout.7)

    Parameters
    ----------
    state : MCDropoutState
        The trained state.
    X : array of shape (n, n_in)
        Inputs, in theta's dtype.
    masks_list : list of list of array
        S >= 1 mask lists, one per pass, each as ``step`` takes them (with n rows).
    cfg : MCDropoutConfig
        Hyperparameters.
    model : FlatModel
        The network, with D parameters.

    Returns
    -------
    array of shape (S, n, n_out)
        The outputs F.

    Raises
    ------
    ValueError
        If state or cfg is invalid (see MCDropoutState, MCDropoutConfig); if model is not a
        FlatModel with D parameters; if masks_list is not a non-empty list; if a mask list is not
        one binary array per site (see ``step``); if X is not a finite float (n, n_in) array of
        theta's dtype; or if the arrays mix NumPy and CuPy.
    """
    _check_state(state)
    _check_cfg(cfg)
    check_model(model, state.theta.shape[0], cnn=True)
    _check_sites(model, cfg)
    if not isinstance(masks_list, (list, tuple)) or len(masks_list) < 1:
        raise ValueError("masks_list: expected a non-empty list of mask lists (one per Monte "
                         f"Carlo pass), got {type(masks_list).__name__}")
    out = []
    for k, masks in enumerate(masks_list):
        try:
            out.append(masked_forward(model, state.theta, X, masks, scale(cfg),
                                      cfg.sites))                                        # (mc_dropout.7)
        except ValueError as err:
            if str(err).startswith("masks"):
                raise ValueError(f"masks_list[{k}]: {err}") from None
            raise
    return xp_of(*out).stack(out)


def predictive_log_likelihood(F, y, noise_precision: float):
    """Compute the per-point MC predictive log-likelihood for a Gaussian likelihood.

    log p(y_n | x_n) ~= logsumexp_s [ -tau/2 ||y_n - F[s, n]||^2 ] - log S + (K/2) log(tau / 2 pi),
    Gal's test log-likelihood (its mean over n is the reported number).  Everything in one set
    of units: for targets standardized by (m_y, s_y), pass F * s_y + m_y, the raw y and tau in
    raw units (tau_std / s_y^2).  (mc_dropout.8)

    Parameters
    ----------
    F : array of shape (S, n, K) or (S, n)
        Forward passes (``predict_samples``).
    y : array of shape (n, K) or (n,)
        Targets.
    noise_precision : float
        The likelihood precision tau > 0.

    Returns
    -------
    array of shape (n,)
        The log-likelihood of each point.

    Raises
    ------
    ValueError
        If F is not a finite float 2-d or 3-d array, noise_precision is not a real number in
        (0, inf), y is not a finite real array of shape (n,) or (n, K) (1-d only when K = 1),
        or the arrays mix NumPy and CuPy.
    """
    xp = xp_of(F, y)
    check_array(F, "F", ndim=(2, 3))
    check_float(F, "F")
    tau = check_in_range(noise_precision, "noise_precision", 0.0, math.inf, low_open=True,
                         high_open=True)
    S, n = F.shape[0], F.shape[1]
    K = F.shape[2] if F.ndim == 3 else 1
    check_array(y, "y", shape=(n, K) if F.ndim == 3 and y.ndim == 2 else (n,))
    if F.ndim == 3 and y.ndim == 1 and K != 1:
        raise ValueError(f"y: expected shape ({n}, {K}) for {K} outputs, got {tuple(y.shape)}")
    r = F.reshape(S, n, K) - y.reshape(1, n, K).astype(F.dtype)
    e = -0.5 * tau * (r * r).sum(axis=2)                                          # (S, n)
    e_max = e.max(axis=0)
    lse = e_max + xp.log(xp.exp(e - e_max).sum(axis=0))                           # logsumexp over s
    return lse - math.log(S) + 0.5 * K * math.log(tau / (2.0 * math.pi))          # (mc_dropout.8)
