"""Conformance of laplace-torch (aleximmer/Laplace, ``laplace``) with refbayes.methods.laplace.

The problem is the one of ``refbayes trace laplace`` (``refbayes.tracing.problems.regression_problem``: a [1, 4, 1]
tanh MLP regression, N = 30, D = 13), its deterministic MAP
(``refbayes.tracing.problems.find_map``, prior precision 1), noise precision tau = 16 (laplace-torch's
``sigma_noise = 1 / sqrt(tau) = 0.25``), prior precision delta = 1 on both sides, float64.
laplace-torch sees the same network as an ``nn.Sequential`` of ``nn.Linear`` / ``nn.Tanh`` with
the MAP copied in (each weight transposed), one full-batch ``DataLoader``, and its default
curvature backend (Curvlinops) unless a row says otherwise.

For every structure both offer ("full", "diag", "kron") and both subsets ("all", "last_layer"),
GGN curvature, the rows compare: the posterior precision (dense, or its diagonal, in refbayes'
parameter order), ``log_det_ratio`` and ``scatter`` (laplace.6), the log marginal likelihood,
and the GLM predictive mean and variance at the five test inputs (laplace.7). Further rows:
the Hessian (``CurvlinopsHessian``), the empirical Fisher (``CurvlinopsEF``) and the temperature.

Mappings used (derivations/laplace.md, Conventions): K-FAC per tensor without the W-b cross
block (laplace.24): refbayes' own factors rearranged as blockdiag(A~ kron B + delta I,
A_{bb} B + delta I) with A~ the top-left block of A_l, and laplace-torch's log det
sum log(outer(lam_A~, lam_B) + delta); temperature T: H / T and the squared-error term / T with
the normaliser at sigma_noise, i.e. refbayes at noise precision tau / T plus (N K / 2) log T
in the evidence. Dense checks deciding a defect: the GGN tau J^T J, the Hessian and the EF
sum_i g_i g_i^T of the Gaussian negative log-likelihood by ``torch.func`` autograd of the torch
network (independent of both libraries).
"""
from __future__ import annotations

import math
from importlib.metadata import version

import numpy as np
import scipy.linalg

from refbayes._tolerances import rel_err
from refbayes.conformance import Report, classify, dense_side, torch_mlp, torch_order
from refbayes.methods import laplace
from refbayes.models import MLP
from refbayes.tracing.problems import regression_problem, shipped_map

__all__ = ["report"]

PRIOR_PRECISION = 1.0
TEMPERATURE = 2.0
KEYS = ("precision", "log_det_ratio", "scatter", "log_lik", "lml", "f_mean", "f_var")


def _loader(X, y):
    import torch
    data = torch.utils.data.TensorDataset(torch.from_numpy(X), torch.from_numpy(y[:, None]))
    return torch.utils.data.DataLoader(data, batch_size=len(X))


def _lt_fit(net, X, y, X_star, subset, structure, tau, backend=None, temperature=1.0) -> dict:
    """Fit laplace-torch and read every compared quantity (precision in torch order)."""
    import torch
    from laplace import Laplace
    extra = {} if backend is None else {"backend": backend}
    la = Laplace(net, "regression", subset_of_weights=subset, hessian_structure=structure,
                 prior_precision=PRIOR_PRECISION, sigma_noise=1.0 / math.sqrt(tau),
                 temperature=temperature, **extra)
    la.fit(_loader(X, y))
    P = la.posterior_precision
    P = P.to_matrix() if hasattr(P, "to_matrix") else P
    f_mu, f_var = la(torch.from_numpy(X_star), pred_type="glm")
    return {"precision": _np(P), "log_det_ratio": float(la.log_det_ratio),
            "scatter": float(la.scatter), "log_lik": float(la.log_likelihood),
            "lml": float(la.log_marginal_likelihood()), "f_mean": _np(f_mu),
            "f_var": _np(f_var)}


def _np(t) -> np.ndarray:
    return t.detach().numpy().copy()


