"""Dense-layer machinery shared by every flat-theta model: layout, forward pass, backprop.

Implements (peg.1)-(peg.6), the layer forms (peg.10)-(peg.11) and the R-operator passes
(peg.22)-(peg.26) of
derivations/per_example_gradients.md. Symbols: a_{l-1} (M, n_{l-1}) the layer-l input
(a_0 = X), z_l = a_{l-1} W_l + b_l, a_l = act(z_l) for hidden layers, f = z_L (M, K);
delta_l = dl_i/dz_l (M, [R,] n_l) the backpropagated error, with an optional axis R of seeds.

Everything here is unchecked and backend-generic: ``ns`` may be numpy, cupy or autograd.numpy.
Layers without a bias (linear models without an intercept) carry ``b = None``.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

__all__ = ["ACTIVATIONS", "Layout", "layout", "unflatten", "activate", "act_prime",
           "forward", "backward", "check_out", "per_example_blocks", "summed_blocks", "sum_sq_blocks",
           "unflatten_batched", "forward_batched", "backward_batched", "summed_blocks_batched",
           "sum_sq_blocks_batched", "act_second", "r_forward", "r_backward", "r_blocks"]

ACTIVATIONS = ("relu", "tanh", "sigmoid")


class Layout(NamedTuple):
    """Where each layer's parameters sit in theta (row-major W_l, then b_l)."""
    w_off: tuple   # start of W_l, one per layer
    b_off: tuple   # start of b_l, or -1 when the model has no bias
    D: int         # len(theta)


@functools.lru_cache(maxsize=None)
def layout(sizes: tuple, bias: bool) -> Layout:
    """Return where each layer's W_l and b_l sit in theta (``refbayes.models.theta_layout``).

    Parameters
    ----------
    sizes : tuple of int
        Layer widths (n_0, ..., n_L), n_0 the input width.
    bias : bool
        Whether every layer has a bias b_l.

    Returns
    -------
    Layout
        ``w_off[l]`` the start of W_l (n_{l-1} * n_l entries, row-major), ``b_off[l]`` that of
        b_l (-1 without a bias), ``D`` the length of theta.
    """
    w_off, b_off, pos = [], [], 0
    for n_in, n_out in zip(sizes[:-1], sizes[1:]):
        w_off.append(pos)
        pos += n_in * n_out
        b_off.append(pos if bias else -1)
        pos += n_out if bias else 0
    return Layout(tuple(w_off), tuple(b_off), pos)


def unflatten(theta, sizes, bias):
    """Return the layers' (W_l, b_l) as views into theta (``refbayes.models.unflatten_theta``).

    Unchecked and backend-generic: any 1-D array of length ``layout(sizes, bias).D`` works,
    integer positions included (``refbayes.layout`` maps ``arange(D)`` to build permutations).

    Parameters
    ----------
    theta : array of shape (D,)
        The flat parameter vector.
    sizes : sequence of int
        Layer widths (n_0, ..., n_L).
    bias : bool
        Whether every layer has a bias b_l.

    Returns
    -------
    list of tuple
        One ``(W_l, b_l)`` per layer: W_l of shape (n_{l-1}, n_l), b_l of shape (n_l,) or None.
    """
    lay = layout(tuple(sizes), bias)
    params = []
    for l, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        w0, b0 = lay.w_off[l], lay.b_off[l]
        W = theta[w0:w0 + n_in * n_out].reshape(n_in, n_out)
        params.append((W, theta[b0:b0 + n_out] if bias else None))
    return params


def activate(ns, z, activation):
    """act(z): relu(z) = z 1[z > 0], tanh, sigmoid = (1 + tanh(z/2)) / 2 (overflow-free)."""
    if activation == "relu":
        # z * 1[z > 0] has derivative 1[z > 0] under autograd too, i.e. relu'(0) = 0  (peg.5)
        return z * (z > 0)
    if activation == "tanh":
        return ns.tanh(z)
    return 0.5 * (ns.tanh(0.5 * z) + 1.0)


def act_prime(a, activation):
    """act'(z_l) written through the output a_l = act(z_l). (peg.5)

    relu: 1[a > 0] (= 1[z > 0], so relu'(0) = 0); tanh: 1 - a^2; sigmoid: a (1 - a).
    """
    if activation == "relu":
        return (a > 0).astype(a.dtype)  # (peg.5)
    if activation == "tanh":
        return 1.0 - a * a  # (peg.5)
    return a * (1.0 - a)  # (peg.5)


