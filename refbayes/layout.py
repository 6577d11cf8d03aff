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

A CNN (refbayes.models.conv, NCHW, derivations/conv.md (conv.2)-(conv.3)) is flattened by those
frameworks as follows, and the layouts take it too:

``"torch"``
    ``nn.Conv2d`` ``weight`` (C_out, C_in, k_h, k_w) row-major, then ``bias``: refbayes' own conv
    block (conv.2), unchanged; ``nn.Linear`` as above; ``nn.Flatten`` of an NCHW map orders
    (c, h, w) as refbayes (conv.15). Tensors named ``weight_j`` / ``bias_j``, j counting the
    layers with parameters.
``"flax"``
    ``nn.Conv`` ``kernel`` (k_h, k_w, C_in, C_out) (= W.transpose(2, 3, 1, 0)) and ``bias``,
    modules auto-named ``Conv_0``, ... and ``Dense_0``, ... and visited in sorted name order
    (every ``Conv_*`` before every ``Dense_*``), bias before kernel. Flax images are NHWC, so a
    flatten orders (h, w, c): the kernel of the Dense that follows a Flatten has its rows in
    (h, w, c) order, refbayes' in (c, h, w); the conversion permutes them.

``permutation(model, layout)`` gives p with ``theta_refbayes = theta_layout[p]`` and, the other
way, ``theta_layout = theta_refbayes[numpy.argsort(p)]``. ``to_refbayes`` / ``from_refbayes``
apply it along chosen axes of any array (a (S, D) stack of gradients, a (D, S) matrix of draws, a
D x D precision), on NumPy or CuPy; ``to_layers`` / ``from_layers`` split theta into, and build it
from, the per-layer tensors in a layout's own shapes.

