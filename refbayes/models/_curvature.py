"""The curvature methods of FlatModel: output Jacobians, GGN, Hessian, Hessian-vector products
and the GGN / empirical-Fisher diagonals, at one theta or batched over S parameter vectors.

Implements (peg.7)-(peg.11), (peg.21) and (peg.22)-(peg.27) of derivations/per_example_gradients.md, in the symbols
and shapes of refbayes.models.base. Each public function here is a method of FlatModel (its
first argument ``self`` is the model), bound by name in FlatModel's class body, so that
``FlatModel.ggn`` is this ``ggn``: called, documented and overridden (the linear models' closed
forms) as a method. The inputs are validated as the FlatModel docstring states.
"""
from __future__ import annotations

import autograd
import numpy as np

from refbayes._checks import check_array, check_same_dtype
from refbayes.backend import xp_of
from refbayes.models import _layers

__all__ = ["diag_ef", "diag_ggn", "ggn", "ggn_vp", "grad_hvp", "hessian", "hvp", "jacobian",
           "jvp", "sample_moments"]


def _seeded_rows(model, xp, params, acts, seeds):
    """J_i^T s_{i,r} for seeds (M, R, K): shape (M, R, D). (peg.7)"""
    deltas = _layers.backward(params, acts, seeds, model.activation)  # (peg.7)
    return _layers.per_example_blocks(xp, acts, deltas, model.bias)


def jacobian(self, theta, X):
    """Compute the output Jacobians J[i, k] = d f_ik / d theta.

    Backprop of the K = n_out unit seeds e_k.  (peg.7)

    Parameters
    ----------
    theta : array of shape (D,)
        Flat parameter vector (float64 or float32).
    X : array of shape (M, n_in)
        Inputs, M >= 1, same dtype as theta.

    Returns
    -------
    array of shape (M, K, D)
        The Jacobians J.

    Raises
    ------
    ValueError
        If theta or X is invalid (see FlatModel).
    """
    xp, theta, X, _ = self._inputs(theta, X, need_y=False)
    M, K = X.shape[0], self.sizes[-1]
    params, acts, _ = self._forward(xp, theta, X)
    seeds = xp.broadcast_to(xp.eye(K, dtype=theta.dtype), (M, K, K))  # (peg.7)
    return _seeded_rows(self, xp, params, acts, seeds)

def ggn(self, theta, X, y):
    """Form the dense generalized Gauss-Newton matrix sum_i J_i^T H_i J_i.

    H_i = d^2 l_i / df_i^2 from the likelihood.  (peg.8)

    Parameters
    ----------
    theta : array of shape (D,)
        Flat parameter vector (float64 or float32).
    X : array of shape (M, n_in)
        Inputs, M >= 1, same dtype as theta.
    y : array of shape (M,) or (M, n_out)
        Targets: labels (M,) for classification; reals (M,) or (M, n_out) for the gaussian
        likelihood.

    Returns
    -------
    array of shape (D, D)
        The GGN.

    Raises
    ------
    ValueError
        If theta, X or y is invalid (see FlatModel).
    """
    xp, theta, X, y = self._inputs(theta, X, y)
    M, K = X.shape[0], self.sizes[-1]
    params, acts, f = self._forward(xp, theta, X)
    J = _seeded_rows(self, xp, params, acts,
                     xp.broadcast_to(xp.eye(K, dtype=theta.dtype), (M, K, K)))  # (peg.7)
    HJ = xp.einsum("mkl,mld->mkd", self.likelihood._hess_f(f, y), J)
    M_K = M * K  # sum over (m, k) as one matrix product: BLAS, not einsum's loop
    return J.reshape(M_K, -1).T @ HJ.reshape(M_K, -1)  # (peg.8)

def hessian(self, theta, X, y):
    """Form the dense Hessian of sum_i l_i, by autograd (NumPy only).

    (peg.21)

    Parameters
    ----------
    theta : array of shape (D,)
        Flat parameter vector (float64 or float32).
    X : array of shape (M, n_in)
        Inputs, M >= 1, same dtype as theta.
    y : array of shape (M,) or (M, n_out)
        Targets: labels (M,) for classification; reals (M,) or (M, n_out) for the gaussian
        likelihood.

    Returns
    -------
    numpy.ndarray of shape (D, D)
        The Hessian, in theta's dtype.

    Raises
    ------
    ValueError
        If theta, X or y is invalid (see FlatModel), or the arrays are CuPy arrays.
    """
    xp, theta, X, y = self._inputs(theta, X, y)
    if xp is not np:
        raise ValueError("theta: the autograd Hessian needs NumPy arrays, got CuPy arrays")
    H = autograd.hessian(self._autograd_loss)(theta, X, y)  # (peg.21)
    return np.asarray(H, dtype=theta.dtype)


