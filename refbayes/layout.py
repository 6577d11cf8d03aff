"""Convert flat parameter vectors between refbayes' layout and those of PyTorch and Flax.

refbayes orders theta (D,) as, for each layer l = 1..L in order, W_l of shape (n_in, n_out)
row-major, then b_l (n_out,) when the model has biases (``model.bias``; for LogisticRegression
and SoftmaxRegression that is the intercept, stored as the one layer's bias). The other layouts
are the orders in which those frameworks flatten the same dense network:

``"torch"``
    ``torch.nn.utils.parameters_to_vector(net.parameters())`` for ``net = nn.Sequential`` of
    ``nn.Linear(n_in, n_out, bias=model.bias)`` layers (activations in between hold no
    parameters): per layer ``weight`` (n_out, n_in) row-major, then ``bias`` (n_out,).
``"flax"``
    ``jax.flatten_util.ravel_pytree(params)`` for a ``flax.linen`` MLP of ``nn.Dense(n_out,
    use_bias=model.bias)`` layers auto-named ``Dense_0``, ..., ``Dense_{L-1}`` (``params`` the
    ``variables["params"]`` dict, or ``variables`` itself: the extra level changes nothing).
    Pytree dict keys are visited in sorted order, so each layer contributes ``bias`` (n_out,)
    then ``kernel`` (n_in, n_out) row-major, and the layers come in the lexicographic order of
    their names: with 11 or more layers ``Dense_10`` precedes ``Dense_2``.

``permutation(model, layout)`` gives p with ``theta_refbayes = theta_layout[p]`` and, the other
way, ``theta_layout = theta_refbayes[numpy.argsort(p)]``. ``to_refbayes`` / ``from_refbayes``
apply it along chosen axes of any array (a (S, D) stack of gradients, a (D, S) matrix of draws, a
D x D precision), on NumPy or CuPy; ``to_layers`` / ``from_layers`` split theta into, and build it
from, the per-layer tensors in a layout's own shapes.
"""
from __future__ import annotations

import functools
import numbers

import numpy as np

from refbayes._checks import check_array
from refbayes.backend import xp_of
from refbayes.models import theta_layout, unflatten_theta
from refbayes.models.base import FlatModel

__all__ = ["LAYOUTS", "from_layers", "from_refbayes", "permutation", "to_layers", "to_refbayes"]

LAYOUTS = ("refbayes", "torch", "flax")


# ----------------------------------------------------------------------------- the layouts' tensors

def _check_model(model):
    if not isinstance(model, FlatModel):
        raise ValueError(f"model: expected a refbayes FlatModel (MLP, LogisticRegression, "
                         f"SoftmaxRegression, ...), got {type(model).__name__}")


def _check_layout(layout):
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")


@functools.cache
def _specs(sizes: tuple, bias: bool, layout: str) -> tuple:
    """The layout's tensors in its flattening order: (name, shape, l, kind, transposed).

    kind is "W" or "b" (which refbayes block of layer l the tensor holds), transposed says the
    tensor is W_l^T (torch's weight).
    """
    L = len(sizes) - 1
    specs = []
    if layout == "flax":
        # ravel_pytree visits dict keys sorted as strings: "Dense_10" < "Dense_2", "bias" < "kernel"
        for l in sorted(range(L), key=lambda l: f"Dense_{l}"):
            n_in, n_out = sizes[l], sizes[l + 1]
            if bias:
                specs.append((f"Dense_{l}/bias", (n_out,), l, "b", False))
            specs.append((f"Dense_{l}/kernel", (n_in, n_out), l, "W", False))
        return tuple(specs)
    for l in range(L):
        n_in, n_out = sizes[l], sizes[l + 1]
        if layout == "torch":
            # named by layer: nn.Sequential's own names ("0.weight", "2.weight", ...) depend on
            # where the (parameter-free) activations sit
            specs.append((f"weight_{l + 1}", (n_out, n_in), l, "W", True))
            if bias:
                specs.append((f"bias_{l + 1}", (n_out,), l, "b", False))
        else:
            specs.append((f"W_{l + 1}", (n_in, n_out), l, "W", False))
            if bias:
                specs.append((f"b_{l + 1}", (n_out,), l, "b", False))
    return tuple(specs)


def _tensors(theta, sizes, bias, layout):
    """The layout's tensors of theta (unchecked, any backend), in its flattening order."""
    params = unflatten_theta(theta, sizes, bias)
    out = []
    for _, _, l, kind, transposed in _specs(tuple(sizes), bool(bias), layout):
        W, b = params[l]
        out.append((W.T if transposed else W) if kind == "W" else b)
    return out


