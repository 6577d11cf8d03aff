"""Convolution and pooling kernels on NCHW arrays: unfold, fold, the products, their backward passes.

Implements (conv.1) and (conv.4)-(conv.9), (conv.11)-(conv.14) and the R-operator's conv blocks
(conv.36) of derivations/conv.md. Symbols: x (M, C, H, W) a
layer input; Wc (C_out, C_in, k_h, k_w) the conv weight, Wm = Wc.reshape(C_out, Q) with
Q = C_in k_h k_w; U (M, Q, P) the unfolded padded input, P = H_o W_o; Z (M, C_out, H_o, W_o);
Delta (M, C_out, P) the error at a conv output; windows (M, C, k_h k_w, H_o, W_o) the pooling
patches, window entry q = u k_w + v (row-major).

On NumPy arrays, ``fold``, ``max_pool``'s window argmax and ``max_pool_backward`` run as numba
loops (about 2x faster than the strided slice adds and the window copy + argmax they replace at
LeNet-5's sizes), and ``unfold`` is one copy of a sliding-window view (a numba loop was slower,
measured): the same values, to the bit, with fold's additions in the same order
(derivations/conv_experiments.md); max_pool's y is the winner itself, which the slice code's
sum of P times the one-hot equals for finite inputs (an inf elsewhere in the window makes that
sum NaN, and the sign of a zero winner may differ).

Everything here is unchecked. The forward functions take ``ns`` (numpy, cupy or autograd.numpy:
strided slices, stack, pad, matmul and argmax only); the backward functions take ``xp`` (numpy or
cupy) and write into fresh arrays, except ``conv_rows_into``, which writes into the caller's.
"""
from __future__ import annotations

import numba
import numpy as np

__all__ = ["out_size", "pad", "windows", "unfold", "fold", "conv_forward", "conv_unfold", "conv_grads", "conv_rows_into",
           "conv_backward_input", "max_pool", "max_pool_backward", "avg_pool",
           "avg_pool_backward", "conv_r_grads"]


@numba.njit(cache=True)
def _fold_kernel(V, kh, kw, sh, sw, out):
    """out[i, c, sh h_o + u, sw w_o + v] += V[i, c, u kw + v, h_o, w_o], offsets (u, v) in
    ``fold``'s order, so every entry sums its terms in the same order. (conv.9)"""
    M, C, _, Ho, Wo = V.shape
    for i in range(M):
        for c in range(C):
            for u in range(kh):
                for v in range(kw):
                    q = u * kw + v
                    for h in range(Ho):
                        for w in range(Wo):
                            out[i, c, sh * h + u, sw * w + v] += V[i, c, q, h, w]


@numba.njit(cache=True)
def _pool_route_kernel(onehot, dy, kh, kw, sh, sw, out):
    """``_fold_kernel`` of V = onehot * dy[:, :, None] without forming V: the same products,
    added in the same order. (conv.12)"""
    M, C, _, Ho, Wo = onehot.shape
    for i in range(M):
        for c in range(C):
            for u in range(kh):
                for v in range(kw):
                    q = u * kw + v
                    for h in range(Ho):
                        for w in range(Wo):
                            out[i, c, sh * h + u, sw * w + v] += onehot[i, c, q, h, w] * dy[i, c, h, w]


@numba.njit(cache=True)
def _window_argmax_kernel(x, kh, kw, sh, sw, q_star, y):
    """q_star: the first maximum of each window in row-major order (NaN first, as np.argmax), y
    its value. (conv.11)"""
    M, C, Ho, Wo = y.shape
    for i in range(M):
        for c in range(C):
            for h in range(Ho):
                for w in range(Wo):
                    best = x[i, c, sh * h, sw * w]
                    bq = 0
                    for u in range(kh):
                        for v in range(kw):
                            val = x[i, c, sh * h + u, sw * w + v]
                            if best == best and (val > best or val != val):
                                best = val
                                bq = u * kw + v
                    q_star[i, c, h, w] = bq
                    y[i, c, h, w] = best


