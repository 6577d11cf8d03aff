"""The masked network of MC dropout (Gal and Ghahramani 2016): a FlatModel's forward pass,
per-example losses and summed gradient with a dropout mask on the input of every layer.

Implements (mc_dropout.1)-(mc_dropout.2) of derivations/mc_dropout.md on top of the layer
machinery of refbayes.models._layers (unflatten, activations, per-layer gradient blocks).
Symbols: layers k = 0, ..., L-1 with (W_k (n_k, n_{k+1}), b_k); a_0 = X (M, n_0); masks
z_k (M, n_k) in {0, 1}, one row per example (the mask of layer k multiplies that layer's
INPUT: z_0 drops input features, z_k for k >= 1 drops hidden units); s the scale, 1 / (1 - p)
for inverted dropout or 1 for Gal's original (non-inverted) form. Then

    a~_k = s * z_k * a_k,   h_k = a~_k W_k + b_k,   a_{k+1} = act(h_k) (k < L-1),   f = h_{L-1}.

The loss is SUMMED over the M rows, l_i = -log p(y_i | f_i) with the model's likelihood; any
N / M minibatch scaling is the caller's. Backprop carries the masks: with delta_k = dl/dh_k,
delta_{k-1} = ((delta_k W_k^T) * s * z_k) * act'(a_k), and the gradient blocks are
a~_k^T delta_k and 1^T delta_k, the usual ones with a~_k in place of a_k.

Every public function checks its arguments and raises ValueError unless: model is a FlatModel;
theta and X are valid for it (theta a finite float (D,) array, X a finite (M, n_0) array with
M >= 1 of theta's dtype, see FlatModel); y, where taken, fits the model's likelihood; masks is
a list of L arrays, masks[k] of shape (M, sizes[k]) holding only 0 and 1; scale is a real
number in [1, inf); and the arrays do not mix NumPy and CuPy.

A CNN (refbayes.models.conv) is masked the same way, layer by layer: the input of each Conv2d
(an (M, C, H, W) feature map, one mask entry per pixel and channel) and of each Dense is
multiplied by s z_j, and backprop multiplies the error below that layer by s z_j; pooling,
Flatten and activations pass the masks' effect through unchanged (conv.md, (conv.4)-(conv.15)).
"""
from __future__ import annotations

import math

from refbayes._checks import check_array, check_binary, check_in_range
from refbayes.backend import xp_of
from refbayes.models import _layers
from refbayes.models import conv as _conv
from refbayes.models.base import FlatModel
from refbayes.models.conv import CNN

__all__ = ["mask_shapes", "masked_forward", "masked_grad", "masked_output_and_grad",
           "masked_per_example_grads", "masked_per_example_losses"]


def _check_model(model):
    if not isinstance(model, (FlatModel, CNN)):
        raise ValueError(f"model: expected a refbayes.models model, got {type(model).__name__}")
    return model


def mask_shapes(model) -> list:
    """List the per-example shape of each dropout mask: the inputs of the layers with parameters.

    In theta order. An MLP: [(n_0,), ..., (n_{L-1},)]. A CNN: the (C, H, W) image entering each
    Conv2d (one mask entry per pixel and channel, as torch's ``nn.Dropout`` on a feature map)
    and the (n_in,) vector entering each Dense.  (mc_dropout.1)

    Parameters
    ----------
    model : FlatModel or CNN
        The network.

    Returns
    -------
    list of tuple of int
        One shape per layer with parameters; a mask for M rows has shape (M,) + shape.

    Raises
    ------
    ValueError
        If model is not a refbayes.models model.
    """
    if isinstance(_check_model(model), CNN):
        return [model.shapes[k] for k, layer in enumerate(model.layers)
                if isinstance(layer, (_conv.Conv2d, _conv.Dense))]
    return [(n,) for n in model.sizes[:-1]]


def check_masks(masks, model, M: int):
    """masks: a list of one array per layer with parameters, masks[k] of shape (M,) +
    mask_shapes(model)[k], holding only 0 and 1 (bool, integer or float dtype). Returns them
    unchanged."""
    shapes = [(M,) + s for s in mask_shapes(model)]
    if not isinstance(masks, (list, tuple)) or len(masks) != len(shapes):
        got = f"{type(masks).__name__} of length {len(masks)}" if isinstance(
            masks, (list, tuple)) else type(masks).__name__
        raise ValueError(f"masks: expected a list of {len(shapes)} arrays (one per layer input, "
                         f"shapes {shapes}), got {got}")
    for k, (z, shape) in enumerate(zip(masks, shapes)):
        check_array(z, f"masks[{k}]", shape=shape)
        check_binary(z, f"masks[{k}]")
    return masks


def check_scale(scale) -> float:
    """The inverted-dropout factor 1 / (1 - p) >= 1, or 1 for non-inverted dropout."""
    return check_in_range(scale, "scale", 1.0, math.inf, high_open=True)