def _r_inputs(self, theta, v, X, y, need_y=True):
    """Validated (xp, theta, X, y) and v split into per-layer blocks (V_l, c_l)."""
    xp, theta, X, y = self._inputs(theta, X, y, need_y=need_y)
    xp_of(theta, v)
    check_array(v, "v", shape=(self.D,))
    check_same_dtype({"theta": theta, "v": v})
    return xp, theta, X, y, _layers.unflatten(v, self.sizes, self.bias)


def hvp(self, theta, v, X, y):
    """Compute the Hessian-vector product H v of sum_i l_i in closed form (NumPy or CuPy).

    H is the Hessian of ``hessian`` (peg.21); H v = R{grad} is Pearlmutter's R-operator: one
    forward pass of the directional derivatives R{z_l} beside (peg.1), then one backward pass of
    R{delta_l} beside (peg.3), (peg.22)-(peg.26). The D x D matrix is never formed. The same
    product by autograd (reverse over reverse, NumPy only) is ``_hvp_autograd``, its test oracle.

    Parameters
    ----------
    theta : array of shape (D,)
        Flat parameter vector (float64 or float32).
    v : array of shape (D,)
        The vector, same dtype and backend as theta.
    X : array of shape (M, n_in)
        Inputs, M >= 1, same dtype as theta.
    y : array of shape (M,) or (M, n_out)
        Targets: labels (M,) for classification; reals (M,) or (M, n_out) for the gaussian
        likelihood.

    Returns
    -------
    array of shape (D,)
        The product H v, in theta's dtype.

    Raises
    ------
    ValueError
        If theta, X or y is invalid (see FlatModel), or v is not a finite (D,) array of
        theta's dtype on theta's backend.
    """
    return _grad_hvp(self, *_r_inputs(self, theta, v, X, y))[1]


def grad_hvp(self, theta, v, X, y):
    """Compute the gradient g = sum_i dl_i/dtheta and H v from one forward and one backward pass.

    The R-operator's passes (peg.22)-(peg.26) run beside the gradient's (peg.1)-(peg.6), so both
    cost about as much as ``hvp`` alone: what a geodesic's right-hand side needs at one point
    (``riemannian_laplace.loss_fns``). Each equals ``grad`` and ``hvp`` bit for bit.

    Parameters
    ----------
    theta : array of shape (D,)
        Flat parameter vector (float64 or float32).
    v : array of shape (D,)
        The vector, same dtype and backend as theta.
    X : array of shape (M, n_in)
        Inputs, M >= 1, same dtype as theta.
    y : array of shape (M,) or (M, n_out)
        Targets: labels (M,) for classification; reals (M,) or (M, n_out) for the gaussian
        likelihood.

    Returns
    -------
    g : array of shape (D,)
        The gradient, as ``grad``.
    Hv : array of shape (D,)
        The product H v, as ``hvp``.

    Raises
    ------
    ValueError
        If theta, X or y is invalid (see FlatModel), or v is not a finite (D,) array of
        theta's dtype on theta's backend.
    """
    return _grad_hvp(self, *_r_inputs(self, theta, v, X, y))


def _grad_hvp(self, xp, theta, X, y, dparams):
    """(g, H v) of validated inputs, v split into dparams.  (peg.6), (peg.22)-(peg.25)"""
    params, acts, f = self._forward(xp, theta, X)  # (peg.1)
    r = self.likelihood._grad_f(f, y)  # (peg.2)
    deltas = _layers.backward(params, acts, r, self.activation)  # (peg.3), as grad's pass
    r_zs, r_as, r_f = _layers.r_forward(params, dparams, acts, self.activation)  # (peg.22)
    r_seed = xp.einsum("mkl,ml->mk", self.likelihood._hess_f(f, y), r_f)  # (peg.23)
    r_deltas = _layers.r_backward(params, dparams, acts, deltas, r_zs, r_seed,
                                  self.activation)  # (peg.24)
    g = _layers.summed_blocks(xp, acts, deltas, self.bias)  # (peg.6)
    return g, _layers.r_blocks(xp, acts, deltas, r_as, r_deltas, self.bias)  # (peg.25)


def _hvp_autograd(self, theta, v, X, y):
    """H v by autograd's reverse-over-reverse product (NumPy only): the oracle of ``hvp``. (peg.21)"""
    xp, theta, X, y = self._inputs(theta, X, y)
    check_array(v, "v", shape=(self.D,))
    check_same_dtype({"theta": theta, "v": v})
    if xp is not np:
        raise ValueError("theta: the autograd Hessian-vector product needs NumPy arrays, got "
                         "CuPy arrays")
    Hv = autograd.hessian_tensor_product(self._autograd_loss)(theta, X, y, v)  # (peg.21)
    return np.asarray(Hv, dtype=theta.dtype)


