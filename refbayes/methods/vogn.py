"""VON / VOGN / OGN: variational online Gauss-Newton (Khan et al. 2018, arXiv:1806.04854;
Osawa et al. 2019, arXiv:1906.02506, Algorithm 1) and its deterministic counterpart OGN.

Implements (vogn.1)-(vogn.10) of derivations/vogn.md.

Symbols (derivations/notation.md, vogn.md): mu (D,) mean; s (D,) curvature running average in
per-example units; m (D,) momentum buffer; delta prior precision (scalar or (D,));
N training-set size; rho data-augmentation factor; tau tempering (KL weight); gamma external
damping; alpha learning rate; beta1 momentum rate; beta2 curvature running-average rate (the
weight of the NEW estimate); K = S Monte Carlo draws, the columns of eps (D, S).

Scaling, where N, M, S, tau, rho enter:

- N_eff = rho N and delta~ = tau delta / N_eff (vogn.2); the Gaussian is
  q = N(mu, diag(sigma^2)), sigma^2 = tau / (N_eff (s + delta~ + gamma)), so
  prec_diag = (N_eff / tau)(s + delta~ + gamma) (vogn.4).
- ghat, hhat are per-example MEANS: (1/M) over the minibatch rows and (1/S) over the draws
  (vogn.5); the losses of the models are sums, so the code divides by M explicitly. N_eff and tau
  enter only through sigma, prec_diag and delta~, never through ghat or hhat.
- The objective is (N_eff / tau) E_q[(1/N) sum_n l_n] + KL(q || N(0, diag(delta)^{-1})) (vogn.1).

Algorithm 1 as implemented (one step, t -> t + 1)::

    sigma   = sqrt(tau / (N_eff (s + delta~ + gamma)))      draws with the OLD s   (vogn.4)
    theta_k = mu + sigma * eps_k, k = 1..S                                         (vogn.4)
    ghat    = mean_k (1/M) sum_i g_{k,i};  hhat = mean_k (1/M) sum_i g_{k,i}^2 ("ef")
              or mean_k (1/M) diag(sum_i J^T H J) ("ggn")                           (vogn.5)
    m  <- beta1 m + (ghat + delta~ mu)                                             (vogn.7)
    s  <- (1 - beta2) s + beta2 hhat                                               (vogn.8)
    mu <- mu - alpha m / (s + delta~ + gamma)                                      (vogn.9)

The printed sigma line lacks tau and the printed s line weights the old s by (1 - tau beta2):
for tau != 1 that pair is not a natural-gradient step of the tempered objective (erratum
E-vogn.1); at tau = 1 those two printed lines are what runs here. The printed momentum line has
the full delta where delta~ belongs (erratum E-vogn.2); delta~ runs here.

Special cases:

- Khan et al. (2018) VON / VOGN: beta1 = 0, alpha = beta2 = beta_t, tau = rho = 1, gamma = 0
  (then delta~ = lambda / N and sigma^2 = 1 / (N (s + lambda~))); curvature "ggn" gives VON on
  models whose Hessian is the GGN (linear, logistic regression), "ef" gives the 2018 VOGN
  (squared per-example gradients) (vogn.11).
- The natural-gradient mean-field step of refbayes.methods.ngvi (vogn.12): ngvi.step_meanfield with
  prec_diag = N (s + delta~), lam = delta, alpha, beta = beta2, momentum 0, decay 0 (tau = rho = 1,
  gamma = 0, beta1 = 0).
- OGN (vogn.10): ``eps=None`` evaluates the gradient and curvature at theta = mu (one point, no
  draw); identical to eps = zeros((D, 1)).

Data parallel (vogn.6): ``step`` is ``apply(state, *allreduce([local_estimates(...)])[:2], cfg)``.
Worker w calls ``local_estimates`` on its own rows (M_w of them) with the SAME eps as the others;
``allreduce`` takes the M-weighted mean sum_w M_w ghat_w / sum_w M_w (and the same for hhat),
which equals the one-worker estimate on the concatenated rows. So with equal eps across workers
the data-parallel step equals the one-worker step exactly, up to the order of floating-point
summation, for equal or unequal M_w.

Randomness: nothing is drawn here; eps (D, S) comes from the caller.

Examples
--------
One VOGN step on 20 synthetic logistic-regression points; the caller draws the minibatch and the
standard-normal eps (a step draws nothing):

>>> import numpy as np
>>> from refbayes.datasets import make_logistic_regression
>>> from refbayes.methods import vogn
>>> from refbayes.models import LogisticRegression
>>> data = make_logistic_regression(20, 3, 0)     # N = 20 rows, 3 features, seed 0
>>> model = LogisticRegression(3)                 # D = 4 with the intercept
>>> state = vogn.init(np.zeros(model.D), np.ones(model.D))   # mu, s
>>> cfg = vogn.VOGNConfig(N=20, delta=1.0, alpha=0.1)
>>> rng = np.random.default_rng(0)
>>> idx = rng.choice(20, size=8, replace=False)   # minibatch, M = 8
>>> eps = rng.standard_normal((model.D, 2))       # S = 2 draws
>>> batch = vogn.Batch(data.X[idx], data.y[idx].astype(float))
>>> state, info = vogn.step(state, batch, eps, cfg, model)
>>> state.mu.shape, info.g_hat.shape, int(state.t)
((4,), (4,), 1)
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

from refbayes._checks import (
    check_at_construction,
    check_array,
    check_float,
    check_in_range,
    check_int,
    check_positive,
    check_same_dtype,
)
from refbayes.backend import xp_of
from refbayes.methods._estimates import (
    Batch,
    check_batch,
    check_draws,
    check_model,
    check_N,
    check_t,
)

__all__ = [
    "CURVATURES",
    "Batch",
    "Estimates",
    "VOGNConfig",
    "VOGNInfo",
    "VOGNState",
    "allreduce",
    "apply",
    "dense_covariance",
    "init",
    "local_estimates",
    "prec_diag",
    "sample",
    "step",
]

Array = Any

CURVATURES = ("ef", "ggn")


class VOGNConfig(NamedTuple):
    """VOGN hyperparameters.

    alpha, beta1, beta2 default to the official ResNet-18 / CIFAR-10 setting of Osawa et al.
    (team-approx-bayes/dl-with-bayes, resnet18_vogn_bs256_8gpu.json: lr 1e-4, momentum 0.9 of
    type 'raw', curvature ema_decay 0.999) and curvature to the paper's squared per-example
    gradients; gamma, tau, rho default to the untempered, undamped, unaugmented natural-gradient
    step (that config uses gamma = 1e-3, rho = 10, tau = 1).

    Each field is documented by its trailing comment.  The functions that take a cfg check it
    against the state and raise ValueError unless: N is an integer >= 1; alpha, tau and rho are
    finite reals > 0; beta1 is in [0, 1) and beta2 in (0, 1]; gamma is a finite real >= 0;
    curvature is in CURVATURES; and delta is a finite real > 0 or a finite float (D,) array > 0
    in the state's dtype.

    Construction (``VOGNConfig(...)``, and unpickling) checks these rules too, except delta's
    length and dtype, known only with the state; ``_replace`` and ``_make`` do not, so the
    functions check every cfg again.
    """
    N: int                 # training-set size, an integer >= 1; N_eff = rho N (vogn.2)
    delta: Any             # prior precision delta: float > 0 or (D,) array > 0 (vogn.1), (vogn.2)
    alpha: float = 1e-4    # learning rate alpha > 0 (vogn.9)
    beta1: float = 0.9     # momentum rate beta_1 in [0, 1) (vogn.7)
    beta2: float = 0.999   # curvature running-average rate beta_2 in (0, 1], the new estimate's weight (vogn.8)
    gamma: float = 0.0     # external damping gamma >= 0 (vogn.4), (vogn.9)
    tau: float = 1.0       # tempering tau > 0, the KL weight (vogn.1), (vogn.2), (vogn.4)
    rho: float = 1.0       # data-augmentation factor rho > 0, N_eff = rho N (vogn.2)
    curvature: str = "ef"  # "ef" per-example squares or "ggn" diagonal GGN (vogn.5)


class VOGNState(NamedTuple):
    """VOGN state after t steps.

    Each field is documented by its trailing comment.  Every function that takes a state checks
    it and raises ValueError unless: mu is a finite float (float64 or float32) (D,) array; s and
    m are finite (D,) arrays of mu's dtype; every s >= 0; and t is an integer >= 0.
    """
    mu: Array  # mu_t, (D,), (vogn.9)
    s: Array   # s_t >= 0, (D,), curvature running average, per-example units (vogn.8)
    m: Array   # m_t, (D,), momentum buffer incl. the prior term (vogn.7)
    t: int     # steps taken, an integer >= 0


class VOGNInfo(NamedTuple):
    """The named intermediates of one VOGN step, by equation.

    Each field is documented by its trailing comment (the equation tag last).
    """
    N_eff: float        # rho N (vogn.2)
    delta_tilde: Array  # tau delta / N_eff, scalar or (D,) (vogn.2)
    sigma: Array        # std (tau / (N_eff (s_t + delta~ + gamma)))^{1/2}, from the old s, (D,) (vogn.4)
    theta: Array        # theta_k = mu + sigma eps_k, (D, S); mu as (D, 1) for OGN; (D, 0) from apply (vogn.4)
    g_k: Array          # ghat_k, (S, D); (0, D) from apply (vogn.5)
    h_k: Array          # hhat_k, (S, D); (0, D) from apply (vogn.5)
    g_hat: Array        # ghat, (D,) (vogn.5), (vogn.6)
    h_hat: Array        # hhat, (D,) (vogn.5), (vogn.6)
    m: Array            # m_{t+1}, (D,) (vogn.7)
    s: Array            # s_{t+1}, (D,) (vogn.8)
    prec_diag: Array    # (N_eff / tau)(s_{t+1} + delta~ + gamma), (D,) (vogn.4)
    Delta_mu: Array     # alpha m_{t+1} / (s_{t+1} + delta~ + gamma), (D,) (vogn.9)
    mu: Array           # mu_{t+1}, (D,) (vogn.9)


class Estimates(NamedTuple):
    """One worker's minibatch estimates (vogn.5), or their reduction (vogn.6).

    Each field is documented by its trailing comment.
    """
    g_hat: Array  # gradient estimate ghat, a per-example mean, (D,)
    h_hat: Array  # curvature estimate hhat, a per-example mean, (D,)
    M: int        # rows behind the estimate


class _Cfg(NamedTuple):
    """A validated VOGNConfig with the derived scales of (vogn.2)."""
    N_eff: float
    delta_tilde: Any
    alpha: float
    beta1: float
    beta2: float
    gamma: float
    tau: float
    curvature: str
    N: int


# ----------------------------------------------------------------------------- checks

def _check_state(state):
    if not isinstance(state, VOGNState):
        raise ValueError(f"state: expected a VOGNState, got {type(state).__name__}")
    check_array(state.mu, "state.mu", ndim=1)
    check_float(state.mu, "state.mu")
    D = state.mu.shape[0]
    check_array(state.s, "state.s", shape=(D,))
    check_array(state.m, "state.m", shape=(D,))
    check_same_dtype({"state.mu": state.mu, "state.s": state.s, "state.m": state.m})
    xp = xp_of(state.mu, state.s, state.m)
    check_positive(state.s, "state.s", strict=False)
    check_t(state.t)
    return D, xp


def _scales(cfg, D=None, dtype=None) -> _Cfg:
    """Validate cfg and form N_eff = rho N, delta~ = tau delta / N_eff.  (vogn.2)"""
    if not isinstance(cfg, VOGNConfig):
        raise ValueError(f"cfg: expected a VOGNConfig, got {type(cfg).__name__}")
    N = check_N(cfg.N)
    # every float finite (check_in_range rejects NaN, and inf at an open bound)
    alpha = check_in_range(cfg.alpha, "cfg.alpha", 0.0, math.inf, low_open=True, high_open=True)
    beta1 = check_in_range(cfg.beta1, "cfg.beta1", 0.0, 1.0, high_open=True)
    beta2 = check_in_range(cfg.beta2, "cfg.beta2", 0.0, 1.0, low_open=True)
    gamma = check_in_range(cfg.gamma, "cfg.gamma", 0.0, math.inf, high_open=True)
    tau = check_in_range(cfg.tau, "cfg.tau", 0.0, math.inf, low_open=True, high_open=True)
    rho = check_in_range(cfg.rho, "cfg.rho", 0.0, math.inf, low_open=True, high_open=True)
    if cfg.curvature not in CURVATURES:
        raise ValueError(f"curvature: expected one of {CURVATURES}, got {cfg.curvature!r}")
    delta = cfg.delta
    if hasattr(delta, "shape"):
        check_array(delta, "cfg.delta", shape=(D,))
        check_float(delta, "cfg.delta")
        if dtype is not None and delta.dtype != dtype:
            raise ValueError(f"cfg.delta: expected dtype {dtype} (the state's), got {delta.dtype}")
        check_positive(delta, "cfg.delta")
    else:
        delta = check_in_range(delta, "cfg.delta", 0.0, math.inf, low_open=True, high_open=True)
    N_eff = rho * N                                                  # (vogn.2)
    delta_tilde = (tau / N_eff) * delta                              # (vogn.2)
    return _Cfg(N_eff, delta_tilde, alpha, beta1, beta2, gamma, tau, cfg.curvature, N)


check_at_construction(VOGNConfig, _scales)  # D, dtype unknown: delta's length and dtype later


def _check_eps(eps, D: int, dtype):
    """eps (D, S), S >= 1, in the state's dtype; None means OGN (vogn.10)."""
    if eps is not None:
        check_draws(eps, D, dtype)


