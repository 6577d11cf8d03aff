"""Laplace approximation at a MAP estimate (MacKay 1992; Daxberger et al. 2021, "Laplace Redux",
with the conventions of the laplace-torch library).

Implements (laplace.1)-(laplace.23) of derivations/laplace.md.

Symbols (derivations/notation.md): theta (D,) flat parameters; mu = theta* the MAP estimate,
the mean of q; delta (D,) prior precision, p(theta) = N(0, diag(delta)^{-1}) (``prior_precision``:
a scalar, a (D,) array, or per parameter tensor through ``expand_prior_precision``); H the
curvature of the SUMMED negative log-likelihood sum_i l_i at mu ("hessian", "ggn" = sum_i
J_i^T H_i J_i, "ef" = sum_i g_i g_i^T); Sigma_inv (D, D) the dense posterior precision
H + diag(delta) (structure "full"); prec_diag (D,) its diagonal counterpart diag(H) + delta
(structure "diag"); per layer l the K-FAC factors A_l = (1/N) sum_i a~_i a~_i^T and
B_l = sum_i B_i (structure "kron": blockdiag_l(A_l kron B_l + delta_l I),
(laplace.18)-(laplace.21));
D_q the number of random parameters theta[n_fixed:] (D, or the last layer's with subset
"last_layer", (laplace.23)); J(x) (K, D) the output Jacobian at mu; noise_precision the
Gaussian likelihood's 1 / sigma_noise^2.

Scaling: the curvature is of the summed loss over all N rows passed to ``fit`` (no N / M factor:
the Laplace approximation uses the full training set); delta enters unscaled. No tempering
(laplace-torch's temperature = 1; see derivations/laplace.md, Conventions).

q(theta) = N(mu, Sigma_inv^{-1}) or N(mu, diag(1 / prec_diag)) (laplace.3), (laplace.4)::

    Sigma_inv = H + diag(delta)                                               (laplace.3)
    theta_s   = mu + L^{-T} eps_s, L L^T = Sigma_inv  /  mu + eps_s / sqrt(prec_diag)  (laplace.4)
    log Z     = log p(D | mu) + log p(mu) + (D / 2) log 2 pi - (1 / 2) log det Sigma_inv (laplace.5)
    f(x*)     ~ N(f(x*, mu), J Sigma J^T);  y* ~ N(f(x*, mu), J Sigma J^T + I / noise_precision)
                                                                              (laplace.7)

Evidence optimisation and classification / sampling predictives, (laplace.10)-(laplace.17):
``log_marginal_likelihood_grad`` (log Z and its gradient in log delta and log tau with mu and H
held fixed), ``optimize_prior_precision`` (laplace-torch's post-hoc tuning),
``glm_class_predictive`` (probit or Monte Carlo link over the linearized logits),
``mc_predictive`` (sampling predictive).

Randomness: nothing is drawn here; eps (D_q, S) comes from the caller. The MC link's eps is (K, S).

Examples
--------
A full-GGN Laplace fit of Bayesian linear regression (a one-layer MLP, so the MAP is closed
form) on 20 synthetic points, then its GLM predictive and log evidence. ``fit`` draws nothing
and takes no minibatch: it is a function of the MAP and the whole data set (unlike the step
methods, whose draws the caller passes):

>>> import numpy as np
>>> from refbayes.datasets import make_linear_regression
>>> from refbayes.methods import laplace
>>> from refbayes.models import MLP
>>> data = make_linear_regression(20, 2, 0, 4.0)  # N = 20 rows, 2 features, seed 0, tau = 4
>>> model = MLP([2, 1], likelihood="gaussian", noise_precision=4.0)   # theta = [w; b]
>>> X1 = np.hstack([data.X, np.ones((20, 1))])
>>> theta_map = np.linalg.solve(4.0 * X1.T @ X1 + np.eye(3), 4.0 * X1.T @ data.y)  # delta = 1
>>> cfg = laplace.LaplaceConfig(prior_precision=1.0)
>>> state = laplace.fit(model, theta_map, data.X, data.y, cfg)
>>> np.allclose(state.Sigma_inv, 4.0 * X1.T @ X1 + np.eye(3))   # exact for a linear model
True
>>> pred = laplace.glm_predictive(model, state, data.X[:5])
>>> pred.f_mean.shape, bool(np.all(pred.y_var > pred.f_var))
((5, 1), True)
>>> bool(np.isfinite(laplace.log_marginal_likelihood(model, state, data.X, data.y, cfg)))
True
"""
from __future__ import annotations

import math
import numbers
import warnings
from typing import Any, NamedTuple

import numpy as np
from scipy.optimize import minimize

from refbayes._checks import (
    check_at_construction,
    check_array,
    check_float,
    check_in_range,
    check_invertible_positive,
    check_positive,
    check_same_dtype,
    check_spd,
    check_symmetric,
)
from refbayes.backend import cholesky, solve_triangular, to_numpy, xp_of
from refbayes.linalg import kron
from refbayes.methods._estimates import (
    check_hessian_backend,
    check_model,
    kfac_blocks,
    model_widths,
)
from refbayes.methods.adam import AdamConfig, adam_init, adam_update
from refbayes.models.base import FlatModel
from refbayes.models.conv import CNN
from refbayes.models.likelihoods import Gaussian

__all__ = [
    "CURVATURES",
    "STRUCTURES",
    "SUBSETS",
    "STATIONARY_RTOL",
    "GLMPredictive",
    "KronBlock",
    "LaplaceConfig",
    "LaplaceState",
    "curvature",
    "dense_covariance",
    "dense_precision",
    "expand_prior_precision",
    "fit",
    "glm_predictive",
    "linearized_outputs",
    "log_marginal_likelihood",
    "sample",
    # evidence optimisation and classification / sampling predictives (laplace.10)-(laplace.17)
    "LINKS",
    "PRIOR_STRUCTURES",
    "TUNING_METHODS",
    "ClassPredictive",
    "MCPredictive",
    "MarglikGrad",
    "PriorOptInfo",
    "glm_class_predictive",
    "log_marginal_likelihood_grad",
    "mc_predictive",
    "optimize_prior_precision",
]

Array = Any

CURVATURES = ("hessian", "ggn", "ef")
STRUCTURES = ("full", "diag", "kron")
SUBSETS = ("all", "last_layer")
# fit warns when |grad L(theta_map)|_2 > STATIONARY_RTOL (|grad sum_i l_i|_2 + |delta theta|_2),
# L the negative log joint of the random parameters: theta_map is then not a minimum
STATIONARY_RTOL = 1e-3


class LaplaceConfig(NamedTuple):
    """Laplace approximation hyperparameters.

    Defaults follow laplace-torch's prior_precision = 1.0 and its GGN curvature; subset
    defaults to "all" and structure to "full" (laplace-torch's ``Laplace`` defaults are
    "last_layer" and "kron").

    Each field is documented by its trailing comment. ``fit`` checks a cfg and raises
    ValueError unless: prior_precision is a finite real > 0 or a finite float (D_q,) array > 0
    in theta_map's dtype and backend (constant on each layer block [W_l, b_l] for "kron");
    structure is in STRUCTURES; curvature is in CURVATURES, and "ggn" or "ef" for "kron"; and
    subset is in SUBSETS. "hessian" on an MLP is autograd's, NumPy only: CuPy arrays are
    refused (linear and logistic regression have it in closed form on both backends).

    Construction (``LaplaceConfig(...)``, and unpickling) checks these rules too, except
    prior_precision's length, dtype and backend, known only with the state; ``_replace`` and
    ``_make`` do not, so the functions check every cfg again.
    """
    prior_precision: Any = 1.0   # delta: float > 0 or (D_q,) array > 0 (laplace.1), (laplace.3)
    #                              p(theta) = N(0, diag(delta)^{-1}); an array has one entry per random
    #                              parameter (``expand_prior_precision`` builds it from per-tensor
    #                              values), constant on each layer block [W_l, b_l] for "kron"
    structure: str = "full"      # "full", "diag" or "kron" (laplace.3), (laplace.18)
    #                              dense Sigma_inv (D_q, D_q), its diagonal prec_diag (D_q,), or one
    #                              K-FAC block A_l kron B_l + delta_l I per layer
    curvature: str = "ggn"       # "hessian", "ggn" or "ef" (laplace.2)
    #                              H of the summed NLL at the MAP: the Hessian, the GGN
    #                              sum_i J_i^T H_i J_i or the EF sum_i g_i g_i^T ("kron": GGN or EF)
    subset: str = "all"          # "all" or "last_layer" (laplace.23)
    #                              the random parameters: all D, or the last layer's D_q (the rest
    #                              fixed at the MAP)


class KronBlock(NamedTuple):
    """The K-FAC factors of one layer's curvature block, H_l ~ A kron B (peg.13).

    Each field is documented by its trailing comment.
    """
    A: Array  # (1/N) sum_i a~_i a~_i^T, (n_in~, n_in~) (peg.13), (laplace.18)
    #           a~_i the layer input with a 1 appended for the bias: n_in~ = n_in + 1, or n_in
    B: Array  # sum_i B_i, the pre-activation GGN (or EF) over the N rows, (n_out, n_out) (peg.13), (laplace.18)


