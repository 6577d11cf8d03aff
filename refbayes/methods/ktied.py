"""The k-tied Normal (Swiatkowski et al. 2020, arXiv:2002.02655): mean-field Gaussian VI whose
weight standard deviations are tied by a positive low-rank factorisation, trained like
Bayes-by-Backprop (reparameterisation, closed-form KL, Adam); and the paper's post-hoc analysis
of a trained mean-field posterior (explained-variance spectra, rank-k truncation, evaluation) and
its gradient signal-to-noise ratio.

Implements (ktied.1)-(ktied.17) of derivations/ktied.md.
Symbols: layer l has W_l (m_l, n_l) (m = n_in, n = n_out, theta's row-major layout) and bias
b_l (n_l,); the standard deviations of W_l are A_l = U_l V_l^T with U_l = softplus(R^U_l)
(m_l, k_l) and V_l = softplus(R^V_l) (n_l, k_l); a bias keeps its own scale softplus(r^b_l).
rho (P,) = concat_l (vec R^U_l, vec R^V_l, r^b_l) holds every unconstrained scale parameter,
P = sum_l (k_l (m_l + n_l) + n_l). q(theta) = N(mu, diag(sigma^2)), sigma (D,) from (ktied.1);
eps (D, S) standard-normal draws; a minibatch B of M rows out of N; lam the prior precision,
p = N(0, diag(1 / lam)).

CNNs (refbayes.models.conv.CNN, issue 34): every function that takes a model takes a CNN too;
its layers l are the Conv2d and Dense layers in theta order (pooling, flatten and activations have
no parameters). A Dense layer is tied as above. A Conv2d layer (C_out, C_in, k_h, k_w) is tied as
its im2col matrix, the dense layer it is under unfolding: A_l (Q, C_out), Q = C_in k_h k_w, rows the
patch entries (c, u, v) row-major, columns the output channels, so the standard deviation of kernel
entry (o, c, u, v), at theta offset ((o C_in + c) k_h + u) k_w + v of the layer's block (conv.2),
is A_l[q, o] = sum_j U_l[q, j] V_l[o, j], q = (c k_h + u) k_w + v (ktied.16): the block is
vec_row(A_l^T);
its bias keeps a mean-field scale. The paper's own rule for a convolution kernel was not found
(derivations/ktied.md, "Convolutional layers").

Objective (summed-loss convention, minimized), the BBB estimate (bbb.3)::

    F_hat = (N / (M S)) sum_s sum_{i in B} l_i(mu + sigma * eps_s) + kl_weight * KL(q || p)

Gaussian mean-field VI, the paper's baseline, is ``refbayes.methods.bbb`` unchanged; the
hyperparameters are the same, so ``KTiedConfig`` is ``bbb.BBBConfig``.

Examples
--------
One k-tied Normal step (rank k = 2 in the first layer, 1 in the 4 x 1 output layer) on a small
MLP and 20 synthetic regression points; the caller draws the start's jitter xi, the minibatch and the standard-normal eps:

>>> import numpy as np
>>> from refbayes.datasets import make_linear_regression
>>> from refbayes.methods import ktied
>>> from refbayes.models import MLP
>>> data = make_linear_regression(20, 2, 0, 4.0)  # N = 20 rows, 2 features, seed 0, tau = 4
>>> model = MLP([2, 4, 1], "tanh", "gaussian", noise_precision=4.0)   # D = 17
>>> rng = np.random.default_rng(0)
>>> k = (2, 1)                                    # per layer, each <= min(n_in, n_out)
>>> P = ktied.layout(model, k).P                # the number of scale parameters
>>> state = ktied.init(0.5 * rng.standard_normal(model.D), model, k, 0.1, rng.standard_normal(P))
>>> cfg = ktied.KTiedConfig(N=20, lam=1.0, alpha=0.01)
>>> idx = rng.choice(20, size=8, replace=False)   # minibatch, M = 8
>>> eps = rng.standard_normal((model.D, 2))       # S = 2 draws
>>> batch = ktied.Batch(data.X[idx], data.y[idx])
>>> state, info = ktied.step(state, batch, eps, cfg, model)
>>> P, state.rho.shape, ktied.std(state, model).shape
(22, (22,), (17,))
"""
from __future__ import annotations

import math
import numbers
import warnings
from typing import Any, NamedTuple

import numpy as np

from refbayes._checks import check_array, check_float, check_int, check_same_dtype
from refbayes.backend import to_numpy, xp_of
from refbayes.methods import bbb
from refbayes.methods._estimates import (Batch, check_batch, check_draws, check_model, check_t,
                                         kfac_blocks)
from refbayes.methods.adam import AdamState, _adam, adam_init, check_adam_state, check_lam
from refbayes.methods.bbb import BBBConfig, _kl, _sigmoid, inv_softplus, log_softplus, softplus
from refbayes.models import theta_layout
from refbayes.models.conv import CNN, Conv2d, Dense

__all__ = [
    "Batch",
    "Evaluation",
    "KTiedConfig",
    "KTiedInfo",
    "KTiedLayout",
    "KTiedState",
    "dense_covariance",
    "entropy",
    "evaluate",
    "explained_variance",
    "from_mean_field",
    "init",
    "kl_divergence",
    "layout",
    "log_density",
    "n_variational_params",
    "sample",
    "scale_parameters",
    "snr",
    "std",
    "step",
    "truncate",
    "truncate_sigma",
]

Array = Any

KTiedConfig = BBBConfig  # the same hyperparameters: N, lam, Adam's, kl_weight (ktied.3), (ktied.7)