# ----------------------------------------------------------------------------- the Gaussian

def _sigma(s, c: _Cfg):
    """sigma = (tau / (N_eff (s + delta~ + gamma)))^{1/2}.  (vogn.4)

    In place on one fresh array: the same operations in the same order as the expression.
    """
    xp = xp_of(s)
    out = _denominator(s, c)
    xp.multiply(c.N_eff, out, out=out)
    xp.divide(c.tau, out, out=out)
    return xp.sqrt(out, out=out)  # (vogn.4)


def _denominator(s, c: _Cfg):
    """s + delta~ + gamma, a fresh array: the denominator of (vogn.4) and (vogn.9)."""
    out = s + c.delta_tilde
    out += c.gamma
    return out


def _prec(s, c: _Cfg):
    """prec_diag = (N_eff / tau)(s + delta~ + gamma) = 1 / sigma^2.  (vogn.4)"""
    out = _denominator(s, c)
    return xp_of(s).multiply(out, c.N_eff / c.tau, out=out)  # (vogn.4)


def _draws(mu, sigma, eps):
    """theta (D, S) = mu + sigma * eps; mu as one column for eps=None (OGN).  (vogn.4), (vogn.10)"""
    if eps is None:
        return mu[:, None]  # (vogn.10)
    # formed as rows (S, D) and returned transposed: the model's (S, D) input without a copy
    out = sigma * eps.T
    out += mu
    return out.T  # (vogn.4)


