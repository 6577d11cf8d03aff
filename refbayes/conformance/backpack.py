"""Conformance of BackPACK (f-dangel/backpack, ``backpack``) with refbayes' CNN (refbayes.models.conv).

The problems: ``tiny_cnn()`` (1x6x6, conv 3x3 (2), relu, maxpool 2, dense 3; D = 47) and
``lenet5()`` (3x32x32, ten classes; D = 62006), each with M = 8 standard-normal images and
uniform labels from ``numpy.random.default_rng(DATA_SEED)``, the weights of torch's own
initialisation after ``torch.manual_seed(INIT_SEED)``, float64 on both sides. The torch network
(``torch_cnn``) is the ``nn.Sequential`` of ``nn.Conv2d`` / ``nn.ReLU`` / ``nn.MaxPool2d`` /
``nn.Flatten`` / ``nn.Linear`` modules of the refbayes spec, extended by BackPACK, with the
summed cross-entropy ``nn.CrossEntropyLoss(reduction="sum")`` (refbayes' summed loss, so every
first-order quantity has scale factor 1). theta is its ``parameters()`` mapped by
``refbayes.layout`` ("torch": conv weight as is, Linear weight transposed; (conv.2)-(conv.3)).

Rows per network (max rel error max|refbayes - BackPACK| / max|BackPACK|, tolerance EXACT_F64):

- ``BatchGrad``: the per-example gradients (M, D) against ``CNN.per_example_grads`` (conv.6)-(conv.7);
- ``SumGradSquared``: sum_i g_i^2 against ``CNN.diag_ef`` (conv.10);
- ``BatchL2Grad``: ||g_i restricted to one torch tensor||^2, (M, tensors), against the squares
  of the refbayes rows summed over each tensor's theta indices;
- ``DiagGGNExact``: the exact GGN diagonal against ``CNN.diag_ggn`` (conv.18) (a defect on
  tiny_cnn decided by the diagonal of the dense ``CNN.ggn`` (conv.17));
- ``KFLR``: BackPACK's factors for every weight and bias, against ``CNN.kfac_curvature`` (GGN).
  derivations/conv.md's conventions table: a Conv2d weight's KFLR is [B_reduce, Omega] with
  Omega = P A_expand without its ones row (conv.28): a hybrid, neither expand nor reduce; its
  bias factor is B_reduce; a Linear weight's is [B, A without its ones row] (conv.29), its bias
  [B]. The raw error compares BackPACK's factors with refbayes' expand factors as they are;
  the mapped one with the hybrid. On a network with a conv layer the row is therefore a
  convention (raw -> mapped);
- ``KFAC``: the same with one Monte Carlo label per example (``KFAC(mc_samples=1)``): the input
  factors are KFLR's, the output factors B_reduce of the empirical Fisher at the sampled labels
  (``curvature="ef"`` with y~). The labels are the draw BackPACK makes, replayed: torch is
  seeded with KFAC_SEED before the backward pass and again before
  ``torch.distributions.Categorical(softmax(f)).sample((1,))``, the one draw of BackPACK's
  cross-entropy ``_compute_sampled_grads_manual``.

Importing this module does not import torch or BackPACK: ``report`` does.
"""
from __future__ import annotations

import itertools
import warnings
from importlib.metadata import version

import numpy as np

from refbayes._tolerances import rel_err
from refbayes.conformance import REPORTS, Report, classify, dense_side, flat_params
from refbayes.layout import from_refbayes, to_refbayes
from refbayes.models import (
    AvgPool2d,
    Conv2d,
    Dense,
    Flatten,
    MaxPool2d,
    lenet5,
    tiny_cnn,
)

__all__ = ["NETWORKS", "cnn_problem", "report", "torch_cnn"]

M_ROWS = 8        # images per problem
DATA_SEED = 0     # numpy.random.default_rng(DATA_SEED): the images and labels
INIT_SEED = 0     # torch.manual_seed(INIT_SEED) before the network is built: its weights
KFAC_SEED = 3     # torch.manual_seed(KFAC_SEED) before BackPACK's KFAC pass and its replay
DENSE_MAX_D = 500  # up to this D a DiagGGNExact defect is decided by the dense ggn
NETWORKS = {"tiny_cnn": tiny_cnn, "lenet5": lenet5}