class KTiedLayout(NamedTuple):
    """Where each layer's scale parameters sit in rho (ktied.1), and its weights in theta.

    Each field is documented by its trailing comment.
    """
    sizes: tuple    # layer widths [n_in, hidden..., n_out] of an MLP; None for a CNN
    k: tuple        # the rank k_l of each layer's tie
    u_off: tuple    # offsets of vec R^U_l (m_l k_l entries, row-major) in rho
    v_off: tuple    # offsets of vec R^V_l (n_l k_l entries, row-major) in rho
    b_off: tuple    # offsets of r^b_l (n_l entries) in rho, -1 without biases
    w_theta: tuple  # offsets of vec W_l in theta
    b_theta: tuple  # offsets of b_l in theta, -1 without biases
    P: int          # len(rho)
    D: int          # len(theta)
    shapes: tuple   # (m_l, n_l) of each tied matrix A_l: (n_in, n_out), or (Q, C_out) for a conv
    conv: tuple     # per layer, True where theta holds vec_row(A_l^T) (a conv kernel) (ktied.16)


class KTiedState(NamedTuple):
    """The k-tied Normal state after t steps.

    Each field is documented by its trailing comment. Every function that takes a state (with its
    model) checks it and raises ValueError unless: model is a FlatModel or CNN; k is a tuple of L
    integers >= 1, one per parameter layer (``layout``; no upper bound is checked); mu is a finite
    float (float64 or float32) (D,) array and rho a finite (P,) array of mu's dtype, D and P those
    of ``layout(model, k)``; t is an integer >= 0; and adam is an AdamState whose m, v are finite
    (D + P,) arrays of mu's dtype with v >= 0 and whose t is an integer >= 0 (checked, though not
    read).
    """
    mu: Array         # mu_t, (D,), (ktied.7)
    rho: Array        # unconstrained scales concat_l (vec R^U_l, vec R^V_l, r^b_l), (P,), (ktied.1)
    adam: AdamState   # moments of [mu; rho], (D + P,) each, (ktied.7); adam.t is not read
    t: int            # steps taken; drives the bias correction (adam.3)
    k: tuple          # the rank k_l of each layer's tie (ktied.1)


class KTiedInfo(NamedTuple):
    """The named intermediates of one k-tied step, by equation.

    Each field is documented by its trailing comment (the equation tag last).
    """
    sigma: Array       # std: vec(U_l V_l^T), softplus(r^b_l) in theta's order, (D,)  (ktied.1)
    theta: Array       # theta_s = mu + sigma * eps_s, (D, S)  (ktied.2)
    g: Array           # g_s = sum_{i in B} grad l_i(theta_s), (S, D)  (bbb.4)
    g_hat: Array       # (N / (M S)) sum_s g_s, (D,)  (bbb.5)
    g_sigma: Array     # (N / (M S)) sum_s g_s * eps_s, (D,)  (ktied.5)
    kl: Array          # KL(q || p), 0-d  (ktied.4)
    grad_mu: Array     # g_hat + kl_weight lam mu, (D,)  (bbb.9)
    grad_sigma: Array  # g_sigma + kl_weight (lam sigma - 1 / sigma), (D,)  (ktied.5)
    grad_rho: Array    # dF/drho through A = U V^T and the softplus, (P,)  (ktied.6)
    loss_hat: Array    # (N / (M S)) sum_s sum_{i in B} l_i(theta_s), 0-d  (ktied.3)
    elbo: Array        # -(loss_hat + kl_weight kl), 0-d  (ktied.3)
    delta: Array       # Adam step on [mu; rho], (D + P,)  (ktied.7)
    mu: Array          # mu_{t+1}, (D,)  (ktied.7)
    rho: Array         # rho_{t+1}, (P,)  (ktied.7)


class Evaluation(NamedTuple):
    """A posterior's scores (ktied.14).

    The standard errors are over examples (the spread of the per-example terms / sqrt(count)),
    the paper's error bars; the posterior's draws are held fixed.

    Each field is documented by its trailing comment.
    """
    neg_elbo: float     # -ELBO per training example, [(1/S) sum_s l(theta_s) + KL] / N
    nll: float          # test negative log predictive density per example
    accuracy: float     # test accuracy of the predictive's argmax, in [0, 1]
    kl: float           # KL(q || p), nats
    neg_elbo_se: float  # standard error of neg_elbo: sd_n((1/S) sum_s l_n(theta_s)) / sqrt(N)
    nll_se: float       # standard error of nll: sd of the per-example NLL / sqrt(N_test)
    accuracy_se: float  # standard error of accuracy: sd of the per-example 0/1 hits / sqrt(N_test)


# ----------------------------------------------------------------------------- layout

def _check_k(k, L: int) -> tuple:
    if isinstance(k, numbers.Integral) and not isinstance(k, bool):
        k = (int(k),) * L
    if not isinstance(k, (tuple, list)) or len(k) != L or any(
            not isinstance(c, numbers.Integral) or isinstance(c, bool) or c < 1 for c in k):
        raise ValueError(f"k: expected an integer >= 1 or a sequence of {L} integers >= 1 (one "
                         f"per layer), got {k!r}")
    return tuple(int(c) for c in k)


def _rho_size(shapes, k, biases) -> int:
    """P = sum_l (m_l + n_l) k_l (+ n_l with a bias), the length of rho (ktied.10)."""
    return sum((m + n) * c + (n if b else 0) for (m, n), c, b in zip(shapes, k, biases))


def _warn_if_redundant(lay) -> None:
    """UserWarning naming each layer whose k_l exceeds min(m_l, n_l) (min(n_in, n_out) of a
    dense layer, min(Q, C_out) of a conv layer): columns beyond that rank add parameters to rho,
    not rank to U_l V_l^T."""
    shapes, k = lay.shapes, lay.k
    biases = tuple(b >= 0 for b in lay.b_off)
    caps = tuple(min(m, n) for m, n in shapes)
    over = [(i, c, cap) for i, (c, cap) in enumerate(zip(k, caps)) if c > cap]
    if not over:
        return
    layers = "; ".join(f"layer {i} ({shapes[i][0]} x {shapes[i][1]}): {c} > {cap}"
                       for i, c, cap in over)
    kept = tuple(min(c, cap) for c, cap in zip(k, caps))
    warnings.warn(f"k: k_l exceeds min(m_l, n_l) of the tied matrix (n_in x n_out for a dense "
                  f"layer, Q x C_out for a conv layer) on {layers}; U_l V_l^T has rank <= "
                  f"min(m_l, n_l) whatever k, so the extra columns are redundant parameters: P = "
                  f"{_rho_size(shapes, k, biases)}, against {_rho_size(shapes, kept, biases)} with "
                  f"k = {kept}", UserWarning, stacklevel=3)