def init(mu, s) -> VOGNState:
    """Create the initial VOGNState at mean mu and curvature s, with m = 0 and t = 0.

    The official code's ``init_precision`` p_0 corresponds to s = p_0 - delta~ (vogn.md,
    Conventions); Khan et al.'s ``prec_init`` P_0 to s = (P_0 - delta) / N.

    Parameters
    ----------
    mu : array of shape (D,)
        Initial mean.
    s : array of shape (D,)
        Initial curvature average, >= 0, same dtype as mu.

    Returns
    -------
    VOGNState
        The state (mu, s, zeros, 0).

    Raises
    ------
    ValueError
        If mu is not a finite float 1-d array, s not a finite (D,) array >= 0 of mu's dtype,
        or the arrays mix NumPy and CuPy.
    """
    check_array(mu, "mu", ndim=1)
    check_float(mu, "mu")
    check_array(s, "s", shape=(mu.shape[0],))
    check_same_dtype({"mu": mu, "s": s})
    xp = xp_of(mu, s)
    if not bool(xp.all(s >= 0)):
        raise ValueError(f"s: expected >= 0 everywhere, got min {float(s.min())}")
    return VOGNState(mu, s, xp.zeros_like(mu), 0)


def sample(state: VOGNState, eps, cfg: VOGNConfig):
    """Draw theta = mu + sigma * eps from the VOGN Gaussian.

    sigma = (tau / (N_eff (s + delta~ + gamma)))^{1/2} of (vogn.4); cfg gives N, rho, tau,
    delta and gamma.

    Parameters
    ----------
    state : VOGNState
        Current state (mu, s, m, t).
    eps : array of shape (D, S)
        Standard-normal draws from the caller, one column per sample.
    cfg : VOGNConfig
        Hyperparameters (N, delta, alpha, beta1, beta2, gamma, tau, rho, curvature).

    Returns
    -------
    array of shape (D, S)
        The draws theta.

    Raises
    ------
    ValueError
        If state or cfg is invalid (see VOGNState, VOGNConfig), eps is not a finite (D, S >= 1)
        array of the state's dtype, or the arrays mix NumPy and CuPy.
    """
    D, _ = _check_state(state)
    c = _scales(cfg, D, state.mu.dtype)
    if eps is None:
        raise ValueError(f"eps: expected an array of shape (D, S) = ({D}, S >= 1), got None")
    _check_eps(eps, D, state.mu.dtype)
    xp_of(state.mu, eps)  # one backend
    return _draws(state.mu, _sigma(state.s, c), eps)