def _inputs(model, theta, X, y, masks, scale, need_y=True):
    """xp, validated theta, X, y (canonical form), and the scaled masks s * z_k in theta's dtype."""
    _check_model(model)
    xp, theta, X, y = model._inputs(theta, X, y, need_y=need_y)
    check_masks(masks, model, X.shape[0])
    xp_of(theta, *masks)  # one backend
    s = check_scale(scale)
    return xp, theta, X, y, [z.astype(theta.dtype) * s for z in masks]


def _cnn_pass(xp, model, theta, X, sz):
    """(params, caches, f) of a CNN with the masks sz on its parameter layers' inputs."""
    params = _conv._split(theta, model._param_shapes)
    caches, f = _conv._forward(xp, model.layers, params, X, sz)  # (mc_dropout.1)
    return params, caches, f


def _cnn_blocks(xp, model, theta, X, y, sz, mode):
    """(f, the gradient blocks of ``mode``) of a masked CNN: one forward, one backward pass."""
    params, caches, f = _cnn_pass(xp, model, theta, X, sz)
    r = model.likelihood._grad_f(f, y)
    return f, _conv._backward_blocks(xp, model.layers, params, caches, r, mode, sz)  # (mc_dropout.2)


def _forward(xp, model, theta, X, sz):
    """(params, masked inputs [a~_0, ..., a~_{L-1}], hidden outputs [a_1, ..., a_{L-1}], f)."""
    params = _layers.unflatten(theta, model.sizes, model.bias)
    a, inputs, hidden = X, [], []
    for k, (W, b) in enumerate(params):
        a_t = a * sz[k]                             # a~_k = s z_k a_k  (mc_dropout.1)
        inputs.append(a_t)
        h = a_t @ W if b is None else a_t @ W + b   # (mc_dropout.1)
        if k == len(params) - 1:
            return params, inputs, hidden, h
        a = _layers.activate(xp, h, model.activation)
        hidden.append(a)


def _backward(params, hidden, sz, r, activation):
    """[delta_0, ..., delta_{L-1}] from delta_{L-1} = r: delta_{k-1} = ((delta_k W_k^T) s z_k)
    act'(a_k).  (mc_dropout.2)"""
    deltas = [r]
    for k in range(len(params) - 1, 0, -1):
        d_a = (deltas[-1] @ params[k][0].T) * sz[k]                            # (mc_dropout.2)
        deltas.append(d_a * _layers.act_prime(hidden[k - 1], activation))      # (mc_dropout.2)
    return deltas[::-1]


def masked_forward(model, theta, X, masks, scale):
    """Compute the network output with masks[k] on the input of layer k.

    a~_k = s z_k a_k, h_k = a~_k W_k + b_k.  (mc_dropout.1)

    Parameters
    ----------
    model : FlatModel or CNN
        The network (MLP, LogisticRegression, SoftmaxRegression, CNN).
    theta : array of shape (D,)
        Flat parameter vector (float64 or float32).
    X : array of shape (M, n_0)
        Inputs, M >= 1, same dtype as theta (a CNN: (M, C, H, W) or its rows).
    masks : list of array
        One binary mask per layer with parameters, masks[k] of shape (M,) + mask_shapes(model)[k]
        on that layer's input (an MLP: (M, sizes[k]); bool, integer or float dtype holding only
        0 and 1).
    scale : float
        Scale s >= 1: 1 / (1 - p) for inverted dropout, 1 for Gal's non-inverted form.

    Returns
    -------
    array of shape (M, n_out)
        The masked outputs f.

    Raises
    ------
    ValueError
        If model, theta, X, masks or scale is invalid (see refbayes.models.dropout).
    """
    xp, theta, X, _, sz = _inputs(model, theta, X, None, masks, scale, need_y=False)
    if isinstance(model, CNN):
        return _cnn_pass(xp, model, theta, X, sz)[2]
    return _forward(xp, model, theta, X, sz)[3]


def masked_per_example_losses(model, theta, X, y, masks, scale):
    """Compute the per-example losses l_i = -log p(y_i | f_i) at the masked outputs.

    (mc_dropout.1)

    Parameters
    ----------
    model : FlatModel or CNN
        The network (MLP, LogisticRegression, SoftmaxRegression, CNN).
    theta : array of shape (D,)
        Flat parameter vector (float64 or float32).
    X : array of shape (M, n_0)
        Inputs, M >= 1, same dtype as theta (a CNN: (M, C, H, W) or its rows).
    y : array of shape (M,) or (M, n_out)
        Targets, as the model's likelihood expects them.
    masks : list of array
        One binary mask per layer with parameters, masks[k] of shape (M,) + mask_shapes(model)[k]
        on that layer's input (an MLP: (M, sizes[k]); bool, integer or float dtype holding only
        0 and 1).
    scale : float
        Scale s >= 1: 1 / (1 - p) for inverted dropout, 1 for Gal's non-inverted form.

    Returns
    -------
    array of shape (M,)
        The losses l_i.

    Raises
    ------
    ValueError
        If model, theta, X, y, masks or scale is invalid (see refbayes.models.dropout).
    """
    xp, theta, X, y, sz = _inputs(model, theta, X, y, masks, scale)
    if isinstance(model, CNN):
        return model.likelihood._losses(xp, _cnn_pass(xp, model, theta, X, sz)[2], y)
    return model.likelihood._losses(xp, _forward(xp, model, theta, X, sz)[3], y)