def layout(model, k) -> KTiedLayout:
    """Compute where each layer's scale parameters sit in rho (ktied.1).

    Parameters
    ----------
    model : FlatModel or CNN
        A refbayes.models model (MLP, or a linear model: one layer), or a CNN: its Conv2d and
        Dense layers in theta order, a conv layer tied as its (Q, C_out) matrix (ktied.16).
    k : int or sequence of int
        The rank of the tie, one for every layer or one per layer, each >= 1. A k_l above
        min(n_in, n_out) of its layer is kept as given, not clamped and not refused, with a
        UserWarning: U_l V_l^T has rank <= min(n_in, n_out) whatever k_l (that rank is already
        exact, ktied.11), so the extra k_l - min(n_in, n_out) columns of R^U_l, R^V_l are
        redundant parameters that P counts as (ktied.10) does. It is still a valid tie (a golden
        trace uses k = 4 on a (5, 3) layer). Pass one k per layer to avoid them.

    Returns
    -------
    KTiedLayout
        The offsets of R^U_l, R^V_l, r^b_l in rho and of W_l, b_l in theta.

    Raises
    ------
    ValueError
        If model is not a FlatModel or CNN or k is not an integer >= 1 or a sequence of them, one
        per layer.

    Warns
    -----
    UserWarning
        If a k_l exceeds min(n_in, n_out) of its layer; the message gives P and the P of the
        same tie with each such k_l lowered to min(n_in, n_out).
    """
    lay = _layout(model, k)
    _warn_if_redundant(lay)
    return lay


def _layout(model, k) -> KTiedLayout:
    """``layout`` without its warning, for the functions of a tie already made (or warned
    about by their own caller-facing check)."""
    check_model(model, cnn=True)
    if isinstance(model, CNN):
        layers = _cnn_tied_layers(model)
        sizes, tied = None, tuple(layer[:4] for layer in layers)
        w_theta = tuple(w0 for *_, w0 in layers)
        b_theta = tuple(w0 + m * n if bias else -1 for m, n, bias, _, w0 in layers)
        D = model.D
    else:
        sizes = tuple(model.sizes)
        tied = tuple((m, n, model.bias, False) for m, n in zip(sizes[:-1], sizes[1:]))
        theta_lay = theta_layout(sizes, model.bias)
        w_theta, b_theta, D = theta_lay.w_off, theta_lay.b_off, theta_lay.D
    k = _check_k(k, len(tied))
    u_off, v_off, b_off, pos = [], [], [], 0
    for (m, n, bias, _), c in zip(tied, k):
        u_off.append(pos)
        v_off.append(pos + m * c)
        pos += (m + n) * c
        b_off.append(pos if bias else -1)
        pos += n if bias else 0
    return KTiedLayout(sizes, k, tuple(u_off), tuple(v_off), tuple(b_off), w_theta, b_theta, pos,
                       D, tuple((m, n) for m, n, _, _ in tied), tuple(cv for *_, cv in tied))


def _cnn_tied_layers(model) -> tuple:
    """(m_l, n_l, has bias, conv, offset of the weights in theta) per parameter layer of a CNN,
    read off the K-FAC block map (``kfac_blocks``, (conv.24), (conv.33)): layer l ties its W~
    without the bias row, the im2col matrix A_l (Q, C_out), Q = C_in k_h k_w, of a Conv2d, the
    W (n_in, n_out) of a Dense; its weights start the layer's slice, its bias follows them.
    (ktied.16)"""
    layers = [layer for layer in model.layers if isinstance(layer, (Conv2d, Dense))]
    return tuple((blk.n_a - layer.bias, blk.n_b, layer.bias, isinstance(layer, Conv2d),
                  blk.start) for layer, blk in zip(layers, kfac_blocks(model)))  # (ktied.16)


def _weights(vec, lay, l):
    """Layer l's tied matrix (m, n) read from a (D,) vector in theta's order: the row-major block
    of a dense layer, the transpose of the (C_out, Q) block of a conv layer (a view).  (ktied.16)"""
    m, n = lay.shapes[l]
    w0 = lay.w_theta[l]
    if lay.conv[l]:
        return vec[w0:w0 + m * n].reshape(n, m).T                                   # (ktied.16)
    return vec[w0:w0 + m * n].reshape(m, n)


def n_variational_params(model, k=None) -> int:
    """Count the variational parameters: 2 D for mean field (k None), D + P for k-tied.

    P = sum_l (k_l (m_l + n_l) + n_l) (ktied.10).  MLP 784-400-400-10: 956,820 (mean field),
    481,614, 484,008, 486,402 (k = 1, 2, 3).

    Parameters
    ----------
    model : FlatModel or CNN
        The model.
    k : int or sequence of int, optional
        The tie's rank; None for the mean-field family.

    Returns
    -------
    int
        The number of variational parameters (means and scales).

    Raises
    ------
    ValueError
        If model is not a FlatModel or CNN or k is neither None, an integer >= 1 nor a sequence of
        them, one per layer.

    Warns
    -----
    UserWarning
        If a k_l exceeds min(n_in, n_out) of its layer, as ``layout``.
    """
    check_model(model, cnn=True)
    if k is None:
        return 2 * model.D
    lay = _layout(model, k)
    _warn_if_redundant(lay)
    return model.D + lay.P  # (ktied.10)