def prec_diag(state: VOGNState, cfg: VOGNConfig):
    """Compute the Gaussian's diagonal precision (N_eff / tau)(s + delta~ + gamma).

    (vogn.4)

    Parameters
    ----------
    state : VOGNState
        Current state (mu, s, m, t).
    cfg : VOGNConfig
        Hyperparameters (N, delta, alpha, beta1, beta2, gamma, tau, rho, curvature).

    Returns
    -------
    array of shape (D,)
        The precision diagonal, 1 / sigma^2.

    Raises
    ------
    ValueError
        If state or cfg is invalid (see VOGNState, VOGNConfig).
    """
    D, _ = _check_state(state)
    return _prec(state.s, _scales(cfg, D, state.mu.dtype))


def dense_covariance(state: VOGNState, cfg: VOGNConfig):
    """Form the dense covariance diag(1 / prec_diag), for tests.

    Parameters
    ----------
    state : VOGNState
        Current state (mu, s, m, t).
    cfg : VOGNConfig
        Hyperparameters (N, delta, alpha, beta1, beta2, gamma, tau, rho, curvature).

    Returns
    -------
    array of shape (D, D)
        The covariance diag(1 / prec_diag).

    Raises
    ------
    ValueError
        If state or cfg is invalid (see VOGNState, VOGNConfig).
    """
    p = prec_diag(state, cfg)  # validates state and cfg before any attribute is touched
    return xp_of(p).diag(1 / p)