def _residual_pass(xp, model, theta, X, y, sz):
    """(masked inputs, deltas, f): one forward and one backward pass from r = dl/df."""
    params, inputs, hidden, f = _forward(xp, model, theta, X, sz)
    r = model.likelihood._grad_f(f, y)
    return inputs, _backward(params, hidden, sz, r, model.activation), f


def masked_output_and_grad(model, theta, X, y, masks, scale):
    """Compute the masked network's output and summed gradient in one forward-backward pass.

    (mc_dropout.1)-(mc_dropout.2)

    Parameters
    ----------
    model : FlatModel or CNN
        The network (MLP, LogisticRegression, SoftmaxRegression, CNN).
    theta : array of shape (D,)
        Flat parameter vector (float64 or float32).
    X : array of shape (M, n_0)
        Inputs, M >= 1, same dtype as theta (a CNN: (M, C, H, W) or its rows).
    y : array of shape (M,) or (M, n_out)
        Targets, as the model's likelihood expects them.
    masks : list of array
        One binary mask per layer with parameters, masks[k] of shape (M,) + mask_shapes(model)[k]
        on that layer's input (an MLP: (M, sizes[k]); bool, integer or float dtype holding only
        0 and 1).
    scale : float
        Scale s >= 1: 1 / (1 - p) for inverted dropout, 1 for Gal's non-inverted form.

    Returns
    -------
    f : array of shape (M, n_out)
        The masked outputs.
    grad : array of shape (D,)
        The summed gradient sum_i dl_i/dtheta.

    Raises
    ------
    ValueError
        If model, theta, X, y, masks or scale is invalid (see refbayes.models.dropout).
    """
    xp, theta, X, y, sz = _inputs(model, theta, X, y, masks, scale)
    if isinstance(model, CNN):
        f, blocks = _cnn_blocks(xp, model, theta, X, y, sz, "sum")
        return f, xp.concatenate(blocks)
    inputs, deltas, f = _residual_pass(xp, model, theta, X, y, sz)
    return f, _layers.summed_blocks(xp, inputs, deltas, model.bias)  # (mc_dropout.2)


def masked_grad(model, theta, X, y, masks, scale):
    """Compute the summed gradient sum_i dl_i/dtheta of the masked network.

    One backprop pass.  (mc_dropout.2)

    Parameters
    ----------
    model : FlatModel or CNN
        The network (MLP, LogisticRegression, SoftmaxRegression, CNN).
    theta : array of shape (D,)
        Flat parameter vector (float64 or float32).
    X : array of shape (M, n_0)
        Inputs, M >= 1, same dtype as theta (a CNN: (M, C, H, W) or its rows).
    y : array of shape (M,) or (M, n_out)
        Targets, as the model's likelihood expects them.
    masks : list of array
        One binary mask per layer with parameters, masks[k] of shape (M,) + mask_shapes(model)[k]
        on that layer's input (an MLP: (M, sizes[k]); bool, integer or float dtype holding only
        0 and 1).
    scale : float
        Scale s >= 1: 1 / (1 - p) for inverted dropout, 1 for Gal's non-inverted form.

    Returns
    -------
    array of shape (D,)
        The summed gradient.

    Raises
    ------
    ValueError
        If model, theta, X, y, masks or scale is invalid (see refbayes.models.dropout).
    """
    return masked_output_and_grad(model, theta, X, y, masks, scale)[1]


def masked_per_example_grads(model, theta, X, y, masks, scale):
    """Compute the per-example gradients G[i] = dl_i/dtheta of the masked network.

    G.sum(0) == masked_grad.  (mc_dropout.2)

    Parameters
    ----------
    model : FlatModel or CNN
        The network (MLP, LogisticRegression, SoftmaxRegression, CNN).
    theta : array of shape (D,)
        Flat parameter vector (float64 or float32).
    X : array of shape (M, n_0)
        Inputs, M >= 1, same dtype as theta (a CNN: (M, C, H, W) or its rows).
    y : array of shape (M,) or (M, n_out)
        Targets, as the model's likelihood expects them.
    masks : list of array
        One binary mask per layer with parameters, masks[k] of shape (M,) + mask_shapes(model)[k]
        on that layer's input (an MLP: (M, sizes[k]); bool, integer or float dtype holding only
        0 and 1).
    scale : float
        Scale s >= 1: 1 / (1 - p) for inverted dropout, 1 for Gal's non-inverted form.

    Returns
    -------
    array of shape (M, D)
        The per-example gradients G.

    Raises
    ------
    ValueError
        If model, theta, X, y, masks or scale is invalid (see refbayes.models.dropout).
    """
    xp, theta, X, y, sz = _inputs(model, theta, X, y, masks, scale)
    if isinstance(model, CNN):
        return xp.concatenate(_cnn_blocks(xp, model, theta, X, y, sz, "rows")[1], axis=1)
    inputs, deltas, _ = _residual_pass(xp, model, theta, X, y, sz)
    return _layers.per_example_blocks(xp, inputs, deltas, model.bias)  # (mc_dropout.2)