class LaplaceState(NamedTuple):
    """The Laplace posterior q(theta) = N(mu, precision^{-1}) over theta[n_fixed:].

    Exactly one of Sigma_inv (structure "full"), prec_diag ("diag") and kron ("kron") is set;
    the others are None.  The random parameters are the last D_q = D - n_fixed entries of
    theta (all of them for subset "all", n_fixed = 0; the last layer's for "last_layer"); the
    first n_fixed stay at mu.

    Each field is documented by its trailing comment. Every function that takes a state checks
    it and raises ValueError unless: mu is a finite float (float64 or float32) (D,) array;
    n_fixed is an int in [0, D), so that D_q = D - n_fixed; exactly one of Sigma_inv, prec_diag
    and kron is set (the structure); prior_prec is a finite (D_q,) array > 0; Sigma_inv is a
    finite symmetric (D_q, D_q) array (the functions that factor it also raise when its
    Cholesky factorization fails); prec_diag is a finite (D_q,) array > 0 with 1 / prec_diag
    finite; kron is a non-empty tuple of KronBlock of finite symmetric square float factors
    that tile the D_q entries, with prior_prec constant on each block; kron_perm is None, or for
    "kron" a NumPy int permutation of range(D_q) within each block's slice (a CNN, (conv.33));
    and all arrays share mu's dtype.
    """
    mu: Array          # mean: the MAP estimate theta*, (D,) (laplace.1)
    Sigma_inv: Array   # H + diag(delta), (D_q, D_q), for "full"; else None (laplace.3)
    prec_diag: Array   # diag(H) + delta, (D_q,), for "diag"; else None (laplace.3)
    prior_prec: Array  # delta inside the precision, per random parameter, (D_q,) (laplace.1)
    kron: Any = None   # (KronBlock(A_l, B_l), ...) for "kron", or None (laplace.18)
    #                    one block per layer in theta order: blockdiag_l(A_l kron B_l + delta_l I)
    n_fixed: int = 0   # leading entries of theta fixed at mu, 0 for subset "all" (laplace.23)
    kron_perm: Any = None  # "kron" only: None (the blocks are theta's row-major [W_l; b_l^T]
    #                        slices), or a NumPy (D_q,) int permutation with theta_q[kron_perm]
    #                        the blocks' vec_row_major(W~_l) concatenated, moving entries only
    #                        within their layer's slice (a CNN's conv layers) (conv.24), (conv.33)


class GLMPredictive(NamedTuple):
    """The linearized (GLM) predictive of a Gaussian-likelihood model at M test inputs.

    Each field is documented by its trailing comment.
    """
    f_mean: Array  # predictive mean f(x*, mu), (M, K) (laplace.7)
    f_var: Array   # linearized-output covariance J(x*) Sigma J(x*)^T, (M, K, K) (laplace.7)
    y_var: Array   # covariance of y*: f_var + I_K / noise_precision, (M, K, K) (laplace.7)


# ----------------------------------------------------------------------------- checks

def _check_cfg(cfg, D=None, dtype=None, xp=None):
    """Validate cfg; return (structure, curvature, delta (D,) in dtype).  (laplace.1)"""
    if not isinstance(cfg, LaplaceConfig):
        raise ValueError(f"cfg: expected a LaplaceConfig, got {type(cfg).__name__}")
    delta = _as_delta(cfg.prior_precision, "cfg.prior_precision", D, dtype, xp)  # (laplace.1)
    if cfg.structure not in STRUCTURES:
        raise ValueError(f"cfg.structure: expected one of {STRUCTURES}, got {cfg.structure!r}")
    if cfg.curvature not in CURVATURES:
        raise ValueError(f"cfg.curvature: expected one of {CURVATURES}, got {cfg.curvature!r}")
    if cfg.structure == "kron" and cfg.curvature == "hessian":
        raise ValueError("cfg.curvature: structure 'kron' factors the GGN or the EF "
                         "(curvature 'ggn' or 'ef'), got 'hessian'")
    if cfg.subset not in SUBSETS:
        raise ValueError(f"cfg.subset: expected one of {SUBSETS}, got {cfg.subset!r}")
    return cfg.structure, cfg.curvature, delta


# D, dtype and backend unknown: prior_precision's length, dtype and backend are checked later
check_at_construction(LaplaceConfig, _check_cfg)


def _as_delta(value, name, Dq, dtype, xp):
    """A prior precision given as a real > 0 (a Python or NumPy scalar) or a finite (D_q,)
    array > 0 in dtype on backend xp -> the (D_q,) delta.  (laplace.1)  With Dq, dtype, xp None
    (a cfg at construction) only the value is checked, and returned as given."""
    if isinstance(value, numbers.Real):
        v = check_in_range(value, name, 0.0, math.inf, low_open=True, high_open=True)
        return v if xp is None else xp.full(Dq, v, dtype=dtype)
    check_array(value, name, shape=(Dq,))
    check_float(value, name)
    if dtype is not None and value.dtype != dtype:
        raise ValueError(f"{name}: expected dtype {dtype} (theta's), got {value.dtype}")
    check_positive(value, name)
    if xp is not None and xp_of(value) is not xp:
        raise ValueError(f"{name}: expected an array on theta's backend, got NumPy and CuPy "
                         "mixed")
    return value


def _check_state(state):
    """A LaplaceState of finite float arrays of one dtype and one structure; returns (D, xp),
    D = len(mu) (the random block is the last D_q = D - n_fixed entries, ``_n_random``)."""
    if not isinstance(state, LaplaceState):
        raise ValueError(f"state: expected a LaplaceState, got {type(state).__name__}")
    check_array(state.mu, "state.mu", ndim=1)
    check_float(state.mu, "state.mu")
    D = state.mu.shape[0]
    set_fields = [n for n in ("Sigma_inv", "prec_diag", "kron") if getattr(state, n) is not None]
    if len(set_fields) != 1:
        raise ValueError("state.Sigma_inv, state.prec_diag, state.kron: expected exactly one of "
                         "them to be set (structure 'full', 'diag' or 'kron'), got "
                         f"{set_fields or 'none'}")
    if isinstance(state.n_fixed, bool) or not isinstance(state.n_fixed, numbers.Integral) \
            or not 0 <= state.n_fixed < D:
        raise ValueError(f"state.n_fixed: expected an int in [0, {D}), got {state.n_fixed!r}")
    Dq = D - int(state.n_fixed)
    check_array(state.prior_prec, "state.prior_prec", shape=(Dq,))
    check_positive(state.prior_prec, "state.prior_prec")
    arrays = {"state.mu": state.mu, "state.prior_prec": state.prior_prec}
    if state.Sigma_inv is not None:
        check_array(state.Sigma_inv, "state.Sigma_inv", shape=(Dq, Dq))
        check_symmetric(state.Sigma_inv, "state.Sigma_inv")
        arrays["state.Sigma_inv"] = state.Sigma_inv
    elif state.prec_diag is not None:
        check_array(state.prec_diag, "state.prec_diag", shape=(Dq,))
        check_invertible_positive(state.prec_diag, "state.prec_diag")
        arrays["state.prec_diag"] = state.prec_diag
    else:
        arrays.update(_check_kron(state.kron, state.prior_prec))
    _check_kron_perm(state, Dq)
    check_same_dtype(arrays)
    return D, xp_of(*arrays.values())


def _check_kron(blocks, delta):
    """K-FAC blocks that tile delta's D_q entries, each with a constant delta on its block;
    returns {name: array} for the dtype check.  (laplace.18)"""
    if not isinstance(blocks, tuple) or not blocks \
            or not all(isinstance(b, KronBlock) for b in blocks):
        raise ValueError("state.kron: expected a non-empty tuple of KronBlock, got "
                         f"{type(blocks).__name__}")
    arrays, stop = {}, 0
    for l, (A, B) in enumerate(blocks):
        for name, F in ((f"state.kron[{l}].A", A), (f"state.kron[{l}].B", B)):
            check_array(F, name, ndim=2)
            check_float(F, name)
            if F.shape[0] != F.shape[1]:
                raise ValueError(f"{name}: expected a square matrix, got shape {tuple(F.shape)}")
            check_symmetric(F, name)
            arrays[name] = F
        start, stop = stop, stop + A.shape[0] * B.shape[0]
        if stop > delta.shape[0]:
            break
        _block_delta(delta, start, stop, f"state.prior_prec[{start}:{stop}]")
    if stop != delta.shape[0]:
        raise ValueError(f"state.kron: expected blocks of sum_l n_in~ n_out = {delta.shape[0]} "
                         f"parameters (len(state.prior_prec)), got {stop}"
                         + (" or more" if stop > delta.shape[0] else ""))
    return arrays


def _check_kron_perm(state, Dq):
    """state.kron_perm: None, or (kron only) a NumPy int (D_q,) permutation that keeps every
    entry in its K-FAC block's slice.  (conv.24), (conv.33)"""
    p = state.kron_perm
    if p is None:
        return
    if state.kron is None:
        raise ValueError("state.kron_perm: expected None for structure "
                         f"{_structure(state)!r} (it permutes K-FAC blocks), got an array")
    if not isinstance(p, np.ndarray) or p.shape != (Dq,) or p.dtype.kind not in "iu":
        raise ValueError(f"state.kron_perm: expected a NumPy int array of shape ({Dq},), got "
                         f"{type(p).__name__} {getattr(p, 'shape', '')}")
    offsets = _kron_offsets(state.kron)
    lo = np.repeat([a for a, _, _, _ in offsets], [b - a for a, b, _, _ in offsets])
    hi = np.repeat([b for _, b, _, _ in offsets], [b - a for a, b, _, _ in offsets])
    if not (np.array_equal(np.sort(p), np.arange(Dq)) and np.all((p >= lo) & (p < hi))):
        raise ValueError("state.kron_perm: expected a permutation of range(D_q) within each "
                         "K-FAC block's slice")


