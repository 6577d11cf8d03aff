"""Convolutional networks on a flat theta: Conv2d, MaxPool2d, AvgPool2d, Flatten, Dense, Activation.

Implements derivations/conv.md (conv.1)-(conv.32) (issue 34, first to third slices) and
(conv.34)-(conv.36) (issue 37, the closed-form Hessian-vector product): a
sequential network built from layer records, with the forward pass, per-example losses, the summed gradient, the
per-example gradients and the diagonal empirical Fisher of the FlatModel contract
(refbayes.models.base). Dense layers and activations are (peg.1)-(peg.5) and (peg.11) of
derivations/per_example_gradients.md.

Symbols and shapes: theta (D,); images NCHW, X (M, C, H, W) or its rows X (M, C H W) (each row an
image flattened row-major in (c, h, w), the 2-D form the methods pass); f (M, K) the outputs; y
(M,) labels or (M,) / (M, K) reals, as for FlatModel. theta: the parameter layers' blocks in spec
order; a Conv2d block is its weight (C_out, C_in, k_h, k_w) row-major (torch's ``nn.Conv2d.weight``
as it is) then its bias (C_out,) (conv.2); a Dense block is W (n_in, n_out) row-major (torch's
``nn.Linear.weight`` transposed, as for the MLP) then b (n_out,) (conv.3).

Valid inputs, checked by every CNN method that takes them (ValueError otherwise, naming the
argument): theta is a finite float64 or float32 (D,) array; X is a finite (M, C, H, W) or
(M, C H W) array with M >= 1 in theta's dtype, (C, H, W) = ``input_shape``; y, where a method
takes it, passes ``likelihood.check_targets`` (M rows, labels in range); the arrays do not mix
NumPy and CuPy. Layer records validate their arguments at construction, and ``CNN`` checks that
the spec chains from ``input_shape`` to a (K,) output (conv.1).

Second slice (conv.16)-(conv.23): ``jacobian``, ``ggn``, ``diag_ggn`` (exact, by the columns
of the output Hessian's factor), ``jvp`` and ``ggn_vp`` (the R-operator's forward pass through
conv and pooling layers) in closed form; ``hessian`` by autograd of the same forward pass (NumPy
only); ``forward_batched``, ``sample_losses_and_grads``, ``per_example_grads_batched`` and
``sample_moments`` as a loop over the S parameter vectors of the single-theta passes.

Issue 37 (conv.34)-(conv.36): ``hvp`` and ``grad_hvp`` in closed form on NumPy or CuPy, the
R-operator's backward pass (R{delta} through conv, dense, activations with their act'' terms,
pooling with the max-pool winners fixed, flatten) beside the gradient's; autograd's product
stays as ``_hvp_autograd``, their test oracle.

Third slice (conv.24)-(conv.32): K-FAC. ``kfac_factors``, ``kfac_curvature``, ``kfac_moments``
and ``kfac_block_errors`` with FlatModel's signatures plus ``approx`` ("expand", the default, or
"reduce", Eschenhagen et al. 2023) for conv layers; dense layers are the MLP's (peg.13) either
way. The factors (A_l, B_l) are those of the matrix W~_l of ``kfac_layout`` (for a conv layer
[Wm^T; b^T], a permutation of theta's block; for a dense layer theta's block itself).

``last_layer`` splits off a final Dense (peg.15); MC dropout's masked passes are
refbayes.models.dropout's. CNN is not a FlatModel
subclass: FlatModel's inherited methods read the MLP's ``sizes`` layout and would compute the
wrong thing on a CNN rather than fail.

``per_example_grads`` and ``per_example_grads_batched`` take ``out`` (FlatModel's contract: an
array of theta's module and dtype, shape (M, D) / (S, M, D), C-contiguous, filled and returned);
their rows path writes every layer's rows straight into its columns, and on NumPy runs over
chunks of examples that fit in cache (``_ROWS_CHUNK_BYTES``; derivations/conv_experiments.md).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import autograd
import autograd.numpy as anp
import numpy as np

from refbayes._checks import (
    check_array,
    check_float,
    check_int,
    check_same_dtype,
)
from refbayes.backend import xp_of
from refbayes.models import _conv_layers as cl
from refbayes.models import _curvature
from refbayes.models._layers import ACTIVATIONS, act_prime, act_second, activate, check_out
from refbayes.models._kfac import check_moment_extras
from refbayes.models.base import INIT_SCHEMES, FlatModel, KFACLayer
from refbayes.models.likelihoods import LIKELIHOODS, make_likelihood

__all__ = ["Conv2d", "MaxPool2d", "AvgPool2d", "Flatten", "Dense", "Activation", "CNN",
           "CNN_IMPLS", "KFAC_APPROX", "tiny_cnn", "lenet5"]

_ROWS_CHUNK_BYTES = 8 * 2 ** 20  # the rows path's working set per chunk on NumPy (CNN._rows_chunk)
CNN_IMPLS = ("vectorized", "autograd")  # per_example_grads' implementations (FlatModel's names)


def _pair(value, name: str, low: int):
    """An int or a pair of ints, each >= low, as a pair (height, width)."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = (value, value)
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ValueError(f"{name}: expected an integer >= {low} or a pair of them, got {value!r}")
    return tuple(check_int(v, name, low=low) for v in value)


@dataclass(frozen=True)
class Conv2d:
    """A 2-d convolution layer (cross-correlation, torch's ``nn.Conv2d``) on NCHW images.

    Z_i = Wm U_i + b 1^T on the unfolded, zero-padded input (conv.4)-(conv.5).

    Parameters
    ----------
    c_in : int
        Input channels C_in >= 1.
    c_out : int
        Output channels C_out >= 1.
    kernel : int or tuple of int
        Kernel size k (square) or (k_h, k_w), each >= 1.
    stride : int or tuple of int, default 1
        Stride s or (s_h, s_w), each >= 1.
    padding : int or tuple of int, default 0
        Zero padding p or (p_h, p_w) on each side, each >= 0.
    bias : bool, default True
        Whether the layer has a bias b (C_out,).

    Raises
    ------
    ValueError
        If an argument is not an integer (pair) in its range, or bias is not a bool.
    """

    c_in: int
    c_out: int
    kernel: tuple
    stride: tuple = 1
    padding: tuple = 0
    bias: bool = True

    def __post_init__(self):
        object.__setattr__(self, "c_in", check_int(self.c_in, "c_in", low=1))
        object.__setattr__(self, "c_out", check_int(self.c_out, "c_out", low=1))
        object.__setattr__(self, "kernel", _pair(self.kernel, "kernel", 1))
        object.__setattr__(self, "stride", _pair(self.stride, "stride", 1))
        object.__setattr__(self, "padding", _pair(self.padding, "padding", 0))
        if not isinstance(self.bias, bool):
            raise ValueError(f"bias: expected a bool, got {self.bias!r}")


@dataclass(frozen=True)
class _Pool2d:
    """A k_h x k_w window with strides, no padding: what MaxPool2d and AvgPool2d share."""

    kernel: tuple
    stride: tuple = None

    def __post_init__(self):
        object.__setattr__(self, "kernel", _pair(self.kernel, "kernel", 1))
        stride = self.kernel if self.stride is None else _pair(self.stride, "stride", 1)
        object.__setattr__(self, "stride", stride)


@dataclass(frozen=True)
class MaxPool2d(_Pool2d):
    """Max pooling over k_h x k_w windows, no padding; ties go to the first window index.

    The window maximum, read at the first maximal entry in row-major window order (conv.11).

    Parameters
    ----------
    kernel : int or tuple of int
        Window size k or (k_h, k_w), each >= 1.
    stride : int or tuple of int, optional
        Stride s or (s_h, s_w), each >= 1; default the kernel (torch's default).

    Raises
    ------
    ValueError
        If kernel or stride is not an integer (pair) >= 1.
    """


@dataclass(frozen=True)
class AvgPool2d(_Pool2d):
    """Average pooling over k_h x k_w windows, no padding (torch's count_include_pad is moot).

    The mean of each window's k_h k_w entries (conv.13).

    Parameters
    ----------
    kernel : int or tuple of int
        Window size k or (k_h, k_w), each >= 1.
    stride : int or tuple of int, optional
        Stride s or (s_h, s_w), each >= 1; default the kernel (torch's default).

    Raises
    ------
    ValueError
        If kernel or stride is not an integer (pair) >= 1.
    """


@dataclass(frozen=True)
class Flatten:
    """Flatten (C, H, W) to C H W features row-major, torch's ``nn.Flatten()`` order.

    Entry c H W + h W + w holds pixel (c, h, w) (conv.15).
    """


@dataclass(frozen=True)
class Dense:
    """A dense layer h W + b, W (n_in, n_out) as the MLP's (peg.1).

    Parameters
    ----------
    n_in : int
        Input width >= 1.
    n_out : int
        Output width >= 1.
    bias : bool, default True
        Whether the layer has a bias b (n_out,).

    Raises
    ------
    ValueError
        If n_in or n_out is not an integer >= 1, or bias is not a bool.
    """

    n_in: int
    n_out: int
    bias: bool = True

    def __post_init__(self):
        object.__setattr__(self, "n_in", check_int(self.n_in, "n_in", low=1))
        object.__setattr__(self, "n_out", check_int(self.n_out, "n_out", low=1))
        if not isinstance(self.bias, bool):
            raise ValueError(f"bias: expected a bool, got {self.bias!r}")


@dataclass(frozen=True)
class Activation:
    """An elementwise activation: relu (relu'(0) = 0), tanh or sigmoid.

    As the MLP's hidden layers (peg.1), (peg.5).

    Parameters
    ----------
    name : {"relu", "tanh", "sigmoid"}
        The activation.

    Raises
    ------
    ValueError
        If name is not one of refbayes.models._layers.ACTIVATIONS.
    """

    name: str

    def __post_init__(self):
        if self.name not in ACTIVATIONS:
            raise ValueError(f"name: expected one of {ACTIVATIONS}, got {self.name!r}")


_LAYER_TYPES = (Conv2d, MaxPool2d, AvgPool2d, Flatten, Dense, Activation)
_PARAM_TYPES = (Conv2d, Dense)


# ---------------------------------------------------------------------------- shapes and layout

def _out_shape(layer, shape: tuple, where: str) -> tuple:
    """The output shape (per example) of ``layer`` on an input of ``shape``; ValueError if it
    does not chain. (conv.1)"""
    if isinstance(layer, Activation):
        return shape
    if isinstance(layer, Dense):
        if shape != (layer.n_in,):
            raise ValueError(f"{where}: Dense expects an input of shape ({layer.n_in},), the "
                             f"previous layer gives {shape} (a Flatten is needed after images)")
        return (layer.n_out,)
    if len(shape) != 3:
        raise ValueError(f"{where}: {type(layer).__name__} expects a (C, H, W) image input, "
                         f"the previous layer gives {shape}")
    if isinstance(layer, Flatten):
        return (shape[0] * shape[1] * shape[2],)
    C, H, W = shape
    if isinstance(layer, Conv2d):
        if C != layer.c_in:
            raise ValueError(f"{where}: Conv2d expects {layer.c_in} input channels, the previous "
                             f"layer gives {C} (shape {shape})")
        C, pad = layer.c_out, layer.padding
    else:
        pad = (0, 0)
    (kh, kw), (sh, sw) = layer.kernel, layer.stride
    Ho, Wo = cl.out_size(H, kh, sh, pad[0]), cl.out_size(W, kw, sw, pad[1])  # (conv.1)
    if Ho < 1 or Wo < 1:  # (conv.1): the kernel exceeds the padded input
        raise ValueError(f"{where}: kernel {layer.kernel} exceeds the padded input "
                         f"{(H + 2 * pad[0], W + 2 * pad[1])} (input {shape}, padding {pad}); "
                         f"expected kernel <= input + 2 padding, giving an output size >= 1")
    return (C, Ho, Wo)