# ----------------------------------------------------------------------------- estimates

def _per_sample(model, theta, X, y, curvature: str):
    """(ghat_k (S, D), hhat_k (S, D)) at the draws theta (D, S) on the M rows.  (vogn.5)

    One batched pass of the model over the S draws (model.sample_moments): "ef" sums the squared
    per-example gradients without forming the (M, D) rows (peg.11), "ggn" the diagonal GGN
    (peg.9)-(peg.10); both sums over the rows, divided by M here.
    """
    xp = xp_of(theta)
    # the draws come from the step's checked mu, s, eps and X from check_batch: only y is checked
    g, h = model._sample_moments_trusted(xp.ascontiguousarray(theta.T), X, y, curvature)
    g /= X.shape[0]  # (vogn.5), in place: g and h are the pass's own fresh arrays
    h /= X.shape[0]  # (vogn.5)
    return g, h


def _local(state, batch, eps, cfg, model):
    """Validated inputs -> (c, sigma, theta, ghat_k, hhat_k, M) for one worker's rows."""
    D, _ = _check_state(state)
    dtype = state.mu.dtype
    c = _scales(cfg, D, dtype)
    check_model(model, D, cnn=True)
    X, y, M = check_batch(batch, model, c.N, dtype)
    _check_eps(eps, D, dtype)
    xp_of(state.mu, X, eps)  # one backend
    sigma = _sigma(state.s, c)                                        # (vogn.4)
    theta = _draws(state.mu, sigma, eps)                              # (vogn.4)
    g_k, h_k = _per_sample(model, theta, X, y, c.curvature)           # (vogn.5)
    return c, sigma, theta, g_k, h_k, M