def out_size(n: int, k: int, s: int, p: int) -> int:
    """floor((n + 2 p - k) / s) + 1, the output length of a window k, stride s, padding p. (conv.1)"""
    return (n + 2 * p - k) // s + 1  # (conv.1)


def pad(ns, x, ph: int, pw: int):
    """x zero-padded by ph rows on top and bottom and pw columns left and right."""
    if ph == 0 and pw == 0:
        return x
    # mode positional: autograd's vjp of pad takes it as an argument, not a keyword
    return ns.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), "constant")


def windows(ns, x, kh: int, kw: int, sh: int, sw: int):
    """(M, C, kh kw, H_o, W_o): entry q = u kw + v at (h_o, w_o) is x[:, :, sh h_o + u, sw w_o + v]. (conv.4)

    One strided slice per window offset (u, v), stacked: no index arrays, so autograd
    differentiates it as slices.
    """
    Ho, Wo = out_size(x.shape[2], kh, sh, 0), out_size(x.shape[3], kw, sw, 0)
    return ns.stack([x[:, :, u:u + sh * (Ho - 1) + 1:sh, v:v + sw * (Wo - 1) + 1:sw]
                     for u in range(kh) for v in range(kw)], axis=2)  # (conv.4)


def unfold(ns, xp_pad, kh: int, kw: int, sh: int, sw: int):
    """U (M, Q, P) of the padded input: U[i, (c, u, v), (h_o, w_o)] = xp_pad[i, c, sh h_o + u, sw w_o + v]. (conv.4)

    Rows (c, u, v) in row-major order, Wm's column order; torch's ``nn.functional.unfold``.
    """
    if ns is np:  # the same entries, one strided copy (not kh kw slice copies and a stack)
        M, C, H, W = xp_pad.shape
        Ho, Wo = out_size(H, kh, sh, 0), out_size(W, kw, sw, 0)
        V = np.lib.stride_tricks.sliding_window_view(xp_pad, (kh, kw), axis=(2, 3))[:, :, ::sh, ::sw]
        return np.ascontiguousarray(V.transpose(0, 1, 4, 5, 2, 3).reshape(M, C * kh * kw, Ho * Wo))  # (conv.4)
    P = windows(ns, xp_pad, kh, kw, sh, sw)
    M, C, KK, Ho, Wo = P.shape
    return P.reshape(M, C * KK, Ho * Wo)  # (conv.4)


def fold(xp, V, shape, kh: int, kw: int, sh: int, sw: int):
    """The transpose of ``windows``: (M, C, H, W) with each window entry added where it was read. (conv.9)

    out[:, c, sh h_o + u, sw w_o + v] += V[:, c, u kw + v, h_o, w_o]; one strided slice-add per
    window offset (u, v), so overlapping windows (stride < kernel) sum, no scatter needed.
    """
    out = xp.zeros(shape, dtype=V.dtype)
    if xp is np:  # the same adds in the same order, as a numba loop
        _fold_kernel(V, kh, kw, sh, sw, out)  # (conv.9)
        return out
    Ho, Wo = V.shape[3], V.shape[4]
    for u in range(kh):
        for v in range(kw):
            out[:, :, u:u + sh * (Ho - 1) + 1:sh, v:v + sw * (Wo - 1) + 1:sw] += V[:, :, u * kw + v]  # (conv.9)
    return out


def conv_forward(ns, x, Wc, b, stride, padding, U=None):
    """(U (M, Q, P), Z (M, C_out, H_o, W_o)): Z_i = Wm U_i + b 1^T, a cross-correlation. (conv.5)

    ``U``, if given, is x's unfolded input (``conv_unfold(ns, x, Wc.shape[2:], stride,
    padding)``, e.g. formed once for S parameter vectors on the same batch) and is used as is."""
    (kh, kw), (sh, sw), (ph, pw) = Wc.shape[2:], stride, padding
    M, Cout = x.shape[0], Wc.shape[0]
    if U is None:
        U = conv_unfold(ns, x, (kh, kw), stride, padding)
    Ho, Wo = out_size(x.shape[2], kh, sh, ph), out_size(x.shape[3], kw, sw, pw)
    Z = Wc.reshape(Cout, -1) @ U  # (conv.5): (C_out, Q) @ (M, Q, P) -> (M, C_out, P)
    if b is not None and ns is np:
        Z += b[:, None]  # (conv.5): in place (Z is fresh; autograd's arrays take the line below)
    elif b is not None:
        Z = Z + b[:, None]  # (conv.5)
    return U, Z.reshape(M, Cout, Ho, Wo)


