"""The K-FAC methods of FlatModel: the per-layer K-FAC ingredients and factors, their average
over S parameter vectors, and K-FAC's error against the exact curvature blocks.

Implements (peg.12), (peg.13), (peg.16) and (peg.14) of derivations/per_example_gradients.md, in
the symbols and shapes of refbayes.models.base. As in refbayes.models._curvature, each public
function here is a method of FlatModel (its first argument ``self`` is the model), bound by name
in FlatModel's class body (``FlatModel.kfac_moments`` is this ``kfac_moments``). The inputs are
validated as the FlatModel docstring states.
"""
from __future__ import annotations

from typing import NamedTuple

from refbayes._checks import check_array, check_positive_vector
from refbayes.backend import xp_of
from refbayes.models import _layers
from refbayes.models._curvature import _ggn_column_passes

__all__ = ["KFACLayer", "check_moment_extras", "kfac_block_errors", "kfac_curvature",
           "kfac_factors", "kfac_moments"]


class KFACLayer(NamedTuple):
    """K-FAC ingredients of one layer l, for the loss and labels given.

    (peg.12)  Each field is documented by its trailing comment.
    """
    a: object  # a_{l-1}, (M, n_{l-1}): the layer's per-example input (a_0 = X)
    g: object  # g_l = dl_i/dz_l, (M, n_l): per-example pre-activation gradient (= delta_l)


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

def _kfac_seeds(model, theta, X, y, curvature):
    """(xp, layer inputs a_{l-1}, the per-example factors E_l (M, R, n_l) backpropagated to
    each pre-activation, M): R = 1 and E = dl_i/dz_l for "ef"; the columns of C_i (H_i = C_i
    C_i^T) for "ggn".  The one pass behind ``kfac_curvature`` and ``kfac_block_errors``."""
    if curvature not in ("ggn", "ef"):
        raise ValueError(f"curvature: expected 'ggn' or 'ef', got {curvature!r}")
    xp, theta, X, y = model._inputs(theta, X, y)
    params, acts, f = model._forward(xp, theta, X)
    if curvature == "ef":
        r = model.likelihood._grad_f(f, y)  # (peg.2)
        factors = [d[:, None, :] for d in _layers.backward(params, acts, r, model.activation)]
    else:
        C = model.likelihood._hess_factor(f, y)  # H_i = C_i C_i^T, (M, K, R)
        factors = _layers.backward(params, acts, xp.swapaxes(C, 1, 2), model.activation)
    return xp, acts, factors, X.shape[0]

def kfac_curvature(self, theta, X, y, curvature="ggn"):
    """Compute the K-FAC factors (A_l, B_l) of the GGN or empirical Fisher of sum_i l_i.

    Per layer l, with a~_i = [a_{l-1,i}, 1] (the layer input, a 1 appended when the layer
    has a bias) and the layer's parameters [W_l; b_l^T] flattened row-major, the exact
    curvature block is sum_i (a~_i a~_i^T) kron B_i, with B_i = sum_r c_{l,i,r} c_{l,i,r}^T
    (GGN: c_{l,i,r} the column r of C_i, H_i = C_i C_i^T, backpropagated to the
    pre-activation z_l) or B_i = g_{l,i} g_{l,i}^T (EF: g_{l,i} = dl_i/dz_l).  K-FAC
    replaces the sum of products by the product of sums over the M rows::

        A_l = (1/M) sum_i a~_i a~_i^T,   B_l = sum_i B_i,   block ~ A_l kron B_l   (peg.13)

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
    xp, acts, deltas, M = _kfac_seeds(self, theta, X, y, curvature)
    out = []
    for a, d in zip(acts, deltas):
        if self.bias:
            a = xp.concatenate([a, xp.ones((M, 1), dtype=a.dtype)], axis=1)
        A = (a.T @ a) / M  # (peg.13)
        d = d.reshape(-1, d.shape[-1])  # the (M R) seeds' rows, one BLAS product below
        B = d.T @ d  # (peg.13)
        out.append((A, B))
    return out

def kfac_moments(self, thetas, X, y, curvature=None, y_curv=None, scale=None):
    """Compute gradients and the draw-averaged K-FAC factors at S parameter vectors at once.

    g[s] = sum_i dl_i/dtheta at theta_s with the labels y (peg.6). With a curvature, also,
    per layer, the mean over the S vectors of ``kfac_curvature``'s factors (peg.13)::

        A_l = (1/S) sum_s (1/M) sum_i a~_i a~_i^T,   B_l = (1/S) sum_s sum_i B_i   (peg.14)

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
        [(A_l, B_l)] for l = 1..L as in (peg.14), or None when curvature is None.

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
    M = X.shape[0]
    y_curv = check_moment_extras(self.likelihood, self.sizes[-1], thetas, y_curv, scale,
                                 curvature, S, M)
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
        passes = _ggn_column_passes(self, xp, params, acts, f, yy, S)  # (peg.9)
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
        out.append(((a.T @ a) / a.shape[0], B_l / S))  # (peg.14)
    return g, out