def local_estimates(state: VOGNState, batch, eps, cfg: VOGNConfig, model) -> Estimates:
    """Compute one worker's Estimates(ghat, hhat, M) on its own rows.

    Means over the M rows and the S draws theta_k = mu + sigma eps_k (eps=None: at mu, OGN).
    Every worker must get the same eps for the data-parallel step to equal the one-worker step.
    (vogn.4), (vogn.5)

    Parameters
    ----------
    state : VOGNState
        Current state (mu, s, m, t).
    batch : Batch
        The worker's rows Batch(X_B (M, n_in), y_B (M,)), 1 <= M <= N.
    eps : array of shape (D, S) or None
        Standard-normal draws from the caller, one column per MC sample; None for OGN
        (evaluate at theta = mu, vogn.10).
    cfg : VOGNConfig
        Hyperparameters (N, delta, alpha, beta1, beta2, gamma, tau, rho, curvature).
    model : FlatModel or CNN
        A refbayes.models model with D parameters.

    Returns
    -------
    Estimates
        The worker's (g_hat (D,), h_hat (D,), M).

    Raises
    ------
    ValueError
        If state or cfg is invalid (see VOGNState, VOGNConfig), model is not a FlatModel with D
        parameters, batch does not fit it (see Batch), eps is not a finite (D, S >= 1) array of
        the state's dtype, or the arrays mix NumPy and CuPy.
    """
    _, _, _, g_k, h_k, M = _local(state, batch, eps, cfg, model)
    return Estimates(g_k.mean(axis=0), h_k.mean(axis=0), M)  # (vogn.5)