def act_second(a, activation):
    """act''(z_l) written through the output a_l = act(z_l). (peg.26)

    relu: 0 (also at the kink, as relu'(0) = 0 makes 1[z > 0] flat there); tanh: -2 a (1 - a^2);
    sigmoid: a (1 - a) (1 - 2 a).
    """
    if activation == "relu":
        return None  # the act'' term of (peg.24) vanishes
    if activation == "tanh":
        return -2.0 * a * (1.0 - a * a)  # (peg.26)
    return a * (1.0 - a) * (1.0 - 2.0 * a)  # (peg.26)


def forward(ns, params, X, activation):
    """Inputs of every layer [a_0 = X, a_1, ..., a_{L-1}] and the output f = z_L. (peg.1)"""
    acts = [X]
    a = X
    for l, (W, b) in enumerate(params):
        z = a @ W if b is None else a @ W + b  # (peg.1)
        if l == len(params) - 1:
            return acts, z
        a = activate(ns, z, activation)  # (peg.1)
        acts.append(a)


def backward(params, acts, seed, activation):
    """[delta_1, ..., delta_L] from delta_L = seed (M, [R,] K). (peg.2)-(peg.3)

    delta_l = (delta_{l+1} W_{l+1}^T) * act'(z_l); a seed axis R (between M and the units) is
    carried along, with act' broadcast over it.
    """
    deltas = [seed]  # (peg.2)
    for l in range(len(params) - 1, 0, -1):
        W_next = params[l][0]
        ap = act_prime(acts[l], activation)
        if seed.ndim == 3:
            ap = ap[:, None, :]
        deltas.append((deltas[-1] @ W_next.T) * ap)  # (peg.3)
    return deltas[::-1]


def r_forward(params, dparams, acts, activation):
    """The R pass beside (peg.1) along v = (V_l, c_l): (R{z}, R{a}, R{f}).  (peg.22)

    R{z_l} = R{a_{l-1}} W_l + a_{l-1} V_l + c_l with R{a_0} = 0 and R{a_l} = act'(z_l) * R{z_l};
    the lists hold the hidden layers' R{z_l} and R{a_l} (l = 1 .. L-1), and R{f} = R{z_L} is J v.
    """
    r_zs, r_as = [], []
    for l, ((W, _), (V, c)) in enumerate(zip(params, dparams)):
        r_z = acts[l] @ V  # (peg.22)
        if r_as:
            r_z += r_as[-1] @ W  # (peg.22)
        if c is not None:
            r_z += c
        if l == len(params) - 1:
            return r_zs, r_as, r_z
        r_zs.append(r_z)
        r_as.append(act_prime(acts[l + 1], activation) * r_z)  # (peg.22)


def r_backward(params, dparams, acts, deltas, r_zs, r_seed, activation):
    """[R{delta_1}, ..., R{delta_L}] from R{delta_L} = r_seed (M, K), beside (peg.3). (peg.24)

    R{delta_l} = (R{delta_{l+1}} W_{l+1}^T + delta_{l+1} V_{l+1}^T) * act'(z_l)
    + (delta_{l+1} W_{l+1}^T) * act''(z_l) * R{z_l}; deltas are those of (peg.3), unseeded axis.
    """
    r_deltas = [r_seed]
    for l in range(len(params) - 1, 0, -1):
        W_next, V_next = params[l][0], dparams[l][0]
        a = acts[l]
        r_d = r_deltas[-1] @ W_next.T + deltas[l] @ V_next.T  # (peg.24)
        r_d *= act_prime(a, activation)  # (peg.24)
        second = act_second(a, activation)
        if second is not None:  # relu: act'' = 0
            r_d += (deltas[l] @ W_next.T) * second * r_zs[l - 1]  # (peg.24)
        r_deltas.append(r_d)
    return r_deltas[::-1]


def r_blocks(xp, acts, deltas, r_as, r_deltas, bias):
    """H v (D,): R{a_{l-1}}^T Delta_l + A_{l-1}^T R{Delta_l} and 1^T R{Delta_l} per layer. (peg.25)"""
    blocks = []
    for l, (a, d, r_d) in enumerate(zip(acts, deltas, r_deltas)):
        w = a.T @ r_d  # (peg.25)
        if l > 0:  # R{a_0} = 0
            w += r_as[l - 1].T @ d  # (peg.25)
        blocks.append(w.reshape(-1))
        if bias:
            blocks.append(r_d.sum(axis=0))  # (peg.25)
    return xp.concatenate(blocks)