def check_moment_extras(likelihood, n_out, thetas, y_curv, scale, curvature, S, M):
    """The checked per-draw arguments of a ``kfac_moments`` (the MLP's and the CNN's): scale a
    finite (S,) array > 0 in thetas' dtype or None; y_curv None, or (S, M, ...) targets for
    curvature "ef" only, returned as S M rows checked by the likelihood (the error naming
    y_curv). One backend for thetas, y_curv and scale."""
    xp_of(thetas, y_curv, scale)  # one backend for the sampled labels and weights too
    if scale is not None:
        check_positive_vector(scale, "scale", S, thetas.dtype, "vector")
    if y_curv is None:
        return None
    if curvature != "ef":
        raise ValueError(f"y_curv: only curvature 'ef' takes its own targets, got "
                         f"curvature {curvature!r}")
    check_array(y_curv, "y_curv", ndim=(2, 3))
    if tuple(y_curv.shape[:2]) != (S, M):
        raise ValueError(f"y_curv: expected shape ({S}, {M}, ...) (S, M), got "
                         f"{tuple(y_curv.shape)}")
    # the S rows of labels checked as one (S M)-row batch, the error naming y_curv
    try:
        return likelihood.check_targets(y_curv.reshape((S * M,) + y_curv.shape[2:]), S * M,
                                        n_out, thetas.dtype)
    except ValueError as err:
        raise ValueError(f"y_curv (the ({S}, {M}, ...) targets of the curvature, "
                         f"checked as {S * M} rows): {err}") from err


def kfac_block_errors(self, theta, X, y, curvature="ggn"):
    """Compute the relative Frobenius error of K-FAC's A_l kron B_l per layer.

    Per layer l, with a~_i, B_i, A_l and B_l as in ``kfac_curvature`` (peg.13) and
    P_i = a~_i a~_i^T, the exact block is Y_l = sum_i P_i kron B_i (the layer's diagonal
    block of ``ggn`` for "ggn"; of G^T G, G = ``per_example_grads``, for "ef"), K-FAC's is
    X_l = A_l kron B_l with exactly the factors ``kfac_curvature`` returns, and ::

        e_l = ||X_l - Y_l||_F / ||Y_l||_F.   (peg.16)

    Neither block (nor any D x D matrix) is formed: with <U kron V, U' kron V'>_F =
    <U, U'>_F <V, V'>_F and <u u^T, v v^T>_F = (u^T v)^2, everything is a sum over M x M
    Gram matrices of the rows a~_i and of the factors E_i (B_i = E_i^T E_i, R rows: the
    backpropagated columns of C_i for "ggn", R = 1 and E_i = g_i for "ef")::

        ||Y_l||^2 = sum_ij (a~_i^T a~_j)^2 ||E_i E_j^T||_F^2,   ||X_l|| = ||A_l|| ||B_l||.

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
    xp, acts, factors, M = _kfac_seeds(self, theta, X, y, curvature)

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
            Btf = (0.5 * (SD + xp.swapaxes(SD, 1, 2))).reshape(M, n * n)  # (peg.16)
            return Bf @ Bf.T, Btf @ Btf.T, k
        Ef, Sf, Df = E.reshape(M * R, n), S.reshape(M * R, n), D.reshape(M * R, n)
        K = xp.empty((M, M), dtype=E.dtype)
        Kt = xp.empty((M, M), dtype=E.dtype)
        step = max(1, (1 << 22) // (M * R * R))  # rows i per chunk of (i, a, j, b) products
        for i0 in range(0, M, step):
            i1 = min(M, i0 + step)
            rows, shape = slice(i0 * R, i1 * R), (i1 - i0, R, M, R)
            G = (Ef[rows] @ Ef.T).reshape(shape)
            K[i0:i1] = (G * G).sum(axis=(1, 3))  # <B_i, B_j> = ||E_i E_j^T||^2  (peg.16)
            SS, DD = Sf[rows] @ Sf.T, Df[rows] @ Df.T
            SD, DS = Sf[rows] @ Df.T, Df[rows] @ Sf.T
            Kt[i0:i1] = 0.5 * (SS * DD + SD * DS).reshape(shape).sum(axis=(1, 3))  # (peg.16)
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
        exact2 = (Kp * Kb).sum()  # ||sum_i P_i kron B_i||^2  (peg.16)
        kfac2 = Kp.sum() * Kb.sum() / (M * M)  # ||A_l||^2 ||B_l||^2  (peg.16)
        err2 = (centred(Kp_shift) * centred(Kb_shift)).sum()  # ||X_l - Y_l||^2  (peg.16)
        err, ex = xp.sqrt(xp.maximum(err2, 0.0)), xp.sqrt(exact2)
        rel.append(xp.where(ex > 0, err / xp.where(ex > 0, ex, 1.0),
                            xp.where(err > 0, xp.inf, 0.0)))  # (peg.16)
        scale = 2 * (ka + kb)  # undo the 2^-ka, 2^-kb scalings (P and B are quadratic)
        kfac.append(xp.ldexp(xp.sqrt(kfac2), scale))
        exact.append(xp.ldexp(ex, scale))
    dtype = theta.dtype
    return {"rel_err": xp.stack(rel).astype(dtype, copy=False),
            "kfac_norm": xp.stack(kfac).astype(dtype, copy=False),
            "exact_norm": xp.stack(exact).astype(dtype, copy=False)}