def _kron_perm(model):
    """The state's kron_perm for ``model``: None for an MLP (and a CNN without conv layers),
    else the block map's permutations (``kfac_blocks``) joined.  (conv.24), (conv.33)"""
    blocks = kfac_blocks(model)
    if all(b.perm is None for b in blocks):
        return None
    return np.concatenate([np.arange(b.start, b.stop) if b.perm is None else b.start + b.perm
                           for b in blocks])  # (conv.24), (conv.33)


def _to_kron_order(state, v, axis=0):
    """v's random entries (along axis) in the K-FAC blocks' order.  (conv.24), (conv.33)"""
    if state.kron_perm is None:
        return v
    xp = xp_of(v)
    return xp.take(v, xp.asarray(state.kron_perm), axis=axis)  # (conv.24), (conv.33)


def _block_delta(delta, start, stop, name):
    """The one prior precision of a K-FAC block: delta[start:stop] must be constant."""
    xp = xp_of(delta)
    d = delta[start:stop]
    if not bool(xp.all(d == d[0])):
        raise ValueError(f"{name}: expected one prior precision per layer block [W_l, b_l] for "
                         f"structure 'kron', got values from {float(xp.min(d))!r} to "
                         f"{float(xp.max(d))!r}")
    return d[0]


def _structure(state) -> str:
    if state.kron is not None:
        return "kron"
    return "full" if state.Sigma_inv is not None else "diag"


def _n_random(state) -> int:
    """D_q, the number of random parameters theta[n_fixed:].  (laplace.23)"""
    return state.mu.shape[0] - int(state.n_fixed)


def _kron_offsets(blocks):
    """Per K-FAC block: (start, stop, A, B), its slice of the D_q random entries (a block holds
    the layer's [W_l; b_l^T] flattened row-major, A.shape[0] * B.shape[0] entries)."""
    out, stop = [], 0
    for A, B in blocks:
        start, stop = stop, stop + A.shape[0] * B.shape[0]
        out.append((start, stop, A, B))
    return out


def _kron_eigh(state):
    """Per K-FAC block: (start, stop, Q_A, Q_B, Lam) with A kron B + delta_l I =
    (Q_A kron Q_B) diag(vec Lam) (Q_A kron Q_B)^T, offsets into the D_q random entries.
    (laplace.19)"""
    out = []
    for start, stop, A, B in _kron_offsets(state.kron):
        delta_l = float(state.prior_prec[start])
        Q_A, Q_B, Lam = kron.damped_eigh(A, B, delta_l)  # (laplace.19)
        out.append((start, stop, Q_A, Q_B, Lam))
    return out


def _chol(state):
    """Lower Cholesky factor L of state.Sigma_inv (L L^T = Sigma_inv), or ValueError."""
    return check_spd(state.Sigma_inv, "state.Sigma_inv")


# ----------------------------------------------------------------------------- prior

def _tensor_sizes(model) -> list:
    """Entries of each parameter tensor in theta order: W_1, b_1, ..., W_L, b_L (no b_l
    without a bias).  (laplace.9)"""
    if isinstance(model, CNN):  # torch's parameters() order (conv.2)-(conv.3)
        return [t.size for pair in model.unflatten(np.zeros(model.D)) for t in pair
                if t is not None]
    sizes = []
    for n_in, n_out in zip(model.sizes[:-1], model.sizes[1:]):
        sizes.append(n_in * n_out)
        if model.bias:
            sizes.append(n_out)
    return sizes


def expand_prior_precision(model, values):
    """Expand one prior precision per parameter tensor to one per parameter.

    laplace-torch's "layerwise" prior precision.

    The tensors in theta order are W_1, b_1, W_2, b_2, ..., W_L, b_L (no b_l without a bias),
    the order of laplace-torch's ``model.parameters()`` for an ``nn.Sequential`` of ``Linear``
    layers; every entry of tensor t gets values[t].  (laplace.9)

    Parameters
    ----------
    model : FlatModel or CNN
        A refbayes.models model.
    values : array of shape (T,)
        Prior precisions > 0, T = 2 L with biases, L without.

    Returns
    -------
    array of shape (D,)
        The per-parameter prior precision delta, in values' dtype and backend.

    Raises
    ------
    ValueError
        If model is not a FlatModel or CNN, or values is not a finite float (T,) array > 0.
    """
    if not isinstance(model, (FlatModel, CNN)):
        raise ValueError(f"model: expected a refbayes.models model, got {type(model).__name__}")
    sizes = _tensor_sizes(model)
    check_array(values, "values", shape=(len(sizes),))
    check_float(values, "values")
    check_positive(values, "values")
    return xp_of(values).repeat(values, sizes)  # (laplace.9)


# ----------------------------------------------------------------------------- fit

def _curvature(model, theta, X, y, structure: str, curvature: str):
    """H or diag(H) of sum_i l_i at theta.  (laplace.2)"""
    xp = xp_of(theta)
    if structure == "kron":
        return tuple(KronBlock(A, B)
                     for A, B in model.kfac_curvature(theta, X, y, curvature))  # (laplace.18)
    if curvature == "ggn":
        if structure == "full":
            return model.ggn(theta, X, y)  # (laplace.2)
        return model.diag_ggn(theta, X, y)  # (laplace.2)
    if curvature == "ef":
        if structure == "full":
            G = model.per_example_grads(theta, X, y)
            return G.T @ G  # (laplace.2)
        return model.diag_ef(theta, X, y)  # (laplace.2)
    check_hessian_backend(model, xp, 'laplace: cfg.curvature "hessian"',
                          'cfg.curvature "ggn" or "ef"')
    H = model.hessian(theta, X, y)  # (laplace.2)
    return H if structure == "full" else xp.diagonal(H).copy()  # (laplace.2)


def _check_theta_map(model, theta_map) -> int:
    """theta_map a finite float (D,) array for a FlatModel of D parameters; returns D. The
    length is checked against the model's D (fit and curvature have no state)."""
    check_array(theta_map, "theta_map", ndim=1)
    check_float(theta_map, "theta_map")
    check_model(model, cnn=True)
    if theta_map.shape[0] != model.D:
        raise ValueError(f"theta_map: expected shape ({model.D},) (the model's D = {model.D} "
                         f"parameters), got {tuple(theta_map.shape)}")
    return model.D


def _warn_if_not_stationary(model_q, theta_q, X_q, y, delta) -> None:
    """UserWarning where |grad L(theta_q)|_2 > STATIONARY_RTOL (|g_lik|_2 + |delta theta_q|_2),
    L = sum_i l_i + (1/2) theta_q^T diag(delta) theta_q: theta_q is not a minimum of L."""
    xp = xp_of(theta_q)
    g_lik = model_q.grad(theta_q, X_q, y)
    g_prior = delta * theta_q
    norms = xp.stack([xp.linalg.norm(g_lik + g_prior), xp.linalg.norm(g_lik),
                      xp.linalg.norm(g_prior)])
    g, a, b = (float(v) for v in to_numpy(norms))  # one read-back
    threshold = STATIONARY_RTOL * (a + b)
    if g > threshold:
        warnings.warn(f"laplace.fit: theta_map is not a stationary point of the negative log "
                      f"joint L: |grad L|_2 = {g:.3g} > {threshold:.3g} = STATIONARY_RTOL "
                      f"({STATIONARY_RTOL:g}) x (|grad sum_i l_i|_2 + |delta theta|_2), while the "
                      "Laplace approximation assumes a minimum of L", UserWarning,
                      stacklevel=3)


def _random_part(model, theta_map, X, cfg):
    """(model_q, theta_q, X_q, n_fixed): the model of the random parameters, their MAP values,
    its inputs and the count of fixed leading entries.  For subset "last_layer" the head on
    the features phi(X) (peg.15), whose curvature is the exact last-layer block of the whole
    network's (laplace.23); for "all" the model itself.  cfg is validated later."""
    if isinstance(cfg, LaplaceConfig) and cfg.subset == "last_layer":
        head, phi = model.last_layer(theta_map, X)  # (laplace.23); a CNN's ends in a Dense
        n_fixed = model.D - head.D
        return head, theta_map[n_fixed:], phi, n_fixed
    return model, theta_map, X, 0


def curvature(model, theta_map, X, y, cfg: LaplaceConfig):
    """Compute the curvature H that ``fit`` adds the prior precision to.

    H of the summed negative log-likelihood at theta_map for cfg's curvature, structure and
    subset (laplace.2), (laplace.18), (laplace.23): for the random parameters theta[n_fixed:]
    only, so that ``fit`` forms H + diag(delta), diag(H) + delta or A_l kron B_l + delta_l I.

    Parameters
    ----------
    model : FlatModel or CNN
        A refbayes.models model with D parameters.
    theta_map : array of shape (D,)
        The MAP estimate theta*, float64 or float32.
    X : array of shape (N, n_in)
        All training inputs, in theta_map's dtype.
    y : array of shape (N,) or (N, n_out)
        All training targets.
    cfg : LaplaceConfig
        Structure, curvature and subset (its prior precision is validated, not used).

    Returns
    -------
    array of shape (D_q, D_q) or (D_q,), or tuple of KronBlock
        The dense curvature ("full"), its diagonal ("diag") or one K-FAC block per layer
        ("kron").

    Raises
    ------
    ValueError
        As ``fit``, except for the positive definiteness of the precision.
    """
    D = _check_theta_map(model, theta_map)
    model_q, theta_q, X_q, n_fixed = _random_part(model, theta_map, X, cfg)  # (laplace.23)
    structure, curv, _ = _check_cfg(cfg, D - n_fixed, theta_map.dtype, xp_of(theta_map))
    return _curvature(model_q, theta_q, X_q, y, structure, curv)  # (laplace.2)