def check_out(out, xp, dtype, shape):
    """Check a caller's output buffer for per-example gradients; ValueError naming ``out``.

    ``out`` must be an array of backend ``xp`` (NumPy or CuPy), of ``dtype``, of exactly
    ``shape`` and C-contiguous (a row slice of a C-contiguous 2-d array qualifies): the results
    are written into it, so no silent copy or broadcast is possible. Returns ``out``.
    """
    expected = (f"a C-contiguous {'NumPy' if xp is np else 'CuPy'} array of "
                f"dtype {xp.dtype(dtype).name} and shape {tuple(shape)}")
    if not isinstance(out, xp.ndarray):
        raise ValueError(f"out: expected {expected}, got {type(out).__module__}."
                         f"{type(out).__name__}")
    if out.dtype != dtype or tuple(out.shape) != tuple(shape) or not out.flags.c_contiguous:
        layout = "C-contiguous" if out.flags.c_contiguous else "not C-contiguous"
        raise ValueError(f"out: expected {expected}, got dtype {out.dtype.name}, shape "
                         f"{tuple(out.shape)}, {layout}")
    if not getattr(out.flags, "writeable", True):  # NumPy's read-only arrays (CuPy has none)
        raise ValueError(f"out: expected {expected}, writeable; got a read-only array")
    return out


def per_example_blocks(xp, acts, deltas, bias, out=None):
    """Per-example (per-seed) gradients (M, [R,] D): rows vec(a_{l-1,i} delta_{l,i}^T), delta_{l,i}. (peg.4)

    Each outer product is a broadcast product written into its slice of one preallocated output,
    so the only large allocation is the result itself (freshly mapped temporaries of a few MB
    cost more than the arithmetic here), and no einsum with an ellipsis, which takes NumPy's
    slow generic path. ``out`` (C-contiguous, of the result's shape and dtype, checked by the
    caller) receives the rows instead of a fresh array: the same products, bit for bit.
    """
    lead = deltas[0].shape[:-1]  # (M,) or (M, R) with seeds
    D = sum((a.shape[-1] + bias) * d.shape[-1] for a, d in zip(acts, deltas))
    G = xp.empty(lead + (D,), dtype=deltas[-1].dtype) if out is None else out
    off = 0
    for a, d in zip(acts, deltas):
        n_in, n_out = a.shape[-1], d.shape[-1]
        a_b = a.reshape((a.shape[0],) + (1,) * (len(lead) - 1) + (n_in, 1))
        block = G[..., off:off + n_in * n_out].reshape(lead + (n_in, n_out))
        if not xp.may_share_memory(block, G):  # splitting the unit-stride last axis must give a view
            raise RuntimeError("per_example_blocks: reshape returned a copy; results would be lost")
        xp.multiply(a_b, d[..., None, :], out=block)  # (peg.4)
        off += n_in * n_out
        if bias:
            G[..., off:off + n_out] = d  # (peg.4)
            off += n_out
    return G


def summed_blocks(xp, acts, deltas, bias):
    """sum_i g_i (D,) without forming the rows: a_{l-1}^T delta_l and 1^T delta_l per layer. (peg.6)"""
    blocks = []
    for a, d in zip(acts, deltas):
        blocks.append((a.T @ d).reshape(-1))  # (peg.6)
        if bias:
            blocks.append(d.sum(axis=0))
    return xp.concatenate(blocks)


def sum_sq_blocks(xp, acts, e, bias):
    """sum_i of squared per-example rows (D,): (a_{l-1}^2)^T e_l, 1^T e_l, with e_l (M, n_l). (peg.10)-(peg.11)

    e_l is delta_l^2 for the empirical Fisher and sum_r delta_{l,r}^2 for the GGN factor seeds;
    valid because (a_p d_q)^2 = a_p^2 d_q^2 separates.
    """
    blocks = []
    for a, el in zip(acts, e):
        blocks.append(((a * a).T @ el).reshape(-1))  # (peg.10)
        if bias:
            blocks.append(el.sum(axis=0))
    return xp.concatenate(blocks)


# ----------------------------------------------------------------------------- S parameter vectors at once

def unflatten_batched(thetas, sizes, bias):
    """[(W_l (S, n_{l-1}, n_l), b_l (S, 1, n_l) or None)] for thetas (S, D), views of each row's
    slices, so one batched matmul per layer serves all S vectors."""
    lay = layout(tuple(sizes), bias)
    S = thetas.shape[0]
    params = []
    for l, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        w0, b0 = lay.w_off[l], lay.b_off[l]
        W = thetas[:, w0:w0 + n_in * n_out].reshape(S, n_in, n_out)
        params.append((W, thetas[:, None, b0:b0 + n_out] if bias else None))
    return params


