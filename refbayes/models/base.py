"""FlatModel: a dense network on one flat parameter vector theta, with every quantity methods consume.

Implements (peg.1)-(peg.12) and (peg.17) of derivations/per_example_gradients.md; ``MLP``,
``LogisticRegression`` and ``SoftmaxRegression`` are FlatModels.

Symbols and shapes: theta (D,); X (M, n_in); y (M,) class labels for classification (integer
dtype, or floats holding exact integers), (M,) or (M, K) reals for the gaussian likelihood (K = n_out); f (M, K) outputs; r = dl/df (M, K);
H (M, K, K) and its factor C (M, K, R) from the likelihood; G (M, D) per-example gradients;
J (M, K, D) output Jacobians. Losses are SUMMED over the M examples: loss = sum_i l_i,
l_i = -log p(y_i | x_i, theta) with every constant; minibatch scaling (N / M) is the caller's.

theta layout: for l = 1..L, W_l (n_{l-1}, n_l) row-major, then b_l (n_l,) (absent without bias).
Every public method validates theta, X, y (shapes, one float dtype for theta and X, finiteness,
labels) and raises ValueError naming the argument. theta and X must share a dtype (float64 or
float32); results come back in that dtype on the backend of the inputs.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from refbayes._checks import check_array, check_float, check_int, check_same_dtype
from refbayes.backend import xp_of
from refbayes.models import _layers

__all__ = ["FlatModel", "KFACLayer", "IMPLS"]

IMPLS = ("numba", "vectorized", "autograd")


class KFACLayer(NamedTuple):
    """K-FAC ingredients of one layer l, for the loss and labels given. (peg.12)"""
    a: object  # a_{l-1}, (M, n_{l-1}): the layer's per-example input (a_0 = X)
    g: object  # g_l = dl_i/dz_l, (M, n_l): per-example pre-activation gradient (= delta_l)


class FlatModel:
    """A dense network x -> f(x; theta) with a likelihood p(y | f); hyperparameters only.

    Attributes: ``sizes`` (tuple, [n_in, ..., n_out]), ``D`` (number of parameters),
    ``activation`` (hidden layers; the last layer is linear), ``likelihood`` (a likelihood
    instance from refbayes.models.likelihoods), ``bias`` (whether each layer has b_l).
    """

    __slots__ = ("sizes", "activation", "likelihood", "bias", "D")
    _numpy_impl = "numba"  # default per-example-gradient implementation on NumPy

    def __init__(self, sizes, activation, likelihood, bias):
        object.__setattr__(self, "sizes", tuple(int(s) for s in sizes))
        object.__setattr__(self, "activation", activation)
        object.__setattr__(self, "likelihood", likelihood)
        object.__setattr__(self, "bias", bool(bias))
        object.__setattr__(self, "D", _layers.layout(self.sizes, self.bias).D)

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is immutable (hyperparameters only)")

    def __eq__(self, other):
        return type(self) is type(other) and all(
            getattr(self, k) == getattr(other, k) for k in FlatModel.__slots__)

    def __hash__(self):
        return hash((type(self).__name__,) + tuple(getattr(self, k) for k in FlatModel.__slots__))

    @property
    def n_layers(self) -> int:
        return len(self.sizes) - 1

    # ---- validation ------------------------------------------------------------------------

    def _check_theta(self, theta):
        check_array(theta, "theta", ndim=1)
        if theta.shape[0] != self.D:
            raise ValueError(f"theta: expected shape ({self.D},) for sizes {list(self.sizes)}, "
                             f"got {tuple(theta.shape)}")
        check_float(theta, "theta")
        return theta

    def _check_X(self, X):
        check_array(X, "X", ndim=2)
        if X.shape[1] != self.sizes[0]:
            raise ValueError(f"X: expected shape (M, {self.sizes[0]}), got {tuple(X.shape)}")
        if X.shape[0] < 1:
            raise ValueError("X: expected at least one row, got shape "
                             f"{tuple(X.shape)}")
        check_float(X, "X")
        return X

    def _inputs(self, theta, X, y=None, need_y=True):
        """xp and validated (theta, X, y); y comes back as the likelihood's canonical form."""
        xp = xp_of(theta, X, y)
        self._check_theta(theta)
        self._check_X(X)
        check_same_dtype({"theta": theta, "X": X})
        if need_y:
            if y is None:
                raise ValueError("y: expected targets, got None")
            y = self.likelihood.check_targets(y, X.shape[0], self.sizes[-1], theta.dtype)
        return xp, theta, X, y

    # ---- parameters ------------------------------------------------------------------------

    def unflatten(self, theta):
        """theta (D,) -> [(W_l (n_{l-1}, n_l), b_l (n_l,) or None)], views into theta (row-major W_l)."""
        xp_of(theta)
        self._check_theta(theta)
        return _layers.unflatten(theta, self.sizes, self.bias)

    def flatten(self, params):
        """[(W_l, b_l)] -> theta (D,) = concat(vec_row_major(W_1), b_1, ..., vec(W_L), b_L)."""
        if not isinstance(params, (list, tuple)) or len(params) != self.n_layers:
            raise ValueError(f"params: expected a list of {self.n_layers} (W, b) pairs, "
                             f"got {type(params).__name__} of length "
                             f"{len(params) if hasattr(params, '__len__') else '?'}")
        arrays = [p for pair in params for p in pair if p is not None]
        xp = xp_of(*arrays)
        pieces = []
        for l, pair in enumerate(params):
            n_in, n_out = self.sizes[l], self.sizes[l + 1]
            if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                raise ValueError(f"params[{l}]: expected a (W, b) pair, got {pair!r:.80}")
            W, b = pair
            check_array(W, f"params[{l}][0] (W_{l + 1})", shape=(n_in, n_out))
            pieces.append(W.reshape(-1))
            if self.bias:
                if b is None:
                    raise ValueError(f"params[{l}][1] (b_{l + 1}): expected shape ({n_out},), got None")
                check_array(b, f"params[{l}][1] (b_{l + 1})", shape=(n_out,))
                pieces.append(b)
            elif b is not None:
                raise ValueError(f"params[{l}][1]: expected None (this model has no bias), got an array")
        check_same_dtype({f"params[{k}]": a for k, a in enumerate(arrays)})
        return xp.concatenate(pieces)

    def init_theta(self, rng, dtype=np.float64):
        """Glorot-uniform theta (NumPy): W_l ~ U(-s, s), s = sqrt(6 / (n_{l-1} + n_l)); b_l = 0.

        ``rng`` is a numpy.random.Generator owned by the caller (weights drawn layer by layer in
        theta order); move the result to the GPU explicitly if needed.
        """
        if not isinstance(rng, np.random.Generator):
            raise ValueError(f"rng: expected a numpy.random.Generator, got {type(rng).__name__}")
        if np.dtype(dtype) not in (np.float32, np.float64):
            raise ValueError(f"dtype: expected float64 or float32, got {dtype}")
        params = []
        for n_in, n_out in zip(self.sizes[:-1], self.sizes[1:]):
            s = math.sqrt(6.0 / (n_in + n_out))
            W = rng.uniform(-s, s, size=(n_in, n_out))
            params.append((W, np.zeros(n_out) if self.bias else None))
        return self.flatten(params).astype(dtype)

    # ---- forward ---------------------------------------------------------------------------

    def _forward(self, xp, theta, X):
        params = _layers.unflatten(theta, self.sizes, self.bias)
        acts, f = _layers.forward(xp, params, X, self.activation)
        return params, acts, f

    def forward(self, theta, X):
        """f = z_L (M, n_out): h_0 = X, h_l = act(h_{l-1} W_l + b_l), last layer linear. (peg.1)"""
        xp, theta, X, _ = self._inputs(theta, X, need_y=False)
        return self._forward(xp, theta, X)[2]

    def predict(self, theta, X):
        """The predictive mean E[y | x, theta]: gaussian f (M, n_out); bernoulli p(y=1) (M,);
        categorical class probabilities (M, C)."""
        xp, theta, X, _ = self._inputs(theta, X, need_y=False)
        return self.likelihood._mean(xp, self._forward(xp, theta, X)[2])

    def per_example_losses(self, theta, X, y):
        """l_i = -log p(y_i | x_i, theta), shape (M,). (peg.13)-(peg.15)"""
        xp, theta, X, y = self._inputs(theta, X, y)
        return self.likelihood._losses(xp, self._forward(xp, theta, X)[2], y)

    def loss(self, theta, X, y):
        """sum_i l_i (a 0-d array of theta's dtype on theta's backend)."""
        return self.per_example_losses(theta, X, y).sum()

    # ---- gradients ---------------------------------------------------------------------------

    def _residual_pass(self, xp, theta, X, y):
        params, acts, f = self._forward(xp, theta, X)
        r = self.likelihood._grad_f(f, y)  # (peg.2)
        return acts, _layers.backward(params, acts, r, self.activation)

    def grad(self, theta, X, y):
        """g = sum_i dl_i/dtheta (D,), by backprop of r = dl/df without forming per-example rows. (peg.6)"""
        xp, theta, X, y = self._inputs(theta, X, y)
        acts, deltas = self._residual_pass(xp, theta, X, y)
        return _layers.summed_blocks(xp, acts, deltas, self.bias)

    def per_example_grads(self, theta, X, y, impl=None):
        """G (M, D), G[i] = dl_i/dtheta, so G.sum(0) == grad. (peg.4)

        impl: "numba" (jitted loops; NumPy only; the default on NumPy except for the one-layer
        linear models, where "vectorized" is faster), "vectorized" (batched
        outer products via einsum; NumPy or CuPy; the default on CuPy), "autograd" (a loop of
        autograd.grad over examples, the oracle; NumPy only). All agree to rounding.
        """
        xp = xp_of(theta, X, y)
        impl = (self._numpy_impl if xp is np else "vectorized") if impl is None else impl
        if impl not in IMPLS:
            raise ValueError(f"impl: expected one of {IMPLS}, got {impl!r}")
        if impl != "vectorized" and xp is not np:
            raise ValueError(f"impl: {impl!r} runs on NumPy arrays only, got CuPy arrays; "
                             "use impl='vectorized' on the GPU")
        xp, theta, X, y = self._inputs(theta, X, y)
        if impl == "numba":
            from refbayes.models._numba_kernels import per_example_grads_numba
            return per_example_grads_numba(theta, X, self.sizes, self.bias, self.activation,
                                           lambda f: self.likelihood._grad_f(f, y))
        if impl == "autograd":
            return self._per_example_grads_autograd(theta, X, y)
        acts, deltas = self._residual_pass(xp, theta, X, y)
        return _layers.per_example_blocks(xp, acts, deltas, self.bias)

    def _autograd_loss(self, theta, X, y):
        import autograd.numpy as anp
        params = _layers.unflatten(theta, self.sizes, self.bias)
        f = _layers.forward(anp, params, X, self.activation)[1]
        return anp.sum(self.likelihood._losses(anp, f, y))

    def _per_example_grads_autograd(self, theta, X, y):
        import autograd
        grad_fn = autograd.grad(self._autograd_loss)
        G = np.empty((X.shape[0], self.D), dtype=theta.dtype)
        for i in range(X.shape[0]):
            G[i] = grad_fn(theta, X[i:i + 1], y[i:i + 1])
        return G

    # ---- curvature -------------------------------------------------------------------------

    def _seeded_rows(self, xp, params, acts, seeds):
        """J_i^T s_{i,r} for seeds (M, R, K): shape (M, R, D). (peg.7)"""
        deltas = _layers.backward(params, acts, seeds, self.activation)  # (peg.7)
        return _layers.per_example_blocks(xp, acts, deltas, self.bias)

    def jacobian(self, theta, X):
        """J (M, K, D), J[i, k] = d f_ik / d theta: backprop of the K unit seeds e_k. (peg.7)"""
        xp, theta, X, _ = self._inputs(theta, X, need_y=False)
        M, K = X.shape[0], self.sizes[-1]
        params, acts, _ = self._forward(xp, theta, X)
        seeds = xp.broadcast_to(xp.eye(K, dtype=theta.dtype), (M, K, K))  # (peg.7)
        return self._seeded_rows(xp, params, acts, seeds)

    def ggn(self, theta, X, y):
        """Dense GGN (D, D) = sum_i J_i^T H_i J_i, H_i = d^2 l_i / df_i^2. (peg.8)"""
        xp, theta, X, y = self._inputs(theta, X, y)
        M, K = X.shape[0], self.sizes[-1]
        params, acts, f = self._forward(xp, theta, X)
        J = self._seeded_rows(xp, params, acts,
                              xp.broadcast_to(xp.eye(K, dtype=theta.dtype), (M, K, K)))  # (peg.7)
        HJ = xp.einsum("mkl,mld->mkd", self.likelihood._hess_f(f, y), J)
        return xp.einsum("mkd,mke->de", J, HJ)  # (peg.8)

    def hessian(self, theta, X, y):
        """Dense Hessian (D, D) of sum_i l_i, by autograd (NumPy only). (peg.17)"""
        xp, theta, X, y = self._inputs(theta, X, y)
        if xp is not np:
            raise ValueError("theta: the autograd Hessian needs NumPy arrays, got CuPy arrays")
        import autograd
        H = autograd.hessian(self._autograd_loss)(theta, X, y)  # (peg.17)
        return np.asarray(H, dtype=theta.dtype)

    def diag_ggn(self, theta, X, y):
        """diag(GGN) (D,) = sum_i sum_r (J_i^T c_{i,r})^2 with H_i = C_i C_i^T, no D x D. (peg.9)-(peg.10)"""
        xp, theta, X, y = self._inputs(theta, X, y)
        params, acts, f = self._forward(xp, theta, X)
        C = self.likelihood._hess_factor(f, y)  # (M, K, R)
        deltas = _layers.backward(params, acts, xp.swapaxes(C, 1, 2), self.activation)  # (peg.9)
        e = [(d * d).sum(axis=1) for d in deltas]
        return _layers.sum_sq_blocks(xp, acts, e, self.bias)  # (peg.10)

    def diag_ef(self, theta, X, y):
        """Diagonal empirical Fisher (D,) = sum_i g_i^2, g_i = dl_i/dtheta, no (M, D) rows. (peg.11)"""
        xp, theta, X, y = self._inputs(theta, X, y)
        acts, deltas = self._residual_pass(xp, theta, X, y)
        return _layers.sum_sq_blocks(xp, acts, [d * d for d in deltas], self.bias)  # (peg.11)

    def sample_moments(self, thetas, X, y, curvature=None):
        """(g (S, D), h (S, D) or None) for S parameter vectors thetas (S, D) in one batched pass:
        g[s] = sum_i dl_i/dtheta at theta_s (peg.6), and with curvature="ef" h[s] = sum_i g_i^2
        (peg.11) or with curvature="ggn" h[s] = diag(sum_i J_i^T H_i J_i) (peg.9)-(peg.10).

        Equal to S calls of ``grad`` and ``diag_ef`` / ``diag_ggn``; one matmul per layer for all S
        vectors (Monte Carlo samples) instead of a Python loop, and no (M, D) rows.
        """
        if curvature not in (None, "ef", "ggn"):
            raise ValueError(f"curvature: expected None, 'ef' or 'ggn', got {curvature!r}")
        check_array(thetas, "thetas", ndim=2)
        S = thetas.shape[0]
        if S < 1 or thetas.shape[1] != self.D:
            raise ValueError(f"thetas: expected shape (S >= 1, {self.D}), got {tuple(thetas.shape)}")
        xp, _, X, y = self._inputs(thetas[0], X, y)
        check_float(thetas, "thetas")
        check_same_dtype({"thetas": thetas, "X": X})
        params = _layers.unflatten_batched(thetas, self.sizes, self.bias)
        acts, f = _layers.forward_batched(xp, params, X, self.activation)
        M, K = X.shape[0], f.shape[-1]
        lik = self.likelihood
        yy = xp.concatenate([y] * S) if S > 1 else y
        r = lik._grad_f(f.reshape(S * M, K), yy).reshape(S, M, K)  # (peg.2)
        deltas = _layers.backward_batched(xp, params, acts, r, self.activation)
        g = _layers.summed_blocks_batched(xp, acts, deltas, self.bias)  # (peg.6)
        if curvature is None:
            return g, None
        if curvature == "ef":
            return g, _layers.sum_sq_blocks_batched(xp, acts, [d * d for d in deltas],
                                                    self.bias)  # (peg.11)
        C = lik._hess_factor(f.reshape(S * M, K), yy)  # H_i = C_i C_i^T, (S M, K, R)
        e = None
        for q in range(C.shape[2]):  # one backprop per factor column (peg.9)
            seed = C[:, :, q].reshape(S, M, K)
            dq = _layers.backward_batched(xp, params, acts, seed, self.activation)
            e = [d * d for d in dq] if e is None else [a + d * d for a, d in zip(e, dq)]
        return g, _layers.sum_sq_blocks_batched(xp, acts, e, self.bias)  # (peg.10)

    def kfac_factors(self, theta, X, y):
        """[KFACLayer(a=a_{l-1} (M, n_{l-1}), g=g_l (M, n_l))] for l = 1..L. (peg.12)

        Per example i: dl_i/dW_l = outer(a[i], g[i]) and dl_i/db_l = g[i], with the labels y as
        given (pass labels sampled from the model for the MC Fisher; nothing random happens here).
        K-FAC forms A_l = a^T a / M and S_l = g^T g / M itself.
        """
        xp, theta, X, y = self._inputs(theta, X, y)
        acts, deltas = self._residual_pass(xp, theta, X, y)
        return [KFACLayer(a, d) for a, d in zip(acts, deltas)]  # (peg.12)


def _check_sizes(sizes, likelihood_name):
    """sizes = [n_in, hidden..., n_out] of positive ints, n_out matching the likelihood."""
    if not isinstance(sizes, (list, tuple)) or len(sizes) < 2:
        raise ValueError(f"sizes: expected a list [n_in, hidden..., n_out] of >= 2 ints, got {sizes!r}")
    for k, n in enumerate(sizes):
        check_int(n, f"sizes[{k}]", low=1)
    if likelihood_name == "bernoulli" and sizes[-1] != 1:
        raise ValueError(f"sizes: expected n_out == 1 for the bernoulli likelihood, got {sizes[-1]}")
    if likelihood_name == "categorical" and sizes[-1] < 2:
        raise ValueError(f"sizes: expected n_out >= 2 for the categorical likelihood, got {sizes[-1]}")
    return tuple(int(n) for n in sizes)

