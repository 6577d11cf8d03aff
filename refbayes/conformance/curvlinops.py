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
- ``KFACLinearOperator`` with ``fisher_type="empirical"`` (the empirical Fisher's K-FAC) and
  ``"mc"`` (``mc_samples=MC_SAMPLES``, ``seed=MC_SEED``), ``separate_weight_and_bias=False``, one
  row per kind of layer (Conv2d: expand (conv.26) and reduce (conv.27); Linear: (conv.29), where
  reduce is expand): refbayes' ``kfac_curvature(..., "ef")`` factors at the data's labels, scalar
  factor 1 (A a mean, B a sum, as type-2), and for "mc" at curvlinops' own labels: it seeds a
  ``torch.Generator`` with ``seed`` and draws ``softmax(output).multinomial(1)`` per sample;
  ``mc_labels`` replays those draws, and refbayes' B is averaged over them (curvlinops scales
  each sample's covariance by 1 / mc_samples), so the comparison is exact, not statistical.
  ``reduction="mean"`` with the empirical Fisher (expand) is a convention, B / M. A defect in
  these rows is decided by ``autograd_kfac``: the factors built from torch's autograd alone (the
  layers' recorded inputs unfolded, the summed loss's output gradients);
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

__all__ = ["MC_SAMPLES", "MC_SEED", "N_VECTORS", "VECTOR_SEED", "autograd_kfac", "kfac_matmat",
           "mc_labels", "report"]

N_VECTORS = 3      # columns of V on a larger network
VECTOR_SEED = 1    # numpy.random.default_rng(VECTOR_SEED) draws them
MC_SAMPLES = 4     # curvlinops' mc_samples in the fisher_type="mc" rows
MC_SEED = 2147483647  # curvlinops' seed there (its default), reproduced by mc_labels


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


def mc_labels(net, X, n_samples, seed=MC_SEED):
    """The labels curvlinops' ``fisher_type="mc"`` draws for one batch, reproduced.

    ``KFACLinearOperator`` seeds a ``torch.Generator`` with its ``seed`` before its pass over
    the data and, per Monte Carlo sample, draws ``softmax(net(X)).multinomial(1,
    generator=...)`` (its ``draw_label`` for ``nn.CrossEntropyLoss``); the same calls on the
    same outputs give the same labels.

    Parameters
    ----------
    net : torch.nn.Module
        The float64 network curvlinops sees.
    X : numpy.ndarray of shape (M, C, H, W)
        The one batch of images.
    n_samples : int
        curvlinops' ``mc_samples`` (>= 1).
    seed : int, default MC_SEED
        curvlinops' ``seed``.

    Returns
    -------
    list of numpy.ndarray of shape (M,)
        One label vector per Monte Carlo sample, in curvlinops' order.

    Raises
    ------
    ValueError
        If n_samples is not an integer >= 1.
    """
    if isinstance(n_samples, bool) or not isinstance(n_samples, (int, np.integer)) \
            or n_samples < 1:
        raise ValueError(f"n_samples: expected an integer >= 1, got {n_samples!r}")
    import torch
    gen = torch.Generator()
    gen.manual_seed(seed)
    with torch.no_grad():
        probs = net(torch.from_numpy(X)).softmax(dim=1)
    return [probs.multinomial(num_samples=1, generator=gen).squeeze(-1).numpy()
            for _ in range(n_samples)]