# ----------------------------------------------------------------------------- sigma from rho

def _blocks(rho, lay, l):
    """(R^U_l (m, k), R^V_l (n, k), r^b_l (n,) or None): views into rho."""
    (m, n), c = lay.shapes[l], lay.k[l]
    RU = rho[lay.u_off[l]:lay.u_off[l] + m * c].reshape(m, c)
    RV = rho[lay.v_off[l]:lay.v_off[l] + n * c].reshape(n, c)
    rb = rho[lay.b_off[l]:lay.b_off[l] + n] if lay.b_off[l] >= 0 else None
    return RU, RV, rb


def _sigma(xp, rho, lay):
    """sigma (D,) in theta's order and the factors [(U_l, V_l)] (ktied.1)."""
    parts, factors = [], []
    for l in range(len(lay.k)):
        RU, RV, rb = _blocks(rho, lay, l)
        U, V = softplus(RU), softplus(RV)                                    # (ktied.1)
        factors.append((U, V))
        if lay.conv[l]:  # theta holds the conv kernel (C_out, Q): A_l^T = V U^T row-major
            parts.append((V @ U.T).reshape(-1))                              # (ktied.16)
        else:
            parts.append((U @ V.T).reshape(-1))                              # (ktied.1)
        if rb is not None:
            parts.append(softplus(rb))                                       # (ktied.1)
    return xp.concatenate(parts), factors


def _log_sigma(xp, rho, lay, sigma):
    """log sigma: log(U V^T) for tied entries (a sum of positive terms), log softplus(r^b) for
    biases (finite where softplus underflows).  (ktied.4)"""
    out = xp.log(sigma)
    for l in range(len(lay.k)):
        rb = _blocks(rho, lay, l)[2]
        if rb is not None:
            b0 = lay.b_theta[l]
            out[b0:b0 + rb.shape[0]] = log_softplus(rb)
    return out


def _chain(xp, G_sigma, rho, lay, factors, out=None):
    """dF/drho from dF/dsigma: dF/dU = G V, dF/dV = G^T U, times sigmoid, written into ``out``
    (P,) (a fresh array when None).  (ktied.6)"""
    out = xp.empty_like(rho) if out is None else out
    for l, (U, V) in enumerate(factors):
        (m, n), c = lay.shapes[l], lay.k[l]
        RU, RV, rb = _blocks(rho, lay, l)
        G = _weights(G_sigma, lay, l)  # dF/dA_l (m, n); a conv block read transposed (ktied.17)
        # dF/dR^U = (G V) * sigmoid(R^U), dF/dR^V = (G^T U) * sigmoid(R^V)  (ktied.6)
        out[lay.u_off[l]:lay.u_off[l] + m * c] = ((G @ V) * _sigmoid(xp, RU)).reshape(-1)
        out[lay.v_off[l]:lay.v_off[l] + n * c] = ((G.T @ U) * _sigmoid(xp, RV)).reshape(-1)
        if rb is not None:
            Gb = G_sigma[lay.b_theta[l]:lay.b_theta[l] + n]
            out[lay.b_off[l]:lay.b_off[l] + n] = Gb * _sigmoid(xp, rb)      # (ktied.6)
    return out


# ----------------------------------------------------------------------------- state

def _check_state(state, model) -> KTiedLayout:
    if not isinstance(state, KTiedState):
        raise ValueError(f"state: expected a KTiedState, got {type(state).__name__}")
    check_model(model, cnn=True)
    if not isinstance(state.k, tuple):
        raise ValueError(f"state.k: expected a tuple of integers >= 1, got {state.k!r}")
    lay = _layout(model, state.k)  # init warned about a redundant k
    check_array(state.mu, "state.mu", shape=(lay.D,))
    check_float(state.mu, "state.mu")
    check_array(state.rho, "state.rho", shape=(lay.P,))
    check_same_dtype({"state.mu": state.mu, "state.rho": state.rho})
    check_t(state.t)
    check_adam_state(state.adam, lay.D + lay.P, state.mu.dtype, "state.adam")
    xp_of(state.mu, state.rho)
    return lay


def _fresh(mu, rho, k) -> KTiedState:
    xp = xp_of(mu, rho)
    return KTiedState(mu, rho, adam_init(xp.concatenate([mu, rho])), 0, k)


def init(mu, model, k, sigma0: float, xi, jitter: float = 0.1) -> KTiedState:
    """Create the initial state: A_l = sigma0 everywhere, perturbed by the caller's draws.

    Every entry of U_l and V_l is c_l = sqrt(sigma0 / k_l), so U_l V_l^T = sigma0, and each bias
    scale is sigma0; then rho = softplus^{-1}(those) + jitter * xi (ktied.8).  The perturbation
    breaks the symmetry between the k_l columns: with jitter * xi = 0 they receive equal
    gradients forever and the tie stays rank 1.  Zero Adam moments, t = 0.

    Parameters
    ----------
    mu : array of shape (D,)
        Initial mean.
    model : FlatModel or CNN
        The model (its layer widths fix the layout).
    k : int or sequence of int
        The tie's rank, for every layer or per layer, each >= 1.
    sigma0 : float
        Initial standard deviation > 0 (the mean-field start it reproduces).
    xi : array of shape (P,)
        The caller's standard-normal draws (P from ``layout(model, k).P``), mu's dtype and
        backend; zeros give the exactly symmetric start.
    jitter : float, default 0.1
        Scale >= 0 of the perturbation, in rho's units.

    Returns
    -------
    KTiedState
        The state (mu, rho, zero moments, 0, k).

    Raises
    ------
    ValueError
        If mu is not a finite float (D,) array, k not a valid rank, sigma0 not a finite
        number > 0, jitter not a finite number >= 0, or xi not a finite (P,) array of mu's
        dtype on mu's backend.

    Warns
    -----
    UserWarning
        If a k_l exceeds min(n_in, n_out) of its layer, as ``layout``; the functions that take
        the state do not warn again.
    """
    check_model(model, cnn=True)
    lay = _layout(model, k)
    _warn_if_redundant(lay)
    xp = xp_of(mu, xi)
    check_array(mu, "mu", shape=(lay.D,))
    check_float(mu, "mu")
    for name, value, ok in (("sigma0", sigma0, lambda v: v > 0), ("jitter", jitter, lambda v: v >= 0)):
        if not isinstance(value, numbers.Real) or isinstance(value, bool) or not math.isfinite(
                value) or not ok(value):
            raise ValueError(f"{name}: expected a finite number {'> 0' if name == 'sigma0' else '>= 0'}, "
                             f"got {value!r}")
    check_array(xi, "xi", shape=(lay.P,))
    check_same_dtype({"mu": mu, "xi": xi})
    start = xp.empty(lay.P, dtype=mu.dtype)
    for l in range(len(lay.k)):
        (m, n), c = lay.shapes[l], lay.k[l]
        start[lay.u_off[l]:lay.u_off[l] + (m + n) * c] = math.sqrt(sigma0 / c)   # (ktied.8)
        if lay.b_off[l] >= 0:
            start[lay.b_off[l]:lay.b_off[l] + n] = sigma0                       # (ktied.8)
    rho = inv_softplus(start) + jitter * xi                                      # (ktied.8)
    return _fresh(mu, rho, lay.k)