def _to_refbayes_order(q: dict, perm) -> dict:
    """Permute a torch-order precision (matrix or diagonal) into refbayes' order."""
    inv = np.argsort(perm)
    P = q["precision"]
    return dict(q, precision=P[np.ix_(inv, inv)] if P.ndim == 2 else P[inv])


def _rb_fit(model, theta, X, y, X_star, cfg) -> tuple[dict, object]:
    """Fit refbayes and read the same quantities (refbayes order)."""
    st = laplace.fit(model, theta, X, y, cfg)
    return _rb_quantities(model, st, X, y, X_star, cfg), st


def _rb_quantities(model, st, X, y, X_star, cfg) -> dict:
    if st.kron is not None:
        P = laplace.dense_precision(st)
    else:
        P = st.Sigma_inv if st.Sigma_inv is not None else st.prec_diag
    mu_q, delta_q = st.mu[st.n_fixed:], st.prior_prec
    log_det = (np.linalg.slogdet(P)[1] if P.ndim == 2 else np.sum(np.log(P)))
    pred = laplace.glm_predictive(model, st, X_star)
    return {"precision": P, "log_det_ratio": float(log_det - np.sum(np.log(delta_q))),
            "scatter": float(np.sum(delta_q * mu_q * mu_q)),
            "log_lik": -float(model.loss(st.mu, X, y)),
            "lml": float(laplace.log_marginal_likelihood(model, st, X, y, cfg)),
            "f_mean": pred.f_mean, "f_var": pred.f_var}


def _flat_fn(net, subset):
    """(f, w0): f(w, x) the network output (N,) as a function of the random tensors' flat
    values w (torch order; the last Linear's weight and bias for "last_layer"), w0 the MAP's."""
    import torch
    from torch.func import functional_call
    params = {k: v.detach() for k, v in net.named_parameters()}
    names = list(params) if subset == "all" else list(params)[-2:]
    sizes = [params[k].numel() for k in names]

    def f(w, x):
        p, off = dict(params), 0
        for k, n in zip(names, sizes):
            p[k] = w[off:off + n].reshape(params[k].shape)
            off += n
        return functional_call(net, p, (x,)).reshape(-1)
    return f, torch.cat([params[k].reshape(-1) for k in names])


def _dense_check(net, X, y, X_star, tau, subset, curvature) -> dict:
    """Every quantity from a dense torch.func autograd curvature of the Gaussian NLL (torch order).

    GGN tau J^T J, EF sum_i g_i g_i^T with g_i = tau r_i J_i^T, or the Hessian of
    (tau / 2) sum_i r_i^2; J = d f / d theta_q at the MAP, theta_q the random tensors.
    """
    import torch
    from torch.func import hessian, jacrev
    f, w0 = _flat_fn(net, subset)
    Xt, yt, Xs = torch.from_numpy(X), torch.from_numpy(y), torch.from_numpy(X_star)

    J = jacrev(f)(w0, Xt)
    r = f(w0, Xt) - yt
    if curvature == "ggn":
        H = tau * J.T @ J
    elif curvature == "ef":
        G = tau * r[:, None] * J
        H = G.T @ G
    else:
        H = hessian(lambda w: 0.5 * tau * torch.sum((f(w, Xt) - yt) ** 2))(w0)
    H = H.numpy()
    D_q = w0.numel()
    P = H + PRIOR_PRECISION * np.eye(D_q)
    Js = jacrev(f)(w0, Xs).numpy()
    N = len(y)
    log_lik = -float(0.5 * tau * torch.sum(r * r) + 0.5 * N * math.log(2 * math.pi / tau))
    log_det_ratio = float(np.linalg.slogdet(P)[1] - D_q * math.log(PRIOR_PRECISION))
    scatter = float(PRIOR_PRECISION * torch.sum(w0 * w0))
    f_var = np.einsum("md,de,me->m", Js, np.linalg.inv(P), Js)[:, None, None]
    return {"precision": P, "log_det_ratio": log_det_ratio, "scatter": scatter,
            "log_lik": log_lik, "lml": log_lik - 0.5 * (log_det_ratio + scatter),
            "f_mean": f(w0, Xs).detach().numpy()[:, None], "f_var": f_var}