def allreduce(estimates) -> Estimates:
    """Reduce the workers' Estimates to their M-weighted mean.

    ghat = sum_w M_w ghat_w / sum_w M_w, the same for hhat, M = sum_w M_w.  Equals the
    one-worker estimate on the concatenated rows; reduces to the plain mean (an AllReduce
    average) when all M_w are equal.  (vogn.6)

    Parameters
    ----------
    estimates : list of Estimates
        One Estimates(g_hat (D,), h_hat (D,), M_w) per worker, at least one.

    Returns
    -------
    Estimates
        The reduced (g_hat (D,), h_hat (D,), sum_w M_w).

    Raises
    ------
    ValueError
        If estimates is not a non-empty list of triples, a g_hat is not a finite float 1-d
        array of the common shape, an h_hat is not finite of g_hat's shape, an M_w is not an
        integer >= 1, the arrays differ in dtype, or they mix NumPy and CuPy.
    """
    if not isinstance(estimates, (list, tuple)) or len(estimates) == 0:
        raise ValueError("estimates: expected a non-empty list of Estimates(g_hat, h_hat, M), "
                         f"got {estimates!r:.80}")
    for w, e in enumerate(estimates):
        if not isinstance(e, tuple) or len(e) != 3:
            raise ValueError(f"estimates[{w}]: expected Estimates(g_hat, h_hat, M), "
                             f"got {type(e).__name__}")
        check_array(e[0], f"estimates[{w}].g_hat", ndim=1)
        check_float(e[0], f"estimates[{w}].g_hat")
        check_array(e[1], f"estimates[{w}].h_hat", shape=e[0].shape)
        check_int(e[2], f"estimates[{w}].M", low=1)
        if e[0].shape != estimates[0][0].shape:
            raise ValueError(f"estimates[{w}].g_hat: expected shape {estimates[0][0].shape} "
                             f"(as estimates[0]), got {e[0].shape}")
    check_same_dtype({f"estimates[{w}].{n}": a for w, e in enumerate(estimates)
                      for n, a in (("g_hat", e[0]), ("h_hat", e[1]))})
    xp_of(*[a for e in estimates for a in e[:2]])  # one backend
    return _reduce(estimates)


def _reduce(estimates) -> Estimates:
    """(vogn.6) on validated estimates; one worker: weight M / M = 1, the estimate unchanged."""
    M = sum(int(e[2]) for e in estimates)
    if len(estimates) == 1:
        # 0.0 + (M / M) g = 0.0 + g exactly (only -0.0 becomes +0.0), without the product's array
        g_w, h_w, _ = estimates[0]
        return Estimates(g_w + 0.0, h_w + 0.0, M)  # (vogn.6)
    g_hat, h_hat = 0.0, 0.0
    for g_w, h_w, M_w in estimates:
        g_hat = g_hat + (int(M_w) / M) * g_w  # (vogn.6)
        h_hat = h_hat + (int(M_w) / M) * h_w  # (vogn.6)
    return Estimates(g_hat, h_hat, M)


def _update(state, g_hat, h_hat, c: _Cfg, sigma):
    """(vogn.7)-(vogn.9) from the reduced estimates; returns (new state, info without draws)."""
    xp = xp_of(state.mu)
    mu, s = state.mu, state.s
    # Each line's operations in the printed order, written in place into fresh arrays (the
    # results are the expressions' bit for bit): tmp holds delta~ mu + ghat, then beta2 hhat,
    # then s_{t+1} + delta~ + gamma, which is also prec_diag's factor (vogn.4).
    # NOTE: printed (ghat + delta mu), full delta: the mean settles under an N-times prior (E-vogn.2)
    tmp = xp.multiply(c.delta_tilde, mu)
    tmp += g_hat
    m = xp.multiply(c.beta1, state.m)
    m += tmp                                                               # (vogn.7)
    xp.multiply(c.beta2, h_hat, out=tmp)
    s_new = xp.multiply(1 - c.beta2, s)
    s_new += tmp                                                           # (vogn.8)  NOTE: printed (1 - tau beta2) s, E-vogn.1
    xp.add(s_new, c.delta_tilde, out=tmp)
    tmp += c.gamma
    Delta_mu = xp.multiply(c.alpha, m)
    Delta_mu /= tmp                                                        # (vogn.9)
    mu_new = mu - Delta_mu                                                 # (vogn.9)
    prec = xp.multiply(tmp, c.N_eff / c.tau, out=tmp)                      # (vogn.4), as _prec(s_new, c)
    empty = xp.zeros((0, mu.shape[0]), dtype=mu.dtype)
    info = VOGNInfo(c.N_eff, c.delta_tilde, sigma, empty.T, empty, empty, g_hat, h_hat, m, s_new,
                    prec, Delta_mu, mu_new)
    return VOGNState(mu_new, s_new, m, state.t + 1), info