def _exact_factors(xp, A):
    """Positive U (m, k), V (n, k), k = min(m, n), with U V^T = A for A > 0.  (ktied.11)"""
    transpose = A.shape[0] < A.shape[1]
    B = A.T if transpose else A                       # B (m >= n)
    n = B.shape[1]
    r = B.sum(axis=1)
    c = 0.5 * float(xp.min(B / r[:, None]))           # c < B_ij / r_i for all i, j
    delta = c / (1.0 - n * c)
    V = xp.eye(n, dtype=A.dtype) + delta              # I + delta 1 1^T        (ktied.11)
    U = B - c * r[:, None]                            # B V^{-T} = B - c r 1^T (ktied.11)
    return (V, U) if transpose else (U, V)


def from_mean_field(mu, sigma, model) -> KTiedState:
    """Convert a mean-field posterior N(mu, diag(sigma^2)) into the same distribution, k-tied.

    Each layer gets k_l = min(m_l, n_l) and positive factors with U_l V_l^T = A_l exactly
    (ktied.11); biases keep their scales.  Zero Adam moments, t = 0.

    Parameters
    ----------
    mu : array of shape (D,)
        Mean.
    sigma : array of shape (D,)
        Standard deviations > 0, mu's dtype.
    model : FlatModel or CNN
        The model.

    Returns
    -------
    KTiedState
        A state whose ``std`` equals sigma to rounding.

    Raises
    ------
    ValueError
        If model is not a FlatModel or CNN, mu is not a finite float (D,) array or sigma is not a
        finite (D,) array > 0 of mu's dtype.
    """
    check_model(model, cnn=True)
    xp = xp_of(mu, sigma)
    check_array(mu, "mu", shape=(model.D,))
    check_float(mu, "mu")
    check_array(sigma, "sigma", shape=(model.D,))
    check_same_dtype({"mu": mu, "sigma": sigma})
    if not bool(xp.all(sigma > 0)):
        raise ValueError("sigma: expected > 0 everywhere (standard deviations)")
    lay = _layout(model, 1)
    lay = _layout(model, tuple(min(m, n) for m, n in lay.shapes))
    pos = xp.empty(lay.P, dtype=mu.dtype)
    for l in range(len(lay.k)):
        (m, n), c = lay.shapes[l], lay.k[l]
        A = _weights(sigma, lay, l)                   # (m, n); a conv's (Q, C_out) (ktied.16)
        U, V = _exact_factors(xp, A)
        pos[lay.u_off[l]:lay.u_off[l] + m * c] = U.reshape(-1)
        pos[lay.v_off[l]:lay.v_off[l] + n * c] = V.reshape(-1)
        if lay.b_off[l] >= 0:
            pos[lay.b_off[l]:lay.b_off[l] + n] = sigma[lay.b_theta[l]:lay.b_theta[l] + n]
    return _fresh(mu, inv_softplus(pos), lay.k)


# ----------------------------------------------------------------------------- the distribution

def std(state: KTiedState, model):
    """Compute the standard deviations sigma (D,): vec(U_l V_l^T) and the bias scales (ktied.1).

    Parameters
    ----------
    state : KTiedState
        The state.
    model : FlatModel or CNN
        The model the state belongs to.

    Returns
    -------
    array of shape (D,)
        The standard deviations sigma, in theta's order.

    Raises
    ------
    ValueError
        If state is invalid for model (see KTiedState).
    """
    lay = _check_state(state, model)
    return _sigma(xp_of(state.rho), state.rho, lay)[0]


def scale_parameters(state: KTiedState, model) -> list:
    """Return the positive factors of every layer: [(U_l, V_l, sigma_b_l or None)] (ktied.1).

    Parameters
    ----------
    state : KTiedState
        The state.
    model : FlatModel or CNN
        The model the state belongs to.

    Returns
    -------
    list of tuple
        (U_l (m_l, k_l), V_l (n_l, k_l), softplus(r^b_l) (n_l,) or None) per layer.

    Raises
    ------
    ValueError
        If state is invalid for model (see KTiedState).
    """
    lay = _check_state(state, model)
    out = []
    for l in range(len(lay.k)):
        RU, RV, rb = _blocks(state.rho, lay, l)
        out.append((softplus(RU), softplus(RV), None if rb is None else softplus(rb)))
    return out


