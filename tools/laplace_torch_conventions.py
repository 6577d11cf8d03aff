"""Check the laplace-torch rows of derivations/laplace.md's conventions table by running
laplace-torch on the problem of ``refbayes trace laplace`` (and a 3-class twin), side by side
with refbayes.

Needs PyTorch and laplace-torch, which refbayes does not depend on:

    python -m venv /tmp/lt && /tmp/lt/bin/pip install -e . torch laplace-torch
    /tmp/lt/bin/python tools/laplace_torch_conventions.py

Every row compares one quantity after converting laplace-torch's parameter order (per tensor:
``Linear.weight`` (n_out, n_in) row-major, then the bias) to refbayes' (W_l (n_in, n_out)
row-major, then b_l) and prints max|refbayes - laplace-torch| / max|laplace-torch|. The
conversions are the table's: noise_precision = 1 / sigma_noise^2, prior_precision as is,
temperature 1. Rows whose difference is the point (the EF scaling of regression, the K-FAC
weight-bias cross block) say what they show. Nothing here is random: the MAP comes from
``refbayes.tracing.problems.find_map``; a float64 torch is used throughout.
"""
from __future__ import annotations

import math

import numpy as np
import scipy.linalg
import torch
from laplace import Laplace
from laplace.curvature import BackPackEF, BackPackGGN

from refbayes.tracing.problems import find_map, regression_problem
from refbayes.methods import laplace as rb
from refbayes.models import MLP

__all__ = ["main", "torch_order", "torch_net"]

torch.set_default_dtype(torch.float64)


def torch_order(model) -> np.ndarray:
    """perm with theta[perm] in laplace-torch's order (per layer: W^T row-major, then b)."""
    perm, off = [], 0
    for n_in, n_out in zip(model.sizes[:-1], model.sizes[1:]):
        W = np.arange(off, off + n_in * n_out).reshape(n_in, n_out)
        perm += list(W.T.reshape(-1)) + list(range(off + n_in * n_out, off + n_in * n_out + n_out))
        off += (n_in + 1) * n_out
    return np.array(perm)


def torch_net(model, theta) -> torch.nn.Sequential:
    """The nn.Sequential of Linear / Tanh layers with refbayes' theta as its weights."""
    layers = []
    for l, (W, b) in enumerate(model.unflatten(theta)):
        lin = torch.nn.Linear(*W.shape)
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(W.T.copy()))
            lin.bias.copy_(torch.from_numpy(b.copy()))
        layers.append(lin)
        if l < model.n_layers - 1:
            layers.append(torch.nn.Tanh())
    return torch.nn.Sequential(*layers)


def _rel(a, b) -> float:
    a, b = np.asarray(a, float), np.asarray(b, float)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


def _loader(X, y, classification: bool):
    Xt = torch.from_numpy(X)
    yt = torch.from_numpy(y.astype(np.int64)) if classification else torch.from_numpy(y[:, None])
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(Xt, yt), batch_size=len(X))


def _fit_lt(net, X, y, classification, structure, backend, delta, sigma=1.0):
    kwargs = {} if classification else {"sigma_noise": sigma}
    la = Laplace(net, "classification" if classification else "regression",
                 subset_of_weights="all", hessian_structure=structure, backend=backend,
                 prior_precision=delta, **kwargs)
    la.fit(_loader(X, y, classification))
    return la


