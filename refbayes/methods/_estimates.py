"""Shared pieces of the natural-gradient Gaussian VI family (ngvi, slang): the step-size
schedule, input checks, and the minibatch / Monte Carlo estimates of the gradient and curvature
of E_q[sum_n l_n(theta)].

Implements (ngvi.7)-(ngvi.11), (ngvi.12) and (ngvi.13) of derivations/ngvi.md. Scaling, stated once for the
whole family: the loss is SUMMED over the N training examples, a minibatch of M rows stands for
all N through the factor N / M, and S Monte Carlo draws theta_s are averaged (factor 1 / S). The
prior precision lam (D,) is never scaled by N, M or S.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, NamedTuple

import numpy as np

from refbayes._checks import (
    check_array,
    check_binary,
    check_float,
    check_in_range,
    check_int,
    check_positive,
    check_positive_vector,
    check_same_dtype,
)
from refbayes.backend import xp_of
from refbayes.methods import exact_vi
from refbayes.models.base import FlatModel
from refbayes.models.conv import CNN
from refbayes.models.likelihoods import Bernoulli, Gaussian
from refbayes.models.linear import add_intercept

Array = Any

CURVATURES = ("ef", "hess", "exact")


class Batch(NamedTuple):
    """A minibatch: the rows the caller selected (explicit randomness: the driver draws them).

    Each field is documented by its trailing comment.  A step checks its batch against the model
    and the training-set size N and raises ValueError unless: it is a pair (X, y) (a Batch or a
    tuple); X is a finite (M, n_in) array with 1 <= M <= N rows in the state's dtype; y is a
    finite (M,) or (M, n_out) array; real targets, and labels stored as floats, are in the
    state's dtype; and labels are binary for a Bernoulli likelihood (``check_batch``).
    """
    X: Array  # X_B, (M, n_in), raw inputs (the model appends its intercept column itself)
    y: Array  # y_B, (M,) labels / targets; (M, n_out) for a multi-output gaussian likelihood


def step_sizes(t: int, alpha: float, beta: float, decay: float) -> tuple[float, float]:
    """Step sizes of step t = 0, 1, ... (the number of steps already taken).  (ngvi.12)

    The official SLANG code's schedule, with k = t + 1 its 1-based iteration counter:
    alpha_t = alpha / (1 + k^decay) and beta_t = beta / (1 + k^decay) for decay > 0, and the
    constant alpha, beta for decay = 0 (the code special-cases 0, so the schedule jumps from
    alpha / 2 to alpha as decay -> 0). The paper's tables use decay = 0.51.
    """
    if decay == 0:
        return alpha, beta
    shrink = 1.0 / (1.0 + (t + 1) ** decay)
    return alpha * shrink, beta * shrink  # (ngvi.12)


def check_hyper(alpha, beta, decay, momentum):
    """The shared hyperparameter ranges of cfg.alpha, cfg.beta, cfg.decay, cfg.momentum, each a
    finite real (NaN and inf rejected); returns them as floats."""
    alpha = check_in_range(alpha, "cfg.alpha", 0.0, 1.0, low_open=True)
    beta = check_in_range(beta, "cfg.beta", 0.0, 1.0, low_open=True)
    decay = check_in_range(decay, "cfg.decay", 0.0, math.inf, high_open=True)
    momentum = check_in_range(momentum, "cfg.momentum", 0.0, 1.0, high_open=True)
    return alpha, beta, decay, momentum


def check_prior(lam, D: int, dtype=None, name: str = "cfg.lam"):
    """lam (D,): a per-coordinate prior precision, every entry finite and > 0."""
    check_array(lam, name, shape=(D,))
    check_float(lam, name)
    check_positive(lam, name)
    if dtype is not None and lam.dtype != dtype:
        raise ValueError(f"{name}: expected dtype {dtype} (the state's), got {lam.dtype}")
    return lam


def check_t(t) -> int:
    """state.t: the number of steps already taken, a non-negative integer."""
    if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 0:
        raise ValueError(f"state.t: expected a non-negative integer step count, got {t!r}")
    return int(t)


def check_N(N) -> int:
    return check_int(N, "N", low=1)


def check_model(model, D=None, cnn: bool = False):
    """A FlatModel (or, with cnn=True, a refbayes.models.conv.CNN: the methods whose steps use only
    the passes a CNN has), with D parameters unless D is None."""
    if not isinstance(model, (FlatModel, CNN) if cnn else FlatModel):
        raise ValueError(f"model: expected a refbayes.models model, got {type(model).__name__}")
    if D is not None and model.D != D:
        raise ValueError(f"model: expected a model with D = {D} parameters (the state's), "
                         f"got D = {model.D}")
    return model


class KFACBlock(NamedTuple):
    """One parameter layer's K-FAC block: where it lies in theta and how W~ is read from it.

    Each field is documented by its trailing comment.
    """
    start: int    # first entry of the layer's contiguous slice theta[start:stop]
    stop: int     # one past its last entry
    n_a: int      # rows of W~: n_in + 1 (dense) or Q + 1 (conv), no + 1 without a bias
    n_b: int      # columns of W~: n_out or C_out
    perm: Any     # None (W~ is theta[start:stop] row-major, the MLP's), or the (stop - start,)
    #               int array with vec_row_major(W~) = theta[start:stop][perm] (conv.24)
    inv: Any      # None, or argsort(perm): theta[start:stop] = vec_row_major(W~)[inv] (conv.24)


def kfac_blocks(model) -> list:
    """The K-FAC block map: one KFACBlock per parameter layer, in theta order, tiling theta.

    For a FlatModel the row-major [W_l; b_l^T] slices from ``model.sizes`` (perm None); for a CNN
    the slices of ``kfac_layout`` (conv.24), a conv layer's with the permutation of its slice
    into W~ = [Wm^T; b^T] order (a dense layer's is the identity, perm None).  (conv.33)"""
    out, stop = [], 0
    if isinstance(model, CNN):
        for idx in model.kfac_layout():
            start, n = stop, idx.size
            stop = start + n
            flat = np.asarray(idx).ravel() - start
            if int(flat.min()) != 0 or int(flat.max()) != n - 1:
                raise ValueError("model.kfac_layout(): expected blocks tiling theta in order")
            perm = None if np.array_equal(flat, np.arange(n)) else flat  # (conv.24)
            out.append(KFACBlock(start, stop, idx.shape[0], idx.shape[1], perm,
                                 None if perm is None else np.argsort(perm)))  # (conv.24)
        return out
    for n_in, n_out in zip(model.sizes[:-1], model.sizes[1:]):
        n_in = n_in + (1 if model.bias else 0)
        start, stop = stop, stop + n_in * n_out
        out.append(KFACBlock(start, stop, n_in, n_out, None, None))
    return out


def to_kfac(v, block: KFACBlock):
    """The block's entries of v (D, ...) in vec_row_major(W~) order (rows start..stop of v,
    permuted for a conv layer).  (conv.24)"""
    part = v[block.start:block.stop]
    return part if block.perm is None else part[block.perm]  # (conv.24)


def from_kfac(w, block: KFACBlock):
    """The inverse of ``to_kfac``: rows in vec_row_major(W~) order back to theta's.  (conv.24)"""
    return w if block.inv is None else w[block.inv]  # (conv.24)


def check_hessian_backend(model, xp, who: str, on_cupy: str) -> None:
    """Refuse CuPy arrays where the model's Hessian is autograd's (NumPy only, see
    ``FlatModel.hessian_on_cupy``), naming the caller ``who`` and what works on CuPy."""
    if xp is not np and not model.hessian_on_cupy:
        raise ValueError(f"{who}: the Hessian of a {type(model).__name__} is computed by autograd, "
                         f"which runs on NumPy only, got CuPy arrays; on CuPy use {on_cupy}, "
                         "or move the arrays to the host with refbayes.backend.to_numpy")


def model_widths(model) -> tuple[int, int]:
    """(n_in, n_out): a row's width and the number of outputs, of a FlatModel (sizes[0],
    sizes[-1]) or a CNN (C H W of its images as rows, K)."""
    if isinstance(model, CNN):
        return model.n_in, model.n_out
    return model.sizes[0], model.sizes[-1]


def check_batch(batch, model, N, dtype, name: str = "batch"):
    """The minibatch rows: 1 <= M <= N rows (any M >= 1 with N None: a whole data set), finite,
    X (and real targets) in the state's dtype, class labels as integers or in that dtype, binary
    labels for a Bernoulli likelihood. Errors name ``name``."""
    if not isinstance(batch, tuple) or len(batch) != 2:
        got = (f"a tuple of {len(batch)}" if isinstance(batch, tuple)
               else type(batch).__name__)
        raise ValueError(f"{name}: expected a Batch(X, y) (or a pair of arrays), got {got}")
    X, y = batch
    check_array(X, f"{name}.X", shape=(None, model_widths(model)[0]))
    check_array(y, f"{name}.y", ndim=(1, 2))
    M = X.shape[0]
    if M < 1 or (N is not None and M > N):
        want = "at least 1 row" if N is None else f"1 <= M <= N = {N} rows"
        raise ValueError(f"{name}.X: expected {want}, got M = {M}")
    if y.shape[0] != M:
        raise ValueError(f"{name}.y: expected {M} rows (as {name}.X), got shape {tuple(y.shape)}")
    if X.dtype != dtype:
        raise ValueError(f"{name}.X: expected dtype {dtype} (the state's), got {X.dtype}")
    # class labels may be integers; real targets must share the state's dtype
    if y.dtype != dtype and (isinstance(model.likelihood, Gaussian) or y.dtype.kind == "f"):
        raise ValueError(f"{name}.y: expected dtype {dtype} (the state's), got {y.dtype}")
    if isinstance(model.likelihood, Bernoulli):
        check_binary(y, f"{name}.y", "binary labels in {0, 1}")
    return X, y, M


def check_eps(eps, D: int, dtype, curvature: str):
    """eps (D, S), S >= 1, for the Monte Carlo curvatures; None for 'exact' (no draws)."""
    if curvature == "exact":
        if eps is not None:
            raise ValueError("eps: curvature='exact' takes no Monte Carlo draws (expectations "
                             "are Gauss-Hermite quadratures), got an array; pass eps=None")
        return 0
    if eps is None:
        raise ValueError(f"eps: curvature={curvature!r} needs standard-normal draws of shape "
                         f"(D, S) = ({D}, S >= 1), got None")
    return check_draws(eps, D, dtype)


def check_draws(eps, D: int, dtype) -> int:
    """eps (D, S), S >= 1 standard-normal draws in the state's dtype; returns S."""
    if eps is None:
        raise ValueError(f"eps: expected standard-normal draws of shape (D, S) = ({D}, S >= 1), "
                         "got None")
    check_array(eps, "eps", ndim=2)
    if eps.shape[0] != D or eps.shape[1] < 1:
        raise ValueError(f"eps: expected shape (D, S) = ({D}, S >= 1), got {tuple(eps.shape)}")
    if eps.dtype != dtype:
        raise ValueError(f"eps: expected dtype {dtype} (the state's), got {eps.dtype}")
    return eps.shape[1]


def check_draw_precisions(tau, S: int, model, dtype):
    """tau (S,): per-draw noise precisions > 0 of a Gaussian likelihood, finite, in the state's
    dtype, for a model whose own noise precision is 1 (the draws' precisions replace it, as
    per-draw loss weights; noise_gamma.2). Returns tau."""
    lik = model.likelihood
    if not isinstance(lik, Gaussian) or lik.noise_precision != 1.0:
        raise ValueError("tau: per-draw noise precisions need a Gaussian likelihood with "
                         f"noise_precision 1 (they replace it), got {lik!r}")
    return check_positive_vector(tau, "tau", S, dtype, "draw")


def nonneg_start(value, name: str, mu):
    """A running average's starting value beside mean mu (D,): None -> zeros, a finite float
    >= 0 -> that value everywhere, or a (D,) array >= 0 in mu's dtype."""
    xp = xp_of(mu)
    D = mu.shape[0]
    if value is None:
        return xp.zeros_like(mu)
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{name}: expected a finite value >= 0, got {value}")
        return xp.full(D, float(value), dtype=mu.dtype)
    check_array(value, name, shape=(D,))
    check_same_dtype({"mu": mu, name: value})
    check_positive(value, name, strict=False)
    return value


def check_curvature(curvature: str) -> str:
    if curvature not in CURVATURES:
        raise ValueError(f"curvature: expected one of {CURVATURES}, got {curvature!r}")
    return curvature


def momentum_direction(g_bar, g_hat, lam, mu, b, t):
    """(g_bar_{t+1}, direction): g_bar_{t+1} = b g_bar_t + (1 - b) g_hat, direction =
    g_bar_{t+1} / (1 - b^{t+1}) + lam * mu (the prior term is added after the average, as in
    the official code); b = 0 gives g_hat + lam * mu.  (ngvi.13)"""
    if b == 0.0:
        return g_bar, g_hat + lam * mu
    g_bar = b * g_bar + (1 - b) * g_hat  # (ngvi.13)
    return g_bar, g_bar / (1 - b ** (t + 1)) + lam * mu  # (ngvi.13)


# ----------------------------------------------------------------------------- Monte Carlo estimates

def per_example_grads(model, theta, X, y, out=None):
    """G (S, M, D): G[s, i] = grad l_i(theta_s) for theta (D, S), one column per draw.  (ngvi.7)

    S = 1: the model's per_example_grads (a view, no copy); S > 1: one batched pass over the S
    draws (``per_example_grads_batched``, equal to S calls to rounding and 1.3-5.8x faster on
    the UCI, logistic-regression and MNIST-MLP shapes: asv bench_per_example.PerExampleGradsDraws).
    ``out`` (S, M, D), C-contiguous, of theta's backend and dtype (the models check it and raise
    ValueError naming ``out``): the rows are written there, bit for bit as without it, and
    ``out`` is returned (e.g. ``W_T[L:].reshape(S, M, D)``, rows of SLANG's W^T).
    """
    xp = xp_of(theta)
    if theta.shape[1] == 1:
        shape = tuple(getattr(out, "shape", ()))
        if out is not None and (len(shape) != 3 or shape[0] != 1):
            raise ValueError(f"out: expected an array of shape (1, M, D) for one draw, got "
                             f"{type(out).__name__} of shape {shape}")
        G = model.per_example_grads(xp.ascontiguousarray(theta[:, 0]), X, y,
                                    out=None if out is None else out[0])
        return G[None] if out is None else out
    return model.per_example_grads_batched(xp.ascontiguousarray(theta.T), X, y, out=out)  # (ngvi.7)


def grad_estimate(G, N: int):
    """g_hat = (N / M) (1 / S) sum_s sum_i g_{s,i}, G (S, M, D).  (ngvi.8)"""
    S, M, _ = G.shape
    return (N / (M * S)) * G.sum(axis=(0, 1))  # (ngvi.8)


def ef_estimate(G, N: int):
    """EF = (N / M) (1 / S) sum_s sum_i g_{s,i} g_{s,i}^T (D, D).  (ngvi.9)"""
    S, M, D = G.shape
    F = G.reshape(S * M, D)
    return (N / (M * S)) * (F.T @ F)  # (ngvi.9)


def ef_diag_estimate(G, N: int):
    """diag of (ngvi.9): (N / M) (1 / S) sum_s sum_i g_{s,i}^2 (D,).  (ngvi.9)"""
    S, M, _ = G.shape
    return (N / (M * S)) * (G * G).sum(axis=(0, 1))  # (ngvi.9)


def hess_estimate(model, theta, X, y, N: int):
    """H_hat = (N / M) (1 / S) sum_s sum_i grad^2 l_i(theta_s) (D, D).  (ngvi.10)

    The sum over the S draws is the model's (``_hessian_sum``): S Hessian calls in general, one
    batched pass for linear models, whose Hessian is the GGN (``ggn_sum``, peg.20).
    """
    M, S = X.shape[0], theta.shape[1]
    thetas = xp_of(theta).ascontiguousarray(theta.T)
    return (N / (M * S)) * model._hessian_sum(thetas, X, y)  # (ngvi.10)


def hess_diag_estimate(model, theta, X, y, N: int):
    """diag of (ngvi.10) (D,): the model's ``_hessian_sum`` of diagonals (linear models in closed
    form, without D x D matrices)."""
    M, S = X.shape[0], theta.shape[1]
    thetas = xp_of(theta).ascontiguousarray(theta.T)
    return (N / (M * S)) * model._hessian_sum(thetas, X, y, diag=True)  # (ngvi.10)


# ----------------------------------------------------------------------------- exact expectations

def glm_design(model, X):
    """(X~ (M, D), likelihood name, noise precision) for a model whose output is x~^T theta.

    'exact' curvature integrates over a_i = x~_i^T theta ~ N(m_i, v_i), which needs a scalar output
    linear in theta: LogisticRegression, or MLP([n, 1]) with a Bernoulli or Gaussian likelihood.
    """
    if len(model.sizes) != 2 or model.sizes[1] != 1:
        raise ValueError("model: curvature='exact' needs a linear model with one output "
                         f"(LogisticRegression or MLP([n, 1])), got sizes {model.sizes}")
    lik = model.likelihood
    if isinstance(lik, Bernoulli):
        kind, tau = "logistic", None
    elif isinstance(lik, Gaussian):
        kind, tau = "gaussian", float(lik.noise_precision)
    else:
        raise ValueError("model: curvature='exact' needs a Bernoulli or Gaussian likelihood, "
                         f"got {type(lik).__name__}")
    return (add_intercept(X) if model.bias else X), kind, tau


def exact_terms(Xd, y, mu, v, kind, tau, N: int):
    """(g_hat (D,), w (M,)) for curvature "exact", a_i = x~_i^T theta ~ N(m_i, v_i), m = X~ mu:
    g_hat = -(N / M) X~^T E1 and w = -(N / M) E2, so that C_hat = X~^T diag(w) X~, with E1, E2 the
    expected first two a-derivatives of log p by quadrature (exact_vi.2), (exact_vi.12),
    (exact_vi.13).  (ngvi.11)"""
    yy = y.reshape(-1)
    m = Xd @ mu
    if kind == "logistic":
        _, E1, E2 = exact_vi.logistic_expectations(m, v, yy)
    else:
        _, E1, E2 = exact_vi.gaussian_expectations(m, v, yy, tau)
    scale = -N / Xd.shape[0]
    return scale * (Xd.T @ E1), scale * E2  # (ngvi.11)