def sample(state: KTiedState, eps, model):
    """Draw theta_s = mu + sigma * eps_s from q (ktied.2).

    Parameters
    ----------
    state : KTiedState
        The state.
    eps : array of shape (D, S)
        Standard-normal draws from the caller, one column per sample.
    model : FlatModel or CNN
        The model the state belongs to.

    Returns
    -------
    array of shape (D, S)
        The draws.

    Raises
    ------
    ValueError
        If state is invalid for model (see KTiedState), or eps not a finite (D, S >= 1) array of
        the state's dtype and backend.
    """
    lay = _check_state(state, model)
    xp_of(state.mu, eps)
    check_draws(eps, lay.D, state.mu.dtype)
    sigma = _sigma(xp_of(state.rho), state.rho, lay)[0]
    return state.mu[:, None] + sigma[:, None] * eps  # (ktied.2)


def dense_covariance(state: KTiedState, model):
    """Form the dense covariance diag(sigma^2), for tests (ktied.2).

    Parameters
    ----------
    state : KTiedState
        The state.
    model : FlatModel or CNN
        The model the state belongs to.

    Returns
    -------
    array of shape (D, D)
        The covariance.

    Raises
    ------
    ValueError
        If state is invalid for model (see KTiedState).
    """
    sigma = std(state, model)
    return xp_of(sigma).diag(sigma * sigma)


def kl_divergence(state: KTiedState, model, lam):
    """Compute KL(q || N(0, diag(1 / lam))) in closed form (ktied.4).

    Parameters
    ----------
    state : KTiedState
        The state.
    model : FlatModel or CNN
        The model the state belongs to.
    lam : float or array of shape (D,)
        Prior precision > 0 (an array in the state's dtype).

    Returns
    -------
    array of shape ()
        The divergence.

    Raises
    ------
    ValueError
        If state is invalid for model (see KTiedState) or lam not a finite precision > 0.
    """
    lay = _check_state(state, model)
    xp = xp_of(state.mu, state.rho)
    lam = check_lam(lam, lay.D, state.mu.dtype, strict=True)
    sigma = _sigma(xp, state.rho, lay)[0]
    return _kl(xp, state.mu, sigma, _log_sigma(xp, state.rho, lay, sigma), lam)


def entropy(state: KTiedState, model):
    """Compute H[q] = (1/2) sum_j log(2 pi e sigma_j^2) (ktied.4).

    Parameters
    ----------
    state : KTiedState
        The state.
    model : FlatModel or CNN
        The model the state belongs to.

    Returns
    -------
    array of shape ()
        The entropy, nats.

    Raises
    ------
    ValueError
        If state is invalid for model (see KTiedState).
    """
    lay = _check_state(state, model)
    xp = xp_of(state.rho)
    sigma = _sigma(xp, state.rho, lay)[0]
    log_sigma = _log_sigma(xp, state.rho, lay, sigma)
    return xp.sum(log_sigma) + 0.5 * lay.D * (1.0 + math.log(2.0 * math.pi))  # (ktied.4)


def log_density(state: KTiedState, model, x):
    """Compute log q(x) for points x, (D,) or (D, S) one per column (ktied.4).

    Parameters
    ----------
    state : KTiedState
        The state.
    model : FlatModel or CNN
        The model the state belongs to.
    x : array of shape (D,) or (D, S)
        Points, the state's dtype and backend.

    Returns
    -------
    array of shape () or (S,)
        The log density log q at each point.

    Raises
    ------
    ValueError
        If state is invalid for model (see KTiedState) or x is not a finite (D,) or (D, S) array of
        the state's dtype.
    """
    lay = _check_state(state, model)
    xp = xp_of(state.mu, x)
    if getattr(x, "ndim", None) not in (1, 2):
        raise ValueError(f"x: expected shape ({lay.D},) or ({lay.D}, S), got "
                         f"{getattr(x, 'shape', type(x).__name__)}")
    check_array(x, "x", ndim=x.ndim)
    if x.shape[0] != lay.D:
        raise ValueError(f"x: expected {lay.D} rows, got shape {tuple(x.shape)}")
    check_same_dtype({"state.mu": state.mu, "x": x})
    sigma = _sigma(xp, state.rho, lay)[0]
    log_sigma = _log_sigma(xp, state.rho, lay, sigma)
    mu, sig, ls = (state.mu, sigma, log_sigma) if x.ndim == 1 else (
        state.mu[:, None], sigma[:, None], log_sigma[:, None])
    z = (x - mu) / sig
    return -0.5 * xp.sum(z * z + 2.0 * ls + math.log(2.0 * math.pi), axis=0)  # (ktied.4)


# ----------------------------------------------------------------------------- the step