@functools.cache
def _perm(sizes: tuple, bias: bool, layout: str) -> np.ndarray:
    D = theta_layout(sizes, bias).D
    # q[j] = the refbayes position of entry j of the layout's vector (theta_layout = theta[q])
    q = np.concatenate([t.reshape(-1) for t in _tensors(np.arange(D), sizes, bias, layout)])
    p = np.empty(D, dtype=np.intp)
    p[q] = np.arange(D, dtype=np.intp)  # p = q^{-1}: theta = theta_layout[p]
    p.setflags(write=False)
    return p


# ----------------------------------------------------------------------------- public functions

def permutation(model, layout):
    """Return the permutation p that takes a layout's flat vector to refbayes order.

    ``theta_refbayes = theta_layout[p]``; the inverse map is
    ``theta_layout = theta_refbayes[numpy.argsort(p)]``.  For ``layout="refbayes"`` p is the
    identity.

    Parameters
    ----------
    model : FlatModel
        The refbayes model (MLP, LogisticRegression, SoftmaxRegression, ...) whose sizes and
        bias fix the layouts.
    layout : {"refbayes", "torch", "flax"}
        The order of the vector that p is applied to.

    Returns
    -------
    numpy.ndarray of shape (D,)
        The permutation, an integer (numpy.intp) array holding each of 0..D-1 once; a fresh
        copy the caller may modify.

    Raises
    ------
    ValueError
        If model is not a FlatModel or layout is not one of LAYOUTS.
    """
    _check_model(model)
    _check_layout(layout)
    return _perm(model.sizes, model.bias, layout).copy()


def _normalize_axes(a, axes, D):
    if not hasattr(a, "shape") or not hasattr(a, "ndim"):
        raise ValueError(f"a: expected a NumPy or CuPy array, got {type(a).__name__}")
    if isinstance(axes, numbers.Integral) and not isinstance(axes, bool):
        axes = (axes,)
    if not isinstance(axes, (tuple, list)) or len(axes) == 0:
        raise ValueError(f"axes: expected a non-empty tuple of ints, got {axes!r}")
    out = []
    for k, ax in enumerate(axes):
        if isinstance(ax, bool) or not isinstance(ax, numbers.Integral):
            raise ValueError(f"axes[{k}]: expected an int, got {ax!r} ({type(ax).__name__})")
        if not -a.ndim <= ax < a.ndim:
            raise ValueError(f"axes[{k}]: expected an axis in [-{a.ndim}, {a.ndim - 1}] for a of "
                             f"shape {tuple(a.shape)}, got {ax}")
        ax = int(ax) % a.ndim
        if ax in out:
            raise ValueError(f"axes: expected distinct axes, got {tuple(axes)} (axis {ax} twice) "
                             f"for a of shape {tuple(a.shape)}")
        if a.shape[ax] != D:
            raise ValueError(f"a: expected length D = {D} along axis {ax} (axes={tuple(axes)}), "
                             f"got shape {tuple(a.shape)}")
        out.append(ax)
    return out


def _permute(a, model, layout, axes, inverse):
    _check_model(model)
    _check_layout(layout)
    axes = _normalize_axes(a, axes, model.D)
    xp = xp_of(a)
    p = _perm(model.sizes, model.bias, layout)
    if inverse:
        p = np.argsort(p)
    p = xp.asarray(p)  # explicit host-to-device copy of the index vector for CuPy arrays
    for ax in axes:
        a = xp.take(a, p, axis=ax)
    return a


def to_refbayes(a, model, layout, axes=(-1,)):
    """Reorder the parameter axes of an array from a layout into refbayes order.

    Along each axis k in ``axes`` (length D), the result is ``a`` indexed by
    ``permutation(model, layout)``: for axes=(-1,), ``out[..., i] = a[..., p[i]]``.  Use
    axes=(-1,) for a (S, D) stack of gradients, (0,) for a (D, S) matrix of draws, (0, 1) for a
    D x D precision or covariance.  Values and dtype are untouched.

    Parameters
    ----------
    a : array
        NumPy or CuPy array whose ``axes`` have length D and are ordered as in ``layout``.
    model : FlatModel
        The refbayes model that fixes D and the layouts.
    layout : {"refbayes", "torch", "flax"}
        The order of the parameter axes of ``a``.
    axes : int or tuple of int, default (-1,)
        The parameter axes of ``a`` (negative counts from the end), distinct.

    Returns
    -------
    array
        A new array of a's shape, dtype and backend, with the parameter axes in refbayes order.

    Raises
    ------
    ValueError
        If model is not a FlatModel, layout is not one of LAYOUTS, a is not an array, axes is
        empty, holds a non-integer, an axis out of range or the same axis twice, or an axis of
        ``a`` in ``axes`` does not have length D.
    """
    return _permute(a, model, layout, axes, inverse=False)