def conv_unfold(ns, x, kernel, stride, padding):
    """U (M, Q, P): the padded input x unfolded for a kernel (k_h, k_w) (conv.4)."""
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    return unfold(ns, pad(ns, x, ph, pw), kh, kw, sh, sw)  # (conv.4)


def conv_grads(xp, U, Delta, bias: bool, mode: str):
    """The conv layer's gradient blocks: per-example rows, their sum, or their sum of squares.

    mode "rows": dl_i/dWm = Delta_i U_i^T (M, C_out Q) and dl_i/db = Delta_i 1 (M, C_out)
    (conv.6)-(conv.7); "sum": their sums over i (C_out Q,), (C_out,) (conv.8); "sum_sq": the sums
    of their squares (conv.10); "sum+sum_sq": the pair (sum blocks, sum_sq blocks) from one set
    of products, each to the bit what its own mode gives. Delta is (M, C_out, P); the weight
    block comes back row-major, theta's order (conv.2).
    """
    M = U.shape[0]
    # the M products (C_out, P) @ (P, Q): tensordot over (i, position) for the sum transposes U
    # into a copy first, ~50x slower here (M = 128, LeNet-5's first layer)
    P = Delta @ xp.swapaxes(U, 1, 2)  # (conv.6)
    if mode in ("sum", "sum+sum_sq"):
        sums = [P.sum(axis=0).reshape(-1)]  # (conv.8)
        sums = sums + [Delta.sum(axis=(0, 2))] if bias else sums  # (conv.8)
        if mode == "sum":
            return sums
    dW = P.reshape(M, -1)  # (conv.6)
    db = Delta.sum(axis=2) if bias else None  # (conv.7)
    if mode == "rows":
        return [dW] if db is None else [dW, db]
    # the square of a sum over positions: (conv.10) needs the rows of this layer (not of all D)
    sq = [(dW * dW).sum(axis=0)]  # (conv.10)
    sq = sq if db is None else sq + [(db * db).sum(axis=0)]  # (conv.10)
    return (sums, sq) if mode == "sum+sum_sq" else sq


def conv_rows_into(xp, U, Delta, out_w, out_b):
    """``conv_grads``' "rows" written in place: out_w (M, C_out, Q) <- Delta_i U_i^T, out_b (M, C_out) <- Delta_i 1. (conv.6)-(conv.7)

    out_w and out_b are views of the caller's (M, D) rows (row stride D, unit last stride, so each
    of the M products is one BLAS GEMM straight into its columns); out_b None for no bias. The
    values are ``conv_grads``' to the bit: the same products and sums, no copy after.
    """
    xp.matmul(Delta, xp.swapaxes(U, 1, 2), out=out_w)  # (conv.6)
    if out_b is not None:
        xp.sum(Delta, axis=2, out=out_b)  # (conv.7)


def conv_backward_input(xp, Wc, Delta, x_shape, stride, padding):
    """dl_i/dx_i (M, C, H, W): fold(Wm^T Delta_i) with the padding cropped off. (conv.9)"""
    M, C, H, W = x_shape
    (kh, kw), (sh, sw), (ph, pw) = Wc.shape[2:], stride, padding
    Ho, Wo = out_size(H, kh, sh, ph), out_size(W, kw, sw, pw)
    dU = xp.swapaxes(Wc.reshape(Wc.shape[0], -1), 0, 1) @ Delta  # (conv.9): Wm^T Delta_i, (M, Q, P)
    dxp = fold(xp, dU.reshape(M, C, kh * kw, Ho, Wo), (M, C, H + 2 * ph, W + 2 * pw),
               kh, kw, sh, sw)  # (conv.9)
    return dxp[:, :, ph:ph + H, pw:pw + W]  # (conv.9): crop the padding