def step(state: KTiedState, batch, eps, cfg: KTiedConfig, model) -> tuple[KTiedState, KTiedInfo]:
    """Take one k-tied step: reparameterisation gradients through A = U V^T, Adam on [mu; rho].

    (ktied.1)-(ktied.7), with (bbb.4), (bbb.5), (bbb.9) and Adam (adam.1)-(adam.4).
    Deterministic given its inputs.  Costs one batched forward and backward pass over the S
    draws (``model.sample_losses_and_grads``: the gradients and the losses of the ELBO estimate
    in the info) and two (m, n) x (n or m, k) products per layer.

    Parameters
    ----------
    state : KTiedState
        Current state.
    batch : Batch
        The minibatch rows Batch(X_B (M, n_in), y_B (M,)), 1 <= M <= N.
    eps : array of shape (D, S)
        Standard-normal draws, one column per MC sample, for the gradient AND the ELBO estimate.
    cfg : KTiedConfig
        Hyperparameters (``bbb.BBBConfig``).
    model : FlatModel or CNN
        The model the state belongs to.

    Returns
    -------
    state : KTiedState
        The state after the step, t + 1.
    info : KTiedInfo
        The step's intermediates, by equation.

    Raises
    ------
    ValueError
        If state or cfg is invalid (see KTiedState, BBBConfig); if batch does not fit model (see
        Batch); if eps is not a finite (D, S >= 1) array of the state's dtype; or if the arrays mix
        NumPy and CuPy.
    """
    lay = _check_state(state, model)
    xp = xp_of(state.mu, state.rho, eps)
    dtype = state.mu.dtype
    N, lam, (alpha, beta1, beta2, eps_adam), kl_weight = bbb._check_cfg(cfg, lay.D, dtype)
    X, y, M = check_batch(batch, model, N, dtype)
    S = check_draws(eps, lay.D, dtype)
    mu, rho, D = state.mu, state.rho, lay.D
    c = N / (M * S)
    sigma, factors = _sigma(xp, rho, lay)                                           # (ktied.1)
    theta = mu[:, None] + sigma[:, None] * eps                                      # (ktied.2)
    losses, g = model.sample_losses_and_grads(xp.ascontiguousarray(theta.T), X, y)  # (ktied.3), (bbb.4)
    g_hat = c * g.sum(axis=0)                                                       # (bbb.5)
    g_sigma = c * (g * eps.T).sum(axis=0)                                           # (ktied.5)
    log_sigma = _log_sigma(xp, rho, lay, sigma)
    kl = _kl(xp, mu, sigma, log_sigma, lam)                                         # (ktied.4)
    # [dF/dmu; dF/drho] written into one fresh (D + P,) array, Adam's input without a
    # concatenation; info.grad_mu, info.grad_rho are its parts (the printed sums bit for bit)
    grad = xp.empty(D + lay.P, dtype=dtype)
    grad_mu = grad[:D]
    xp.multiply(lam, mu, out=grad_mu)
    grad_mu *= kl_weight
    grad_mu += g_hat                                                                # (bbb.9)
    grad_sigma = g_sigma + kl_weight * (lam * sigma - xp.exp(-log_sigma))           # (ktied.5)
    grad_rho = _chain(xp, grad_sigma, rho, lay, factors, out=grad[D:])              # (ktied.6)
    loss_hat = c * losses.sum()                                                     # (ktied.3)
    elbo = -(loss_hat + kl_weight * kl)                                             # (ktied.3)
    delta, adam = _adam(xp, grad, state.adam, alpha, beta1, beta2, eps_adam,
                        state.t)                                                    # (ktied.7)
    mu_new = mu + delta[:D]                                                         # (ktied.7)
    rho_new = rho + delta[D:]                                                       # (ktied.7)
    info = KTiedInfo(sigma, theta, g, g_hat, g_sigma, kl, grad_mu, grad_sigma, grad_rho,
                     loss_hat, elbo, delta, mu_new, rho_new)
    return KTiedState(mu_new, rho_new, adam, state.t + 1, lay.k), info


# ----------------------------------------------------------------------------- post-hoc analysis

def _check_matrix(A, name="A"):
    check_array(A, name, ndim=2)
    check_float(A, name)
    if min(A.shape) < 1:
        raise ValueError(f"{name}: expected a non-empty matrix, got shape {tuple(A.shape)}")


def explained_variance(A):
    """Compute the fraction of variance of each singular value, gamma_i^2 / sum_j gamma_j^2.

    (ktied.12)  The fractions are in decreasing order and sum to 1.

    Parameters
    ----------
    A : array of shape (m, n)
        A matrix (a layer's standard deviations, or its means), not all zero.

    Returns
    -------
    array of shape (min(m, n),)
        The explained-variance fractions.

    Raises
    ------
    ValueError
        If A is not a finite float 2-d array with a non-zero entry.
    """
    _check_matrix(A)
    xp = xp_of(A)
    gamma = xp.linalg.svd(A, compute_uv=False)
    total = xp.sum(gamma * gamma)
    if not float(total) > 0:
        raise ValueError("A: expected a non-zero matrix (its variance is 0)")
    return gamma * gamma / total  # (ktied.12)


def truncate(A, k: int):
    """Compute the rank-k truncated SVD A^(k) = sum_{i <= k} gamma_i u_i v_i^T (ktied.13).

    The best rank-k approximation of A in Frobenius norm (Eckart-Young).

    Parameters
    ----------
    A : array of shape (m, n)
        The matrix.
    k : int
        The rank, 1 <= k <= min(m, n).

    Returns
    -------
    array of shape (m, n)
        A^(k).

    Raises
    ------
    ValueError
        If A is not a finite float 2-d array or k is not an integer in [1, min(m, n)].
    """
    _check_matrix(A)
    k = check_int(k, "k", low=1, high=min(A.shape))
    xp = xp_of(A)
    U, gamma, Vt = xp.linalg.svd(A, full_matrices=False)
    return (U[:, :k] * gamma[:k]) @ Vt[:k]  # (ktied.13)


def truncate_sigma(sigma, model, k: int):
    """Replace every weight block A_l of a mean-field sigma by ``|A_l^(k)|`` (ktied.13).

    Biases keep their scales.  An entry that becomes exactly 0 stays 0 (a degenerate direction:
    the KL is then infinite); nothing is clipped.

    Parameters
    ----------
    sigma : array of shape (D,)
        Mean-field standard deviations, > 0.
    model : FlatModel or CNN
        The model.
    k : int
        The rank, 1 <= k <= min(m_l, n_l) for every layer.

    Returns
    -------
    array of shape (D,)
        The truncated standard deviations.

    Raises
    ------
    ValueError
        If model is not a FlatModel or CNN, sigma is not a finite float (D,) array > 0, or k is not
        an integer in [1, min(m_l, n_l)] for every layer.
    """
    check_model(model, cnn=True)
    xp = xp_of(sigma)
    check_array(sigma, "sigma", shape=(model.D,))
    check_float(sigma, "sigma")
    if not bool(xp.all(sigma > 0)):
        raise ValueError("sigma: expected > 0 everywhere (standard deviations)")
    if isinstance(model, CNN):
        lay = _layout(model, 1)
        out = sigma.copy()
        for l in range(len(lay.k)):
            # A_l (m, n), a conv's (Q, C_out); written back through the same view (ktied.16)
            _weights(out, lay, l)[...] = xp.abs(truncate(_weights(sigma, lay, l), k))  # (ktied.13)
        return out
    lay = theta_layout(tuple(model.sizes), model.bias)
    out = sigma.copy()
    for l, (m, n) in enumerate(zip(model.sizes[:-1], model.sizes[1:])):
        w0 = lay.w_off[l]
        A = sigma[w0:w0 + m * n].reshape(m, n)
        out[w0:w0 + m * n] = xp.abs(truncate(A, k)).reshape(-1)  # (ktied.13)
    return out