def fit(model, theta_map, X, y, cfg: LaplaceConfig, *, check_stationary: bool = True
        ) -> LaplaceState:
    """Fit the Laplace approximation N(theta_map, (H + diag(delta))^{-1}) at a MAP estimate.

    H is the curvature of the summed negative log-likelihood sum_i l_i over all rows of (X, y) at
    theta_map (laplace.2), delta the prior precision (laplace.1); Sigma_inv = H + diag(delta) for
    structure "full", prec_diag = diag(H) + delta for "diag" (laplace.3), and one K-FAC block
    A_l kron B_l + delta_l I per layer for "kron" (laplace.18).  With cfg.subset "last_layer"
    only the last layer's D_q parameters are random and H is their exact block (laplace.23).
    theta_map is taken as given: the approximation is a Laplace approximation only where
    theta_map minimises L(theta) = sum_i l_i + (1/2) theta^T diag(delta) theta (over the random
    parameters); a UserWarning says where it clearly does not (see Warns).

    Parameters
    ----------
    model : FlatModel or CNN
        A refbayes.models model with D parameters (curvature "hessian" on an MLP needs NumPy
        arrays: autograd).
    theta_map : array of shape (D,)
        The MAP estimate theta*, float64 or float32.
    X : array of shape (N, n_in)
        All training inputs, in theta_map's dtype.
    y : array of shape (N,) or (N, n_out)
        All training targets.
    cfg : LaplaceConfig
        Prior precision, structure, curvature and subset.
    check_stationary : bool, default True
        Whether to evaluate grad L(theta_map) for the warning below: one gradient pass over
        (X, y), measured at 13-43 % of ``fit``'s own time (D = 46, N = 1e4, GGN). Pass False to
        time the approximation alone, or where theta_map is knowingly not a minimum.

    Returns
    -------
    LaplaceState
        The state (theta_map, Sigma_inv, prec_diag or kron (one set, the others None), delta,
        n_fixed).

    Raises
    ------
    ValueError
        If theta_map is not a finite float (D,) array; if model is not a FlatModel or CNN with D
        parameters; if cfg is invalid (see LaplaceConfig); if X, y do not fit the model (see
        ``FlatModel.ggn``); or if the precision is not positive definite (an indefinite Hessian
        away from a minimum; for "diag", an entry below the smallest normal float); or if curvature
        is "hessian" with CuPy arrays and a model whose Hessian is autograd's (an MLP).

    Warns
    -----
    UserWarning
        If theta_map is not a stationary point of L: ``||grad L||_2 > STATIONARY_RTOL (1e-3) *
        (||grad sum_i l_i||_2 + ||delta theta||_2)``, both terms at theta_map (the random
        parameters' only, for subset "last_layer"). The two terms cancel at a minimum; the relative
        threshold is far above the rounding of either in float32, and far below the mismatch
        at a point an optimizer has not converged to. The state is returned all the same.
    """
    D = _check_theta_map(model, theta_map)
    xp = xp_of(theta_map)
    model_q, theta_q, X_q, n_fixed = _random_part(model, theta_map, X, cfg)  # (laplace.23)
    structure, curv, delta = _check_cfg(cfg, D - n_fixed, theta_map.dtype, xp)
    H = _curvature(model_q, theta_q, X_q, y, structure, curv)  # (laplace.2)
    if not isinstance(check_stationary, bool):
        raise ValueError(f"check_stationary: expected a bool, got {check_stationary!r}")
    if check_stationary:
        _warn_if_not_stationary(model_q, theta_q, X_q, y, delta)
    if structure == "full":
        Sigma_inv = H + xp.diag(delta)  # (laplace.3)
        Sigma_inv = 0.5 * (Sigma_inv + Sigma_inv.T)  # exact symmetry for the Cholesky routines
        check_spd(Sigma_inv, "Sigma_inv")
        return LaplaceState(theta_map, Sigma_inv, None, delta, None, n_fixed)
    if structure == "kron":
        state = LaplaceState(theta_map, None, None, delta, H, n_fixed,
                             None if n_fixed else _kron_perm(model_q))  # (conv.24), (conv.33)
        _check_state(state)  # delta constant on each block
        _kron_eigh(state)  # every A_l kron B_l + delta_l I positive definite (laplace.19)
        return state
    prec_diag = H + delta  # (laplace.3)
    check_invertible_positive(prec_diag, "prec_diag")
    return LaplaceState(theta_map, None, prec_diag, delta, None, n_fixed)


# ----------------------------------------------------------------------------- the Gaussian

def sample(state: LaplaceState, eps):
    """Draw theta_s = mu + R eps_s, R R^T = Sigma, one column of eps per draw.

    (laplace.4), (laplace.20)  R eps is L^{-T} eps (full, L L^T = Sigma_inv), eps / sqrt(prec_diag)
    (diag), or per K-FAC block the symmetric root Sigma_l^{1/2} eps_l (kron; unique, so the draw
    does not depend on the eigensolver). A linear map of eps: with eps the identity, the columns
    minus mu form a square root of the covariance.

    Parameters
    ----------
    state : LaplaceState
        The Laplace posterior.
    eps : array of shape (D, S)
        Standard-normal draws from the caller, one column per sample, in the state's dtype.

    Returns
    -------
    array of shape (D, S)
        The draws theta.

    Raises
    ------
    ValueError
        If state is invalid (see LaplaceState), or eps is not a finite (D, S) array of the state's
        dtype.
    """
    _, xp = _check_state(state)
    Dq = _n_random(state)
    check_array(eps, "eps", shape=(Dq, None))
    check_same_dtype({"state.mu": state.mu, "eps": eps})
    if xp_of(eps) is not xp:
        raise ValueError("eps: expected an array on the state's backend, got NumPy and CuPy mixed")
    Theta = xp.repeat(state.mu[:, None], eps.shape[1], axis=1)  # fixed entries stay at mu
    Theta[state.n_fixed:] += _sqrt_cov_times(state, eps)  # (laplace.4), (laplace.20), (laplace.23)
    return Theta


def _sqrt_cov_times(state, eps):
    """R eps with R R^T = Sigma (D_q, D_q): L^{-T} eps (full), eps / sqrt(prec_diag) (diag), or
    per K-FAC block the symmetric root Sigma_l^{1/2} vec E_l = vec(Q_A ((Q_A^T E_l Q_B) /
    sqrt(Lam)) Q_B^T) (kron).  (laplace.4), (laplace.20)"""
    xp = xp_of(state.mu)
    structure = _structure(state)
    if structure == "full":
        L = _chol(state)
        return solve_triangular(L.T, eps, lower=False)  # (laplace.4)
    if structure == "diag":
        return eps / xp.sqrt(state.prec_diag)[:, None]  # (laplace.4)
    out = xp.empty_like(eps)
    S = eps.shape[1]
    eps = _to_kron_order(state, eps)  # the blocks' W~ order (conv.24), (conv.33)
    for start, stop, Q_A, Q_B, Lam in _kron_eigh(state):
        E = eps[start:stop].reshape(Q_A.shape[0], Q_B.shape[0], S).transpose(2, 0, 1)
        # the symmetric root is unique: the draw does not depend on the eigensolver's basis
        Z = Q_A @ ((Q_A.T @ E @ Q_B) / xp.sqrt(Lam)) @ Q_B.T  # (laplace.20)
        out[start:stop] = Z.transpose(1, 2, 0).reshape(stop - start, S)
    if state.kron_perm is not None:  # back to theta's order: R = Pm^T R~ Pm (conv.33)
        back = xp.empty_like(out)
        back[xp.asarray(state.kron_perm)] = out
        return back
    return out


def dense_precision(state: LaplaceState):
    """Form the dense precision: Sigma_inv, or diag(prec_diag).

    (laplace.3)

    Parameters
    ----------
    state : LaplaceState
        The Laplace posterior.

    Returns
    -------
    array of shape (D, D)
        The precision.

    Raises
    ------
    ValueError
        If state is invalid (see LaplaceState).
    """
    _, xp = _check_state(state)
    structure = _structure(state)
    if structure == "full":
        return state.Sigma_inv.copy()
    if structure == "diag":
        return xp.diag(state.prec_diag)
    P = xp.zeros((_n_random(state),) * 2, dtype=state.mu.dtype)
    for start, stop, A, B in _kron_offsets(state.kron):
        P[start:stop, start:stop] = kron.dense(A, B) \
            + state.prior_prec[start] * xp.eye(stop - start, dtype=P.dtype)  # (laplace.18)
    if state.kron_perm is not None:  # P_theta = Pm^T P Pm in theta's order (conv.33)
        p = xp.asarray(state.kron_perm)
        back = xp.empty_like(P)
        back[p[:, None], p[None, :]] = P
        return back
    return P


def dense_covariance(state: LaplaceState):
    """Form the dense covariance: Sigma_inv^{-1} by its Cholesky factor, or diag(1 / prec_diag).

    (laplace.3)

    Parameters
    ----------
    state : LaplaceState
        The Laplace posterior.

    Returns
    -------
    array of shape (D, D)
        The covariance Sigma.

    Raises
    ------
    ValueError
        If state is invalid (see LaplaceState).
    """
    _, xp = _check_state(state)
    Dq = _n_random(state)
    structure = _structure(state)
    if structure == "full":
        L = _chol(state)
        L_inv = solve_triangular(L, xp.eye(Dq, dtype=L.dtype), lower=True)
        return L_inv.T @ L_inv  # (laplace.3)
    if structure == "diag":
        return xp.diag(1.0 / state.prec_diag)  # (laplace.3)
    R = _sqrt_cov_times(state, xp.eye(Dq, dtype=state.mu.dtype))
    return R @ R.T  # (laplace.19), (laplace.20)