def _chain_shapes(input_shape: tuple, layers: tuple) -> tuple:
    """(input_shape, shape after layer 1, ..., shape after the last layer). (conv.1)"""
    shapes = [input_shape]
    for k, layer in enumerate(layers):
        shapes.append(_out_shape(layer, shapes[-1], f"layers[{k}]"))
    return tuple(shapes)


def _param_shapes(layers: tuple) -> tuple:
    """One (weight shape, bias shape or None) per parameter layer, in theta order. (conv.2)-(conv.3)"""
    out = []
    for layer in layers:
        if isinstance(layer, Conv2d):
            out.append(((layer.c_out, layer.c_in) + layer.kernel,  # (conv.2): torch's layout
                        (layer.c_out,) if layer.bias else None))
        elif isinstance(layer, Dense):
            out.append(((layer.n_in, layer.n_out), (layer.n_out,) if layer.bias else None))  # (conv.3)
    return tuple(out)


def _split(theta, param_shapes):
    """[(W, b or None)] as views into theta, blocks in spec order. (conv.2)-(conv.3)"""
    params, pos = [], 0
    for w_shape, b_shape in param_shapes:
        n = math.prod(w_shape)
        W = theta[pos:pos + n].reshape(w_shape)  # (conv.2): row-major
        pos += n
        b = None
        if b_shape is not None:
            b = theta[pos:pos + b_shape[0]]
            pos += b_shape[0]
        params.append((W, b))
    return params


def _fans(w_shape):
    """torch's (fan_in, fan_out): (C_in k_h k_w, C_out k_h k_w) for a conv, (n_in, n_out) dense."""
    if len(w_shape) == 4:
        rf = w_shape[2] * w_shape[3]
        return w_shape[1] * rf, w_shape[0] * rf
    return w_shape


# ---------------------------------------------------------------------------- forward and backward

def _layer_forward(ns, layer, p, a, U=None):
    """(cache for the backward pass, output) of one layer on the batch a (a Conv2d's unfolded
    input U given, or formed here)."""
    if isinstance(layer, Conv2d):
        U, z = cl.conv_forward(ns, a, p[0], p[1], layer.stride, layer.padding, U)  # (conv.5)
        return (a.shape, U), z
    if isinstance(layer, Dense):
        z = a @ p[0]  # (peg.1)
        return a, (z if p[1] is None else z + p[1])
    if isinstance(layer, Activation):
        out = activate(ns, a, layer.name)  # (peg.1)
        return out, out
    if isinstance(layer, MaxPool2d):
        onehot, y = cl.max_pool(ns, a, layer.kernel, layer.stride)  # (conv.11)
        return (a.shape, onehot), y
    if isinstance(layer, AvgPool2d):
        return a.shape, cl.avg_pool(ns, a, layer.kernel, layer.stride)  # (conv.13)
    return a.shape, a.reshape(a.shape[0], -1)  # Flatten: (conv.15), row-major (c, h, w)


def _param_sites(layers) -> tuple:
    """The indices k of the parameter layers (Conv2d, Dense): MC dropout's default mask sites
    (a mask at site k multiplies the input of layer k)."""
    return tuple(k for k, layer in enumerate(layers) if isinstance(layer, _PARAM_TYPES))


def _site_masks(layers, sz, sites) -> dict:
    """{site k: mask}: sz[j] at sites[j] (default sites: the parameter layers'); {} without sz."""
    if sz is None:
        return {}
    return dict(zip(_param_sites(layers) if sites is None else sites, sz))


def _forward(ns, layers, params, X, sz=None, U0=None, sites=None):
    """(per-layer caches, f): the network on a validated (M, C, H, W) batch. With ``sz`` (MC
    dropout, refbayes.models.dropout), the input of layer k = sites[j] is multiplied by sz[j] =
    s z_j first (k = len(layers): the output f), and that layer's cache holds the masked input;
    sites None: the parameter layers' inputs. ``U0``: X unfolded for a first layer that is a
    Conv2d (``_first_unfold``), shared by the passes of S parameter vectors."""
    it = iter(params)
    masks = _site_masks(layers, sz, sites)
    caches, a = [], X
    for k, layer in enumerate(layers):
        p = next(it) if isinstance(layer, _PARAM_TYPES) else None
        if k in masks:
            a = a * masks[k]  # a~ = s z a  (mc_dropout.1), (mc_dropout.10)
        cache, a = _layer_forward(ns, layer, p, a, U0 if k == 0 else None)
        caches.append(cache)
    if len(layers) in masks:
        a = a * masks[len(layers)]  # f~ = s z f  (mc_dropout.10)
    return caches, a


def _first_unfold(ns, layers, X, S: int):
    """X unfolded for the first layer when it is a Conv2d and S > 1 parameter vectors will pass
    over the same batch: the unfold (a copy 25x LeNet-5's input) does not depend on theta, so
    the S passes share it (the same values, so the same results bit for bit); else None."""
    first = layers[0]
    if S > 1 and isinstance(first, Conv2d):
        return cl.conv_unfold(ns, X, first.kernel, first.stride, first.padding)  # (conv.4)
    return None


def _layer_backward(xp, layer, p, cache, delta):
    """dl/d(input) of one layer from dl/d(output) = delta (backprop one layer down)."""
    if isinstance(layer, Conv2d):
        x_shape, _ = cache
        D = delta.reshape(delta.shape[0], delta.shape[1], -1)
        return cl.conv_backward_input(xp, p[0], D, x_shape, layer.stride, layer.padding)  # (conv.9)
    if isinstance(layer, Dense):
        return delta @ p[0].T  # (peg.3)
    if isinstance(layer, Activation):
        return delta * act_prime(cache, layer.name)  # (peg.3), (peg.5)
    if isinstance(layer, MaxPool2d):
        x_shape, onehot = cache
        return cl.max_pool_backward(xp, onehot, delta, x_shape, layer.kernel, layer.stride)  # (conv.12)
    if isinstance(layer, AvgPool2d):
        return cl.avg_pool_backward(xp, delta, cache, layer.kernel, layer.stride)  # (conv.14)
    return delta.reshape(cache)  # Flatten: (conv.15)


def _backward_blocks(xp, layers, params, caches, r, mode: str, sz=None, sites=None):
    """The gradient blocks in theta order from r = dl/df: per-example rows (M, D_l) ("rows"), their
    sums (D_l,) ("sum"), their sums of squares (D_l,) ("sum_sq") or both lists from the one pass
    ("sum+sum_sq": (sums, sums of squares), each to the bit its own mode's). With the masks ``sz`` and
    ``sites`` of ``_forward``, the error of layer k's input is multiplied by the mask at site k
    (r by the output site's; the caches already hold the masked inputs, so the blocks need
    nothing else)."""
    it = reversed(params)
    masks = _site_masks(layers, sz, sites)
    blocks, delta = [], r  # (peg.2)
    if len(layers) in masks:
        delta = delta * masks[len(layers)]  # dl/df = s z dl/df~  (mc_dropout.11)
    for k in range(len(layers) - 1, -1, -1):
        layer = layers[k]
        p = next(it) if isinstance(layer, _PARAM_TYPES) else None
        if isinstance(layer, Conv2d):
            U = caches[k][1]
            D = delta.reshape(delta.shape[0], delta.shape[1], -1)
            blocks.append(cl.conv_grads(xp, U, D, layer.bias, mode))  # (conv.6)-(conv.8), (conv.10)
        elif isinstance(layer, Dense):
            blocks.append(_dense_grads(caches[k], delta, layer.bias, mode))  # (peg.4), (peg.6), (peg.11)
        if k > 0:  # the input's error is never needed
            delta = _layer_backward(xp, layer, p, caches[k], delta)
            if k in masks:
                delta = delta * masks[k]  # dl/da = s z dl/da~  (mc_dropout.2), (mc_dropout.11)
    blocks.reverse()  # theta order
    if mode == "sum+sum_sq":  # one backward pass, both sets of blocks
        return ([b for pair in blocks for b in pair[0]], [b for pair in blocks for b in pair[1]])
    return [b for layer_blocks in blocks for b in layer_blocks]


def _rows_into(xp, layers, params, caches, r, out):
    """The per-example rows of ``_backward_blocks``' "rows" mode, written straight into their
    columns of ``out`` (M, D) (C-contiguous rows): no per-layer blocks and no concatenation, the
    values to the bit. (conv.6)-(conv.7), (peg.4)"""
    M, pos, spans = out.shape[0], out.shape[1], []
    for w_shape, b_shape in reversed(_param_shapes(layers)):  # column spans, last layer first
        nb = 0 if b_shape is None else b_shape[0]
        pos -= nb
        b_cols = None if b_shape is None else out[:, pos:pos + nb]
        nw = math.prod(w_shape)
        pos -= nw
        spans.append((out[:, pos:pos + nw], b_cols))
    spans = iter(spans)
    it = reversed(params)
    delta = r  # (peg.2)
    for k in range(len(layers) - 1, -1, -1):
        layer = layers[k]
        p = next(it) if isinstance(layer, _PARAM_TYPES) else None
        if isinstance(layer, Conv2d):
            w_cols, b_cols = next(spans)
            U = caches[k][1]
            D = delta.reshape(M, delta.shape[1], -1)
            cl.conv_rows_into(xp, U, D, w_cols.reshape(M, D.shape[1], U.shape[1]), b_cols)  # (conv.6)-(conv.7)
        elif isinstance(layer, Dense):
            w_cols, b_cols = next(spans)
            a = caches[k]
            xp.multiply(a[:, :, None], delta[:, None, :],
                        out=w_cols.reshape(M, a.shape[1], delta.shape[1]))  # (peg.4)
            if b_cols is not None:
                b_cols[...] = delta  # (peg.4)
        if k > 0:  # the input's error is never needed
            delta = _layer_backward(xp, layer, p, caches[k], delta)


def _check_out(xp, out, shape, dtype):
    """A fresh xp array of ``shape`` and ``dtype`` when out is None, else out checked by the
    MLP's rule (``_layers.check_out``: xp, dtype, exact shape, C-contiguous, writable)."""
    return xp.empty(shape, dtype=dtype) if out is None else check_out(out, xp, dtype, shape)


def _dense_grads(a, d, bias: bool, mode: str):
    """Rows a_i^T d_i and d_i (peg.4); sums A^T Delta, 1^T Delta (peg.6); the sums of their
    squares (a^2)^T (d^2), 1^T d^2, as the squares of an outer product separate (peg.11); or
    ("sum+sum_sq") the pair of the last two."""
    if mode == "rows":
        blocks = [(a[:, :, None] * d[:, None, :]).reshape(a.shape[0], -1)]  # (peg.4)
        return blocks + [d] if bias else blocks
    if mode == "sum+sum_sq":
        return _dense_grads(a, d, bias, "sum"), _dense_grads(a, d, bias, "sum_sq")
    if mode == "sum_sq":
        a, d = a * a, d * d  # (peg.11)
    blocks = [(a.T @ d).reshape(-1)]  # (peg.6) / (peg.11)
    return blocks + [d.sum(axis=0)] if bias else blocks


def _seeded(xp, layers, params, caches, seed, mode: str):
    """The backward pass seeded with r = seed (M, K) instead of dl/df, its blocks concatenated:
    rows J_i^T seed_i (M, D) ("rows"), their sum ("sum") or sum of squares ("sum_sq"); with
    "sum+sum_sq" the pair (sum, sum of squares) of one pass."""
    blocks = _backward_blocks(xp, layers, params, caches, seed, mode)
    if mode == "sum+sum_sq":
        return xp.concatenate(blocks[0]), xp.concatenate(blocks[1])
    return xp.concatenate(blocks, axis=1 if mode == "rows" else 0)


def _jacobian(xp, layers, params, caches, f):
    """J (M, K, D): row k of every J_i from the pass seeded with e_k.  (conv.16)"""
    M, K = f.shape
    rows = []
    for k in range(K):
        e_k = xp.zeros((M, K), dtype=f.dtype)
        e_k[:, k] = 1.0
        rows.append(_seeded(xp, layers, params, caches, e_k, "rows"))  # (conv.16)
    return xp.stack(rows, axis=1)