def _dense_diag(full: dict, net, X_star, subset) -> dict:
    """Turn a full dense check into the "diag" structure's quantities."""
    import torch
    from torch.func import jacrev
    d = np.diagonal(full["precision"]).copy()
    f, w0 = _flat_fn(net, subset)

    Js = jacrev(f)(w0, torch.from_numpy(X_star)).numpy()
    ldr = float(np.sum(np.log(d)) - d.size * math.log(PRIOR_PRECISION))
    return dict(full, precision=d, log_det_ratio=ldr,
                lml=full["log_lik"] - 0.5 * (ldr + full["scatter"]),
                f_var=np.einsum("md,d,md->m", Js, 1.0 / d, Js)[:, None, None])


def _compare(rows, label, rb, lt, check, what, keys=KEYS):
    for key in keys:
        a, b = np.asarray(rb[key], float), np.asarray(lt[key], float).reshape(np.shape(rb[key]))
        c = None if check is None else np.asarray(check[key], float).reshape(np.shape(rb[key]))
        rows.append(classify(f"{label}: {key}", rel_err(a, b),
                             decide=None if c is None else
                             (lambda a=a, b=b, c=c: dense_side(a, b, c, what))))


def _per_tensor_kron(st):
    """refbayes' K-FAC factors in laplace-torch's per-tensor form (laplace.24).

    Per layer with A_l = [[A~, m], [m^T, a]] ((n_in + 1) square) and B_l: the weight block
    A~ kron B + delta I, the bias block a B + delta I, no cross block; log det as laplace-torch
    forms it, sum log(outer(eig A~, eig B) + delta) + sum log(a eig B + delta).
    """
    blocks, log_det, off = [], 0.0, 0
    for blk in st.kron:
        n_in, n_out = blk.A.shape[0] - 1, blk.B.shape[0]
        d = st.prior_prec[off]
        At, a = blk.A[:n_in, :n_in], blk.A[n_in, n_in]
        lam_A, lam_B = np.linalg.eigvalsh(At), np.linalg.eigvalsh(blk.B)
        blocks += [np.kron(At, blk.B) + d * np.eye(n_in * n_out), a * blk.B + d * np.eye(n_out)]
        log_det += np.sum(np.log(np.outer(lam_A, lam_B) + d)) + np.sum(np.log(a * lam_B + d))
        off += (n_in + 1) * n_out
    return scipy.linalg.block_diag(*blocks), float(log_det)


def _kron_rows(rows, label, model, st, cfg, rb, lt, X, y, X_star):
    """Raw (refbayes' augmented-input K-FAC) and mapped (per tensor) comparisons (laplace.24)."""
    P_map, log_det = _per_tensor_kron(st)
    full = laplace.LaplaceState(st.mu, P_map, None, st.prior_prec, None, st.n_fixed)
    ldr = log_det - float(np.sum(np.log(st.prior_prec)))
    mapped = {"precision": P_map, "log_det_ratio": ldr,
              "lml": rb["log_lik"] - 0.5 * (ldr + rb["scatter"]),
              "f_var": laplace.glm_predictive(model, full, X_star).f_var}
    note = ("(laplace.24) K-FAC per tensor: refbayes' A_l, B_l as blockdiag(A~ kron B + delta I, "
            "A_bb B + delta I), no W-b cross block; log det sum log(outer(lam_A~, lam_B) + delta)")
    for key in ("precision", "log_det_ratio", "lml", "f_var"):
        b = np.asarray(lt[key], float).reshape(np.shape(rb[key]))
        raw = rel_err(rb[key], b)
        err = rel_err(np.asarray(mapped[key], float).reshape(b.shape), b)
        rows.append(classify(f"{label}: {key}", err, raw_error=raw, note=note))
    _compare(rows, label, rb, lt, None, "", keys=("scatter", "log_lik", "f_mean"))


