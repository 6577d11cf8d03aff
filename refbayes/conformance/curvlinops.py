"""Conformance of curvlinops (f-dangel/curvlinops, ``curvlinops``) with refbayes' CNN (refbayes.models.conv).

The problems are those of ``refbayes conformance backpack`` (``cnn_problem``): ``tiny_cnn()``
(D = 47) and ``lenet5()`` (D = 62006), M = 8 images and labels, torch's initialisation, float64,
theta by ``refbayes.layout`` "torch" (conv weight as is, Linear weight transposed). curvlinops
sees the torch network, ``nn.CrossEntropyLoss(reduction="sum")`` (refbayes' summed loss) unless
a row says "mean", and one full batch. Every operator is applied to the same matrix V, mapped
to torch's parameter order: the identity (the dense D x D matrix) on tiny_cnn, N_VECTORS
standard-normal columns of ``default_rng(VECTOR_SEED)`` on lenet5, where a D x D matrix does not
fit. Rows per network (max rel error max|refbayes - curvlinops| / max|curvlinops|):

- ``KFACLinearOperator`` (``fisher_type="type-2"``: the exact GGN's K-FAC) with
  ``kfac_approx="expand"`` and ``"reduce"``, ``separate_weight_and_bias=False``: refbayes'
  factors of ``CNN.kfac_curvature`` (conv.26)-(conv.27), (conv.29), applied block by block as
  (A kron B) vec_row_major(V~) = vec_row_major(A V~ B) on each layer's W~ (conv.24). The
  conventions table of derivations/conv.md: curvlinops' input covariance is A and its gradient
  covariance B, scalar factor 1 (A a mean over examples and positions, B a sum);
- the same, ``separate_weight_and_bias=True`` (curvlinops' default): a convention: the raw
  error is against the joint A kron B, the mapped one drops the weight-bias cross blocks and
  takes B alone for the bias (A[Q, Q] = 1);
- the same, ``reduction="mean"``: a convention: curvlinops' gradient covariance is B / M, so
  the mapped comparison divides refbayes' K-FAC by M;
- ``GGNLinearOperator``: against ``CNN.ggn_vp`` column by column (conv.22);
- ``HessianLinearOperator``: against ``CNN.hvp`` column by column (conv.34)-(conv.36).

On tiny_cnn a defect is decided against refbayes' dense ``ggn`` / ``hessian`` (conv.17),
(conv.19) (the matrices, not the products). Importing this module does not import torch or
curvlinops: ``report`` does.
"""
from __future__ import annotations

from importlib.metadata import version

import numpy as np

from refbayes._tolerances import rel_err
from refbayes.conformance import REPORTS, Report, classify, dense_side
from refbayes.conformance.backpack import DENSE_MAX_D, M_ROWS, NETWORKS, cnn_problem
from refbayes.layout import from_refbayes, to_refbayes
from refbayes.models import Conv2d, Dense

__all__ = ["N_VECTORS", "VECTOR_SEED", "kfac_matmat", "report"]

N_VECTORS = 3      # columns of V on a larger network
VECTOR_SEED = 1    # numpy.random.default_rng(VECTOR_SEED) draws them


def kfac_matmat(model, factors, V, separate=False):
    """Apply refbayes' K-FAC matrix blockdiag_l(A_l kron B_l) to the columns of V (theta order).

    Per parameter layer, with idx = ``model.kfac_layout()[l]`` and V~ = V[idx] the columns cut
    into W~'s shape (conv.24), the block's product is vec_row_major(A V~ B) (A, B symmetric).

    Parameters
    ----------
    model : refbayes.models.CNN
        The network (its ``kfac_layout``).
    factors : list of (A, B)
        ``model.kfac_curvature(...)``'s factors, one pair per parameter layer.
    V : numpy.ndarray of shape (D, S)
        The vectors, in refbayes' order.
    separate : bool, default False
        Drop the weight-bias cross blocks and give the bias the block B alone, as curvlinops'
        ``separate_weight_and_bias=True`` (A[Q, Q] = 1, so the bias block is A[Q, Q] B).

    Returns
    -------
    numpy.ndarray of shape (D, S)
        The products, refbayes' order.

    Raises
    ------
    ValueError
        If V is not a (D, S) array or factors does not hold one pair per parameter layer.
    """
    V = np.asarray(V)
    if V.ndim != 2 or V.shape[0] != model.D:
        raise ValueError(f"V: expected an array of shape ({model.D}, S), got shape {V.shape}")
    layout = model.kfac_layout()
    if len(factors) != len(layout):
        raise ValueError(f"factors: expected {len(layout)} (A, B) pairs, got {len(factors)}")
    out = np.zeros_like(V)
    layers = [layer for layer in model.layers if isinstance(layer, (Conv2d, Dense))]
    for (A, B), idx, layer in zip(factors, layout, layers):
        Vt = V[idx]  # (n_a, n_b, S)
        if separate and layer.bias:
            W = np.einsum("ab,bcs,cd->ads", A[:-1, :-1], Vt[:-1], B, optimize=True)
            b = np.einsum("cs,cd->ds", Vt[-1], B)
            res = np.concatenate([W, b[None]], axis=0)
        else:
            res = np.einsum("ab,bcs,cd->ads", A, Vt, B, optimize=True)
        out[idx] = res
    return out