Stacked blocks. An axis of length k D that holds k theta-shaped blocks one after the other (BBB's
[mu; rho] (2 D,): its Adam moments ``adam.m``, ``adam.v`` and step ``delta``) is converted block by
block with ``blocks=k``: the permutation of each block is p, so the whole axis is permuted by
``concatenate([p, p + D, ..., p + (k - 1) D])`` (``permutation(model, layout, blocks=k)``), still a
permutation, inverted by ``argsort``. The caller declares k (the length alone does not say whether
2 D entries are two blocks of theta or, as k-tied's [mu; rho] of length D + P can be when P = D,
something else); an axis whose length is not k D is a ValueError.
"""
from __future__ import annotations

import functools
import numbers

import numpy as np

from refbayes._checks import check_array
from refbayes.backend import xp_of
from refbayes.models import CNN, Conv2d, Dense, Flatten, unflatten_theta
from refbayes.models.base import FlatModel

__all__ = ["LAYOUTS", "from_layers", "from_refbayes", "permutation", "to_layers", "to_refbayes"]

LAYOUTS = ("refbayes", "torch", "flax")


# ----------------------------------------------------------------------------- the layouts' tensors

def _check_model(model):
    if not isinstance(model, (FlatModel, CNN)):
        raise ValueError(f"model: expected a refbayes FlatModel (MLP, LogisticRegression, "
                         f"SoftmaxRegression, ...) or CNN, got {type(model).__name__}")


def _check_layout(layout):
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")


# how a layout's tensor is made from refbayes' block: ("id",) as is; ("T",) W^T (a torch
# Linear weight); ("conv_flax",) W.transpose(2, 3, 1, 0) (a flax Conv kernel); ("flat_flax", C, H,
# W) the rows of a Dense kernel that follows a Flatten, reordered from (c, h, w) to (h, w, c)
_ID, _T, _CONV_FLAX = ("id",), ("T",), ("conv_flax",)


def _to_layout(t, how):
    if how[0] == "T":
        return t.T
    if how[0] == "conv_flax":
        return t.transpose(2, 3, 1, 0)
    if how[0] == "flat_flax":
        C, H, W = how[1:]
        return t.reshape(C, H, W, -1).transpose(1, 2, 0, 3).reshape(C * H * W, -1)
    return t


def _from_layout(t, how):
    if how[0] == "T":
        return t.T
    if how[0] == "conv_flax":
        return t.transpose(3, 2, 0, 1)
    if how[0] == "flat_flax":
        C, H, W = how[1:]
        return t.reshape(H, W, C, -1).transpose(2, 0, 1, 3).reshape(C * H * W, -1)
    return t


@functools.cache
def _specs(sizes: tuple, bias: bool, layout: str) -> tuple:
    """The layout's tensors in its flattening order: (name, shape, l, kind, how).

    kind is "W" or "b" (which refbayes block of layer l the tensor holds), how says how the
    tensor is made from that block (``_to_layout``): as is, or W_l^T (torch's weight).
    """
    L = len(sizes) - 1
    specs = []
    if layout == "flax":
        # ravel_pytree visits dict keys sorted as strings: "Dense_10" < "Dense_2", "bias" < "kernel"
        for l in sorted(range(L), key=lambda l: f"Dense_{l}"):
            n_in, n_out = sizes[l], sizes[l + 1]
            if bias:
                specs.append((f"Dense_{l}/bias", (n_out,), l, "b", _ID))
            specs.append((f"Dense_{l}/kernel", (n_in, n_out), l, "W", _ID))
        return tuple(specs)
    for l in range(L):
        n_in, n_out = sizes[l], sizes[l + 1]
        if layout == "torch":
            # named by layer: nn.Sequential's own names ("0.weight", "2.weight", ...) depend on
            # where the (parameter-free) activations sit
            specs.append((f"weight_{l + 1}", (n_out, n_in), l, "W", _T))
            if bias:
                specs.append((f"bias_{l + 1}", (n_out,), l, "b", _ID))
        else:
            specs.append((f"W_{l + 1}", (n_in, n_out), l, "W", _ID))
            if bias:
                specs.append((f"b_{l + 1}", (n_out,), l, "b", _ID))
    return tuple(specs)


@functools.cache
def _cnn_specs(model, layout: str) -> tuple:
    """``_specs`` of a CNN: its Conv2d and Dense layers (j = 0, 1, ... in spec order)."""
    specs, j, n_conv, n_dense, flat = [], 0, 0, 0, None
    for k, layer in enumerate(model.layers):
        if isinstance(layer, Flatten):
            flat = model.shapes[k]  # the (C, H, W) it flattens
            continue
        if not isinstance(layer, (Conv2d, Dense)):
            continue
        conv = isinstance(layer, Conv2d)
        n_out = layer.c_out if conv else layer.n_out
        w = (layer.c_out, layer.c_in) + layer.kernel if conv else (layer.n_in, layer.n_out)
        if layout == "flax":
            name = f"Conv_{n_conv}" if conv else f"Dense_{n_dense}"
            how = _CONV_FLAX if conv else (_ID if flat is None else ("flat_flax",) + flat)
            shape = (layer.kernel + (layer.c_in, layer.c_out)) if conv else w
            specs += ([(f"{name}/bias", (n_out,), j, "b", _ID)] if layer.bias else []) + \
                     [(f"{name}/kernel", shape, j, "W", how)]
        else:
            torch = layout == "torch"
            how = _T if torch and not conv else _ID
            shape = (layer.n_out, layer.n_in) if torch and not conv else w
            specs += [(f"{'weight' if torch else 'W'}_{j + 1}", shape, j, "W", how)] + \
                     ([(f"{'bias' if torch else 'b'}_{j + 1}", (n_out,), j, "b", _ID)]
                      if layer.bias else [])
        n_conv, n_dense, j = n_conv + conv, n_dense + (not conv), j + 1
        if not conv:
            flat = None
    if layout == "flax":  # ravel_pytree: module names, then "bias" < "kernel", sorted as strings
        specs.sort(key=lambda s: (s[0].split("/")[0], s[0]))
    return tuple(specs)


def _model_specs(model, layout):
    if isinstance(model, CNN):
        return _cnn_specs(model, layout)
    return _specs(tuple(model.sizes), bool(model.bias), layout)


def _tensors(theta, model, layout):
    """The layout's tensors of theta (unchecked beyond the model's unflatten), in its order."""
    params = (model.unflatten(theta) if isinstance(model, CNN)
              else unflatten_theta(theta, model.sizes, model.bias))
    out = []
    for _, _, l, kind, how in _model_specs(model, layout):
        W, b = params[l]
        out.append(_to_layout(W, how) if kind == "W" else b)
    return out


def _check_blocks(blocks, n_axes: int) -> tuple:
    """blocks (an int k >= 1, or one per axis) as a tuple of n_axes ints."""
    items = blocks if isinstance(blocks, (tuple, list)) else (blocks,) * n_axes
    if len(items) != n_axes:
        raise ValueError(f"blocks: expected an int >= 1 or one per axis ({n_axes}), got "
                         f"{blocks!r}")
    for k in items:
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
            raise ValueError(f"blocks: expected an int >= 1 (the number of stacked theta-shaped "
                             f"blocks of an axis), got {blocks!r}")
    return tuple(int(k) for k in items)


@functools.cache
def _block_perm(model, layout: str, blocks: int) -> np.ndarray:
    """``_perm`` applied to each of ``blocks`` consecutive D-blocks: a permutation of blocks D."""
    p = _perm(model, layout)
    if blocks == 1:
        return p
    out = np.concatenate([p + k * p.size for k in range(blocks)])
    out.setflags(write=False)
    return out


@functools.cache
def _perm(model, layout: str) -> np.ndarray:
    D = model.D
    # q[j] = the refbayes position of entry j of the layout's vector (theta_layout = theta[q]);
    # the positions travel as float64 (exact below 2**53) since a CNN's unflatten wants floats
    q = np.concatenate([t.reshape(-1) for t in _tensors(np.arange(D, dtype=np.float64), model,
                                                           layout)]).astype(np.intp)
    p = np.empty(D, dtype=np.intp)
    p[q] = np.arange(D, dtype=np.intp)  # p = q^{-1}: theta = theta_layout[p]
    p.setflags(write=False)
    return p


# ----------------------------------------------------------------------------- public functions

def permutation(model, layout, blocks=1):
    """Return the permutation p that takes a layout's flat vector to refbayes order.

    ``theta_refbayes = theta_layout[p]``; the inverse map is
    ``theta_layout = theta_refbayes[numpy.argsort(p)]``.  For ``layout="refbayes"`` p is the
    identity.  With ``blocks=k``, the permutation of a vector of k stacked theta-shaped blocks
    (BBB's [mu; rho], k = 2): p_1 of each block, ``concatenate([p_1 + j D for j < k])``.

    Parameters
    ----------
    model : FlatModel or CNN
        The refbayes model (MLP, LogisticRegression, SoftmaxRegression, ...) whose sizes and
        bias fix the layouts.
    layout : {"refbayes", "torch", "flax"}
        The order of the vector that p is applied to.
    blocks : int, default 1
        The number k >= 1 of theta-shaped blocks stacked in the vector.

    Returns
    -------
    numpy.ndarray of shape (k D,)
        The permutation, an integer (numpy.intp) array holding each of 0..k D - 1 once; a fresh
        copy the caller may modify.

    Raises
    ------
    ValueError
        If model is not a FlatModel or CNN, layout is not one of LAYOUTS, or blocks is not an
        int >= 1.
    """
    _check_model(model)
    _check_layout(layout)
    if isinstance(blocks, (tuple, list)):
        raise ValueError(f"blocks: expected an int >= 1 (the number of stacked theta-shaped "
                         f"blocks of the vector), got {blocks!r}")
    (blocks,) = _check_blocks(blocks, 1)
    return _block_perm(model, layout, blocks).copy()


def _normalize_axes(a, axes, D, blocks=1):
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
        out.append(ax)
    blocks = _check_blocks(blocks, len(out))
    for k, (ax, b) in enumerate(zip(out, blocks)):
        if a.shape[ax] != b * D:
            want = f"D = {D}" if b == 1 else f"blocks[{k}] * D = {b} * {D} = {b * D}"
            raise ValueError(f"a: expected length {want} along axis {ax} (axes={tuple(axes)}), "
                             f"got shape {tuple(a.shape)}")
    return list(zip(out, blocks))


def _permute(a, model, layout, axes, inverse, blocks=1):
    _check_model(model)
    _check_layout(layout)
    axes = _normalize_axes(a, axes, model.D, blocks)
    xp = xp_of(a)
    for ax, b in axes:
        p = _block_perm(model, layout, b)
        if inverse:
            p = np.argsort(p)
        p = xp.asarray(p)  # explicit host-to-device copy of the index vector for CuPy arrays
        a = xp.take(a, p, axis=ax)
    return a


def to_refbayes(a, model, layout, axes=(-1,), blocks=1):
    """Reorder the parameter axes of an array from a layout into refbayes order.

    Along each axis k in ``axes`` (length D), the result is ``a`` indexed by
    ``permutation(model, layout)``: for axes=(-1,), ``out[..., i] = a[..., p[i]]``.  Use
    axes=(-1,) for a (S, D) stack of gradients, (0,) for a (D, S) matrix of draws, (0, 1) for a
    D x D precision or covariance, and blocks=2 for BBB's [mu; rho] (2 D,) quantities (each
    D-block permuted by p).  Values and dtype are untouched.

    Parameters
    ----------
    a : array
        NumPy or CuPy array whose ``axes`` have length D and are ordered as in ``layout``.
    model : FlatModel or CNN
        The refbayes model that fixes D and the layouts.
    layout : {"refbayes", "torch", "flax"}
        The order of the parameter axes of ``a``.
    axes : int or tuple of int, default (-1,)
        The parameter axes of ``a`` (negative counts from the end), distinct.
    blocks : int or tuple of int, default 1
        The number k >= 1 of theta-shaped blocks stacked along each parameter axis (one for
        all, or one per axis): an axis of length k D is converted block by block (BBB's
        [mu; rho] quantities: 2).

    Returns
    -------
    array
        A new array of a's shape, dtype and backend, with the parameter axes in refbayes order.

    Raises
    ------
    ValueError
        If model is not a FlatModel or CNN, layout is not one of LAYOUTS, a is not an array,
        axes is empty, holds a non-integer, an axis out of range or the same axis twice, blocks
        is not an int >= 1 (or one per axis), or an axis of ``a`` in ``axes`` does not have
        length blocks * D.
    """
    return _permute(a, model, layout, axes, inverse=False, blocks=blocks)


def from_refbayes(a, model, layout, axes=(-1,), blocks=1):
    """Reorder the parameter axes of an array from refbayes order into a layout.

    The inverse of ``to_refbayes``: along each axis in ``axes``, the result is ``a`` indexed
    by ``numpy.argsort(permutation(model, layout))``.

    Parameters
    ----------
    a : array
        NumPy or CuPy array whose ``axes`` have length D and are in refbayes order.
    model : FlatModel or CNN
        The refbayes model that fixes D and the layouts.
    layout : {"refbayes", "torch", "flax"}
        The order wanted for the parameter axes.
    axes : int or tuple of int, default (-1,)
        The parameter axes of ``a`` (negative counts from the end), distinct.
    blocks : int or tuple of int, default 1
        The number k >= 1 of theta-shaped blocks stacked along each parameter axis (one for
        all, or one per axis): an axis of length k D is converted block by block (BBB's
        [mu; rho] quantities: 2).

    Returns
    -------
    array
        A new array of a's shape, dtype and backend, with the parameter axes in ``layout``
        order.

    Raises
    ------
    ValueError
        If model is not a FlatModel or CNN, layout is not one of LAYOUTS, a is not an array,
        axes is empty, holds a non-integer, an axis out of range or the same axis twice, blocks
        is not an int >= 1 (or one per axis), or an axis of ``a`` in ``axes`` does not have
        length blocks * D.
    """
    return _permute(a, model, layout, axes, inverse=True, blocks=blocks)


def to_layers(theta, model, layout="refbayes"):
    """Split theta into per-layer tensors in a layout's own shapes and flattening order.

    - ``"refbayes"``: [W_1 (n_0, n_1), b_1 (n_1,), W_2, b_2, ...];
    - ``"torch"``: [weight_1 (n_1, n_0), bias_1 (n_1,), weight_2, bias_2, ...], the order of
      ``net.parameters()``;
    - ``"flax"``: per layer [bias (n_l,), kernel (n_{l-1}, n_l)], layers in the sorted order of
      their names Dense_0, Dense_1, ... (Dense_10 before Dense_2), i.e. the order of
      ``jax.tree_util.tree_leaves(params)``.

    A CNN: the same per layer with parameters (a Conv2d's weight (C_out, C_in, k_h, k_w) in
    "refbayes" and "torch", its kernel (k_h, k_w, C_in, C_out) in "flax", modules Conv_0, ...
    before Dense_0, ...; see the module docstring).

    Without biases (``model.bias`` False) the bias entries are left out.  Concatenating the
    raveled (row-major) tensors gives the layout's flat vector.

    Parameters
    ----------
    theta : array of shape (D,)
        Flat parameter vector in refbayes order (float64 or float32, NumPy or CuPy).
    model : FlatModel or CNN
        The refbayes model that fixes the layer sizes and whether layers have biases.
    layout : {"refbayes", "torch", "flax"}, default "refbayes"
        The framework whose tensors are wanted.

    Returns
    -------
    list of array
        The tensors, theta's dtype and backend: in the "refbayes" layout views into theta; in
        the others C-contiguous arrays (copies where the layout reorders a block: torch's Linear
        weights, flax's Conv kernels and the Dense kernel after a Flatten).

    Raises
    ------
    ValueError
        If model is not a FlatModel or CNN, layout is not one of LAYOUTS, or theta is not a finite
        float (D,) array.
    """
    _check_model(model)
    _check_layout(layout)
    xp = xp_of(theta)
    model.unflatten(theta)  # validates theta: finite float (D,)
    out = _tensors(theta, model, layout)
    return [xp.ascontiguousarray(t) for t in out] if layout != "refbayes" else out


def from_layers(params, model, layout="refbayes"):
    """Build the refbayes theta from per-layer tensors given in a layout's shapes and order.

    The inverse of ``to_layers``: ``params`` lists the tensors exactly as ``to_layers``
    returns them for this layout (see there), each with its exact shape; nothing is
    broadcast or transposed implicitly.

    Parameters
    ----------
    params : list of array
        The layout's tensors, in its order: 2 L of them with biases, L without.
    model : FlatModel or CNN
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
        If model is not a FlatModel or CNN, layout is not one of LAYOUTS, params is not a list of the
        expected number of arrays, a tensor does not have its expected shape, or the tensors
        are not finite real arrays of one dtype on one backend.
    """
    _check_model(model)
    _check_layout(layout)
    specs = _model_specs(model, layout)
    if not isinstance(params, (list, tuple)) or len(params) != len(specs):
        n = len(params) if isinstance(params, (list, tuple)) else "?"
        want = [f"{s[0]} {s[1]}" for s in specs]
        raise ValueError(f"params: expected a list of {len(specs)} arrays for the {layout!r} layout "
                         f"({', '.join(want)}), got {type(params).__name__} of length {n}")
    pairs = [[None, None] for _ in range(1 + max(s[2] for s in specs))]
    for k, (t, spec) in enumerate(zip(params, specs)):
        name, shape, l, kind, how = spec
        check_array(t, f"params[{k}] ({layout} {name})", shape=shape)
        pairs[l][0 if kind == "W" else 1] = _from_layout(t, how) if kind == "W" else t
    return model.flatten([tuple(pair) for pair in pairs])