def _diag_ggn_blocks(xp, layers, params, caches, C):
    """sum_r sum_i (J_i^T c_{i,r})^2 (D,) from the factor C (M, K, R), H_i = C_i C_i^T.  (conv.18)"""
    out = None
    for r in range(C.shape[2]):
        sq = _seeded(xp, layers, params, caches, xp.ascontiguousarray(C[:, :, r]), "sum_sq")  # (conv.18)
        out = sq if out is None else out + sq  # (conv.18): the sum over the R columns
    return out


def _r_layer_forward(ns, layer, p, dp, cache, ra):
    """R{output} of one layer from R{input} = ra (None: zero) and the direction's block dp = (V, c).

    Conv2d: Wm R{U_i} + Vm U_i + c 1^T (conv.20); Dense: R{a} W + a V + c and activations
    act'(z) R{z} (peg.22); pooling with the max-pool winners held fixed and flatten (conv.21).
    """
    if isinstance(layer, Conv2d):
        (M, _, H, W), U = cache
        (kh, kw), (sh, sw), (ph, pw) = layer.kernel, layer.stride, layer.padding
        Ho, Wo = cl.out_size(H, kh, sh, ph), cl.out_size(W, kw, sw, pw)
        rz = dp[0].reshape(layer.c_out, -1) @ U  # (conv.20): Vm U_i
        if dp[1] is not None:
            rz = rz + dp[1][:, None]  # (conv.20): c 1^T
        rz = rz.reshape(M, layer.c_out, Ho, Wo)
        if ra is None:
            return rz
        return rz + cl.conv_forward(ns, ra, p[0], None, layer.stride, layer.padding)[1]  # (conv.20)
    if isinstance(layer, Dense):
        rz = cache @ dp[0]  # (peg.22): a V
        if dp[1] is not None:
            rz = rz + dp[1]  # (peg.22)
        return rz if ra is None else rz + ra @ p[0]  # (peg.22)
    if ra is None:
        return None
    if isinstance(layer, Activation):
        return act_prime(cache, layer.name) * ra  # (peg.22)
    if isinstance(layer, MaxPool2d):
        P = cl.windows(ns, ra, layer.kernel[0], layer.kernel[1], layer.stride[0], layer.stride[1])
        return (P * cache[1]).sum(axis=2)  # (conv.21): R{P} at the fixed winner q*
    if isinstance(layer, AvgPool2d):
        return cl.avg_pool(ns, ra, layer.kernel, layer.stride)  # (conv.21)
    return ra.reshape(ra.shape[0], -1)  # (conv.21): Flatten


def _r_forward(xp, layers, params, dparams, caches, f):
    """R{f} = J v (M, K) along v split as dparams, from the forward pass's caches.  (conv.20)-(conv.21)"""
    it_p, it_d = iter(params), iter(dparams)
    ra = None  # R{x} = 0
    for layer, cache in zip(layers, caches):
        p, dp = (next(it_p), next(it_d)) if isinstance(layer, _PARAM_TYPES) else (None, None)
        ra = _r_layer_forward(xp, layer, p, dp, cache, ra)
    return xp.zeros_like(f) if ra is None else ra


# ---------------------------------------------------------------------------- H v: the R-operator backward pass (conv.34)-(conv.36)

def _r_forward_record(xp, layers, params, dparams, caches):
    """(R{input} per layer (None: zero), R{U} per layer (conv layers reached by a nonzero R{x},
    else None), R{f} (None if zero)): the R-forward pass (conv.20)-(conv.21), (peg.22) with the
    values the backward pass (conv.34)-(conv.36) reads."""
    it_p, it_d = iter(params), iter(dparams)
    ras, rUs, ra = [], [], None  # R{x} = 0
    for layer, cache in zip(layers, caches):
        p, dp = (next(it_p), next(it_d)) if isinstance(layer, _PARAM_TYPES) else (None, None)
        ras.append(ra)
        if isinstance(layer, Conv2d) and ra is not None:
            rU, rz = cl.conv_forward(xp, ra, p[0], None, layer.stride, layer.padding)  # (conv.20): R{U_i}
            ra = _r_layer_forward(xp, layer, p, dp, cache, None) + rz  # (conv.20)
            rUs.append(rU)
        else:
            rUs.append(None)
            ra = _r_layer_forward(xp, layer, p, dp, cache, ra)  # (conv.20)-(conv.21), (peg.22)
    return ras, rUs, ra


def _r_layer_backward(xp, layer, p, dp, cache, ra, delta, r_delta):
    """R{dl/d(input)} of one layer from dl/d(output) = delta, its R{.} = r_delta, R{input} = ra
    (None: zero) and the direction's block dp = (V, c).  (conv.34)-(conv.35)"""
    if isinstance(layer, Conv2d):
        x_shape = cache[0]
        M, C = delta.shape[0], delta.shape[1]
        D, RD = delta.reshape(M, C, -1), r_delta.reshape(M, C, -1)
        out = cl.conv_backward_input(xp, p[0], RD, x_shape, layer.stride, layer.padding)  # (conv.34): W with R{Delta}
        return out + cl.conv_backward_input(xp, dp[0], D, x_shape, layer.stride, layer.padding)  # (conv.34): V with Delta
    if isinstance(layer, Dense):
        return r_delta @ p[0].T + delta @ dp[0].T  # (conv.34), (peg.24)
    if isinstance(layer, Activation):
        out = r_delta * act_prime(cache, layer.name)  # (conv.35), (peg.24)
        second = act_second(cache, layer.name)
        if second is None or ra is None:  # relu: act'' = 0; R{z} = 0 above every parameter
            return out
        return out + delta * second * ra  # (conv.35), (peg.24), (peg.26)
    if isinstance(layer, MaxPool2d):
        x_shape, onehot = cache
        return cl.max_pool_backward(xp, onehot, r_delta, x_shape, layer.kernel, layer.stride)  # (conv.35): q* fixed
    if isinstance(layer, AvgPool2d):
        return cl.avg_pool_backward(xp, r_delta, cache, layer.kernel, layer.stride)  # (conv.35)
    return r_delta.reshape(cache)  # (conv.35): Flatten


def _dense_r_grads(a, ra, delta, r_delta, bias: bool):
    """A dense layer's blocks of H v: R{a}^T Delta + A^T R{Delta} and 1^T R{Delta}.  (conv.36), (peg.25)"""
    w = a.T @ r_delta  # (peg.25)
    if ra is not None:  # R{a} = 0 above every parameter
        w = w + ra.T @ delta  # (peg.25)
    blocks = [w.reshape(-1)]
    return blocks + [r_delta.sum(axis=0)] if bias else blocks  # (peg.25)


def _grad_hvp_closed(model, xp, theta, v, X, y, with_grad: bool):
    """(g or None, H v) of validated inputs: the forward and R-forward passes, then the backward
    pass beside its R{.}, seeded with dl/df and H_i R{f_i}.  (conv.34)-(conv.36), (peg.23)"""
    layers = model.layers
    params, caches, f = model._passes(xp, theta, X)
    dparams = _split(v, model._param_shapes)
    ras, rUs, r_f = _r_forward_record(xp, layers, params, dparams, caches)
    if r_f is None:
        r_f = xp.zeros_like(f)
    delta = model.likelihood._grad_f(f, y)  # (peg.2)
    r_delta = xp.einsum("mkl,ml->mk", model.likelihood._hess_f(f, y), r_f)  # (peg.23)
    it_p, it_d = reversed(params), reversed(dparams)
    g_blocks, h_blocks = [], []
    for k in range(len(layers) - 1, -1, -1):
        layer = layers[k]
        p, dp = (next(it_p), next(it_d)) if isinstance(layer, _PARAM_TYPES) else (None, None)
        if isinstance(layer, Conv2d):
            U = caches[k][1]
            D = delta.reshape(delta.shape[0], delta.shape[1], -1)
            RD = r_delta.reshape(D.shape)
            if with_grad:
                g_blocks.append(cl.conv_grads(xp, U, D, layer.bias, "sum"))  # (conv.8), as grad's
            h_blocks.append(cl.conv_r_grads(xp, U, rUs[k], D, RD, layer.bias))  # (conv.36)
        elif isinstance(layer, Dense):
            if with_grad:
                g_blocks.append(_dense_grads(caches[k], delta, layer.bias, "sum"))  # (peg.6), as grad's
            h_blocks.append(_dense_r_grads(caches[k], ras[k], delta, r_delta, layer.bias))  # (conv.36)
        if k > 0:  # the input's errors are never needed
            r_delta = _r_layer_backward(xp, layer, p, dp, caches[k], ras[k], delta, r_delta)  # (conv.34)-(conv.35)
            delta = _layer_backward(xp, layer, p, caches[k], delta)  # (conv.9), (conv.12), (conv.14), (peg.3)
    Hv = xp.concatenate([b for blocks in reversed(h_blocks) for b in blocks])  # (conv.36)
    if not with_grad:
        return None, Hv
    return xp.concatenate([b for blocks in reversed(g_blocks) for b in blocks]), Hv


# ---------------------------------------------------------------------------- K-FAC (conv.24)-(conv.32)

KFAC_APPROX = ("expand", "reduce")
# a layer's K-FAC block error is formed as an n x n matrix up to n^2 = 2^22 entries (conv.31)
_DENSE_BLOCK_LIMIT = 1 << 22


def _check_approx(approx):
    if approx not in KFAC_APPROX:
        raise ValueError(f"approx: expected one of {KFAC_APPROX}, got {approx!r}")
    return approx


def _param_layer_errors(xp, layers, params, caches, r):
    """dl/d(output) of every parameter layer, in theta order, from the seed r = dl/df (M, K):
    conv (M, C_out, P), dense (M, n_out).  The backward pass (conv.9), (conv.11)-(conv.15), (peg.3)."""
    it = reversed(params)
    errs, delta = [], r  # (peg.2)
    for k in range(len(layers) - 1, -1, -1):
        layer = layers[k]
        p = next(it) if isinstance(layer, _PARAM_TYPES) else None
        if isinstance(layer, Conv2d):
            errs.append(delta.reshape(delta.shape[0], delta.shape[1], -1))  # Delta_i (C_out, P)
        elif isinstance(layer, Dense):
            errs.append(delta)
        if k > 0:
            delta = _layer_backward(xp, layer, p, caches[k], delta)
    return errs[::-1]


def _kfac_inputs(xp, layers, caches):
    """U~ (M, n_a, P) per parameter layer: the unfolded input (conv.4) (a dense layer's input as
    P = 1 column) with a row of ones appended when the layer has a bias.  (conv.24), (conv.29)"""
    out = []
    for layer, cache in zip(layers, caches):
        if isinstance(layer, Conv2d):
            U = cache[1]  # (M, Q, P)
        elif isinstance(layer, Dense):
            U = cache[:, :, None]  # (conv.29): P = 1
        else:
            continue
        if layer.bias:
            U = xp.concatenate([U, xp.ones((U.shape[0], 1, U.shape[2]), dtype=U.dtype)], axis=1)  # (conv.24)
        out.append(U)
    return out


def _kfac_errors(model, xp, params, caches, f, y, curvature, scale=1.0):
    """E (M, R, n_b, P) per parameter layer: the R seeds of each example backpropagated to the
    layer's output; "ef": R = 1, the gradient dl_i/df_i (times scale); "ggn": the columns of C_i,
    H_i = C_i C_i^T (times sqrt(scale)).  (conv.25)"""
    if curvature == "ef":
        seeds = [model.likelihood._grad_f(f, y) * scale]  # (peg.2), (noise_gamma.2)
    else:
        C = model.likelihood._hess_factor(f, y) * scale ** 0.5  # (M, K, R), (noise_gamma.2)
        seeds = [xp.ascontiguousarray(C[:, :, r]) for r in range(C.shape[2])]
    passes = [_param_layer_errors(xp, model.layers, params, caches, s) for s in seeds]  # (conv.25)
    out = []
    for per_r in zip(*passes):
        E = xp.stack(per_r, axis=1)  # (M, R, n_b[, P])
        out.append(E if E.ndim == 4 else E[..., None])
    return out