def evaluate(mu, sigma, model, train, test, eps, lam) -> Evaluation:
    """Score the posterior N(mu, diag(sigma^2)) of a classifier (ktied.14).

    -ELBO per training example [(1/S) sum_s l(theta_s) + KL] / N on the whole training set, and
    the test NLL and accuracy of the predictive (1/S) sum_s p(y | x, theta_s), with the same S
    draws theta_s = mu + sigma * eps_s throughout.

    Parameters
    ----------
    mu : array of shape (D,)
        Mean.
    sigma : array of shape (D,)
        Standard deviations >= 0, mu's dtype (0 gives an infinite KL).
    model : FlatModel or CNN
        A classifier (bernoulli or categorical likelihood).
    train : Batch
        The whole training set (X (N, n_in), y (N,)).
    test : Batch
        The test set (X (N_test, n_in), y (N_test,)).
    eps : array of shape (D, S)
        Standard-normal draws from the caller.
    lam : float or array of shape (D,)
        Prior precision > 0.

    Returns
    -------
    Evaluation
        The scores neg_elbo, nll, accuracy, kl and the standard errors over examples.

    Raises
    ------
    ValueError
        If model is not a classifier, mu or sigma is not a finite (D,) float array (sigma >= 0),
        eps not a finite (D, S >= 1) array, lam not a finite precision > 0, or train / test are
        not (X, y) pairs of the model's shapes in mu's dtype.
    """
    check_model(model, getattr(mu, "shape", (None,))[0], cnn=True)
    if model.likelihood.name not in ("bernoulli", "categorical"):
        raise ValueError(f"model: expected a classifier (bernoulli or categorical likelihood), "
                         f"got {model.likelihood.name!r}")
    xp = xp_of(mu, sigma, eps)
    check_array(mu, "mu", shape=(model.D,))
    check_float(mu, "mu")
    check_array(sigma, "sigma", shape=(model.D,))
    check_same_dtype({"mu": mu, "sigma": sigma})
    if not bool(xp.all(sigma >= 0)):
        raise ValueError("sigma: expected >= 0 everywhere (standard deviations)")
    S = check_draws(eps, model.D, mu.dtype)
    lam = check_lam(lam, model.D, mu.dtype, strict=True)
    X, y, N = check_batch(train, model, None, mu.dtype, "train")
    X_te, y_te, _ = check_batch(test, model, None, mu.dtype, "test")
    with np.errstate(divide="ignore"):
        log_sigma = xp.log(sigma)
    kl = float(_kl(xp, mu, sigma, log_sigma, lam))                          # (ktied.4)
    theta = mu[:, None] + sigma[:, None] * eps                                 # (ktied.2)
    losses = to_numpy(sum(model.per_example_losses(xp.ascontiguousarray(theta[:, s]), X, y)
                          for s in range(S)) / S)          # (1/S) sum_s l_n(theta_s) (ktied.14)
    probs = sum(model.predict(xp.ascontiguousarray(theta[:, s]), X_te)
                for s in range(S)) / S                     # the predictive (ktied.14)
    probs, y_int = to_numpy(probs), to_numpy(y_te).astype(np.int64)
    if probs.ndim == 1:  # bernoulli: p(y = 1)
        probs = np.stack([1.0 - probs, probs], axis=1)
    # per-example terms, their means the scores and their spreads the standard errors; the
    # clamp at the smallest normal float is metrics.nll's
    nll_n = -np.log(np.maximum(probs[np.arange(len(y_int)), y_int], np.finfo(probs.dtype).tiny))
    hits = (np.argmax(probs, axis=1) == y_int).astype(np.float64)
    se = lambda a: float(np.std(a, ddof=1) / math.sqrt(len(a))) if len(a) > 1 else math.nan  # noqa: E731
    return Evaluation((float(losses.sum()) + kl) / N, float(nll_n.mean()), float(hits.mean()),
                      kl, se(losses), se(nll_n), se(hits))                 # (ktied.14)


def snr(G):
    """Estimate each parameter's gradient signal-to-noise ratio mean(g)^2 / var(g) (ktied.15).

    From R independent stochastic gradients (over minibatches and draws, at one state); the
    variance is the unbiased one (ddof = 1).  The issue's E[g^2] / Var[g] reading is 1 + this.

    Parameters
    ----------
    G : array of shape (R, P)
        R >= 2 gradients of P parameters.

    Returns
    -------
    array of shape (P,)
        SNR per parameter; inf where all R gradients are equal (a deterministic gradient) and
        not 0, nan where they are all 0.

    Raises
    ------
    ValueError
        If G is not a finite float (R >= 2, P) array.
    """
    check_array(G, "G", ndim=2)
    check_float(G, "G")
    if G.shape[0] < 2:
        raise ValueError(f"G: expected at least 2 gradients (rows) for a variance, got shape "
                         f"{tuple(G.shape)}")
    xp_of(G)  # one backend
    mean = G.mean(axis=0)
    # the variance of the rows shifted by the first (shift-invariant): exactly 0 where every
    # gradient is the same (a parameter no data term reaches, e.g. a weight of an input pixel
    # that is 0 in every image), where G.var would leave rounding noise and a huge finite SNR
    var = (G - G[0]).var(axis=0, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return mean * mean / var  # (ktied.15)