def _logdet_precision(state):
    """log det of the precision: 2 sum log diag(L), sum log prec_diag, or sum_l sum log Lam_l."""
    xp = xp_of(state.mu)
    structure = _structure(state)
    if structure == "full":
        return 2.0 * xp.sum(xp.log(xp.diagonal(_chol(state))))
    if structure == "diag":
        return xp.sum(xp.log(state.prec_diag))
    return sum(xp.sum(xp.log(Lam)) for *_, Lam in _kron_eigh(state))  # (laplace.19)


# ----------------------------------------------------------------------------- evidence

def log_marginal_likelihood(model, state: LaplaceState, X, y, cfg: LaplaceConfig) -> float:
    """Compute the Laplace estimate of the log evidence log p(D).

    log Z = log p(D | mu) + log p(mu) + (D / 2) log 2 pi - (1 / 2) log det P (laplace.5), with
    log p(D | mu) = -sum_i l_i(mu), p = N(0, diag(delta)^{-1}) and P the state's precision;
    equal to laplace-torch's log_likelihood - (1 / 2)(log det P - log det diag(delta) +
    mu^T diag(delta) mu) (laplace.6).  Exact for Bayesian linear regression with the Hessian or
    GGN (laplace.8).

    Parameters
    ----------
    model : FlatModel or CNN
        The model the state was fit with.
    state : LaplaceState
        The Laplace posterior from ``fit``.
    X : array of shape (N, n_in)
        The training inputs the state was fit on.
    y : array of shape (N,) or (N, n_out)
        The training targets.
    cfg : LaplaceConfig
        The config the state was fit with (its prior precision and structure must match the
        state's; refit to evaluate another prior precision).

    Returns
    -------
    float
        The log marginal likelihood estimate, in nats.

    Raises
    ------
    ValueError
        If state is invalid (see LaplaceState); if cfg is invalid (see LaplaceConfig), its
        structure differs from the state's or its prior precision from state.prior_prec; if model
        is not a FlatModel with D parameters; or if X, y do not fit the model.
    """
    _, xp, _ = _check_evidence_args(model, state, X, y, cfg)
    delta = state.prior_prec
    log_lik = -model.loss(state.mu, X, y)  # (laplace.5)
    mu, Dq = state.mu[state.n_fixed:], _n_random(state)  # the random block (laplace.23)
    log_prior = 0.5 * (xp.sum(xp.log(delta)) - Dq * math.log(2.0 * math.pi)
                       - xp.sum(delta * mu * mu))  # (laplace.1)
    logdet = _logdet_precision(state)
    lml = log_lik + log_prior + 0.5 * Dq * math.log(2.0 * math.pi) - 0.5 * logdet  # (laplace.5)
    return float(lml)


PRIOR_STRUCTURES = ("scalar", "layerwise", "diag")
TUNING_METHODS = ("lbfgs", "adam", "grid")


class MarglikGrad(NamedTuple):
    """The Laplace evidence at a prior precision (and noise precision), with its gradient.

    Each field is documented by its trailing comment.
    """
    log_marglik: float          # log Z at (delta, tau), mu and H held fixed (laplace.6), (laplace.12)
    grad_log_prior_prec: Array  # d log Z / d log delta_j, (D_q,) (laplace.11)
    grad_log_noise_prec: Any    # d log Z / d log tau, float; None without a noise precision (laplace.13)


class PriorOptInfo(NamedTuple):
    """The result and trace of ``optimize_prior_precision``.

    Each field is documented by its trailing comment.
    """
    prior_precision: Any     # delta_g in prior_structure: float, (T,) or (D_q,) (laplace.17)
    #                          "scalar": a float; "layerwise": one per parameter tensor (G = T;
    #                          one per layer block [W_l, b_l] for a "kron" state); "diag": G = D_q
    noise_precision: Any     # tau, float, or None when held fixed (laplace.12)
    log_marglik: float       # log Z at the result (laplace.6), (laplace.12)
    trace_log_hyper: Any     # (n, G[+1]) log delta_g [, log tau] at every evaluation (laplace.17)
    trace_log_marglik: Any   # (n,) log Z at each; -inf where not positive definite (grid) (laplace.17)
    converged: bool          # lbfgs: scipy's success; adam: False (fixed steps, as laplace-torch); grid: True


def _diag_covariance(state):
    """diag(Sigma) (D_q,): column sums of squares of L^{-1} (full, Sigma = L^{-T} L^{-1}),
    1 / prec_diag (diag), or per K-FAC block from its eigenbasis (kron, (laplace.25)).
    (laplace.11)"""
    xp = xp_of(state.mu)
    structure = _structure(state)
    Dq = _n_random(state)
    if structure == "full":
        L = _chol(state)
        L_inv = solve_triangular(L, xp.eye(Dq, dtype=L.dtype), lower=True)
        return xp.sum(L_inv * L_inv, axis=0)  # Sigma_jj = sum_i (L^{-1})_ij^2 (laplace.11)
    if structure == "diag":
        return 1.0 / state.prec_diag  # (laplace.11)
    return _kron_diag_covariance(state, Dq)


def _kron_diag_covariance(state, Dq: int):
    """diag(Sigma) (D_q,) of a K-FAC state, block by block from the eigenbasis (laplace.19),
    without a D_q x D_q array: diag Sigma_l = vec_row_major((Q_A o Q_A) (1 / Lam) (Q_B o Q_B)^T)
    (laplace.25), scattered back to theta's order through kron_perm as ``_sqrt_cov_times``."""
    xp = xp_of(state.mu)
    out = xp.empty(Dq, dtype=state.mu.dtype)
    for start, stop, Q_A, Q_B, Lam in _kron_eigh(state):
        out[start:stop] = ((Q_A * Q_A) @ (1.0 / Lam) @ (Q_B * Q_B).T).reshape(-1)  # (laplace.25)
    if state.kron_perm is not None:  # diag(Pm^T Sigma~ Pm) = Pm^T diag(Sigma~) (conv.33)
        back = xp.empty_like(out)
        back[xp.asarray(state.kron_perm)] = out
        return back
    return out


def _with_prior_precision(state, delta):
    """The state with prior precision delta (D_q,) in place of state.prior_prec: H does not
    depend on delta, so P(delta) = P - diag(delta_old) + diag(delta), no refit.  (laplace.10)

    K-FAC states keep delta outside their factors (A_l kron B_l + delta_l I), so only
    prior_prec changes there (delta must stay constant on each block: ``_check_state``)."""
    xp = xp_of(state.mu)
    structure = _structure(state)
    if structure == "full":
        idx = xp.arange(delta.shape[0])
        Sigma_inv = state.Sigma_inv.copy()
        Sigma_inv[idx, idx] += delta - state.prior_prec  # (laplace.10)
        return state._replace(Sigma_inv=Sigma_inv, prior_prec=delta)
    if structure == "diag":
        prec_diag = state.prec_diag + (delta - state.prior_prec)  # (laplace.10)
        return state._replace(prec_diag=prec_diag, prior_prec=delta)
    new = state._replace(prior_prec=delta)  # (laplace.10)
    _check_state(new)  # delta constant on each K-FAC block
    return new


def _with_curvature_scale(state, c: float):
    """The state with H -> c H inside the precision: P -> c (P - diag(delta)) + diag(delta).
    (laplace.12)  For K-FAC, c scales each B_l (A_l kron c B_l = c A_l kron B_l)."""
    xp = xp_of(state.mu)
    structure = _structure(state)
    delta = state.prior_prec
    if structure == "full":
        idx = xp.arange(delta.shape[0])
        Sigma_inv = c * state.Sigma_inv
        Sigma_inv[idx, idx] += (1.0 - c) * delta  # (laplace.12)
        return state._replace(Sigma_inv=Sigma_inv)
    if structure == "diag":
        return state._replace(prec_diag=c * state.prec_diag + (1.0 - c) * delta)  # (laplace.12)
    return state._replace(kron=tuple(KronBlock(A, c * B) for A, B in state.kron))  # (laplace.12)


def _check_evidence_args(model, state, X, y, cfg):
    """The checks of ``log_marginal_likelihood``: returns (D, xp, curvature)."""
    D, xp = _check_state(state)
    structure, curvature, delta = _check_cfg(cfg, _n_random(state), state.mu.dtype, xp)
    if cfg.subset != ("last_layer" if state.n_fixed else "all"):
        raise ValueError(f"cfg.subset: expected the state's subset, got {cfg.subset!r}")
    if structure != _structure(state):
        raise ValueError(f"cfg.structure: expected {_structure(state)!r} (the state's), "
                         f"got {structure!r}")
    if not bool(xp.all(delta == state.prior_prec)):
        raise ValueError("cfg.prior_precision: expected the prior precision the state was fit "
                         "with (state.prior_prec); refit, or pass another one to "
                         "log_marginal_likelihood_grad")
    check_model(model, D, cnn=True)
    return D, xp, curvature


def _noise_power(curvature: str) -> int:
    """p with H(tau) = (tau / tau_0)^p H(tau_0): 1 for the Hessian and GGN, 2 for the EF."""
    return 2 if curvature == "ef" else 1  # (laplace.12)


def _gaussian_residual_energy(model, state, X, y):
    """(E, N K): E = (1/2) sum_i ||y_i - f(x_i, mu)||^2, the tau-free part of sum_i l_i."""
    f = model.forward(state.mu, X)
    N, K = f.shape
    t = model.likelihood.check_targets(y, N, K, f.dtype)
    r = t - f
    return 0.5 * xp_of(f).sum(r * r), N * K