def _apply(op, V_torch):
    import torch
    return (op @ torch.from_numpy(np.ascontiguousarray(V_torch))).detach().numpy()


def _kfac_rows(rows, name, model, net, theta, X, y, V, Vt):
    import torch
    import curvlinops as cl  # the optional extra 'conformance', imported when a report runs
    data = [(torch.from_numpy(X), torch.from_numpy(y))]
    M = len(y)
    for approx in ("expand", "reduce"):
        factors = model.kfac_curvature(theta, X, y, "ggn", approx)
        ours = kfac_matmat(model, factors, V)
        for reduction, separate in (("sum", False), ("sum", True), ("mean", False)):
            if approx == "reduce" and (separate or reduction == "mean"):
                continue  # one variant of each convention is enough: it is approx-independent
            op = cl.KFACLinearOperator(
                net, torch.nn.CrossEntropyLoss(reduction=reduction), list(net.parameters()),
                data, fisher_type="type-2", kfac_approx=approx,
                separate_weight_and_bias=separate, check_deterministic=False)
            theirs = to_refbayes(_apply(op, Vt), model, "torch", axes=(0,))
            label = (f"{name}: KFACLinearOperator {approx}, type-2, reduction={reduction}, "
                     f"separate_weight_and_bias={separate}")
            if separate:
                mapped = kfac_matmat(model, factors, V, separate=True)
                rows.append(classify(label, rel_err(mapped, theirs),
                                     raw_error=rel_err(ours, theirs),
                                     note="bias apart: cross blocks dropped, bias block B "
                                          "(A[Q, Q] = 1); factor 1"))
            elif reduction == "mean":
                rows.append(classify(label, rel_err(ours / M, theirs),
                                     raw_error=rel_err(ours, theirs),
                                     note=f"mean loss: gradient covariance B / M, M = {M}"))
            else:
                rows.append(classify(label, rel_err(ours, theirs),
                                     note=f"(conv.{26 if approx == 'expand' else 27}): input "
                                          f"covariance = A, gradient covariance = B, factor 1"))


def _operator_rows(rows, name, model, net, theta, X, y, V, Vt):
    import torch
    import curvlinops as cl  # the optional extra 'conformance', imported when a report runs
    data = [(torch.from_numpy(X), torch.from_numpy(y))]
    loss = torch.nn.CrossEntropyLoss(reduction="sum")
    dense = model.D <= DENSE_MAX_D
    for kind, cls, prod, full, tags in (
            ("GGN", cl.GGNLinearOperator, model.ggn_vp, model.ggn, "(conv.22)"),
            ("Hessian", cl.HessianLinearOperator, model.hvp, model.hessian,
             "(conv.34)-(conv.36)")):
        op = cls(net, loss, list(net.parameters()), data, check_deterministic=False)
        theirs = to_refbayes(_apply(op, Vt), model, "torch", axes=(0,))
        ours = np.stack([prod(theta, V[:, s], X, y) for s in range(V.shape[1])], axis=1)
        decide = None
        if dense:
            def decide(ours=ours, theirs=theirs, full=full, kind=kind):
                return dense_side(ours, theirs, full(theta, X, y) @ V,
                                  f"refbayes' dense {kind.lower()} matrix")
        what = "dense matrix" if dense else f"{V.shape[1]} random vectors"
        rows.append(classify(f"{name}: {kind}LinearOperator @ V ({what}) {tags}",
                             rel_err(ours, theirs), decide=decide))


def report() -> Report:
    """Run curvlinops and refbayes on tiny_cnn and lenet5 and classify every difference.

    Returns
    -------
    Report
        Per network: the K-FAC rows (expand, reduce; separate bias and mean reduction as
        conventions), the GGN and Hessian product rows.
    """
    import torch
    rows = []
    for name in NETWORKS:
        model, net, theta, X, y = cnn_problem(name)
        if model.D <= DENSE_MAX_D:
            V = np.eye(model.D)
        else:
            V = np.random.default_rng(VECTOR_SEED).standard_normal((model.D, N_VECTORS))
        Vt = from_refbayes(V, model, "torch", axes=(0,))
        _kfac_rows(rows, name, model, net, theta, X, y, V, Vt)
        _operator_rows(rows, name, model, net, theta, X, y, V, Vt)
    title = (f"curvlinops (curvlinops-for-pytorch {version('curvlinops-for-pytorch')}), torch "
             f"{torch.__version__}, float64; tiny_cnn (D = 47, dense) and lenet5 (D = 62006, "
             f"{N_VECTORS} vectors), M = {M_ROWS}, cross-entropy; theta by refbayes.layout "
             f"'torch'")
    return Report("curvlinops", title, rows)
