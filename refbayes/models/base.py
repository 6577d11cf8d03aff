"""FlatModel: a dense network on one flat parameter vector theta, with every quantity methods consume.

Implements (peg.1)-(peg.12) and (peg.17)-(peg.20) of derivations/per_example_gradients.md; ``MLP``,
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

import autograd
import autograd.numpy as anp
import numpy as np

from refbayes._checks import (
    check_array,
    check_float,
    check_int,
    check_positive_vector,
    check_same_dtype,
)
from refbayes.backend import xp_of
from refbayes.models import _layers
from refbayes.models._numba_kernels import per_example_grads_numba

__all__ = ["FlatModel", "KFACLayer", "IMPLS", "INIT_SCHEMES"]

IMPLS = ("numba", "vectorized", "autograd")
INIT_SCHEMES = ("glorot", "pytorch")  # init_theta's distributions


class KFACLayer(NamedTuple):
    """K-FAC ingredients of one layer l, for the loss and labels given.

    (peg.12)  Each field is documented by its trailing comment.
    """
    a: object  # a_{l-1}, (M, n_{l-1}): the layer's per-example input (a_0 = X)
    g: object  # g_l = dl_i/dz_l, (M, n_l): per-example pre-activation gradient (= delta_l)


class FlatModel:
    """A dense network x -> f(x; theta) with a likelihood p(y | f); hyperparameters only.

    The base class of ``MLP``, ``LogisticRegression`` and ``SoftmaxRegression``; build those
    (they validate their arguments) rather than this one.  Instances are immutable.

    Valid inputs, checked by every method that takes them (ValueError otherwise, naming the
    argument): theta is a finite float64 or float32 (D,) array, and thetas a finite float
    (S, D) array with S >= 1; X is a finite float (M, n_in) array with M >= 1 in theta's dtype;
    y, where a method takes it, is not None and passes ``likelihood.check_targets`` (M rows,
    labels in the likelihood's set, or (M,) / (M, n_out) reals for the gaussian likelihood);
    and the arrays do not mix NumPy and CuPy.

    Parameters
    ----------
    sizes : sequence of int
        Layer widths [n_in, hidden..., n_out].
    activation : str
        Activation of the hidden layers ("relu", "tanh", "sigmoid"); the last layer is linear.
    likelihood : Gaussian, Bernoulli or Categorical
        Observation model p(y | f), from refbayes.models.likelihoods.
    bias : bool
        Whether each layer has a bias b_l.

    Attributes
    ----------
    sizes : tuple of int
        Layer widths [n_in, ..., n_out].
    activation : str
        Activation of the hidden layers.
    likelihood : Gaussian, Bernoulli or Categorical
        Observation model p(y | f).
    bias : bool
        Whether each layer has b_l.
    D : int
        Number of parameters, len(theta).
    """

    __slots__ = ("sizes", "activation", "likelihood", "bias", "D")
    # default per-example-gradient implementation on NumPy, chosen by measurement
    # (bench_per_example.PerExampleGrads: numba at 0.57-1.05x the vectorized time on nine MLP shapes)
    _numpy_impl = "numba"
    # hessian / hvp / _hessian_sum are autograd's (NumPy only); models with a closed form say so
    hessian_on_cupy = False

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
        """Number of layers L = len(sizes) - 1 (weight matrices W_1, ..., W_L)."""
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

    def _inputs_batched(self, thetas, X, y=None, need_y=True):
        """xp, validated X and y, and S for S parameter vectors thetas (S, D)."""
        check_array(thetas, "thetas", ndim=2)
        S = thetas.shape[0]
        if S < 1 or thetas.shape[1] != self.D:
            raise ValueError(f"thetas: expected shape (S >= 1, {self.D}), got {tuple(thetas.shape)}")
        xp, _, X, y = self._inputs(thetas[0], X, y, need_y)
        check_float(thetas, "thetas")
        check_same_dtype({"thetas": thetas, "X": X})
        return xp, X, y, S

    # ---- parameters ------------------------------------------------------------------------

    def unflatten(self, theta):
        """Split theta into per-layer weights and biases (views into theta, row-major W_l).

        Parameters
        ----------
        theta : array of shape (D,)
            Flat parameter vector (float64 or float32).

        Returns
        -------
        list of tuple
            [(W_l (n_{l-1}, n_l), b_l (n_l,) or None)] for l = 1..L.

        Raises
        ------
        ValueError
            If theta is not a finite float (D,) array.
        """
        xp_of(theta)
        self._check_theta(theta)
        return _layers.unflatten(theta, self.sizes, self.bias)

    def flatten(self, params):
        """Concatenate per-layer weights and biases into theta, the inverse of ``unflatten``.

        theta = concat(vec_row_major(W_1), b_1, ..., vec(W_L), b_L).

        Parameters
        ----------
        params : list of tuple
            L pairs (W_l (n_{l-1}, n_l), b_l (n_l,)), with b_l None when the model has no bias.

        Returns
        -------
        array of shape (D,)
            The flat parameter vector theta.

        Raises
        ------
        ValueError
            If params is not a list of L (W, b) pairs, a W_l or b_l is not a finite real array
            of its shape, b_l is None with a bias or an array without one, the arrays differ in
            dtype, or they mix NumPy and CuPy.
        """
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

    def init_theta(self, rng, dtype=np.float64, scheme: str = "glorot"):
        """Draw an initial theta (NumPy), layer by layer in theta order.

        ``scheme="glorot"`` (default): W_l ~ U(-s, s), s = sqrt(6 / (n_{l-1} + n_l)), biases zero
        (only the weights are drawn). ``"pytorch"``: the distribution of torch.nn.Linear's
        default initialization, W_l and b_l ~ U(-s, s) with s = 1 / sqrt(n_{l-1}), drawn W_l then
        b_l per layer (NumPy's draws, not torch's). Move the result to the GPU explicitly if
        needed.

        Parameters
        ----------
        rng : numpy.random.Generator
            Generator owned by the caller.
        dtype : numpy dtype, default numpy.float64
            Either float64 or float32.
        scheme : {"glorot", "pytorch"}, default "glorot"
            The initialization's distribution (INIT_SCHEMES).

        Returns
        -------
        numpy.ndarray of shape (D,)
            The initial theta, in ``dtype``.

        Raises
        ------
        ValueError
            If rng is not a numpy.random.Generator, dtype is neither float64 nor float32, or
            scheme is not one of INIT_SCHEMES.
        """
        if not isinstance(rng, np.random.Generator):
            raise ValueError(f"rng: expected a numpy.random.Generator, got {type(rng).__name__}")
        if np.dtype(dtype) not in (np.float32, np.float64):
            raise ValueError(f"dtype: expected float64 or float32, got {dtype}")
        if scheme not in INIT_SCHEMES:
            raise ValueError(f"scheme: expected one of {INIT_SCHEMES}, got {scheme!r}")
        params = []
        for n_in, n_out in zip(self.sizes[:-1], self.sizes[1:]):
            # torch.nn.Linear.reset_parameters: kaiming_uniform(a = sqrt 5) = U(+-1/sqrt n_in)
            s = math.sqrt(6.0 / (n_in + n_out)) if scheme == "glorot" else 1.0 / math.sqrt(n_in)
            W = rng.uniform(-s, s, size=(n_in, n_out))
            if not self.bias:
                b = None
            else:
                b = np.zeros(n_out) if scheme == "glorot" else rng.uniform(-s, s, size=n_out)
            params.append((W, b))
        return self.flatten(params).astype(dtype)

    # ---- forward ---------------------------------------------------------------------------

    def _forward(self, xp, theta, X):
        params = _layers.unflatten(theta, self.sizes, self.bias)
        acts, f = _layers.forward(xp, params, X, self.activation)
        return params, acts, f

    def forward(self, theta, X):
        """Compute the network output f = z_L.

        h_0 = X, h_l = act(h_{l-1} W_l + b_l), last layer linear.  (peg.1)

        Parameters
        ----------
        theta : array of shape (D,)
            Flat parameter vector (float64 or float32).
        X : array of shape (M, n_in)
            Inputs, M >= 1, same dtype as theta.

        Returns
        -------
        array of shape (M, n_out)
            The outputs f.

        Raises
        ------
        ValueError
            If theta or X is invalid (see FlatModel).
        """
        xp, theta, X, _ = self._inputs(theta, X, need_y=False)
        return self._forward(xp, theta, X)[2]

    def forward_batched(self, thetas, X):
        """Compute the network outputs at S parameter vectors in one batched pass.

        F[s] = ``forward(thetas[s], X)``: (peg.1) with one matmul per layer for all S vectors.

        Parameters
        ----------
        thetas : array of shape (S, D)
            S >= 1 parameter vectors (float64 or float32).
        X : array of shape (M, n_in)
            Inputs, M >= 1, same dtype as thetas.

        Returns
        -------
        array of shape (S, M, n_out)
            The outputs F.

        Raises
        ------
        ValueError
            If thetas or X is invalid (see FlatModel).
        """
        xp, X, _, _ = self._inputs_batched(thetas, X, need_y=False)
        params = _layers.unflatten_batched(thetas, self.sizes, self.bias)
        return _layers.forward_batched(xp, params, X, self.activation)[1]  # (peg.1)

    def predict(self, theta, X):
        """Compute the predictive mean E[y | x, theta] of the likelihood at the outputs f.

        Parameters
        ----------
        theta : array of shape (D,)
            Flat parameter vector (float64 or float32).
        X : array of shape (M, n_in)
            Inputs, M >= 1, same dtype as theta.

        Returns
        -------
        array of shape (M, n_out), (M,) or (M, C)
            Gaussian: f (M, n_out); bernoulli: p(y = 1) (M,); categorical: the class
            probabilities (M, C).

        Raises
        ------
        ValueError
            If theta or X is invalid (see FlatModel).
        """
        xp, theta, X, _ = self._inputs(theta, X, need_y=False)
        return self.likelihood._mean(xp, self._forward(xp, theta, X)[2])

    def per_example_losses(self, theta, X, y):
        """Compute the per-example negative log-likelihoods l_i = -log p(y_i | x_i, theta).

        (peg.13)-(peg.15)

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
        array of shape (M,)
            The losses l_i, constants included.

        Raises
        ------
        ValueError
            If theta, X or y is invalid (see FlatModel).
        """
        xp, theta, X, y = self._inputs(theta, X, y)
        return self.likelihood._losses(xp, self._forward(xp, theta, X)[2], y)

    def loss(self, theta, X, y):
        """Compute the summed loss sum_i l_i, l_i = -log p(y_i | x_i, theta).

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
        array of shape ()
            The loss, a 0-d array of theta's dtype on theta's backend.

        Raises
        ------
        ValueError
            If theta, X or y is invalid (see FlatModel).
        """
        return self.per_example_losses(theta, X, y).sum()

    # ---- gradients ---------------------------------------------------------------------------

    def _residual_pass(self, xp, theta, X, y):
        params, acts, f = self._forward(xp, theta, X)
        r = self.likelihood._grad_f(f, y)  # (peg.2)
        return acts, _layers.backward(params, acts, r, self.activation)

    def grad(self, theta, X, y):
        """Compute the summed gradient g = sum_i dl_i/dtheta.

        Backprop of r = dl/df, without forming per-example rows.  (peg.6)

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
            The gradient g.

        Raises
        ------
        ValueError
            If theta, X or y is invalid (see FlatModel).
        """
        xp, theta, X, y = self._inputs(theta, X, y)
        acts, deltas = self._residual_pass(xp, theta, X, y)
        return _layers.summed_blocks(xp, acts, deltas, self.bias)

    def per_example_grads(self, theta, X, y, impl=None):
        """Compute the per-example gradients G[i] = dl_i/dtheta, so G.sum(0) == grad.

        (peg.4)  All implementations agree to rounding.

        Parameters
        ----------
        theta : array of shape (D,)
            Flat parameter vector (float64 or float32).
        X : array of shape (M, n_in)
            Inputs, M >= 1, same dtype as theta.
        y : array of shape (M,) or (M, n_out)
            Targets: labels (M,) for classification; reals (M,) or (M, n_out) for the gaussian
            likelihood.
        impl : {"numba", "vectorized", "autograd"}, optional
            "numba" (jitted loops; NumPy only; the default on NumPy except for the one-layer
            linear models, where "vectorized" is faster), "vectorized" (batched outer products
            via einsum; NumPy or CuPy; the default on CuPy), "autograd" (a loop of
            autograd.grad over examples, the oracle; NumPy only).

        Returns
        -------
        array of shape (M, D)
            The per-example gradients G.

        Raises
        ------
        ValueError
            If theta, X or y is invalid (see FlatModel), or impl is not one of IMPLS, or
            is "numba" or "autograd" with CuPy arrays.
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
            return per_example_grads_numba(theta, X, self.sizes, self.bias, self.activation,
                                           lambda f: self.likelihood._grad_f(f, y))
        if impl == "autograd":
            return self._per_example_grads_autograd(theta, X, y)
        acts, deltas = self._residual_pass(xp, theta, X, y)
        return _layers.per_example_blocks(xp, acts, deltas, self.bias)

    def _autograd_loss(self, theta, X, y):
        params = _layers.unflatten(theta, self.sizes, self.bias)
        f = _layers.forward(anp, params, X, self.activation)[1]
        return anp.sum(self.likelihood._losses(anp, f, y))

    def _per_example_grads_autograd(self, theta, X, y):
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
        return self._seeded_rows(xp, params, acts, seeds)

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
        J = self._seeded_rows(xp, params, acts,
                              xp.broadcast_to(xp.eye(K, dtype=theta.dtype), (M, K, K)))  # (peg.7)
        HJ = xp.einsum("mkl,mld->mkd", self.likelihood._hess_f(f, y), J)
        M_K = M * K  # sum over (m, k) as one matrix product: BLAS, not einsum's loop
        return J.reshape(M_K, -1).T @ HJ.reshape(M_K, -1)  # (peg.8)

    def hessian(self, theta, X, y):
        """Form the dense Hessian of sum_i l_i, by autograd (NumPy only).

        (peg.17)

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
        H = autograd.hessian(self._autograd_loss)(theta, X, y)  # (peg.17)
        return np.asarray(H, dtype=theta.dtype)

    def hvp(self, theta, v, X, y):
        """Compute the Hessian-vector product H v of sum_i l_i, by autograd (NumPy only).

        H is the Hessian of ``hessian`` (peg.17); H v = d/dtheta (grad(theta)^T v) is formed by
        reverse-over-reverse differentiation without the D x D matrix (one gradient pass of
        the scalar grad^T v).

        Parameters
        ----------
        theta : array of shape (D,)
            Flat parameter vector (float64 or float32).
        v : array of shape (D,)
            The vector, same dtype as theta.
        X : array of shape (M, n_in)
            Inputs, M >= 1, same dtype as theta.
        y : array of shape (M,) or (M, n_out)
            Targets: labels (M,) for classification; reals (M,) or (M, n_out) for the gaussian
            likelihood.

        Returns
        -------
        numpy.ndarray of shape (D,)
            The product H v, in theta's dtype.

        Raises
        ------
        ValueError
            If theta, X or y is invalid (see FlatModel), v is not a finite (D,) array of
            theta's dtype, or the arrays are CuPy arrays.
        """
        xp, theta, X, y = self._inputs(theta, X, y)
        xp_of(theta, v)
        check_array(v, "v", shape=(self.D,))
        check_same_dtype({"theta": theta, "v": v})
        if xp is not np:
            raise ValueError("theta: the autograd Hessian-vector product needs NumPy arrays, got "
                             "CuPy arrays")
        Hv = autograd.hessian_tensor_product(self._autograd_loss)(theta, X, y, v)  # (peg.17)
        return np.asarray(Hv, dtype=theta.dtype)

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
        params, acts, f, yy, deltas, g = self._batched_gradient_pass(xp, thetas, X, y, S)
        if curvature is None:
            return g, None
        if curvature == "ef":
            return g, _layers.sum_sq_blocks_batched(xp, acts, [d * d for d in deltas],
                                                    self.bias)  # (peg.11)
        e = None
        for dq in self._ggn_column_passes(xp, params, acts, f, yy, S):
            e = [d * d for d in dq] if e is None else [a + d * d for a, d in zip(e, dq)]
        return g, _layers.sum_sq_blocks_batched(xp, acts, e, self.bias)  # (peg.10)

    def sample_losses_and_grads(self, thetas, X, y):
        """Compute the summed losses and gradients at S parameter vectors in one batched pass.

        loss[s] = sum_i l_i(theta_s) (peg.13)-(peg.15) and g[s] = sum_i dl_i/dtheta at theta_s
        (peg.6): equal to S calls of ``loss`` and ``grad``, from the one forward pass that the
        gradient's backward pass needs (what a Monte Carlo ELBO and its gradient take).

        Parameters
        ----------
        thetas : array of shape (S, D)
            S >= 1 parameter vectors (float64 or float32).
        X : array of shape (M, n_in)
            Inputs, M >= 1, same dtype as thetas.
        y : array of shape (M,) or (M, n_out)
            Targets: labels (M,) for classification; reals (M,) or (M, n_out) for the gaussian
            likelihood.

        Returns
        -------
        loss : array of shape (S,)
            The summed negative log-likelihoods.
        g : array of shape (S, D)
            The summed gradients.

        Raises
        ------
        ValueError
            If thetas, X or y is invalid (see FlatModel).
        """
        xp, X, y, S = self._inputs_batched(thetas, X, y)
        _, _, f, yy, _, g = self._batched_gradient_pass(xp, thetas, X, y, S)
        loss = self.likelihood._losses(xp, f, yy).reshape(S, -1).sum(axis=1)  # (peg.13)-(peg.15)
        return loss, g

    def per_example_grads_batched(self, thetas, X, y):
        """Compute the per-example gradients at S parameter vectors in one batched pass.

        G[s] = ``per_example_grads(thetas[s], X, y)`` (peg.4), to rounding: one forward and one
        backward matmul per layer for all S vectors (Monte Carlo samples) instead of a Python
        loop of S calls.

        Parameters
        ----------
        thetas : array of shape (S, D)
            S >= 1 parameter vectors (float64 or float32).
        X : array of shape (M, n_in)
            Inputs, M >= 1, same dtype as thetas.
        y : array of shape (M,) or (M, n_out)
            Targets: labels (M,) for classification; reals (M,) or (M, n_out) for the gaussian
            likelihood.

        Returns
        -------
        array of shape (S, M, D)
            The per-example gradients G.

        Raises
        ------
        ValueError
            If thetas, X or y is invalid (see FlatModel).
        """
        xp, X, y, S = self._inputs_batched(thetas, X, y)
        _, acts, _, _, deltas = self._batched_residual_pass(xp, thetas, X, y, S)
        M = X.shape[0]
        # rows (s, i) flattened to S M rows: acts[0] = X is shared by the S vectors
        rows = [xp.broadcast_to(a, (S,) + a.shape) if a.ndim == 2 else a for a in acts]
        G = _layers.per_example_blocks(xp, [a.reshape(S * M, a.shape[-1]) for a in rows],
                                       [d.reshape(S * M, d.shape[-1]) for d in deltas],
                                       self.bias)  # (peg.4)
        return G.reshape(S, M, self.D)

    def _batched_residual_pass(self, xp, thetas, X, y, S):
        """One forward and one backward pass at the S vectors (validated inputs): (params, the
        layer inputs, f (S M, K), the targets repeated S times, the deltas (S, M, n_l))."""
        params = _layers.unflatten_batched(thetas, self.sizes, self.bias)
        acts, f = _layers.forward_batched(xp, params, X, self.activation)
        M, K = X.shape[0], f.shape[-1]
        f = f.reshape(S * M, K)
        yy = xp.concatenate([y] * S) if S > 1 else y
        r = self.likelihood._grad_f(f, yy).reshape(S, M, K)  # (peg.2)
        deltas = _layers.backward_batched(xp, params, acts, r, self.activation)
        return params, acts, f, yy, deltas

    def _hessian_sum(self, thetas, X, y, diag=False):
        """sum_s of ``hessian(thetas[s], X, y)`` (or of its diagonal) over the rows of thetas
        (S, D): S Hessian calls here; models with a closed form for the sum override it."""
        xp = xp_of(thetas)
        H = [self.hessian(xp.ascontiguousarray(th), X, y) for th in thetas]  # (peg.17)
        return sum(xp.diagonal(h) for h in H) if diag else sum(H)

    def _batched_gradient_pass(self, xp, thetas, X, y, S):
        """:meth:`_batched_residual_pass` and g (S, D), the S summed gradients."""
        params, acts, f, yy, deltas = self._batched_residual_pass(xp, thetas, X, y, S)
        g = _layers.summed_blocks_batched(xp, acts, deltas, self.bias)  # (peg.6)
        return params, acts, f, yy, deltas, g

    def _ggn_column_passes(self, xp, params, acts, f, yy, S):
        """The backward passes of the columns of C_i (H_i = C_i C_i^T), one per column, at the S
        vectors: each [e_1, ..., e_L] with e_l (S, M, n_l).  (peg.9)"""
        C = self.likelihood._hess_factor(f, yy)  # (S M, K, R)
        K = f.shape[1]
        return (_layers.backward_batched(xp, params, acts, C[:, :, q].reshape(S, -1, K),
                                         self.activation)
                for q in range(C.shape[2]))  # (peg.9)

    def kfac_factors(self, theta, X, y):
        """Compute the K-FAC ingredients (layer inputs and pre-activation gradients) per layer.

        Per example i: dl_i/dW_l = outer(a[i], g[i]) and dl_i/db_l = g[i], with the labels y as
        given (pass labels sampled from the model for the MC Fisher; nothing random happens here).
        K-FAC forms A_l = a^T a / M and S_l = g^T g / M itself.  (peg.12)

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
        list of KFACLayer
            [KFACLayer(a=a_{l-1} (M, n_{l-1}), g=g_l (M, n_l))] for l = 1..L.

        Raises
        ------
        ValueError
            If theta, X or y is invalid (see FlatModel).
        """
        xp, theta, X, y = self._inputs(theta, X, y)
        acts, deltas = self._residual_pass(xp, theta, X, y)
        return [KFACLayer(a, d) for a, d in zip(acts, deltas)]  # (peg.12)

    def _kfac_seeds(self, theta, X, y, curvature):
        """(xp, layer inputs a_{l-1}, the per-example factors E_l (M, R, n_l) backpropagated to
        each pre-activation, M): R = 1 and E = dl_i/dz_l for "ef"; the columns of C_i (H_i = C_i
        C_i^T) for "ggn".  The one pass behind ``kfac_curvature`` and ``kfac_block_errors``."""
        if curvature not in ("ggn", "ef"):
            raise ValueError(f"curvature: expected 'ggn' or 'ef', got {curvature!r}")
        xp, theta, X, y = self._inputs(theta, X, y)
        params, acts, f = self._forward(xp, theta, X)
        if curvature == "ef":
            r = self.likelihood._grad_f(f, y)  # (peg.2)
            factors = [d[:, None, :] for d in _layers.backward(params, acts, r, self.activation)]
        else:
            C = self.likelihood._hess_factor(f, y)  # H_i = C_i C_i^T, (M, K, R)
            factors = _layers.backward(params, acts, xp.swapaxes(C, 1, 2), self.activation)
        return xp, acts, factors, X.shape[0]

    def kfac_curvature(self, theta, X, y, curvature="ggn"):
        """Compute the K-FAC factors (A_l, B_l) of the GGN or empirical Fisher of sum_i l_i.

        Per layer l, with a~_i = [a_{l-1,i}, 1] (the layer input, a 1 appended when the layer
        has a bias) and the layer's parameters [W_l; b_l^T] flattened row-major, the exact
        curvature block is sum_i (a~_i a~_i^T) kron B_i, with B_i = sum_r c_{l,i,r} c_{l,i,r}^T
        (GGN: c_{l,i,r} the column r of C_i, H_i = C_i C_i^T, backpropagated to the
        pre-activation z_l) or B_i = g_{l,i} g_{l,i}^T (EF: g_{l,i} = dl_i/dz_l).  K-FAC
        replaces the sum of products by the product of sums over the M rows:

            A_l = (1/M) sum_i a~_i a~_i^T,   B_l = sum_i B_i,   block ~ A_l kron B_l   (peg.18)

        (exact when M = 1, or when every B_i is the same matrix).

        Parameters
        ----------
        theta : array of shape (D,)
            Flat parameter vector (float64 or float32).
        X : array of shape (M, n_in)
            Inputs, M >= 1, same dtype as theta.
        y : array of shape (M,) or (M, n_out)
            Targets: labels (M,) for classification; reals (M,) or (M, n_out) for the gaussian
            likelihood.
        curvature : {"ggn", "ef"}, default "ggn"
            The curvature whose blocks are factored.

        Returns
        -------
        list of tuple
            [(A_l (n_{l-1} + bias, n_{l-1} + bias), B_l (n_l, n_l))] for l = 1..L.

        Raises
        ------
        ValueError
            If theta, X or y is invalid (see FlatModel), or curvature is not "ggn" or "ef".
        """
        xp, acts, deltas, M = self._kfac_seeds(theta, X, y, curvature)
        out = []
        for a, d in zip(acts, deltas):
            if self.bias:
                a = xp.concatenate([a, xp.ones((M, 1), dtype=a.dtype)], axis=1)
            A = (a.T @ a) / M  # (peg.18)
            d = d.reshape(-1, d.shape[-1])  # the (M R) seeds' rows, one BLAS product below
            B = d.T @ d  # (peg.18)
            out.append((A, B))
        return out

    def kfac_moments(self, thetas, X, y, curvature=None, y_curv=None, scale=None):
        """Compute gradients and the draw-averaged K-FAC factors at S parameter vectors at once.

        g[s] = sum_i dl_i/dtheta at theta_s with the labels y (peg.6). With a curvature, also,
        per layer, the mean over the S vectors of ``kfac_curvature``'s factors (peg.18):

            A_l = (1/S) sum_s (1/M) sum_i a~_i a~_i^T,   B_l = (1/S) sum_s sum_i B_i   (peg.21)

        at theta_s, with the labels y, or y_curv[s] for "ef" when given (labels sampled from the
        model at theta_s: the Monte Carlo Fisher of K-FAC). Equal to S calls of ``grad`` and
        ``kfac_curvature``, averaged; one forward pass and one batched matmul per layer for all S
        vectors, and the "ef" factors with the labels y reuse the gradient's backward pass.

        With ``scale`` c (S,), vector s's loss is c_s sum_i l_i (per-draw noise precisions of a
        unit-precision Gaussian likelihood, noise_gamma.2): g[s] is multiplied by c_s, vector
        s's terms of B_l by c_s^2 for "ef" (outer products of scaled gradients) and by c_s for
        "ggn" (c_s H_i); A_l does not change.

        Parameters
        ----------
        thetas : array of shape (S, D)
            S >= 1 parameter vectors (float64 or float32).
        X : array of shape (M, n_in)
            Inputs, M >= 1, same dtype as thetas.
        y : array of shape (M,) or (M, n_out)
            Targets of the gradient: labels (M,) for classification; reals (M,) or (M, n_out)
            for the gaussian likelihood.
        curvature : {None, "ef", "ggn"}, optional
            Which curvature's factors to return with the gradients.
        y_curv : array of shape (S, M) or (S, M, n_out), optional
            Per-vector targets of the "ef" factors (refused for any other curvature).
        scale : array of shape (S,), optional
            Per-vector loss weights c_s > 0 (finite, thetas' dtype); None is c_s = 1.

        Returns
        -------
        g : array of shape (S, D)
            The summed gradients (times c_s).
        factors : list of tuple or None
            [(A_l, B_l)] for l = 1..L as in (peg.21), or None when curvature is None.

        Raises
        ------
        ValueError
            If thetas, X or y is invalid (see FlatModel); if curvature is not None, "ef" or "ggn";
            if a row y_curv[s] does not fit the likelihood (see its ``check_targets``), y_curv is
            not (S, M, ...), or y_curv is given with a curvature other than "ef"; if scale is not a
            finite (S,) array > 0 in thetas' dtype.
        """
        if curvature not in (None, "ef", "ggn"):
            raise ValueError(f"curvature: expected None, 'ef' or 'ggn', got {curvature!r}")
        xp, X, y, S = self._inputs_batched(thetas, X, y)
        xp_of(thetas, y_curv, scale)  # one backend for the sampled labels and weights too
        M = X.shape[0]
        if scale is not None:
            check_positive_vector(scale, "scale", S, thetas.dtype, "vector")
        if y_curv is not None:
            if curvature != "ef":
                raise ValueError(f"y_curv: only curvature 'ef' takes its own targets, got "
                                 f"curvature {curvature!r}")
            check_array(y_curv, "y_curv", ndim=(2, 3))
            if tuple(y_curv.shape[:2]) != (S, M):
                raise ValueError(f"y_curv: expected shape ({S}, {M}, ...) (S, M), got "
                                 f"{tuple(y_curv.shape)}")
            # the S rows of labels checked as one (S M)-row batch, the error naming y_curv
            try:
                y_curv = self.likelihood.check_targets(
                    y_curv.reshape((S * M,) + y_curv.shape[2:]), S * M, self.sizes[-1],
                    thetas.dtype)
            except ValueError as err:
                raise ValueError(f"y_curv (the ({S}, {M}, ...) targets of the curvature, "
                                 f"checked as {S * M} rows): {err}") from err
        params, acts, f, yy, deltas, g = self._batched_gradient_pass(xp, thetas, X, y, S)
        if scale is not None:
            g = g * scale[:, None]  # grad of c_s sum_i l_i  (noise_gamma.2)
        if curvature is None:
            return g, None
        if curvature == "ef" and y_curv is None:
            passes = [deltas]  # the gradient's own backward pass
        elif curvature == "ef":
            r_curv = self.likelihood._grad_f(f, y_curv).reshape(S, M, -1)  # (peg.2)
            passes = [_layers.backward_batched(xp, params, acts, r_curv, self.activation)]
        else:
            passes = self._ggn_column_passes(xp, params, acts, f, yy, S)  # (peg.9)
        if scale is not None:  # "ef": c_s g_i (c_s g_i)^T; "ggn": C_i scaled by sqrt(c_s)
            root = (scale if curvature == "ef" else xp.sqrt(scale))[:, None, None]
            passes = [[d.reshape(S, M, -1) * root for d in dq] for dq in passes]  # (noise_gamma.2)
        B = None
        for dq in passes:
            Bq = [d.reshape(S * M, -1).T @ d.reshape(S * M, -1) for d in dq]
            B = Bq if B is None else [b + c for b, c in zip(B, Bq)]
        out = []
        for a, B_l in zip(acts, B):
            a = a.reshape(-1, a.shape[-1])  # (M, n) for the shared input X, else (S M, n)
            if self.bias:
                a = xp.concatenate([a, xp.ones((a.shape[0], 1), dtype=a.dtype)], axis=1)
            out.append(((a.T @ a) / a.shape[0], B_l / S))  # (peg.21)
        return g, out

    def kfac_block_errors(self, theta, X, y, curvature="ggn"):
        """Compute the relative Frobenius error of K-FAC's A_l kron B_l per layer.

        Per layer l, with a~_i, B_i, A_l and B_l as in ``kfac_curvature`` (peg.18) and
        P_i = a~_i a~_i^T, the exact block is Y_l = sum_i P_i kron B_i (the layer's diagonal
        block of ``ggn`` for "ggn"; of G^T G, G = ``per_example_grads``, for "ef"), K-FAC's is
        X_l = A_l kron B_l with exactly the factors ``kfac_curvature`` returns, and

            e_l = ||X_l - Y_l||_F / ||Y_l||_F.   (peg.20)

        Neither block (nor any D x D matrix) is formed: with <U kron V, U' kron V'>_F =
        <U, U'>_F <V, V'>_F and <u u^T, v v^T>_F = (u^T v)^2, everything is a sum over M x M
        Gram matrices of the rows a~_i and of the factors E_i (B_i = E_i^T E_i, R rows: the
        backpropagated columns of C_i for "ggn", R = 1 and E_i = g_i for "ef"):
        ||Y_l||^2 = sum_ij (a~_i^T a~_j)^2 ||E_i E_j^T||_F^2 and ||X_l|| = ||A_l|| ||B_l||.
        Cost per layer: O(M^2 (n_{l-1} + n_l R^2)) time (O(M n_l^2 (R + M)) where
        n_l <= R^2 and the B_i are formed as n_l x n_l matrices instead), M x M Grams plus
        chunks of at most 2^22 entries of memory.

        Parameters
        ----------
        theta : array of shape (D,)
            Flat parameter vector (float64 or float32).
        X : array of shape (M, n_in)
            Inputs, M >= 1, same dtype as theta.
        y : array of shape (M,) or (M, n_out)
            Targets: labels (M,) for classification; reals (M,) or (M, n_out) for the gaussian
            likelihood.
        curvature : {"ggn", "ef"}, default "ggn"
            The curvature whose blocks K-FAC approximates.

        Returns
        -------
        dict
            Three arrays of shape (L,), entry l - 1 for layer l, in theta's dtype on theta's
            backend: "rel_err" e_l (0 where both blocks are 0; inf where only the exact block
            is 0, which needs every example to have P_i = 0 or B_i = 0); "kfac_norm"
            ||A_l kron B_l||_F; "exact_norm" ||sum_i P_i kron B_i||_F.

        Raises
        ------
        ValueError
            If theta, X or y is invalid (see FlatModel), or curvature is not "ggn" or "ef".

        Notes
        -----
        The error is not computed as ||X||^2 - 2 <X, Y> + ||Y||^2: the three terms are each
        about ||Y||^2, so rounding leaves an absolute floor of about sqrt(eps) on e_l (1e-8 in
        float64, 3e-4 in float32) and a nonzero e_l where K-FAC is exact.  It uses instead

            X_l - Y_l = -sum_i (P_i - A_l) kron (B_i - B_l / M),

        so ||X_l - Y_l||^2 = <H Kp H, H Kb H>_F with H = I - 1 1^T / M, Kp[i, j] =
        <P_i - P_1, P_j - P_1>_F and Kb[i, j] = <B_i - B_1, B_j - B_1>_F (centring is shift
        invariant).  The shifted Grams are formed without subtracting large numbers: with
        s_i = a~_i + a~_1 and d_i = a~_i - a~_1, P_i - P_1 = (s_i d_i^T + d_i s_i^T) / 2 and
        Kp[i, j] = ((s_i^T s_j)(d_i^T d_j) + (s_i^T d_j)(d_i^T s_j)) / 2, and likewise for B_i
        with S_i = E_i + E_1, D_i = E_i - E_1 and Frobenius products of R x R blocks (or,
        where n_l <= R^2, from B_i - B_1 = (S_i^T D_i + D_i^T S_i) / 2 formed as a matrix).  The
        rounding error of e_l is then about sqrt(eps) M max_i ||P_i - A_l|| max_i
        ||B_i - B_l / M|| / ||Y_l||: relative to the spread of the factors over the batch, so
        e_l comes out exactly 0 where it is 0 for bitwise-equal inputs (M = 1; all a~_i equal;
        all B_i equal, e.g. the last layer of a gaussian network for "ggn") and keeps its
        leading digits when it is small.  The price is a few Gram products per factor instead
        of one (five on the R x R route, two on the n_l x n_l route).  The rows and the
        factors are scaled by powers of 2 (exactly) before the fourth powers are formed, so
        float32 neither overflows nor underflows there.
        """
        xp, acts, factors, M = self._kfac_seeds(theta, X, y, curvature)

        def grams(E):
            """For B_i = E_i^T E_i, E (M, R, n) scaled by 2^-k exactly: the raw Gram
            <B_i, B_j> = ||E_i E_j^T||^2, the shifted Gram <B_i - B_1, B_j - B_1>, and k."""
            k = xp.frexp(xp.abs(E).max())[1]
            E = xp.ldexp(E, -k)
            R, n = E.shape[1], E.shape[2]
            S, D = E + E[:1], E - E[:1]  # S_i = E_i + E_1, D_i = E_i - E_1 (0 where E_i = E_1)
            if R > 1 and n <= R * R and M * n * n <= 1 << 22:
                # n x n matrices B_i and B_i - B_1 = (S_i^T D_i + D_i^T S_i) / 2 are the
                # cheaper route here: O(M n^2 (R + M)) instead of O(M^2 R^2 n)
                Bf = (xp.swapaxes(E, 1, 2) @ E).reshape(M, n * n)
                SD = xp.swapaxes(S, 1, 2) @ D
                Btf = (0.5 * (SD + xp.swapaxes(SD, 1, 2))).reshape(M, n * n)  # (peg.20)
                return Bf @ Bf.T, Btf @ Btf.T, k
            Ef, Sf, Df = E.reshape(M * R, n), S.reshape(M * R, n), D.reshape(M * R, n)
            K = xp.empty((M, M), dtype=E.dtype)
            Kt = xp.empty((M, M), dtype=E.dtype)
            step = max(1, (1 << 22) // (M * R * R))  # rows i per chunk of (i, a, j, b) products
            for i0 in range(0, M, step):
                i1 = min(M, i0 + step)
                rows, shape = slice(i0 * R, i1 * R), (i1 - i0, R, M, R)
                G = (Ef[rows] @ Ef.T).reshape(shape)
                K[i0:i1] = (G * G).sum(axis=(1, 3))  # <B_i, B_j> = ||E_i E_j^T||^2  (peg.20)
                SS, DD = Sf[rows] @ Sf.T, Df[rows] @ Df.T
                SD, DS = Sf[rows] @ Df.T, Df[rows] @ Sf.T
                Kt[i0:i1] = 0.5 * (SS * DD + SD * DS).reshape(shape).sum(axis=(1, 3))  # (peg.20)
            return K, Kt, k

        def centred(K):
            return (K - K.mean(axis=0, keepdims=True) - K.mean(axis=1, keepdims=True)
                    + K.mean())  # H K H

        rel, kfac, exact = [], [], []
        for a, E in zip(acts, factors):
            if self.bias:
                a = xp.concatenate([a, xp.ones((M, 1), dtype=a.dtype)], axis=1)
            Kp, Kp_shift, ka = grams(a[:, None, :])  # <P_i, P_j> = (a~_i^T a~_j)^2
            Kb, Kb_shift, kb = grams(E)
            exact2 = (Kp * Kb).sum()  # ||sum_i P_i kron B_i||^2  (peg.20)
            kfac2 = Kp.sum() * Kb.sum() / (M * M)  # ||A_l||^2 ||B_l||^2  (peg.20)
            err2 = (centred(Kp_shift) * centred(Kb_shift)).sum()  # ||X_l - Y_l||^2  (peg.20)
            err, ex = xp.sqrt(xp.maximum(err2, 0.0)), xp.sqrt(exact2)
            rel.append(xp.where(ex > 0, err / xp.where(ex > 0, ex, 1.0),
                                xp.where(err > 0, xp.inf, 0.0)))  # (peg.20)
            scale = 2 * (ka + kb)  # undo the 2^-ka, 2^-kb scalings (P and B are quadratic)
            kfac.append(xp.ldexp(xp.sqrt(kfac2), scale))
            exact.append(xp.ldexp(ex, scale))
        dtype = theta.dtype
        return {"rel_err": xp.stack(rel).astype(dtype, copy=False),
                "kfac_norm": xp.stack(kfac).astype(dtype, copy=False),
                "exact_norm": xp.stack(exact).astype(dtype, copy=False)}

    def last_layer(self, theta, X):
        """Split the network into its features and its last layer: f(x) = head(phi(x)).

        phi(x) = a_{L-1} is the input of the last layer (x itself for a one-layer model) and
        the head is the one-layer model of W_L, b_L with this model's likelihood; its
        parameters are theta[D - head.D:], the last entries of the layout.  (peg.19)

        Parameters
        ----------
        theta : array of shape (D,)
            Flat parameter vector (float64 or float32).
        X : array of shape (M, n_in)
            Inputs, M >= 1, same dtype as theta.

        Returns
        -------
        head : FlatModel
            The last layer as a model, sizes [n_{L-1}, n_out], same likelihood and bias.
        phi : array of shape (M, n_{L-1})
            The features a_{L-1} at theta.

        Raises
        ------
        ValueError
            If theta or X is invalid (see FlatModel).
        """
        xp, theta, X, _ = self._inputs(theta, X, need_y=False)
        acts = self._forward(xp, theta, X)[1]
        head = FlatModel(self.sizes[-2:], self.activation, self.likelihood, self.bias)
        return head, acts[-1]  # (peg.19)


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