def _evidence_and_grad(model, state, X, y, curvature, delta, tau):
    """(log Z, d/d log delta (D_q,), d/d log tau or None) at (delta, tau), mu and H fixed.
    Inputs validated by the caller.  (laplace.10)-(laplace.13)"""
    xp = xp_of(state.mu)
    st = _with_prior_precision(state, delta)  # (laplace.10)
    if tau is None:
        log_lik = -model.loss(state.mu, X, y)  # (laplace.5)
    else:
        tau0 = model.likelihood.noise_precision
        p = _noise_power(curvature)
        st = _with_curvature_scale(st, (tau / tau0) ** p)  # (laplace.12)
        E, NK = _gaussian_residual_energy(model, state, X, y)
        log_lik = -(tau * E + 0.5 * NK * math.log(2.0 * math.pi / tau))  # (laplace.12)
    mu = state.mu[state.n_fixed:]
    Dq = mu.shape[0]
    lml = log_lik - 0.5 * (_logdet_precision(st) - xp.sum(xp.log(delta))
                           + xp.sum(delta * mu * mu))  # (laplace.6)
    s = _diag_covariance(st)
    g_delta = 0.5 * (1.0 - delta * (mu * mu + s))  # (laplace.11)
    g_tau = None
    if tau is not None:
        g_tau = float(-tau * E + 0.5 * NK - 0.5 * p * (Dq - xp.sum(delta * s)))  # (laplace.13)
    return float(lml), g_delta, g_tau, st


def log_marginal_likelihood_grad(model, state: LaplaceState, X, y, cfg: LaplaceConfig,
                                 prior_precision=None, noise_precision=None) -> MarglikGrad:
    """Compute the Laplace evidence and its gradient at another prior (and noise) precision.

    The MAP mu and the curvature H stay those of the fit (laplace-torch's post-hoc
    ``log_marginal_likelihood(prior_precision, sigma_noise)``): H does not depend on delta, so
    P(delta) = P - diag(delta_fit) + diag(delta) (laplace.10), and for the Gaussian likelihood
    H(tau) = (tau / tau_fit)^p H with p = 1 ("hessian", "ggn") or p = 2 ("ef") (laplace.12).
    log Z is (laplace.6) there; its gradients are (laplace.11) and (laplace.13)::

        d log Z / d log delta_j = (1 - delta_j (mu_j^2 + Sigma_jj)) / 2,
        d log Z / d log tau     = -tau E + N K / 2 - (p / 2)(D_q - sum_j delta_j Sigma_jj),

    E = (1/2) sum_i ||y_i - f(x_i, mu)||^2, Sigma = P(delta, tau)^{-1}.  With the fit's own
    values this is ``log_marginal_likelihood`` (laplace.5).

    Parameters
    ----------
    model : FlatModel or CNN
        The model the state was fit with (its likelihood's noise precision is tau_fit).
    state : LaplaceState
        The Laplace posterior from ``fit``.
    X : array of shape (N, n_in)
        The training inputs the state was fit on.
    y : array of shape (N,) or (N, n_out)
        The training targets.
    cfg : LaplaceConfig
        The config the state was fit with (its curvature fixes p).
    prior_precision : float or array of shape (D_q,), optional
        The prior precision delta > 0 at which to evaluate; default the state's.
    noise_precision : float, optional
        The Gaussian noise precision tau > 0 at which to evaluate (Gaussian likelihood only);
        default None: the model's, and no noise gradient.

    Returns
    -------
    MarglikGrad
        The evidence log Z, d log Z / d log delta (D_q,), and d log Z / d log tau (or None).

    Raises
    ------
    ValueError
        If the arguments fail the checks of ``log_marginal_likelihood``; if prior_precision is
        not a real > 0 or a finite (D_q,) array > 0 in the state's dtype; if noise_precision is
        given for a likelihood that is not Gaussian or is not a finite real > 0; or if the
        precision at (delta, tau) is not positive definite.
    """
    D, xp, curvature = _check_evidence_args(model, state, X, y, cfg)
    Dq = _n_random(state)
    delta = state.prior_prec if prior_precision is None else \
        _as_delta(prior_precision, "prior_precision", Dq, state.mu.dtype, xp)
    tau = None
    if noise_precision is not None:
        if not isinstance(model.likelihood, Gaussian):
            raise ValueError("noise_precision: expected None for a "
                             f"{model.likelihood.name!r} likelihood (Gaussian only)")
        tau = check_in_range(noise_precision, "noise_precision", 0.0, math.inf,
                             low_open=True, high_open=True)
    lml, g_delta, g_tau, _ = _evidence_and_grad(model, state, X, y, curvature, delta, tau)
    return MarglikGrad(lml, g_delta, g_tau)


def _prior_groups(model, state, prior_structure):
    """(G, group id per random parameter (D_q,) int): one group ("scalar"), one per parameter
    tensor of the random block ("layerwise"; per K-FAC block for "kron"), or one per parameter
    ("diag").  (laplace.17)"""
    Dq = _n_random(state)
    if prior_structure == "scalar":
        return 1, np.zeros(Dq, dtype=np.int64)
    if _structure(state) == "kron":  # one delta per K-FAC block [W_l, b_l] (laplace.18)
        if prior_structure == "diag":
            raise ValueError("prior_structure: expected 'scalar' or 'layerwise' for a 'kron' "
                             "state (one prior precision per layer block), got 'diag'")
        sizes = [stop - start for start, stop, _, _ in _kron_offsets(state.kron)]
        return len(sizes), np.repeat(np.arange(len(sizes)), sizes)
    if prior_structure == "diag":
        return Dq, np.arange(Dq)
    sizes = _tensor_sizes(model)
    ids = np.repeat(np.arange(len(sizes)), sizes)[state.n_fixed:]  # the random tensors
    ids = ids - ids[0]
    return int(ids[-1]) + 1, ids