def torch_cnn(model):
    """Build the float64 ``nn.Sequential`` of torch modules that is a refbayes CNN spec.

    Parameters
    ----------
    model : refbayes.models.CNN
        The refbayes network; its layers are Conv2d, Dense, MaxPool2d, AvgPool2d, Flatten and
        Activation ("relu", "tanh", "sigmoid").

    Returns
    -------
    torch.nn.Sequential
        The same layers as torch modules, torch's own initialisation, float64.
    """
    import torch
    from torch import nn
    acts = {"relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid}
    mods = []
    for layer in model.layers:
        if isinstance(layer, Conv2d):
            mods.append(nn.Conv2d(layer.c_in, layer.c_out, layer.kernel, layer.stride,
                                  layer.padding, bias=layer.bias))
        elif isinstance(layer, Dense):
            mods.append(nn.Linear(layer.n_in, layer.n_out, bias=layer.bias))
        elif isinstance(layer, MaxPool2d):
            mods.append(nn.MaxPool2d(layer.kernel, layer.stride))
        elif isinstance(layer, AvgPool2d):
            mods.append(nn.AvgPool2d(layer.kernel, layer.stride))
        elif isinstance(layer, Flatten):
            mods.append(nn.Flatten())
        else:
            mods.append(acts[layer.name]())
    return nn.Sequential(*mods).to(torch.float64)


def cnn_problem(name: str, M: int = M_ROWS):
    """Build one network of NETWORKS, its torch twin, theta and the data.

    Parameters
    ----------
    name : str
        A key of NETWORKS ("tiny_cnn" or "lenet5").
    M : int, default M_ROWS
        The number of images.

    Returns
    -------
    tuple
        (model, net, theta, X, y): the refbayes CNN, the float64 torch ``nn.Sequential``
        (weights after ``torch.manual_seed(INIT_SEED)``), theta (D,) in refbayes order, the
        images X (M, C, H, W) and labels y (M,) of ``default_rng(DATA_SEED)``.

    Raises
    ------
    ValueError
        If name is not a key of NETWORKS or M < 1.
    """
    if name not in NETWORKS:
        raise ValueError(f"name: expected one of {', '.join(NETWORKS)}, got {name!r}")
    if isinstance(M, bool) or not isinstance(M, (int, np.integer)) or M < 1:
        raise ValueError(f"M: expected an integer >= 1, got {M!r}")
    import torch
    model = NETWORKS[name]()
    torch.manual_seed(INIT_SEED)
    net = torch_cnn(model)
    theta = to_refbayes(flat_params(net), model, "torch")
    rng = np.random.default_rng(DATA_SEED)
    X = rng.standard_normal((M,) + tuple(model.input_shape))
    y = rng.integers(0, model.n_out, size=M)
    return model, net, theta, X, y


def _param_tensors(net):
    """[(module, name, parameter)] in ``parameters()`` order."""
    return [(mod, n, p) for mod in net.modules() for n, p in mod.named_parameters(recurse=False)]


def _stack(tensors, M=None) -> np.ndarray:
    """Flatten torch-order tensors into one vector, or (M, D) rows when M is given."""
    if M is None:
        return np.concatenate([t.detach().reshape(-1).numpy() for t in tensors])
    return np.concatenate([t.detach().reshape(M, -1).numpy() for t in tensors], axis=1)


def _conv_positions(net, X):
    """{conv module: its output positions P = H_o W_o} from a forward pass."""
    import torch
    from torch import nn
    P, hooks = {}, []
    for mod in net.modules():
        if isinstance(mod, nn.Conv2d):
            hooks.append(mod.register_forward_hook(
                lambda m, inp, out: P.__setitem__(m, out.shape[2] * out.shape[3])))
    with torch.no_grad():
        net(torch.from_numpy(X))
    for h in hooks:
        h.remove()
    return P


def _backward(net, X, y, *extensions, seed=None):
    """One BackPACK backward pass of the summed cross-entropy with these extensions."""
    import torch
    import backpack as bp  # the optional extra 'conformance', imported when a report runs
    for p in net.parameters():
        p.grad = None
    loss_fn = bp.extend(torch.nn.CrossEntropyLoss(reduction="sum"))
    loss = loss_fn(net(torch.from_numpy(X)), torch.from_numpy(y))
    if seed is not None:
        torch.manual_seed(seed)
    with bp.backpack(*extensions), warnings.catch_warnings():
        # the images do not require gradients: torch's note on BackPACK's full backward hooks
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        loss.backward()


def _first_order_rows(rows, name, model, net, theta, X, y):
    from backpack import extensions as ext  # the optional extra 'conformance'
    M = len(y)
    _backward(net, X, y, ext.BatchGrad(), ext.SumGradSquared(), ext.BatchL2Grad(),
              ext.DiagGGNExact())
    params = [p for _, _, p in _param_tensors(net)]
    G = model.per_example_grads(theta, X, y)
    G_bp = to_refbayes(_stack([p.grad_batch for p in params], M), model, "torch")
    rows.append(classify(f"{name}: BatchGrad per-example gradients (M, D) (conv.6)-(conv.7)",
                         rel_err(G, G_bp), note="reduction='sum': scale 1"))
    s_bp = to_refbayes(_stack([p.sum_grad_squared for p in params]), model, "torch")
    rows.append(classify(f"{name}: SumGradSquared vs diag_ef (conv.10)",
                         rel_err(model.diag_ef(theta, X, y), s_bp)))
    G_t = from_refbayes(G, model, "torch")  # torch order, cut into the tensors
    sizes = np.cumsum([0] + [p.numel() for p in params])
    l2 = np.stack([np.sum(G_t[:, a:b] ** 2, axis=1) for a, b in itertools.pairwise(sizes)],
                  axis=1)
    l2_bp = np.stack([p.batch_l2.detach().numpy() for p in params], axis=1)
    rows.append(classify(f"{name}: BatchL2Grad per-example squared norms (M, tensors)",
                         rel_err(l2, l2_bp), note="per torch tensor: weight and bias apart"))
    d_bp = to_refbayes(_stack([p.diag_ggn_exact for p in params]), model, "torch")
    d = model.diag_ggn(theta, X, y)
    decide = None
    if model.D <= DENSE_MAX_D:
        def decide():
            return dense_side(d, d_bp, np.diag(model.ggn(theta, X, y)),
                              "the diagonal of refbayes' dense ggn (conv.17)")
    rows.append(classify(f"{name}: DiagGGNExact vs diag_ggn (conv.18)", rel_err(d, d_bp),
                         decide=decide))


def _factor_errors(net, P, attr, hybrid, raw):
    """(raw error, mapped error): BackPACK's factors vs refbayes' expand ones and the hybrid."""
    from torch import nn
    e_raw = e_map = 0.0
    layers = [m for m in net.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    for mod, (A_h, B_h), (A_r, B_r) in zip(layers, hybrid, raw):
        G_w, A_w = (t.detach().numpy() for t in getattr(mod.weight, attr))
        scale = P.get(mod, 1)  # Omega = P A_expand (conv.28); 1 for Linear (conv.29)
        e_map = max(e_map, rel_err(G_w, B_h), rel_err(A_w, scale * A_h[:-1, :-1]))
        e_raw = max(e_raw, rel_err(G_w, B_r), rel_err(A_w, A_r[:-1, :-1]))
        if mod.bias is not None:
            G_b = getattr(mod.bias, attr)[0].detach().numpy()
            e_map, e_raw = max(e_map, rel_err(G_b, B_h)), max(e_raw, rel_err(G_b, B_r))
    return e_raw, e_map


def _hybrid(expand, reduce_):
    """BackPACK's split: refbayes' expand input factor, reduce output factor, per layer."""
    return [(A_e, B_r) for (A_e, _), (_, B_r) in zip(expand, reduce_)]


def _kfac_rows(rows, name, model, net, theta, X, y):
    import torch
    from backpack import extensions as ext  # the optional extra 'conformance'
    P = _conv_positions(net, X)
    has_conv = bool(P)
    how = ("Conv2d weight [B_reduce, P A_expand[:Q, :Q]] (conv.28), bias B_reduce; Linear "
           "[B, A[:-1, :-1]] (conv.29)")
    expand = model.kfac_curvature(theta, X, y, "ggn", "expand")
    reduce_ = model.kfac_curvature(theta, X, y, "ggn", "reduce")
    _backward(net, X, y, ext.KFLR())
    e_raw, e_map = _factor_errors(net, P, "kflr", _hybrid(expand, reduce_), expand)
    rows.append(classify(f"{name}: KFLR factors (exact GGN), every layer",
                         e_map, raw_error=e_raw if has_conv else None,
                         note=f"BackPACK's hybrid scaling: {how}; raw: refbayes expand as is"))
    _backward(net, X, y, ext.KFAC(mc_samples=1), seed=KFAC_SEED)
    torch.manual_seed(KFAC_SEED)  # replay BackPACK's one draw of labels
    with torch.no_grad():
        probs = torch.softmax(net(torch.from_numpy(X)), dim=1)
    y_mc = torch.distributions.Categorical(probs).sample(torch.Size([1]))[0].numpy()
    ef_reduce = model.kfac_curvature(theta, X, y_mc, "ef", "reduce")
    ef_expand = model.kfac_curvature(theta, X, y_mc, "ef", "expand")
    e_raw, e_map = _factor_errors(net, P, "kfac", _hybrid(ef_expand, ef_reduce), ef_expand)
    rows.append(classify(f"{name}: KFAC factors (1 MC label per example), every layer",
                         e_map, raw_error=e_raw if has_conv else None,
                         note=(f"as KFLR at BackPACK's sampled labels (replayed, seed "
                               f"{KFAC_SEED}; refbayes curvature='ef' at them): {how}")))


def report() -> Report:
    """Run BackPACK and refbayes on tiny_cnn and lenet5 and classify every difference.

    Returns
    -------
    Report
        Per network: BatchGrad, SumGradSquared, BatchL2Grad, DiagGGNExact, KFLR and KFAC rows.
    """
    import torch
    import backpack as bp  # the optional extra 'conformance', imported when a report runs
    rows = []
    for name in NETWORKS:
        model, net, theta, X, y = cnn_problem(name)
        net = bp.extend(net)
        _first_order_rows(rows, name, model, net, theta, X, y)
        _kfac_rows(rows, name, model, net, theta, X, y)
    title = (f"BackPACK (backpack-for-pytorch {version('backpack-for-pytorch')}), torch "
             f"{torch.__version__}, float64; tiny_cnn (D = 47) and lenet5 (D = 62006), "
             f"M = {M_ROWS}, summed cross-entropy; theta by refbayes.layout 'torch'")
    return Report("backpack", title, rows)