def _kfac_pair(xp, U, E, approx):
    """(A, B) of one layer from U~ (M, n_a, P) and E (M, R, n_b, P).  (conv.26), (conv.27)"""
    M, n_a, P = U.shape
    n_b = E.shape[2]
    if approx == "expand":
        Uf = xp.swapaxes(U, 0, 1).reshape(n_a, M * P)
        Ef = xp.moveaxis(E, 2, 0).reshape(n_b, -1)
        return (Uf @ Uf.T) / (M * P), Ef @ Ef.T  # (conv.26)
    ubar = U.mean(axis=2)  # (conv.27): patches averaged over the positions (the ones row stays 1)
    e = E.sum(axis=3).reshape(-1, n_b)  # (conv.27): errors summed over the positions
    return (ubar.T @ ubar) / M, e.T @ e  # (conv.27)


def _kfac_block_error(xp, U, E, A, B):
    """(||A kron B - Y||_F, ||A kron B||_F, ||Y||_F) of one layer, Y = sum_{i,r} g g^T.  (conv.31)"""
    M, n_a, P = U.shape
    R, n_b = E.shape[1], E.shape[2]
    n = n_a * n_b
    kfac_norm = xp.linalg.norm(A) * xp.linalg.norm(B)  # (conv.31)
    if P > 1 or n * n <= _DENSE_BLOCK_LIMIT:
        # the rows g_{i,r} = vec_row_major(U~_i E_{i,r}^T) (conv.25)
        Gm = U[:, None] @ xp.swapaxes(E, 2, 3)  # (M, R, n_a, n_b)
        G = Gm.reshape(M * R, n)
    if n * n <= _DENSE_BLOCK_LIMIT:
        Y = G.T @ G  # (conv.25)
        X = (A[:, None, :, None] * B[None, :, None, :]).reshape(n, n)  # A kron B
        return xp.linalg.norm(X - Y), kfac_norm, xp.linalg.norm(Y)  # (conv.31)
    if P > 1:
        K = G @ G.T  # (conv.31): <g_{i,r}, g_{j,s}>
        Gm = Gm.reshape(M * R, n_a, n_b)
        cross = ((A @ Gm @ B) * Gm).sum()  # (conv.31): sum <A Gm B, Gm>
    else:  # a dense layer: the Gram entries factor (conv.31)
        a, e = U[:, :, 0], E[..., 0].reshape(M * R, n_b)
        Ka = xp.repeat(xp.repeat(a @ a.T, R, axis=0), R, axis=1)
        K = Ka * (e @ e.T)  # (conv.31)
        aAa = xp.repeat(((a @ A) * a).sum(axis=1), R)
        cross = (aAa * ((e @ B) * e).sum(axis=1)).sum()  # (conv.31)
    exact2 = (K * K).sum()  # ||Y||^2 = ||G G^T||^2  (conv.31)
    err2 = kfac_norm * kfac_norm - 2.0 * cross + exact2  # (conv.31)
    return xp.sqrt(xp.maximum(err2, 0.0)), kfac_norm, xp.sqrt(exact2)


# ---------------------------------------------------------------------------- the model

