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

Classification (the k-tied trace's 3-class problem, ``ktied_problem``: MLP [4, 5, 3] tanh,
N = 30, D = 43, its MAP by ``find_map`` at prior precision 1, five test inputs): the full GGN
Laplace, all weights and last layer, every quantity above plus the probit link (laplace.14);
the MC link (laplace.15) draw by draw with the draws laplace-torch takes; the MC link and the
sampling ("nn") predictive with ``generator=``; temperature; K-FAC with ``damping=True``.
Tempered evidence: Bayesian linear regression (D = 4), where the Laplace evidence at the
tempered posterior's mode is exact, against the closed-form integral of p(D | w)^(1/T) p(w)
(``exact_tempered_log_evidence``). refbayes has no temperature, damping or generator: those
rows compare laplace-torch with a dense float64 computation alone (``_dense_row``): the error
is max|dense - library| / max|library| and a defect's note gives what the documentation says
the number is, what laplace-torch computes, the dense and the library value.

Mappings used (derivations/laplace.md, Conventions): K-FAC per tensor without the W-b cross
block (laplace.22): refbayes' own factors rearranged as blockdiag(A~ kron B + delta I,
A_{bb} B + delta I) with A~ the top-left block of A_l, and laplace-torch's log det
sum log(outer(lam_A~, lam_B) + delta); temperature T: H / T and the squared-error term / T with
the normaliser at sigma_noise, i.e. refbayes at noise precision tau / T plus (N K / 2) log T
in the evidence (a convention for the precision and f_var; for log_likelihood and the evidence
the rows are decided against the dense tempered quantities, and are defects). Dense checks
deciding a defect: the GGN tau J^T J, the Hessian and the EF sum_i g_i g_i^T of the Gaussian
negative log-likelihood, and the GGN sum_i J_i^T (diag p_i - p_i p_i^T) J_i of the
cross-entropy, by ``torch.func`` autograd of the torch network (independent of both
libraries); the damped K-FAC precision built densely (``numpy.kron``) from laplace-torch's own
factors; MC averages over the very draws named, formed densely.
"""
from __future__ import annotations

import math
from importlib.metadata import version

import numpy as np
import scipy.linalg
from scipy.special import log_softmax, softmax
from scipy.stats import multivariate_normal, norm

from refbayes._tolerances import rel_err
from refbayes.conformance import Report, classify, dense_side, torch_mlp, torch_order
from refbayes.methods import laplace
from refbayes.models import MLP
from refbayes.tracing.problems import (
    find_map,
    ktied_problem,
    regression_problem,
    shipped_map,
)

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


def _rb_fit(model, theta, X, y, X_star, cfg, check_stationary=True) -> tuple[dict, object]:
    """Fit refbayes and read the same quantities (refbayes order)."""
    st = laplace.fit(model, theta, X, y, cfg, check_stationary=check_stationary)
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


def _flat_fn(net, subset, flat=True):
    """(f, w0): f(w, x) the network output (N,) (flat) or (N, K) as a function of the random
    tensors' flat values w (torch order; the last Linear's weight and bias for "last_layer"),
    w0 the MAP's."""
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
        out = functional_call(net, p, (x,))
        return out.reshape(-1) if flat else out
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
    """refbayes' K-FAC factors in laplace-torch's per-tensor form (laplace.22).

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
    """Raw (refbayes' augmented-input K-FAC) and mapped (per tensor) comparisons (laplace.22)."""
    P_map, log_det = _per_tensor_kron(st)
    full = laplace.LaplaceState(st.mu, P_map, None, st.prior_prec, None, st.n_fixed)
    ldr = log_det - float(np.sum(np.log(st.prior_prec)))
    mapped = {"precision": P_map, "log_det_ratio": ldr,
              "lml": rb["log_lik"] - 0.5 * (ldr + rb["scatter"]),
              "f_var": laplace.glm_predictive(model, full, X_star).f_var}
    note = ("(laplace.22) K-FAC per tensor: refbayes' A_l, B_l as blockdiag(A~ kron B + delta I, "
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
    # deliberate: the mapping evaluates the tau / T model at laplace-torch's mean, the MAP at
    # tau, which is not that model's MAP (laplace.fit's stationarity check would warn)
    rb_T, _ = _rb_fit(model_T, theta, X, y, X_star, cfg, check_stationary=False)
    note = (f"temperature T = {T:g}: H / T = H at noise precision tau / T "
            f"(laplace.md, temperature row)")
    for key, mapped in (("precision", rb_T["precision"]), ("f_var", rb_T["f_var"])):
        b = np.asarray(lt[key], float).reshape(np.shape(rb[key]))
        rows.append(classify(f"all, full, temperature {T:g}: {key}", rel_err(mapped, b),
                             raw_error=rel_err(rb[key], b), note=note))
    # log_lik and lml: the tempered likelihood p(D | theta)^(1/T), densely (torch.func GGN)
    check = _dense_check(net, X, y, X_star, tau, "all", "ggn")
    eye = PRIOR_PRECISION * np.eye(model.D)
    P_T = (check["precision"] - eye) / T + eye
    ldr_T = float(np.linalg.slogdet(P_T)[1] - model.D * math.log(PRIOR_PRECISION))
    dense = {"log_lik": check["log_lik"] / T}
    dense["lml"] = dense["log_lik"] - 0.5 * (ldr_T + check["scatter"])
    NK_log_T = 0.5 * len(y) * model.sizes[-1] * math.log(T)
    mapped = {"log_lik": rb_T["log_lik"] + NK_log_T, "lml": rb_T["lml"] + NK_log_T}
    what = {"log_lik": "dense (1/T) log p(D | theta*) of the Gaussian likelihood",
            "lml": ("dense Laplace evidence of the tempered posterior: (1/T) log p(D | theta*) "
                    "- (1/2)(log det(H_GGN / T + delta I) - D log delta + delta |theta*|^2), "
                    "H_GGN by torch.func")}
    for key in ("log_lik", "lml"):
        e_map = rel_err(mapped[key], lt[key])
        _dense_row(rows, f"all, full, temperature {T:g}: {key}", dense[key], lt[key], what[key],
                   note=(f"{_TEMPERATURE_DEFECT}; it equals refbayes at tau / T plus (N K / 2) "
                         f"log T to {e_map:.1e} (the mapping of laplace.md); the exact "
                         f"tempered evidence: the linear-Gaussian rows"))


def report() -> Report:
    """Run laplace-torch and refbayes on the trace problem and classify every difference.

    Returns
    -------
    Report
        One row per (subset, structure, quantity), plus the Hessian, EF and temperature rows,
        the tempered linear-Gaussian rows and the classification rows.
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
             f"{1 / math.sqrt(tau):g}, prior precision {PRIOR_PRECISION:g}); classification "
             f"rows: the k-tied trace's 3-class MLP [4, 5, 3] tanh, N = 30, D = 43; tempered "
             f"evidence: Bayesian linear regression, D = {len(LINEAR_W)}")
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
    _tempered_linear_rows(rows)
    _classification_rows(rows)


# --- classification, the generator argument, K-FAC damping, tempered evidence -------------

CLASS_TEST_SEED = 1   # the classifier's X_star = default_rng(1).standard_normal((5, n_in))
CLASS_TEST_POINTS = 5
MC_SAMPLES = 64       # n_samples of the MC-link and NN-predictive rows
GENERATOR_SEED = 0    # the torch.Generator passed as generator=
GLOBAL_SEED = 5       # torch.manual_seed(GLOBAL_SEED) just before each sampling call
LINEAR_SEED = 2       # the linear-Gaussian data of the tempered-evidence rows
LINEAR_ROWS = 30
LINEAR_W = (1.0, -0.5, 0.25, 0.3)  # teacher weights, intercept last
LINEAR_SIGMA = 0.25   # noise standard deviation, as the MLP problem's


def _fmt(dense, lib) -> str:
    d, b = np.asarray(dense, float), np.asarray(lib, float)
    if d.size == 1:
        return (f"dense {float(d.item()):.10g}, library {float(b.item()):.10g}, library - dense "
                f"{float(b.item() - d.item()):+.4g}")
    return f"max |library - dense| {np.max(np.abs(b - d)):.3g}, max |dense| {np.max(np.abs(d)):.3g}"


def _dense_row(rows, quantity, dense, lib, what, note=""):
    """A row decided by a dense float64 computation alone (refbayes has no counterpart):
    error max|dense - library| / max|library|."""
    dense = np.asarray(dense, float)
    lib = np.asarray(lib, float).reshape(dense.shape)
    rows.append(classify(quantity, rel_err(dense, lib), note=note,
                         decide=lambda: f"library wrong by {what}: {_fmt(dense, lib)}"))


def _class_problem():
    """The k-tied trace's 3-class problem (MLP [4, 5, 3] tanh, N = 30, D = 43), its MAP at
    prior precision 1 by ``find_map`` and CLASS_TEST_POINTS test inputs."""
    model, X, y = ktied_problem()
    theta = find_map(model, X, y, np.full(model.D, PRIOR_PRECISION)).theta_map
    X_star = np.random.default_rng(CLASS_TEST_SEED).standard_normal(
        (CLASS_TEST_POINTS, model.sizes[0]))
    return model, theta, X, y, X_star


def _lt_class(net, X, y, subset, structure, temperature=1.0, damping=None):
    import torch
    from laplace import Laplace
    extra = {} if damping is None else {"damping": damping}
    la = Laplace(net, "classification", subset_of_weights=subset, hessian_structure=structure,
                 prior_precision=PRIOR_PRECISION, temperature=temperature, **extra)
    data = torch.utils.data.TensorDataset(torch.from_numpy(X), torch.from_numpy(y.astype(np.int64)))
    la.fit(torch.utils.data.DataLoader(data, batch_size=len(X)))
    return la


def _lt_class_quantities(la, X_star, perm=None) -> dict:
    """laplace-torch's classifier quantities; f_mu, f_var by ``_glm_predictive_distribution``
    (what ``__call__`` feeds its links), the probit predictive by ``la(x)``."""
    import torch
    Xs = torch.from_numpy(X_star)
    P = la.posterior_precision
    P = _np(P.to_matrix() if hasattr(P, "to_matrix") else P)
    if perm is not None:
        inv = np.argsort(perm)
        P = P[np.ix_(inv, inv)]
    f_mu, f_var = la._glm_predictive_distribution(Xs)
    return {"precision": P, "log_det_ratio": float(la.log_det_ratio),
            "scatter": float(la.scatter), "log_lik": float(la.log_likelihood),
            "lml": float(la.log_marginal_likelihood()), "f_mean": _np(f_mu), "f_var": _np(f_var),
            "probit": _np(la(Xs, link_approx="probit"))}


def _dense_class(net, X, y, X_star, subset, temperature=1.0) -> dict:
    """The classifier's quantities from a dense torch.func Jacobian (torch order):
    H = sum_i J_i^T (diag p_i - p_i p_i^T) J_i (the GGN of the cross-entropy), the tempered
    precision H / T + delta I, (1/T) sum_i log softmax(f_i)_{y_i}, f_var = J* P^{-1} J*^T and
    the probit line softmax(f / sqrt(1 + pi/8 diag f_var))."""
    import torch
    from torch.func import jacrev
    f, w0 = _flat_fn(net, subset, flat=False)
    Xt, Xs = torch.from_numpy(X), torch.from_numpy(X_star)
    J = jacrev(f)(w0, Xt).detach().numpy()
    F = f(w0, Xt).detach().numpy()
    p = softmax(F, axis=1)
    Lam = np.einsum("nk,kl->nkl", p, np.eye(p.shape[1])) - np.einsum("nk,nl->nkl", p, p)
    H = np.einsum("nkd,nkl,nle->de", J, Lam, J)
    T, w = temperature, w0.detach().numpy()
    P = H / T + PRIOR_PRECISION * np.eye(w.size)
    log_lik = float(np.sum(log_softmax(F, axis=1)[np.arange(len(y)), y])) / T
    ldr = float(np.linalg.slogdet(P)[1] - w.size * math.log(PRIOR_PRECISION))
    scatter = float(PRIOR_PRECISION * w @ w)
    Js = jacrev(f)(w0, Xs).detach().numpy()
    Sigma = np.linalg.inv(P)
    f_var = np.einsum("mkd,de,mle->mkl", Js, Sigma, Js)
    f_mean = f(w0, Xs).detach().numpy()
    kappa = 1.0 / np.sqrt(1.0 + math.pi / 8.0 * np.diagonal(f_var, axis1=1, axis2=2))
    return {"precision": P, "log_det_ratio": ldr, "scatter": scatter, "log_lik": log_lik,
            "lml": log_lik - 0.5 * (ldr + scatter), "f_mean": f_mean, "f_var": f_var,
            "probit": softmax(kappa * f_mean, axis=1), "Sigma": Sigma, "J_star": Js, "w0": w,
            "f": f}


PROBIT_CHECK_DRAWS = 2 ** 18  # draws of the many-sample E[softmax(f*)] in the probit note
PROBIT_CHECK_SEED = 0


def _probit_note(dense) -> str:
    """The probit link is a documented approximation of E[softmax(f*)], f* ~ N(f, f_var): its
    distance from a many-sample estimate of the expectation, with the estimate's standard error."""
    eps = np.random.default_rng(PROBIT_CHECK_SEED).standard_normal(
        (dense["f_var"].shape[1], PROBIT_CHECK_DRAWS))
    C = np.linalg.cholesky(dense["f_var"])
    p = softmax(dense["f_mean"][None] + np.einsum("mkl,ls->smk", C, eps), axis=2)
    mean, se = p.mean(axis=0), p.std(axis=0) / math.sqrt(PROBIT_CHECK_DRAWS)
    return (f"(laplace.14) a documented approximation: max |probit - E[softmax(f*)]| "
            f"{np.max(np.abs(dense['probit'] - mean)):.3g}, E by {PROBIT_CHECK_DRAWS} draws "
            f"(standard error <= {np.max(se):.1g})")


def _dense_glm_mc(f_mean, f_var, eps) -> np.ndarray:
    """(1/S) sum_s softmax(f_mean + chol(f_var) eps_s) per test point, eps (K, S) shared."""
    C = np.linalg.cholesky(f_var)
    f_s = f_mean[None] + np.einsum("mkl,ls->smk", C, eps)
    return softmax(f_s, axis=2).mean(axis=0)


def _dense_nn(dense, X_star, eps) -> np.ndarray:
    """(1/S) sum_s softmax(f(x*, theta_s)), theta_s = theta* + L eps_s with L = chol(P^{-1})
    (laplace-torch's posterior_scale) and eps (S, D) in its ``sample`` layout."""
    import torch
    L = np.linalg.cholesky(dense["Sigma"])
    thetas = dense["w0"][None] + eps @ L.T
    f, Xs = dense["f"], torch.from_numpy(X_star)
    return np.mean([softmax(f(torch.from_numpy(t), Xs).detach().numpy(), axis=1)
                    for t in thetas], axis=0)


def _rb_class(model, theta, X, y, X_star, cfg) -> tuple[dict, object]:
    st = laplace.fit(model, theta, X, y, cfg)
    mu_q, delta_q = st.mu[st.n_fixed:], st.prior_prec
    pred = laplace.glm_class_predictive(model, st, X_star)
    return {"precision": st.Sigma_inv,
            "log_det_ratio": float(np.linalg.slogdet(st.Sigma_inv)[1] - np.sum(np.log(delta_q))),
            "scatter": float(np.sum(delta_q * mu_q * mu_q)),
            "log_lik": -float(model.loss(st.mu, X, y)),
            "lml": float(laplace.log_marginal_likelihood(model, st, X, y, cfg)),
            "f_mean": pred.f_mean, "f_var": pred.f_var, "probit": pred.probs}, st


_TEMPERATURE_DEFECT = (
    "documented: `temperature`, 'temperature of the likelihood' (BaseLaplace), i.e. p(D | "
    "theta)^(1/T) (H / T), and log_marginal_likelihood 'the Laplace approximation to the log "
    "marginal likelihood'; computes: log_likelihood = -_H_factor * loss - N K log(sigma "
    "sqrt(2 pi)) tempers the squared error but not the normaliser: (1/T) log p(D | theta*) - "
    "(1 - 1/T)(N K / 2) log(2 pi sigma^2)")

_GENERATOR_DOC = ("documented: `generator`, 'random number generator to control the samples "
                  "(if sampling used)' (ParametricLaplace.__call__)")


def _classification_rows(rows):
    """GGN full Laplace of a 3-class MLP: every quantity, the probit and MC links, the NN
    predictive with generator=, temperature, and K-FAC with damping=True."""
    model, theta, X, y, X_star = _class_problem()
    net = torch_mlp(model, theta)
    K = model.sizes[-1]
    what = "dense autograd GGN sum_i J_i^T (diag p_i - p_i p_i^T) J_i of the cross-entropy"
    for subset in ("all", "last_layer"):
        perm = torch_order(model.sizes if subset == "all" else model.sizes[-2:])
        inv = np.argsort(perm)
        cfg = laplace.LaplaceConfig(PRIOR_PRECISION, "full", "ggn", subset)
        rb, st = _rb_class(model, theta, X, y, X_star, cfg)
        la = _lt_class(net, X, y, subset, "full")
        lt = _lt_class_quantities(la, X_star, perm)
        dense = _dense_class(net, X, y, X_star, subset)
        check = dict(dense, precision=dense["precision"][np.ix_(inv, inv)])
        _compare(rows, f"classification, {subset}, full, GGN", rb, lt, check, what)
        rows.append(classify(
            f"classification, {subset}, full, GGN: probit", rel_err(rb["probit"], lt["probit"]),
            note=_probit_note(dense),
            decide=lambda rb=rb, lt=lt, dense=dense: dense_side(
                rb["probit"], lt["probit"], dense["probit"],
                "dense probit softmax(f / sqrt(1 + pi/8 diag f_var)), f_var from the dense GGN")))
        if subset == "all":
            _link_rows(rows, model, st, la, dense, X_star, K)
    _class_temperature_rows(rows, net, X, y, X_star)
    for subset in ("all", "last_layer"):
        _damping_rows(rows, net, X, y, X_star, subset)


def _link_rows(rows, model, st, la, dense, X_star, K):
    """The MC link (with the global RNG's draws, and with generator=) and the NN predictive
    with generator=, each against the dense average over the draws named."""
    import torch
    S, Xs = MC_SAMPLES, torch.from_numpy(X_star)
    label = "classification, all, full, GGN"
    eps_gen = torch.randn((K, S), generator=torch.Generator().manual_seed(GENERATOR_SEED)).numpy()
    torch.manual_seed(GLOBAL_SEED)
    eps_global = torch.randn((K, S)).numpy()
    torch.manual_seed(GLOBAL_SEED)
    p_none = _np(la(Xs, link_approx="mc", n_samples=S))  # no generator: the global RNG
    torch.manual_seed(GLOBAL_SEED)
    p_lt = _np(la(Xs, link_approx="mc", n_samples=S,
                  generator=torch.Generator().manual_seed(GENERATOR_SEED)))
    p_rb = laplace.glm_class_predictive(model, st, X_star, link="mc", eps=eps_global).probs
    dense_global = _dense_glm_mc(dense["f_mean"], dense["f_var"], eps_global)
    dense_gen = _dense_glm_mc(dense["f_mean"], dense["f_var"], eps_gen)
    rows.append(classify(
        f"{label}, MC link, S = {S}, no generator (torch.manual_seed): probs",
        rel_err(p_rb, p_none),
        note=("(laplace.15) with eps = the (K, S) draws of torch's global RNG that "
              "normal_samples takes when no generator is given"),
        decide=lambda: dense_side(p_rb, p_none, dense_global,
                                  "dense (1/S) sum_s softmax(f + chol(f_var) eps_s)")))
    what = "dense (1/S) sum_s softmax(f + chol(f_var) eps_s), eps = the generator's (K, S) draws"
    _dense_row(rows, f"{label}, MC link, S = {S}, generator=: probs", dense_gen, p_lt, what,
               note=(f"{_GENERATOR_DOC}; computes: _glm_forward_call calls "
                     "_glm_predictive_samples without it, so normal_samples draws from torch's "
                     f"global RNG ({rel_err(dense_global, p_lt):.1e} from the dense average "
                     "over the global draws, the row above)"))
    D = dense["w0"].size
    eps_gen = torch.randn((S, D), generator=torch.Generator().manual_seed(GENERATOR_SEED)).numpy()
    torch.manual_seed(GLOBAL_SEED)
    eps_global = torch.randn((S, D)).numpy()
    torch.manual_seed(GLOBAL_SEED)
    p_nn = _np(la(Xs, pred_type="nn", link_approx="mc", n_samples=S,
                  generator=torch.Generator().manual_seed(GENERATOR_SEED)))
    e_global = rel_err(_dense_nn(dense, X_star, eps_global), p_nn)
    what = ("dense (1/S) sum_s softmax(f(x*, theta* + chol(P^{-1}) eps_s)), eps = the "
            "generator's (S, D) draws")
    _dense_row(rows, f"{label}, NN predictive, S = {S}, generator=: probs",
               _dense_nn(dense, X_star, eps_gen), p_nn, what,
               note=(f"{_GENERATOR_DOC}; computes: __call__ calls "
                     "_nn_predictive_classification(x, n_samples) without it, and "
                     "self.sample(n_samples) draws from torch's global RNG (with those draws: "
                     f"{e_global:.1e})"))


def _class_temperature_rows(rows, net, X, y, X_star):
    """Tempered classification: the cross-entropy is normalised, so -loss / T is (1/T) log p."""
    T = TEMPERATURE
    la = _lt_class(net, X, y, "all", "full", temperature=T)
    lt = _lt_class_quantities(la, X_star)
    dense = _dense_class(net, X, y, X_star, "all", temperature=T)
    for key in ("precision", "log_lik", "lml"):
        _dense_row(rows, f"classification, all, full, GGN, temperature {T:g}: {key}",
                   dense[key], lt[key],
                   "dense tempered Laplace: (1/T) log p(D | theta*), H / T + delta I")


def _kron_dense(la, damping: bool) -> np.ndarray:
    """The posterior precision from laplace-torch's own K-FAC factors H_facs, dense (torch
    order): per weight tensor with factors (B, A) and c = _H_factor,
    (sqrt(c) B + sqrt(delta) I) kron (sqrt(c) A + sqrt(delta) I) with damping and
    c B kron A + delta I without; per bias c B + delta I."""
    c, d = float(la._H_factor), float(la.prior_precision)
    blocks = []
    for F in la.H_facs.kfacs:
        F = [_np(M) for M in F]
        if len(F) == 1:
            blocks.append(c * F[0] + d * np.eye(len(F[0])))
        elif damping:
            B, A = (math.sqrt(c) * M + math.sqrt(d) * np.eye(len(M)) for M in F)
            blocks.append(np.kron(B, A))
        else:
            blocks.append(c * np.kron(F[0], F[1]) + d * np.eye(len(F[0]) * len(F[1])))
    return scipy.linalg.block_diag(*blocks)


def _damping_rows(rows, net, X, y, X_star, subset):
    """K-FAC with damping=True against the damped precision built densely from its factors."""
    la = _lt_class(net, X, y, subset, "kron", damping=True)
    la0 = _lt_class(net, X, y, subset, "kron", damping=False)
    lt = _lt_class_quantities(la, X_star)
    dense = _dense_class(net, X, y, X_star, subset)
    P = _kron_dense(la, damping=True)
    e_undamped = rel_err(_kron_dense(la0, damping=False), _np(la0.posterior_precision.to_matrix()))
    e_same = rel_err(lt["precision"], _np(la0.posterior_precision.to_matrix()))
    ldr = float(np.linalg.slogdet(P)[1] - len(P) * math.log(PRIOR_PRECISION))
    damped = {"precision": P, "log_det_ratio": ldr,
              "lml": dense["log_lik"] - 0.5 * (ldr + dense["scatter"]),
              "f_var": np.einsum("mkd,de,mle->mkl", dense["J_star"], np.linalg.inv(P),
                                 dense["J_star"])}
    what = ("dense damped K-FAC from laplace-torch's own factors H_facs: (sqrt(c) B + "
            "sqrt(delta) I) kron (sqrt(c) A + sqrt(delta) I) per weight, c B + delta I per bias")
    note = ("documented: KronLaplace 'Damping can be enabled by setting damping=True', "
            "KronDecomposed(damping=True) 'dampen approximation mixing prior and Kron partially "
            "multiplicatively' (eigenvalues (lam_B + sqrt(delta))(lam_A + sqrt(delta))); "
            "computes: posterior_precision = H * _H_factor + prior_precision, and "
            "KronDecomposed.__mul__ / __add__ build a new KronDecomposed without damping, so "
            f"damping=True gives damping=False's numbers ({e_same:.1e} apart; the same dense "
            f"construction without damping reproduces damping=False to {e_undamped:.1e})")
    if subset == "last_layer":
        note += (f"; for last_layer also KronLLLaplace's constructor: LLLaplace.__init__ "
                 f"calls KronLaplace.__init__ without damping, which sets self.damping = False "
                 f"(Laplace(..., damping=True).damping is {la.damping})")
    for key in ("precision", "log_det_ratio", "lml", "f_var"):
        _dense_row(rows, f"classification, {subset}, kron, GGN, damping=True: {key}",
                   damped[key], lt[key], what, note=note)


def exact_tempered_log_evidence(Xa, y, sigma, delta, T) -> float:
    """log of the integral of prod_i N(y_i; xa_i^T w, sigma^2)^(1/T) N(w; 0, I / delta) dw.

    N(y; m, s^2)^(1/T) = (2 pi s^2)^(-1/(2T)) (2 pi s^2 T)^(1/2) N(y; m, s^2 T), so the integral
    is (N/2) log(2 pi sigma^2 T) - (N / (2T)) log(2 pi sigma^2) + log N(y; 0, sigma^2 T I +
    Xa Xa^T / delta) (scipy's multivariate normal): the marginal of the linear-Gaussian model
    with noise variance sigma^2 T, independent of any Laplace formula.
    """
    N = len(y)
    C = sigma ** 2 * T * np.eye(N) + Xa @ Xa.T / delta
    return float(0.5 * N * math.log(2 * math.pi * sigma ** 2 * T)
                 - 0.5 * N / T * math.log(2 * math.pi * sigma ** 2)
                 + multivariate_normal(np.zeros(N), C).logpdf(y))  # (laplace.24)


def _linear_problem():
    rng = np.random.default_rng(LINEAR_SEED)
    n_in = len(LINEAR_W) - 1
    X = rng.standard_normal((LINEAR_ROWS, n_in))
    Xa = np.hstack([X, np.ones((LINEAR_ROWS, 1))])
    y = Xa @ np.array(LINEAR_W) + LINEAR_SIGMA * rng.standard_normal(LINEAR_ROWS)
    return X, Xa, y


def _tempered_linear_rows(rows):
    """Bayesian linear regression, tempered likelihood p(D | w)^(1/T): the Laplace evidence at
    the tempered posterior's mode is exact, so laplace-torch's must equal the closed form."""
    import torch
    from laplace import Laplace
    X, Xa, y = _linear_problem()
    s2, d = LINEAR_SIGMA ** 2, PRIOR_PRECISION
    N, D = Xa.shape
    for T in (1.0, TEMPERATURE):
        P = Xa.T @ Xa / (s2 * T) + d * np.eye(D)
        w = np.linalg.solve(P, Xa.T @ y / (s2 * T))
        net = torch.nn.Linear(D - 1, 1, dtype=torch.float64)
        with torch.no_grad():
            net.weight.copy_(torch.from_numpy(w[None, :-1].copy()))
            net.bias.copy_(torch.from_numpy(w[-1:].copy()))
        la = Laplace(net, "regression", subset_of_weights="all", hessian_structure="full",
                     prior_precision=d, sigma_noise=LINEAR_SIGMA, temperature=T)
        la.fit(_loader(X, y))
        exact = {"log_lik": float(np.sum(norm.logpdf(y, Xa @ w, LINEAR_SIGMA))) / T,
                 "lml": exact_tempered_log_evidence(Xa, y, LINEAR_SIGMA, d, T)}
        lt = {"log_lik": float(la.log_likelihood), "lml": float(la.log_marginal_likelihood())}
        shift = -0.5 * N * (1.0 - 1.0 / T) * math.log(2 * math.pi * s2)
        note = ("" if T == 1.0 else
                f"{_TEMPERATURE_DEFECT}: library - exact = -(1 - 1/T)(N K / 2) log(2 pi "
                f"sigma^2) = {shift:+.4g} here (log_lik and lml alike); refbayes' mapping: "
                f"its evidence at tau / T plus (N K / 2) log T")
        what = {"log_lik": "dense (1/T) sum_i log N(y_i; x_i^T w, sigma^2)",
                "lml": ("the exact tempered evidence log int p(D | w)^(1/T) p(w) dw (closed "
                        "form, exact_tempered_log_evidence)")}
        for key in ("log_lik", "lml"):
            _dense_row(rows, f"linear-Gaussian (D = {D}), full, temperature {T:g}: {key}",
                       exact[key], lt[key], what[key], note=note)