def regression_rows(rows):
    model, X, y, X_star = regression_problem()
    delta = 1.0
    theta = find_map(model, X, y, np.full(model.D, delta)).theta_map
    tau = model.likelihood.noise_precision
    perm = torch_order(model)
    net = torch_net(model, theta)
    for structure in ("full", "diag"):
        cfg = rb.LaplaceConfig(delta, structure, "ggn")
        st = rb.fit(model, theta, X, y, cfg)
        la = _fit_lt(net, X, y, False, structure, BackPackGGN, delta, 1.0 / math.sqrt(tau))
        P_rb = rb.dense_precision(st)[np.ix_(perm, perm)]
        P_lt = la.posterior_precision.detach().numpy()
        P_lt = P_lt if P_lt.ndim == 2 else np.diag(P_lt)
        rows.append((f"regression GGN {structure}: posterior precision", _rel(P_rb, P_lt)))
        rows.append((f"regression GGN {structure}: log marginal likelihood",
                     _rel(rb.log_marginal_likelihood(model, st, X, y, cfg),
                          float(la.log_marginal_likelihood().detach()))))
        if structure == "full":
            f_mu, f_var = la(torch.from_numpy(X_star), pred_type="glm")
            pred = rb.glm_predictive(model, st, X_star)
            rows.append(("regression GLM predictive f_var (laplace.7)",
                         _rel(pred.f_var, f_var.detach().numpy())))
    # EF: laplace-torch's factor 1 / sigma^2 on the raw-loss EF vs the EF of the Gaussian NLL
    cfg = rb.LaplaceConfig(delta, "full", "ef")
    st = rb.fit(model, theta, X, y, cfg)
    la = _fit_lt(net, X, y, False, "full", BackPackEF, delta, 1.0 / math.sqrt(tau))
    H_rb = (rb.dense_precision(st) - delta * np.eye(model.D))[np.ix_(perm, perm)]
    H_lt = la.posterior_precision.detach().numpy() - delta * np.eye(model.D)
    rows.append((f"regression EF full: H_refbayes / H_laplace-torch (tau / 2 = {tau / 2:g})",
                 float(np.median(H_rb / H_lt))))
    rows.append(("regression EF full: H_refbayes vs (tau / 2) H_laplace-torch",
                 _rel(H_rb, 0.5 * tau * H_lt)))
    # K-FAC: per tensor blocks
    cfg = rb.LaplaceConfig(delta, "kron", "ggn")
    st = rb.fit(model, theta, X, y, cfg)
    la = _fit_lt(net, X, y, False, "kron", BackPackGGN, delta, 1.0 / math.sqrt(tau))
    P_rb = rb.dense_precision(st)[np.ix_(perm, perm)]
    P_lt = la.posterior_precision.to_matrix().detach().numpy()
    same, cross = np.zeros_like(P_rb, bool), np.zeros_like(P_rb, bool)
    off = 0
    for n_in, n_out in zip(model.sizes[:-1], model.sizes[1:]):
        w = slice(off, off + n_in * n_out)
        b = slice(off + n_in * n_out, off + (n_in + 1) * n_out)
        same[w, w] = same[b, b] = True
        cross[w, b] = cross[b, w] = True
        off += (n_in + 1) * n_out
    rows.append(("regression K-FAC: W and b blocks (laplace.22)",
                 _rel(P_rb[same], P_lt[same])))
    rows.append(("regression K-FAC: W-b cross block, max |laplace-torch| (dropped: 0)",
                 float(np.max(np.abs(P_lt[cross])))))
    rows.append(("regression K-FAC: W-b cross block, max |refbayes| (kept)",
                 float(np.max(np.abs(P_rb[cross])))))
    rows.append(("regression K-FAC: log marginal likelihood, rel. difference (cross block)",
                 _rel(rb.log_marginal_likelihood(model, st, X, y, cfg),
                      float(la.log_marginal_likelihood().detach()))))


def last_layer_rows(rows):
    """laplace-torch's last-layer Laplace (full GGN) against subset "last_layer" (laplace.23)."""
    model, X, y, X_star = regression_problem()
    delta = 1.0
    theta = find_map(model, X, y, np.full(model.D, delta)).theta_map
    tau = model.likelihood.noise_precision
    net = torch_net(model, theta)
    la = Laplace(net, "regression", subset_of_weights="last_layer", hessian_structure="full",
                 backend=BackPackGGN, prior_precision=delta, sigma_noise=1.0 / math.sqrt(tau))
    la.fit(_loader(X, y, False))
    cfg = rb.LaplaceConfig(delta, "full", "ggn", "last_layer")
    st = rb.fit(model, theta, X, y, cfg)
    head = model.sizes[-2:]
    Dq = (head[0] + 1) * head[1]
    perm = torch_order(MLP(list(head), "tanh", "gaussian"))  # the head's own order
    rows.append(("regression last layer, GGN full: posterior precision",
                 _rel(rb.dense_precision(st)[np.ix_(perm, perm)],
                      la.posterior_precision.detach().numpy())))
    rows.append(("regression last layer: log marginal likelihood",
                 _rel(rb.log_marginal_likelihood(model, st, X, y, cfg),
                      float(la.log_marginal_likelihood().detach()))))
    assert st.n_fixed == model.D - Dq


def classification_rows(rows):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((40, 2))
    y = (X[:, 0] > 0).astype(int) + (X[:, 1] > 0.5).astype(int)
    model = MLP([2, 5, 3], "tanh", "categorical")
    theta = 0.5 * model.init_theta(np.random.default_rng(1))
    delta = 2.0
    perm = torch_order(model)
    net = torch_net(model, theta)
    cfg = rb.LaplaceConfig(delta, "full", "ggn")
    st = rb.fit(model, theta, X, y, cfg)
    la = _fit_lt(net, X, y, True, "full", BackPackGGN, delta)
    rows.append(("classification GGN full: posterior precision",
                 _rel(rb.dense_precision(st)[np.ix_(perm, perm)],
                      la.posterior_precision.detach().numpy())))
    X_star = rng.standard_normal((6, 2))
    p_lt = la(torch.from_numpy(X_star), pred_type="glm", link_approx="probit").detach().numpy()
    p_rb = rb.glm_class_predictive(model, st, X_star, "probit").probs
    rows.append(("classification probit predictive (laplace.14)", _rel(p_rb, p_lt)))


def main() -> int:
    rows: list[tuple[str, float]] = []
    regression_rows(rows)
    last_layer_rows(rows)
    classification_rows(rows)
    from importlib.metadata import version
    print(f"laplace-torch {version('laplace-torch')}, torch {torch.__version__}; "
          "the problem of `refbayes trace laplace` (D = 13) and a 2-5-3 tanh classifier")
    width = max(len(r[0]) for r in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value:.3e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