def autograd_kfac(net, X, labels, approx):
    """K-FAC factors of the empirical Fisher at given labels, from torch's autograd alone.

    The dense check of the "empirical" and "mc" rows, independent of refbayes' passes and of
    curvlinops' hooks: torch's forward records each Conv2d / Linear layer's input and output,
    one autograd pass of the summed cross-entropy per label vector gives the output gradients
    E (per example, as the loss is a sum), and the factors are formed as in (conv.26),
    (conv.27), (conv.29): U~ the unfolded input (``torch.nn.functional.unfold``, rows
    (c_in, k_h, k_w) as W~ of (conv.24)) with a ones row for the bias::

        expand: A = sum_i U~_i U~_i^T / (M P),  B = mean_s sum_{i,r} E_{i,r} E_{i,r}^T
        reduce: A = sum_i ubar_i ubar_i^T / M,  B = mean_s sum_i (E_i 1)(E_i 1)^T

    (a Linear layer: P = 1), B averaged over the label vectors (one for the empirical Fisher,
    curvlinops' ``mc_samples`` for "mc").

    Parameters
    ----------
    net : torch.nn.Sequential
        The float64 network (Conv2d layers without groups or dilation).
    X : numpy.ndarray of shape (M, C, H, W)
        The images.
    labels : list of numpy.ndarray of shape (M,)
        The label vectors (the data's for the empirical Fisher, sampled ones for "mc").
    approx : {"expand", "reduce"}
        The conv-layer approximation.

    Returns
    -------
    list of tuple
        [(A_l, B_l)] per parameter layer, NumPy float64, as ``CNN.kfac_curvature`` orders them.

    Raises
    ------
    ValueError
        If approx is not "expand" or "reduce", or labels is empty.
    """
    if approx not in ("expand", "reduce"):
        raise ValueError(f"approx: expected 'expand' or 'reduce', got {approx!r}")
    if not labels:
        raise ValueError("labels: expected at least one label vector")
    import torch
    from torch import nn
    layers = [m for m in net.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    seen = {}

    def hook(module, inputs, output):
        seen[module] = (inputs[0].detach(), output)

    handles = [m.register_forward_hook(hook) for m in layers]
    try:
        Bs = [0.0] * len(layers)
        for y in labels:
            seen.clear()
            out = net(torch.from_numpy(X))
            loss = nn.functional.cross_entropy(out, torch.from_numpy(np.asarray(y)).long(),
                                               reduction="sum")
            grads = torch.autograd.grad(loss, [seen[m][1] for m in layers])
            for j, (m, E) in enumerate(zip(layers, grads)):
                E = E.detach().reshape(E.shape[0], E.shape[1], -1)  # (M, n_out, P)
                if approx == "reduce" or isinstance(m, nn.Linear):
                    E = E.sum(dim=2, keepdim=True)
                Bs[j] = Bs[j] + torch.einsum("mop,mqp->oq", E, E) / len(labels)
    finally:
        for h in handles:
            h.remove()
    factors = []
    for j, m in enumerate(layers):
        x = seen[m][0]
        M = x.shape[0]
        if isinstance(m, nn.Conv2d):
            U = nn.functional.unfold(x, m.kernel_size, padding=m.padding, stride=m.stride)
        else:
            U = x.reshape(M, -1, 1)  # (M, n_in, 1)
        if m.bias is not None:
            U = torch.cat([U, torch.ones_like(U[:, :1])], dim=1)
        P = U.shape[2]
        if approx == "reduce" or isinstance(m, nn.Linear):
            Ub = U.mean(dim=2)
            A = Ub.T @ Ub / M
        else:
            A = torch.einsum("map,mbp->ab", U, U) / (M * P)
        factors.append((A.numpy(), Bs[j].numpy()))
    return factors


def _layer_rows(model, kind):
    """theta's indices (refbayes order) of the Conv2d ("Conv2d") or Dense ("Linear") layers."""
    layers = [layer for layer in model.layers if isinstance(layer, (Conv2d, Dense))]
    want = Conv2d if kind == "Conv2d" else Dense
    return np.sort(np.concatenate([idx.ravel() for idx, layer in zip(model.kfac_layout(), layers)
                                   if isinstance(layer, want)]))


def _fisher_rows(rows, name, model, net, theta, X, y, V, Vt):
    """The "empirical" and "mc" K-FAC rows: refbayes' "ef" factors at the data's labels, and
    averaged over curvlinops' own sampled labels (reproduced by ``mc_labels``)."""
    import torch
    import curvlinops as cl  # the optional extra 'conformance', imported when a report runs
    data = [(torch.from_numpy(X), torch.from_numpy(y))]
    M = len(y)
    sampled = mc_labels(net, X, MC_SAMPLES)
    cases = [("empirical", "expand", "sum"), ("empirical", "reduce", "sum"),
             ("empirical", "expand", "mean"), ("mc", "expand", "sum"), ("mc", "reduce", "sum")]
    for fisher, approx, reduction in cases:
        labels = [y] if fisher == "empirical" else sampled
        per_label = [model.kfac_curvature(theta, X, lab, "ef", approx) for lab in labels]
        factors = [(pairs[0][0], sum(B for _, B in pairs) / len(labels))
                   for pairs in zip(*per_label)]  # A does not depend on the labels
        ours = kfac_matmat(model, factors, V)
        extra = {"mc_samples": MC_SAMPLES, "seed": MC_SEED} if fisher == "mc" else {}
        op = cl.KFACLinearOperator(
            net, torch.nn.CrossEntropyLoss(reduction=reduction), list(net.parameters()), data,
            fisher_type=fisher, kfac_approx=approx, separate_weight_and_bias=False,
            check_deterministic=False, **extra)
        theirs = to_refbayes(_apply(op, Vt), model, "torch", axes=(0,))
        what = ("refbayes 'ef' at the data's labels" if fisher == "empirical" else
                f"refbayes 'ef' B averaged over curvlinops' {MC_SAMPLES} label draws (seed "
                f"{MC_SEED}, reproduced)")
        tag = "(conv.26)" if approx == "expand" else "(conv.27)"
        if reduction == "mean":
            rows.append(classify(f"{name}: KFACLinearOperator {approx}, {fisher}, "
                                 f"reduction=mean", rel_err(ours / M, theirs),
                                 raw_error=rel_err(ours, theirs),
                                 note=f"mean loss: gradient covariance B / M, M = {M}; {what}"))
            continue

        def decide(ours=ours, theirs=theirs, labels=labels, approx=approx, idx=None):
            dense = kfac_matmat(model, autograd_kfac(net, X, labels, approx), V)
            return dense_side(ours[idx], theirs[idx], dense[idx],
                              "torch autograd's K-FAC factors at the same labels")

        kinds = ("Conv2d", "Linear") if approx == "expand" else ("Conv2d",)
        for kind in kinds:  # (conv.29): a Linear layer's reduce is its expand
            idx = _layer_rows(model, kind)
            rows.append(classify(
                f"{name}: KFACLinearOperator {approx}, {fisher}, {kind} layers "
                f"{tag if kind == 'Conv2d' else '(conv.29)'}",
                rel_err(ours[idx], theirs[idx]),
                note=f"{what}; input covariance = A, gradient covariance = B, factor 1",
                decide=lambda d=decide, idx=idx: d(idx=idx)))


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
        Per network: the type-2 K-FAC rows (expand, reduce; separate bias and mean reduction as
        conventions), the empirical and MC Fisher K-FAC rows (Conv2d and Linear layers apart;
        the empirical mean reduction a convention), the GGN and Hessian product rows.
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
        _fisher_rows(rows, name, model, net, theta, X, y, V, Vt)
        _operator_rows(rows, name, model, net, theta, X, y, V, Vt)
    title = (f"curvlinops (curvlinops-for-pytorch {version('curvlinops-for-pytorch')}), torch "
             f"{torch.__version__}, float64; tiny_cnn (D = 47, dense) and lenet5 (D = 62006, "
             f"{N_VECTORS} vectors), M = {M_ROWS}, cross-entropy; theta by refbayes.layout "
             f"'torch'")
    return Report("curvlinops", title, rows)