def forward_batched(ns, params, X, activation):
    """(peg.1) for S parameter vectors: inputs [a_0 = X (M, n_0), a_1 (S, M, n_1), ...] and
    f (S, M, K); X @ W_1 broadcasts the shared inputs against the S first-layer weights."""
    acts = [X]
    a = X
    for l, (W, b) in enumerate(params):
        z = a @ W
        if b is not None:
            z += b  # (peg.1), in place: z is a fresh (S, M, n_l) array
        if l == len(params) - 1:
            return acts, z
        # relu in place as max(z, 0) (relu'(0) = 0 still holds: act_prime reads 1[a > 0])
        a = ns.maximum(z, 0.0, out=z) if activation == "relu" else activate(ns, z, activation)  # (peg.1)
        acts.append(a)


def backward_batched(xp, params, acts, seed, activation):
    """(peg.2)-(peg.3) for S parameter vectors: [delta_1, ..., delta_L], each (S, M, n_l), from
    delta_L = seed (S, M, K)."""
    deltas = [seed]  # (peg.2)
    for l in range(len(params) - 1, 0, -1):
        W_next = params[l][0]
        W_T = xp.swapaxes(W_next, 1, 2)
        # one output unit: the product is an outer product, which broadcasting does ~3x faster
        # than NumPy's batched matmul with an inner dimension of 1
        d = deltas[-1] * W_T if W_T.shape[1] == 1 else deltas[-1] @ W_T
        # relu' = 1[a > 0] multiplies as a boolean mask, without a float copy of it
        d *= (acts[l] > 0) if activation == "relu" else act_prime(acts[l], activation)  # (peg.3)
        deltas.append(d)
    return deltas[::-1]


def _blocks_batched(xp, acts, e, bias, square):
    """(S, D) rows: per layer sum_i a_i (x) e_i (square=False) or sum_i a_i^2 (x) e_i, then 1^T e.

    On NumPy each block's product is written into its slice of one preallocated (S, D) output
    (the same products as separate blocks concatenated, bit for bit, without the blocks' fresh
    memory and the copy); other backends (CuPy: matmul into a strided slice untested there)
    concatenate the blocks.
    """
    S, M = e[0].shape[:2]
    if getattr(xp, "__name__", "") != "numpy":
        return _blocks_concatenated(xp, acts, e, bias, square)
    D = sum((a.shape[-1] + bias) * el.shape[-1] for a, el in zip(acts, e))
    out = xp.empty((S, D), dtype=e[0].dtype)
    ones = xp.ones(M, dtype=e[0].dtype)
    off = 0
    for a, el in zip(acts, e):
        n_in, n_out = a.shape[-1], el.shape[-1]
        a = a * a if square else a
        block = out[:, off:off + n_in * n_out].reshape(S, n_in, n_out)
        if not xp.may_share_memory(block, out):  # splitting the unit-stride last axis must give a view
            raise RuntimeError("_blocks_batched: reshape returned a copy; results would be lost")
        xp.matmul(xp.swapaxes(a, -1, -2), el, out=block)  # (peg.6) / (peg.10)
        off += n_in * n_out
        if bias:
            # 1^T e as a product: 3-4x faster than a sum over the middle axis of (S, M, n)
            xp.matmul(ones, el, out=out[:, off:off + n_out])  # (peg.6) / (peg.10): the bias block
            off += n_out
    return out


def _blocks_concatenated(xp, acts, e, bias, square):
    """``_blocks_batched`` as separate blocks, concatenated (the non-NumPy backends)."""
    S, M = e[0].shape[:2]
    ones = xp.ones(M, dtype=e[0].dtype)
    blocks = []
    for a, el in zip(acts, e):
        a = a * a if square else a
        blocks.append((xp.swapaxes(a, -1, -2) @ el).reshape(S, -1))  # (peg.6) / (peg.10)
        if bias:
            # 1^T e as a product: 3-4x faster than a sum over the middle axis of (S, M, n)
            blocks.append(ones @ el)  # (peg.6) / (peg.10): the bias block
    return xp.concatenate(blocks, axis=1)


def summed_blocks_batched(xp, acts, deltas, bias):
    """(peg.6) for S parameter vectors: (S, D), row s = sum_i g_i(theta_s)."""
    return _blocks_batched(xp, acts, deltas, bias, square=False)


def sum_sq_blocks_batched(xp, acts, e, bias):
    """(peg.10)-(peg.11) for S parameter vectors: (S, D) from e_l (S, M, n_l)."""
    return _blocks_batched(xp, acts, e, bias, square=True)