class CNN:
    """A sequential convolutional network x -> f(x; theta) with a likelihood p(y | f).

    theta holds the parameter layers' blocks in spec order (conv.2)-(conv.3), torch's
    ``parameters()`` order; Conv2d blocks are torch's ``weight`` as it is, Dense blocks the
    MLP's (``weight`` transposed). Instances are immutable. See refbayes.models.conv for the
    valid inputs and the methods not provided yet.

    Parameters
    ----------
    input_shape : tuple of int
        (C, H, W), each >= 1: the shape of one image (NCHW batches).
    layers : sequence of layer records
        Conv2d, MaxPool2d, AvgPool2d, Flatten, Dense and Activation records, in order; each
        layer's input must be the previous layer's output (channels, widths) and the last
        output a (K,) vector. No activation is implied: f is the last layer's output.
    likelihood : {"gaussian", "bernoulli", "categorical"}, default "categorical"
        Gaussian on K real outputs, bernoulli on one logit (K == 1), categorical on K >= 2
        logits.
    noise_precision : float, default 1.0
        The gaussian likelihood's noise precision tau > 0, finite (checked for every
        likelihood; only the gaussian uses it).

    Attributes
    ----------
    input_shape : tuple of int
        (C, H, W).
    layers : tuple
        The layer records.
    likelihood : Gaussian, Bernoulli or Categorical
        Observation model p(y | f).
    shapes : tuple of tuple
        The per-example shape before the first layer and after each layer (conv.1).
    D : int
        Number of parameters, len(theta) (conv.3).

    Raises
    ------
    ValueError
        If input_shape is not three integers >= 1, layers is empty or holds something other
        than the records above, the spec does not chain (channel or width mismatch, a kernel
        larger than its padded input, a Dense on an image, pooling on a vector), the last
        output is not a vector whose length K fits the likelihood, or likelihood or
        noise_precision is invalid.
    """

    __slots__ = ("input_shape", "layers", "likelihood", "shapes", "D", "_param_shapes")
    # hessian is autograd's (NumPy only) (conv.19); hvp and grad_hvp are closed form on either
    # backend (conv.34)-(conv.36)
    hessian_on_cupy = False

    def __init__(self, input_shape, layers, likelihood="categorical", noise_precision=1.0):
        if not isinstance(input_shape, (tuple, list)) or len(input_shape) != 3:
            raise ValueError(f"input_shape: expected (C, H, W), three integers >= 1, got {input_shape!r}")
        input_shape = tuple(check_int(n, "input_shape", low=1) for n in input_shape)
        if not isinstance(layers, (tuple, list)) or len(layers) == 0:
            raise ValueError(f"layers: expected a non-empty sequence of layer records, got {layers!r:.80}")
        for k, layer in enumerate(layers):
            if not isinstance(layer, _LAYER_TYPES):
                raise ValueError(f"layers[{k}]: expected one of "
                                 f"{[t.__name__ for t in _LAYER_TYPES]}, got {layer!r:.80}")
        if likelihood not in LIKELIHOODS:
            raise ValueError(f"likelihood: expected one of {LIKELIHOODS}, got {likelihood!r}")
        layers = tuple(layers)
        shapes = _chain_shapes(input_shape, layers)
        _check_output(shapes[-1], likelihood)
        param_shapes = _param_shapes(layers)
        D = sum(math.prod(w) + (b[0] if b else 0) for w, b in param_shapes)  # (conv.3)
        for name, value in (("input_shape", input_shape), ("layers", layers),
                            ("likelihood", make_likelihood(likelihood, noise_precision)),
                            ("shapes", shapes), ("D", D), ("_param_shapes", param_shapes)):
            object.__setattr__(self, name, value)

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is immutable (hyperparameters only)")

    def __eq__(self, other):
        return type(self) is type(other) and all(
            getattr(self, k) == getattr(other, k) for k in ("input_shape", "layers", "likelihood"))

    def __hash__(self):
        return hash((type(self).__name__, self.input_shape, self.layers, self.likelihood))

    def __repr__(self):
        return (f"CNN({self.input_shape}, {list(self.layers)}, "
                f"likelihood={self.likelihood.name!r})")

    @property
    def n_in(self) -> int:
        """The width C H W of one input row (the 2-D form of X)."""
        return math.prod(self.input_shape)

    @property
    def n_out(self) -> int:
        """The number K of outputs f_i."""
        return self.shapes[-1][0]

    # ---- validation ------------------------------------------------------------------------

    def _check_theta(self, theta):
        check_array(theta, "theta", ndim=1)
        if theta.shape[0] != self.D:
            raise ValueError(f"theta: expected shape ({self.D},), got {tuple(theta.shape)}")
        return check_float(theta, "theta")

    def _check_X(self, X):
        """X as an (M, C, H, W) batch: NCHW images, or rows (M, C H W) reshaped (a view)."""
        C, H, W = self.input_shape
        check_array(X, "X", ndim=(2, 4))
        if X.shape[1:] not in ((C, H, W), (C * H * W,)):
            raise ValueError(f"X: expected NCHW images (M, {C}, {H}, {W}) or rows "
                             f"(M, {C * H * W}), got {tuple(X.shape)}")
        if X.shape[0] < 1:
            raise ValueError(f"X: expected at least one example, got shape {tuple(X.shape)}")
        check_float(X, "X")
        return X.reshape((X.shape[0],) + self.input_shape)

    def _inputs(self, theta, X, y=None, need_y=True):
        """xp and validated (theta, X (M, C, H, W), y in the likelihood's canonical form)."""
        xp = xp_of(theta, X, y)
        self._check_theta(theta)
        X = self._check_X(X)
        check_same_dtype({"theta": theta, "X": X})
        if need_y:
            if y is None:
                raise ValueError("y: expected targets, got None")
            y = self.likelihood.check_targets(y, X.shape[0], self.n_out, theta.dtype)
        return xp, theta, X, y

    # ---- parameters ------------------------------------------------------------------------

    def unflatten(self, theta):
        """Split theta into the parameter layers' weights and biases (views into theta).

        (conv.2)-(conv.3): a Conv2d's W is (C_out, C_in, k_h, k_w), a Dense's (n_in, n_out).

        Parameters
        ----------
        theta : array of shape (D,)
            Flat parameter vector (float64 or float32).

        Returns
        -------
        list of tuple
            [(W, b or None)], one pair per Conv2d or Dense layer, in spec order.

        Raises
        ------
        ValueError
            If theta is invalid (see refbayes.models.conv).
        """
        xp_of(theta)
        self._check_theta(theta)
        return _split(theta, self._param_shapes)

    def flatten(self, params):
        """Concatenate the parameter layers' weights and biases into theta, inverse of ``unflatten``.

        theta = concat(vec_row_major(W), b) over the Conv2d and Dense layers in spec order.
        (conv.2)-(conv.3)

        Parameters
        ----------
        params : list of tuple
            One (W, b) pair per parameter layer, shaped as ``unflatten`` returns them, b None
            for a layer without a bias.

        Returns
        -------
        array of shape (D,)
            The flat parameter vector theta.

        Raises
        ------
        ValueError
            If params is not one (W, b) pair per parameter layer of those shapes, with finite
            real values of one dtype on one backend.
        """
        n = len(self._param_shapes)
        if not isinstance(params, (list, tuple)) or len(params) != n:
            raise ValueError(f"params: expected a list of {n} (W, b) pairs, got "
                             f"{type(params).__name__} of length "
                             f"{len(params) if hasattr(params, '__len__') else '?'}")
        pieces = []
        for k, (pair, (w_shape, b_shape)) in enumerate(zip(params, self._param_shapes)):
            if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                raise ValueError(f"params[{k}]: expected a (W, b) pair, got {pair!r:.80}")
            pieces.append(check_array(pair[0], f"params[{k}][0]", shape=w_shape).reshape(-1))
            if b_shape is None:
                if pair[1] is not None:
                    raise ValueError(f"params[{k}][1]: expected None (the layer has no bias), got an array")
            else:
                pieces.append(check_array(pair[1], f"params[{k}][1]", shape=b_shape))
        if not pieces:  # a spec of pooling, flatten and activations only: D = 0
            return np.zeros(0)
        xp = xp_of(*pieces)
        check_same_dtype({f"params[{k}]": a for k, a in enumerate(pieces)})
        return xp.concatenate(pieces)

    def init_theta(self, rng, dtype=np.float64, scheme: str = "glorot"):
        """Draw an initial theta (NumPy), parameter layer by layer in theta order.

        As ``FlatModel.init_theta``, with torch's fans: fan_in = C_in k_h k_w and fan_out =
        C_out k_h k_w for a Conv2d, n_in and n_out for a Dense. "glorot": W ~ U(-s, s),
        s = sqrt(6 / (fan_in + fan_out)), biases zero; "pytorch": W then b ~ U(-s, s),
        s = 1 / sqrt(fan_in) (torch's default distribution, NumPy's draws).

        Parameters
        ----------
        rng : numpy.random.Generator
            Generator owned by the caller.
        dtype : numpy dtype, default numpy.float64
            Either float64 or float32.
        scheme : {"glorot", "pytorch"}, default "glorot"
            The initialization's distribution.

        Returns
        -------
        numpy.ndarray of shape (D,)
            The initial theta, in ``dtype``.

        Raises
        ------
        ValueError
            If rng is not a numpy.random.Generator, dtype is neither float64 nor float32, or
            scheme is not one of refbayes.models.base.INIT_SCHEMES.
        """
        if not isinstance(rng, np.random.Generator):
            raise ValueError(f"rng: expected a numpy.random.Generator, got {type(rng).__name__}")
        if np.dtype(dtype) not in (np.float32, np.float64):
            raise ValueError(f"dtype: expected float64 or float32, got {dtype}")
        if scheme not in INIT_SCHEMES:
            raise ValueError(f"scheme: expected one of {INIT_SCHEMES}, got {scheme!r}")
        params = []
        for w_shape, b_shape in self._param_shapes:
            fan_in, fan_out = _fans(w_shape)
            s = math.sqrt(6.0 / (fan_in + fan_out)) if scheme == "glorot" else 1.0 / math.sqrt(fan_in)
            W = rng.uniform(-s, s, size=w_shape)
            if b_shape is None:
                b = None
            else:
                b = np.zeros(b_shape) if scheme == "glorot" else rng.uniform(-s, s, size=b_shape)
            params.append((W, b))
        return self.flatten(params).astype(dtype)

    # ---- forward -----------------------------------------------------------------------------

    def forward(self, theta, X):
        """Compute the network output f, the last layer's output.

        Conv2d (conv.4)-(conv.5), MaxPool2d (conv.11), AvgPool2d (conv.13), Flatten (conv.15),
        Dense and Activation (peg.1), in spec order.

        Parameters
        ----------
        theta : array of shape (D,)
            Flat parameter vector (float64 or float32).
        X : array of shape (M, C, H, W) or (M, C H W)
            Images NCHW, or their rows flattened row-major; M >= 1, theta's dtype.

        Returns
        -------
        array of shape (M, K)
            The outputs f.

        Raises
        ------
        ValueError
            If theta or X is invalid (see refbayes.models.conv).
        """
        xp, theta, X, _ = self._inputs(theta, X, need_y=False)
        return _forward(xp, self.layers, _split(theta, self._param_shapes), X)[1]

    def predict(self, theta, X):
        """Compute the predictive mean E[y | x, theta] of the likelihood at the outputs f.

        Parameters
        ----------
        theta : array of shape (D,)
            Flat parameter vector (float64 or float32).
        X : array of shape (M, C, H, W) or (M, C H W)
            Images NCHW, or their rows flattened row-major; M >= 1, theta's dtype.

        Returns
        -------
        array of shape (M, K), (M,) or (M, C)
            Gaussian: f (M, K); bernoulli: p(y = 1) (M,); categorical: the class
            probabilities (M, K).

        Raises
        ------
        ValueError
            If theta or X is invalid (see refbayes.models.conv).
        """
        xp, theta, X, _ = self._inputs(theta, X, need_y=False)
        f = _forward(xp, self.layers, _split(theta, self._param_shapes), X)[1]
        return self.likelihood._mean(xp, f)

    def per_example_losses(self, theta, X, y):
        """Compute the per-example negative log-likelihoods l_i = -log p(y_i | x_i, theta).

        (peg.17)-(peg.19) at the outputs f of ``forward``.

        Parameters
        ----------
        theta : array of shape (D,)
            Flat parameter vector (float64 or float32).
        X : array of shape (M, C, H, W) or (M, C H W)
            Images NCHW, or their rows flattened row-major; M >= 1, theta's dtype.
        y : array of shape (M,) or (M, K)
            Targets: labels (M,) for classification; reals (M,) or (M, K) for the gaussian
            likelihood.

        Returns
        -------
        array of shape (M,)
            The losses l_i, constants included.

        Raises
        ------
        ValueError
            If theta, X or y is invalid (see refbayes.models.conv).
        """
        xp, theta, X, y = self._inputs(theta, X, y)
        f = _forward(xp, self.layers, _split(theta, self._param_shapes), X)[1]
        return self.likelihood._losses(xp, f, y)

    def loss(self, theta, X, y):
        """Compute the summed loss sum_i l_i, l_i = -log p(y_i | x_i, theta).

        Parameters
        ----------
        theta : array of shape (D,)
            Flat parameter vector (float64 or float32).
        X : array of shape (M, C, H, W) or (M, C H W)
            Images NCHW, or their rows flattened row-major; M >= 1, theta's dtype.
        y : array of shape (M,) or (M, K)
            Targets: labels (M,) for classification; reals (M,) or (M, K) for the gaussian
            likelihood.

        Returns
        -------
        array of shape ()
            The loss, a 0-d array of theta's dtype on theta's backend.

        Raises
        ------
        ValueError
            If theta, X or y is invalid (see refbayes.models.conv).
        """
        return self.per_example_losses(theta, X, y).sum()

    # ---- gradients -----------------------------------------------------------------------------

    def _gradient_blocks(self, xp, theta, X, y, mode):
        params = _split(theta, self._param_shapes)
        caches, f = _forward(xp, self.layers, params, X)
        r = self.likelihood._grad_f(f, y)  # (peg.2)
        return _backward_blocks(xp, self.layers, params, caches, r, mode)

    def grad(self, theta, X, y):
        """Compute the summed gradient g = sum_i dl_i/dtheta.

        Backprop of r = dl/df through every layer, without forming per-example rows: conv
        blocks sum_i Delta_i U_i^T and sum_i Delta_i 1 (conv.8), dense blocks (peg.6).

        Parameters
        ----------
        theta : array of shape (D,)
            Flat parameter vector (float64 or float32).
        X : array of shape (M, C, H, W) or (M, C H W)
            Images NCHW, or their rows flattened row-major; M >= 1, theta's dtype.
        y : array of shape (M,) or (M, K)
            Targets: labels (M,) for classification; reals (M,) or (M, K) for the gaussian
            likelihood.

        Returns
        -------
        array of shape (D,)
            The gradient g.

        Raises
        ------
        ValueError
            If theta, X or y is invalid (see refbayes.models.conv).
        """
        xp, theta, X, y = self._inputs(theta, X, y)
        return xp.concatenate(self._gradient_blocks(xp, theta, X, y, "sum"))  # (conv.8)

    def per_example_grads(self, theta, X, y, impl=None, out=None):
        """Compute the per-example gradients G[i] = dl_i/dtheta, so G.sum(0) == grad.

        "vectorized": a forward and a backward pass; conv blocks Delta_i U_i^T and Delta_i 1 as
        one batched product over the examples (conv.6)-(conv.7), BackPACK's BatchGrad; dense
        blocks (peg.4). Every layer's rows are written straight into their columns of G; on
        NumPy the passes run over chunks of examples whose activations fit in cache (the
        values do not depend on the chunking). "autograd": a loop of autograd.grad over
        examples (the oracle).

        Parameters
        ----------
        theta : array of shape (D,)
            Flat parameter vector (float64 or float32).
        X : array of shape (M, C, H, W) or (M, C H W)
            Images NCHW, or their rows flattened row-major; M >= 1, theta's dtype.
        y : array of shape (M,) or (M, K)
            Targets: labels (M,) for classification; reals (M,) or (M, K) for the gaussian
            likelihood.
        impl : {"vectorized", "autograd"}, optional
            Default "vectorized" (NumPy or CuPy); "autograd" runs on NumPy only. FlatModel's
            "numba" has no CNN version.
        out : array of shape (M, D), optional
            Where to write G: theta's array module and dtype, C-contiguous (a row slice of a
            C-contiguous 2-D array qualifies). The values are those of out=None, to the bit.

        Returns
        -------
        array of shape (M, D)
            The per-example gradients G (``out`` itself when given).

        Raises
        ------
        ValueError
            If theta, X or y is invalid (see refbayes.models.conv), or impl is not one of
            CNN_IMPLS, or is "autograd" with CuPy arrays, or out is not as described.
        """
        xp = xp_of(theta, X, y)
        impl = "vectorized" if impl is None else impl
        if impl not in CNN_IMPLS:
            raise ValueError(f"impl: expected one of {CNN_IMPLS}, got {impl!r}")
        if impl == "autograd" and xp is not np:
            raise ValueError("impl: 'autograd' runs on NumPy arrays only, got CuPy arrays; "
                             "use impl='vectorized' on the GPU")
        xp, theta, X, y = self._inputs(theta, X, y)
        out = _check_out(xp, out, (X.shape[0], self.D), theta.dtype)
        if impl == "autograd":
            out[...] = self._per_example_grads_autograd(theta, X, y)
            return out
        return self._rows(xp, theta, X, y, out)  # (conv.6)-(conv.7)

    def _rows_chunk(self, xp, itemsize: int) -> int | None:
        """Examples per pass of ``_rows`` on NumPy: every layer's per-example activations and
        unfolded inputs (conv.4) within _ROWS_CHUNK_BYTES, so they stay in cache and under the
        allocator's mmap threshold (measured, derivations/conv_experiments.md); all M on CuPy."""
        if xp is not np:
            return None
        per = sum(math.prod(s) for s in self.shapes)
        for layer, shape in zip(self.layers, self.shapes):
            if isinstance(layer, Conv2d):
                Ho, Wo = _out_shape(layer, shape, "")[1:]
                per += layer.c_in * layer.kernel[0] * layer.kernel[1] * Ho * Wo  # U (conv.4)
        return max(1, _ROWS_CHUNK_BYTES // (per * itemsize))

    def _rows(self, xp, theta, X, y, out):
        """``out`` (M, D) <- the per-example gradients, a forward and a backward pass per chunk of
        examples (``_rows_chunk``), each layer's rows written into its columns. (conv.6)-(conv.7)"""
        params = _split(theta, self._param_shapes)
        M = X.shape[0]
        step = self._rows_chunk(xp, theta.dtype.itemsize) or M
        for i in range(0, M, step):
            caches, f = _forward(xp, self.layers, params, X[i:i + step])
            r = self.likelihood._grad_f(f, y[i:i + step])  # (peg.2)
            _rows_into(xp, self.layers, params, caches, r, out[i:i + step])  # (conv.6)-(conv.7)
        return out

    def diag_ef(self, theta, X, y):
        """Compute the diagonal empirical Fisher sum_i g_i^2, g_i = dl_i/dtheta.

        No (M, D) rows: a conv layer's squared rows are formed one layer at a time,
        sum_i (Delta_i U_i^T)^2 and sum_i (Delta_i 1)^2 (conv.10) (the square of a sum over
        positions does not separate); a dense layer's sum is (a^2)^T (delta^2) (peg.11).

        Parameters
        ----------
        theta : array of shape (D,)
            Flat parameter vector (float64 or float32).
        X : array of shape (M, C, H, W) or (M, C H W)
            Images NCHW, or their rows flattened row-major; M >= 1, theta's dtype.
        y : array of shape (M,) or (M, K)
            Targets: labels (M,) for classification; reals (M,) or (M, K) for the gaussian
            likelihood.

        Returns
        -------
        array of shape (D,)
            The diagonal empirical Fisher.

        Raises
        ------
        ValueError
            If theta, X or y is invalid (see refbayes.models.conv).
        """
        xp, theta, X, y = self._inputs(theta, X, y)
        return xp.concatenate(self._gradient_blocks(xp, theta, X, y, "sum_sq"))  # (conv.10)

    def _autograd_loss(self, theta, X, y):
        """sum_i l_i through autograd.numpy: the same forward pass, differentiated by autograd."""
        f = _forward(anp, self.layers, _split(theta, self._param_shapes), X)[1]
        return anp.sum(self.likelihood._losses(anp, f, y))

    def _per_example_grads_autograd(self, theta, X, y):
        grad_fn = autograd.grad(self._autograd_loss)
        G = np.empty((X.shape[0], self.D), dtype=theta.dtype)
        for i in range(X.shape[0]):
            G[i] = grad_fn(theta, X[i:i + 1], y[i:i + 1])
        return G

    # ---- curvature (conv.16)-(conv.22) -------------------------------------------------------

    def _check_v(self, theta, v):
        xp_of(theta, v)
        check_array(v, "v", shape=(self.D,))
        check_same_dtype({"theta": theta, "v": v})
        return check_float(v, "v")

    def _passes(self, xp, theta, X, U0=None):
        """(params, caches, f) of one forward pass on validated inputs (``U0``: ``_forward``'s)."""
        params = _split(theta, self._param_shapes)
        caches, f = _forward(xp, self.layers, params, X, U0=U0)
        return params, caches, f

    def jacobian(self, theta, X):
        """Compute the output Jacobians J[i, k] = d f_ik / d theta.

        K backward passes of the same forward caches, the k-th seeded with the unit vector e_k
        for every example: its per-example rows are row k of every J_i (conv.16).

        Parameters
        ----------
        theta : array of shape (D,)
            Flat parameter vector (float64 or float32).
        X : array of shape (M, C, H, W) or (M, C H W)
            Images NCHW, or their rows flattened row-major; M >= 1, theta's dtype.

        Returns
        -------
        array of shape (M, K, D)
            The Jacobians J.

        Raises
        ------
        ValueError
            If theta or X is invalid (see refbayes.models.conv).
        """
        xp, theta, X, _ = self._inputs(theta, X, need_y=False)
        params, caches, f = self._passes(xp, theta, X)
        return _jacobian(xp, self.layers, params, caches, f)  # (conv.16)

    def ggn(self, theta, X, y):
        """Form the dense generalized Gauss-Newton matrix sum_i J_i^T H_i J_i.

        J from the K seeded backward passes (conv.16), H_i = d^2 l_i / df_i^2 from the
        likelihood (conv.17).

        Parameters
        ----------
        theta : array of shape (D,)
            Flat parameter vector (float64 or float32).
        X : array of shape (M, C, H, W) or (M, C H W)
            Images NCHW, or their rows flattened row-major; M >= 1, theta's dtype.
        y : array of shape (M,) or (M, K)
            Targets: labels (M,) for classification; reals (M,) or (M, K) for the gaussian
            likelihood.

        Returns
        -------
        array of shape (D, D)
            The GGN.

        Raises
        ------
        ValueError
            If theta, X or y is invalid (see refbayes.models.conv).
        """
        xp, theta, X, y = self._inputs(theta, X, y)
        params, caches, f = self._passes(xp, theta, X)
        J = _jacobian(xp, self.layers, params, caches, f)  # (conv.16)
        HJ = xp.einsum("mkl,mld->mkd", self.likelihood._hess_f(f, y), J)
        MK = J.shape[0] * J.shape[1]
        return J.reshape(MK, -1).T @ HJ.reshape(MK, -1)  # (conv.17)

    def diag_ggn(self, theta, X, y):
        """Compute the exact GGN diagonal without forming J or a D x D matrix.

        diag(GGN) = sum_r sum_i (J_i^T c_{i,r})^2 with H_i = C_i C_i^T: one backward pass per
        column of C_i, each squared per example and layer and summed (conv.18), BackPACK's
        DiagGGNExact.

        Parameters
        ----------
        theta : array of shape (D,)
            Flat parameter vector (float64 or float32).
        X : array of shape (M, C, H, W) or (M, C H W)
            Images NCHW, or their rows flattened row-major; M >= 1, theta's dtype.
        y : array of shape (M,) or (M, K)
            Targets: labels (M,) for classification; reals (M,) or (M, K) for the gaussian
            likelihood.

        Returns
        -------
        array of shape (D,)
            The diagonal of the GGN.

        Raises
        ------
        ValueError
            If theta, X or y is invalid (see refbayes.models.conv).
        """
        xp, theta, X, y = self._inputs(theta, X, y)
        params, caches, f = self._passes(xp, theta, X)
        C = self.likelihood._hess_factor(f, y)  # (M, K, R)
        return _diag_ggn_blocks(xp, self.layers, params, caches, C)  # (conv.18)

    # sum_s of hessian(thetas[s]) (or of its diagonal): S autograd Hessians, as FlatModel's
    # (ngvi's "hess" curvature, (ngvi.10))
    _hessian_sum = _curvature._hessian_sum

    def hessian(self, theta, X, y):
        """Form the dense Hessian of sum_i l_i by autograd (NumPy only).

        At this slice the CNN's Hessian is autograd's Hessian of the same vectorized forward
        pass (conv.19); a closed-form R-operator for conv layers is a later slice.

        Parameters
        ----------
        theta : array of shape (D,)
            Flat parameter vector (float64 or float32).
        X : array of shape (M, C, H, W) or (M, C H W)
            Images NCHW, or their rows flattened row-major; M >= 1, theta's dtype.
        y : array of shape (M,) or (M, K)
            Targets: labels (M,) for classification; reals (M,) or (M, K) for the gaussian
            likelihood.

        Returns
        -------
        numpy.ndarray of shape (D, D)
            The Hessian, in theta's dtype.

        Raises
        ------
        ValueError
            If theta, X or y is invalid (see refbayes.models.conv), or the arrays are CuPy
            arrays.
        """
        xp, theta, X, y = self._inputs(theta, X, y)
        if xp is not np:
            raise ValueError("theta: the CNN's autograd Hessian needs NumPy arrays, got CuPy arrays")
        H = autograd.hessian(self._autograd_loss)(theta, X, y)  # (conv.19)
        return np.asarray(H, dtype=theta.dtype)

    def hvp(self, theta, v, X, y):
        """Compute the Hessian-vector product H v of sum_i l_i in closed form (NumPy or CuPy).

        H is the Hessian of ``hessian`` (conv.19); H v = R{g} is Pearlmutter's R-operator: the
        forward pass of R{.} (conv.20)-(conv.21), the seed H_i R{f_i} (peg.23), then one backward
        pass of R{delta} beside the gradient's: conv and dense layers (conv.34), activations
        (act'' terms), pooling (max-pool winners held fixed) and flatten (conv.35), and the
        blocks R{sum_i Delta_i U_i^T} (conv.36). The D x D matrix is never formed. The same
        product by autograd (reverse over reverse, NumPy only) is ``_hvp_autograd``, its oracle.

        Parameters
        ----------
        theta : array of shape (D,)
            Flat parameter vector (float64 or float32).
        v : array of shape (D,)
            The vector, same dtype and backend as theta.
        X : array of shape (M, C, H, W) or (M, C H W)
            Images NCHW, or their rows flattened row-major; M >= 1, theta's dtype.
        y : array of shape (M,) or (M, K)
            Targets: labels (M,) for classification; reals (M,) or (M, K) for the gaussian
            likelihood.

        Returns
        -------
        array of shape (D,)
            The product H v, in theta's dtype on theta's backend.

        Raises
        ------
        ValueError
            If theta, X or y is invalid (see refbayes.models.conv), or v is not a finite (D,)
            array of theta's dtype on theta's backend.
        """
        xp, theta, X, y = self._inputs(theta, X, y)
        v = self._check_v(theta, v)
        return _grad_hvp_closed(self, xp, theta, v, X, y, with_grad=False)[1]  # (conv.34)-(conv.36)

    def _hvp_autograd(self, theta, v, X, y):
        """H v by autograd's reverse-over-reverse product (NumPy only): the oracle of ``hvp``. (conv.19)"""
        xp, theta, X, y = self._inputs(theta, X, y)
        v = self._check_v(theta, v)
        if xp is not np:
            raise ValueError("theta: the CNN's autograd Hessian-vector product needs NumPy "
                             "arrays, got CuPy arrays")
        Hv = autograd.hessian_tensor_product(self._autograd_loss)(theta, X, y, v)  # (conv.19)
        return np.asarray(Hv, dtype=theta.dtype)

    def grad_hvp(self, theta, v, X, y):
        """Compute the gradient g = sum_i dl_i/dtheta and H v from one forward and one backward pass.

        The R-operator's passes (conv.34)-(conv.36) run beside the gradient's (conv.8), so both
        cost about as much as ``hvp`` alone: what a geodesic's right-hand side needs at one point
        (``riemannian_laplace.loss_fns``). Each equals ``grad`` and ``hvp`` bit for bit.

        Parameters
        ----------
        theta : array of shape (D,)
            Flat parameter vector (float64 or float32).
        v : array of shape (D,)
            The vector, same dtype and backend as theta.
        X : array of shape (M, C, H, W) or (M, C H W)
            Images NCHW, or their rows flattened row-major; M >= 1, theta's dtype.
        y : array of shape (M,) or (M, K)
            Targets: labels (M,) for classification; reals (M,) or (M, K) for the gaussian
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
            As ``hvp``.
        """
        xp, theta, X, y = self._inputs(theta, X, y)
        v = self._check_v(theta, v)
        return _grad_hvp_closed(self, xp, theta, v, X, y, with_grad=True)  # (conv.8), (conv.34)-(conv.36)

    def jvp(self, theta, v, X):
        """Compute the output Jacobian-vector products J_i v = R{f_i} in one forward pass.

        Pearlmutter's R-operator forward pass: conv layers Wm R{U_i} + Vm U_i + c 1^T (conv.20),
        pooling with the max-pool winners fixed and flatten (conv.21), dense layers and
        activations (peg.22). Neither J nor a backward pass is formed.

        Parameters
        ----------
        theta : array of shape (D,)
            Flat parameter vector (float64 or float32).
        v : array of shape (D,)
            The vector, same dtype and backend as theta.
        X : array of shape (M, C, H, W) or (M, C H W)
            Images NCHW, or their rows flattened row-major; M >= 1, theta's dtype.

        Returns
        -------
        array of shape (M, K)
            Row i is J_i v, J_i as in ``jacobian``.

        Raises
        ------
        ValueError
            If theta or X is invalid (see refbayes.models.conv), or v is not a finite (D,)
            array of theta's dtype on theta's backend.
        """
        xp, theta, X, _ = self._inputs(theta, X, need_y=False)
        v = self._check_v(theta, v)
        params, caches, f = self._passes(xp, theta, X)
        dparams = _split(v, self._param_shapes)
        return _r_forward(xp, self.layers, params, dparams, caches, f)  # (conv.20)-(conv.21)

    def ggn_vp(self, theta, v, X, y):
        """Compute the GGN-vector product sum_i J_i^T H_i J_i v without J or the D x D GGN.

        J v by the R-operator forward pass (conv.20)-(conv.21), the seed H_i J_i v (peg.23),
        then one backward pass in the summed mode (conv.22); ``ggn(theta, X, y) @ v`` up to
        rounding.

        Parameters
        ----------
        theta : array of shape (D,)
            Flat parameter vector (float64 or float32).
        v : array of shape (D,)
            The vector, same dtype and backend as theta.
        X : array of shape (M, C, H, W) or (M, C H W)
            Images NCHW, or their rows flattened row-major; M >= 1, theta's dtype.
        y : array of shape (M,) or (M, K)
            Targets: labels (M,) for classification; reals (M,) or (M, K) for the gaussian
            likelihood.

        Returns
        -------
        array of shape (D,)
            The product GGN v, in theta's dtype.

        Raises
        ------
        ValueError
            If theta, X or y is invalid (see refbayes.models.conv), or v is not a finite (D,)
            array of theta's dtype on theta's backend.
        """
        xp, theta, X, y = self._inputs(theta, X, y)
        v = self._check_v(theta, v)
        params, caches, f = self._passes(xp, theta, X)
        r_f = _r_forward(xp, self.layers, params, _split(v, self._param_shapes), caches, f)
        seed = xp.einsum("mkl,ml->mk", self.likelihood._hess_f(f, y), r_f)  # (peg.23)
        return _seeded(xp, self.layers, params, caches, seed, "sum")  # (conv.22)

    # ---- S parameter vectors (conv.23) -------------------------------------------------------

    def _inputs_batched(self, thetas, X, y=None, need_y=True):
        """xp, validated X (M, C, H, W) and y, and S for S parameter vectors thetas (S, D)."""
        check_array(thetas, "thetas", ndim=2)
        S = thetas.shape[0]
        if S < 1 or thetas.shape[1] != self.D:
            raise ValueError(f"thetas: expected shape (S >= 1, {self.D}), got {tuple(thetas.shape)}")
        xp, _, X, y = self._inputs(thetas[0], X, y, need_y)
        check_float(thetas, "thetas")
        check_same_dtype({"thetas": thetas, "X": X})
        return xp, X, y, S

    def forward_batched(self, thetas, X):
        """Compute the network outputs at S parameter vectors.

        F[s] = ``forward(thetas[s], X)``: a loop over s of the single-theta pass (conv.23).

        Parameters
        ----------
        thetas : array of shape (S, D)
            S >= 1 parameter vectors (float64 or float32).
        X : array of shape (M, C, H, W) or (M, C H W)
            Images NCHW, or their rows flattened row-major; M >= 1, thetas' dtype.

        Returns
        -------
        array of shape (S, M, K)
            The outputs F.

        Raises
        ------
        ValueError
            If thetas or X is invalid (see refbayes.models.conv).
        """
        xp, X, _, _ = self._inputs_batched(thetas, X, need_y=False)
        U0 = _first_unfold(xp, self.layers, X, thetas.shape[0])
        return xp.stack([self._passes(xp, th, X, U0)[2] for th in thetas])  # (conv.23)

    def sample_losses_and_grads(self, thetas, X, y):
        """Compute the summed losses and gradients at S parameter vectors.

        loss[s] = sum_i l_i(theta_s) and g[s] = ``grad(thetas[s], X, y)``, from one forward
        and one backward pass per s (conv.23).

        Parameters
        ----------
        thetas : array of shape (S, D)
            S >= 1 parameter vectors (float64 or float32).
        X : array of shape (M, C, H, W) or (M, C H W)
            Images NCHW, or their rows flattened row-major; M >= 1, thetas' dtype.
        y : array of shape (M,) or (M, K)
            Targets: labels (M,) for classification; reals (M,) or (M, K) for the gaussian
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
            If thetas, X or y is invalid (see refbayes.models.conv).
        """
        xp, X, y, S = self._inputs_batched(thetas, X, y)
        losses, grads = [], []
        U0 = _first_unfold(xp, self.layers, X, S)
        for th in thetas:  # (conv.23)
            params, caches, f = self._passes(xp, th, X, U0)
            losses.append(self.likelihood._losses(xp, f, y).sum())
            grads.append(_seeded(xp, self.layers, params, caches, self.likelihood._grad_f(f, y), "sum"))
        return xp.stack(losses), xp.stack(grads)

    def per_example_grads_batched(self, thetas, X, y, out=None):
        """Compute the per-example gradients at S parameter vectors.

        G[s] = ``per_example_grads(thetas[s], X, y)`` (vectorized): a loop over s (conv.23),
        each written into its slice of G.

        Parameters
        ----------
        thetas : array of shape (S, D)
            S >= 1 parameter vectors (float64 or float32).
        X : array of shape (M, C, H, W) or (M, C H W)
            Images NCHW, or their rows flattened row-major; M >= 1, thetas' dtype.
        y : array of shape (M,) or (M, K)
            Targets: labels (M,) for classification; reals (M,) or (M, K) for the gaussian
            likelihood.
        out : array of shape (S, M, D), optional
            Where to write G: thetas' array module and dtype, C-contiguous. The values are
            those of out=None, to the bit.

        Returns
        -------
        array of shape (S, M, D)
            The per-example gradients G (``out`` itself when given).

        Raises
        ------
        ValueError
            If thetas, X or y is invalid (see refbayes.models.conv), or out is not as described.
        """
        xp, X, y, S = self._inputs_batched(thetas, X, y)
        out = _check_out(xp, out, (S, X.shape[0], self.D), thetas.dtype)
        for s, th in enumerate(thetas):
            self._rows(xp, th, X, y, out[s])  # (conv.23)
        return out

    def sample_moments(self, thetas, X, y, curvature=None):
        """Compute gradients and curvature diagonals at S parameter vectors.

        g[s] = ``grad(thetas[s], X, y)``; with curvature="ef" h[s] = ``diag_ef`` (conv.10),
        with curvature="ggn" h[s] = ``diag_ggn`` (conv.18); one forward pass per s shared by
        both (conv.23), with "ef" one backward pass too, and no (M, D) rows.

        Parameters
        ----------
        thetas : array of shape (S, D)
            S >= 1 parameter vectors (float64 or float32).
        X : array of shape (M, C, H, W) or (M, C H W)
            Images NCHW, or their rows flattened row-major; M >= 1, thetas' dtype.
        y : array of shape (M,) or (M, K)
            Targets: labels (M,) for classification; reals (M,) or (M, K) for the gaussian
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
            If thetas, X or y is invalid (see refbayes.models.conv), or curvature is not None,
            "ef" or "ggn".
        """
        if curvature not in (None, "ef", "ggn"):
            raise ValueError(f"curvature: expected None, 'ef' or 'ggn', got {curvature!r}")
        xp, X, y, S = self._inputs_batched(thetas, X, y)
        gs, hs = [], []
        U0 = _first_unfold(xp, self.layers, X, S)
        for th in thetas:  # (conv.23)
            params, caches, f = self._passes(xp, th, X, U0)
            r = self.likelihood._grad_f(f, y)
            if curvature == "ef":  # one backward pass gives both (conv.8), (conv.10)
                g, h = _seeded(xp, self.layers, params, caches, r, "sum+sum_sq")
                gs.append(g)
                hs.append(h)
                continue
            gs.append(_seeded(xp, self.layers, params, caches, r, "sum"))  # (conv.8)
            if curvature == "ggn":
                C = self.likelihood._hess_factor(f, y)
                hs.append(_diag_ggn_blocks(xp, self.layers, params, caches, C))  # (conv.18)
        return xp.stack(gs), (xp.stack(hs) if hs else None)

    def _sample_moments_trusted(self, thetas, X, y, curvature):
        """``sample_moments`` under FlatModel's name for VOGN's step: the CNN checks every input."""
        return self.sample_moments(thetas, X, y, curvature)

    # ---- K-FAC (conv.24)-(conv.32) -------------------------------------------------------------

    def kfac_layout(self):
        """Index arrays mapping theta to each parameter layer's K-FAC matrix W~ (conv.24).

        For parameter layer l, ``theta[idx_l]`` is W~_l (n_a, n_b): for a conv layer
        [Wm^T; b^T] ((Q + 1, C_out) with a bias, Q = C_in k_h k_w), for a dense layer [W; b^T]
        ((n_in + 1, n_out), theta's own row-major block). The K-FAC factors (A_l, B_l) of
        ``kfac_curvature`` approximate the curvature block of vec_row_major(W~_l), i.e. of
        ``theta[idx_l.ravel()]``, by A_l kron B_l.

        Returns
        -------
        list of array of int
            One (n_a, n_b) index array per parameter layer, in theta order.
        """
        out, pos = [], 0
        for w_shape, b_shape in self._param_shapes:
            n_w = math.prod(w_shape)
            if len(w_shape) == 4:  # conv: theta holds Wm (C_out, Q) row-major, then b  (conv.24)
                c_out, Q = w_shape[0], n_w // w_shape[0]
                idx = pos + np.arange(n_w).reshape(c_out, Q).T  # W~[q, o] = theta_l[o Q + q]
                if b_shape is not None:
                    idx = np.vstack([idx, pos + n_w + np.arange(c_out)[None, :]])  # (conv.24)
            else:  # dense: [W; b^T] row-major is theta's block  (conv.24)
                n_b = w_shape[1]
                idx = pos + np.arange(n_w + (n_b if b_shape else 0)).reshape(-1, n_b)
            out.append(idx)
            pos += n_w + (b_shape[0] if b_shape else 0)
        return out

    def kfac_factors(self, theta, X, y):
        """Compute the K-FAC ingredients per parameter layer: its input and its output error.

        Conv layer: KFACLayer(a=U (M, Q, P), g=Delta (M, C_out, P)), the unfolded input (conv.4)
        and dl_i/dZ_i (conv.6), so dl_i/dWm = Delta_i U_i^T; dense layer: the MLP's (peg.12),
        KFACLayer(a=a_{l-1} (M, n_in), g=dl_i/dz_l (M, n_out)). With the labels y as given
        (sampled labels give the MC Fisher's; nothing random happens here). No ones row: the
        factors of ``kfac_curvature`` append it.

        Parameters
        ----------
        theta : array of shape (D,)
            Flat parameter vector (float64 or float32).
        X : array of shape (M, C, H, W) or (M, C H W)
            Images NCHW, or their rows flattened row-major; M >= 1, theta's dtype.
        y : array of shape (M,) or (M, K)
            Targets: labels (M,) for classification; reals (M,) or (M, K) for the gaussian
            likelihood.

        Returns
        -------
        list of KFACLayer
            One per parameter layer, in theta order.

        Raises
        ------
        ValueError
            If theta, X or y is invalid (see refbayes.models.conv).
        """
        xp, theta, X, y = self._inputs(theta, X, y)
        params, caches, f = self._passes(xp, theta, X)
        errs = _param_layer_errors(xp, self.layers, params, caches, self.likelihood._grad_f(f, y))
        ins = [c[1] if isinstance(layer, Conv2d) else c
               for layer, c in zip(self.layers, caches) if isinstance(layer, _PARAM_TYPES)]
        return [KFACLayer(a, g) for a, g in zip(ins, errs)]  # (conv.25), (peg.12)

    def kfac_curvature(self, theta, X, y, curvature="ggn", approx="expand"):
        """Compute the K-FAC factors (A_l, B_l) of the GGN or empirical Fisher of sum_i l_i.

        Per parameter layer, A_l kron B_l approximates the exact block (conv.25) of
        vec_row_major(W~_l) (``kfac_layout``; for a dense layer theta's own block, as the MLP's
        (peg.13)). Conv layers (Eschenhagen et al. 2023), U~_i the unfolded input with a ones
        row for the bias, E_{i,r} the seeds backpropagated to the layer output::

            expand: A = sum_i U~_i U~_i^T / (M P),  B = sum_{i,r} E_{i,r} E_{i,r}^T       (conv.26)
            reduce: A = sum_i ubar_i ubar_i^T / M,  ubar_i = U~_i 1 / P,
                    B = sum_{i,r} (E_{i,r} 1)(E_{i,r} 1)^T                                (conv.27)

        Dense layers: both are (peg.13) (conv.29). KFC (Grosse & Martens 2016) is expand with
        A times P and B over P (conv.28). Exact only in the cases of (conv.30).

        Parameters
        ----------
        theta : array of shape (D,)
            Flat parameter vector (float64 or float32).
        X : array of shape (M, C, H, W) or (M, C H W)
            Images NCHW, or their rows flattened row-major; M >= 1, theta's dtype.
        y : array of shape (M,) or (M, K)
            Targets: labels (M,) for classification; reals (M,) or (M, K) for the gaussian
            likelihood.
        curvature : {"ggn", "ef"}, default "ggn"
            The curvature whose blocks are factored (exact output-Hessian factor, or the
            gradients at y; pass sampled labels with "ef" for the MC Fisher).
        approx : {"expand", "reduce"}, default "expand"
            The conv-layer approximation; curvlinops' and laplace-torch's default, = KFC.

        Returns
        -------
        list of tuple
            [(A_l (n_a, n_a), B_l (n_b, n_b))] per parameter layer, n_a = Q + bias or
            n_in + bias, n_b = C_out or n_out.

        Raises
        ------
        ValueError
            If theta, X or y is invalid (see refbayes.models.conv), curvature is not "ggn" or
            "ef", or approx is not "expand" or "reduce".
        """
        if curvature not in ("ggn", "ef"):
            raise ValueError(f"curvature: expected 'ggn' or 'ef', got {curvature!r}")
        _check_approx(approx)
        xp, theta, X, y = self._inputs(theta, X, y)
        params, caches, f = self._passes(xp, theta, X)
        Us = _kfac_inputs(xp, self.layers, caches)
        Es = _kfac_errors(self, xp, params, caches, f, y, curvature)
        return [_kfac_pair(xp, U, E, approx) for U, E in zip(Us, Es)]  # (conv.26)-(conv.29)

    def kfac_moments(self, thetas, X, y, curvature=None, y_curv=None, scale=None,
                     approx="expand"):
        """Compute gradients and the draw-averaged K-FAC factors at S parameter vectors.

        g[s] = ``grad(thetas[s], X, y)`` (times c_s); with a curvature, per parameter layer the
        mean over s of ``kfac_curvature``'s factors at thetas[s] (conv.32), with the labels y,
        or y_curv[s] for "ef" when given (the MC Fisher). ``scale`` c (S,) weighs vector s's
        loss by c_s (noise_gamma.2): B's terms by c_s^2 for "ef", c_s for "ggn"; A unchanged.
        A loop over s (conv.23), the MLP's signature (peg.14) plus ``approx``.

        Parameters
        ----------
        thetas : array of shape (S, D)
            S >= 1 parameter vectors (float64 or float32).
        X : array of shape (M, C, H, W) or (M, C H W)
            Images NCHW, or their rows flattened row-major; M >= 1, thetas' dtype.
        y : array of shape (M,) or (M, K)
            Targets of the gradient.
        curvature : {None, "ef", "ggn"}, optional
            Which curvature's factors to return with the gradients.
        y_curv : array of shape (S, M) or (S, M, K), optional
            Per-vector targets of the "ef" factors (refused for any other curvature).
        scale : array of shape (S,), optional
            Per-vector loss weights c_s > 0 (finite, thetas' dtype); None is c_s = 1.
        approx : {"expand", "reduce"}, default "expand"
            As in ``kfac_curvature``.

        Returns
        -------
        g : array of shape (S, D)
            The summed gradients (times c_s).
        factors : list of tuple or None
            [(A_l, B_l)] per parameter layer as (conv.32), or None when curvature is None.

        Raises
        ------
        ValueError
            If thetas, X or y is invalid; curvature is not None, "ef" or "ggn"; y_curv is given
            with another curvature, is not (S, M, ...) or a row does not fit the likelihood;
            scale is not a finite (S,) array > 0 in thetas' dtype; approx is invalid.
        """
        if curvature not in (None, "ef", "ggn"):
            raise ValueError(f"curvature: expected None, 'ef' or 'ggn', got {curvature!r}")
        _check_approx(approx)
        xp, X, y, S = self._inputs_batched(thetas, X, y)
        M = X.shape[0]
        y_curv = check_moment_extras(self.likelihood, self.n_out, thetas, y_curv, scale,
                                     curvature, S, M)
        if y_curv is not None:
            y_curv = y_curv.reshape((S, M) + y_curv.shape[1:])
        gs, sums = [], None
        U0 = _first_unfold(xp, self.layers, X, S)
        for s, th in enumerate(thetas):  # (conv.23)
            c = 1.0 if scale is None else scale[s]
            params, caches, f = self._passes(xp, th, X, U0)
            gs.append(_seeded(xp, self.layers, params, caches, self.likelihood._grad_f(f, y),
                              "sum") * c)  # (conv.8), (noise_gamma.2)
            if curvature is None:
                continue
            yc = y if y_curv is None else y_curv[s]
            Us = _kfac_inputs(xp, self.layers, caches)
            Es = _kfac_errors(self, xp, params, caches, f, yc, curvature, c)
            pairs = [_kfac_pair(xp, U, E, approx) for U, E in zip(Us, Es)]  # (conv.26)-(conv.29)
            sums = pairs if sums is None else [(a + A, b + B) for (a, b), (A, B) in zip(sums, pairs)]
        g = xp.stack(gs)
        if curvature is None:
            return g, None
        return g, [(A / S, B / S) for A, B in sums]  # (conv.32)

    def kfac_block_errors(self, theta, X, y, curvature="ggn", approx="expand"):
        """Compute the relative Frobenius error of K-FAC's A_l kron B_l per parameter layer.

        e_l = ||A_l kron B_l - Y_l||_F / ||Y_l||_F (conv.31), Y_l the exact block (conv.25) of
        vec_row_major(W~_l) (``kfac_layout``) and (A_l, B_l) exactly ``kfac_curvature``'s. Up
        to n_l^2 = 2^22 entries the difference is formed as a matrix; above, from Grams of the
        M R per-(example, seed) gradient rows, with an absolute floor of about sqrt(eps) on
        e_l (conv.31).

        Parameters
        ----------
        theta : array of shape (D,)
            Flat parameter vector (float64 or float32).
        X : array of shape (M, C, H, W) or (M, C H W)
            Images NCHW, or their rows flattened row-major; M >= 1, theta's dtype.
        y : array of shape (M,) or (M, K)
            Targets.
        curvature : {"ggn", "ef"}, default "ggn"
            The curvature whose blocks K-FAC approximates.
        approx : {"expand", "reduce"}, default "expand"
            As in ``kfac_curvature``.

        Returns
        -------
        dict
            "rel_err", "kfac_norm", "exact_norm": arrays (L,) (L parameter layers), theta's
            dtype; rel_err is 0 where both blocks are 0 and inf where only Y_l is.

        Raises
        ------
        ValueError
            If theta, X or y is invalid, curvature is not "ggn" or "ef", or approx is invalid.
        """
        if curvature not in ("ggn", "ef"):
            raise ValueError(f"curvature: expected 'ggn' or 'ef', got {curvature!r}")
        _check_approx(approx)
        xp, theta, X, y = self._inputs(theta, X, y)
        params, caches, f = self._passes(xp, theta, X)
        Us = _kfac_inputs(xp, self.layers, caches)
        Es = _kfac_errors(self, xp, params, caches, f, y, curvature)
        rel, kfac, exact = [], [], []
        for U, E in zip(Us, Es):
            A, B = _kfac_pair(xp, U, E, approx)  # (conv.26)-(conv.29)
            err, kn, ex = _kfac_block_error(xp, U, E, A, B)  # (conv.31)
            rel.append(xp.where(ex > 0, err / xp.where(ex > 0, ex, 1.0),
                                xp.where(err > 0, xp.inf, 0.0)))  # (conv.31)
            kfac.append(kn)
            exact.append(ex)
        dtype = theta.dtype
        return {"rel_err": xp.stack(rel).astype(dtype, copy=False),
                "kfac_norm": xp.stack(kfac).astype(dtype, copy=False),
                "exact_norm": xp.stack(exact).astype(dtype, copy=False)}

    # ---- the last layer ----------------------------------------------------------------------

    def last_layer(self, theta, X):
        """Split the network into its features and its last layer: f(x) = head(phi(x)).

        The last layer must be a Dense: phi(x) is its input (the output of every layer before
        it), and the head is the one-layer model of its W, b with this CNN's likelihood; its
        parameters are theta[D - head.D:], the last entries of the layout (conv.3), in the
        head's own order (W (n_in, n_out) row-major, then b).  (peg.15)

        Parameters
        ----------
        theta : array of shape (D,)
            Flat parameter vector (float64 or float32).
        X : array of shape (M, C, H, W) or (M, C H W)
            Images NCHW, or their rows flattened row-major; M >= 1, theta's dtype.

        Returns
        -------
        head : FlatModel
            The last layer as a model, sizes [n_in, n_out], this CNN's likelihood and the
            Dense's bias.
        phi : array of shape (M, n_in)
            The features at theta.

        Raises
        ------
        ValueError
            If the last layer is not a Dense, or theta or X is invalid (see
            refbayes.models.conv).
        """
        last = self.layers[-1]
        if not isinstance(last, Dense):
            raise ValueError(f"last_layer: the CNN's last layer is {last!r}, not a Dense; the "
                             "last-layer split needs the output to be a Dense of the features")
        xp, theta, X, _ = self._inputs(theta, X, need_y=False)
        caches = self._passes(xp, theta, X)[1]
        head = FlatModel((last.n_in, last.n_out), "tanh", self.likelihood, last.bias)
        return head, caches[-1]  # the Dense's cache is its input a: phi(x)  (peg.15)


def _check_output(shape: tuple, likelihood: str):
    """The last layer gives a (K,) vector with K fitting the likelihood."""
    if len(shape) != 1:
        raise ValueError(f"layers: expected the last layer to output a vector (K,), got shape "
                         f"{shape} (end with Flatten and/or Dense)")
    K = shape[0]
    if likelihood == "bernoulli" and K != 1:
        raise ValueError(f"layers: expected K == 1 output for the bernoulli likelihood, got {K}")
    if likelihood == "categorical" and K < 2:
        raise ValueError(f"layers: expected K >= 2 outputs for the categorical likelihood, got {K}")


def tiny_cnn(likelihood: str = "categorical", n_out: int = 3, noise_precision: float = 1.0) -> CNN:
    """Build the tiny CNN of the tests and traces: 1x6x6 -> conv 3x3 (2) -> relu -> maxpool 2 -> dense.

    Conv2d(1, 2, 3) (-> 2x4x4), relu, MaxPool2d(2) (-> 2x2x2), Flatten (8), Dense(8, n_out);
    D = 20 + 9 n_out (47 for three classes). See derivations/conv.md.

    Parameters
    ----------
    likelihood : {"gaussian", "bernoulli", "categorical"}, default "categorical"
        The likelihood on the n_out outputs.
    n_out : int, default 3
        The number K of outputs (1 for bernoulli).
    noise_precision : float, default 1.0
        The gaussian likelihood's noise precision tau > 0.

    Returns
    -------
    CNN
        The model, input_shape (1, 6, 6).

    Raises
    ------
    ValueError
        If the arguments are invalid (see CNN).
    """
    layers = [Conv2d(1, 2, 3), Activation("relu"), MaxPool2d(2), Flatten(),
              Dense(8, check_int(n_out, "n_out", low=1))]
    return CNN((1, 6, 6), layers, likelihood, noise_precision)


def lenet5(n_classes: int = 10, input_shape=(3, 32, 32)) -> CNN:
    """Build the LeNet-5 of Osawa et al. (2019), their code's ``LeNet5`` (categorical).

    conv 5x5 (6) -> relu -> maxpool 2 -> conv 5x5 (16) -> relu -> maxpool 2 -> flatten ->
    dense 120 -> relu -> dense 84 -> relu -> dense n_classes; D = 62006 for 3x32x32 and ten
    classes. Source: team-approx-bayes/dl-with-bayes, classification/models/lenet.py at commit
    392cbb44fb5e440dc893b87ca701eadbcf208fc8 (derivations/conv.md).

    Parameters
    ----------
    n_classes : int, default 10
        The number of classes K >= 2 (10 for CIFAR-10).
    input_shape : tuple of int, default (3, 32, 32)
        (C, H, W); their CIFAR-10 net is 3x32x32 (1x28x28 MNIST: pass (1, 28, 28); the flatten
        width follows the input).

    Returns
    -------
    CNN
        The model.

    Raises
    ------
    ValueError
        If n_classes < 2 or the input is too small for two 5x5 conv and 2x2 pool stages.
    """
    n_classes = check_int(n_classes, "n_classes", low=2)
    if not isinstance(input_shape, (tuple, list)) or len(input_shape) != 3:
        raise ValueError(f"input_shape: expected (C, H, W), got {input_shape!r}")
    input_shape = tuple(check_int(n, "input_shape", low=1) for n in input_shape)
    convs = [Conv2d(input_shape[0], 6, 5), Activation("relu"), MaxPool2d(2),
             Conv2d(6, 16, 5), Activation("relu"), MaxPool2d(2), Flatten()]
    n_flat = _chain_shapes(input_shape, tuple(convs))[-1][0]
    dense = [Dense(n_flat, 120), Activation("relu"), Dense(120, 84), Activation("relu"),
             Dense(84, n_classes)]
    return CNN(input_shape, convs + dense, "categorical")