def from_refbayes(a, model, layout, axes=(-1,)):
    """Reorder the parameter axes of an array from refbayes order into a layout.

    The inverse of ``to_refbayes``: along each axis in ``axes``, the result is ``a`` indexed
    by ``numpy.argsort(permutation(model, layout))``.

    Parameters
    ----------
    a : array
        NumPy or CuPy array whose ``axes`` have length D and are in refbayes order.
    model : FlatModel
        The refbayes model that fixes D and the layouts.
    layout : {"refbayes", "torch", "flax"}
        The order wanted for the parameter axes.
    axes : int or tuple of int, default (-1,)
        The parameter axes of ``a`` (negative counts from the end), distinct.

    Returns
    -------
    array
        A new array of a's shape, dtype and backend, with the parameter axes in ``layout``
        order.

    Raises
    ------
    ValueError
        If model is not a FlatModel, layout is not one of LAYOUTS, a is not an array, axes is
        empty, holds a non-integer, an axis out of range or the same axis twice, or an axis of
        ``a`` in ``axes`` does not have length D.
    """
    return _permute(a, model, layout, axes, inverse=True)


def to_layers(theta, model, layout="refbayes"):
    """Split theta into per-layer tensors in a layout's own shapes and flattening order.

    - ``"refbayes"``: [W_1 (n_0, n_1), b_1 (n_1,), W_2, b_2, ...];
    - ``"torch"``: [weight_1 (n_1, n_0), bias_1 (n_1,), weight_2, bias_2, ...], the order of
      ``net.parameters()``;
    - ``"flax"``: per layer [bias (n_l,), kernel (n_{l-1}, n_l)], layers in the sorted order of
      their names Dense_0, Dense_1, ... (Dense_10 before Dense_2), i.e. the order of
      ``jax.tree_util.tree_leaves(params)``.

    Without biases (``model.bias`` False) the bias entries are left out.  Concatenating the
    raveled (row-major) tensors gives the layout's flat vector.

    Parameters
    ----------
    theta : array of shape (D,)
        Flat parameter vector in refbayes order (float64 or float32, NumPy or CuPy).
    model : FlatModel
        The refbayes model that fixes the layer sizes and whether layers have biases.
    layout : {"refbayes", "torch", "flax"}, default "refbayes"
        The framework whose tensors are wanted.

    Returns
    -------
    list of array
        The tensors, theta's dtype and backend; torch weights are transposed copies
        (C-contiguous), the others are views into theta.

    Raises
    ------
    ValueError
        If model is not a FlatModel, layout is not one of LAYOUTS, or theta is not a finite
        float (D,) array.
    """
    _check_model(model)
    _check_layout(layout)
    xp = xp_of(theta)
    model.unflatten(theta)  # validates theta: finite float (D,)
    out = _tensors(theta, model.sizes, model.bias, layout)
    return [xp.ascontiguousarray(t) for t in out] if layout == "torch" else out


def from_layers(params, model, layout="refbayes"):
    """Build the refbayes theta from per-layer tensors given in a layout's shapes and order.

    The inverse of ``to_layers``: ``params`` lists the tensors exactly as ``to_layers``
    returns them for this layout (see there), each with its exact shape; nothing is
    broadcast or transposed implicitly.

    Parameters
    ----------
    params : list of array
        The layout's tensors, in its order: 2 L of them with biases, L without.
    model : FlatModel
        The refbayes model that fixes the layer sizes and whether layers have biases.
    layout : {"refbayes", "torch", "flax"}, default "refbayes"
        The framework the tensors come from.

    Returns
    -------
    array of shape (D,)
        The flat parameter vector theta in refbayes order, the tensors' dtype and backend.

    Raises
    ------
    ValueError
        If model is not a FlatModel, layout is not one of LAYOUTS, params is not a list of the
        expected number of arrays, a tensor does not have its expected shape, or the tensors
        are not finite real arrays of one dtype on one backend.
    """
    _check_model(model)
    _check_layout(layout)
    specs = _specs(model.sizes, model.bias, layout)
    if not isinstance(params, (list, tuple)) or len(params) != len(specs):
        n = len(params) if isinstance(params, (list, tuple)) else "?"
        want = [f"{s[0]} {s[1]}" for s in specs]
        raise ValueError(f"params: expected a list of {len(specs)} arrays for the {layout!r} layout "
                         f"({', '.join(want)}), got {type(params).__name__} of length {n}")
    pairs = [[None, None] for _ in range(model.n_layers)]
    for k, (t, spec) in enumerate(zip(params, specs)):
        name, shape, l, kind, transposed = spec
        check_array(t, f"params[{k}] ({layout} {name})", shape=shape)
        pairs[l][0 if kind == "W" else 1] = t.T if transposed else t
    return model.flatten([tuple(pair) for pair in pairs])