def _ef_rows(rows, model, theta, X, y, X_star, net, tau):
    """EF: laplace-torch's regression EF against the EF of the Gaussian NLL (dense check)."""
    from laplace.curvature import CurvlinopsEF

    perm = torch_order(model.sizes)
    inv = np.argsort(perm)
    cfg = laplace.LaplaceConfig(PRIOR_PRECISION, "full", "ef")
    rb, st = _rb_fit(model, theta, X, y, X_star, cfg)
    lt = _to_refbayes_order(_lt_fit(net, X, y, X_star, "all", "full", tau, CurvlinopsEF), perm)
    check = _dense_check(net, X, y, X_star, tau, "all", "ef")
    check = dict(check, precision=check["precision"][np.ix_(inv, inv)])
    # the conventions note's factor: H_laplace-torch = (2 / tau) H_refbayes
    eye = PRIOR_PRECISION * np.eye(model.D)
    P_scaled = (2.0 / tau) * (rb["precision"] - eye) + eye
    scaled = laplace.LaplaceState(st.mu, P_scaled, None, st.prior_prec, None, 0)
    lml_scaled = float(laplace.log_marginal_likelihood(model, scaled, X, y, cfg))
    what = "dense autograd EF sum_i g_i g_i^T of the Gaussian NLL"
    for key, scaled_value in (("precision", P_scaled), ("lml", lml_scaled)):
        e_scaled = rel_err(scaled_value, lt[key])
        rows.append(classify(
            f"all, full, EF (CurvlinopsEF): {key}", rel_err(rb[key], lt[key]),
            note=(f"H_laplace-torch = (2 / tau) x EF of its own Gaussian likelihood: the 1/2 of "
                  f"the loss factor is applied once to a quadratic form in the gradient; with "
                  f"(2 / tau) H_refbayes: {e_scaled:.1e} (laplace.md EF note)"),
            decide=lambda key=key: dense_side(rb[key], lt[key], check[key], what)))


def _temperature_rows(rows, model, theta, X, y, X_star, net, tau):
    """Temperature T: refbayes has none; laplace-torch's T maps to noise precision tau / T."""
    T = TEMPERATURE
    perm = torch_order(model.sizes)
    cfg = laplace.LaplaceConfig(PRIOR_PRECISION, "full", "ggn")
    lt = _to_refbayes_order(_lt_fit(net, X, y, X_star, "all", "full", tau, temperature=T), perm)
    rb, _ = _rb_fit(model, theta, X, y, X_star, cfg)
    model_T = MLP(list(model.sizes), activation=model.activation, likelihood="gaussian",
                  noise_precision=tau / T)
    rb_T, _ = _rb_fit(model_T, theta, X, y, X_star, cfg)
    NK_log_T = 0.5 * len(y) * model.sizes[-1] * math.log(T)
    note = (f"temperature T = {T:g}: H / T = H at noise precision tau / T; laplace-torch's "
            f"log_likelihood divides the squared error by T, not its normaliser: "
            f"+ (N K / 2) log T (laplace.md, temperature row)")
    for key, mapped in (("precision", rb_T["precision"]), ("log_lik", rb_T["log_lik"] + NK_log_T),
                        ("lml", rb_T["lml"] + NK_log_T), ("f_var", rb_T["f_var"])):
        b = np.asarray(lt[key], float).reshape(np.shape(rb[key]))
        rows.append(classify(f"all, full, temperature {T:g}: {key}", rel_err(mapped, b),
                             raw_error=rel_err(rb[key], b), note=note))


def report() -> Report:
    """Run laplace-torch and refbayes on the trace problem and classify every difference.

    Returns
    -------
    Report
        One row per (subset, structure, quantity), plus the Hessian, EF and temperature rows.
    """
    import torch

    model, X, y, X_star = regression_problem()
    theta = shipped_map(PRIOR_PRECISION).theta_map
    tau = float(model.likelihood.noise_precision)
    net = torch_mlp(model, theta)
    rows = []
    previous = torch.get_default_dtype()
    try:
        # The comparisons run with torch's default dtype float64 (Curvlinops' dense "full"
        # curvature is built on an identity of the default dtype; see _default_dtype_rows).
        torch.set_default_dtype(torch.float64)
        _rows(rows, model, theta, X, y, X_star, net, tau)
        torch.set_default_dtype(torch.float32)
        _default_dtype_rows(rows, model, theta, X, y, X_star, net, tau)
    finally:
        torch.set_default_dtype(previous)
    title = (f"laplace-torch {version('laplace-torch')} (default backend CurvlinopsGGN, "
             f"curvlinops-for-pytorch {version('curvlinops-for-pytorch')}), torch "
             f"{torch.__version__}, float64; problem of `refbayes trace laplace` (MLP "
             f"{list(model.sizes)} tanh, N = {len(y)}, D = {model.D}, sigma_noise = "
             f"{1 / math.sqrt(tau):g}, prior precision {PRIOR_PRECISION:g})")
    return Report("laplace-torch", title, rows)