def jvp(self, theta, v, X):
    """Compute the output Jacobian-vector products J_i v = R{f_i} in one forward pass.

    (peg.22)

    Parameters
    ----------
    theta : array of shape (D,)
        Flat parameter vector (float64 or float32).
    v : array of shape (D,)
        The vector, same dtype and backend as theta.
    X : array of shape (M, n_in)
        Inputs, M >= 1, same dtype as theta.

    Returns
    -------
    array of shape (M, n_out)
        Row i is J_i v, J_i = df_i/dtheta as in ``jacobian``.

    Raises
    ------
    ValueError
        If theta or X is invalid (see FlatModel), or v is not a finite (D,) array of theta's
        dtype on theta's backend.
    """
    xp, theta, X, _, dparams = _r_inputs(self, theta, v, X, None, need_y=False)
    params, acts, _ = self._forward(xp, theta, X)
    return _layers.r_forward(params, dparams, acts, self.activation)[2]  # (peg.22)


def ggn_vp(self, theta, v, X, y):
    """Compute the GGN-vector product sum_i J_i^T H_i J_i v without J or the D x D GGN.

    (peg.27) J v by the R pass (peg.22), the seed H_i J_i v (peg.23), then plain backprop (peg.3)-(peg.6):
    the Hessian of the loss of the network linearized at theta, applied to v; ``ggn(theta, X,
    y) @ v`` up to rounding.

    Parameters
    ----------
    theta : array of shape (D,)
        Flat parameter vector (float64 or float32).
    v : array of shape (D,)
        The vector, same dtype and backend as theta.
    X : array of shape (M, n_in)
        Inputs, M >= 1, same dtype as theta.
    y : array of shape (M,) or (M, n_out)
        Targets: labels (M,) for classification; reals (M,) or (M, n_out) for the gaussian
        likelihood.

    Returns
    -------
    array of shape (D,)
        The product GGN v, in theta's dtype.

    Raises
    ------
    ValueError
        If theta, X or y is invalid (see FlatModel), or v is not a finite (D,) array of
        theta's dtype on theta's backend.
    """
    xp, theta, X, y, dparams = _r_inputs(self, theta, v, X, y)
    params, acts, f = self._forward(xp, theta, X)
    r_f = _layers.r_forward(params, dparams, acts, self.activation)[2]  # J v (peg.22)
    seed = xp.einsum("mkl,ml->mk", self.likelihood._hess_f(f, y), r_f)  # (peg.23)
    deltas = _layers.backward(params, acts, seed, self.activation)  # (peg.27)
    return _layers.summed_blocks(xp, acts, deltas, self.bias)  # (peg.27)


def diag_ggn(self, theta, X, y):
    """Compute the GGN diagonal without forming a D x D matrix.

    diag(GGN) = sum_i sum_r (J_i^T c_{i,r})^2 with H_i = C_i C_i^T.  (peg.9)-(peg.10)

    Parameters
    ----------
    theta : array of shape (D,)
        Flat parameter vector (float64 or float32).
    X : array of shape (M, n_in)
        Inputs, M >= 1, same dtype as theta.
    y : array of shape (M,) or (M, n_out)
        Targets: labels (M,) for classification; reals (M,) or (M, n_out) for the gaussian
        likelihood.

    Returns
    -------
    array of shape (D,)
        The diagonal of the GGN.

    Raises
    ------
    ValueError
        If theta, X or y is invalid (see FlatModel).
    """
    xp, theta, X, y = self._inputs(theta, X, y)
    params, acts, f = self._forward(xp, theta, X)
    C = self.likelihood._hess_factor(f, y)  # (M, K, R)
    deltas = _layers.backward(params, acts, xp.swapaxes(C, 1, 2), self.activation)  # (peg.9)
    e = [(d * d).sum(axis=1) for d in deltas]
    return _layers.sum_sq_blocks(xp, acts, e, self.bias)  # (peg.10)