def max_pool(ns, x, kernel, stride):
    """(onehot (M, C, kh kw, H_o, W_o) bool, y (M, C, H_o, W_o)): the window max, first index on ties. (conv.11)

    y = sum_q 1[q = q*] P[:, :, q]: q* from argmax (NumPy's and CuPy's argmax return the first
    maximum, torch's tie rule), a constant to autograd, so autograd's gradient is (conv.12).
    """
    (kh, kw), (sh, sw) = kernel, stride
    if ns is np:  # argmax and its value in one numba loop (no window copy)
        M, C, H, W = x.shape
        q_star = np.empty((M, C, out_size(H, kh, sh, 0), out_size(W, kw, sw, 0)), np.intp)
        y = np.empty(q_star.shape, x.dtype)
        _window_argmax_kernel(x, kh, kw, sh, sw, q_star, y)  # (conv.11)
        return q_star[:, :, None] == np.arange(kh * kw)[:, None, None], y
    P = windows(ns, x, kh, kw, sh, sw)
    q_star = ns.argmax(P, axis=2)  # (conv.11): the first maximum in row-major window order
    onehot = q_star[:, :, None] == ns.arange(P.shape[2])[:, None, None]
    return onehot, ns.sum(P * onehot, axis=2)  # (conv.11)


def max_pool_backward(xp, onehot, dy, x_shape, kernel, stride):
    """dl/dx (M, C, H, W): each output error routed to its window's winner, then folded. (conv.12)"""
    if xp is np:  # fold of onehot * dy in one numba loop, no (M, C, kh kw, H_o, W_o) product
        out = np.zeros(x_shape, dtype=dy.dtype)
        _pool_route_kernel(onehot, dy, kernel[0], kernel[1], stride[0], stride[1], out)  # (conv.12)
        return out
    V = onehot * dy[:, :, None]  # (conv.12)
    return fold(xp, V, x_shape, kernel[0], kernel[1], stride[0], stride[1])  # (conv.12)


def avg_pool(ns, x, kernel, stride):
    """y (M, C, H_o, W_o): the window mean (1 / (kh kw)) sum_q P[:, :, q], no padding. (conv.13)"""
    P = windows(ns, x, kernel[0], kernel[1], stride[0], stride[1])
    return ns.sum(P, axis=2) / (kernel[0] * kernel[1])  # (conv.13)


def avg_pool_backward(xp, dy, x_shape, kernel, stride):
    """dl/dx (M, C, H, W): fold of dy / (kh kw) at every window entry. (conv.14)"""
    KK = kernel[0] * kernel[1]
    V = xp.broadcast_to((dy / KK)[:, :, None], dy.shape[:2] + (KK,) + dy.shape[2:])  # (conv.14)
    return fold(xp, V, x_shape, kernel[0], kernel[1], stride[0], stride[1])  # (conv.14)


def conv_r_grads(xp, U, rU, Delta, rDelta, bias: bool):
    """The conv layer's blocks of H v: sum_i (R{Delta_i} U_i^T + Delta_i R{U_i}^T) and sum_i R{Delta_i} 1. (conv.36)

    U, rU (M, Q, P) the unfolded input and its R-forward value (rU None where R{x} = 0); Delta,
    rDelta (M, C_out, P) the error at the layer output and its R-backward value. The weight block
    comes back row-major, theta's order (conv.2), as ``conv_grads``'s "sum" mode.
    """
    W = rDelta @ xp.swapaxes(U, 1, 2)  # (conv.36): R{Delta_i} U_i^T, (M, C_out, Q)
    if rU is not None:
        W = W + Delta @ xp.swapaxes(rU, 1, 2)  # (conv.36): Delta_i R{U_i}^T
    blocks = [W.sum(axis=0).reshape(-1)]  # (conv.36)
    return blocks + [rDelta.sum(axis=(0, 2))] if bias else blocks  # (conv.36)