def apply(state: VOGNState, g_hat, h_hat, cfg: VOGNConfig, *,
          signed: bool = False) -> tuple[VOGNState, VOGNInfo]:
    """Apply the update (vogn.7)-(vogn.9) from reduced estimates (e.g. from ``allreduce``).

    info.theta is (D, 0) and info.g_k, info.h_k are (0, D): the draws belong to the workers.

    Parameters
    ----------
    state : VOGNState
        Current state (mu, s, m, t).
    g_hat : array of shape (D,)
        Reduced gradient estimate, in the state's dtype.
    h_hat : array of shape (D,)
        Reduced curvature estimate, >= 0, in the state's dtype.
    cfg : VOGNConfig
        Hyperparameters (N, delta, alpha, beta1, beta2, gamma, tau, rho, curvature).
    signed : bool, default False
        Accept an h_hat with negative entries (a Hessian estimate, as IVON's: the reduction
        (vogn.19) runs VOGN's update on it). VOGN's own GGN and EF estimates are >= 0, and a
        negative one is refused unless this is set.

    Returns
    -------
    state : VOGNState
        The state after the step, t + 1.
    info : VOGNInfo
        The step's intermediates.

    Raises
    ------
    ValueError
        If state or cfg is invalid (see VOGNState, VOGNConfig), g_hat or h_hat is not a finite (D,)
        array of the state's dtype, h_hat has a negative entry (unless signed), or the arrays
        mix NumPy and CuPy.
    """
    D, _ = _check_state(state)
    c = _scales(cfg, D, state.mu.dtype)
    check_array(g_hat, "g_hat", shape=(D,))
    check_array(h_hat, "h_hat", shape=(D,))
    check_same_dtype({"state.mu": state.mu, "g_hat": g_hat, "h_hat": h_hat})
    xp = xp_of(state.mu, g_hat, h_hat)  # one backend
    if not signed and not bool(xp.all(h_hat >= 0)):  # means of squares or GGN diagonals: s >= 0
        raise ValueError(f"h_hat: expected >= 0 everywhere, got min {float(h_hat.min())}")
    return _update(state, g_hat, h_hat, c, _sigma(state.s, c))


def step(state: VOGNState, batch, eps, cfg: VOGNConfig, model) -> tuple[VOGNState, VOGNInfo]:
    """Take one VOGN step (Algorithm 1 of Osawa et al. 2019, corrected as in vogn.md).

    (vogn.2)-(vogn.9).  Equal to
    ``apply(state, *allreduce([local_estimates(state, batch, eps, cfg, model)])[:2], cfg)`` with
    the draws and per-sample estimates kept in the info.  Deterministic given its inputs.

    Parameters
    ----------
    state : VOGNState
        Current state (mu, s, m, t).
    batch : Batch
        The minibatch rows Batch(X_B (M, n_in), y_B (M,)), 1 <= M <= N.
    eps : array of shape (D, S) or None
        Standard-normal draws from the caller, one column per MC sample; None for OGN
        (evaluate at theta = mu, vogn.10).
    cfg : VOGNConfig
        Hyperparameters (N, delta, alpha, beta1, beta2, gamma, tau, rho, curvature).
    model : FlatModel or CNN
        A refbayes.models model with D parameters.

    Returns
    -------
    state : VOGNState
        The state after the step, t + 1.
    info : VOGNInfo
        The step's intermediates, by equation.

    Raises
    ------
    ValueError
        As ``local_estimates``: if state, cfg, model, batch or eps is invalid.
    """
    c, sigma, theta, g_k, h_k, M = _local(state, batch, eps, cfg, model)  # (vogn.2)-(vogn.5)
    g_hat, h_hat, _ = _reduce([Estimates(g_k.mean(axis=0), h_k.mean(axis=0), M)])  # (vogn.5), (vogn.6)
    new, info = _update(state, g_hat, h_hat, c, sigma)                     # (vogn.7)-(vogn.9)
    return new, info._replace(theta=theta, g_k=g_k, h_k=h_k)