def _default_dtype_rows(rows, model, theta, X, y, X_star, net, tau):
    """The full GGN of a float64 network under torch's default dtype float32."""
    perm = torch_order(model.sizes)
    inv = np.argsort(perm)
    cfg = laplace.LaplaceConfig(PRIOR_PRECISION, "full", "ggn")
    rb, _ = _rb_fit(model, theta, X, y, X_star, cfg)
    lt = _to_refbayes_order(_lt_fit(net, X, y, X_star, "all", "full", tau), perm)
    check = _dense_check(net, X, y, X_star, tau, "all", "ggn")
    check = dict(check, precision=check["precision"][np.ix_(inv, inv)])
    note = ("laplace/curvature/curvlinops.py CurvlinopsInterface.full multiplies the GGN "
            "operator onto torch.eye(D) of torch's DEFAULT dtype: a float32-accurate H for a "
            "float64 model (the same fit under default float64 agrees, rows above)")
    for key in ("precision", "lml"):
        rows.append(classify(
            f"all, full, GGN, torch default dtype float32: {key}", rel_err(rb[key], lt[key]),
            note=note, decide=lambda key=key: dense_side(rb[key], lt[key], check[key],
                                                         "dense autograd GGN tau J^T J")))


def _rows(rows, model, theta, X, y, X_star, net, tau):
    """Every structure and subset (GGN), the Hessian, the EF and the temperature rows."""
    from laplace.curvature import CurvlinopsHessian

    for subset in ("all", "last_layer"):
        perm = torch_order(model.sizes if subset == "all" else model.sizes[-2:])
        inv = np.argsort(perm)
        check = _dense_check(net, X, y, X_star, tau, subset, "ggn")
        check = dict(check, precision=check["precision"][np.ix_(inv, inv)])
        for structure in ("full", "diag", "kron"):
            label = f"{subset}, {structure}, GGN"
            cfg = laplace.LaplaceConfig(PRIOR_PRECISION, structure, "ggn", subset)
            rb, st = _rb_fit(model, theta, X, y, X_star, cfg)
            lt = _to_refbayes_order(_lt_fit(net, X, y, X_star, subset, structure, tau), perm)
            what = "dense autograd GGN tau J^T J"
            if structure == "full":
                _compare(rows, label, rb, lt, check, what)
            elif structure == "diag":
                _compare(rows, label, rb, lt, _dense_diag(check, net, X_star, subset),
                         what + " (its diagonal)")
            else:
                _kron_rows(rows, label, model, st, cfg, rb, lt, X, y, X_star)
    # the Hessian
    perm = torch_order(model.sizes)
    inv = np.argsort(perm)
    cfg = laplace.LaplaceConfig(PRIOR_PRECISION, "full", "hessian")
    rb, _ = _rb_fit(model, theta, X, y, X_star, cfg)
    lt = _to_refbayes_order(_lt_fit(net, X, y, X_star, "all", "full", tau, CurvlinopsHessian),
                            perm)
    check = _dense_check(net, X, y, X_star, tau, "all", "hessian")
    check = dict(check, precision=check["precision"][np.ix_(inv, inv)])
    _compare(rows, "all, full, Hessian (CurvlinopsHessian)", rb, lt, check,
             "dense autograd Hessian of the Gaussian NLL",
             keys=("precision", "log_det_ratio", "lml", "f_var"))
    _ef_rows(rows, model, theta, X, y, X_star, net, tau)
    _temperature_rows(rows, model, theta, X, y, X_star, net, tau)