def diag_ef(self, theta, X, y):
    """Compute the diagonal empirical Fisher sum_i g_i^2, g_i = dl_i/dtheta.

    No (M, D) rows are formed.  (peg.11)

    Parameters
    ----------
    theta : array of shape (D,)
        Flat parameter vector (float64 or float32).
    X : array of shape (M, n_in)
        Inputs, M >= 1, same dtype as theta.
    y : array of shape (M,) or (M, n_out)
        Targets: labels (M,) for classification; reals (M,) or (M, n_out) for the gaussian
        likelihood.

    Returns
    -------
    array of shape (D,)
        The diagonal empirical Fisher.

    Raises
    ------
    ValueError
        If theta, X or y is invalid (see FlatModel).
    """
    xp, theta, X, y = self._inputs(theta, X, y)
    acts, deltas = self._residual_pass(xp, theta, X, y)
    return _layers.sum_sq_blocks(xp, acts, [d * d for d in deltas], self.bias)  # (peg.11)

def sample_moments(self, thetas, X, y, curvature=None):
    """Compute gradients and curvature diagonals at S parameter vectors in one batched pass.

    g[s] = sum_i dl_i/dtheta at theta_s (peg.6); with curvature="ef" h[s] = sum_i g_i^2
    (peg.11), with curvature="ggn" h[s] = diag(sum_i J_i^T H_i J_i) (peg.9)-(peg.10).
    Equal to S calls of ``grad`` and ``diag_ef`` / ``diag_ggn``; one matmul per layer for all
    S vectors (Monte Carlo samples) instead of a Python loop, and no (M, D) rows.

    Parameters
    ----------
    thetas : array of shape (S, D)
        S >= 1 parameter vectors (float64 or float32).
    X : array of shape (M, n_in)
        Inputs, M >= 1, same dtype as thetas.
    y : array of shape (M,) or (M, n_out)
        Targets: labels (M,) for classification; reals (M,) or (M, n_out) for the gaussian
        likelihood.
    curvature : {None, "ef", "ggn"}, optional
        Which curvature diagonal to return with the gradients.

    Returns
    -------
    g : array of shape (S, D)
        The summed gradients.
    h : array of shape (S, D) or None
        The curvature diagonals, None when curvature is None.

    Raises
    ------
    ValueError
        If thetas, X or y is invalid (see FlatModel), or curvature is not None, "ef" or
        "ggn".
    """
    if curvature not in (None, "ef", "ggn"):
        raise ValueError(f"curvature: expected None, 'ef' or 'ggn', got {curvature!r}")
    xp, X, y, S = self._inputs_batched(thetas, X, y)
    return _moments(self, xp, thetas, X, y, S, curvature)


def _sample_moments_trusted(self, thetas, X, y, curvature):
    """``sample_moments`` for a caller that built thetas (S, D) itself from checked arrays and has
    checked X (finite, (M, n_in), thetas' dtype) and curvature: only the targets are checked (and
    put in the likelihood's form), not the thetas and X again.  (peg.6), (peg.9)-(peg.11)"""
    y = self.likelihood.check_targets(y, X.shape[0], self.sizes[-1], thetas.dtype)
    return _moments(self, xp_of(thetas, X, y), thetas, X, y, thetas.shape[0], curvature)


def _moments(self, xp, thetas, X, y, S, curvature):
    """The pass of ``sample_moments`` on validated inputs (y in the likelihood's form)."""
    params, acts, f, yy, deltas, g = self._batched_gradient_pass(xp, thetas, X, y, S)
    if curvature is None:
        return g, None
    if curvature == "ef":
        return g, _layers.sum_sq_blocks_batched(xp, acts, [d * d for d in deltas],
                                                self.bias)  # (peg.11)
    e = None
    for dq in _ggn_column_passes(self, xp, params, acts, f, yy, S):
        e = [d * d for d in dq] if e is None else [a + d * d for a, d in zip(e, dq)]
    return g, _layers.sum_sq_blocks_batched(xp, acts, e, self.bias)  # (peg.10)


def _hessian_sum(self, thetas, X, y, diag=False):
    """sum_s of ``hessian(thetas[s], X, y)`` (or of its diagonal) over the rows of thetas
    (S, D): S Hessian calls here; models with a closed form for the sum override it."""
    xp = xp_of(thetas)
    H = [self.hessian(xp.ascontiguousarray(th), X, y) for th in thetas]  # (peg.21)
    return sum(xp.diagonal(h) for h in H) if diag else sum(H)


def _ggn_column_passes(model, xp, params, acts, f, yy, S):
    """The backward passes of the columns of C_i (H_i = C_i C_i^T), one per column, at the S
    vectors: each [e_1, ..., e_L] with e_l (S, M, n_l).  (peg.9)"""
    C = model.likelihood._hess_factor(f, yy)  # (S M, K, R)
    K = f.shape[1]
    return (_layers.backward_batched(xp, params, acts, C[:, :, q].reshape(S, -1, K),
                                     model.activation)
            for q in range(C.shape[2]))  # (peg.9)