def optimize_prior_precision(model, state: LaplaceState, X, y, cfg: LaplaceConfig,
                             method: str = "lbfgs", prior_structure: str = "scalar",
                             optimize_noise: bool = False, init_prior_prec: float = 1.0,
                             grid=None, n_steps: int = 100, lr: float = 0.1,
                             gtol: float = 1e-10):
    """Maximise the Laplace evidence over the prior precision (and the Gaussian noise).

    laplace-torch's ``optimize_prior_precision`` on the post-hoc evidence: mu and H stay those
    of the fit, delta = expand(exp(x_g)) for the log prior precisions x_g of the structure,
    and log Z is (laplace.6) at P(delta, tau) (laplace.10), (laplace.12), with the gradient
    d log Z / d x_g = sum_{j in g} (laplace.11) and d / d log tau (laplace.13) (laplace.17).
    Methods: "lbfgs" (scipy L-BFGS-B on -log Z, run to gtol), "adam" (laplace-torch's
    ``method="marglik"``: n_steps Adam steps of size lr on -log Z from init_prior_prec and the
    model's tau), "grid" (a scalar delta over ``grid``, laplace-torch's ``"gridsearch"``
    interval logspace(-4, 4, 100) by default, scored by the evidence where laplace-torch
    scores a validation loss).  The optimiser runs on the host in float64.  A group whose mean
    entries are all zero has no finite maximiser (d log Z / d log delta_j >= 0 there,
    (laplace.11)): "lbfgs" drives its delta_g towards infinity and may report
    ``converged=False``.

    Parameters
    ----------
    model : FlatModel or CNN
        The model the state was fit with.
    state : LaplaceState
        The Laplace posterior from ``fit``.
    X : array of shape (N, n_in)
        The training inputs the state was fit on.
    y : array of shape (N,) or (N, n_out)
        The training targets.
    cfg : LaplaceConfig
        The config the state was fit with.
    method : {"lbfgs", "adam", "grid"}, default "lbfgs"
        How to maximise (TUNING_METHODS).
    prior_structure : {"scalar", "layerwise", "diag"}, default "scalar"
        One delta for all random parameters, one per parameter tensor (W_l, b_l, in theta
        order, as ``expand_prior_precision``; for a "kron" state one per layer block
        [W_l, b_l], which K-FAC requires), or one per random parameter (PRIOR_STRUCTURES;
        "grid" takes "scalar" only; "kron" refuses "diag").
    optimize_noise : bool, default False
        Also maximise over the Gaussian noise precision tau (Gaussian likelihood; not "grid").
    init_prior_prec : float, default 1.0
        Starting delta of every group for "lbfgs" and "adam" (laplace-torch's default).
    grid : array of shape (n,), optional
        Scalar prior precisions > 0 for "grid"; default 10 ** linspace(-4, 4, 100).
    n_steps : int, default 100
        Adam steps ("adam"), or the iteration limit of L-BFGS-B ("lbfgs").
    lr : float, default 0.1
        Adam's step size ("adam").
    gtol : float, default 1e-10
        L-BFGS-B's projected-gradient tolerance ("lbfgs").

    Returns
    -------
    state : LaplaceState
        The state at the optimum: P(delta*, tau*), same mu (use it with a model of noise
        precision tau* when the noise was optimised).
    info : PriorOptInfo
        The optimum in its structure, log Z there, and every evaluated point.

    Raises
    ------
    ValueError
        If the arguments fail the checks of ``log_marginal_likelihood``; if method,
        prior_structure are not among TUNING_METHODS, PRIOR_STRUCTURES; if optimize_noise is
        not a bool or is True for a likelihood that is not Gaussian or with "grid"; if "grid"
        is asked with a structure other than "scalar" or grid is not a finite (n,) array > 0
        (n >= 1); if init_prior_prec, lr or gtol is not a finite real > 0 or n_steps an int
        >= 1; or if the precision at an iterate of "lbfgs" or "adam" is not positive definite.
    """

    D, xp, curvature = _check_evidence_args(model, state, X, y, cfg)
    if method not in TUNING_METHODS:
        raise ValueError(f"method: expected one of {TUNING_METHODS}, got {method!r}")
    if prior_structure not in PRIOR_STRUCTURES:
        raise ValueError(f"prior_structure: expected one of {PRIOR_STRUCTURES}, "
                         f"got {prior_structure!r}")
    if not isinstance(optimize_noise, bool):
        raise ValueError(f"optimize_noise: expected a bool, got {optimize_noise!r}")
    if optimize_noise and not isinstance(model.likelihood, Gaussian):
        raise ValueError("optimize_noise: expected False for a "
                         f"{model.likelihood.name!r} likelihood (Gaussian only)")
    init = check_in_range(init_prior_prec, "init_prior_prec", 0.0, math.inf, low_open=True,
                          high_open=True)
    check_in_range(lr, "lr", 0.0, math.inf, low_open=True, high_open=True)
    check_in_range(gtol, "gtol", 0.0, math.inf, low_open=True, high_open=True)
    if isinstance(n_steps, bool) or not isinstance(n_steps, numbers.Integral) or n_steps < 1:
        raise ValueError(f"n_steps: expected an int >= 1, got {n_steps!r}")
    if method == "grid":
        if prior_structure != "scalar":
            raise ValueError("prior_structure: expected 'scalar' for method 'grid', got "
                             f"{prior_structure!r}")
        if optimize_noise:
            raise ValueError("optimize_noise: expected False for method 'grid' (it scans the "
                             "prior precision only)")
        grid = 10.0 ** np.linspace(-4.0, 4.0, 100) if grid is None else grid
        check_array(grid, "grid", ndim=1)
        if grid.shape[0] < 1:
            raise ValueError("grid: expected at least one value, got shape (0,)")
        check_positive(grid, "grid")
        grid = to_numpy(grid).astype(np.float64)
    elif grid is not None:
        raise ValueError(f"grid: expected None for method {method!r}")

    G, ids = _prior_groups(model, state, prior_structure)
    ids_xp = xp.asarray(ids)
    dtype = state.mu.dtype
    tau0 = model.likelihood.noise_precision if optimize_noise else None
    trace_x, trace_f = [], []

    def evaluate(x, values=None):
        """log Z and its gradient in x = [log delta_g, (log tau)] (host float64); values, if
        given, are the delta_g themselves (the grid's, exactly)."""
        values = np.exp(x[:G]) if values is None else values
        delta = xp.asarray(values, dtype=dtype)[ids_xp]  # (laplace.17)
        tau = float(np.exp(x[G])) if optimize_noise else None
        lml, g_delta, g_tau, st = _evidence_and_grad(model, state, X, y, curvature, delta, tau)
        g = np.bincount(ids, weights=to_numpy(g_delta).astype(np.float64), minlength=G)
        if optimize_noise:
            g = np.append(g, g_tau)  # (laplace.13)
        trace_x.append(np.array(x, dtype=np.float64))
        trace_f.append(lml)
        return lml, g, st  # (laplace.17)

    x0 = np.full(G, math.log(init))
    if optimize_noise:
        x0 = np.append(x0, math.log(tau0))
    converged = True
    if method == "lbfgs":

        res = minimize(lambda x: tuple(-v for v in evaluate(x)[:2]), x0, jac=True,
                       method="L-BFGS-B", options={"gtol": gtol, "ftol": 0.0, "maxiter": n_steps})
        x_best, converged = res.x, bool(res.success)
    elif method == "adam":
        acfg, a_state, x = AdamConfig(alpha=lr), adam_init(x0.shape[0]), x0.copy()
        for _ in range(n_steps):
            step, a_state = adam_update(-evaluate(x)[1], a_state, acfg)  # minimise -log Z
            x = x + step
        x_best, converged = x, False
    else:
        scores = []
        for d in grid:
            try:
                scores.append(evaluate(np.array([math.log(d)]), np.array([d]))[0])
            except ValueError:  # P not positive definite there: laplace-torch scores inf loss
                trace_x.append(np.array([math.log(d)]))
                trace_f.append(-math.inf)
                scores.append(-math.inf)
        x_best = np.array([math.log(grid[int(np.argmax(scores))])])
    values = grid[[int(np.argmax(scores))]] if method == "grid" else np.exp(x_best[:G])
    lml, _, st = evaluate(x_best, values)
    info = PriorOptInfo(float(values[0]) if prior_structure == "scalar" else values,
                        float(np.exp(x_best[G])) if optimize_noise else None, lml,
                        np.stack(trace_x), np.array(trace_f), converged)
    return st, info


# ----------------------------------------------------------------------------- predictive

def _functional_covariance(state, J):
    """J Sigma J^T per test point, for J (M, K, D) the output Jacobians at mu.  (laplace.7)

    Full: V = L^{-1} J^T (L L^T = Sigma_inv), J Sigma J^T = V^T V; diag: J diag(1/prec_diag) J^T.
    """
    xp = xp_of(state.mu)
    J = J[:, :, state.n_fixed:]  # the random block's columns (laplace.23)
    M, K, D = J.shape
    structure = _structure(state)
    if structure == "full":
        L = _chol(state)
        V = solve_triangular(L, J.reshape(M * K, D).T, lower=True)  # L^{-1} J^T
        V = V.reshape(D, M, K)
        return xp.einsum("dmk,dml->mkl", V, V)  # (laplace.7)
    if structure == "diag":
        return xp.einsum("mkd,mld->mkl", J / state.prec_diag, J)  # (laplace.7)
    f_var = xp.zeros((M, K, K), dtype=J.dtype)
    J = _to_kron_order(state, J, axis=2)  # the blocks' W~ order (conv.24), (conv.33)
    for start, stop, Q_A, Q_B, Lam in _kron_eigh(state):
        R = J[:, :, start:stop].reshape(M, K, Q_A.shape[0], Q_B.shape[0])
        V = ((Q_A.T @ R @ Q_B) / xp.sqrt(Lam)).reshape(M, K, -1)  # eigen-coordinates (laplace.21)
        f_var += V @ V.transpose(0, 2, 1)  # (laplace.21)
    return f_var


def glm_predictive(model, state: LaplaceState, X_star) -> GLMPredictive:
    """Compute the linearized (GLM) predictive of a Gaussian-likelihood model in closed form.

    f_lin(x, theta) = f(x, mu) + J(x)(theta - mu) under q gives f* ~ N(f(x*, mu),
    J Sigma J^T) and y* ~ N(f(x*, mu), J Sigma J^T + I / noise_precision), J = J(x*) at mu
    (laplace.7).

    Parameters
    ----------
    model : FlatModel or CNN
        A model with a Gaussian likelihood and D parameters.
    state : LaplaceState
        The Laplace posterior.
    X_star : array of shape (M, n_in)
        Test inputs, in the state's dtype.

    Returns
    -------
    GLMPredictive
        The mean f_mean (M, K) and the covariances f_var, y_var (M, K, K).

    Raises
    ------
    ValueError
        If state is invalid (see LaplaceState); if model is not a FlatModel or CNN
        with D parameters and a Gaussian likelihood; or if X_star is not a finite float
        (M, n_in) array with M >= 1 in the state's dtype.
    """
    D, xp = _check_state(state)
    check_model(model, D, cnn=True)
    if not isinstance(model.likelihood, Gaussian):
        raise ValueError("model: expected a Gaussian likelihood for the closed-form GLM "
                         f"predictive, got {model.likelihood.name!r}")
    check_array(X_star, "X_star", shape=(None, model_widths(model)[0]))
    if X_star.shape[0] < 1:
        raise ValueError(f"X_star: expected at least one row, got shape {tuple(X_star.shape)}")
    check_same_dtype({"state.mu": state.mu, "X_star": X_star})
    f_mean = model.forward(state.mu, X_star)  # (laplace.7)
    J = model.jacobian(state.mu, X_star)  # (M, K, D)
    f_var = _functional_covariance(state, J)  # (laplace.7)
    K = J.shape[1]
    eye = xp.eye(K, dtype=f_var.dtype) / model.likelihood.noise_precision
    y_var = f_var + eye[None]  # (laplace.7)
    return GLMPredictive(f_mean, f_var, y_var)


LINKS = ("probit", "mc")


class ClassPredictive(NamedTuple):
    """The linearized (GLM) predictive of a classifier at M test inputs.

    Each field is documented by its trailing comment.
    """
    probs: Array   # (M,) p(y* = 1) (as Bernoulli.mean) or (M, K) class probabilities (laplace.14), (laplace.15)
    f_mean: Array  # mean of the linearized logits f(x*, mu), (M, K) (laplace.7)
    f_var: Array   # their covariance J(x*) Sigma J(x*)^T, (M, K, K) (laplace.7)


class MCPredictive(NamedTuple):
    """The sampling ("nn") predictive at M test inputs from S parameter draws.

    Each field is documented by its trailing comment.
    """
    y_mean: Array     # (1/S) sum_s E[y | x*, theta_s], (M,) or (M, K) (laplace.16)
    y_var: Array      # mixture covariance (M, K, K), Gaussian only, else None (laplace.16)
    #                   (1/S) sum_s (f_s - y_mean)(f_s - y_mean)^T + I_K / noise_precision
    f_samples: Array  # f(x*, theta_s), (S, M, K) (laplace.16)


def _check_X_star(model, state, X_star):
    check_array(X_star, "X_star", shape=(None, model_widths(model)[0]))
    if X_star.shape[0] < 1:
        raise ValueError(f"X_star: expected at least one row, got shape {tuple(X_star.shape)}")
    check_same_dtype({"state.mu": state.mu, "X_star": X_star})


