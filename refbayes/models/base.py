"""FlatModel: a dense network on one flat parameter vector theta, with every quantity methods consume.

Implements (peg.1)-(peg.12) and (peg.13), (peg.15), (peg.16), (peg.21) of derivations/per_example_gradients.md; ``MLP``,
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

FlatModel's curvature methods (``jacobian``, ``jvp``, ``ggn``, ``ggn_vp``, ``hessian``, ``hvp``,
``grad_hvp``, ``diag_ggn``, ``diag_ef``, ``sample_moments``) are defined in
refbayes.models._curvature and its K-FAC methods (``kfac_*``, with ``KFACLayer``) in
refbayes.models._kfac, and bound by name in the class body below: they are FlatModel's methods,
documented there.
"""
from __future__ import annotations

import math

import autograd
import autograd.numpy as anp
import numpy as np

from refbayes._checks import check_array, check_float, check_int, check_same_dtype
from refbayes.backend import xp_of
from refbayes.models import _curvature, _kfac, _layers
from refbayes.models._kfac import KFACLayer
from refbayes.models._numba_kernels import per_example_grads_numba

__all__ = ["FlatModel", "KFACLayer", "IMPLS", "INIT_SCHEMES"]

IMPLS = ("numba", "vectorized", "autograd")
INIT_SCHEMES = ("glorot", "pytorch")  # init_theta's distributions


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
    # hessian / _hessian_sum are autograd's (NumPy only); models with a closed form say so (hvp is
    # the R-operator's closed form on both backends)
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

        (peg.17)-(peg.19)

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

    def per_example_grads(self, theta, X, y, impl=None, out=None):
        """Compute the per-example gradients G[i] = dl_i/dtheta, so G.sum(0) == grad.

        (peg.4)  All implementations agree to rounding. With ``out`` the rows are written into
        the caller's array (e.g. rows of a larger buffer such as SLANG's W^T), bit for bit the
        values that ``out=None`` returns, and ``out`` itself is returned.

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
        out : array of shape (M, D), optional
            Where to write G: an array of theta's backend (NumPy / CuPy) and dtype, shape
            exactly (M, D), C-contiguous and writeable (a row slice of a C-contiguous 2-d array
            qualifies). Default: a fresh array.

        Returns
        -------
        array of shape (M, D)
            The per-example gradients G (``out`` itself when given).

        Raises
        ------
        ValueError
            If theta, X or y is invalid (see FlatModel), or impl is not one of IMPLS, or
            is "numba" or "autograd" with CuPy arrays, or out is not such an array (no silent
            copy, no broadcast).
        """
        xp = xp_of(theta, X, y)
        impl = (self._numpy_impl if xp is np else "vectorized") if impl is None else impl
        if impl not in IMPLS:
            raise ValueError(f"impl: expected one of {IMPLS}, got {impl!r}")
        if impl != "vectorized" and xp is not np:
            raise ValueError(f"impl: {impl!r} runs on NumPy arrays only, got CuPy arrays; "
                             "use impl='vectorized' on the GPU")
        xp, theta, X, y = self._inputs(theta, X, y)
        if out is not None:
            _layers.check_out(out, xp, theta.dtype, (X.shape[0], self.D))
        if impl == "numba":
            return per_example_grads_numba(theta, X, self.sizes, self.bias, self.activation,
                                           lambda f: self.likelihood._grad_f(f, y), out)
        if impl == "autograd":
            return self._per_example_grads_autograd(theta, X, y, out)
        acts, deltas = self._residual_pass(xp, theta, X, y)
        return _layers.per_example_blocks(xp, acts, deltas, self.bias, out=out)

    def _autograd_loss(self, theta, X, y):
        params = _layers.unflatten(theta, self.sizes, self.bias)
        f = _layers.forward(anp, params, X, self.activation)[1]
        return anp.sum(self.likelihood._losses(anp, f, y))

    def _per_example_grads_autograd(self, theta, X, y, out=None):
        grad_fn = autograd.grad(self._autograd_loss)
        G = np.empty((X.shape[0], self.D), dtype=theta.dtype) if out is None else out
        for i in range(X.shape[0]):
            G[i] = grad_fn(theta, X[i:i + 1], y[i:i + 1])
        return G

    # ---- gradients at S parameter vectors ---------------------------------------------------

    def sample_losses_and_grads(self, thetas, X, y):
        """Compute the summed losses and gradients at S parameter vectors in one batched pass.

        loss[s] = sum_i l_i(theta_s) (peg.17)-(peg.19) and g[s] = sum_i dl_i/dtheta at theta_s
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
        loss = self.likelihood._losses(xp, f, yy).reshape(S, -1).sum(axis=1)  # (peg.17)-(peg.19)
        return loss, g

    def per_example_grads_batched(self, thetas, X, y, out=None):
        """Compute the per-example gradients at S parameter vectors in one batched pass.

        G[s] = ``per_example_grads(thetas[s], X, y)`` (peg.4), to rounding: one forward and one
        backward matmul per layer for all S vectors (Monte Carlo samples) instead of a Python
        loop of S calls. With ``out`` the rows are written into the caller's array, bit for bit
        the values that ``out=None`` returns, and ``out`` itself is returned.

        Parameters
        ----------
        thetas : array of shape (S, D)
            S >= 1 parameter vectors (float64 or float32).
        X : array of shape (M, n_in)
            Inputs, M >= 1, same dtype as thetas.
        y : array of shape (M,) or (M, n_out)
            Targets: labels (M,) for classification; reals (M,) or (M, n_out) for the gaussian
            likelihood.
        out : array of shape (S, M, D), optional
            Where to write G: an array of thetas' backend (NumPy / CuPy) and dtype, shape
            exactly (S, M, D), C-contiguous and writeable. Default: a fresh array.

        Returns
        -------
        array of shape (S, M, D)
            The per-example gradients G (``out`` itself when given).

        Raises
        ------
        ValueError
            If thetas, X or y is invalid (see FlatModel), or out is not such an array (no
            silent copy, no broadcast).
        """
        xp, X, y, S = self._inputs_batched(thetas, X, y)
        M = X.shape[0]
        if out is not None:
            _layers.check_out(out, xp, thetas.dtype, (S, M, self.D))
        _, acts, _, _, deltas = self._batched_residual_pass(xp, thetas, X, y, S)
        # rows (s, i) flattened to S M rows: acts[0] = X is shared by the S vectors
        rows = [xp.broadcast_to(a, (S,) + a.shape) if a.ndim == 2 else a for a in acts]
        G = _layers.per_example_blocks(xp, [a.reshape(S * M, a.shape[-1]) for a in rows],
                                       [d.reshape(S * M, d.shape[-1]) for d in deltas],
                                       self.bias,
                                       out=None if out is None else out.reshape(S * M, self.D))  # (peg.4)
        return G.reshape(S, M, self.D) if out is None else out

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

    def _batched_gradient_pass(self, xp, thetas, X, y, S):
        """:meth:`_batched_residual_pass` and g (S, D), the S summed gradients."""
        params, acts, f, yy, deltas = self._batched_residual_pass(xp, thetas, X, y, S)
        g = _layers.summed_blocks_batched(xp, acts, deltas, self.bias)  # (peg.6)
        return params, acts, f, yy, deltas, g

    # ---- curvature: methods defined in refbayes/models/_curvature.py -------------------------

    jacobian = _curvature.jacobian
    ggn = _curvature.ggn
    hessian = _curvature.hessian
    hvp = _curvature.hvp
    grad_hvp = _curvature.grad_hvp
    _hvp_autograd = _curvature._hvp_autograd
    jvp = _curvature.jvp
    ggn_vp = _curvature.ggn_vp
    diag_ggn = _curvature.diag_ggn
    diag_ef = _curvature.diag_ef
    sample_moments = _curvature.sample_moments
    _sample_moments_trusted = _curvature._sample_moments_trusted  # the VOGN step's checked path
    _hessian_sum = _curvature._hessian_sum

    # ---- K-FAC: methods defined in refbayes/models/_kfac.py ----------------------------------

    kfac_factors = _kfac.kfac_factors
    kfac_curvature = _kfac.kfac_curvature
    kfac_moments = _kfac.kfac_moments
    kfac_block_errors = _kfac.kfac_block_errors

    # ---- the last layer ----------------------------------------------------------------------

    def last_layer(self, theta, X):
        """Split the network into its features and its last layer: f(x) = head(phi(x)).

        phi(x) = a_{L-1} is the input of the last layer (x itself for a one-layer model) and
        the head is the one-layer model of W_L, b_L with this model's likelihood; its
        parameters are theta[D - head.D:], the last entries of the layout.  (peg.15)

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
        return head, acts[-1]  # (peg.15)


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