def _check_eps(eps, rows: int, xp, state, what: str):
    if eps is None:
        raise ValueError(f"eps: expected a ({rows}, S) array of standard-normal draws ({what}), "
                         "got None")
    check_array(eps, "eps", shape=(rows, None))
    if eps.shape[1] < 1:
        raise ValueError(f"eps: expected at least one column (S >= 1), got shape "
                         f"{tuple(eps.shape)}")
    check_same_dtype({"state.mu": state.mu, "eps": eps})
    if xp_of(eps) is not xp:
        raise ValueError("eps: expected an array on the state's backend, got NumPy and CuPy mixed")


def glm_class_predictive(model, state: LaplaceState, X_star, link: str = "probit",
                         eps=None) -> ClassPredictive:
    """Compute the linearized (GLM) predictive of a Bernoulli or categorical model.

    The logits are f* ~ N(f(x*, mu), J Sigma J^T) under the linearization (laplace.7); the
    probabilities E[sigma(f*)] / E[softmax(f*)] are approximated by the probit approximation
    (laplace.14), in laplace-torch's form (for categorical: the softmax of the logits each
    scaled by its own variance, f_k / sqrt(1 + pi/8 var_kk); Bernoulli: sigma(f / sqrt(1 +
    pi/8 var)), MacKay 1992), or by Monte Carlo over the linearized logits (laplace.15),
    f_s = f(x*, mu) + C eps_s with C C^T = J Sigma J^T (lower Cholesky, per test point) and
    the caller's eps (K, S) shared by all test points (laplace-torch's ``normal_samples``),
    probs = (1/S) sum_s E[y | f_s].

    Parameters
    ----------
    model : FlatModel or CNN
        A model with a Bernoulli (one logit) or categorical likelihood and D parameters.
    state : LaplaceState
        The Laplace posterior.
    X_star : array of shape (M, n_in)
        Test inputs, in the state's dtype.
    link : {"probit", "mc"}, default "probit"
        The link approximation (LINKS).
    eps : array of shape (K, S), optional
        Standard-normal draws in the state's dtype, S >= 1; required for "mc", None for
        "probit".

    Returns
    -------
    ClassPredictive
        The probabilities (M,) (Bernoulli, p(y* = 1)) or (M, K) (categorical), and the
        linearized logits' mean (M, K) and covariance (M, K, K).

    Raises
    ------
    ValueError
        If state is invalid (see LaplaceState); if model is not a FlatModel or CNN
        with D parameters and a Bernoulli or categorical likelihood; if X_star is not a
        finite float (M, n_in) array with M >= 1 in the state's dtype; if link is not in
        LINKS; if eps is not None with "probit", or not a finite (K, S) array (S >= 1) of the
        state's dtype and backend with "mc"; or if J Sigma J^T is not positive definite at a
        test point ("mc").
    """
    D, xp = _check_state(state)
    check_model(model, D, cnn=True)
    if isinstance(model.likelihood, Gaussian):
        raise ValueError("model: expected a bernoulli or categorical likelihood, got "
                         "'gaussian' (use glm_predictive)")
    _check_X_star(model, state, X_star)
    if link not in LINKS:
        raise ValueError(f"link: expected one of {LINKS}, got {link!r}")
    K = model_widths(model)[1]
    if link == "probit":
        if eps is not None:
            raise ValueError("eps: expected None for link 'probit' (no sampling), got an array")
    else:
        _check_eps(eps, K, xp, state, "one row per output")
    f_mean = model.forward(state.mu, X_star)  # (laplace.7)
    J = model.jacobian(state.mu, X_star)  # (M, K, D)
    f_var = _functional_covariance(state, J)  # (laplace.7)
    lik = model.likelihood
    if link == "probit":
        var = xp.diagonal(f_var, axis1=1, axis2=2)  # (M, K)
        kappa = 1.0 / xp.sqrt(1.0 + (math.pi / 8.0) * var)  # (laplace.14)
        return ClassPredictive(lik.mean(kappa * f_mean), f_mean, f_var)  # (laplace.14)
    try:
        C = cholesky(f_var)  # C C^T = f_var per test point
    except np.linalg.LinAlgError:
        C = None
    if C is None or not bool(xp.all(xp.isfinite(C))) \
            or not bool(xp.all(xp.diagonal(C, axis1=1, axis2=2) > 0)):
        raise ValueError("f_var: expected J Sigma J^T positive definite at every test point "
                         "for link 'mc' (its Cholesky factorization fails)")
    S, M = eps.shape[1], f_mean.shape[0]
    f_s = f_mean[None] + xp.einsum("mkl,ls->smk", C, eps)  # (laplace.15)
    p_s = lik.mean(f_s.reshape(S * M, K))  # E[y | f_s] (laplace.15)
    probs = xp.mean(p_s.reshape((S, M) + p_s.shape[1:]), axis=0)  # (laplace.15)
    return ClassPredictive(probs, f_mean, f_var)


def mc_predictive(model, state: LaplaceState, X_star, eps) -> MCPredictive:
    """Compute the sampling ("nn") predictive: average the likelihood's mean over theta_s ~ q.

    theta_s = ``sample(state, eps)`` (laplace.4), f_s = f(x*, theta_s) by the network itself
    (not linearized), y_mean = (1/S) sum_s E[y | f_s]; for the Gaussian likelihood also the
    covariance of the mixture (1/S) sum_s N(f_s, I / noise_precision),
    (1/S) sum_s f_s f_s^T - y_mean y_mean^T + I / noise_precision (laplace.16), computed from
    the centred draws.

    Parameters
    ----------
    model : FlatModel or CNN
        A model with D parameters (any likelihood).
    state : LaplaceState
        The Laplace posterior.
    X_star : array of shape (M, n_in)
        Test inputs, in the state's dtype.
    eps : array of shape (D_q, S)
        Standard-normal draws for ``sample``, S >= 1, in the state's dtype.

    Returns
    -------
    MCPredictive
        The mean y_mean (M, K) (Gaussian, categorical) or (M,) (Bernoulli), the covariance
        y_var (M, K, K) or None, and the draws f_samples (S, M, K).

    Raises
    ------
    ValueError
        If state is invalid (see LaplaceState); if model is not a FlatModel or CNN
        with D parameters; if X_star is not a finite float (M, n_in) array with M >= 1 in the
        state's dtype; or if eps is not a finite (D_q, S) array (S >= 1) of the state's dtype
        and backend.
    """
    D, xp = _check_state(state)
    check_model(model, D, cnn=True)
    _check_X_star(model, state, X_star)
    _check_eps(eps, _n_random(state), xp, state, "one row per random parameter")
    thetas = sample(state, eps)  # (laplace.4)
    S = eps.shape[1]
    f_s = xp.stack([model.forward(thetas[:, s], X_star) for s in range(S)])  # (laplace.16)
    M, K = f_s.shape[1:]
    lik = model.likelihood
    p_s = lik.mean(f_s.reshape(S * M, K))
    y_mean = xp.mean(p_s.reshape((S, M) + p_s.shape[1:]), axis=0)  # (laplace.16)
    if not isinstance(lik, Gaussian):
        return MCPredictive(y_mean, None, f_s)
    R = f_s - y_mean[None]
    eye = xp.eye(K, dtype=f_s.dtype) / lik.noise_precision
    y_var = xp.einsum("smk,sml->mkl", R, R) / S + eye[None]  # (laplace.16)
    return MCPredictive(y_mean, y_var, f_s)


def linearized_outputs(model, theta_map, Theta, X_star):
    """Evaluate the linearized network f_lin(x*, theta_s) at given parameter samples.

    f_lin(x*, theta) = f(x*, theta_map) + J(x*) (theta - theta_map), J the output Jacobian at
    theta_map (laplace.7): the outputs the GLM predictive integrates, at any S samples (Laplace
    draws from ``sample``, or Riemannian Laplace end points, which the RLA paper's code predicts
    with through the linearized network).

    Parameters
    ----------
    model : FlatModel or CNN
        A model with D parameters.
    theta_map : array of shape (D,)
        The linearization point, float64 or float32.
    Theta : array of shape (D, S)
        Parameter samples, one per column, S >= 1, in theta_map's dtype.
    X_star : array of shape (M, n_in)
        Test inputs, M >= 1, in theta_map's dtype.

    Returns
    -------
    array of shape (S, M, K)
        The outputs f_lin(x*_m, theta_s), for every sample s and input m.

    Raises
    ------
    ValueError
        If theta_map is not a finite float (D,) array; if model is not a FlatModel or CNN with D
        parameters; if Theta is not a finite (D, S) array with S >= 1 of theta_map's dtype and
        backend; or if X_star is not a finite float (M, n_in) array with M >= 1 in theta_map's
        dtype.
    """
    check_array(theta_map, "theta_map", ndim=1)
    check_float(theta_map, "theta_map")
    D = theta_map.shape[0]
    check_model(model, D, cnn=True)
    check_array(Theta, "Theta", shape=(D, None))
    if Theta.shape[1] < 1:
        raise ValueError(f"Theta: expected at least one column (S >= 1), got shape "
                         f"{tuple(Theta.shape)}")
    check_same_dtype({"theta_map": theta_map, "Theta": Theta})
    if xp_of(Theta) is not xp_of(theta_map):
        raise ValueError("Theta: expected an array on theta_map's backend, got NumPy and CuPy "
                         "mixed")
    f0 = model.forward(theta_map, X_star)  # f(x*, theta_map), (M, K), validates X_star
    J = model.jacobian(theta_map, X_star)  # (M, K, D)
    xp = xp_of(theta_map)
    return f0[None] + xp.einsum("mkd,ds->smk", J, Theta - theta_map[:, None])  # (laplace.7)
